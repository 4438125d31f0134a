//! The tasks read model end to end: scripted lifecycles through `GET /v1/tasks/{id}` (review
//! gates, rejections with and without continuation, sticky cancel, events of other runs),
//! `latest_event_seq` over every stream, the list with its filters and paging, and 404s.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, assert_problem_for, encode_path};

use crate::common::{TaskOracle, append_ok, check_time, get_task, list_tasks, seq_of, task_ev};

/// Append one lifecycle event of `task`; returns its seq.
async fn step(api: &Api, task: &str, ty: &str, payload: Value) -> u64 {
    let r = append_ok(api, &task_ev(task, ty, payload)).await;
    assert!(!r[0].2, "a fresh event was answered as a duplicate");
    r[0].1
}

/// `GET /v1/tasks/{id}`, checking the status and `latest_event_seq`.
#[track_caller]
fn check(t: &Value, status: &str, latest: u64, what: &str) {
    assert_eq!(t["status"], status, "{what}: status: {t}");
    assert_eq!(
        t["latest_event_seq"], latest,
        "{what}: latest_event_seq: {t}"
    );
}

fn run<'a>(t: &'a Value, run_id: &str) -> &'a Value {
    t["runs"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["run_id"] == run_id))
        .unwrap_or_else(|| panic!("no run {run_id} in {t}"))
}

#[tokio::test]
async fn review_gated_completion_waits_for_the_approval() {
    let s = Server::start(ServerOpts::default()).await;
    let t = "task-gated";
    let created = step(
        &s,
        t,
        "task.created",
        json!({"project_id": "proj-a", "title": "Ship it", "review_required": true}),
    )
    .await;
    let v = get_task(&s, t).await;
    check(&v, "open", created, "after task.created");
    assert_eq!(v["task_id"], t);
    assert_eq!(v["project_id"], "proj-a");
    assert_eq!(v["title"], "Ship it");
    assert_eq!(v["review_required"], true);
    assert_eq!(v["canceled"], false);
    assert_eq!(v["cancel_reason"], Value::Null);
    assert_eq!(v["current_run_id"], Value::Null);
    assert_eq!(v["runs"], json!([]));

    let started = step(&s, t, "task.run_started", json!({"run_id": "r1"})).await;
    let v = get_task(&s, t).await;
    check(&v, "running", started, "after run_started");
    assert_eq!(v["current_run_id"], "r1");
    let r1 = run(&v, "r1");
    assert_eq!(r1["outcome"], "running", "{r1}");
    assert_eq!(r1["started_seq"], started, "{r1}");
    assert_eq!(r1["ended_seq"], Value::Null, "{r1}");

    let completed = step(&s, t, "task.run_completed", json!({"run_id": "r1"})).await;
    let v = get_task(&s, t).await;
    check(
        &v,
        "awaiting_review",
        completed,
        "a review-gated run that completed waits for its approval",
    );
    let r1 = run(&v, "r1");
    assert_eq!(r1["outcome"], "completed", "{r1}");
    assert_eq!(r1["ended_seq"], completed, "{r1}");
    assert_eq!(r1["review"]["required"], true, "{r1}");
    assert_eq!(r1["review"]["gated"], true, "{r1}");
    assert_ne!(r1["review"]["state"], "approved", "{r1}");

    // A free-form event about the task on another stream moves latest_event_seq only.
    let note = append_ok(
        &s,
        &json!({"stream": "comments", "subject": t, "type": "comment.added",
                "payload": {"text": "looks fine"}}),
    )
    .await[0]
        .1;
    let v = get_task(&s, t).await;
    check(&v, "awaiting_review", note, "after a comment on the task");

    let approved = step(
        &s,
        t,
        "task.run_review_approved",
        json!({"run_id": "r1", "reviewer": "alice"}),
    )
    .await;
    let v = get_task(&s, t).await;
    check(&v, "completed", approved, "after the approval");
    let r1 = run(&v, "r1");
    assert_eq!(r1["review"]["state"], "approved", "{r1}");
    assert_eq!(r1["review"]["reviewer"], "alice", "{r1}");
    assert_eq!(r1["outcome"], "completed", "{r1}");
    for k in ["required", "requested", "continuation", "gated"] {
        assert!(r1["review"][k].is_boolean(), "review.{k}: {r1}");
    }
    // updated_at comes from the events (RFC 3339, microseconds), never before the creation.
    let times: Vec<String> = s
        .read_all(&format!("subject={}", encode_path(t)))
        .await
        .iter()
        .map(|e| e["time"].as_str().expect("time").to_owned())
        .collect();
    let updated = v["updated_at"].as_str().expect("updated_at");
    check_time(updated);
    assert!(
        times.iter().any(|x| x == updated),
        "updated_at {updated} is the time of none of the task's events {times:?}"
    );
    assert!(
        updated >= times[0].as_str(),
        "updated_at before the creation"
    );
}

