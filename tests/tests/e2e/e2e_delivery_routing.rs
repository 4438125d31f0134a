//! Routing of notifications to deliveries and the scheduling policies (spec sections 4 and 5),
//! end to end against the real binary: the default routing table (client notifications and
//! the ones routed from lifecycle events), settings changed mid-log by a restart with another
//! config (each notification is routed under the settings in force at its seq), quiet hours,
//! delay windows, suppression (at routing and at claim), digests, task cancellation, exactly
//! one delivery per notification across `kill -9` (I3/I8), and a rebuild of the deliveries
//! projection that answers the same rows.
//!
//! Routing is asynchronous and in log order. A test waits (bounded) for the rows it expects;
//! to show that a notification has NO delivery it first waits for a later "marker": a
//! notification appended after it whose delivery exists, or, when the settings route nothing,
//! the cancellation of a task whose never-due "barrier" delivery becomes `cancelled`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, encode_path, tail};

use crate::common::{
    append_ok, check_time, civil_micros, list_after, list_notifications, notif_ev, now_us,
    rebuild_or_verify, receipts, task_ev, wait_for, wait_routed,
};

const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// 1. The routing table with the defaults
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn default_routing_table_for_requested_and_lifecycle_notifications() {
    let s = Server::start(ServerOpts::default()).await;
    let batch = json!({"events": [
        notif("u1", "urgent", json!({"recipient": "alice", "body": "b-u1", "task_id": "tx"})),
        notif("a1", "action", json!({"recipient": "alice", "group_key": "g"})),
        notif("w1", "warning", json!({"recipient": "alice"})),
        notif("i1", "info", json!({})),
        task_ev("t-fail", "task.created", json!({"project_id": "p"})),
        task_ev("t-fail", "task.run_started", json!({"run_id": "r1"})),
        task_ev("t-fail", "task.run_failed", json!({"run_id": "r1", "error": "boom"})),
        task_ev("t-rev", "task.created", json!({"project_id": "p"})),
        task_ev("t-rev", "task.run_started", json!({"run_id": "r1"})),
        task_ev("t-rev", "task.run_review_requested", json!({"run_id": "r1"})),
        task_ev("t-done", "task.created", json!({"project_id": "p"})),
        task_ev("t-done", "task.run_started", json!({"run_id": "r1"})),
        task_ev("t-done", "task.run_completed", json!({"run_id": "r1"})),
    ]});
    let r = append_ok(&s, &batch).await;
    let failed_ntf = format!("ntf:{}", r[6].1);
    let review_ntf = format!("ntf:{}", r[9].1);
    let done_ntf = format!("ntf:{}", r[12].1);
    // The router makes the lifecycle notifications; only then can a marker follow them.
    wait_routed(&s, WAIT).await;
    settle(&s, "m1").await;

    // urgent: one desktop delivery on the app sink, with sound.
    let u1 = get_delivery(&s, "dlv:u1:desktop")
        .await
        .expect("urgent u1 has a desktop delivery");
    check_row(&u1);
    assert_eq!(u1["notification_id"], "u1", "{u1}");
    assert_eq!(u1["route"], "desktop", "{u1}");
    assert_eq!(u1["sink"], "app", "{u1}");
    assert_eq!(u1["status"], "queued", "{u1}");
    assert_eq!(u1["reason"], Value::Null, "{u1}");
    assert_eq!(u1["priority"], "urgent", "{u1}");
    assert_eq!(u1["sound"], true, "urgent is a sound priority: {u1}");
    assert_eq!(u1["recipient"], "alice", "{u1}");
    assert_eq!(u1["title"], "title of u1", "{u1}");
    assert_eq!(u1["body"], "b-u1", "{u1}");
    assert_eq!(u1["task_id"], "tx", "{u1}");
    assert_eq!(u1["attempts"], 0, "{u1}");
    assert_eq!(
        u1["max_attempts"], 5,
        "the default retry.max_attempts: {u1}"
    );
    assert_eq!(u1["lease_owner"], Value::Null, "{u1}");
    assert_eq!(u1["items"].as_array().map(Vec::len), Some(1), "{u1}");
    assert_eq!(u1["items"][0]["notification_id"], "u1", "{u1}");
    let u1_time = notification_time(&s, "u1").await;
    assert_eq!(
        u1["created_at"], u1_time,
        "created_at is the notification's event time"
    );
    assert_eq!(
        u1["next_attempt_at"], u1_time,
        "no policy: due at the notification's time"
    );
    let steps = timeline_events(&u1);
    assert_eq!(steps, vec!["created"], "{u1}");

    let a1 = get_delivery(&s, "dlv:a1:desktop")
        .await
        .expect("action a1 has a desktop delivery");
    check_row(&a1);
    assert_eq!(
        (&a1["sink"], &a1["status"], &a1["priority"]),
        (&json!("app"), &json!("queued"), &json!("action")),
        "{a1}"
    );
    assert_eq!(a1["sound"], false, "action is not a sound priority: {a1}");
    assert_eq!(a1["group_key"], "g", "{a1}");

    // Lifecycle notifications: run_failed → urgent, review_requested → action.
    let f = get_delivery(&s, &format!("dlv:{failed_ntf}:desktop"))
        .await
        .unwrap_or_else(|| panic!("run_failed → {failed_ntf} (urgent) has no delivery"));
    check_row(&f);
    assert_eq!(f["notification_id"], failed_ntf.as_str(), "{f}");
    assert_eq!(f["task_id"], "t-fail", "{f}");
    assert_eq!(f["priority"], "urgent", "{f}");
    assert_eq!(f["sound"], true, "{f}");
    assert_eq!(
        (&f["sink"], &f["status"]),
        (&json!("app"), &json!("queued")),
        "{f}"
    );
    let rv = get_delivery(&s, &format!("dlv:{review_ntf}:desktop"))
        .await
        .unwrap_or_else(|| panic!("review_requested → {review_ntf} (action) has no delivery"));
    assert_eq!(rv["task_id"], "t-rev", "{rv}");
    assert_eq!(rv["priority"], "action", "{rv}");
    assert_eq!(rv["sound"], false, "{rv}");
    assert_eq!(rv["status"], "queued", "{rv}");

    // Exactly these deliveries exist (warning, info, run_completed: dashboard only).
    let all = all_deliveries(&s, "").await;
    let ids: BTreeSet<String> = all.iter().map(|d| str_of(d, "id")).collect();
    let want: BTreeSet<String> = [
        "dlv:u1:desktop".to_owned(),
        "dlv:a1:desktop".to_owned(),
        format!("dlv:{failed_ntf}:desktop"),
        format!("dlv:{review_ntf}:desktop"),
        "dlv:marker-m1:desktop".to_owned(),
    ]
    .into_iter()
    .collect();
    assert_eq!(ids, want, "the deliveries of the default routing table");
    assert_eq!(all.len(), want.len(), "a delivery listed twice: {all:?}");
    for nid in ["w1", "i1", done_ntf.as_str()] {
        assert!(
            all.iter().all(|d| d["notification_id"] != nid),
            "{nid} (warning/info) must have no delivery row"
        );
        assert_absent(&s, &format!("dlv:{nid}:desktop")).await;
        assert_absent(&s, &format!("dlv:{nid}:dashboard")).await;
    }
    // ... but they are on the dashboard.
    let dash: HashMap<String, Value> = list_notifications(&s, "", 500)
        .await
        .into_iter()
        .map(|n| (str_of(&n, "notification_id"), n))
        .collect();
    for (nid, prio) in [
        ("u1", "urgent"),
        ("a1", "action"),
        ("w1", "warning"),
        ("i1", "info"),
        (failed_ntf.as_str(), "urgent"),
        (review_ntf.as_str(), "action"),
        (done_ntf.as_str(), "info"),
    ] {
        let n = dash
            .get(nid)
            .unwrap_or_else(|| panic!("{nid} is not on the dashboard"));
        assert_eq!(n["priority"], prio, "{n}");
    }

    // Filters of the list.
    let app = all_deliveries(&s, "sink=app&route=desktop&status=queued").await;
    assert_eq!(app.len(), want.len(), "{app:?}");
    assert!(all_deliveries(&s, "sink=none").await.is_empty());
    let alice = all_deliveries(&s, "recipient=alice").await;
    let alice_ids: BTreeSet<String> = alice.iter().map(|d| str_of(d, "id")).collect();
    assert_eq!(
        alice_ids,
        ["dlv:a1:desktop", "dlv:u1:desktop"]
            .map(str::to_owned)
            .into_iter()
            .collect(),
    );

    // Every row has exactly one delivery.created on the deliveries stream, nothing else.
    let evs = s.read_all("stream=deliveries").await;
    let mut created: Vec<String> = evs
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "delivery.created", "{e}");
            str_of(e, "subject")
        })
        .collect();
    created.sort();
    assert_eq!(created, want.into_iter().collect::<Vec<_>>());
}

