//! Recovery mid-rebuild: a rebuild commits its new table generation chunk by chunk, so a
//! `kill -9` between chunks leaves a half-built generation in the file. The restarted server
//! must drop it, keep serving the old (complete) model with lag 0, and verify identical.

use std::time::Duration;

use serde_json::json;
use tidemark_tests::{Server, ServerOpts};

use crate::common::{assert_projections_sound, projections, settled, wait_for};

const TASKS: usize = 120_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_a_rebuild_keeps_the_old_model_and_recovers() {
    let mut server = Server::start(ServerOpts::default()).await;
    let api = server.api();
    // More than two rebuild chunks (50,000 events each) of task rows.
    for chunk in 0..TASKS / 1000 {
        let events: Vec<_> = (0..1000)
            .map(|i| {
                let t = format!("rc-{:06}", chunk * 1000 + i);
                json!({"stream": "task_events", "subject": t, "type": "task.created", "payload": {"project_id": "p"}})
            })
            .collect();
        let (status, body) = api.append(&json!({ "events": events })).await;
        assert_eq!(status.as_u16(), 201, "{body}");
    }
    settled(&api).await;
    let before = projections(&api).await;
    let generation = before["tasks"]["generation"].as_u64().expect("generation");
    let digest = before["tasks"]["digest"].clone();

    // Start a rebuild and kill the server once its first chunk is committed.
    let rebuild_api = api.clone();
    let rebuild = tokio::spawn(async move {
        rebuild_api
            .request(reqwest::Method::POST, "/v1/admin/projections/tasks/rebuild")
            .send()
            .await
            .map(|r| r.status())
    });
    wait_for(
        Duration::from_secs(120),
        "the rebuild's first chunk",
        || {
            let api = api.clone();
            async move {
                let p = projections(&api).await;
                let done = p["tasks"]["rebuild"]["done"].as_u64().unwrap_or(0);
                (done > 0).then_some(())
            }
        },
    )
    .await;
    server.kill9();
    let r = rebuild.await.expect("rebuild task");
    assert!(
        r.is_err(),
        "the rebuild cannot have answered: the kill came after its first of several chunks ({r:?})"
    );

    server.restart().await;
    let api = server.api();
    assert!(
        server
            .stderr()
            .contains("dropped tables of an unfinished rebuild"),
        "the half-built generation is dropped at start: {}",
        server.stderr()
    );
    settled(&api).await;
    let after = projections(&api).await;
    assert_eq!(
        after["tasks"]["generation"].as_u64(),
        Some(generation),
        "the old model stays live"
    );
    assert_eq!(after["tasks"]["digest"], digest, "and unchanged");
    assert_eq!(after["tasks"]["lag"], 0);
    let t = api.get("/v1/tasks/rc-119999").await;
    assert_eq!(t.status.as_u16(), 200, "{}", t.text);
    assert_projections_sound(&api, "after a kill mid-rebuild").await;
}