#[tokio::test]
async fn a_requested_review_gates_the_run_in_either_order() {
    let s = Server::start(ServerOpts::default()).await;
    // Review requested while running, then completion: still waiting for the approval.
    let t = "task-req-1";
    step(&s, t, "task.created", json!({"project_id": "p"})).await;
    step(&s, t, "task.run_started", json!({"run_id": "r1"})).await;
    let req = step(&s, t, "task.run_review_requested", json!({"run_id": "r1"})).await;
    let v = get_task(&s, t).await;
    check(&v, "awaiting_review", req, "after review_requested");
    let r1 = run(&v, "r1");
    assert_eq!(r1["review"]["requested"], true, "{r1}");
    assert_eq!(r1["review"]["required"], false, "{r1}");
    assert_eq!(r1["review"]["state"], "pending", "{r1}");
    assert_eq!(r1["review"]["gated"], true, "{r1}");
    let done = step(&s, t, "task.run_completed", json!({"run_id": "r1"})).await;
    check(
        &get_task(&s, t).await,
        "awaiting_review",
        done,
        "completion of a run with a pending review",
    );
    let ok = step(&s, t, "task.run_review_approved", json!({"run_id": "r1"})).await;
    check(&get_task(&s, t).await, "completed", ok, "approved");

    // Completion first, then a review request: awaiting_review again.
    let t = "task-req-2";
    step(&s, t, "task.created", json!({"project_id": "p"})).await;
    step(&s, t, "task.run_started", json!({"run_id": "r1"})).await;
    let done = step(&s, t, "task.run_completed", json!({"run_id": "r1"})).await;
    let v = get_task(&s, t).await;
    check(&v, "completed", done, "an ungated completion completes");
    assert_eq!(run(&v, "r1")["review"]["gated"], false, "{v}");
    let req = step(&s, t, "task.run_review_requested", json!({"run_id": "r1"})).await;
    check(
        &get_task(&s, t).await,
        "awaiting_review",
        req,
        "a review requested after the completion",
    );
    // A plain rejection reopens the task.
    let rej = step(
        &s,
        t,
        "task.run_review_rejected",
        json!({"run_id": "r1", "reviewer": "bob", "reason": "tests missing"}),
    )
    .await;
    let v = get_task(&s, t).await;
    check(&v, "open", rej, "a rejection without continuation reopens");
    let r1 = run(&v, "r1");
    assert_eq!(r1["review"]["state"], "rejected", "{r1}");
    assert_eq!(r1["review"]["reviewer"], "bob", "{r1}");
    assert_eq!(r1["review"]["reason"], "tests missing", "{r1}");
    assert_eq!(r1["review"]["continuation"], false, "{r1}");
}