// ---------------------------------------------------------------------------------------------
// 2. Settings changed mid-log
// ---------------------------------------------------------------------------------------------

const CFG_DISABLED: &str = "[notifications]\nenabled = false\n";
const CFG_NO_DESKTOP: &str = "[notifications.desktop]\nenabled = false\n";
const CFG_NO_URGENT: &str = "[notifications.routing]\nurgent = []\n";
const CFG_WARNING_DESKTOP: &str = "[notifications.desktop]\npriorities = [\"warning\"]\n\
                                   [notifications.routing]\nwarning = [\"dashboard\", \"desktop\"]\n";
const CFG_PAGER: &str = "[notifications.routing]\ninfo = [\"dashboard\", \"pager\"]\n";

/// Append `lates` at the end of one batch behind 999 - len info fillers (routed to nothing
/// under every setting in force before the last phase): routing this batch takes a while, so
/// that a kill -9 right after the ack usually lands before the lates are routed.
async fn append_late(s: &Server, tag: &str, lates: Vec<Value>) {
    let mut batch: Vec<Value> = (0..999 - lates.len())
        .map(|i| notif(&format!("fill-{tag}-{i:03}"), "info", json!({})))
        .collect();
    batch.extend(lates);
    append_ok(s, &json!({ "events": batch })).await;
}

/// Restart `s` with `config` right after the last acknowledged append (kill -9, so that the
/// notifications appended just before are, at best, not yet routed). Answers the seq of the
/// `settings.updated` recorded at start.
async fn restart_with(s: &mut Server, config: &str) -> u64 {
    let before = s.read_all("stream=settings").await.len();
    s.kill9();
    s.set_config(Some(config));
    s.restart().await;
    let after = s.read_all("stream=settings").await;
    assert_eq!(
        after.len(),
        before + 1,
        "the new settings are recorded at start: {:?}",
        after.last()
    );
    after.last().and_then(|e| e["seq"].as_u64()).expect("seq")
}

/// Whether delivery `d` was created after `seq` (its `created` step).
fn created_after(d: &Value, seq: u64) -> bool {
    d["timeline"][0]["event"] == "created"
        && d["timeline"][0]["seq"].as_u64().is_some_and(|c| c > seq)
}

