//! What operators and bridges are told must be true (issue 26; spec sections 5, 6, 10, 18):
//! `stuck` is due work nobody finishes, never work scheduled for later; `stalled` is a consumer
//! with something to deliver now and no progress, never a subscription waiting on a running or
//! review-gated task; `stopped` is a subscription at a mismatch, flagged at once with its
//! reason; a run that never started is never announced as final; the probes say what they
//! mean; and the contract slips operators found (lowercase `bearer`, `RateLimit-Remaining`, the
//! lag list's key, a reset cursor's delivery id) stay fixed. Every flag is checked in the read
//! models, the KPIs, `/metrics` and the lag view, for each false alarm and each true one.
//!
//! Times: a flag that must appear is waited for (bounded); one that must not is checked after
//! `stuck_after` has certainly passed (a lower bound), or, for "not yet", well inside a
//! `stuck_after` that is minutes long.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, encode_path, sha256_hex};

use crate::common::{append_ok, cli_at, cli_ok, notif_ev, now_us, task_ev, wait_for};
use crate::e2e_deliveries::{act, claim, get_dlv, post, wait_status};

const WAIT: Duration = Duration::from_secs(60);

fn dlv(nid: &str) -> String {
    format!("dlv:{nid}:desktop")
}

fn urgent(id: &str, extra: Value) -> Value {
    let mut p = json!({"priority": "urgent", "title": format!("title of {id}")});
    if let (Some(p), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
        p.extend(extra.clone());
    }
    notif_ev(id, p)
}

fn us_of(t: &Value) -> i64 {
    crate::e2e_deliveries::us(t)
}

async fn get_ok(api: &Api, path: &str) -> Value {
    let r = api.get(path).await;
    assert_eq!(r.status, StatusCode::OK, "GET {path}: {}", r.text);
    r.json
}