#[tokio::test]
async fn a_rejection_with_continuation_keeps_the_run_going() {
    let s = Server::start(ServerOpts::default()).await;
    let t = "task-cont";
    step(
        &s,
        t,
        "task.created",
        json!({"project_id": "p", "review_required": true}),
    )
    .await;
    step(&s, t, "task.run_started", json!({"run_id": "r1"})).await;
    step(&s, t, "task.run_completed", json!({"run_id": "r1"})).await;
    let rej = step(
        &s,
        t,
        "task.run_review_rejected",
        json!({"run_id": "r1", "reviewer": "carol", "reason": "again", "continuation": true}),
    )
    .await;
    let v = get_task(&s, t).await;
    check(&v, "running", rej, "a rejection with continuation");
    let r1 = run(&v, "r1");
    assert_eq!(r1["review"]["state"], "rejected", "{r1}");
    assert_eq!(r1["review"]["continuation"], true, "{r1}");
    assert_eq!(v["current_run_id"], "r1");
    // The continued run completes again: still gated, not approved.
    let done = step(&s, t, "task.run_completed", json!({"run_id": "r1"})).await;
    check(
        &get_task(&s, t).await,
        "awaiting_review",
        done,
        "the continued run completed again",
    );
    let ok = step(
        &s,
        t,
        "task.run_review_approved",
        json!({"run_id": "r1", "reviewer": "carol"}),
    )
    .await;
    let v = get_task(&s, t).await;
    check(&v, "completed", ok, "approved at last");
    assert_eq!(run(&v, "r1")["review"]["continuation"], false, "{v}");
}

#[tokio::test]
async fn failures_cancels_and_events_of_other_runs() {
    let s = Server::start(ServerOpts::default()).await;
    let t = "task-runs";
    step(&s, t, "task.created", json!({"project_id": "p"})).await;
    step(&s, t, "task.run_started", json!({"run_id": "r1"})).await;
    let failed = step(
        &s,
        t,
        "task.run_failed",
        json!({"run_id": "r1", "error": "disk full"}),
    )
    .await;
    let v = get_task(&s, t).await;
    check(&v, "failed", failed, "run_failed");
    assert_eq!(run(&v, "r1")["outcome"], "failed");
    assert_eq!(run(&v, "r1")["error"], "disk full");

    let r2 = step(&s, t, "task.run_started", json!({"run_id": "r2"})).await;
    check(&get_task(&s, t).await, "running", r2, "a new run starts");
    // Events of a run that is not the current one update that run only.
    let late = step(&s, t, "task.run_completed", json!({"run_id": "r1"})).await;
    let v = get_task(&s, t).await;
    check(&v, "running", late, "a late event of the old run");
    assert_eq!(v["current_run_id"], "r2");
    let canceled = step(&s, t, "task.run_canceled", json!({"run_id": "r2"})).await;
    let v = get_task(&s, t).await;
    check(&v, "canceled", canceled, "run_canceled");
    assert_eq!(
        v["canceled"], false,
        "a canceled run does not cancel the task"
    );
    // A canceled run is not the end of the task.
    let r3 = step(&s, t, "task.run_started", json!({"run_id": "r3"})).await;
    let v = get_task(&s, t).await;
    check(&v, "running", r3, "a run after a canceled run");
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(3), "{v}");
    let ids: Vec<&str> = v["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["run_id"].as_str().expect("run_id"))
        .collect();
    assert_eq!(ids, ["r1", "r2", "r3"], "runs in the order they started");
}

