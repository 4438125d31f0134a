//! The notification dashboard (`GET /v1/notifications`): client `notification.requested`
//! events become exactly one notification each, lifecycle events are routed to
//! `notification.created` (`ntf:<source_seq>`) with the priority of their type, and the list
//! is newest first with priority/recipient filters and `before_seq` paging.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts, assert_problem_for};

use crate::common::{
    ROUTED, append_ok, assert_routed_exactly_once, check_time, created_notifications,
    list_notifications, notif_ev, receipts, seq_of, task_ev, wait_routed,
};

const WAIT: Duration = Duration::from_secs(30);

fn ids(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|n| {
            n["notification_id"]
                .as_str()
                .unwrap_or_else(|| panic!("no notification_id in {n}"))
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn requested_notifications_are_listed_once_newest_first() {
    let s = Server::start(ServerOpts::default()).await;
    let prios = ["urgent", "action", "warning", "info"];
    let recipients = ["alice", "bob", "carol"];
    // id → (seq, payload)
    let mut model: BTreeMap<String, (u64, Value)> = BTreeMap::new();
    for chunk in 0..5u64 {
        let batch: Vec<Value> = (0..11u64)
            .map(|k| {
                let i = chunk * 11 + k;
                let mut p = json!({
                    "priority": prios[usize::try_from(i % 4).expect("small")],
                    "title": format!("Title {i}"),
                });
                if i % 5 != 0 {
                    p["recipient"] = json!(recipients[usize::try_from(i % 3).expect("small")]);
                }
                if i % 2 == 0 {
                    p["body"] = json!(format!("body of {i}"));
                    p["group_key"] = json!(format!("g{}", i % 4));
                    p["task_id"] = json!(format!("task-{}", i % 7));
                    p["project_id"] = json!("proj");
                }
                let id = format!("n-{i:03}");
                if i % 6 == 0 {
                    // No event_id: the subject is the notification id.
                    json!({"stream": "notifications", "subject": id,
                           "type": "notification.requested", "payload": p})
                } else {
                    notif_ev(&id, p)
                }
            })
            .collect();
        let (st, body) = s.append(&json!({ "events": batch.clone() })).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
        for (r, e) in receipts(&body).into_iter().zip(&batch) {
            assert_eq!(
                r.0,
                e["subject"].as_str().expect("subject"),
                "the notification id is the event_id (the subject when absent)"
            );
            model.insert(r.0, (r.1, e["payload"].clone()));
        }
    }
    let total = model.len();
    assert_eq!(total, 55);

    // Re-sending is a duplicate, not a second notification; the same id with other content is
    // a conflict; without event_id the subject is the id, so it is a duplicate too.
    let (seq1, p1) = model["n-001"].clone();
    let r = append_ok(&s, &notif_ev("n-001", p1.clone())).await;
    assert_eq!(r, vec![("n-001".to_owned(), seq1, true)]);
    let (seq0, p0) = model["n-000"].clone();
    let r = append_ok(
        &s,
        &json!({"stream": "notifications", "subject": "n-000",
                "type": "notification.requested", "payload": p0}),
    )
    .await;
    assert_eq!(r, vec![("n-000".to_owned(), seq0, true)]);
    let mut other = p1.clone();
    other["title"] = json!("another title");
    let rep = s
        .send(
            s.request(reqwest::Method::POST, "/v1/events")
                .json(&notif_ev("n-001", other)),
        )
        .await;
    assert_problem_for(&rep, 409, "event_id_conflict", "same id, other title");

    // The whole dashboard, newest first, each once, with the fields of its event.
    let log: HashMap<u64, Value> = s
        .read_all("stream=notifications")
        .await
        .into_iter()
        .map(|e| (seq_of(&e), e))
        .collect();
    let mut want: Vec<(u64, String)> = model
        .iter()
        .map(|(id, (seq, _))| (*seq, id.clone()))
        .collect();
    want.sort_by_key(|w| std::cmp::Reverse(w.0));
    let want_ids: Vec<String> = want.iter().map(|w| w.1.clone()).collect();
    for limit in [500, 7, 1] {
        let all = list_notifications(&s, "", limit).await;
        assert_eq!(
            ids(&all),
            want_ids,
            "limit {limit}: newest first, each once"
        );
    }
    let all = list_notifications(&s, "", 500).await;
    for n in &all {
        let id = n["notification_id"].as_str().expect("id");
        let (seq, p) = &model[id];
        assert_eq!(n["seq"], *seq, "{n}");
        for k in [
            "priority",
            "title",
            "body",
            "recipient",
            "group_key",
            "task_id",
            "project_id",
        ] {
            assert_eq!(
                n[k],
                p.get(k).cloned().unwrap_or(Value::Null),
                "`{k}` of {n}"
            );
        }
        let t = n["time"].as_str().unwrap_or_else(|| panic!("no time: {n}"));
        check_time(t);
        assert_eq!(n["time"], log[seq]["time"], "time is the event's time: {n}");
    }

    // Default limit 50, then the rest through next_before_seq.
    let (st, body) = s.get_json("/v1/notifications").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let first = body["notifications"].as_array().expect("array");
    assert_eq!(first.len(), 50, "default limit 50");
    assert_eq!(ids(first), want_ids[..50].to_vec());
    let next = body["next_before_seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("a full page names where to go on: {body}"));
    let (_, body) = s
        .get_json(&format!("/v1/notifications?before_seq={next}"))
        .await;
    assert_eq!(
        ids(body["notifications"].as_array().expect("array")),
        want_ids[50..].to_vec()
    );
    assert_eq!(body["next_before_seq"], Value::Null, "{body}");

    // before_seq: strictly older.
    let pivot = want[10].0;
    let (_, body) = s
        .get_json(&format!("/v1/notifications?before_seq={pivot}&limit=500"))
        .await;
    assert_eq!(
        ids(body["notifications"].as_array().expect("array")),
        want_ids[11..].to_vec(),
        "before_seq={pivot}"
    );

    // Filters, paged and unpaged.
    let cases: Vec<(String, Option<&str>, Option<&str>)> = vec![
        ("priority=urgent".into(), Some("urgent"), None),
        ("priority=info".into(), Some("info"), None),
        ("recipient=bob".into(), None, Some("bob")),
        (
            "priority=action&recipient=alice".into(),
            Some("action"),
            Some("alice"),
        ),
        ("recipient=nobody".into(), None, Some("nobody")),
    ];
    for (q, prio, recipient) in &cases {
        let expect: Vec<String> = want
            .iter()
            .filter(|(_, id)| {
                let p = &model[id].1;
                prio.is_none_or(|x| p["priority"] == x)
                    && recipient.is_none_or(|x| p["recipient"] == x)
            })
            .map(|(_, id)| id.clone())
            .collect();
        for limit in [500, 3] {
            let got = list_notifications(&s, q, limit).await;
            assert_eq!(
                ids(&got),
                expect,
                "GET /v1/notifications?{q}, limit {limit}"
            );
        }
    }

    for q in [
        "priority=loud",
        "priority=URGENT",
        "limit=0",
        "limit=501",
        "limit=x",
        "before_seq=x",
        "before_seq=-1",
    ] {
        let r = s.get(&format!("/v1/notifications?{q}")).await;
        assert_problem_for(&r, 400, "invalid_query", q);
    }
    // Client notifications are not routed again: no notification.created at all.
    assert_eq!(created_notifications(&s).await, Vec::<Value>::new());
    assert_eq!(list_notifications(&s, "", 500).await.len(), total);
}

#[tokio::test]
async fn lifecycle_events_are_routed_once_with_their_priority() {
    let s = Server::start(ServerOpts::default()).await;
    let t = "task-routed";
    let script = [
        (
            "task.created",
            json!({"project_id": "proj-7", "title": "Routed"}),
        ),
        ("task.run_started", json!({"run_id": "r1"})),
        ("task.run_review_requested", json!({"run_id": "r1"})),
        (
            "task.run_review_rejected",
            json!({"run_id": "r1", "reviewer": "bob", "reason": "no tests", "continuation": true}),
        ),
        ("task.run_completed", json!({"run_id": "r1"})),
        (
            "task.run_review_approved",
            json!({"run_id": "r1", "reviewer": "bob"}),
        ),
        ("task.run_started", json!({"run_id": "r2"})),
        ("task.run_failed", json!({"run_id": "r2", "error": "boom"})),
        ("task.run_started", json!({"run_id": "r3"})),
        ("task.run_canceled", json!({"run_id": "r3"})),
        ("task.canceled", json!({"reason": "done with it"})),
    ];
    let mut seq_of_type: Vec<(u64, &str)> = Vec::new();
    for (i, (ty, p)) in script.iter().enumerate() {
        let mut e = task_ev(t, ty, p.clone());
        e["event_id"] = json!(format!("routed-{i}"));
        let r = append_ok(&s, &e).await;
        seq_of_type.push((r[0].1, ty));
        // A free-form event on the task between lifecycle events is never routed.
        append_ok(
            &s,
            &json!({"stream": "comments", "subject": t, "type": "comment.added"}),
        )
        .await;
    }
    let (sources, created) = wait_routed(&s, WAIT).await;
    assert_routed_exactly_once(&sources, &created);
    let routed: HashSet<&str> = ROUTED.iter().map(|r| r.0).collect();
    let want_sources: Vec<u64> = seq_of_type
        .iter()
        .filter(|(_, ty)| routed.contains(ty))
        .map(|(seq, _)| *seq)
        .collect();
    assert_eq!(sources.keys().copied().collect::<Vec<_>>(), want_sources);
    assert_eq!(created.len(), 7, "one per routed type of the script");

    // The dashboard shows them with the routed fields.
    let dash = list_notifications(&s, "", 500).await;
    assert_eq!(dash.len(), 7, "{dash:?}");
    for (src, ty) in seq_of_type.iter().filter(|(_, ty)| routed.contains(ty)) {
        let id = format!("ntf:{src}");
        let n = dash
            .iter()
            .find(|n| n["notification_id"] == id.as_str())
            .unwrap_or_else(|| panic!("no {id} on the dashboard: {dash:?}"));
        let prio = ROUTED.iter().find(|r| r.0 == *ty).expect("routed").1;
        assert_eq!(
            n["priority"], prio,
            "priority of the {ty} notification: {n}"
        );
        assert_eq!(n["task_id"], t, "{n}");
        assert_eq!(n["project_id"], "proj-7", "the task's project: {n}");
        assert!(
            n["title"].as_str().is_some_and(|x| !x.is_empty()),
            "a routed notification has a title: {n}"
        );
        assert!(n["seq"].as_u64().is_some_and(|x| x > *src), "{n}");
    }
    let urgent = list_notifications(&s, "priority=urgent", 500).await;
    let failed = seq_of_type
        .iter()
        .find(|(_, ty)| *ty == "task.run_failed")
        .expect("failed")
        .0;
    assert_eq!(ids(&urgent), [format!("ntf:{failed}")]);
    assert_eq!(
        list_notifications(&s, "priority=warning", 500).await.len(),
        3
    );
    assert_eq!(list_notifications(&s, "priority=info", 500).await.len(), 2);
    assert_eq!(
        list_notifications(&s, "priority=action", 500).await.len(),
        1
    );

    // Re-sending the lifecycle events appends nothing, so routes nothing again. A new event
    // afterwards flushes the router: once it is routed, everything before it was read.
    for (i, (ty, p)) in script.iter().enumerate() {
        let mut e = task_ev(t, ty, p.clone());
        e["event_id"] = json!(format!("routed-{i}"));
        let r = append_ok(&s, &e).await;
        assert!(r[0].2, "a re-sent lifecycle event is a duplicate");
    }
    append_ok(
        &s,
        // (A failure: a completion of a run that never started routes nothing.)
        &task_ev("task-flush", "task.run_failed", json!({"run_id": "f"})),
    )
    .await;
    let (sources, created) = wait_routed(&s, WAIT).await;
    assert_routed_exactly_once(&sources, &created);
    assert_eq!(created.len(), 8);
    assert_eq!(list_notifications(&s, "", 500).await.len(), 8);
}

/// Seed 002's dashboard seeds the task stream from what it rendered: each notification carries
/// its task's `latest_event_seq` (0 without a task), read with the row, so a client that opens
/// `/v1/tasks/{id}/stream?after_sequence=<it>` misses nothing that landed after the read. The
/// list once carried no such seq, and a client had to read the task again (a race).
#[tokio::test]
async fn a_notification_carries_its_tasks_latest_event_seq() {
    let s = Server::start(ServerOpts::default()).await;
    let task = "lt-task";
    append_ok(
        &s,
        &json!({"events": [
            task_ev(task, "task.created", json!({"project_id": "p"})),
            task_ev(task, "task.run_started", json!({"run_id": "r1"})),
        ]}),
    )
    .await;
    let r = append_ok(
        &s,
        &json!({"events": [
            notif_ev("lt-1", json!({"priority": "info", "title": "about the task", "task_id": task})),
            notif_ev("lt-2", json!({"priority": "info", "title": "about nothing"})),
            notif_ev("lt-3", json!({"priority": "info", "title": "no such task", "task_id": "lt-none"})),
        ]}),
    )
    .await;
    assert_eq!(r.len(), 3);
    // A later event of the task: the seq moves with it.
    let later = append_ok(
        &s,
        &task_ev(task, "task.run_started", json!({"run_id": "r2"})),
    )
    .await[0]
        .1;
    let t = crate::common::get_task(&s, task).await;
    assert_eq!(t["latest_event_seq"], later, "{t}");
    let items = list_notifications(&s, "", 50).await;
    let by_id: HashMap<&str, &Value> = items
        .iter()
        .map(|n| (n["notification_id"].as_str().unwrap(), n))
        .collect();
    assert_eq!(by_id["lt-1"]["latest_event_seq"], later, "{items:?}");
    assert_eq!(by_id["lt-2"]["latest_event_seq"], 0, "no task: {items:?}");
    assert_eq!(
        by_id["lt-3"]["latest_event_seq"], 0,
        "an unknown task: {items:?}"
    );
    // The status record's notification says the same.
    let st = s.get("/v1/notifications/lt-1").await;
    assert_eq!(st.status, StatusCode::OK, "{}", st.text);
    assert_eq!(
        st.json["notification"]["latest_event_seq"], later,
        "{}",
        st.text
    );
    // Resuming the task's events after it: nothing before, the next event after.
    let next = append_ok(
        &s,
        &task_ev(task, "task.run_started", json!({"run_id": "r3"})),
    )
    .await[0]
        .1;
    let page = s
        .get(&format!("/v1/events?subject={task}&after_sequence={later}"))
        .await;
    let seqs: Vec<u64> = page.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(seq_of)
        .collect();
    assert_eq!(seqs, [next], "{}", page.text);
}

/// A `task.run_completed` of a run that never started is a mismatch (section 6,
/// `run_not_started`): the router makes no "Run … completed" notification of it, and the task
/// view marks the run with the mismatch, with no outcome (it did not complete: `outcome` is
/// null, what its ending event said is `reported_outcome`); a completion after its start is
/// routed and read as before.
#[tokio::test]
async fn a_completion_of_a_run_that_never_started_is_a_mismatch_not_news() {
    let s = Server::start(ServerOpts::default()).await;
    let mut seqs = Vec::new();
    for (ty, run) in [
        ("task.created", None),
        ("task.run_completed", Some("r7")),
        ("task.run_started", Some("r8")),
        ("task.run_completed", Some("r8")),
    ] {
        let p = run.map_or_else(|| json!({"project_id": "p"}), |r| json!({"run_id": r}));
        seqs.push(append_ok(&s, &task_ev("t-never", ty, p)).await[0].1);
    }
    let (sources, created) = wait_routed(&s, WAIT).await;
    assert_routed_exactly_once(&sources, &created);
    let from: Vec<u64> = created
        .iter()
        .filter_map(|n| n["payload"]["source_seq"].as_u64())
        .collect();
    assert_eq!(
        from,
        vec![seqs[3]],
        "only r8's completion is routed: {created:?}"
    );
    let titles: Vec<&str> = created
        .iter()
        .filter_map(|n| n["payload"]["title"].as_str())
        .collect();
    assert!(!titles.iter().any(|t| t.contains("r7")), "{titles:?}");
    let task = s.get("/v1/tasks/t-never").await;
    assert_eq!(task.status, StatusCode::OK, "{}", task.text);
    let run = |id: &str| {
        task.json["runs"]
            .as_array()
            .and_then(|rs| rs.iter().find(|r| r["run_id"] == id))
            .cloned()
            .unwrap_or_else(|| panic!("no run {id}: {}", task.text))
    };
    assert_eq!(run("r7")["mismatch"], "run_not_started", "{}", task.text);
    assert!(run("r8")["mismatch"].is_null(), "{}", task.text);
    // The run that never started has no outcome (a null, not a missing key) and says what
    // its ending event reported; the run that did has its outcome and nothing reported.
    let r7 = run("r7");
    assert_eq!(r7.get("outcome"), Some(&Value::Null), "{r7}");
    assert_eq!(r7["reported_outcome"], "completed", "{r7}");
    let r8 = run("r8");
    assert_eq!(r8["outcome"], "completed", "{r8}");
    assert!(r8.get("reported_outcome").is_none(), "{r8}");
    // The task follows the run that did complete, not the mismatch.
    assert_eq!(task.json["status"], "completed", "{}", task.text);
}
