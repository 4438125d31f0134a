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
    assert_eq!(report["purged"]["deliveries"], 1, "{report}");
    // r-dash, r-sent and the dashboard-only notifications routed from t-done's completion and
    // the two task cancellations.
    assert_eq!(report["purged"]["notifications"], 5, "{report}");
    assert_eq!(report["purged"]["tasks"], 2, "t-done and t-stale: {report}");
    assert_eq!(
        report["compacted_through_seq"],
        Value::Null,
        "no compact_log: {report}"
    );
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
    // Run by hand in open mode: `by` is there, null (section 8).
    assert_eq!(
        purged[0]["payload"].get("by"),
        Some(&Value::Null),
        "{:?}",
        purged[0]
    );
    assert!(
        purged[0]["payload"]["before"].is_string(),
        "{:?}",
        purged[0]
    );
    let again = post_empty(&s, "/v1/admin/retention/run").await;
    assert_eq!(again.json["purged"]["deliveries"], 0, "{}", again.text);
    assert_eq!(again.json["purged"]["notifications"], 0, "{}", again.text);

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

fn free(id: &str, stream: &str) -> Value {
    json!({"event_id": id, "stream": stream, "subject": "", "type": "x.t", "payload": {"id": id}})
}

async fn advance(s: &Server, consumer: &str, stream: &str, to: u64) {
    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/cursors/advance")
                .json(&json!({"consumer_id": consumer, "stream_name": stream,
                              "subject_id": "", "last_sequence": to,
                              "delivery_id": format!("d-{to}")})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

const COMPACT_CFG: &str = "[retention]\nwindow = \"2s\"\nrun_every = \"1h\"\ncompact_log = true\n\
                           [log]\nmerge_threshold = 8\n";

/// `compact_log` (spec section 13): the events older than the window leave the log once every
/// projection has a snapshot, except what a live cursor still follows; a position before the
/// first retained event is `410 compacted` (reads and streams); a rebuild starts from the
/// snapshot and verifies identical; a resend of a compacted event is still a duplicate; all of
/// it again after a `kill -9` and a restart.
#[tokio::test]
async fn compaction_drops_the_old_prefix_keeps_what_cursors_need_and_rebuilds_identical() {
    let mut s = Server::start(ServerOpts::default().config(COMPACT_CFG)).await;
    let mut old = Vec::new();
    for i in 0..20 {
        old.push(free(&format!("old-{i}"), "a"));
    }
    old.push(free("pin-1", "pinned"));
    old.push(free("pin-2", "pinned"));
    old.push(urgent("c-note"));
    let receipts = append_ok(&s, &json!({ "events": old })).await;
    let seq_of = |id: &str| receipts.iter().find(|r| r.0 == id).unwrap().1;
    let (pin1, pin2) = (seq_of("pin-1"), seq_of("pin-2"));
    // A consumer that stops for longer than the window pins nothing.
    advance(&s, "stale", "a", seq_of("old-0")).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // A live consumer of `pinned` at pin-1 still needs pin-2.
    advance(&s, "live", "pinned", pin1).await;
    append_ok(&s, &free("new-1", "a")).await;
    // Enough later events for the in-memory index to be merged past the cut.
    for i in 0..10 {
        append_ok(&s, &free(&format!("fill-{i}"), "f")).await;
    }

    let r = post_empty(&s, "/v1/admin/retention/run").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let first = r.json["compacted_through_seq"]
        .as_u64()
        .expect("compacted_through_seq")
        + 1;
    assert_eq!(
        first, pin2,
        "cut just before what the live cursor needs: {}",
        r.text
    );
    assert!(
        r.json["compacted_events"].as_u64().unwrap() >= 20,
        "{}",
        r.text
    );

    for round in 0..2 {
        // Before the first retained event: 410; from just before it: the rest, in order.
        let r = s.get("/v1/events?after_sequence=0").await;
        assert_problem(&r, 410, "compacted");
        let r = s
            .get(&format!("/v1/events?after_sequence={}&stream=a", first - 2))
            .await;
        assert_problem(&r, 410, "compacted");
        let r = s
            .get(&format!("/v1/events?after_sequence={}&limit=5", first - 1))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.json["events"][0]["seq"], first, "{}", r.text);
        assert_eq!(r.json["events"][0]["event_id"], "pin-2", "{}", r.text);
        let r = s
            .send(
                s.request(reqwest::Method::GET, "/v1/events/stream")
                    .header("Last-Event-ID", "0"),
            )
            .await;
        assert_problem(&r, 410, "compacted");
        let r = s
            .get(&format!("/v1/events?after_sequence={pin1}&stream=pinned"))
            .await;
        assert_eq!(r.json["events"][0]["event_id"], "pin-2", "{}", r.text);
        // A resend of a compacted event is still a duplicate, with its seq.
        let (st, body) = s.append(&free("old-3", "a")).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
        assert_eq!(body["events"][0]["duplicate"], true, "{body}");
        assert_eq!(body["events"][0]["seq"], seq_of("old-3"), "{body}");
        // The read models are whole: the notification and its delivery are there.
        assert_eq!(status(&s, "/v1/notifications/c-note").await, StatusCode::OK);
        // Rebuilds start from the snapshots and verify identical.
        assert_projections_sound(&s, "after compaction").await;
        for name in PROJECTIONS {
            let v = rebuild_or_verify(&s, name, "rebuild").await;
            assert_eq!(
                v["identical"], true,
                "rebuild of {name} (round {round}): {v}"
            );
        }
        if round == 0 {
            s.kill9();
            s.restart().await;
            // The reactors resume past the compacted prefix: a new notification is routed.
            append_ok(&s, &urgent("after-restart")).await;
            wait_status(&s, "dlv:after-restart:desktop", "queued").await;
        }
    }
}

/// Under a steady workload with retention and compaction on, the data directory stops
/// growing: after three windows of warm-up, over the next five it never exceeds 1.25 times
/// its size at the end of the warm-up (spec section 13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_stays_bounded_under_a_steady_workload() {
    const WINDOW_MS: u64 = 1_000;
    let s = Server::start(ServerOpts::default().config(format!(
        "[retention]\nwindow = \"{WINDOW_MS}ms\"\nrun_every = \"{WINDOW_MS}ms\"\ncompact_log = true\n\
         [log]\nmerge_threshold = 200\n"
    )))
    .await;
    let size = |dir: &std::path::Path| -> u64 {
        fn walk(p: &std::path::Path) -> u64 {
            let Ok(meta) = std::fs::metadata(p) else {
                return 0;
            };
            if meta.is_dir() {
                std::fs::read_dir(p)
                    .map(|rd| rd.flatten().map(|e| walk(&e.path())).sum())
                    .unwrap_or(0)
            } else {
                meta.len()
            }
        }
        walk(dir)
    };
    let started = std::time::Instant::now();
    let mut n = 0u64;
    let mut warm = 0u64;
    let mut peak = 0u64;
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_millis(8 * WINDOW_MS) {
        let batch: Vec<Value> = (0..20)
            .map(|i| {
                n += 1;
                json!({"stream": "steady", "subject": format!("s-{}", i % 4), "type": "x.t",
                       "payload": {"n": n, "pad": "x".repeat(200)}})
            })
            .collect();
        append_ok(&s, &json!({ "events": batch })).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = started.elapsed().as_millis() as u64;
        let now = size(s.data_dir());
        if t < 3 * WINDOW_MS {
            warm = now;
        } else {
            peak = peak.max(now);
        }
        samples.push((t, now));
    }
    println!("{n} events; data dir at the end of warm-up {warm} B, peak after {peak} B");
    assert!(warm > 0 && peak > 0, "{samples:?}");
    assert!(
        peak as f64 <= 1.25 * warm as f64,
        "the data directory grew from {warm} to {peak} bytes: {samples:?}"
    );
    let r = s.get("/v1/events?after_sequence=0").await;
    assert_problem(&r, 410, "compacted");
}