/// The ids of `GET /v1/deliveries?<query>` (one page of up to 500).
async fn delivery_ids(api: &Api, query: &str) -> Vec<String> {
    get_ok(api, &format!("/v1/deliveries?limit=500&{query}")).await["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|d| d["id"].as_str().expect("id").to_owned())
        .collect()
}

/// The value of one Prometheus series (`name{labels}` exactly as rendered), if present.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Stuck (section 5): due for longer than `stuck_after`. A due delivery nobody claims is stuck;
/// one scheduled an hour ahead, one backing off, one under a live lease and a parked one are
/// not, whatever their age; an operator retry restarts the clock. The row, the `stuck` filter,
/// the KPIs (overall and by sink) and the `tidemark_outbox_stuck` gauge agree.
#[tokio::test]
async fn stuck_is_due_work_only() {
    let s = Server::start(
        ServerOpts::default().config("[notifications.outbox]\nstuck_after = \"3s\"\n"),
    )
    .await;
    // Three claimed first: one fails and backs off an hour, one is parked, one keeps its lease.
    for id in ["s-backoff", "s-parked", "s-leased"] {
        append_ok(&s, &urgent(id, json!({}))).await;
        wait_status(&s, &dlv(id), "queued").await;
    }
    let got = claim(&s, "w", 3, 3_600_000).await;
    assert_eq!(got.len(), 3, "{got:?}");
    let r = act(
        &s,
        &dlv("s-backoff"),
        "fail",
        &json!({"owner": "w", "error_code": "busy", "retry_after_ms": 3_600_000}),
    )
    .await;
    assert_eq!(r.json["status"], "retry_wait", "{}", r.text);
    let r = act(
        &s,
        &dlv("s-parked"),
        "fail",
        &json!({"owner": "w", "error_code": "gone", "retryable": false}),
    )
    .await;
    assert_eq!(r.json["status"], "parked", "{}", r.text);
    // Then one due now that nobody claims, and one scheduled an hour ahead.
    let later = "2099-01-01T00:00:00Z";
    append_ok(&s, &urgent("s-due", json!({}))).await;
    append_ok(&s, &urgent("s-later", json!({"deliver_after": later}))).await;
    let due = wait_status(&s, &dlv("s-due"), "queued").await;
    let scheduled = wait_status(&s, &dlv("s-later"), "queued").await;
    assert!(
        us_of(&scheduled["next_attempt_at"]) > now_us() + 3_000_000_000,
        "scheduled for later: {scheduled}"
    );
    assert_eq!(due["stuck"], false, "fresh: {due}");

    // The true alarm: the due row becomes stuck (bounded wait) ...
    let stuck = wait_for(WAIT, "s-due to be stuck", || {
        let api = s.api();
        async move {
            let ids = delivery_ids(&api, "stuck=true").await;
            (!ids.is_empty()).then_some(ids)
        }
    })
    .await;
    // ... and it alone: every other row is as old (created before it) and none is due.
    assert_eq!(stuck, vec![dlv("s-due")]);
    for id in ["s-later", "s-backoff", "s-leased", "s-parked"] {
        let row = get_dlv(&s, &dlv(id)).await;
        assert_eq!(row["stuck"], false, "{id} is not due: {row}");
    }
    let mut not_stuck = delivery_ids(&s, "stuck=false").await;
    not_stuck.sort();
    let mut want: Vec<String> = ["s-backoff", "s-later", "s-leased", "s-parked"]
        .iter()
        .map(|i| dlv(i))
        .collect();
    want.sort();
    assert_eq!(not_stuck, want);
    // The CLI says the same: `deliveries list --stuck true`.
    let list = "deliveries list --stuck true -o json";
    let out = cli_ok(&cli_at(s.base(), list).await, list);
    let rows: Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert_eq!(rows[0]["id"], dlv("s-due").as_str(), "{rows}");
    assert_eq!(rows[0]["stuck"], true, "{rows}");
    let k = get_ok(&s, "/v1/outbox/kpis").await;
    assert_eq!(k["stuck"], 1, "{k}");
    assert_eq!(k["by_sink"]["app"]["stuck"], 1, "{k}");
    assert_eq!(k["queue_depth"], 4, "queued 2, leased 1, retry_wait 1: {k}");
    let m = s.get("/metrics").await.text;
    assert_eq!(
        series(&m, "tidemark_outbox_stuck{sink=\"app\"}"),
        Some(1.0),
        "{m}"
    );
    assert!(
        m.contains("# HELP tidemark_outbox_stuck Deliveries not terminal and due"),
        "the HELP text says what is counted"
    );

    // An operator retry of the parked row makes it due now: the clock starts again, so it is
    // not stuck at once although it was created long before stuck_after.
    let r = act(
        &s,
        &dlv("s-parked"),
        "retry",
        &json!({"reason": "try again"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let row = get_dlv(&s, &dlv("s-parked")).await;
    assert_eq!(row["status"], "queued", "{row}");
    assert_eq!(row["stuck"], false, "a retry restarts the clock: {row}");
    assert_eq!(get_ok(&s, "/v1/outbox/kpis").await["stuck"], 1);
    // ... and, still unclaimed, it is stuck once stuck_after has passed since the retry.
    wait_for(WAIT, "the retried row to be stuck again", || {
        let api = s.api();
        async move { (get_dlv(&api, &dlv("s-parked")).await["stuck"] == true).then_some(()) }
    })
    .await;
    // Claiming the due rows clears the alarm: a live lease is not stuck.
    let got = claim(&s, "w2", 10, 3_600_000).await;
    assert_eq!(got.len(), 2, "s-due and the retried row: {got:?}");
    assert_eq!(get_ok(&s, "/v1/outbox/kpis").await["stuck"], 0);
}

/// A digest window and quiet hours hold a delivery for later: neither is stuck while held.
#[tokio::test]
async fn held_deliveries_are_not_stuck() {
    // A digest window of 10 minutes.
    let digest = Server::start(ServerOpts::default().config(
        "[notifications.outbox]\nstuck_after = \"1s\"\n\
         [notifications.routes.desktop]\ndigest = { window = \"10m\", max_items = 5 }\n",
    ))
    .await;
    append_ok(
        &digest,
        &urgent("dg-1", json!({"recipient": "ann", "group_key": "g"})),
    )
    .await;
    let row = wait_status(&digest, &dlv("dg-1"), "queued").await;
    assert!(
        us_of(&row["next_attempt_at"]) > now_us() + 60_000_000,
        "the digest waits for its window: {row}"
    );
    // Quiet hours: a two-hour window around now in UTC+5, for a recipient in UTC+5; the claim
    // defers the row to the window's end.
    let now_min = now_us() / 60_000_000;
    let clock = |m: i64| format!("{:02}:{:02}", m.rem_euclid(1440) / 60, m.rem_euclid(60));
    let quiet = Server::start(ServerOpts::default().config(format!(
        "[notifications.outbox]\nstuck_after = \"1s\"\n\
         [notifications.routes.desktop]\nquiet_hours = [\"{}\", \"{}\"]\n",
        clock(now_min + 300 - 60),
        clock(now_min + 300 + 60)
    )))
    .await;
    let r = post(
        &quiet,
        "/v1/events",
        &json!({"event_id": "q-profile", "stream": "recipients", "subject": "quinn",
                "type": "recipient.updated", "payload": {"tz_offset_minutes": 300}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // Urgent bypasses quiet hours; an action notification is held.
    append_ok(
        &quiet,
        &notif_ev(
            "q-1",
            json!({"priority": "action", "title": "review", "recipient": "quinn"}),
        ),
    )
    .await;
    wait_status(&quiet, &dlv("q-1"), "queued").await;
    let r = post(
        &quiet,
        "/v1/deliveries/claim",
        &json!({"sink": "app", "owner": "w", "limit": 10, "lease_ms": 60_000}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json["deliveries"],
        json!([]),
        "quiet hours: nothing to claim"
    );
    let held = wait_for(WAIT, "the quiet-hours deferral", || {
        let api = quiet.api();
        async move {
            let row = get_dlv(&api, &dlv("q-1")).await;
            (us_of(&row["next_attempt_at"]) > now_us() + 60_000_000).then_some(row)
        }
    })
    .await;
    assert_eq!(held["status"], "queued", "{held}");
    // Both are older than stuck_after now, and neither is stuck.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for (s, id) in [(&digest, "dg-1"), (&quiet, "q-1")] {
        let row = get_dlv(s, &dlv(id)).await;
        assert_eq!(row["stuck"], false, "{row}");
        let k = get_ok(s, "/v1/outbox/kpis").await;
        assert_eq!(k["stuck"], 0, "{k}");
        assert_eq!(k["queue_depth"], 1, "{k}");
        assert_eq!(delivery_ids(s, "stuck=true").await, Vec::<String>::new());
    }
}

fn consumer(sub: &str) -> String {
    format!("bridge_task_subscription:{sub}")
}

async fn subscribe(api: &Api, task: &str, sub: &str, bridge: &str) {
    let r = post(
        api,
        &format!("/v1/tasks/{task}/notifications/bridges"),
        &json!({"subscription_id": sub, "bridge_id": bridge, "thread_id": format!("th-{sub}"),
                "sink": {"kind": "pull"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
}

/// Append lifecycle events of `task`; their seqs.
async fn steps(api: &Api, task: &str, steps: &[(&str, Value)]) -> Vec<u64> {
    let events: Vec<Value> = steps
        .iter()
        .map(|(ty, p)| task_ev(task, ty, p.clone()))
        .collect();
    append_ok(api, &json!({ "events": events }))
        .await
        .iter()
        .map(|r| r.1)
        .collect()
}

/// A server without desktop deliveries whose outbox calls work stuck after `stuck_after`.
async fn no_desktop(stuck_after: &str) -> Server {
    let config = format!(
        "[notifications.desktop]\nenabled = false\n\
         [notifications.outbox]\nstuck_after = \"{stuck_after}\"\n"
    );
    Server::start(ServerOpts::default().config(config)).await
}

/// A task created, its run `started` started and the run `completed` completed.
fn lifecycle(started: &str, completed: &str) -> [(&'static str, Value); 3] {
    [
        ("task.created", json!({"project_id": "p"})),
        ("task.run_started", json!({"run_id": started})),
        ("task.run_completed", json!({"run_id": completed})),
    ]
}

async fn lag(api: &Api) -> Value {
    // The lag view never waits (section 7); a waiting read first, so it shows this test's
    // writes (a command is answered before the models fold its events).
    crate::common::settled(api).await;
    let v = get_ok(api, "/v1/consumers/lag").await;
    assert!(
        v.get("cursors").is_none(),
        "the list key is `consumers` (section 7): {v}"
    );
    v
}

fn lag_row(v: &Value, consumer_id: &str) -> Value {
    v["consumers"]
        .as_array()
        .unwrap_or_else(|| panic!("lag without `consumers`: {v}"))
        .iter()
        .find(|c| c["consumer_id"] == consumer_id)
        .cloned()
        .unwrap_or_else(|| panic!("no lag row for {consumer_id}: {v}"))
}

/// Stalled and stopped (section 10). A subscription whose task is running, or whose run waits
/// for its review, has nothing to send: never stalled, however long it waits. One whose bridge
/// never acks a deliverable envelope is stalled after `stuck_after`, and no longer once it acks.
/// The lag view's counts and the gauges agree.
#[tokio::test]
async fn stalled_is_deliverable_work_without_progress() {
    let s = no_desktop("1s").await;
    let created = |review: bool| {
        (
            "task.created",
            json!({"project_id": "p", "review_required": review}),
        )
    };
    let r1 = || json!({"run_id": "r1"});
    steps(&s, "t-run", &[created(false), ("task.run_started", r1())]).await;
    let completed = |review| {
        [
            created(review),
            ("task.run_started", r1()),
            ("task.run_completed", r1()),
        ]
    };
    steps(&s, "t-rev", &completed(true)).await;
    let done = steps(&s, "t-done", &completed(false)).await;
    subscribe(&s, "t-run", "s-run", "b-run").await;
    subscribe(&s, "t-rev", "s-rev", "b-rev").await;
    subscribe(&s, "t-done", "s-done", "b-done").await;
    for (task, sub) in [("t-run", "s-run"), ("t-rev", "s-rev")] {
        let x = get_ok(
            &s,
            &format!("/v1/tasks/{task}/notifications/bridges/{sub}/explain"),
        )
        .await;
        assert_eq!(x["next"], "idle", "nothing to send: {x}");
    }

    // The true alarm: s-done has a final envelope its bridge never acks.
    let v = wait_for(WAIT, "s-done to be stalled", || {
        let api = s.api();
        async move {
            let v = lag(&api).await;
            (lag_row(&v, &consumer("s-done"))["stalled"] == true).then_some(v)
        }
    })
    .await;
    let row = lag_row(&v, &consumer("s-done"));
    assert!(
        row["lag_seconds"].as_f64().is_some_and(|x| x >= 1.0),
        "{row}"
    );
    assert_eq!(row["stopped"], false, "{row}");
    // The false alarms: as old, events past their cursors, and nothing to send.
    for sub in ["s-run", "s-rev"] {
        let row = lag_row(&v, &consumer(sub));
        assert!(row["lag_events"].as_u64().is_some_and(|n| n >= 2), "{row}");
        assert_eq!(row["stalled"], false, "{sub} waits on its task: {row}");
        assert_eq!(row["stopped"], false, "{row}");
        assert_eq!(row["lag_seconds"].as_f64(), Some(0.0), "{row}");
    }
    assert_eq!(v["stalled"], 1, "{v}");
    assert_eq!(v["stopped"], 0, "{v}");
    let m = s.get("/metrics").await.text;
    assert_eq!(series(&m, "tidemark_consumer_cursors_stalled"), Some(1.0));
    assert_eq!(series(&m, "tidemark_consumer_cursors_stopped"), Some(0.0));

    // The ack is progress: no longer stalled.
    let pulled = get_ok(&s, "/v1/bridges/b-done/deliveries?wait_ms=0").await;
    let id = format!("notif:s-done:{}", done[2]);
    assert_eq!(
        pulled["deliveries"][0]["delivery_id"],
        id.as_str(),
        "{pulled}"
    );
    let r = post(
        &s,
        &format!("/v1/bridges/b-done/deliveries/{}/ack", encode_path(&id)),
        &json!({}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let row = lag_row(&lag(&s).await, &consumer("s-done"));
    assert_eq!(row["stalled"], false, "{row}");
    assert_eq!(row["lag_events"], 0, "{row}");
}

/// Stopped (sections 6 and 10): a completion of run `r9`, which never started while `r1`
/// runs, is a mismatch (`run_not_started`): no final envelope reaches the bridge, explain says
/// why, and the lag view flags the subscription `stopped` at once — under a `stuck_after` of
/// an hour — with the reason and the seq, never `stalled`; the gauge counts it. Repairing is
/// an operator reset past it, after which it is neither.
#[tokio::test]
async fn a_mismatch_is_stopped_at_once_and_a_run_that_never_started_is_never_final() {
    let s = no_desktop("1h").await;
    let seqs = steps(&s, "t-mis", &lifecycle("r1", "r9")).await;
    let bad = seqs[2];
    subscribe(&s, "t-mis", "s-mis", "b-mis").await;
    let task = get_ok(&s, "/v1/tasks/t-mis").await;
    assert_eq!(task["status"], "running", "{task}");
    assert_eq!(task["current_run_id"], "r1", "{task}");

    let x = get_ok(&s, "/v1/tasks/t-mis/notifications/bridges/s-mis/explain").await;
    assert_eq!(x["next"], "stopped", "{x}");
    assert_eq!(x["next_seq"], bad, "{x}");
    let cand = &x["candidates"][0];
    assert_eq!(cand["decision"], "mismatch", "{x}");
    assert!(
        cand["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("run_not_started")),
        "{x}"
    );
    let v = lag(&s).await;
    let row = lag_row(&v, &consumer("s-mis"));
    assert_eq!(row["stopped"], true, "flagged at once: {row}");
    assert_eq!(row["stopped_seq"], bad, "{row}");
    assert!(
        row["stopped_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("run_not_started")),
        "{row}"
    );
    assert_eq!(row["stalled"], false, "{row}");
    // Its lag in time is how long it has been stopped (it read 0 s): it grows.
    let first = row["lag_seconds"].as_f64().expect("lag_seconds");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = lag_row(&lag(&s).await, &consumer("s-mis"))["lag_seconds"]
        .as_f64()
        .expect("lag_seconds");
    assert!(
        later >= 1.0 && later > first,
        "stopped for {first} s, then {later} s"
    );
    assert_eq!(v["stopped"], 1, "{v}");
    assert_eq!(v["stalled"], 0, "{v}");
    let m = s.get("/metrics").await.text;
    assert_eq!(series(&m, "tidemark_consumer_cursors_stopped"), Some(1.0));
    // The notifier records the mismatch; the bridge is never sent a final envelope.
    wait_for(WAIT, "the mismatch event", || {
        let api = s.api();
        async move {
            let ev = get_ok(
                &api,
                "/v1/events?after_sequence=0&type=notification.terminal_state_mismatch",
            )
            .await;
            (!ev["events"].as_array().expect("events").is_empty()).then_some(())
        }
    })
    .await;
    let pulled = get_ok(&s, "/v1/bridges/b-mis/deliveries?wait_ms=300").await;
    assert_eq!(pulled["deliveries"], json!([]), "no final for r9: {pulled}");
    let c = get_ok(
        &s,
        "/v1/cursors?consumer_id=bridge_task_subscription:s-mis&stream_name=task_events&subject_id=t-mis",
    )
    .await;
    assert_eq!(
        c["cursors"][0]["last_sequence"], 0,
        "never advanced past it: {c}"
    );

    // An operator moves it past the mismatch: neither stopped nor stalled.
    let r = post(
        &s,
        "/v1/cursors/reset",
        &json!({"consumer_id": consumer("s-mis"), "stream_name": "task_events",
                "subject_id": "t-mis", "last_sequence": bad, "reason": "r9 was a stray event"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let row = lag_row(&lag(&s).await, &consumer("s-mis"));
    assert_eq!(row["stopped"], false, "{row}");
    assert_eq!(row["stalled"], false, "{row}");
    assert_eq!(row["stopped_reason"], Value::Null, "{row}");
}

/// A reset cursor no longer claims the delivery id of its old position (section 6): the
/// answer of the reset and every later read say `last_delivery_id: null`.
#[tokio::test]
async fn a_reset_cursor_forgets_its_old_delivery_id() {
    let s = Server::start(ServerOpts::default()).await;
    let head = s.head().await;
    let advance = json!({"consumer_id": "c-1", "stream_name": "orders", "subject_id": "",
                         "last_sequence": head, "delivery_id": "d-7"});
    let r = post(&s, "/v1/cursors/advance", &advance).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["last_delivery_id"], "d-7", "{}", r.text);
    let r = post(
        &s,
        "/v1/cursors/reset",
        &json!({"consumer_id": "c-1", "stream_name": "orders", "subject_id": "",
                "last_sequence": 0, "reason": "replay"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for c in [
        r.json.clone(),
        get_ok(
            &s,
            "/v1/cursors?consumer_id=c-1&stream_name=orders&subject_id=",
        )
        .await["cursors"][0]
            .clone(),
    ] {
        assert_eq!(c["last_sequence"], 0, "{c}");
        assert_eq!(c["last_delivery_id"], Value::Null, "{c}");
        assert_eq!(c["last_delivered_at"], Value::Null, "{c}");
    }
    // An idempotent replay of the old advance is no longer "the same delivery": it is an
    // advance from 0 again, accepted.
    let r = post(&s, "/v1/cursors/advance", &advance).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["last_delivery_id"], "d-7", "{}", r.text);
}

/// Probes (section 18): on a healthy server `/livez`, `/healthz` and `/readyz` answer 200; on
/// a disk full from the start `/livez` still does, the others answer 503 with a body whose
/// `status` is 503 (it said 507 in a 503), appends 507 and reads work (e2e_disk_full fills a
/// disk under a running server); every problem body's `status` is its HTTP status.
#[tokio::test]
async fn probes_answer_and_problem_status_is_the_http_status() {
    let s = Server::start(ServerOpts::default()).await;
    for (p, status) in [
        ("/livez", "alive"),
        ("/healthz", "ok"),
        ("/readyz", "ready"),
    ] {
        let r = s.get(p).await;
        assert_eq!(r.status, StatusCode::OK, "{p}: {}", r.text);
        assert_eq!(r.json["status"], status, "{p}: {}", r.text);
    }
    // A reserve larger than any disk: the disk is full from the start, which is not damage
    // (I10): the server starts, serves reads and refuses writes; liveness is not storage.
    let full =
        Server::start(ServerOpts::default().config("[log]\nmin_free = \"1000000GiB\"\n")).await;
    let r = full.get("/livez").await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "/livez on a full disk: {}",
        r.text
    );
    for p in ["/healthz", "/readyz"] {
        let r = full.get(p).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{p}: {}", r.text);
        assert_eq!(r.json["status"], 503, "{p}: {}", r.text);
        assert_eq!(r.json["code"], "insufficient_storage", "{p}: {}", r.text);
    }
    let r = full
        .send(full.request(Method::POST, "/v1/events").json(&json!({
            "event_id": "e-1", "stream": "s", "subject": "x", "type": "t.x", "payload": {}})))
        .await;
    assert_eq!(r.status.as_u16(), 507, "{}", r.text);
    assert_eq!(r.json["status"], 507, "{}", r.text);
    let r = full.get("/v1/events?after_sequence=0").await;
    assert_eq!(r.status, StatusCode::OK, "reads work: {}", r.text);
    for (method, path, body) in [
        (Method::GET, "/v1/nope", json!(null)),
        (Method::GET, "/v1/events?after_sequence=x", json!(null)),
        (Method::POST, "/v1/events", json!({"event_id": "e"})),
        (Method::DELETE, "/v1/events", json!(null)),
        (
            Method::POST,
            "/v1/deliveries/nope/complete",
            json!({"owner": "o"}),
        ),
    ] {
        let r = s.send(s.request(method.clone(), path).json(&body)).await;
        assert!(r.status.is_client_error(), "{method} {path}: {}", r.text);
        assert_eq!(
            r.json["status"],
            r.status.as_u16(),
            "{method} {path}: {}",
            r.text
        );
    }
}

/// The contract slips: the `Bearer` scheme is case-insensitive; a rate-limited token gets
/// `RateLimit-Remaining` on every answer, also a 403, a 404, a 400 and `/v1/whoami`.
#[tokio::test]
async fn bearer_is_case_insensitive_and_every_answer_to_a_limited_token_says_what_remains() {
    let config = format!(
        "[[auth.tokens]]\nname = \"limited\"\nsha256 = \"{}\"\nscopes = [\"read\"]\n\
         rate = \"1000/m\"\n",
        sha256_hex("tok-limited")
    );
    let s = Server::start(ServerOpts::default().config(config)).await;
    let send = |auth: &'static str, method: Method, path: &'static str| {
        let api = s.api();
        async move {
            api.send(
                api.request(method, path)
                    .header("authorization", auth)
                    .json(&json!({})),
            )
            .await
        }
    };
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let auth: &'static str = Box::leak(format!("{scheme} tok-limited").into_boxed_str());
        let r = send(auth, Method::GET, "/v1/whoami").await;
        assert_eq!(r.status, StatusCode::OK, "{scheme}: {}", r.text);
        assert_eq!(r.json["name"], "limited", "{}", r.text);
    }
    let mut remaining = Vec::new();
    for (method, path, status) in [
        (Method::GET, "/v1/events?after_sequence=0", 200),
        (Method::GET, "/v1/whoami", 200),
        (Method::POST, "/v1/events", 403),
        (Method::GET, "/v1/no-such-thing", 404),
        (Method::GET, "/v1/events?bogus=1", 400),
        (Method::GET, "/v1/deliveries/nope", 404),
    ] {
        let r = send("bearer tok-limited", method.clone(), path).await;
        assert_eq!(r.status.as_u16(), status, "{method} {path}: {}", r.text);
        let left: u64 = r
            .headers
            .get("ratelimit-remaining")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{method} {path}: no RateLimit-Remaining: {r:?}"));
        remaining.push(left);
    }
    assert!(
        remaining.windows(2).all(|w| w[1] < w[0]),
        "each request takes one: {remaining:?}"
    );
    // A token it does not know gets no rate headers (nothing to say about it).
    let r = send("Bearer nope", Method::GET, "/v1/whoami").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    assert!(r.headers.get("ratelimit-remaining").is_none());
}

/// A subscription created on a task that finished long ago has a final envelope to deliver at
/// once, but has not been waiting: its clock starts at its creation, so it is not stalled
/// before `stuck_after` has passed since then (the check follows the creation by milliseconds,
/// far inside the 2 s), and is once it has, if nobody acks.
#[tokio::test]
async fn a_new_subscription_is_not_stalled_by_an_old_event() {
    let s = no_desktop("2s").await;
    steps(&s, "t-old", &lifecycle("r1", "r1")).await;
    // The completion is older than stuck_after when the subscription is made.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    subscribe(&s, "t-old", "s-old", "b-old").await;
    let row = lag_row(&lag(&s).await, &consumer("s-old"));
    assert_eq!(row["stalled"], false, "just subscribed: {row}");
    assert!(
        row["lag_seconds"].as_f64().is_some_and(|x| x < 2.0),
        "waited since the subscription: {row}"
    );
    wait_for(WAIT, "s-old to be stalled", || {
        let api = s.api();
        async move {
            (lag_row(&lag(&api).await, &consumer("s-old"))["stalled"] == true).then_some(())
        }
    })
    .await;
}
