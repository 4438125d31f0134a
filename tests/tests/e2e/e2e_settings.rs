//! Settings enter the log (I3): at start the server appends one `settings.updated` (stream
//! `settings`, subject `""`, server-made id) when the configured notification settings differ
//! from the last recorded ones, and nothing when they are the same.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts};

use crate::common::{assert_dense_unique, id_of, projections, seq_of, settled};

/// The `settings.updated` events of the log.
async fn settings_events(s: &Server) -> Vec<Value> {
    s.read_all("stream=settings").await
}

#[track_caller]
fn check_settings_event(e: &Value) {
    assert_eq!(e["stream"], "settings", "{e}");
    assert_eq!(e["subject"], "", "{e}");
    assert_eq!(e["type"], "settings.updated", "{e}");
    let id = id_of(e);
    assert!(
        !id.is_empty()
            && id.len() <= 128
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c)),
        "the server-made event_id follows the event_id rule: {id:?}"
    );
    assert!(e["payload"].is_object(), "{e}");
}

#[tokio::test]
async fn settings_are_recorded_once_per_change() {
    let mut s = Server::start(ServerOpts::default()).await;
    assert_eq!(
        s.start_head(),
        1,
        "a fresh log holds exactly the settings event"
    );
    assert_eq!(s.head().await, 1);
    let all = s.read_all("").await;
    assert_dense_unique(&all, 1);
    let first = &all[0];
    check_settings_event(first);
    // The full effective settings: the defaults of spec section 4.
    let p = &first["payload"];
    assert_eq!(p["enabled"], true, "{p}");
    assert_eq!(p["dashboard"]["enabled"], true, "{p}");
    assert_eq!(
        p["desktop"]["priorities"],
        json!(["urgent", "action"]),
        "{p}"
    );
    assert_eq!(
        p["routing"]["urgent"],
        json!(["dashboard", "desktop"]),
        "{p}"
    );
    assert_eq!(p["routing"]["info"], json!(["dashboard"]), "{p}");
    assert_eq!(p["retry"]["max_attempts"], 5, "{p}");

    // Same config: a restart (clean or after kill -9) appends nothing.
    s.sigterm();
    let st = s.wait_exit(Duration::from_secs(30)).await;
    assert!(st.success(), "SIGTERM exit: {st}");
    s.restart().await;
    assert_eq!(
        s.head().await,
        1,
        "a restart with the same settings appends nothing"
    );
    s.kill9();
    s.restart().await;
    assert_eq!(s.head().await, 1, "a kill -9 and restart appends nothing");

    // Other settings: one new event at the next start, then nothing again.
    let (st, body) = s
        .append(&json!({"event_id": "user-1", "stream": "orders", "type": "order.x"}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    s.kill9();
    s.set_config(Some(
        "[notifications]\nenabled = false\n[notifications.routing]\nurgent = [\"dashboard\"]\n",
    ));
    s.restart().await;
    assert_eq!(s.start_head(), 3, "changed settings are recorded at start");
    let events = settings_events(&s).await;
    assert_eq!(events.len(), 2, "{events:?}");
    let second = &events[1];
    check_settings_event(second);
    assert_eq!(seq_of(second), 3);
    assert_ne!(
        id_of(second),
        id_of(first),
        "each settings event has its own id"
    );
    assert_eq!(second["payload"]["enabled"], false, "{second}");
    assert_eq!(
        second["payload"]["routing"]["urgent"],
        json!(["dashboard"]),
        "{second}"
    );
    s.kill9();
    s.restart().await;
    assert_eq!(
        s.head().await,
        3,
        "the same changed settings are not recorded twice"
    );

    // Back to the defaults: they differ from the last recorded ones, so they are recorded.
    s.kill9();
    s.set_config(None);
    s.restart().await;
    assert_eq!(s.head().await, 4);
    let events = settings_events(&s).await;
    assert_eq!(events.len(), 3);
    assert_eq!(
        events[2]["payload"], first["payload"],
        "the defaults again, as first recorded"
    );

    // The settings projection follows the log.
    settled(&s).await;
    let rows = projections(&s).await;
    assert_eq!(rows["settings"]["checkpoint"], 4, "{}", rows["settings"]);
    assert_eq!(rows["settings"]["lag"], 0, "{}", rows["settings"]);
    assert_dense_unique(&s.read_all("").await, 4);
}