#[tokio::test]
async fn task_canceled_is_sticky() {
    let s = Server::start(ServerOpts::default()).await;
    let t = "task-sticky";
    step(&s, t, "task.created", json!({"project_id": "p"})).await;
    step(&s, t, "task.run_started", json!({"run_id": "r1"})).await;
    let c = step(&s, t, "task.canceled", json!({"reason": "obsolete"})).await;
    let v = get_task(&s, t).await;
    check(&v, "canceled", c, "task.canceled");
    assert_eq!(v["canceled"], true);
    assert_eq!(v["cancel_reason"], "obsolete");
    let mut last = c;
    for (ty, p) in [
        ("task.run_completed", json!({"run_id": "r1"})),
        ("task.run_started", json!({"run_id": "r2"})),
        ("task.run_review_requested", json!({"run_id": "r2"})),
        ("task.run_review_approved", json!({"run_id": "r2"})),
        (
            "task.run_review_rejected",
            json!({"run_id": "r2", "continuation": true}),
        ),
        ("task.run_failed", json!({"run_id": "r2"})),
        ("task.created", json!({"project_id": "p"})),
    ] {
        last = step(&s, t, ty, p).await;
        let v = get_task(&s, t).await;
        check(&v, "canceled", last, &format!("{ty} after task.canceled"));
        assert_eq!(v["canceled"], true, "{v}");
    }
    // The same, through a fold of the whole log.
    let events = s.read_all(&format!("subject={t}")).await;
    assert_eq!(events.last().map(seq_of), Some(last));
    assert_eq!(TaskOracle::of(&events).status, "canceled");
}

#[tokio::test]
async fn unknown_tasks_are_404_and_non_tasks_are_not_tasks() {
    let s = Server::start(ServerOpts::default()).await;
    for id in ["nope", "no such task", "ntf:1", "é/?"] {
        let r = s.get(&format!("/v1/tasks/{}", encode_path(id))).await;
        assert_problem_for(&r, 404, "not_found", &format!("task {id:?}"));
    }
    // Events about a subject on other streams do not make it a task.
    append_ok(
        &s,
        &json!({"stream": "comments", "subject": "just-a-thing", "type": "comment.added"}),
    )
    .await;
    let r = s.get("/v1/tasks/just-a-thing").await;
    assert_problem_for(&r, 404, "not_found", "a subject with only free-form events");
    let (st, body) = s.get_json("/v1/tasks").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let mut body = body;
    let as_of = body.as_object_mut().and_then(|o| o.remove("as_of_seq"));
    assert!(as_of.is_some_and(|a| a.is_u64()), "as_of_seq");
    assert_eq!(body, json!({"tasks": [], "next_after": null}));
}

/// Tasks `list-NN` with a known project and status each.
async fn seed_tasks(api: &Api) -> Vec<(String, String, String)> {
    let mut model = Vec::new();
    let mut per_task: Vec<Vec<Value>> = Vec::new();
    for i in 0..23u32 {
        let id = format!("list-{i:02}");
        let project = if i % 3 == 0 { "alpha" } else { "beta" };
        let mut events = vec![task_ev(&id, "task.created", json!({"project_id": project}))];
        let status = match i % 6 {
            0 => "open",
            1 => {
                events.push(task_ev(&id, "task.run_started", json!({"run_id": "r"})));
                "running"
            }
            2 => {
                events.push(task_ev(&id, "task.run_started", json!({"run_id": "r"})));
                events.push(task_ev(
                    &id,
                    "task.run_review_requested",
                    json!({"run_id": "r"}),
                ));
                "awaiting_review"
            }
            3 => {
                events.push(task_ev(&id, "task.run_started", json!({"run_id": "r"})));
                events.push(task_ev(&id, "task.run_completed", json!({"run_id": "r"})));
                "completed"
            }
            4 => {
                events.push(task_ev(&id, "task.run_started", json!({"run_id": "r"})));
                events.push(task_ev(&id, "task.run_failed", json!({"run_id": "r"})));
                "failed"
            }
            _ => {
                events.push(task_ev(&id, "task.canceled", json!({})));
                "canceled"
            }
        };
        model.push((id, project.to_owned(), status.to_owned()));
        per_task.push(events);
    }
    // Tasks are created in reverse id order, so the list order cannot come from the log.
    let events: Vec<Value> = per_task.into_iter().rev().flatten().collect();
    append_ok(api, &json!({ "events": events })).await;
    model
}