#[tokio::test]
async fn changed_settings_route_from_their_point_in_the_log() {
    let mut s = Server::start(ServerOpts::default()).await;
    // Barrier deliveries, never due: canceling task `barrier-k` turns `dlv:bar-k:desktop`
    // cancelled once routing has passed everything appended before the cancellation.
    let bars: Vec<Value> = (1..=3)
        .map(|k| {
            notif(
                &format!("bar-{k}"),
                "urgent",
                json!({"task_id": format!("barrier-{k}"), "deliver_after": "2099-01-01T00:00:00Z"}),
            )
        })
        .collect();
    append_ok(&s, &json!({ "events": bars })).await;
    append_ok(
        &s,
        &json!({"events": [
            notif("pre-w", "warning", json!({})),
            notif("pre-u", "urgent", json!({})),
            notif("pre-a", "action", json!({})),
        ]}),
    )
    .await;
    wait_delivery(&s, "dlv:pre-a:desktop").await;
    append_late(&s, "a", vec![notif("late-a", "urgent", json!({}))]).await;
    // Lates with a delivery that were routed only after the restart (the case under test).
    let mut routed_after_restart = Vec::new();

    // A: notifications disabled.
    let settings_seq = restart_with(&mut s, CFG_DISABLED).await;
    append_ok(
        &s,
        &json!({"events": [
            notif("a-urgent", "urgent", json!({})),
            notif("a-action", "action", json!({})),
        ]}),
    )
    .await;
    barrier(&s, 1).await;
    assert_absent(&s, "dlv:a-urgent:desktop").await;
    assert_absent(&s, "dlv:a-action:desktop").await;
    for id in ["pre-u", "pre-a"] {
        let d = get_delivery(&s, &format!("dlv:{id}:desktop"))
            .await
            .unwrap_or_else(|| panic!("{id} lost its delivery when the settings changed"));
        assert_eq!(d["status"], "queued", "{d}");
    }
    let late = get_delivery(&s, "dlv:late-a:desktop")
        .await
        .unwrap_or_else(|| {
            panic!(
                "late-a was appended before the settings change (routed after the restart): \
             it must be routed under the settings in force at its seq (defaults)"
            )
        });
    assert_eq!(late["status"], "queued", "{late}");
    if created_after(&late, settings_seq) {
        routed_after_restart.push("late-a");
    }
    let dash: HashSet<String> = list_notifications(&s, "", 500)
        .await
        .iter()
        .map(|n| str_of(n, "notification_id"))
        .collect();
    for id in ["a-urgent", "a-action", "late-a", "pre-w"] {
        assert!(
            dash.contains(id),
            "{id}: notification rows are kept when disabled"
        );
    }
    append_late(&s, "b", vec![notif("late-b", "urgent", json!({}))]).await;

    // B: desktop disabled.
    restart_with(&mut s, CFG_NO_DESKTOP).await;
    append_ok(
        &s,
        &json!({"events": [
            notif("b-urgent", "urgent", json!({})),
            notif("b-action", "action", json!({})),
        ]}),
    )
    .await;
    barrier(&s, 2).await;
    for id in ["late-b", "b-urgent", "b-action"] {
        assert_absent(&s, &format!("dlv:{id}:desktop")).await;
    }
    append_late(&s, "c", vec![notif("late-c", "action", json!({}))]).await;

    // C: routing.urgent = [].
    restart_with(&mut s, CFG_NO_URGENT).await;
    append_ok(&s, &notif("c-urgent", "urgent", json!({}))).await;
    append_ok(&s, &notif("c-action", "action", json!({}))).await;
    let c = wait_delivery(&s, "dlv:c-action:desktop").await;
    assert_eq!(c["status"], "queued", "{c}");
    assert_absent(&s, "dlv:c-urgent:desktop").await;
    assert_absent(&s, "dlv:late-c:desktop").await; // routed under B (desktop disabled)
    append_late(
        &s,
        "d",
        vec![
            notif("late-d-action", "action", json!({})),
            notif("late-d-warning", "warning", json!({})),
        ],
    )
    .await;

    // D: desktop only for warning.
    let settings_seq = restart_with(&mut s, CFG_WARNING_DESKTOP).await;
    append_ok(
        &s,
        &json!({"events": [
            notif("d-urgent", "urgent", json!({})),
            notif("d-action", "action", json!({})),
        ]}),
    )
    .await;
    append_ok(&s, &notif("d-warning", "warning", json!({}))).await;
    let d = wait_delivery(&s, "dlv:d-warning:desktop").await;
    assert_eq!(
        (&d["sink"], &d["status"], &d["priority"], &d["sound"]),
        (
            &json!("app"),
            &json!("queued"),
            &json!("warning"),
            &json!(false)
        ),
        "{d}"
    );
    assert_absent(&s, "dlv:d-urgent:desktop").await;
    assert_absent(&s, "dlv:d-action:desktop").await;
    let ld = get_delivery(&s, "dlv:late-d-action:desktop")
        .await
        .expect("late-d-action was appended under C (action → desktop): it has a delivery");
    assert_eq!(ld["status"], "queued", "{ld}");
    if created_after(&ld, settings_seq) {
        routed_after_restart.push("late-d-action");
    }
    assert_absent(&s, "dlv:late-d-warning:desktop").await; // under C, warning is dashboard only
    append_late(
        &s,
        "e",
        vec![
            notif("late-e-warning", "warning", json!({})),
            notif("late-e-info", "info", json!({})),
        ],
    )
    .await;

    // E: an unknown route configured for info.
    let settings_seq = restart_with(&mut s, CFG_PAGER).await;
    append_ok(&s, &notif("e-info", "info", json!({}))).await;
    append_ok(&s, &notif("e-urgent", "urgent", json!({}))).await;
    let eu = wait_delivery(&s, "dlv:e-urgent:desktop").await;
    assert_eq!(eu["status"], "queued", "{eu}");
    let le = get_delivery(&s, "dlv:late-e-warning:desktop")
        .await
        .expect("late-e-warning was appended under D (warning → desktop): it has a delivery");
    assert_eq!(le["priority"], "warning", "{le}");
    if created_after(&le, settings_seq) {
        routed_after_restart.push("late-e-warning");
    }
    assert_absent(&s, "dlv:late-e-info:pager").await; // routed under D
    assert_absent(&s, "dlv:late-e-info:desktop").await;
    let p = get_delivery(&s, "dlv:e-info:pager")
        .await
        .expect("routing.info = [dashboard, pager]: one skipped delivery on the unknown route");
    check_row(&p);
    assert_eq!(p["route"], "pager", "{p}");
    assert_eq!(p["status"], "skipped", "{p}");
    assert_eq!(p["reason"], "unknown_route", "{p}");
    assert_eq!(p["notification_id"], "e-info", "{p}");
    assert_eq!(p["next_attempt_at"], Value::Null, "never due: {p}");
    assert_absent(&s, "dlv:e-info:desktop").await;
    // Never claimable: not on its own sink, not on the app sink.
    let sink = str_of(&p, "sink");
    assert_eq!(sink, "none", "an unknown route has sink \"none\": {p}");
    let got = claim(&s, "app", "w-e", 1000).await;
    assert!(
        got.iter().all(|d| d["id"] != "dlv:e-info:pager"),
        "claim of sink app returned the skipped unknown-route delivery"
    );
    // "none" (what a skipped delivery shows) and a route's name are no sinks to claim for.
    for sink in ["none", "pager"] {
        let r = api_claim(&s, sink).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "claim of sink {sink}: {}",
            r.text
        );
        assert_eq!(r.json["code"], "invalid_field", "{}", r.text);
        assert!(
            r.text.contains("sink must be one of app, email, webhook"),
            "{}",
            r.text
        );
    }
    let p2 = get_delivery(&s, "dlv:e-info:pager")
        .await
        .expect("still there");
    assert_eq!(p2["status"], "skipped", "{p2}");
    assert_eq!(p2["attempts"], 0, "{p2}");

    // The whole set of deliveries of client notifications, exactly.
    let all = all_deliveries(&s, "").await;
    let got: BTreeSet<String> = all
        .iter()
        .filter(|d| !str_of(d, "notification_id").starts_with("ntf:"))
        .map(|d| str_of(d, "id"))
        .collect();
    let want: BTreeSet<String> = [
        "bar-1",
        "bar-2",
        "bar-3",
        "pre-u",
        "pre-a",
        "late-a",
        "c-action",
        "d-warning",
        "late-d-action",
        "late-e-warning",
        "e-urgent",
    ]
    .iter()
    .map(|n| format!("dlv:{n}:desktop"))
    .chain(["dlv:e-info:pager".to_owned()])
    .collect();
    assert_eq!(got, want, "deliveries under the changing settings");
    // The fillers appended before the pager setting are routed under D: nothing.
    assert!(
        all.iter()
            .all(|d| !str_of(d, "notification_id").starts_with("fill-")),
        "an info filler got a delivery"
    );
    eprintln!("routed only after the settings change: {routed_after_restart:?}");
    assert!(
        !routed_after_restart.is_empty(),
        "every late notification was routed before its kill -9: the case \"appended before \
         the change, routed after it\" was not exercised"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Quiet hours
// ---------------------------------------------------------------------------------------------

const CFG_QUIET: &str = "[notifications.routes.desktop]\nquiet_hours = [\"22:00\", \"09:00\"]\n\
                         quiet_hours_bypass = [\"urgent\"]\n";

#[tokio::test]
async fn quiet_hours_move_due_times_to_the_window_end() {
    let s = Server::start(ServerOpts::default().config(CFG_QUIET)).await;
    append_ok(
        &s,
        &json!({"stream": "recipients", "subject": "tz-user", "type": "recipient.updated",
                "payload": {"tz_offset_minutes": 120}}),
    )
    .await;
    // Dates some weeks ahead (never a fixed year): the hours are what matter.
    let (day, next) = (future_date(60), future_date(61));
    // (id, priority, recipient, deliver_after, expected next_attempt_at)
    let cases: [(&str, &str, &str, String, String); 10] = [
        (
            "q-2159",
            "action",
            "utc-user",
            format!("{day}T21:59:00Z"),
            format!("{day}T21:59:00.000000Z"),
        ),
        (
            "q-2200",
            "action",
            "utc-user",
            format!("{day}T22:00:00Z"),
            format!("{next}T09:00:00.000000Z"),
        ),
        (
            "q-2201",
            "action",
            "utc-user",
            format!("{day}T22:01:00Z"),
            format!("{next}T09:00:00.000000Z"),
        ),
        (
            "q-0300",
            "action",
            "utc-user",
            format!("{day}T03:00:00Z"),
            format!("{day}T09:00:00.000000Z"),
        ),
        (
            "q-0859",
            "action",
            "utc-user",
            format!("{day}T08:59:59.5Z"),
            format!("{day}T09:00:00.000000Z"),
        ),
        (
            "q-0900",
            "action",
            "utc-user",
            format!("{day}T09:00:00Z"),
            format!("{day}T09:00:00.000000Z"),
        ),
        // Without a recipient: UTC as well.
        (
            "q-norcpt",
            "action",
            "",
            format!("{day}T23:30:00Z"),
            format!("{next}T09:00:00.000000Z"),
        ),
        // UTC+02:00: 20:01Z is 22:01 local → 09:00 local = 07:00Z.
        (
            "q-tz-2001",
            "action",
            "tz-user",
            format!("{day}T20:01:00Z"),
            format!("{next}T07:00:00.000000Z"),
        ),
        // 07:30Z is 09:30 local: outside the window (in UTC it would be inside).
        (
            "q-tz-0730",
            "action",
            "tz-user",
            format!("{day}T07:30:00Z"),
            format!("{day}T07:30:00.000000Z"),
        ),
        // Bypass: urgent is not moved.
        (
            "q-urgent",
            "urgent",
            "utc-user",
            format!("{day}T22:01:00Z"),
            format!("{day}T22:01:00.000000Z"),
        ),
    ];
    let batch: Vec<Value> = cases
        .iter()
        .map(|(id, prio, rcpt, after, _)| {
            let mut extra = json!({"deliver_after": after});
            if !rcpt.is_empty() {
                extra["recipient"] = json!(rcpt);
            }
            notif(id, prio, extra)
        })
        .collect();
    append_ok(&s, &json!({ "events": batch })).await;
    let mut wrong = Vec::new();
    for (id, prio, rcpt, after, want) in cases {
        let d = wait_delivery(&s, &format!("dlv:{id}:desktop")).await;
        check_row(&d);
        assert_eq!(d["status"], "queued", "{d}");
        if d["next_attempt_at"] != want {
            wrong.push(format!(
                "{id} ({prio}, recipient {rcpt:?}, deliver_after {after}): next_attempt_at {} \
                 instead of {want}",
                d["next_attempt_at"]
            ));
        }
    }
    assert!(wrong.is_empty(), "quiet hours:\n{}", wrong.join("\n"));
    // Nothing of it is due now.
    let got = claim(&s, "app", "w-q", 1000).await;
    assert!(
        got.is_empty(),
        "claimed deliveries due weeks ahead: {got:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Delay window
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn delay_window_draws_within_its_bounds() {
    let s = Server::start(
        ServerOpts::default().config("[notifications.routes.desktop]\ndelay = [\"2s\", \"5s\"]\n"),
    )
    .await;
    let batch: Vec<Value> = (0..50)
        .map(|i| notif(&format!("dl-{i:02}"), "action", json!({"recipient": "r"})))
        .collect();
    append_ok(&s, &json!({ "events": batch })).await;
    let rows = wait_for(WAIT, "the 50 delayed deliveries", || async {
        let rows = all_deliveries(&s, "").await;
        (rows.len() >= 50).then_some(rows)
    })
    .await;
    let claim_start = now_us();
    let claimed = claim(&s, "app", "w-d", 1000).await;
    let claim_end = now_us();
    assert_eq!(rows.len(), 50, "one delivery per notification");
    let mut delays = BTreeSet::new();
    let mut earliest = i64::MAX;
    for d in &rows {
        check_row(d);
        assert_eq!(d["status"], "queued", "{d}");
        let created = parse_us(d["created_at"].as_str().expect("created_at"));
        let next = parse_us(d["next_attempt_at"].as_str().expect("next_attempt_at"));
        let delay = next - created;
        assert!(
            (2_000_000..=5_000_000).contains(&delay),
            "next_attempt_at − created_at = {delay} µs, outside [2 s, 5 s]: {d}"
        );
        delays.insert(delay);
        earliest = earliest.min(next);
    }
    assert!(
        delays.len() > 1,
        "every delay drawn is the same ({delays:?}): not a random draw in the window"
    );
    eprintln!(
        "delay window: {} distinct delays from {:?} to {:?} µs; claim {} µs before the \
         earliest due time",
        delays.len(),
        delays.first(),
        delays.last(),
        earliest - claim_start
    );
    // A claim right away leases nothing that is not due yet.
    for d in &claimed {
        let next = parse_us(d["next_attempt_at"].as_str().unwrap_or_default());
        assert!(
            next <= claim_end,
            "claim leased a delivery due later ({}): {d}",
            d["next_attempt_at"]
        );
    }
    if claim_end < earliest {
        assert!(claimed.is_empty(), "{claimed:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Suppression
// ---------------------------------------------------------------------------------------------

fn recipient_ev(who: &str, ty: &str, payload: Value) -> Value {
    json!({"stream": "recipients", "subject": who, "type": ty, "payload": payload})
}

/// Suppressed at the append: the crisis block refuses the notification (section 14; it was
/// accepted and skipped at routing before the block existed). Suppressed after the append: the
/// claim skips the delivery instead of leasing it.
#[tokio::test]
async fn suppressed_recipients_are_blocked_at_append_and_skipped_at_claim() {
    let s = Server::start(ServerOpts::default()).await;
    append_ok(
        &s,
        &json!({"events": [
            recipient_ev("carol", "recipient.suppressed", json!({"reason": "vacation"})),
            recipient_ev("erin", "recipient.suppressed",
                         json!({"reason": "old", "until": "2020-01-01T00:00:00Z"})),
            recipient_ev("frank", "recipient.suppressed",
                         json!({"reason": "long", "until": "2099-01-01T00:00:00Z"})),
        ]}),
    )
    .await;
    for (id, priority, who) in [
        ("n-carol", "urgent", "carol"),
        ("n-frank", "action", "frank"),
    ] {
        let r = s
            .send(s.request(reqwest::Method::POST, "/v1/events").json(&notif(
                id,
                priority,
                json!({"recipient": who}),
            )))
            .await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{id}: {}", r.text);
        assert_eq!(r.json["code"], "recipient_blocked", "{id}: {}", r.text);
        assert!(
            get_delivery(&s, &format!("dlv:{id}:desktop"))
                .await
                .is_none()
        );
    }
    append_ok(
        &s,
        &json!({"events": [
            notif("n-erin", "urgent", json!({"recipient": "erin"})),
            notif("n-dave-1", "urgent", json!({"recipient": "dave"})),
        ]}),
    )
    .await;
    let dave1 = wait_delivery(&s, "dlv:n-dave-1:desktop").await;
    assert_eq!(dave1["status"], "queued", "{dave1}");
    let erin = wait_delivery(&s, "dlv:n-erin:desktop").await;
    assert_eq!(
        erin["status"], "queued",
        "a suppression whose `until` has passed does not suppress: {erin}"
    );

    // Suppression after creation: the claim skips instead of leasing.
    append_ok(
        &s,
        &recipient_ev("dave", "recipient.suppressed", json!({"reason": "dnd"})),
    )
    .await;
    let claimed = claim(&s, "app", "w-s", 1000).await;
    let ids: BTreeSet<String> = claimed.iter().map(|d| str_of(d, "id")).collect();
    assert_eq!(
        ids,
        ["dlv:n-erin:desktop".to_owned()].into_iter().collect(),
        "the claim leases erin's delivery and none of the suppressed ones"
    );
    let dave1 = get_delivery(&s, "dlv:n-dave-1:desktop")
        .await
        .expect("dave");
    assert_eq!(dave1["status"], "skipped", "re-checked at claim: {dave1}");
    assert_eq!(dave1["reason"], "suppressed", "{dave1}");
    assert_eq!(dave1["attempts"], 0, "{dave1}");
    assert_eq!(dave1["lease_owner"], Value::Null, "{dave1}");
    assert_eq!(
        timeline_events(&dave1),
        vec!["created", "skipped"],
        "{dave1}"
    );
    assert!(
        claim(&s, "app", "w-s2", 1000).await.is_empty(),
        "nothing left"
    );

    // Lifted: new notifications are queued again.
    append_ok(
        &s,
        &json!({"events": [
            recipient_ev("dave", "recipient.unsuppressed", json!({})),
            notif("n-dave-2", "urgent", json!({"recipient": "dave"})),
        ]}),
    )
    .await;
    let dave2 = wait_delivery(&s, "dlv:n-dave-2:desktop").await;
    assert_eq!(
        dave2["status"], "queued",
        "after recipient.unsuppressed: {dave2}"
    );
    let claimed = claim(&s, "app", "w-s3", 1000).await;
    assert_eq!(
        claimed.iter().map(|d| str_of(d, "id")).collect::<Vec<_>>(),
        vec!["dlv:n-dave-2:desktop".to_owned()]
    );
    // The earlier skip stays a skip.
    let dave1 = get_delivery(&s, "dlv:n-dave-1:desktop")
        .await
        .expect("dave");
    assert_eq!(dave1["status"], "skipped", "{dave1}");

    // Each skip is an event on the deliveries stream.
    let skipped: Vec<String> = s
        .read_all("stream=deliveries&type=delivery.skipped")
        .await
        .iter()
        .map(|e| str_of(e, "subject"))
        .collect();
    assert_eq!(skipped, vec!["dlv:n-dave-1:desktop".to_owned()]);
}

// ---------------------------------------------------------------------------------------------
// 6. Digest
// ---------------------------------------------------------------------------------------------

const CFG_DIGEST: &str =
    "[notifications.routes.desktop]\ndigest = { window = \"10m\", max_items = 3 }\n";

#[tokio::test]
async fn digests_join_within_the_window_however_many() {
    let s = Server::start(ServerOpts::default().config(CFG_DIGEST)).await;
    let g = |id: &str, group: Option<&str>| {
        let mut extra = json!({"recipient": "ann", "body": format!("body {id}")});
        if let Some(g) = group {
            extra["group_key"] = json!(g);
        }
        notif(id, "action", extra)
    };
    append_ok(
        &s,
        &json!({"events": [g("d1", Some("g1")), g("d2", Some("g1")), g("d3", Some("g1"))]}),
    )
    .await;
    append_ok(&s, &g("d4", Some("g1"))).await;
    append_ok(
        &s,
        &json!({"events": [
            g("d5", Some("g2")),
            g("d6", None),
            // Same group key, another recipient: its own digest.
            notif("d7", "action", json!({"recipient": "zed", "group_key": "g1"})),
        ]}),
    )
    .await;
    // The window edge, with deliver_after (a date weeks ahead, never a fixed year).
    let dg = future_date(90);
    append_ok(
        &s,
        &json!({"events": [
            notif("e1", "action", json!({"recipient": "bob", "group_key": "edge",
                                          "deliver_after": format!("{dg}T12:00:00Z")})),
            notif("e2", "action", json!({"recipient": "bob", "group_key": "edge",
                                          "deliver_after": format!("{dg}T12:09:59Z")})),
            notif("e3", "action", json!({"recipient": "bob", "group_key": "edge",
                                          "deliver_after": format!("{dg}T12:10:00Z")})),
        ]}),
    )
    .await;
    settle(&s, "dg1").await;

    let d1 = get_delivery(&s, "dlv:d1:desktop").await.expect("d1 digest");
    check_row(&d1);
    let items: Vec<String> = d1["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| str_of(i, "notification_id"))
        .collect();
    // A digest is never split (section 4): d4 joins too, counted past max_items = 3, and the
    // title is the summary template once past summary_after (= max_items by default).
    assert_eq!(items, vec!["d1", "d2", "d3"], "{d1}");
    assert_eq!(d1["more"], 1, "{d1}");
    assert_eq!(d1["title"], "You have 4 new updates", "{d1}");
    assert_eq!(d1["status"], "queued", "{d1}");
    let t1 = parse_us(&notification_time(&s, "d1").await);
    assert_eq!(
        parse_us(d1["next_attempt_at"].as_str().expect("next_attempt_at")),
        t1 + 600_000_000,
        "held until the first notification's time + 10 min: {d1}"
    );
    assert_eq!(
        timeline_events(&d1),
        vec!["created", "joined", "joined", "joined"],
        "{d1}"
    );
    for id in ["d2", "d3", "d4", "e2"] {
        assert_absent(&s, &format!("dlv:{id}:desktop")).await;
    }
    // d4's status record shows the digest it joined, though the digest does not list it.
    let st4 = s.get("/v1/notifications/d4").await;
    assert_eq!(
        st4.json["deliveries"][0]["id"], "dlv:d1:desktop",
        "{}",
        st4.text
    );
    let by_n = s.get("/v1/deliveries?notification_id=d4").await;
    assert_eq!(
        by_n.json["deliveries"][0]["id"], "dlv:d1:desktop",
        "{}",
        by_n.text
    );
    for id in ["d5", "d6", "d7"] {
        let d = get_delivery(&s, &format!("dlv:{id}:desktop"))
            .await
            .unwrap_or_else(|| panic!("{id} has its own delivery"));
        assert_eq!(d["items"].as_array().map(Vec::len), Some(1), "{d}");
        assert_eq!(d["title"], format!("title of {id}"), "{d}");
    }
    let d6 = get_delivery(&s, "dlv:d6:desktop").await.expect("d6");
    assert_eq!(
        d6["next_attempt_at"], d6["created_at"],
        "no group_key: not held for a digest: {d6}"
    );

    let e1 = get_delivery(&s, "dlv:e1:desktop").await.expect("e1");
    let items: Vec<String> = e1["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| str_of(i, "notification_id"))
        .collect();
    assert_eq!(
        items,
        vec!["e1", "e2"],
        "T + 10m − 1s joins, T + 10m does not: {e1}"
    );
    assert_eq!(e1["title"], "2 new updates", "{e1}");
    assert_eq!(
        e1["next_attempt_at"],
        format!("{dg}T12:10:00.000000Z"),
        "{e1}"
    );
    let e3 = get_delivery(&s, "dlv:e3:desktop")
        .await
        .expect("e3 at the window end: a new delivery");
    assert_eq!(e3["items"].as_array().map(Vec::len), Some(1), "{e3}");
    assert_eq!(
        e3["next_attempt_at"],
        format!("{dg}T12:20:00.000000Z"),
        "{e3}"
    );

    // A replayed notification (same event_id) is a duplicate and never joins twice.
    let (st, body) = s
        .append(&notif(
            "e2",
            "action",
            json!({"recipient": "bob", "group_key": "edge",
                   "deliver_after": format!("{dg}T12:09:59Z")}),
        ))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert!(receipts(&body)[0].2, "the replay is a duplicate: {body}");
    // e4 joins the open digest of the group, now e3's (e2, were it routed again, would have
    // joined it as well: 12:09:59 is before its end).
    append_ok(
        &s,
        &notif(
            "e4",
            "action",
            json!({"recipient": "bob", "group_key": "edge",
                   "deliver_after": format!("{dg}T12:15:00Z")}),
        ),
    )
    .await;
    settle(&s, "dg2").await;
    for (id, want) in [("e1", ["e1", "e2"]), ("e3", ["e3", "e4"])] {
        let d = get_delivery(&s, &format!("dlv:{id}:desktop"))
            .await
            .expect("digest");
        let items: Vec<String> = d["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| str_of(i, "notification_id"))
            .collect();
        assert_eq!(items, want, "{d}");
        assert_eq!(d["title"], "2 new updates", "{d}");
    }
    let joined: Vec<String> = s
        .read_all("stream=deliveries&type=delivery.joined")
        .await
        .iter()
        .map(|e| {
            format!(
                "{}<-{}",
                str_of(e, "subject"),
                e["payload"]["notification_id"]
            )
        })
        .collect();
    assert_eq!(
        joined,
        vec![
            "dlv:d1:desktop<-\"d2\"",
            "dlv:d1:desktop<-\"d3\"",
            "dlv:d1:desktop<-\"d4\"",
            "dlv:e1:desktop<-\"e2\"",
            "dlv:e3:desktop<-\"e4\"",
        ],
        "one delivery.joined per joining notification"
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Cancellation
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn task_cancellation_cancels_undelivered_deliveries() {
    let s = Server::start(ServerOpts::default()).await;
    let r = append_ok(
        &s,
        &json!({"events": [
            task_ev("tc", "task.created", json!({"project_id": "p"})),
            task_ev("tc", "task.run_started", json!({"run_id": "r1"})),
            task_ev("tc", "task.run_failed", json!({"run_id": "r1", "error": "x"})),
            notif("n-tc-1", "action", json!({"task_id": "tc"})),
            notif("n-other", "urgent", json!({"task_id": "other"})),
        ]}),
    )
    .await;
    let failed = format!("dlv:ntf:{}:desktop", r[2].1);
    let d = wait_delivery(&s, &failed).await;
    assert_eq!(d["status"], "queued", "{d}");
    assert_eq!(d["task_id"], "tc", "{d}");
    wait_delivery(&s, "dlv:n-tc-1:desktop").await;
    wait_delivery(&s, "dlv:n-other:desktop").await;

    append_ok(
        &s,
        &task_ev("tc", "task.canceled", json!({"reason": "stop"})),
    )
    .await;
    for id in [failed.as_str(), "dlv:n-tc-1:desktop"] {
        let d = wait_for(WAIT, &format!("{id} cancelled"), || async {
            get_delivery(&s, id)
                .await
                .filter(|d| d["status"] != "queued")
        })
        .await;
        assert_eq!(d["status"], "cancelled", "{d}");
        assert_eq!(d["reason"], "task_canceled", "{d}");
        assert_eq!(d["next_attempt_at"], Value::Null, "{d}");
        assert_eq!(timeline_events(&d), vec!["created", "cancelled"], "{d}");
    }
    // A later notification about the same task is routed normally.
    append_ok(&s, &notif("n-tc-2", "urgent", json!({"task_id": "tc"}))).await;
    let later = wait_delivery(&s, "dlv:n-tc-2:desktop").await;
    assert_eq!(later["status"], "queued", "{later}");

    // Run_failed and cancel in one batch: the notification of run_failed is made (and routed)
    // after the cancellation, and its delivery is created cancelled.
    let r2 = append_ok(
        &s,
        &json!({"events": [
            task_ev("tc2", "task.created", json!({"project_id": "p"})),
            task_ev("tc2", "task.run_started", json!({"run_id": "r1"})),
            task_ev("tc2", "task.run_failed", json!({"run_id": "r1", "error": "x"})),
            task_ev("tc2", "task.canceled", json!({"reason": "stop"})),
        ]}),
    )
    .await;
    let late = wait_delivery(&s, &format!("dlv:ntf:{}:desktop", r2[2].1)).await;
    assert_eq!(
        late["status"], "cancelled",
        "a notification from before the task's cancellation, routed after it: {late}"
    );
    assert_eq!(late["reason"], "task_canceled", "{late}");

    let claimed: BTreeSet<String> = claim(&s, "app", "w-c", 1000)
        .await
        .iter()
        .map(|d| str_of(d, "id"))
        .collect();
    assert_eq!(
        claimed,
        ["dlv:n-other:desktop", "dlv:n-tc-2:desktop"]
            .map(str::to_owned)
            .into_iter()
            .collect(),
        "the claim never returns cancelled deliveries"
    );
    let other = get_delivery(&s, "dlv:n-other:desktop")
        .await
        .expect("other");
    assert_eq!(
        other["status"], "leased",
        "another task is untouched: {other}"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Exactly once across kill -9
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_notification_gets_exactly_one_delivery_across_kill9() {
    const N: usize = 3_000;
    let mut s = Server::start(ServerOpts::default()).await;
    let ids: Vec<String> = (0..N).map(|i| format!("x-{i:05}")).collect();
    for chunk in ids.chunks(500) {
        let batch: Vec<Value> = chunk
            .iter()
            .map(|id| notif(id, "urgent", json!({"recipient": "ops"})))
            .collect();
        append_ok(&s, &json!({ "events": batch })).await;
    }
    s.kill9();
    s.restart().await;
    let head_at_restart = s.start_head();
    let routed_before = s.read_all("stream=deliveries").await.len();
    eprintln!(
        "kill -9 right after the last append: {routed_before} of {N} routed at the first \
         read after the restart"
    );
    let last = format!("dlv:{}:desktop", ids[N - 1]);
    wait_delivery(&s, &last).await;
    // Routing is in log order: the last one routed means all were.
    let all = all_deliveries(&s, "").await;
    let mut per_notification: HashMap<String, usize> = HashMap::new();
    let mut seen = HashSet::new();
    for d in &all {
        let id = str_of(d, "id");
        assert!(seen.insert(id.clone()), "{id} listed twice");
        let nid = str_of(d, "notification_id");
        assert_eq!(id, format!("dlv:{nid}:desktop"), "{d}");
        assert_eq!(d["status"], "queued", "{d}");
        *per_notification.entry(nid).or_default() += 1;
    }
    assert_eq!(all.len(), N, "one delivery per notification");
    for id in &ids {
        assert_eq!(
            per_notification.get(id),
            Some(&1),
            "{id}: deliveries across kill -9"
        );
    }
    let evs = s.read_all("stream=deliveries").await;
    let mut subjects = HashSet::new();
    for e in &evs {
        assert_eq!(e["type"], "delivery.created", "{e}");
        assert!(
            subjects.insert(str_of(e, "subject")),
            "two delivery.created for {}",
            e["subject"]
        );
    }
    assert_eq!(
        evs.len(),
        N,
        "delivery.created events on the deliveries stream"
    );
    let v = rebuild_or_verify(&s, "deliveries", "verify").await;
    assert_eq!(v["identical"], true, "deliveries verify after kill -9: {v}");
    assert_eq!(v["first_divergent_seq"], Value::Null, "{v}");
    assert_eq!(v["swapped"], false, "{v}");
    assert!(
        v["events_replayed"]
            .as_u64()
            .is_some_and(|n| n >= head_at_restart),
        "{v}"
    );
}

// ---------------------------------------------------------------------------------------------
// 9. Rebuild after mixed traffic
// ---------------------------------------------------------------------------------------------

const CFG_MIX: &str = "[notifications.routing]\ninfo = [\"dashboard\", \"pager\"]\n\
                       [notifications.routes.desktop]\ndigest = { window = \"10m\", max_items = 3 }\n";

#[tokio::test]
async fn rebuild_of_deliveries_after_mixed_traffic_is_identical() {
    let mut s = Server::start(ServerOpts::default().config(CFG_MIX)).await;
    let mut events: Vec<Value> = (1..=8)
        .map(|i| {
            notif(
                &format!("m-{i}"),
                if i % 2 == 0 { "urgent" } else { "action" },
                json!({"recipient": format!("r{}", i % 3), "body": format!("b{i}")}),
            )
        })
        .collect();
    events.extend([
        notif(
            "g-1",
            "action",
            json!({"recipient": "r1", "group_key": "gg"}),
        ),
        notif(
            "g-2",
            "action",
            json!({"recipient": "r1", "group_key": "gg"}),
        ),
        notif(
            "g-3",
            "action",
            json!({"recipient": "r1", "group_key": "gg"}),
        ),
        notif("i-1", "info", json!({})),
        // Suppressed after its notification (one before would block the batch, section 14):
        // routed or claimed, it is skipped.
        notif("s-1", "urgent", json!({"recipient": "sup"})),
        recipient_ev("sup", "recipient.suppressed", json!({"reason": "x"})),
        task_ev("mt", "task.created", json!({"project_id": "p"})),
        task_ev("mt", "task.run_started", json!({"run_id": "r1"})),
        task_ev(
            "mt",
            "task.run_failed",
            json!({"run_id": "r1", "error": "x"}),
        ),
    ]);
    let r = append_ok(&s, &json!({ "events": events })).await;
    let mt = format!("dlv:ntf:{}:desktop", r[r.len() - 1].1);
    wait_delivery(&s, &mt).await;
    append_ok(
        &s,
        &task_ev("mt", "task.canceled", json!({"reason": "stop"})),
    )
    .await;
    wait_routed(&s, WAIT).await;
    settle(&s, "mx").await;
    assert_eq!(
        get_delivery(&s, &mt).await.expect("mt")["status"],
        "cancelled"
    );

    let claimed: BTreeSet<String> = claim_with(&s, "app", "w1", 1000, Some(3_600_000))
        .await
        .iter()
        .map(|d| str_of(d, "id"))
        .collect();
    let want: BTreeSet<String> = (1..=8)
        .map(|i| format!("dlv:m-{i}:desktop"))
        .chain(["dlv:marker-mx:desktop".to_owned()])
        .collect();
    assert_eq!(claimed, want, "the due deliveries");
    let post = |path: String, body: Value| {
        let s = s.api();
        async move {
            let r = s
                .send(s.request(reqwest::Method::POST, &path).json(&body))
                .await;
            assert_eq!(r.status, StatusCode::OK, "POST {path} {body}: {}", r.text);
            r.json
        }
    };
    let p = |id: &str, action: &str| format!("/v1/deliveries/{}/{action}", encode_path(id));
    post(
        p("dlv:m-1:desktop", "complete"),
        json!({"owner": "w1", "external_id": "ext-1"}),
    )
    .await;
    post(p("dlv:m-2:desktop", "complete"), json!({"owner": "w1"})).await;
    let f3 = post(
        p("dlv:m-3:desktop", "fail"),
        json!({"owner": "w1", "error_code": "timeout", "error": "slow", "retry_after_ms": 3_600_000}),
    )
    .await;
    assert_eq!(f3["status"], "retry_wait", "{f3}");
    let f4 = post(
        p("dlv:m-4:desktop", "fail"),
        json!({"owner": "w1", "error_code": "gone", "retryable": false}),
    )
    .await;
    assert_eq!(f4["status"], "parked", "{f4}");
    post(
        p("dlv:m-5:desktop", "fail"),
        json!({"owner": "w1", "error_code": "gone", "retryable": false}),
    )
    .await;
    let d5 = post(
        p("dlv:m-5:desktop", "discard"),
        json!({"by": "op", "reason": "no"}),
    )
    .await;
    assert_eq!(d5["status"], "discarded", "{d5}");
    post(
        p("dlv:m-6:desktop", "fail"),
        json!({"owner": "w1", "error_code": "gone", "retryable": false}),
    )
    .await;
    let r6 = post(p("dlv:m-6:desktop", "retry"), json!({})).await;
    assert_eq!(r6["status"], "queued", "{r6}");
    post(
        p("dlv:m-7:desktop", "extend"),
        json!({"owner": "w1", "lease_ms": 3_600_000}),
    )
    .await;
    // m-8 and the marker stay leased.

    let ids: Vec<String> = all_deliveries(&s, "")
        .await
        .iter()
        .map(|d| str_of(d, "id"))
        .collect();
    let statuses: BTreeMap<String, usize> =
        all_deliveries(&s, "")
            .await
            .iter()
            .fold(BTreeMap::new(), |mut m, d| {
                *m.entry(str_of(d, "status")).or_default() += 1;
                m
            });
    eprintln!(
        "rebuild after mixed traffic: {} deliveries {statuses:?}",
        ids.len()
    );
    for st in [
        "queued",
        "leased",
        "retry_wait",
        "sent",
        "parked",
        "discarded",
        "skipped",
        "cancelled",
    ] {
        assert!(
            statuses.contains_key(st),
            "the mix has no {st} delivery: {statuses:?}"
        );
    }
    let before = snapshot(&s, &ids).await;
    let head = s.head().await;
    let r = rebuild_or_verify(&s, "deliveries", "rebuild").await;
    assert_eq!(r["name"], "deliveries", "{r}");
    assert_eq!(r["identical"], true, "rebuild of deliveries: {r}");
    assert_eq!(r["first_divergent_seq"], Value::Null, "{r}");
    assert_eq!(r["swapped"], true, "{r}");
    assert!(
        r["events_replayed"].as_u64().is_some_and(|n| n >= head),
        "{r}"
    );
    let after = snapshot(&s, &ids).await;
    assert_same_rows(&before, &after, "after the rebuild");
    let listed: Vec<String> = all_deliveries(&s, "")
        .await
        .iter()
        .map(|d| str_of(d, "id"))
        .collect();
    assert_eq!(listed, ids, "the list after the rebuild");
    let v = rebuild_or_verify(&s, "deliveries", "verify").await;
    assert_eq!(v["identical"], true, "verify after the rebuild: {v}");

    // And the same rows after a kill -9 and restart.
    s.kill9();
    s.restart().await;
    let again = snapshot(&s, &ids).await;
    assert_same_rows(&before, &again, "after kill -9 and restart");
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A `notification.requested` `id` of `priority`, titled "title of <id>", with `extra` fields.
fn notif(id: &str, priority: &str, extra: Value) -> Value {
    let mut p = json!({"priority": priority, "title": format!("title of {id}")});
    if let (Some(p), Some(x)) = (p.as_object_mut(), extra.as_object()) {
        for (k, v) in x {
            p.insert(k.clone(), v.clone());
        }
    }
    notif_ev(id, p)
}

#[track_caller]
fn str_of(v: &Value, key: &str) -> String {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no string `{key}` in {v}"))
        .to_owned()
}

/// `GET /v1/deliveries/{id}`: the row, or `None` on 404 `delivery_not_found`.
async fn get_delivery(api: &Api, id: &str) -> Option<Value> {
    let r = api
        .get(&format!("/v1/deliveries/{}", encode_path(id)))
        .await;
    match r.status {
        StatusCode::OK => {
            assert_eq!(r.json["id"], id, "GET /v1/deliveries/{id}: {}", r.text);
            Some(r.json)
        }
        StatusCode::NOT_FOUND => {
            assert_eq!(
                r.code(),
                Some("delivery_not_found"),
                "GET /v1/deliveries/{id}: {}",
                r.text
            );
            None
        }
        other => panic!("GET /v1/deliveries/{id}: {other}: {}", tail(&r.text, 2000)),
    }
}

/// Wait (bounded) until delivery `id` exists.
async fn wait_delivery(api: &Api, id: &str) -> Value {
    wait_for(WAIT, &format!("delivery {id}"), || get_delivery(api, id)).await
}

/// Delivery `id` does not exist (call after a marker settled routing past its notification).
async fn assert_absent(api: &Api, id: &str) {
    if let Some(d) = get_delivery(api, id).await {
        panic!("delivery {id} must not exist: {d}");
    }
}

/// Append an urgent marker notification and wait for its delivery: routing is in log order,
/// so everything appended before it has been routed. Needs settings that route urgent.
async fn settle(api: &Api, tag: &str) -> Value {
    let id = format!("marker-{tag}");
    append_ok(api, &notif(&id, "urgent", json!({}))).await;
    wait_delivery(api, &format!("dlv:{id}:desktop")).await
}

/// Cancel task `barrier-<k>` and wait until the never-due delivery `dlv:bar-<k>:desktop` is
/// cancelled: routing has then passed everything appended before (works whatever the settings
/// route).
async fn barrier(api: &Api, k: u32) {
    let id = format!("dlv:bar-{k}:desktop");
    append_ok(
        api,
        &task_ev(
            &format!("barrier-{k}"),
            "task.canceled",
            json!({"reason": "barrier"}),
        ),
    )
    .await;
    let d = wait_for(WAIT, &format!("{id} cancelled"), || async {
        get_delivery(api, &id)
            .await
            .filter(|d| d["status"] == "cancelled")
    })
    .await;
    assert_eq!(d["reason"], "task_canceled", "{d}");
}

/// Every delivery of `GET /v1/deliveries?<query>`, paging with `after` / `next_after`; the
/// list carries no timeline.
async fn all_deliveries(api: &Api, query: &str) -> Vec<Value> {
    let all = list_after(api, "/v1/deliveries", "deliveries", query, 1000).await;
    for d in &all {
        assert!(
            d.get("timeline").is_none(),
            "the list carries no timeline: {d}"
        );
    }
    all
}

async fn claim(api: &Api, sink: &str, owner: &str, limit: u32) -> Vec<Value> {
    claim_with(api, sink, owner, limit, None).await
}

/// `POST /v1/deliveries/claim` for `sink`, whatever it answers.
async fn api_claim(api: &Api, sink: &str) -> tidemark_tests::Reply {
    let body = json!({"sink": sink, "owner": "w-e", "limit": 10});
    api.send(
        api.request(reqwest::Method::POST, "/v1/deliveries/claim")
            .json(&body),
    )
    .await
}

/// `POST /v1/deliveries/claim`; panics unless 200.
async fn claim_with(
    api: &Api,
    sink: &str,
    owner: &str,
    limit: u32,
    lease_ms: Option<u64>,
) -> Vec<Value> {
    let mut body = json!({"sink": sink, "owner": owner, "limit": limit});
    if let Some(ms) = lease_ms {
        body["lease_ms"] = json!(ms);
    }
    let r = api
        .send(
            api.request(reqwest::Method::POST, "/v1/deliveries/claim")
                .json(&body),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "claim {body}: {}", r.text);
    let rows = r.json["deliveries"]
        .as_array()
        .unwrap_or_else(|| panic!("claim: no `deliveries`: {}", r.text))
        .clone();
    for d in &rows {
        assert_eq!(d["status"], "leased", "a claimed row is leased: {d}");
        assert_eq!(d["lease_owner"], owner, "{d}");
        assert_eq!(d["sink"], sink, "{d}");
    }
    rows
}

/// The event `time` of notification `id` (a `notification.requested`, subject = id).
async fn notification_time(api: &Api, id: &str) -> String {
    let evs = api
        .read_all(&format!("stream=notifications&subject={}", encode_path(id)))
        .await;
    let e = evs
        .iter()
        .find(|e| e["type"] == "notification.requested")
        .unwrap_or_else(|| panic!("no notification.requested {id}: {evs:?}"));
    str_of(e, "time")
}

/// The `event` of each timeline step.
fn timeline_events(d: &Value) -> Vec<String> {
    d["timeline"]
        .as_array()
        .unwrap_or_else(|| panic!("no timeline in {d}"))
        .iter()
        .map(|s| str_of(s, "event"))
        .collect()
}

/// Shape of a delivery row: its time fields are RFC 3339 UTC with microseconds.
#[track_caller]
fn check_row(d: &Value) {
    for k in ["created_at", "updated_at"] {
        check_time(d[k].as_str().unwrap_or_else(|| panic!("no {k} in {d}")));
    }
    for k in ["next_attempt_at", "lease_expires_at", "delivered_at"] {
        if let Some(t) = d[k].as_str() {
            check_time(t);
        }
    }
    let id = str_of(d, "id");
    assert_eq!(
        id,
        format!(
            "dlv:{}:{}",
            str_of(d, "notification_id"),
            str_of(d, "route")
        ),
        "delivery id is dlv:<notification_id>:<route>"
    );
}

/// Each row with its timeline, by id.
async fn snapshot(api: &Api, ids: &[String]) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for id in ids {
        let d = get_delivery(api, id)
            .await
            .unwrap_or_else(|| panic!("{id} is gone"));
        out.insert(id.clone(), d);
    }
    out
}

#[track_caller]
fn assert_same_rows(a: &BTreeMap<String, Value>, b: &BTreeMap<String, Value>, when: &str) {
    assert_eq!(a.len(), b.len(), "{when}");
    for (id, row) in a {
        assert_eq!(
            Some(row),
            b.get(id),
            "{when}: GET /v1/deliveries/{id} answers another row"
        );
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.f…]Z` in microseconds since the Unix epoch.
#[track_caller]
fn parse_us(t: &str) -> i64 {
    let bad = || panic!("not an RFC 3339 UTC time: {t:?}");
    let b = t.as_bytes();
    if b.len() < 20 || b[b.len() - 1] != b'Z' {
        bad();
    }
    let num = |r: std::ops::Range<usize>| -> i64 { t[r].parse().unwrap_or_else(|_| bad()) };
    let (y, mo, d) = (num(0..4), num(5..7), num(8..10));
    let (h, mi, s) = (num(11..13), num(14..16), num(17..19));
    let mut micros = 0;
    if b[19] == b'.' {
        let frac = &t[20..t.len() - 1];
        let digits: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
        micros = digits.parse().unwrap_or_else(|_| bad());
    }
    civil_micros((y, mo, d), (h, mi, s), micros)
}

/// The UTC calendar date `days` from today, `YYYY-MM-DD`.
fn future_date(days: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    // Days since the epoch to a civil date (H. Hinnant's algorithm).
    let z = now / 86_400 + days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[test]
fn future_date_round_trips_through_parse_us() {
    for days in [0, 1, 59, 60, 365, 1000] {
        let date = future_date(days);
        let us = parse_us(&format!("{date}T00:00:00Z"));
        let today = parse_us(&format!("{}T00:00:00Z", future_date(0)));
        assert_eq!(us - today, days * 86_400_000_000, "{date}");
    }
}

#[test]
fn parse_us_matches_known_instants() {
    assert_eq!(parse_us("1970-01-01T00:00:00Z"), 0);
    assert_eq!(
        parse_us("2030-01-01T21:59:00.000000Z"),
        1_893_535_140_000_000
    );
    assert_eq!(parse_us("2000-03-01T00:00:00.5Z"), 951_868_800_500_000);
}
