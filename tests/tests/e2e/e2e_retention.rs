//! Retention (spec section 13): `POST /v1/admin/retention/run` (and the periodic run) appends
//! `retention.purged` events that every projection folds. Terminal deliveries, notifications
//! whose deliveries are all terminal, and terminal tasks nobody follows leave the read models
//! a window after their last change; anything pending, and tasks a cursor has not passed,
//! stay; a rebuild after the purge is identical.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts, assert_problem, encode_path};

use crate::common::{
    PROJECTIONS, append_ok, assert_projections_sound, notif_ev, post_empty, rebuild_or_verify,
    task_ev,
};
use crate::e2e_deliveries::{act, claim_some, wait_status};

const CFG: &str = "[retention]\nwindow = \"2s\"\nrun_every = \"1h\"\n";

fn urgent(id: &str) -> Value {
    notif_ev(
        id,
        json!({"priority": "urgent", "title": format!("title of {id}")}),
    )
}

async fn status(s: &Server, path: &str) -> StatusCode {
    s.get(path).await.status
}

#[tokio::test]
async fn a_purge_removes_what_is_done_keeps_what_is_not_and_rebuilds_identical() {
    let s = Server::start(ServerOpts::default().config(CFG)).await;
    // Done: a dashboard-only notification, a sent one, a completed task.
    append_ok(
        &s,
        &json!({"events": [
            notif_ev("r-dash", json!({"priority": "info", "title": "dashboard only"})),
            urgent("r-sent"),
            task_ev("t-done", "task.created", json!({"project_id": "p"})),
            task_ev("t-done", "task.run_started", json!({"run_id": "r1"})),
            task_ev("t-done", "task.run_completed", json!({"run_id": "r1"})),
            task_ev("t-open", "task.created", json!({"project_id": "p"})),
        ]}),
    )
    .await;
    let got = claim_some(&s, "w").await;
    assert_eq!(got[0]["id"], "dlv:r-sent:desktop");
    let r = act(&s, "dlv:r-sent:desktop", "complete", &json!({"owner": "w"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Not done: a queued delivery (never claimed: leased by nobody, due now).
    append_ok(&s, &urgent("r-pending")).await;
    wait_status(&s, "dlv:r-pending:desktop", "queued").await;
    // Tasks followed by a consumer on task_events that has not passed them: one cursor that
    // moves (it pins its task), one with no progress for the window (it pins nothing).
    append_ok(
        &s,
        &json!({"events": [
            task_ev("t-followed", "task.created", json!({"project_id": "p"})),
            task_ev("t-followed", "task.canceled", json!({"reason": "x"})),
            task_ev("t-stale", "task.created", json!({"project_id": "p"})),
            task_ev("t-stale", "task.canceled", json!({"reason": "x"})),
        ]}),
    )
    .await;
    let advance = |subject: &str, to: u64| {
        s.send(
            s.request(reqwest::Method::POST, "/v1/cursors/advance")
                .json(&json!({"consumer_id": format!("watch-{subject}"),
                              "stream_name": "task_events", "subject_id": subject,
                              "last_sequence": to, "delivery_id": format!("d-{to}")})),
        )
    };
    let r = advance("t-stale", 1).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // A window after the last change (a lower bound on the wait; nothing upper-bounded).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let r = advance("t-followed", 1).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let head = s.head().await;

    let r = post_empty(&s, "/v1/admin/retention/run").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let report = r.json.clone();
    assert_eq!(report["deliveries"], 1, "{report}");
    // r-dash, r-sent and the dashboard-only notifications routed from t-done's completion and
    // the two task cancellations.
    assert_eq!(report["notifications"], 5, "{report}");
    assert_eq!(report["tasks"], 2, "t-done and t-stale: {report}");
    assert!(report["through_seq"].as_u64().unwrap() >= head, "{report}");

    for gone in [
        "/v1/notifications/r-dash",
        "/v1/notifications/r-sent",
        "/v1/deliveries/dlv:r-sent:desktop",
        "/v1/tasks/t-done",
        "/v1/tasks/t-stale",
    ] {
        assert_eq!(
            status(&s, gone).await,
            StatusCode::NOT_FOUND,
            "{gone} purged"
        );
    }
    for kept in [
        "/v1/notifications/r-pending",
        "/v1/deliveries/dlv:r-pending:desktop",
        "/v1/tasks/t-open",
        "/v1/tasks/t-followed",
    ] {
        assert_eq!(status(&s, kept).await, StatusCode::OK, "{kept} kept");
    }
    let list = s.get("/v1/notifications?limit=50").await;
    let ids: Vec<&str> = list.json["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["notification_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["r-pending"], "{}", list.text);
    let k = s.get("/v1/outbox/kpis").await;
    assert_eq!(k.json["queue_depth"], 1, "{}", k.text);

    // The purge is in the log, and a second run finds nothing more.
    let purged = s.read_all("stream=retention").await;
    assert_eq!(purged.len(), 1, "{purged:?}");
    assert_eq!(purged[0]["type"], "retention.purged");
    assert!(
        purged[0]["payload"]["before"].is_string(),
        "{:?}",
        purged[0]
    );
    let again = post_empty(&s, "/v1/admin/retention/run").await;
    assert_eq!(again.json["deliveries"], 0, "{}", again.text);
    assert_eq!(again.json["notifications"], 0, "{}", again.text);

    // A rebuild replays the purge: every model identical to the live one.
    assert_projections_sound(&s, "after a purge").await;
    for name in PROJECTIONS {
        let v = rebuild_or_verify(&s, name, "rebuild").await;
        assert_eq!(v["identical"], true, "rebuild of {name}: {v}");
    }
    assert_eq!(
        status(&s, &format!("/v1/tasks/{}", encode_path("t-done"))).await,
        StatusCode::NOT_FOUND
    );

    // A client cannot write the purge itself.
    let r = s
        .send(s.request(reqwest::Method::POST, "/v1/events").json(&json!({
            "stream": "retention", "subject": "", "type": "retention.purged",
            "payload": {"before": "2026-01-01T00:00:00Z", "through_seq": 1}})))
        .await;
    assert_problem(&r, 403, "server_only_type");
}

/// `compact_log` is not built yet: the server says so at start instead of keeping the log
/// whole while claiming to compact it.
#[tokio::test]
async fn compact_log_is_refused_at_start() {
    let r = Server::try_start(
        ServerOpts::default().config("[retention]\nwindow = \"1d\"\ncompact_log = true\n"),
    )
    .await;
    match r {
        Err(e) => assert!(e.to_string().contains("compact_log"), "{e}"),
        Ok(_) => panic!("started with compact_log = true"),
    }
}