#[tokio::test]
async fn list_filters_and_paging() {
    let s = Server::start(ServerOpts::default()).await;
    let model = seed_tasks(&s).await;
    let ids = |ts: &[Value]| -> Vec<String> {
        ts.iter()
            .map(|t| t["task_id"].as_str().expect("task_id").to_owned())
            .collect()
    };
    let cases: Vec<(String, Option<&str>, Option<&str>)> = vec![
        (String::new(), None, None),
        ("status=running".into(), Some("running"), None),
        (
            "status=awaiting_review".into(),
            Some("awaiting_review"),
            None,
        ),
        ("status=canceled".into(), Some("canceled"), None),
        ("status=open".into(), Some("open"), None),
        ("project_id=alpha".into(), None, Some("alpha")),
        (
            "project_id=beta&status=failed".into(),
            Some("failed"),
            Some("beta"),
        ),
        ("project_id=nobody".into(), None, Some("nobody")),
    ];
    for (q, status, project) in &cases {
        let want: Vec<String> = model
            .iter()
            .filter(|m| status.is_none_or(|s| m.2 == s))
            .filter(|m| project.is_none_or(|p| m.1 == p))
            .map(|m| m.0.clone())
            .collect();
        for limit in [1, 4, 500] {
            let got = list_tasks(&s, q, limit).await;
            assert_eq!(ids(&got), want, "GET /v1/tasks?{q} with limit {limit}");
            let unique: HashSet<String> = ids(&got).into_iter().collect();
            assert_eq!(unique.len(), got.len(), "a task twice in {q:?}");
            for t in &got {
                let m = model
                    .iter()
                    .find(|m| t["task_id"] == m.0.as_str())
                    .expect("known");
                assert_eq!(t["status"], m.2.as_str(), "{t}");
                assert_eq!(t["project_id"], m.1.as_str(), "{t}");
                // The list holds the same TaskOut as GET /v1/tasks/{id} (which also says
                // the seq it is as of).
                let mut one = get_task(&s, &m.0).await;
                assert!(one["as_of_seq"].is_u64(), "{one}");
                one.as_object_mut().map(|o| o.remove("as_of_seq"));
                assert_eq!(*t, one, "list item vs GET of {}", m.0);
            }
        }
    }
    // Default limit 50 (23 tasks fit), and a page of 5 names where to go on.
    let (st, body) = s.get_json("/v1/tasks").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(body["tasks"].as_array().map(Vec::len), Some(23));
    assert_eq!(body["next_after"], Value::Null);
    let (_, body) = s.get_json("/v1/tasks?limit=5").await;
    assert_eq!(
        ids(body["tasks"].as_array().expect("tasks")),
        ["list-00", "list-01", "list-02", "list-03", "list-04"]
    );
    let next = body["next_after"]
        .as_str()
        .unwrap_or_else(|| panic!("a full page names where to go on: {body}"));
    let (_, body) = s
        .get_json(&format!("/v1/tasks?limit=5&after={}", encode_path(next)))
        .await;
    assert_eq!(body["tasks"][0]["task_id"], "list-05", "{body}");
    // `after` need not be an existing id.
    let (_, body) = s.get_json("/v1/tasks?after=list-10x&limit=2").await;
    assert_eq!(
        ids(body["tasks"].as_array().expect("tasks")),
        ["list-11", "list-12"],
        "{body}"
    );
    let (_, body) = s.get_json("/v1/tasks?after=zzz").await;
    let mut body = body;
    let as_of = body.as_object_mut().and_then(|o| o.remove("as_of_seq"));
    assert!(as_of.is_some_and(|a| a.is_u64()), "as_of_seq");
    assert_eq!(body, json!({"tasks": [], "next_after": null}));

    for q in [
        "status=done",
        "status=RUNNING",
        "status=",
        "limit=0",
        "limit=501",
        "limit=x",
        "limit=-1",
    ] {
        let r = s.get(&format!("/v1/tasks?{q}")).await;
        assert_problem_for(&r, 400, "invalid_query", q);
    }
    let (_, body) = s.get_json("/v1/tasks?limit=500").await;
    assert_eq!(body["tasks"].as_array().map(Vec::len), Some(23));
}

