//! Bridge terminal notifications and consumer cursors end to end (spec sections 1 I4/I5, 6, 7):
//! every row of the deliver / defer / mismatch decision table observed through a pull
//! subscription (`GET /v1/bridges/{bridge}/deliveries`) and its explain view, the issue's
//! scenarios (review gate, contradicted approval, operator reset past a mismatch, delete and
//! re-create, long-poll), the refusals of ack, subscription create and the cursors API, the
//! lag view and the `tidemark cursors` CLI.
//!
//! The servers here run with desktop deliveries disabled, so the only events appended behind a
//! test's back are the router's `notification.created` (waited for with
//! `common::wait_routed`) and the notifier's mismatch events (waited for explicitly): that
//! makes "the log head is unchanged" a sound check of a refused call.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Reply, Server, ServerOpts, assert_problem_for, run_cli, tail};

use crate::common::{append_ok, check_time, get_task, task_ev, wait_for, wait_routed};

/// Bound of every poll here (never an assertion on speed).
const WAIT: Duration = Duration::from_secs(30);
const CLI_LIMIT: Duration = Duration::from_secs(60);
/// No desktop deliveries: the router appends `notification.created` only.
const QUIET: &str = "[notifications.desktop]\nenabled = false\n";

/// A bad subscription body: what it is, the field of a good body it changes, the field's new
/// value (left out when `None`), the status and code it must get (any 4xx problem when `None`).
type BadBody = (
    &'static str,
    &'static str,
    Option<Value>,
    Option<(u16, &'static str)>,
);
/// A refused advance: what, last_sequence, delivery_id, expected_sequence, status, code.
type Refusal = (
    &'static str,
    u64,
    &'static str,
    Option<u64>,
    u16,
    &'static str,
);

async fn start() -> Server {
    Server::start(ServerOpts::default().config(QUIET)).await
}

/// Append one lifecycle event of `task`; returns its seq.
async fn step(api: &Api, task: &str, ty: &str, payload: Value) -> u64 {
    let r = append_ok(api, &task_ev(task, ty, payload)).await;
    assert!(!r[0].2, "a fresh event was answered as a duplicate");
    r[0].1
}

async fn new_task(api: &Api, task: &str, review_required: bool) -> u64 {
    step(
        api,
        task,
        "task.created",
        json!({"project_id": "p-bridges", "title": task, "review_required": review_required}),
    )
    .await
}

fn consumer(sub: &str) -> String {
    format!("bridge_task_subscription:{sub}")
}

fn delivery_id(sub: &str, seq: u64) -> String {
    format!("notif:{sub}:{seq}")
}

/// A pull subscription body; the thread id is derived from the subscription id.
fn sub_body(sub: &str, bridge: &str) -> Value {
    json!({"subscription_id": sub, "bridge_id": bridge, "thread_id": format!("th-{sub}"),
           "sink": {"kind": "pull"}})
}

async fn post_json(api: &Api, path: &str, body: &Value) -> Reply {
    api.send(api.request(Method::POST, path).json(body)).await
}

async fn delete(api: &Api, path: &str) -> Reply {
    api.send(api.request(Method::DELETE, path)).await
}

fn bridges_path(task: &str) -> String {
    format!("/v1/tasks/{task}/notifications/bridges")
}

/// Create a pull subscription; panics unless 201.
async fn subscribe(api: &Api, task: &str, sub: &str, bridge: &str) -> Value {
    let r = post_json(api, &bridges_path(task), &sub_body(sub, bridge)).await;
    assert_eq!(
        r.status,
        StatusCode::CREATED,
        "create subscription {sub}: {}",
        r.text
    );
    r.json
}

/// `GET /v1/bridges/{bridge}/deliveries?wait_ms=..`; panics unless 200.
async fn pull(api: &Api, bridge: &str, wait_ms: u64) -> Vec<Value> {
    let r = api
        .get(&format!(
            "/v1/bridges/{bridge}/deliveries?wait_ms={wait_ms}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::OK, "pull of {bridge}: {}", r.text);
    r.json["deliveries"]
        .as_array()
        .unwrap_or_else(|| panic!("pull of {bridge}: no `deliveries` array: {}", r.text))
        .clone()
}

async fn explain(api: &Api, task: &str, sub: &str) -> Value {
    let r = api
        .get(&format!("{}/{sub}/explain", bridges_path(task)))
        .await;
    assert_eq!(r.status, StatusCode::OK, "explain of {sub}: {}", r.text);
    assert_eq!(r.json["subscription_id"], sub, "{}", r.text);
    r.json
}

/// `(seq, event_type, decision)` of each candidate of an explain answer; every candidate must
/// have a reason.
#[track_caller]
fn decisions(x: &Value) -> Vec<(u64, String, String)> {
    x["candidates"]
        .as_array()
        .unwrap_or_else(|| panic!("explain without `candidates`: {x}"))
        .iter()
        .map(|c| {
            assert!(
                c["reason"].as_str().is_some_and(|r| !r.trim().is_empty()),
                "candidate without a reason: {c}"
            );
            (
                c["seq"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("candidate without seq: {c}")),
                c["event_type"].as_str().unwrap_or_default().to_owned(),
                c["decision"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn cand(seq: u64, ty: &str, decision: &str) -> (u64, String, String) {
    (seq, ty.to_owned(), decision.to_owned())
}

#[track_caller]
fn check_next(x: &Value, next: &str, next_seq: Option<u64>) {
    assert_eq!(x["next"], next, "explain `next`: {x}");
    assert_eq!(
        x["next_seq"],
        next_seq.map_or(Value::Null, Value::from),
        "explain `next_seq`: {x}"
    );
}

async fn ack(api: &Api, bridge: &str, id: &str) -> Reply {
    post_json(
        api,
        &format!("/v1/bridges/{bridge}/deliveries/{id}/ack"),
        &json!({}),
    )
    .await
}

/// Ack; panics unless 200 with the cursor at `seq`.
async fn ack_ok(api: &Api, bridge: &str, sub: &str, seq: u64) -> Value {
    let id = delivery_id(sub, seq);
    let r = ack(api, bridge, &id).await;
    assert_eq!(r.status, StatusCode::OK, "ack of {id}: {}", r.text);
    assert_eq!(r.json["delivery_id"], id.as_str(), "{}", r.text);
    let c = &r.json["cursor"];
    assert_eq!(c["last_sequence"], seq, "ack of {id}: {}", r.text);
    assert_eq!(
        c["last_delivery_id"],
        id.as_str(),
        "ack of {id}: {}",
        r.text
    );
    assert_eq!(c["last_error"], Value::Null, "ack of {id}: {}", r.text);
    r.json["cursor"].clone()
}

/// `GET /v1/cursors` for one key; panics unless 200 with exactly one cursor of that key.
async fn cursor_of(api: &Api, consumer_id: &str, stream: &str, subject: &str) -> Value {
    let path = format!(
        "/v1/cursors?consumer_id={}&stream_name={}&subject_id={}",
        tidemark_tests::encode_path(consumer_id),
        tidemark_tests::encode_path(stream),
        tidemark_tests::encode_path(subject)
    );
    let r = api.get(&path).await;
    assert_eq!(r.status, StatusCode::OK, "GET {path}: {}", r.text);
    let list = r.json["cursors"]
        .as_array()
        .unwrap_or_else(|| panic!("GET {path}: no `cursors` array: {}", r.text));
    assert_eq!(list.len(), 1, "GET {path}: one cursor expected: {}", r.text);
    let c = list[0].clone();
    assert_eq!(c["consumer_id"], consumer_id, "{c}");
    assert_eq!(c["stream_name"], stream, "{c}");
    assert_eq!(c["subject_id"], subject, "{c}");
    c
}

async fn sub_cursor(api: &Api, task: &str, sub: &str) -> Value {
    cursor_of(api, &consumer(sub), "task_events", task).await
}

/// `tidemark cursors <args> --url <base>`.
async fn cursors_cli(base: &str, args: &[&str]) -> std::process::Output {
    let all = [&["cursors"], args, &["--url", base]].concat();
    run_cli(&all, "", CLI_LIMIT).await
}

/// Append `n` `order.placed` events (stream `orders`, subjects `o-1`..); returns their seqs.
async fn append_orders(api: &Api, n: usize) -> Vec<u64> {
    let events: Vec<Value> = (1..=n)
        .map(|i| json!({"stream": "orders", "subject": format!("o-{i}"), "type": "order.placed"}))
        .collect();
    let r = append_ok(api, &json!({"events": events})).await;
    r.iter().map(|x| x.1).collect()
}

/// `POST /v1/cursors/advance` of `consumer_id` on stream `orders` to `last`; panics unless 200.
async fn advance_orders(api: &Api, consumer_id: &str, last: u64, delivery_id: &str) {
    let body = json!({"consumer_id": consumer_id, "stream_name": "orders", "last_sequence": last,
                      "delivery_id": delivery_id});
    let r = post_json(api, "/v1/cursors/advance", &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

/// The one event on stream `cursors` after `head`: of type `ty`, subject `consumer_id`.
async fn cursor_event(api: &Api, head: u64, ty: &str, consumer_id: &str) -> Value {
    let ev = api.read_all_after(head, "stream=cursors", 10).await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["type"], ty, "{}", ev[0]);
    assert_eq!(ev[0]["subject"], consumer_id, "{}", ev[0]);
    ev[0].clone()
}

/// The zero state of a cursor that never moved.
#[track_caller]
fn assert_zero(c: &Value) {
    assert_eq!(c["last_sequence"], 0, "zero state: {c}");
    for k in [
        "last_delivery_id",
        "last_delivered_at",
        "last_error",
        "updated_at",
    ] {
        assert_eq!(c[k], Value::Null, "zero state: `{k}` must be null: {c}");
    }
}

/// Every `notification.terminal_state_mismatch` of `task`.
async fn mismatches(api: &Api, task: &str) -> Vec<Value> {
    api.read_all(&format!(
        "stream=task_events&subject={task}&type=notification.terminal_state_mismatch"
    ))
    .await
}

/// The mismatch events of `sub`.
async fn mismatches_of(api: &Api, task: &str, sub: &str) -> Vec<Value> {
    mismatches(api, task)
        .await
        .into_iter()
        .filter(|e| e["payload"]["subscription_id"] == sub)
        .collect()
}

/// Wait (bounded) for the notifier's mismatch event of `(sub, seq)`, and check its shape.
async fn wait_mismatch(api: &Api, task: &str, sub: &str, seq: u64) -> Value {
    let id = format!("mismatch:{sub}:{seq}");
    let e = wait_for(WAIT, &format!("the mismatch event {id}"), || async {
        mismatches(api, task)
            .await
            .into_iter()
            .find(|e| e["event_id"] == id.as_str())
    })
    .await;
    assert_eq!(e["stream"], "task_events", "{e}");
    assert_eq!(e["subject"], task, "{e}");
    assert_eq!(e["payload"]["subscription_id"], sub, "{e}");
    assert_eq!(e["payload"]["seq"], seq, "{e}");
    assert!(
        e["payload"]["detail"]
            .as_str()
            .is_some_and(|d| !d.trim().is_empty()),
        "a mismatch without detail: {e}"
    );
    e
}

/// The log head once the router has routed every lifecycle event (nothing else is appended
/// behind the test's back on these servers).
async fn settled_head(api: &Api) -> u64 {
    wait_routed(api, WAIT).await;
    api.head().await
}

/// Check an envelope of the pull sink (spec section 6).
#[track_caller]
fn check_envelope(e: &Value, sub: &str, task: &str, bridge: &str, seq: u64, ty: &str) {
    assert_eq!(e["delivery_id"], delivery_id(sub, seq).as_str(), "{e}");
    assert_eq!(e["subscription_id"], sub, "{e}");
    assert_eq!(e["task_id"], task, "{e}");
    assert_eq!(e["bridge_id"], bridge, "{e}");
    assert_eq!(e["thread_id"], format!("th-{sub}").as_str(), "{e}");
    assert_eq!(e["mode"], "reply", "{e}");
    assert_eq!(e["event_type"], "final", "{e}");
    assert_eq!(e["final"], true, "{e}");
    assert_eq!(e["seq"], seq, "{e}");
    assert_eq!(e["metadata"]["terminal_event_type"], ty, "{e}");
}

/// The pull of `bridge` shows exactly the delivery of `(sub, seq)`.
async fn expect_pending(api: &Api, bridge: &str, sub: &str, task: &str, seq: u64, ty: &str) {
    let got = pull(api, bridge, 0).await;
    assert_eq!(
        got.len(),
        1,
        "bridge {bridge}: exactly one pending delivery (seq {seq}) expected: {got:?}"
    );
    check_envelope(&got[0], sub, task, bridge, seq, ty);
}

async fn expect_nothing_pending(api: &Api, bridge: &str, what: &str) {
    let got = pull(api, bridge, 0).await;
    assert!(
        got.is_empty(),
        "{what}: bridge {bridge} must have nothing pending: {got:?}"
    );
}

#[track_caller]
fn check_4xx(r: &Reply, status: Option<u16>, code: Option<&str>, what: &str) {
    assert!(
        !r.status.is_server_error(),
        "{what}: a 5xx answer: {} {}",
        r.status,
        tail(&r.text, 1000)
    );
    assert!(
        r.status.is_client_error(),
        "{what}: expected a 4xx, got {}: {}",
        r.status,
        tail(&r.text, 1000)
    );
    match (status, code) {
        (Some(s), Some(c)) => assert_problem_for(r, s, c, what),
        (Some(s), None) => assert_eq!(r.status.as_u16(), s, "{what}: {}", r.text),
        _ => {}
    }
    assert!(
        r.content_type
            .as_deref()
            .is_some_and(|c| c.starts_with("application/problem+json")),
        "{what}: not a problem document ({:?}): {}",
        r.content_type,
        r.text
    );
    assert!(
        r.code().is_some_and(|c| !c.is_empty()),
        "{what}: a problem without `code`: {}",
        r.text
    );
}

fn run_of<'a>(t: &'a Value, run_id: &str) -> &'a Value {
    t["runs"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["run_id"] == run_id))
        .unwrap_or_else(|| panic!("no run {run_id} in {t}"))
}

/// A pull subscription under test: `sub` of `bridge` on `task`.
#[derive(Clone, Copy)]
struct Pull<'a> {
    api: &'a Api,
    task: &'a str,
    sub: &'a str,
    bridge: &'a str,
}

impl<'a> Pull<'a> {
    /// Create `task` (`review_required` as given) and the subscription, then start run `r1`.
    async fn start(
        api: &'a Api,
        task: &'a str,
        sub: &'a str,
        bridge: &'a str,
        review_required: bool,
    ) -> Pull<'a> {
        new_task(api, task, review_required).await;
        subscribe(api, task, sub, bridge).await;
        let p = Pull {
            api,
            task,
            sub,
            bridge,
        };
        p.run("task.run_started", "r1").await;
        p
    }

    /// [`Pull::start`], then complete run `r1`; returns the completion's seq too.
    async fn completed(
        api: &'a Api,
        task: &'a str,
        sub: &'a str,
        bridge: &'a str,
        review_required: bool,
    ) -> (Pull<'a>, u64) {
        let p = Pull::start(api, task, sub, bridge, review_required).await;
        let done = p.run("task.run_completed", "r1").await;
        (p, done)
    }

    /// Append a lifecycle event of the task; returns its seq.
    async fn step(&self, ty: &str, payload: Value) -> u64 {
        step(self.api, self.task, ty, payload).await
    }

    /// Append `ty` of run `run` (a payload of just the run id); returns its seq.
    async fn run(&self, ty: &str, run: &str) -> u64 {
        self.step(ty, json!({"run_id": run})).await
    }

    /// `task.run_failed` of run r1 with `error`.
    async fn fail(&self, error: &str) -> u64 {
        let payload = json!({"run_id": "r1", "error": error});
        self.step("task.run_failed", payload).await
    }

    /// `task.run_review_approved` of run r1 by `reviewer`.
    async fn approve(&self, reviewer: &str) -> u64 {
        let payload = json!({"run_id": "r1", "reviewer": reviewer});
        self.step("task.run_review_approved", payload).await
    }

    /// `task.run_review_rejected` of run r1 by `reviewer` for `reason` (with `continuation`
    /// when given).
    async fn reject(&self, reviewer: &str, reason: &str, continuation: Option<bool>) -> u64 {
        let mut payload = json!({"run_id": "r1", "reviewer": reviewer, "reason": reason});
        if let Some(c) = continuation {
            payload["continuation"] = json!(c);
        }
        self.step("task.run_review_rejected", payload).await
    }

    /// The explain view: its candidates must be `want` (`(seq, event_type, decision)`) and
    /// its next step `next` at `next_seq`.
    async fn explain_is(
        &self,
        want: &[(u64, &str, &str)],
        next: &str,
        next_seq: Option<u64>,
    ) -> Value {
        let x = explain(self.api, self.task, self.sub).await;
        let want: Vec<_> = want.iter().map(|(seq, ty, d)| cand(*seq, ty, d)).collect();
        assert_eq!(decisions(&x), want, "{}: {x}", self.sub);
        check_next(&x, next, next_seq);
        x
    }

    /// Wait for the mismatch event at `seq`: the cursor stays at 0 and carries its detail as
    /// `last_error`. Returns the mismatch event.
    async fn stopped_at(&self, seq: u64) -> Value {
        let m = wait_mismatch(self.api, self.task, self.sub, seq).await;
        let c = self.cursor().await;
        assert_eq!(c["last_sequence"], 0, "a mismatch never advances: {c}");
        assert_eq!(c["last_error"], m["payload"]["detail"], "{c} / {m}");
        m
    }

    /// The pull shows exactly the delivery of `seq`.
    async fn pending(&self, seq: u64, ty: &str) {
        expect_pending(self.api, self.bridge, self.sub, self.task, seq, ty).await;
    }

    async fn nothing_pending(&self, what: &str) {
        expect_nothing_pending(self.api, self.bridge, what).await;
    }

    async fn ack_ok(&self, seq: u64) -> Value {
        ack_ok(self.api, self.bridge, self.sub, seq).await
    }

    async fn cursor(&self) -> Value {
        sub_cursor(self.api, self.task, self.sub).await
    }
}

// ---------------------------------------------------------------------------------------------
// The decision table, one test per row.
// ---------------------------------------------------------------------------------------------

/// Row 1: a run end of a run that is not review-gated, and the run has that outcome → deliver.
#[tokio::test]
async fn table_ungated_run_end_with_that_outcome_is_delivered() {
    let s = start().await;
    for (task, ty, payload) in [
        ("t-done", "task.run_completed", json!({"run_id": "r1"})),
        (
            "t-fail",
            "task.run_failed",
            json!({"run_id": "r1", "error": "oom"}),
        ),
        ("t-stop", "task.run_canceled", json!({"run_id": "r1"})),
    ] {
        let (sub, bridge) = (format!("s-{task}"), format!("b-{task}"));
        let p = Pull::start(&s, task, &sub, &bridge, false).await;
        let end = p.step(ty, payload).await;

        let x = p
            .explain_is(&[(end, ty, "deliver")], "deliver", Some(end))
            .await;
        assert_zero(&x["cursor"]);
        let got = pull(&s, &bridge, 0).await;
        assert_eq!(got.len(), 1, "{task}: {got:?}");
        check_envelope(&got[0], &sub, task, &bridge, end, ty);
        assert_eq!(got[0]["metadata"]["run_id"], "r1", "{}", got[0]);

        // Only the confirmation moves the cursor.
        assert_zero(&p.cursor().await);
        p.ack_ok(end).await;
        let c = p.cursor().await;
        assert_eq!(c["last_sequence"], end, "{c}");
        check_time(c["last_delivered_at"].as_str().expect("last_delivered_at"));
        p.nothing_pending(task).await;
        check_next(&explain(&s, task, &sub).await, "idle", None);
    }
    for task in ["t-done", "t-fail", "t-stop"] {
        assert!(mismatches(&s, task).await.is_empty(), "{task}");
    }
}

/// Row 2: a run end of an ungated run whose outcome changed since → mismatch. Two ways the
/// tasks model changes a run's outcome after its completion: a later end event of the same run
/// (`run_failed`), and a review rejection with `continuation: true` (the run is `running`
/// again; the rejection does not make the run gated, as it is not a review request).
#[tokio::test]
async fn table_run_end_whose_run_has_another_outcome_is_a_mismatch() {
    let s = start().await;

    // (a) completed, then failed.
    let (p, done) = Pull::completed(&s, "t-refail", "s-refail", "b-refail", false).await;
    let failed = p.fail("late crash").await;
    assert_eq!(
        run_of(&get_task(&s, p.task).await, "r1")["outcome"],
        "failed"
    );
    let want = [
        (done, "task.run_completed", "mismatch"),
        (failed, "task.run_failed", "deliver"),
    ];
    p.explain_is(&want, "stopped", Some(done)).await;
    // Stopped at the mismatch: the later deliverable event is not offered.
    p.nothing_pending("stopped at a mismatch").await;
    p.stopped_at(done).await;

    // (b) completed, then a rejection that continues the run.
    let (p, done) = Pull::completed(&s, "t-cont", "s-cont", "b-cont", false).await;
    p.reject("eve", "redo", Some(true)).await;
    let t = get_task(&s, p.task).await;
    let r1 = run_of(&t, "r1");
    assert_eq!(r1["outcome"], "running", "precondition: {t}");
    assert_eq!(r1["review"]["gated"], false, "precondition: {t}");
    let want = [(done, "task.run_completed", "mismatch")];
    p.explain_is(&want, "stopped", Some(done)).await;
    p.nothing_pending("completion of a running run").await;
    p.stopped_at(done).await;
}

/// Row 3: a run end of a review-gated run → defer, whatever the outcome: gated by the task's
/// `review_required`, or by a review requested for the run (before or after its completion).
#[tokio::test]
async fn table_run_end_of_a_review_gated_run_is_deferred() {
    let s = start().await;
    // (task, review_required, events before the end, end type)
    let cases: [(&str, bool, &[&str], &str); 4] = [
        ("t-req", true, &[], "task.run_completed"),
        (
            "t-asked",
            false,
            &["task.run_review_requested"],
            "task.run_completed",
        ),
        ("t-req-fail", true, &[], "task.run_failed"),
        ("t-req-stop", true, &[], "task.run_canceled"),
    ];
    for (task, required, before, end_ty) in cases {
        let (sub, bridge) = (format!("s-{task}"), format!("b-{task}"));
        let p = Pull::start(&s, task, &sub, &bridge, required).await;
        for ty in before {
            p.run(ty, "r1").await;
        }
        let end = p.run(end_ty, "r1").await;
        let x = p.explain_is(&[(end, end_ty, "defer")], "idle", None).await;
        assert_zero(&x["cursor"]);
        p.nothing_pending(task).await;
    }

    // Completed while ungated (deliverable), then a review is requested: now deferred.
    let (p, done) = Pull::completed(&s, "t-late-ask", "s-late-ask", "b-late-ask", false).await;
    p.pending(done, "task.run_completed").await;
    p.run("task.run_review_requested", "r1").await;
    let want = [(done, "task.run_completed", "defer")];
    p.explain_is(&want, "idle", None).await;
    p.nothing_pending("a review was requested after the completion")
        .await;
    // The completion is no longer pending: acking it is refused.
    let r = ack(&s, p.bridge, &delivery_id(p.sub, done)).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_zero(&p.cursor().await);

    settled_head(&s).await;
    for (task, ..) in cases {
        assert!(mismatches(&s, task).await.is_empty(), "{task}");
    }
    assert!(mismatches(&s, p.task).await.is_empty());
}

/// Row 4: `run_review_approved` of R while R's review is approved → deliver.
#[tokio::test]
async fn table_approval_of_an_approved_review_is_delivered() {
    let s = start().await;
    let (p, done) = Pull::completed(&s, "t-ok", "s-ok", "b-ok", true).await;
    let ok = p.approve("alice").await;
    let want = [
        (done, "task.run_completed", "defer"),
        (ok, "task.run_review_approved", "deliver"),
    ];
    p.explain_is(&want, "deliver", Some(ok)).await;
    let got = pull(&s, p.bridge, 0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    check_envelope(
        &got[0],
        p.sub,
        p.task,
        p.bridge,
        ok,
        "task.run_review_approved",
    );
    assert_eq!(got[0]["metadata"]["run_id"], "r1", "{}", got[0]);
}

/// Row 5: `run_review_approved` of R while R's review is not approved → mismatch: rejected
/// after the approval, or pending again (a new review request after the approval).
#[tokio::test]
async fn table_approval_of_a_review_not_approved_is_a_mismatch() {
    let s = start().await;
    // (task, review_required, what comes after the approval, the review state it leaves)
    let cases = [
        (
            "t-rej",
            true,
            "task.run_review_rejected",
            json!({"run_id": "r1", "reviewer": "bob", "reason": "no"}),
            "rejected",
        ),
        (
            "t-pend",
            false,
            "task.run_review_requested",
            json!({"run_id": "r1"}),
            "pending",
        ),
    ];
    for (task, required, after_ty, after_payload, state) in cases {
        let (sub, bridge) = (format!("s-{task}"), format!("b-{task}"));
        let p = Pull::start(&s, task, &sub, &bridge, required).await;
        if !required {
            p.run("task.run_review_requested", "r1").await;
        }
        let done = p.run("task.run_completed", "r1").await;
        let ok = p.run("task.run_review_approved", "r1").await;
        p.step(after_ty, after_payload).await;
        let t = get_task(&s, task).await;
        let review = &run_of(&t, "r1")["review"];
        assert_eq!(review["state"], state, "precondition: {t}");
        let want = [
            (done, "task.run_completed", "defer"),
            (ok, "task.run_review_approved", "mismatch"),
        ];
        p.explain_is(&want, "stopped", Some(ok)).await;
        p.nothing_pending(task).await;
        p.stopped_at(ok).await;
    }
}

/// Row 6: `task.canceled` while the task is canceled → deliver; with a run end before it,
/// both are delivered in order, each after the previous one was confirmed.
///
/// Row 7 (`task.canceled` while the task is not canceled → mismatch) cannot be reached through
/// the API: the tasks model sets `canceled` on every `task.canceled` of the task and never
/// clears it (cancel is sticky), and the notifier only considers `task.canceled` events of the
/// task's own `task_events`, which are exactly the events that fold into that task. So the
/// current state of a task that has such an event is always canceled; that row is only
/// reachable by calling the decision function directly, which an end-to-end test cannot do.
#[tokio::test]
async fn table_task_canceled_of_a_canceled_task_is_delivered() {
    let s = start().await;
    let p = Pull::start(&s, "t-cancel", "s-cancel", "b-cancel", false).await;
    let cancel = p
        .step("task.canceled", json!({"reason": "not needed"}))
        .await;
    let want = [(cancel, "task.canceled", "deliver")];
    p.explain_is(&want, "deliver", Some(cancel)).await;
    p.pending(cancel, "task.canceled").await;
    p.ack_ok(cancel).await;
    p.nothing_pending("after the ack").await;

    let (p, done) =
        Pull::completed(&s, "t-done-cancel", "s-done-cancel", "b-done-cancel", false).await;
    let cancel = p.step("task.canceled", json!({})).await;
    let want = [
        (done, "task.run_completed", "deliver"),
        (cancel, "task.canceled", "deliver"),
    ];
    p.explain_is(&want, "deliver", Some(done)).await;
    p.pending(done, "task.run_completed").await;
    // The later one is not the pending one yet.
    let r = ack(&s, p.bridge, &delivery_id(p.sub, cancel)).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    p.ack_ok(done).await;
    p.pending(cancel, "task.canceled").await;
    p.ack_ok(cancel).await;
    p.nothing_pending("both delivered").await;
    assert!(mismatches(&s, p.task).await.is_empty());
}

/// The batch ack: one request confirms the pending deliveries of several subscriptions, and
/// two deliverable events of one subscription in order; an id out of order, of another
/// bridge, or unknown is refused on its own and changes nothing; a repeat is idempotent.
#[tokio::test]
async fn batch_ack_confirms_in_order_and_judges_each_id() {
    let s = start().await;
    let bridge = "b-batch";
    let mut want = Vec::new();
    for i in 0..3 {
        let (task, sub) = (format!("t-batch-{i}"), format!("s-batch-{i}"));
        let (_, seq) = Pull::completed(&s, &task, &sub, bridge, false).await;
        want.push((sub, seq));
    }
    // Subscription 0 also has a second deliverable event (the task is canceled after).
    let cancel = step(&s, "t-batch-0", "task.canceled", json!({})).await;
    let (_, other) = Pull::completed(&s, "t-other", "s-other", "b-other", false).await;
    let head = settled_head(&s).await;

    let path = format!("/v1/bridges/{bridge}/deliveries/ack");
    // Out of order: the cancel of s-batch-0 before its completion is not pending yet.
    let ids = vec![
        delivery_id("s-batch-0", cancel),
        delivery_id("s-other", other),
        "notif:nope:1".to_owned(),
        "garbage".to_owned(),
    ];
    let r = post_json(&s, &path, &json!({"delivery_ids": ids})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let res = r.json["results"].as_array().unwrap().clone();
    assert_eq!(res.len(), 4, "{}", r.text);
    let refused = [(409, "not_pending"), (409, "foreign_delivery")];
    for (x, (status, code)) in res.iter().zip(refused) {
        let got = (x["status"].as_u64(), x["code"].as_str());
        assert_eq!(got, (Some(status), Some(code)), "{}", r.text);
    }
    assert_eq!(res[2]["status"], 404, "{}", r.text);
    assert_eq!(res[3]["status"], 404, "{}", r.text);
    assert_eq!(s.head().await, head, "refused ids change nothing");

    // In order: every pending one, then the cancel of s-batch-0 after its completion.
    let mut ids: Vec<String> = want
        .iter()
        .map(|(sub, seq)| delivery_id(sub, *seq))
        .collect();
    ids.push(delivery_id("s-batch-0", cancel));
    let r = post_json(&s, &path, &json!({"delivery_ids": ids})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let res = r.json["results"].as_array().unwrap().clone();
    for (i, x) in res.iter().enumerate() {
        assert_eq!(x["status"], 200, "item {i}: {}", r.text);
        assert_eq!(x["delivery_id"], ids[i].as_str(), "{}", r.text);
    }
    assert_eq!(res[3]["cursor"]["last_sequence"], cancel, "{}", r.text);
    for (sub, seq) in &want[1..] {
        let task = format!("t-batch-{}", &sub["s-batch-".len()..]);
        let c = cursor_of(&s, &consumer(sub), "task_events", &task).await;
        assert_eq!(c["last_sequence"], *seq, "{c}");
    }
    let c = cursor_of(&s, &consumer("s-batch-0"), "task_events", "t-batch-0").await;
    assert_eq!(c["last_sequence"], cancel, "{c}");
    expect_nothing_pending(&s, bridge, "after the batch ack").await;
    let after = s.head().await;
    assert_eq!(after - head, 4, "one cursor.advanced per confirmed id");
    // A repeat of the last confirmed ids is idempotent.
    let repeat = json!({"delivery_ids": [delivery_id("s-batch-1", want[1].1)]});
    let r = post_json(&s, &path, &repeat).await;
    assert_eq!(r.json["results"][0]["status"], 200, "{}", r.text);
    assert_eq!(s.head().await, after, "a repeat appends nothing");
    // Bad bodies are refused whole.
    for body in [
        json!({"delivery_ids": []}),
        json!({}),
        json!({"delivery_ids": "x"}),
    ] {
        let r = post_json(&s, &path, &body).await;
        check_4xx(&r, None, None, &format!("batch ack {body}"));
    }
    assert_eq!(s.head().await, after);
}

// ---------------------------------------------------------------------------------------------
// The scenarios.
// ---------------------------------------------------------------------------------------------

/// (1) A review-gated run completes: deferred, nothing delivered. The approval is delivered
/// exactly once, at the approval's seq; the ack moves the cursor there and nothing is pending
/// afterwards.
#[tokio::test]
async fn review_gated_completion_is_deferred_then_the_approval_is_delivered_once() {
    let s = start().await;
    let (task, sub, bridge) = ("t-gate", "s-gate", "b-gate");
    new_task(&s, task, true).await;
    let created = subscribe(&s, task, sub, bridge).await;
    assert_zero(&created["cursor"]);
    let p = Pull {
        api: &s,
        task,
        sub,
        bridge,
    };
    p.run("task.run_started", "r1").await;
    let done = p.run("task.run_completed", "r1").await;
    assert_eq!(get_task(&s, task).await["status"], "awaiting_review");

    p.nothing_pending("a gated completion").await;
    let want = [(done, "task.run_completed", "defer")];
    p.explain_is(&want, "idle", None).await;
    // A long-poll does not see it either.
    assert!(pull(&s, bridge, 300).await.is_empty());

    let ok = p.approve("alice").await;
    p.pending(ok, "task.run_review_approved").await;
    // Asking again shows the same single delivery.
    p.pending(ok, "task.run_review_approved").await;
    assert_zero(&p.cursor().await);

    let head = settled_head(&s).await;
    let cur = p.ack_ok(ok).await;
    assert_eq!(s.head().await, head + 1, "the ack records one cursor event");
    let filter = format!("stream=cursors&subject={}", consumer(sub));
    let advanced = s.read_all_after(head, &filter, 100).await;
    assert_eq!(advanced.len(), 1, "{advanced:?}");
    assert_eq!(advanced[0]["type"], "cursor.advanced", "{}", advanced[0]);
    let payload = &advanced[0]["payload"];
    assert_eq!(payload["last_sequence"], ok);
    assert_eq!(payload["delivery_id"], delivery_id(sub, ok).as_str());

    let c = p.cursor().await;
    assert_eq!(c["last_sequence"], ok, "{c}");
    assert_eq!(c["last_delivery_id"], delivery_id(sub, ok).as_str(), "{c}");
    assert_eq!(c["last_error"], Value::Null, "{c}");
    assert_eq!(c, cur, "the ack answers the stored cursor");
    p.nothing_pending("after the ack").await;
    p.explain_is(&[], "idle", None).await;

    // The same ack again: 200, the same cursor, nothing appended.
    let again = ack(&s, bridge, &delivery_id(sub, ok)).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.json["cursor"], c, "{}", again.text);
    assert_eq!(s.head().await, head + 1, "a repeated ack appends nothing");
    // The subscription shows the cursor too.
    let shown = s.get(&format!("{}/{sub}", bridges_path(task))).await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.text);
    assert_eq!(shown.json["cursor"], c, "{}", shown.text);
    assert!(mismatches(&s, task).await.is_empty());
}

/// (2) An approval contradicted by a rejection before the bridge acked it: mismatch, the
/// cursor stays, exactly one `notification.terminal_state_mismatch`, the cursor's last_error
/// says why, the old delivery can no longer be acked. A new approval repairs the state: the
/// next replay decides afresh.
///
/// What "afresh" gives is the decision table's answer for each event past the cursor against
/// the repaired state: the first approval (seq A1) is again the approval of a run whose review
/// is approved, so it is delivered first, then the new approval (A2). The cursor never skips
/// A1 without delivering it ("never advances past a mismatch").
#[tokio::test]
async fn contradicted_approval_is_a_mismatch_until_a_new_approval_repairs_it() {
    let s = start().await;
    let (p, done) = Pull::completed(&s, "t-contra", "s-a", "b-contra", true).await;
    let (task, sub, bridge) = (p.task, p.sub, p.bridge);
    let a1 = p.approve("alice").await;
    p.pending(a1, "task.run_review_approved").await;

    p.reject("bob", "found a bug", None).await;
    let m = p.stopped_at(a1).await;
    p.nothing_pending("after the contradiction").await;
    let want = [
        (done, "task.run_completed", "defer"),
        (a1, "task.run_review_approved", "mismatch"),
    ];
    p.explain_is(&want, "stopped", Some(a1)).await;
    let c = p.cursor().await;
    assert_eq!(c["last_delivery_id"], Value::Null, "{c}");
    assert_eq!(c["last_error"], m["payload"]["detail"], "{c}");

    // The bridge acks the delivery it saw before the rejection: refused, nothing changes.
    let head = settled_head(&s).await;
    let r = ack(&s, bridge, &delivery_id(sub, a1)).await;
    let what = "ack of a contradicted approval";
    assert_eq!(r.status, StatusCode::CONFLICT, "{what}: {}", r.text);
    check_4xx(&r, Some(409), None, what);
    assert_eq!(s.head().await, head, "a refused ack appended events");
    assert_eq!(p.cursor().await, c, "a refused ack moved the cursor");

    // More task events that do not repair it, then a second subscription on the same task:
    // once the notifier recorded the second one's mismatch, it has looked at the first one
    // again after those events (one pass handles the task's subscriptions in id order). Still
    // exactly one mismatch event for the first.
    p.reject("bob", "still broken", None).await;
    subscribe(&s, task, "s-b", "b-contra-2").await;
    wait_mismatch(&s, task, "s-b", a1).await;
    let mine = mismatches_of(&s, task, sub).await;
    let what = "exactly one mismatch event per (subscription, seq)";
    assert_eq!(mine.len(), 1, "{what}: {mine:?}");
    assert_eq!(mine[0]["event_id"], format!("mismatch:{sub}:{a1}").as_str());
    assert_eq!(p.cursor().await["last_sequence"], 0);

    // Repaired by a new approval: every approval of the run decides deliver.
    let a2 = p.approve("carol").await;
    let want = [
        (done, "task.run_completed", "defer"),
        (a1, "task.run_review_approved", "deliver"),
        (a2, "task.run_review_approved", "deliver"),
    ];
    p.explain_is(&want, "deliver", Some(a1)).await;
    p.pending(a1, "task.run_review_approved").await;
    p.ack_ok(a1).await;
    p.pending(a2, "task.run_review_approved").await;
    p.ack_ok(a2).await;
    let c = p.cursor().await;
    assert_eq!(c["last_sequence"], a2, "{c}");
    assert_eq!(c["last_error"], Value::Null, "{c}");
    p.nothing_pending("after the repair").await;
    check_next(&explain(&s, task, sub).await, "idle", None);
    assert_eq!(mismatches_of(&s, task, sub).await.len(), 1);
}

/// (3) An operator reset past the mismatch seq: scanning resumes after it, and a later
/// terminal event is delivered.
#[tokio::test]
async fn operator_reset_past_a_mismatch_resumes_after_it() {
    let s = start().await;
    let (p, done) = Pull::completed(&s, "t-reset", "s-reset", "b-reset", false).await;
    let (task, sub) = (p.task, p.sub);
    let failed = p.fail("crash").await;
    wait_mismatch(&s, task, sub, done).await;
    p.nothing_pending("stopped").await;
    check_next(&explain(&s, task, sub).await, "stopped", Some(done));

    let head = settled_head(&s).await;
    let reason = "stale completion, the failure is the truth";
    let r = post_json(
        &s,
        "/v1/cursors/reset",
        &json!({"consumer_id": consumer(sub), "stream_name": "task_events", "subject_id": task,
                "last_sequence": done, "reason": reason}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "reset: {}", r.text);
    assert_eq!(r.json["last_sequence"], done, "{}", r.text);
    assert_eq!(r.json["last_error"], Value::Null, "{}", r.text);
    let resets = s
        .read_all_after(head, "stream=cursors&type=cursor.reset", 100)
        .await;
    assert_eq!(resets.len(), 1, "{resets:?}");
    assert_eq!(resets[0]["subject"], consumer(sub).as_str());
    assert_eq!(resets[0]["payload"]["from"], 0, "{}", resets[0]);
    assert_eq!(resets[0]["payload"]["to"], done, "{}", resets[0]);
    assert_eq!(resets[0]["payload"]["reason"], reason, "{}", resets[0]);

    let want = [(failed, "task.run_failed", "deliver")];
    p.explain_is(&want, "deliver", Some(failed)).await;
    p.pending(failed, "task.run_failed").await;
    p.ack_ok(failed).await;

    // And the next run's end after that.
    p.run("task.run_started", "r2").await;
    let done2 = p.run("task.run_completed", "r2").await;
    p.pending(done2, "task.run_completed").await;
    p.ack_ok(done2).await;
    p.nothing_pending("all delivered").await;
    assert_eq!(
        mismatches_of(&s, task, sub).await.len(),
        1,
        "the reset past the mismatch recorded no new mismatch"
    );
}

/// (4) Delete and re-create: the cursor is kept, the re-created subscription resumes from it
/// and the confirmed notification is not delivered again.
#[tokio::test]
async fn deleted_then_recreated_subscription_resumes_from_the_kept_cursor() {
    let s = start().await;
    let (p, done) = Pull::completed(&s, "t-again", "s-again", "b-again", false).await;
    let (task, sub, bridge) = (p.task, p.sub, p.bridge);
    p.pending(done, "task.run_completed").await;
    p.ack_ok(done).await;

    let path = format!("{}/{sub}", bridges_path(task));
    let r = delete(&s, &path).await;
    assert_eq!(r.status, StatusCode::OK, "DELETE: {}", r.text);
    assert_eq!(r.json["active"], false, "{}", r.text);
    assert_eq!(r.json["cursor"]["last_sequence"], done, "{}", r.text);
    // Gone from the API, its cursor kept.
    let not_found = [
        (s.get(&path).await, "show of a deleted subscription"),
        (delete(&s, &path).await, "delete again"),
    ];
    for (r, what) in &not_found {
        check_4xx(r, Some(404), Some("subscription_not_found"), what);
    }
    let list = s.get(&bridges_path(task)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert_eq!(list.json["subscriptions"], json!([]), "{}", list.text);
    let kept = p.cursor().await;
    assert_eq!(kept["last_sequence"], done, "{kept}");
    let all = s
        .get(&format!(
            "/v1/cursors?consumer_id={}",
            tidemark_tests::encode_path(&consumer(sub))
        ))
        .await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.text);
    assert_eq!(all.json["cursors"], json!([kept]), "{}", all.text);

    // A terminal event while deleted: nobody is offered it.
    p.run("task.run_started", "r2").await;
    let done2 = p.run("task.run_completed", "r2").await;
    p.nothing_pending("while deleted").await;

    let r = post_json(&s, &bridges_path(task), &sub_body(sub, bridge)).await;
    assert_eq!(r.status, StatusCode::CREATED, "re-create: {}", r.text);
    assert_eq!(r.json["active"], true, "{}", r.text);
    assert_eq!(r.json["cursor"]["last_sequence"], done, "{}", r.text);
    p.pending(done2, "task.run_completed").await;
    p.ack_ok(done2).await;
    p.nothing_pending("after the re-created one was acked")
        .await;
    // Re-creating with the same body again is the 200 of an existing subscription.
    let r = post_json(&s, &bridges_path(task), &sub_body(sub, bridge)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

/// (5) A long-poll started before the terminal event is appended returns it; with nothing
/// pending a short long-poll answers an empty list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_long_poll_returns_an_event_appended_while_it_waits() {
    let s = start().await;
    let p = Pull::start(&s, "t-poll", "s-poll", "b-poll", false).await;
    let (task, sub, bridge) = (p.task, p.sub, p.bridge);

    let api = s.api();
    let poll = tokio::spawn(async move { pull(&api, "b-poll", 10_000).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !poll.is_finished(),
        "the long-poll answered before anything was pending"
    );
    let done = p.run("task.run_completed", "r1").await;
    let got = tokio::time::timeout(WAIT, poll)
        .await
        .expect("the long-poll did not answer")
        .expect("poll task");
    assert_eq!(got.len(), 1, "{got:?}");
    check_envelope(&got[0], sub, task, bridge, done, "task.run_completed");
    p.ack_ok(done).await;

    // Nothing pending: the wait ends with an empty list.
    assert!(pull(&s, bridge, 300).await.is_empty());
    assert!(pull(&s, "b-nobody", 300).await.is_empty());
    // wait_ms is bounded and numeric.
    for q in ["wait_ms=30001", "wait_ms=abc", "wait_ms=-1"] {
        let r = s.get(&format!("/v1/bridges/{bridge}/deliveries?{q}")).await;
        check_4xx(&r, None, None, q);
    }
}

/// (6) Refused acks change nothing: unknown or malformed delivery ids (404), another bridge's
/// delivery (409 foreign_delivery), a seq that is not the pending one (409). A nack records
/// the error and keeps the delivery pending; the ack then clears it.
#[tokio::test]
async fn refused_acks_change_nothing() {
    let s = start().await;
    let task = "t-acks";
    new_task(&s, task, false).await;
    subscribe(&s, task, "s1", "b1").await;
    subscribe(&s, task, "s2", "b2").await;
    let started = step(&s, task, "task.run_started", json!({"run_id": "r1"})).await;
    let done = step(&s, task, "task.run_completed", json!({"run_id": "r1"})).await;
    expect_pending(&s, "b1", "s1", task, done, "task.run_completed").await;
    let head = settled_head(&s).await;

    let cases: Vec<(String, String, u16, Option<&str>)> = vec![
        (
            "b1".into(),
            "notif:nope:1".into(),
            404,
            Some("delivery_not_found"),
        ),
        (
            "b1".into(),
            "garbage".into(),
            404,
            Some("delivery_not_found"),
        ),
        (
            "b1".into(),
            "notif:s1:xyz".into(),
            404,
            Some("delivery_not_found"),
        ),
        (
            "b1".into(),
            "notif:s1".into(),
            404,
            Some("delivery_not_found"),
        ),
        (
            "b1".into(),
            "notif::5".into(),
            404,
            Some("delivery_not_found"),
        ),
        (
            "b2".into(),
            delivery_id("s1", done),
            409,
            Some("foreign_delivery"),
        ),
        (
            "b1".into(),
            delivery_id("s2", done),
            409,
            Some("foreign_delivery"),
        ),
        (
            "b-other".into(),
            delivery_id("s1", done),
            409,
            Some("foreign_delivery"),
        ),
        (
            "b1".into(),
            delivery_id("s1", started),
            409,
            Some("not_pending"),
        ),
        (
            "b1".into(),
            delivery_id("s1", done + 1000),
            409,
            Some("not_pending"),
        ),
    ];
    for (bridge, id, status, code) in &cases {
        let what = format!("ack of {id} on {bridge}");
        let r = ack(&s, bridge, id).await;
        check_4xx(&r, Some(*status), *code, &what);
        assert_eq!(s.head().await, head, "{what}: the log changed");
        assert_zero(&sub_cursor(&s, task, "s1").await);
        assert_zero(&sub_cursor(&s, task, "s2").await);
    }
    expect_pending(&s, "b1", "s1", task, done, "task.run_completed").await;

    // nack: the error is recorded, the delivery stays pending.
    let nack = |id: String, body: Value| {
        let api = s.api();
        async move { post_json(&api, &format!("/v1/bridges/b1/deliveries/{id}/nack"), &body).await }
    };
    let r = nack(delivery_id("s1", started), json!({"error": "x"})).await;
    check_4xx(&r, Some(409), None, "nack of a seq that is not pending");
    let r = nack(delivery_id("s1", done), json!({})).await;
    check_4xx(&r, None, None, "nack without error");
    assert_eq!(s.head().await, head, "refused nacks appended events");
    let r = nack(delivery_id("s1", done), json!({"error": "chat api down"})).await;
    assert_eq!(r.status, StatusCode::OK, "nack: {}", r.text);
    assert_eq!(
        r.json["cursor"]["last_error"], "chat api down",
        "{}",
        r.text
    );
    assert_eq!(r.json["cursor"]["last_sequence"], 0, "{}", r.text);
    let c = sub_cursor(&s, task, "s1").await;
    assert_eq!(c["last_error"], "chat api down", "{c}");
    assert_eq!(c["last_sequence"], 0, "{c}");
    expect_pending(&s, "b1", "s1", task, done, "task.run_completed").await;

    let head = s.head().await;
    let cur = ack_ok(&s, "b1", "s1", done).await;
    assert_eq!(s.head().await, head + 1);
    check_time(
        cur["last_delivered_at"]
            .as_str()
            .expect("last_delivered_at"),
    );
    // Acked: now the old ids are "not pending", the same ack is idempotent.
    let again = ack(&s, "b1", &delivery_id("s1", done)).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.json["cursor"], cur, "{}", again.text);
    check_4xx(
        &ack(&s, "b1", &delivery_id("s1", started)).await,
        Some(409),
        None,
        "ack behind the cursor",
    );
    assert_eq!(s.head().await, head + 1, "repeated/refused acks appended");
    expect_nothing_pending(&s, "b1", "acked").await;
    // The other bridge's subscription has its own cursor: still pending there.
    assert_zero(&sub_cursor(&s, task, "s2").await);
    expect_pending(&s, "b2", "s2", task, done, "task.run_completed").await;
}

/// (7) Subscription create: 201, the same again 200 with nothing appended, another target 409;
/// list and show carry the zero cursor; bad bodies are 4xx problems, never 5xx.
#[tokio::test]
async fn subscription_create_is_idempotent_and_validated() {
    let s = start().await;
    let task = "t-subs";
    new_task(&s, task, false).await;
    let list = s.get(&bridges_path(task)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert_eq!(list.json["subscriptions"], json!([]), "{}", list.text);

    let head = settled_head(&s).await;
    let body = json!({"subscription_id": "sub-1", "bridge_id": "b1", "scope": "team",
                      "workspace_id": "ws-1", "thread_id": "th-9",
                      "sink": {"kind": "pull"}});
    let r = post_json(&s, &bridges_path(task), &body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let row = r.json.clone();
    assert_eq!(row["subscription_id"], "sub-1", "{row}");
    assert_eq!(row["task_id"], task, "{row}");
    assert_eq!(row["bridge_id"], "b1", "{row}");
    assert_eq!(row["scope"], "team", "{row}");
    assert_eq!(row["workspace_id"], "ws-1", "{row}");
    assert_eq!(row["thread_id"], "th-9", "{row}");
    assert_eq!(row["mode"], "reply", "the default mode: {row}");
    assert_eq!(row["sink"]["kind"], "pull", "{row}");
    assert_eq!(row["sink"]["secret_set"], false, "{row}");
    assert_eq!(row["active"], true, "{row}");
    check_time(row["created_at"].as_str().expect("created_at"));
    check_time(row["updated_at"].as_str().expect("updated_at"));
    assert_eq!(
        row["cursor"]["consumer_id"],
        "bridge_task_subscription:sub-1"
    );
    assert_eq!(row["cursor"]["stream_name"], "task_events");
    assert_eq!(row["cursor"]["subject_id"], task);
    assert_zero(&row["cursor"]);
    assert_eq!(s.head().await, head + 1, "one bridge.subscribed");
    let subscribed = s.read_all_after(head, "stream=bridges", 100).await;
    assert_eq!(subscribed.len(), 1, "{subscribed:?}");
    assert_eq!(subscribed[0]["type"], "bridge.subscribed");
    assert_eq!(subscribed[0]["subject"], "sub-1");

    // The same again: 200, the same row, nothing appended.
    let r = post_json(&s, &bridges_path(task), &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json, row, "the same subscription answered differently");
    assert_eq!(s.head().await, head + 1, "a repeated create appended");
    // Another target under the same id: 409.
    for (what, other) in [
        ("another bridge", json!({"bridge_id": "b2"})),
        ("another thread", json!({"thread_id": "th-10"})),
        ("another mode", json!({"mode": "post"})),
    ] {
        let mut b = body.clone();
        for (k, v) in other.as_object().expect("object") {
            b[k] = v.clone();
        }
        let r = post_json(&s, &bridges_path(task), &b).await;
        check_4xx(&r, Some(409), Some("subscription_conflict"), what);
    }
    // The same id on another task is another target too.
    new_task(&s, "t-subs-2", false).await;
    let r = post_json(&s, &bridges_path("t-subs-2"), &body).await;
    check_4xx(&r, Some(409), Some("subscription_conflict"), "another task");
    let head = settled_head(&s).await;

    // List and show carry the cursor's zero state.
    let list = s.get(&bridges_path(task)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert_eq!(list.json["subscriptions"], json!([row]), "{}", list.text);
    let shown = s.get(&format!("{}/sub-1", bridges_path(task))).await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.text);
    // The row as created, plus the seq the answer is as of (spec section 7).
    let mut shown_row = shown.json.clone();
    let as_of = shown_row
        .as_object_mut()
        .and_then(|o| o.remove("as_of_seq"))
        .and_then(|v| v.as_u64());
    assert!(as_of.is_some_and(|a| a >= head), "{}", shown.text);
    assert_eq!(shown_row, row, "{}", shown.text);
    for (path, what) in [
        ("/sub-nope", "show of an unknown subscription"),
        ("/sub-nope/explain", "explain of an unknown subscription"),
    ] {
        let r = s.get(&format!("{}{path}", bridges_path(task))).await;
        check_4xx(&r, Some(404), Some("subscription_not_found"), what);
    }
    let r = s.get(&format!("{}/sub-1", bridges_path("t-subs-2"))).await;
    check_4xx(
        &r,
        Some(404),
        Some("subscription_not_found"),
        "show under another task",
    );

    // Bad bodies: 4xx problems, nothing appended. Each is a good body with one field changed
    // (or left out); `None` where any 4xx problem will do.
    let good = json!({"subscription_id": "x1", "bridge_id": "b1", "sink": {"kind": "pull"}});
    let ftp = json!({"kind": "webhook", "url": "ftp://example.invalid/x"});
    let pull_url = json!({"kind": "pull", "url": "http://127.0.0.1:9/x"});
    let invalid = Some((422, "invalid_field"));
    let bad: Vec<BadBody> = vec![
        ("missing sink", "sink", None, None),
        ("missing bridge_id", "bridge_id", None, None),
        ("missing subscription_id", "subscription_id", None, None),
        (
            "sink kind smtp",
            "sink",
            Some(json!({"kind": "smtp"})),
            invalid,
        ),
        (
            "webhook without url",
            "sink",
            Some(json!({"kind": "webhook"})),
            invalid,
        ),
        ("webhook with an ftp url", "sink", Some(ftp), invalid),
        ("pull with a url", "sink", Some(pull_url), invalid),
        ("mode shout", "mode", Some(json!("shout")), invalid),
        (
            "subscription_id with a space",
            "subscription_id",
            Some(json!("bad id")),
            invalid,
        ),
        (
            "subscription_id with a slash",
            "subscription_id",
            Some(json!("a/b")),
            invalid,
        ),
        (
            "empty subscription_id",
            "subscription_id",
            Some(json!("")),
            invalid,
        ),
        (
            "subscription_id of 129 characters",
            "subscription_id",
            Some(json!("x".repeat(129))),
            invalid,
        ),
        (
            "bridge_id with a colon",
            "bridge_id",
            Some(json!("b:1")),
            invalid,
        ),
        (
            "subscription_id is a number",
            "subscription_id",
            Some(json!(7)),
            None,
        ),
        ("sink is a string", "sink", Some(json!("pull")), None),
        ("unknown field", "colour", Some(json!("red")), None),
    ];
    let bodies = bad.into_iter().map(|(what, field, value, want)| {
        let mut b = good.clone();
        match value {
            Some(v) => b[field] = v,
            None => drop(b.as_object_mut().and_then(|o| o.remove(field))),
        }
        (what, b, want)
    });
    for (what, b, want) in bodies.chain([("a JSON array", json!([1, 2]), None)]) {
        let r = post_json(&s, &bridges_path(task), &b).await;
        match want {
            Some((st, code)) => check_4xx(&r, Some(st), Some(code), what),
            None => check_4xx(&r, None, None, what),
        }
        assert_eq!(s.head().await, head, "{what}: the log changed");
    }
    let r = s
        .send(
            s.request(Method::POST, &bridges_path(task))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body("{not json"),
        )
        .await;
    check_4xx(&r, Some(400), None, "malformed JSON");
    assert_eq!(s.head().await, head, "malformed JSON: the log changed");
    let list = s.get(&bridges_path(task)).await;
    assert_eq!(list.json["subscriptions"], json!([row]), "{}", list.text);

    // A webhook secret is never served back.
    let secret = &tidemark_tests::secret("wh-secret-5f1e9a7c");
    let r = post_json(
        &s,
        &bridges_path("t-subs-2"),
        &json!({"subscription_id": "sub-hook", "bridge_id": "b-hook", "mode": "post",
                "sink": {"kind": "webhook", "url": "http://127.0.0.1:9/hook", "secret": secret}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["sink"]["kind"], "webhook", "{}", r.text);
    // Its URL by scheme, host and port: a webhook URL's path can be its credential (spec
    // section 17).
    assert_eq!(r.json["sink"]["url"], "http://127.0.0.1:9", "{}", r.text);
    assert_eq!(r.json["sink"]["secret_set"], true, "{}", r.text);
    assert_eq!(r.json["mode"], "post", "{}", r.text);
    assert!(
        !r.text.contains(secret),
        "the secret was served: {}",
        r.text
    );
    let page = s.get("/v1/events?stream=bridges&limit=100").await;
    assert!(
        !page.text.contains(secret),
        "the secret is in the events: {}",
        page.text
    );
    let list = s.get(&bridges_path("t-subs-2")).await;
    assert!(!list.text.contains(secret), "{}", list.text);
}

/// (8) The cursors API: zero state, advance, idempotent replay, non-monotonic and CAS
/// refusals, reset with and without a reason, server-only cursor events.
#[tokio::test]
async fn cursors_api_advance_replay_conflicts_and_reset() {
    let s = start().await;
    let base = s.start_head();
    let seqs = append_orders(&s, 6).await;
    assert_eq!(seqs[0], base + 1);
    let (c1, st, sub) = ("c-orders", "orders", "");
    let head = s.head().await;

    assert_zero(&cursor_of(&s, c1, st, sub).await);
    // subject_id defaults to "".
    let r = s
        .get(&format!("/v1/cursors?consumer_id={c1}&stream_name={st}"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["cursors"].as_array().map(Vec::len), Some(1));
    assert_zero(&r.json["cursors"][0]);
    let r = s.get(&format!("/v1/cursors?consumer_id={c1}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["cursors"], json!([]), "{}", r.text);
    check_4xx(&s.get("/v1/cursors").await, None, None, "no consumer_id");
    assert_eq!(s.head().await, head, "reads appended");

    let adv = |last: u64, id: &str, expected: Option<u64>| {
        let mut b = json!({"consumer_id": c1, "stream_name": st, "subject_id": sub,
                           "last_sequence": last, "delivery_id": id});
        if let Some(e) = expected {
            b["expected_sequence"] = json!(e);
        }
        let api = s.api();
        async move { post_json(&api, "/v1/cursors/advance", &b).await }
    };

    let r = adv(seqs[2], "d3", None).await;
    assert_eq!(r.status, StatusCode::OK, "advance: {}", r.text);
    let c = r.json.clone();
    assert_eq!(c["consumer_id"], c1, "{c}");
    assert_eq!(c["stream_name"], st, "{c}");
    assert_eq!(c["subject_id"], sub, "{c}");
    assert_eq!(c["last_sequence"], seqs[2], "{c}");
    assert_eq!(c["last_delivery_id"], "d3", "{c}");
    assert_eq!(c["last_error"], Value::Null, "{c}");
    check_time(c["last_delivered_at"].as_str().expect("last_delivered_at"));
    check_time(c["updated_at"].as_str().expect("updated_at"));
    assert_eq!(s.head().await, head + 1);
    let e = cursor_event(&s, head, "cursor.advanced", c1).await;
    assert_eq!(e["payload"]["last_sequence"], seqs[2], "{e}");
    assert_eq!(e["payload"]["delivery_id"], "d3", "{e}");
    assert_eq!(cursor_of(&s, c1, st, sub).await, c);
    let head = head + 1;

    // Idempotent replay: 200, nothing appended, the cursor as it was.
    let r = adv(seqs[2], "d3", None).await;
    assert_eq!(r.status, StatusCode::OK, "replay: {}", r.text);
    assert_eq!(r.json, c, "a replay answered another cursor");
    let r = adv(seqs[2], "d3", Some(seqs[2])).await;
    assert_eq!(r.status, StatusCode::OK, "replay with CAS: {}", r.text);
    assert_eq!(s.head().await, head, "a replay appended");

    // Refusals.
    let refusals: Vec<Refusal> = vec![
        (
            "same seq, other delivery",
            seqs[2],
            "d3-bis",
            None,
            409,
            "non_monotonic_cursor",
        ),
        (
            "lower seq",
            seqs[1],
            "d2",
            None,
            409,
            "non_monotonic_cursor",
        ),
        (
            "lower seq, same delivery",
            seqs[1],
            "d3",
            None,
            409,
            "non_monotonic_cursor",
        ),
        (
            "CAS on a stale position",
            seqs[4],
            "d5",
            Some(seqs[1]),
            409,
            "cursor_conflict",
        ),
        (
            "CAS on zero",
            seqs[4],
            "d5",
            Some(0),
            409,
            "cursor_conflict",
        ),
        ("last_sequence 0", 0, "d0", None, 422, "invalid_field"),
        (
            "past the head",
            head + 100,
            "dx",
            None,
            422,
            "invalid_field",
        ),
    ];
    for (what, last, id, expected, status, code) in refusals {
        let r = adv(last, id, expected).await;
        check_4xx(&r, Some(status), Some(code), what);
        assert_eq!(s.head().await, head, "{what}: the log changed");
        assert_eq!(
            cursor_of(&s, c1, st, sub).await,
            c,
            "{what}: cursor changed"
        );
    }
    for (what, b) in [
        (
            "missing delivery_id",
            json!({"consumer_id": c1, "stream_name": st, "last_sequence": seqs[4]}),
        ),
        (
            "empty delivery_id",
            json!({"consumer_id": c1, "stream_name": st, "last_sequence": seqs[4],
                   "delivery_id": ""}),
        ),
        (
            "negative seq",
            json!({"consumer_id": c1, "stream_name": st, "last_sequence": -1,
                   "delivery_id": "d"}),
        ),
        (
            "empty consumer_id",
            json!({"consumer_id": "", "stream_name": st, "last_sequence": seqs[4],
                   "delivery_id": "d"}),
        ),
    ] {
        check_4xx(
            &post_json(&s, "/v1/cursors/advance", &b).await,
            None,
            None,
            what,
        );
        assert_eq!(s.head().await, head, "{what}: the log changed");
    }

    // CAS that matches.
    let r = adv(seqs[4], "d5", Some(seqs[2])).await;
    assert_eq!(r.status, StatusCode::OK, "CAS advance: {}", r.text);
    assert_eq!(r.json["last_sequence"], seqs[4], "{}", r.text);
    let head = head + 1;
    assert_eq!(s.head().await, head);

    // Reset: a reason is needed; down with a reason works and is recorded.
    let reset = |last: u64, reason: &str| {
        let b = json!({"consumer_id": c1, "stream_name": st, "subject_id": sub,
                       "last_sequence": last, "reason": reason});
        let api = s.api();
        async move { post_json(&api, "/v1/cursors/reset", &b).await }
    };
    for reason in ["", "   "] {
        let r = reset(seqs[0], reason).await;
        check_4xx(
            &r,
            Some(422),
            Some("reason_required"),
            "reset without reason",
        );
        assert_eq!(s.head().await, head, "a refused reset appended");
    }
    let r = post_json(
        &s,
        "/v1/cursors/reset",
        &json!({"consumer_id": c1, "stream_name": st, "last_sequence": seqs[0]}),
    )
    .await;
    check_4xx(&r, None, None, "reset with no reason field");
    let r = reset(head + 100, "too far").await;
    check_4xx(&r, Some(422), None, "reset past the head");
    assert_eq!(s.head().await, head, "refused resets appended");
    assert_eq!(cursor_of(&s, c1, st, sub).await["last_sequence"], seqs[4]);

    let r = reset(seqs[0], "replay the orders after a bad deploy").await;
    assert_eq!(r.status, StatusCode::OK, "reset: {}", r.text);
    assert_eq!(r.json["last_sequence"], seqs[0], "{}", r.text);
    assert_eq!(s.head().await, head + 1);
    let e = cursor_event(&s, head, "cursor.reset", c1).await;
    let payload = &e["payload"];
    assert_eq!(payload["from"], seqs[4], "{e}");
    assert_eq!(payload["to"], seqs[0], "{e}");
    // Who reset it: nobody named, in open mode, said as `null` (it was left out).
    assert_eq!(payload.get("by"), Some(&Value::Null), "{e}");
    let reason = "replay the orders after a bad deploy";
    assert_eq!(payload["reason"], reason, "{e}");
    let head = head + 1;
    let now = cursor_of(&s, c1, st, sub).await;
    assert_eq!(now["last_sequence"], seqs[0], "{now}");
    // After the reset, advancing forward works again from the new position.
    let r = adv(seqs[1], "d2", Some(seqs[0])).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let head = head + 1;

    // A reset of a cursor that never existed (up from zero) is recorded too.
    let r = post_json(
        &s,
        "/v1/cursors/reset",
        &json!({"consumer_id": "c-new", "stream_name": st, "last_sequence": seqs[3],
                "reason": "start late"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["last_sequence"], seqs[3], "{}", r.text);
    let ev = s.read_all_after(head, "stream=cursors", 10).await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["payload"]["from"], 0, "{}", ev[0]);
    let head = head + 1;

    // All of a consumer's cursors; another stream of the same consumer is its own cursor.
    let r = s.get(&format!("/v1/cursors?consumer_id={c1}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json["cursors"].as_array().map(Vec::len),
        Some(1),
        "{}",
        r.text
    );
    assert_zero(&cursor_of(&s, c1, "payments", "").await);
    assert_zero(&cursor_of(&s, c1, st, "o-1").await);

    // Cursor and mismatch events are server-only.
    for (stream, ty) in [
        ("cursors", "cursor.advanced"),
        ("cursors", "cursor.reset"),
        ("task_events", "notification.terminal_state_mismatch"),
        ("bridges", "bridge.subscribed"),
    ] {
        let (status, body) = s
            .append(&json!({"stream": stream, "subject": c1, "type": ty,
                            "payload": {"stream_name": st, "subject_id": "", "last_sequence": 1,
                                        "at_us": 0}}))
            .await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "client append of {ty}: {body}"
        );
        assert_eq!(body["code"], "server_only_type", "{body}");
    }
    assert_eq!(s.head().await, head, "refused appends changed the log");
}

/// (8, lag) `GET /v1/consumers/lag`: every cursor with the events past it, plus the zero cursor
/// of every active subscription; with `stuck_after = "1s"` a cursor with pending work and no
/// progress is flagged stalled, a caught-up one never, and a subscription whose task is running
/// (nothing to send) never either (e2e_truth has the rest of section 10's flags).
#[tokio::test]
async fn consumers_lag_counts_events_and_flags_stalled_cursors() {
    let config = format!("{QUIET}\n[notifications.outbox]\nstuck_after = \"1s\"\n");
    let s = Server::start(ServerOpts::default().config(config)).await;
    let seqs = append_orders(&s, 10).await;
    let (task, sub) = ("t-lag", "s-lag");
    new_task(&s, task, false).await;
    step(&s, task, "task.run_started", json!({"run_id": "r1"})).await;
    subscribe(&s, task, sub, "b-lag").await;
    for (c, last) in [("c-behind", seqs[6]), ("c-caught", seqs[9])] {
        advance_orders(&s, c, last, &format!("{c}-1")).await;
    }

    // The lag view never waits for the models (section 7), and a command is answered before
    // they fold its events: a waiting read first, so the view shows the cursors just moved.
    let lag = || {
        let api = s.api();
        async move {
            crate::common::settled(&api).await;
            let r = api.get("/v1/consumers/lag").await;
            assert_eq!(r.status, StatusCode::OK, "lag: {}", r.text);
            r.json
        }
    };
    let find = |v: &Value, consumer_id: &str, stream: &str, subject: &str| -> Value {
        v["consumers"]
            .as_array()
            .unwrap_or_else(|| panic!("lag without `consumers`: {v}"))
            .iter()
            .find(|c| {
                c["consumer_id"] == consumer_id
                    && c["stream_name"] == stream
                    && c["subject_id"] == subject
            })
            .cloned()
            .unwrap_or_else(|| panic!("no lag row for {consumer_id}/{stream}/{subject}: {v}"))
    };
    let v = lag().await;
    let behind = find(&v, "c-behind", "orders", "");
    assert_eq!(behind["last_sequence"], seqs[6], "{behind}");
    assert_eq!(behind["lag_events"], 3, "{behind}");
    assert_eq!(behind["lag_capped"], false, "{behind}");
    assert_eq!(behind["last_error"], Value::Null, "{behind}");
    let caught = find(&v, "c-caught", "orders", "");
    assert_eq!(caught["lag_events"], 0, "{caught}");
    assert_eq!(caught["stalled"], false, "{caught}");
    assert_eq!(caught["lag_seconds"].as_f64(), Some(0.0), "{caught}");
    // The subscription's cursor never moved: every task event of the task is past it.
    let subrow = find(&v, &consumer(sub), "task_events", task);
    assert_eq!(subrow["last_sequence"], 0, "{subrow}");
    assert_eq!(subrow["lag_events"], 2, "created + run_started: {subrow}");

    // No progress for longer than stuck_after: flagged (bounded poll, not a timing check).
    let v = wait_for(
        WAIT,
        "the lagging cursors to be flagged stalled",
        || async {
            let v = lag().await;
            (find(&v, "c-behind", "orders", "")["stalled"] == true).then_some(v)
        },
    )
    .await;
    assert_eq!(find(&v, "c-caught", "orders", "")["stalled"], false, "{v}");
    let subrow = find(&v, &consumer(sub), "task_events", task);
    assert_eq!(subrow["stalled"], false, "its task is running: {subrow}");
    let flagged = v["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .filter(|c| c["stalled"] == true)
        .count();
    assert_eq!(
        v["stalled"],
        u64::try_from(flagged).expect("small"),
        "`stalled` counts the flagged rows: {v}"
    );
    let behind = find(&v, "c-behind", "orders", "");
    assert!(
        behind["lag_seconds"].as_f64().is_some_and(|x| x >= 1.0),
        "a stalled cursor lags at least stuck_after: {behind}"
    );

    // Progress clears it.
    advance_orders(&s, "c-behind", seqs[9], "c-behind-2").await;
    let v = lag().await;
    let behind = find(&v, "c-behind", "orders", "");
    assert_eq!(behind["lag_events"], 0, "{behind}");
    assert_eq!(behind["stalled"], false, "{behind}");
}

/// (9) The CLI: `tidemark cursors show` (one cursor, all of a consumer's, `--lag`) and
/// `tidemark cursors reset --reason`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_cursors_show_reset_and_lag() {
    let s = start().await;
    let seqs = append_orders(&s, 4).await;
    advance_orders(&s, "c-cli", seqs[2], "d-3").await;
    let base = s.base().to_owned();

    let json_lines = |out: &std::process::Output, what: &str| -> Vec<Value> {
        assert!(
            out.status.success(),
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("{what}: not a JSON line ({e}): {l:?}"))
            })
            // A list is one JSON array when stdout is not a terminal (`-o json`).
            .flat_map(|v: Value| match v {
                Value::Array(a) => a,
                v => vec![v],
            })
            .collect()
    };

    let show = ["show", "--consumer", "c-cli", "--stream", "orders"];
    let out = cursors_cli(&base, &show).await;
    let shown = json_lines(&out, "cursors show --stream");
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0]["consumer_id"], "c-cli");
    assert_eq!(shown[0]["stream_name"], "orders");
    assert_eq!(shown[0]["last_sequence"], seqs[2], "{}", shown[0]);
    assert_eq!(shown[0]["last_delivery_id"], "d-3", "{}", shown[0]);

    // A cursor that never moved shows its zero state.
    let out = cursors_cli(
        &base,
        &["show", "--consumer", "c-none", "--stream", "orders"],
    )
    .await;
    let zero = json_lines(&out, "cursors show of a new cursor");
    assert_eq!(zero.len(), 1, "{zero:?}");
    assert_zero(&zero[0]);

    let out = cursors_cli(&base, &show[..3]).await;
    let all = json_lines(&out, "cursors show (all of a consumer)");
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0]["last_sequence"], seqs[2]);

    // Reset without a reason: refused, nothing changes.
    let head = s.head().await;
    let to = seqs[0].to_string();
    let reset = [
        "reset",
        "--consumer",
        "c-cli",
        "--stream",
        "orders",
        "--to",
        &to,
    ];
    let out = cursors_cli(&base, &[&reset[..], &["--reason", ""]].concat()).await;
    assert!(
        !out.status.success(),
        "a reset with an empty reason succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(s.head().await, head, "a refused CLI reset appended");
    let cli_cursor = || cursor_of(&s, "c-cli", "orders", "");
    assert_eq!(cli_cursor().await["last_sequence"], seqs[2]);

    let reason = ["--reason", "replay from the CLI"];
    let out = cursors_cli(&base, &[&reset[..], &reason].concat()).await;
    let reset = json_lines(&out, "cursors reset");
    assert_eq!(reset.len(), 1, "{reset:?}");
    assert_eq!(reset[0]["last_sequence"], seqs[0], "{}", reset[0]);
    assert_eq!(cli_cursor().await["last_sequence"], seqs[0]);
    let ev = s.read_all_after(head, "stream=cursors", 10).await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["type"], "cursor.reset");
    assert_eq!(ev[0]["payload"]["reason"], "replay from the CLI");
    assert_eq!(ev[0]["payload"]["from"], seqs[2]);
    assert_eq!(ev[0]["payload"]["to"], seqs[0]);

    let out = cursors_cli(&base, &["show", "--lag"]).await;
    let lag = json_lines(&out, "cursors show --lag");
    let row = lag
        .iter()
        .find(|c| c["consumer_id"] == "c-cli" && c["stream_name"] == "orders")
        .unwrap_or_else(|| panic!("no c-cli row in the lag output: {lag:?}"));
    assert_eq!(row["last_sequence"], seqs[0], "{row}");
    assert_eq!(row["lag_events"], 3, "{row}");
    assert!(row["stalled"].is_boolean(), "{row}");

    // show without --consumer or --lag is a usage error.
    let out = cursors_cli(&base, &["show"]).await;
    assert!(!out.status.success(), "cursors show without a consumer");
}

/// Found by the API fuzzer: a consumer id longer than an event subject (128) — a bridge
/// subscription id near its 128-character limit makes one, and `POST /cursors/advance` takes up
/// to 160 — made the cursor event invalid, which the command reported as a storage failure: the
/// log stopped (503 log_unavailable) until a restart. The event's subject is now a hash of the
/// consumer with the id in the payload; the fold reads it back; the cursor works as any other,
/// across a rebuild too, and the log stays up.
#[tokio::test]
async fn long_consumer_ids_advance_and_never_stop_the_log() {
    let s = start().await;
    let (task, bridge) = ("t-long", "b-long");
    let sub = "s".repeat(128);
    let (_, done) = Pull::completed(&s, task, &sub, bridge, false).await;
    let got = pull(&s, bridge, 10_000).await;
    assert_eq!(got.len(), 1, "{got:?}");
    ack_ok(&s, bridge, &sub, done).await;
    assert_eq!(sub_cursor(&s, task, &sub).await["last_sequence"], done);

    let consumer = "c".repeat(160);
    let r = post_json(
        &s,
        "/v1/cursors/advance",
        &json!({"consumer_id": consumer, "stream_name": "task_events", "subject_id": task,
                "last_sequence": done, "delivery_id": "d-1"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        cursor_of(&s, &consumer, "task_events", task).await["last_sequence"],
        done
    );
    let r = s.get("/healthz").await;
    assert_eq!(r.status, StatusCode::OK, "the log stays up: {}", r.text);
    // The events carry the whole consumer id; a rebuild folds them to the same cursors.
    let r = crate::common::post_empty(&s, "/v1/admin/projections/cursors/rebuild").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["identical"], true, "{}", r.text);
    assert_eq!(
        cursor_of(&s, &consumer, "task_events", task).await["last_sequence"],
        done
    );
}