#[tokio::test]
async fn default_page_size_is_fifty() {
    let s = Server::start(ServerOpts::default()).await;
    let events: Vec<Value> = (0..55)
        .map(|i| {
            task_ev(
                &format!("many-{i:03}"),
                "task.created",
                json!({"project_id": "p"}),
            )
        })
        .collect();
    append_ok(&s, &json!({ "events": events })).await;
    let (st, body) = s.get_json("/v1/tasks").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(body["tasks"].as_array().map(Vec::len), Some(50));
    assert_eq!(body["tasks"][49]["task_id"], "many-049");
    let next = body["next_after"]
        .as_str()
        .unwrap_or_else(|| panic!("a full page names where to go on: {body}"))
        .to_owned();
    let (_, body) = s
        .get_json(&format!("/v1/tasks?after={}", encode_path(&next)))
        .await;
    assert_eq!(body["tasks"].as_array().map(Vec::len), Some(5));
    assert_eq!(body["tasks"][4]["task_id"], "many-054");
    assert_eq!(body["next_after"], Value::Null, "{body}");
}

/// A page holds up to `limit` matches whenever they exist (spec section 7): a status that is
/// rare inside a project that is large. The list used to walk the project's index and stop at
/// a scan budget, answering an empty first page with a cursor while the matches were further
/// on (`?status=awaiting_review&project_id=p1` → `{"tasks":[],"next_after":"bt-225989"}`).
#[tokio::test]
async fn a_rare_status_in_a_large_project_fills_the_first_page() {
    let s = Server::start(ServerOpts::default()).await;
    for chunk in 0..25 {
        let events: Vec<Value> = (0..1000)
            .map(|i| {
                task_ev(
                    &format!("big-{:05}", chunk * 1000 + i),
                    "task.created",
                    json!({"project_id": "p1"}),
                )
            })
            .collect();
        let (st, body) = s.append(&json!({ "events": events })).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
    }
    let ends: Vec<String> = (24_990..25_000).map(|i| format!("big-{i:05}")).collect();
    let cancels: Vec<Value> = ends
        .iter()
        .step_by(3)
        .map(|id| task_ev(id, "task.canceled", json!({"reason": "late"})))
        .collect();
    let (st, body) = s.append(&json!({ "events": cancels })).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let want: Vec<&String> = ends.iter().step_by(3).collect();
    // One page holds them all.
    let (st, body) = s
        .get_json("/v1/tasks?status=canceled&project_id=p1&limit=10")
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let got: Vec<&str> = body["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(got, want, "{body}");
    assert_eq!(body["next_after"], Value::Null, "{body}");
    // Pages of 2 walk the same matches, each page full until the last.
    let mut after = String::new();
    let mut walked = Vec::new();
    loop {
        let q = if after.is_empty() {
            String::new()
        } else {
            format!("&after={after}")
        };
        let (_, body) = s
            .get_json(&format!(
                "/v1/tasks?status=canceled&project_id=p1&limit=2{q}"
            ))
            .await;
        let page: Vec<String> = body["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["task_id"].as_str().unwrap().to_owned())
            .collect();
        match body["next_after"].as_str() {
            Some(n) => {
                assert_eq!(
                    page.len(),
                    2,
                    "a page short of limit before the end: {body}"
                );
                after = n.to_owned();
                walked.extend(page);
            }
            None => {
                walked.extend(page);
                break;
            }
        }
    }
    assert_eq!(walked.iter().collect::<Vec<_>>(), want);
    // Either filter alone, and the other order of the pair, still answer.
    let (_, body) = s.get_json("/v1/tasks?status=canceled&limit=10").await;
    assert_eq!(
        body["tasks"].as_array().unwrap().len(),
        want.len(),
        "{body}"
    );
    let (_, body) = s.get_json("/v1/tasks?project_id=nope&status=open").await;
    assert_eq!(body["tasks"], json!([]), "{body}");
    assert_eq!(body["next_after"], Value::Null, "{body}");
}
