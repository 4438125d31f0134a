//! Bridge terminal notifications through their sinks, end to end (spec sections 1 I5 and 6):
//! a real HTTP webhook receiver (axum on 127.0.0.1:0) that records every POST, checks the
//! envelope and its HMAC signature, makes the server retry by answering 500, holds answers
//! across `kill -9` to prove at-least-once delivery, and a pull bridge whose long-poll wakes
//! on a commit.
//!
//! The receiver's answer per POST comes from a policy: a status, or "hold until the gate
//! opens, then answer". A held answer is what a slow bridge looks like to the server: it has
//! sent the envelope, the bridge has it, and nothing is confirmed, so the cursor must not move;
//! a `kill -9` at that moment must lead to the same `delivery_id` being sent again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode as AxStatus, Uri};
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Sha256;
use tidemark_tests::{Api, Server, ServerOpts, encode_path, random_token};
use tokio::sync::watch;

use crate::common::{append_ok, post_json, python_json, task_ev, wait_for};

/// Small retry delays, so that a failing webhook is retried within the test's time.
const RETRY_CONFIG: &str =
    "[notifications.retry]\nbase_delay = \"100ms\"\nmax_delay = \"400ms\"\njitter = 0.2\n";
/// Bound of every wait (never an assertion on speed).
const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// The webhook receiver

/// What the receiver answers to one POST.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// Answer at once with this status.
    Status(u16),
    /// Hold the answer until the gate is open, then answer with this status.
    Gated(u16),
    /// Answer with this status and `Retry-After: <seconds>`.
    RetryAfter(u16, u64),
    /// Answer with this status and `Retry-After: <HTTP date this many seconds on>`.
    RetryAt(u16, u64),
}

/// One POST the receiver got.
#[derive(Clone, Debug)]
struct Hit {
    method: String,
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
    /// The body parsed as JSON (`Null` when it is not JSON).
    json: Value,
    /// Position on the test's shared clock when the POST arrived.
    tick: u64,
    /// When it arrived.
    at: std::time::Instant,
}

impl Hit {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn delivery_id(&self) -> &str {
        self.json["delivery_id"].as_str().unwrap_or_default()
    }
}

type Policy = Box<dyn Fn(usize) -> Answer + Send + Sync>;

struct HookState {
    hits: Mutex<Vec<Hit>>,
    policy: Mutex<Policy>,
    gate: watch::Sender<bool>,
    clock: Arc<AtomicU64>,
}

/// A webhook receiver on 127.0.0.1:0; stops (and opens its gate) when dropped.
struct Receiver {
    state: Arc<HookState>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

async fn hook_handler(
    State(st): State<Arc<HookState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let answer = {
        let mut hits = st.hits.lock().expect("hits lock");
        let index = hits.len();
        hits.push(Hit {
            method: method.to_string(),
            path: uri.path().to_owned(),
            json: serde_json::from_slice(&body).unwrap_or(Value::Null),
            headers,
            body: body.to_vec(),
            tick: st.clock.fetch_add(1, Ordering::SeqCst),
            at: std::time::Instant::now(),
        });
        (st.policy.lock().expect("policy lock"))(index)
    };
    let status = match answer {
        Answer::Status(s) => s,
        Answer::RetryAfter(s, secs) => {
            return (
                AxStatus::from_u16(s).expect("valid status"),
                [("retry-after", secs.to_string())],
            )
                .into_response();
        }
        Answer::RetryAt(s, secs) => {
            let at = std::time::SystemTime::now() + Duration::from_secs(secs);
            return (
                AxStatus::from_u16(s).expect("valid status"),
                [("retry-after", httpdate::fmt_http_date(at))],
            )
                .into_response();
        }
        Answer::Gated(s) => {
            let mut rx = st.gate.subscribe();
            // An error means the receiver is gone: the answer no longer matters.
            let _ = rx.wait_for(|open| *open).await;
            s
        }
    };
    AxStatus::from_u16(status)
        .expect("valid status")
        .into_response()
}

impl Receiver {
    async fn start(
        clock: Arc<AtomicU64>,
        policy: impl Fn(usize) -> Answer + Send + Sync + 'static,
    ) -> Receiver {
        let (gate, _) = watch::channel(false);
        let state = Arc::new(HookState {
            hits: Mutex::new(Vec::new()),
            policy: Mutex::new(Box::new(policy)),
            gate,
            clock,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the webhook receiver");
        let addr = listener.local_addr().expect("receiver address");
        let app = Router::new()
            .fallback(hook_handler)
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { state, addr, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().expect("hits lock").clone()
    }

    fn count(&self) -> usize {
        self.state.hits.lock().expect("hits lock").len()
    }

    fn set_gate(&self, open: bool) {
        self.state.gate.send_replace(open);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.set_gate(true);
        self.task.abort();
    }
}

pub(crate) fn hmac_hex(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// Seconds since the Unix epoch now.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// What a careful receiver checks (spec section 6, Standard Webhooks): `webhook-id`,
/// `webhook-timestamp` within 5 minutes of `now`, and `tidemark-signature` = `v1=` + hex
/// HMAC-SHA256 under `secret` of `"<id>.<timestamp>.<body>"`. A captured request replayed later
/// is refused as stale, and one with its timestamp rewritten fails the signature.
fn verify(headers: &HeaderMap, body: &[u8], secret: &str, now: u64) -> Result<(), String> {
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let id = h("webhook-id").ok_or("no webhook-id")?;
    let ts: u64 = h("webhook-timestamp")
        .and_then(|t| t.parse().ok())
        .ok_or("no numeric webhook-timestamp")?;
    if ts.abs_diff(now) > 300 {
        return Err(format!("stale timestamp {ts} (now {now})"));
    }
    let mut signed = format!("{id}.{ts}.").into_bytes();
    signed.extend_from_slice(body);
    let want = format!("v1={}", hmac_hex(secret, &signed));
    match h("tidemark-signature") {
        Some(sig) if sig == want => Ok(()),
        other => Err(format!("signature {other:?}, want {want}")),
    }
}

/// The POST is a signed JSON envelope: content type, `webhook-id` = its `delivery_id`, and a
/// signature a careful receiver accepts now ([`verify`]).
#[track_caller]
fn assert_signed(hit: &Hit, secret: &str) {
    assert_eq!(hit.method, "POST", "webhook request method: {hit:?}");
    let ct = hit.header("content-type").unwrap_or_default();
    assert!(
        ct.starts_with("application/json"),
        "webhook content-type is {ct:?}, not application/json"
    );
    assert_eq!(
        hit.header("webhook-id"),
        Some(hit.delivery_id()),
        "webhook-id is the delivery id"
    );
    if let Err(e) = verify(&hit.headers, &hit.body, secret, unix_now()) {
        panic!(
            "a careful receiver refuses the POST of {}: {e}",
            String::from_utf8_lossy(&hit.body)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Server helpers

fn consumer(sub: &str) -> String {
    format!("bridge_task_subscription:{sub}")
}

fn delivery_id(sub: &str, seq: u64) -> String {
    format!("notif:{sub}:{seq}")
}

/// The cursor of subscription `sub` of `task` (`GET /v1/cursors`); panics unless 200.
async fn sub_cursor(api: &Api, sub: &str, task: &str) -> Value {
    let path = format!(
        "/v1/cursors?consumer_id={}&stream_name=task_events&subject_id={}",
        encode_path(&consumer(sub)),
        encode_path(task)
    );
    let r = api.get(&path).await;
    assert_eq!(r.status, StatusCode::OK, "GET {path}: {}", r.text);
    let cursors = r.json["cursors"]
        .as_array()
        .unwrap_or_else(|| panic!("GET {path}: no `cursors` array: {}", r.text));
    assert_eq!(
        cursors.len(),
        1,
        "GET {path}: one cursor expected: {}",
        r.text
    );
    cursors[0].clone()
}

/// Wait (bounded) until the cursor of `sub` is at `seq`; returns it.
async fn wait_cursor_at(api: &Api, sub: &str, task: &str, seq: u64) -> Value {
    wait_for(
        WAIT,
        &format!("the cursor of {sub} to reach {seq}"),
        || async {
            let c = sub_cursor(api, sub, task).await;
            let at = c["last_sequence"].as_u64().unwrap_or(0);
            assert!(
                at <= seq,
                "the cursor of {sub} went past {seq}, its last terminal event: {c}"
            );
            (at == seq).then_some(c)
        },
    )
    .await
}

/// `POST /v1/tasks/{task}/notifications/bridges`; panics unless 201.
async fn subscribe(api: &Api, task: &str, body: &Value) -> Value {
    let path = format!("/v1/tasks/{}/notifications/bridges", encode_path(task));
    let r = api
        .send(api.request(reqwest::Method::POST, &path).json(body))
        .await;
    assert_eq!(
        r.status,
        StatusCode::CREATED,
        "POST {path} {body}: {}",
        r.text
    );
    r.json
}

fn webhook_body(sub: &str, bridge: &str, url: &str, secret: &str) -> Value {
    json!({"subscription_id": sub, "bridge_id": bridge, "thread_id": format!("th-{sub}"),
           "sink": {"kind": "webhook", "url": url, "secret": secret}})
}

fn pull_body(sub: &str, bridge: &str) -> Value {
    json!({"subscription_id": sub, "bridge_id": bridge, "thread_id": format!("th-{sub}"),
           "sink": {"kind": "pull"}})
}

/// Append one event; its seq.
async fn append_one(api: &Api, ev: &Value) -> u64 {
    let r = append_ok(api, ev).await;
    assert_eq!(r.len(), 1, "one receipt for one event");
    assert!(!r[0].2, "a fresh event answered as a duplicate");
    r[0].1
}

/// A task with run `r1` started (review required or not).
async fn task_with_run(api: &Api, task: &str, review_required: bool) {
    append_ok(
        api,
        &json!({"events": [
            task_ev(task, "task.created", json!({"project_id": "bridges", "review_required": review_required})),
            task_ev(task, "task.run_started", json!({"run_id": "r1"})),
        ]}),
    )
    .await;
}

/// The envelope the spec prescribes for a webhook/pull delivery.
fn envelope(
    sub: &str,
    task: &str,
    bridge: &str,
    mode: &str,
    seq: u64,
    ty: &str,
    run: &str,
) -> Value {
    json!({
        "delivery_id": delivery_id(sub, seq),
        "subscription_id": sub,
        "task_id": task,
        "bridge_id": bridge,
        "thread_id": format!("th-{sub}"),
        "mode": mode,
        "event_type": "final",
        "final": true,
        "seq": seq,
        "metadata": {"terminal_event_type": ty, "run_id": run},
    })
}

/// `GET /v1/bridges/{bridge}/deliveries?wait_ms=…`; the envelopes, panics unless 200.
async fn pull(api: &Api, bridge: &str, wait_ms: u64) -> Vec<Value> {
    let path = format!(
        "/v1/bridges/{}/deliveries?wait_ms={wait_ms}",
        encode_path(bridge)
    );
    let r = api.get(&path).await;
    assert_eq!(r.status, StatusCode::OK, "GET {path}: {}", r.text);
    r.json["deliveries"]
        .as_array()
        .unwrap_or_else(|| panic!("GET {path}: no `deliveries` array: {}", r.text))
        .clone()
}

/// `POST /v1/bridges/{bridge}/deliveries/{id}/ack`; the cursor of the answer, panics unless 200.
async fn ack(api: &Api, bridge: &str, id: &str) -> Value {
    let path = format!(
        "/v1/bridges/{}/deliveries/{}/ack",
        encode_path(bridge),
        encode_path(id)
    );
    let r = api.send(api.request(reqwest::Method::POST, &path)).await;
    assert_eq!(r.status, StatusCode::OK, "POST {path}: {}", r.text);
    assert_eq!(r.json["delivery_id"], id, "POST {path}: {}", r.text);
    r.json["cursor"].clone()
}

// ---------------------------------------------------------------------------------------------
// 1. Webhook happy path

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_gets_the_signed_envelope_and_the_secret_never_shows() {
    let clock = Arc::new(AtomicU64::new(0));
    let hook = Receiver::start(clock, |_| Answer::Status(200)).await;
    let mut s = Server::start(ServerOpts::default()).await;
    let secret = format!("wh-secret-{}", random_token(24));
    let (task, sub, bridge) = ("wh-task-1", "wh-sub-1", "b-wh");
    task_with_run(&s, task, false).await;

    let mut body = webhook_body(sub, bridge, &hook.url("/hooks/wh-sub-1"), &secret);
    body["mode"] = json!("post");
    body["workspace_id"] = json!("ws-1");
    let created = subscribe(&s, task, &body).await;
    assert_eq!(created["subscription_id"], sub, "{created}");
    assert_eq!(created["sink"]["kind"], "webhook", "{created}");
    assert_eq!(created["sink"]["secret_set"], true, "{created}");
    assert!(
        !created.to_string().contains(&secret),
        "the subscription answer shows the secret: {created}"
    );
    // Nothing terminal yet: nothing is sent.
    assert_eq!(sub_cursor(&s, sub, task).await["last_sequence"], 0);

    let seq = append_one(
        &s,
        &task_ev(task, "task.run_completed", json!({"run_id": "r1"})),
    )
    .await;
    let cursor = wait_cursor_at(&s, sub, task, seq).await;
    assert_eq!(
        cursor["last_delivery_id"],
        delivery_id(sub, seq).as_str(),
        "{cursor}"
    );
    assert_eq!(cursor["last_error"], Value::Null, "{cursor}");

    let hits = hook.hits();
    assert_eq!(
        hits.len(),
        1,
        "one terminal event, one confirmed POST: {:?}",
        hits.iter()
            .map(|h| String::from_utf8_lossy(&h.body).into_owned())
            .collect::<Vec<_>>()
    );
    let hit = &hits[0];
    assert_eq!(
        hit.path, "/hooks/wh-sub-1",
        "the POST goes to the subscription's url"
    );
    assert_signed(hit, &secret);
    assert_eq!(
        hit.json,
        envelope(sub, task, bridge, "post", seq, "task.run_completed", "r1"),
        "the webhook body"
    );
    // Replayed: ten minutes later the same request is stale; with its timestamp rewritten to
    // look fresh, the signature no longer matches; another body under the same headers neither.
    let later = unix_now() + 600;
    assert!(
        verify(&hit.headers, &hit.body, &secret, later).is_err_and(|e| e.contains("stale")),
        "a replay ten minutes later is refused"
    );
    let mut rewritten = hit.headers.clone();
    rewritten.insert(
        "webhook-timestamp",
        later.to_string().parse().expect("header"),
    );
    assert!(
        verify(&rewritten, &hit.body, &secret, later).is_err_and(|e| e.contains("signature")),
        "a rewritten timestamp breaks the signature"
    );
    assert!(
        verify(&hit.headers, b"{}", &secret, unix_now()).is_err(),
        "another body breaks the signature"
    );

    // The secret is kept (the server signs with it after a restart) but never served or logged.
    let got = s
        .get(&format!("/v1/tasks/{task}/notifications/bridges/{sub}"))
        .await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.text);
    assert!(
        !got.text.contains(&secret),
        "GET subscription shows the secret: {}",
        got.text
    );
    let subscribed: Vec<Value> = s
        .read_all("stream=bridges")
        .await
        .into_iter()
        .filter(|e| e["type"] == "bridge.subscribed" && e["subject"] == sub)
        .collect();
    assert_eq!(subscribed.len(), 1, "one bridge.subscribed: {subscribed:?}");
    assert_eq!(
        subscribed[0]["payload"]["target"]["sink"]["secret"], "[redacted]",
        "bridge.subscribed as served: {}",
        subscribed[0]
    );

    // After a restart the server still signs with the secret it recorded.
    s.kill9();
    s.restart().await;
    append_one(
        &s,
        &task_ev(task, "task.run_started", json!({"run_id": "r2"})),
    )
    .await;
    let seq2 = append_one(
        &s,
        &task_ev(task, "task.run_completed", json!({"run_id": "r2"})),
    )
    .await;
    wait_cursor_at(&s, sub, task, seq2).await;
    let hits = hook.hits();
    assert_eq!(
        hits.len(),
        2,
        "the second run's notification, once: {hits:?}"
    );
    assert_signed(&hits[1], &secret);
    assert_eq!(
        hits[1].json,
        envelope(sub, task, bridge, "post", seq2, "task.run_completed", "r2")
    );

    for e in s.read_all("").await {
        assert!(
            !e.to_string().contains(&secret),
            "GET /v1/events shows the webhook secret: {e}"
        );
    }
    assert!(
        !s.all_stderr().contains(&secret),
        "the server logged the webhook secret"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Webhook failures: retried with backoff, recorded, and never in the way of others

/// A server with short retry delays, a task whose run `r1` completes, and a webhook
/// subscription to it at `hook`: the server and the seq of the completion.
async fn completed_with_webhook(
    hook: &Receiver,
    secret: &str,
    (task, sub, bridge): (&str, &str, &str),
) -> (Server, u64) {
    let s = Server::start(ServerOpts::default().config(RETRY_CONFIG)).await;
    task_with_run(&s, task, false).await;
    subscribe(
        &s,
        task,
        &webhook_body(sub, bridge, &hook.url("/hook"), secret),
    )
    .await;
    let seq = append_one(
        &s,
        &task_ev(task, "task.run_completed", json!({"run_id": "r1"})),
    )
    .await;
    (s, seq)
}

/// A receiver that answers `429` or `503` with `Retry-After` is left alone that long (the
/// backoff here is 100–400 ms, so the waits below are the receiver's), whether it says
/// seconds or an HTTP date (read only as seconds once, a date fell back to the backoff), and
/// every retry is signed anew under the same `webhook-id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_receivers_retry_after_is_honoured() {
    let clock = Arc::new(AtomicU64::new(0));
    let hook = Receiver::start(clock, |i| match i {
        0 => Answer::RetryAfter(429, 2),
        1 => Answer::RetryAfter(503, 1),
        // A date to the second, 3 s on: at least 2 s from now.
        2 => Answer::RetryAt(503, 3),
        _ => Answer::Status(200),
    })
    .await;
    let secret = &tidemark_tests::secret("ra-secret-1b7c");
    let (task, sub, bridge) = ("ra-task", "ra-sub", "b-ra");
    let (s, seq) = completed_with_webhook(&hook, secret, (task, sub, bridge)).await;
    wait_cursor_at(&s, sub, task, seq).await;
    let hits = hook.hits();
    assert_eq!(hits.len(), 4, "429, 503, 503, then 200: {hits:?}");
    let gap = |a: usize, b: usize| hits[b].at.duration_since(hits[a].at);
    assert!(
        gap(0, 1) >= Duration::from_millis(1_900),
        "Retry-After: 2 waited only {:?}",
        gap(0, 1)
    );
    assert!(
        gap(1, 2) >= Duration::from_millis(900),
        "Retry-After: 1 waited only {:?}",
        gap(1, 2)
    );
    assert!(
        gap(2, 3) >= Duration::from_millis(1_900),
        "Retry-After: <a date 3 s on> waited only {:?}",
        gap(2, 3)
    );
    for h in &hits {
        assert_signed(h, secret);
        assert_eq!(h.header("webhook-id"), Some(delivery_id(sub, seq).as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_webhook_is_retried_until_it_answers_2xx() {
    let clock = Arc::new(AtomicU64::new(0));
    // 500 for the first three POSTs; the fourth waits for the test, then 200.
    let hook = Receiver::start(clock, |i| {
        if i < 3 {
            Answer::Status(500)
        } else {
            Answer::Gated(200)
        }
    })
    .await;
    let secret = &tidemark_tests::secret("retry-secret-8d2e");
    let (task, sub, bridge) = ("retry-task", "retry-sub", "b-retry");
    let (s, seq) = completed_with_webhook(&hook, secret, (task, sub, bridge)).await;

    // Three refusals, then the fourth attempt is held: the failure is recorded meanwhile and
    // the cursor has not moved.
    let cursor = wait_for(WAIT, "three 500s and a fourth attempt", || async {
        if hook.count() < 4 {
            return None;
        }
        let c = sub_cursor(&s, sub, task).await;
        c["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("500"))
            .then_some(c)
    })
    .await;
    assert_eq!(
        cursor["last_sequence"], 0,
        "the cursor moved although the webhook never answered 2xx: {cursor}"
    );
    let hits = hook.hits();
    assert_eq!(hits.len(), 4, "no attempt while one is in flight: {hits:?}");
    for h in &hits {
        assert_signed(h, secret);
        assert_eq!(
            h.json,
            envelope(sub, task, bridge, "reply", seq, "task.run_completed", "r1"),
            "each retry sends the same envelope"
        );
    }
    let failed: Vec<Value> = s
        .read_all(&format!(
            "stream=cursors&subject={}",
            encode_path(&consumer(sub))
        ))
        .await
        .into_iter()
        .filter(|e| e["type"] == "cursor.failed")
        .collect();
    assert_eq!(
        failed.len(),
        3,
        "one cursor.failed per refused attempt: {failed:?}"
    );

    hook.set_gate(true);
    let cursor = wait_cursor_at(&s, sub, task, seq).await;
    assert_eq!(
        cursor["last_delivery_id"],
        delivery_id(sub, seq).as_str(),
        "{cursor}"
    );
    let cursor = wait_for(WAIT, "last_error cleared", || async {
        let c = sub_cursor(&s, sub, task).await;
        c["last_error"].is_null().then_some(c)
    })
    .await;
    assert_eq!(cursor["last_sequence"], seq, "{cursor}");
    assert_eq!(hook.count(), 4, "nothing is sent after the confirmation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_webhook_does_not_block_other_subscriptions() {
    let clock = Arc::new(AtomicU64::new(0));
    let broken = Receiver::start(clock.clone(), |_| Answer::Status(500)).await;
    let healthy = Receiver::start(clock, |_| Answer::Status(200)).await;
    // A port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let s = Server::start(ServerOpts::default().config(RETRY_CONFIG)).await;
    for t in ["iso-a", "iso-u", "iso-p", "iso-h"] {
        task_with_run(&s, t, false).await;
    }
    subscribe(
        &s,
        "iso-a",
        &webhook_body("sub-a", "b-iso", &broken.url("/a"), "k"),
    )
    .await;
    subscribe(
        &s,
        "iso-u",
        &webhook_body("sub-u", "b-iso", &format!("http://{closed}/u"), "k"),
    )
    .await;
    subscribe(&s, "iso-p", &pull_body("sub-p", "b-iso")).await;
    subscribe(
        &s,
        "iso-h",
        &webhook_body("sub-h", "b-iso", &healthy.url("/h"), "k"),
    )
    .await;

    let done = |t: &str| task_ev(t, "task.run_completed", json!({"run_id": "r1"}));
    let seq_a = append_one(&s, &done("iso-a")).await;
    let seq_u = append_one(&s, &done("iso-u")).await;
    // Both fail, and keep failing.
    wait_for(WAIT, "the failures of sub-a and sub-u recorded", || async {
        let a = sub_cursor(&s, "sub-a", "iso-a").await;
        let u = sub_cursor(&s, "sub-u", "iso-u").await;
        (a["last_error"].as_str().is_some_and(|e| e.contains("500")) && u["last_error"].is_string())
            .then_some(())
    })
    .await;

    let seq_p = append_one(&s, &done("iso-p")).await;
    let seq_h = append_one(&s, &done("iso-h")).await;
    let c = wait_cursor_at(&s, "sub-h", "iso-h", seq_h).await;
    assert_eq!(c["last_error"], Value::Null, "{c}");
    let hits = healthy.hits();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(
        hits[0].json,
        envelope(
            "sub-h",
            "iso-h",
            "b-iso",
            "reply",
            seq_h,
            "task.run_completed",
            "r1"
        )
    );

    // The pull subscription of the same bridge: its one envelope, acked.
    let pulled = pull(&s, "b-iso", 10_000).await;
    assert_eq!(
        pulled,
        vec![envelope(
            "sub-p",
            "iso-p",
            "b-iso",
            "reply",
            seq_p,
            "task.run_completed",
            "r1"
        )],
        "the pull bridge sees only its pull subscription's envelope"
    );
    let c = ack(&s, "b-iso", &delivery_id("sub-p", seq_p)).await;
    assert_eq!(c["last_sequence"], seq_p, "{c}");
    assert!(
        pull(&s, "b-iso", 0).await.is_empty(),
        "nothing left to pull"
    );

    // Meanwhile the broken webhook keeps being retried, and its cursor stays put.
    let before = broken.count();
    wait_for(WAIT, "another attempt on the broken webhook", || async {
        (broken.count() > before).then_some(())
    })
    .await;
    for h in broken.hits() {
        assert_eq!(h.delivery_id(), delivery_id("sub-a", seq_a));
    }
    for (sub, task) in [("sub-a", "iso-a"), ("sub-u", "iso-u")] {
        let c = sub_cursor(&s, sub, task).await;
        assert_eq!(c["last_sequence"], 0, "{sub}: {c}");
        assert!(c["last_error"].is_string(), "{sub}: {c}");
    }
    let u = sub_cursor(&s, "sub-u", "iso-u").await;
    assert!(
        !u["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains(&closed.to_string()),
        "last_error names the webhook URL: {u}"
    );
    // The unreachable webhook's delivery is still the next one to make.
    let ex = s
        .get("/v1/tasks/iso-u/notifications/bridges/sub-u/explain")
        .await;
    assert_eq!(ex.status, StatusCode::OK, "explain: {}", ex.text);
    assert_eq!(ex.json["next"], "deliver", "explain: {}", ex.text);
    assert_eq!(ex.json["next_seq"], seq_u, "explain: {}", ex.text);

    // Each failure reaches the server's log with its code and its cause (issue 53: the
    // bridge's failure line had none): the receiver's answer, or why it was not reached
    // (without the URL).
    let log = s.stderr();
    let line = |sub: &str| {
        log.lines()
            .find(|l| {
                l.contains("bridge webhook delivery failed")
                    && l.contains(&format!("subscription={sub}"))
            })
            .unwrap_or_else(|| panic!("no failure line for {sub}"))
            .to_owned()
    };
    let a = line("sub-a");
    for part in [
        "WARN",
        "code=http_500",
        "cause=webhook answered 500 Internal Server Error",
    ] {
        assert!(a.contains(part), "{part:?} missing: {a}");
    }
    let u = line("sub-u");
    for part in [
        "WARN",
        "code=http_connection",
        "cause=webhook unreachable: ",
    ] {
        assert!(u.contains(part), "{part:?} missing: {u}");
    }
    assert!(
        !u.contains(&closed.to_string()),
        "the line names the URL: {u}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. At-least-once across kill -9 (I5)

const CRASH_TASKS: usize = 20;
const CRASH_BRIDGE: &str = "b-crash";
const CRASH_SECRET: &str = "crash-secret";

fn crash_task(i: usize) -> String {
    format!("crash-t{i:02}")
}

fn crash_sub(i: usize) -> String {
    format!("crash-s{i:02}")
}

/// How the run of task `i` is gated: review required at creation (0, 1), review requested for
/// the run (2, 3), or not gated.
fn crash_gate(i: usize) -> (bool, bool) {
    (i < 2, (2..4).contains(&i))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_while_the_bridge_holds_deliveries_redelivers_the_same_delivery_ids() {
    let clock = Arc::new(AtomicU64::new(0));
    let hook = Receiver::start(clock.clone(), |_| Answer::Gated(200)).await;
    let mut s = Server::start(ServerOpts::default().config(RETRY_CONFIG)).await;

    for i in 0..CRASH_TASKS {
        let (required, requested) = crash_gate(i);
        task_with_run(&s, &crash_task(i), required).await;
        if requested {
            append_one(
                &s,
                &task_ev(
                    &crash_task(i),
                    "task.run_review_requested",
                    json!({"run_id": "r1"}),
                ),
            )
            .await;
        }
        subscribe(
            &s,
            &crash_task(i),
            &webhook_body(
                &crash_sub(i),
                CRASH_BRIDGE,
                &hook.url("/crash"),
                CRASH_SECRET,
            ),
        )
        .await;
    }

    // delivery_id → (task index, terminal type, seq): what must be delivered.
    let mut expected: BTreeMap<String, (usize, &'static str, u64)> = BTreeMap::new();
    // The gated runs' completions (never to be delivered) and approvals (tick before sending).
    let mut gated_completions: HashMap<usize, u64> = HashMap::new();
    let mut approval_sent_at: HashMap<usize, u64> = HashMap::new();
    // subscription → its final terminal seq.
    let mut final_seq: BTreeMap<usize, u64> = BTreeMap::new();

    for cycle in 0..2 {
        hook.set_gate(false);
        let mut this_cycle: Vec<String> = Vec::new();
        let range = if cycle == 0 { 0..10 } else { 10..CRASH_TASKS };
        for i in range {
            let seq = append_one(
                &s,
                &task_ev(
                    &crash_task(i),
                    "task.run_completed",
                    json!({"run_id": "r1"}),
                ),
            )
            .await;
            let (required, requested) = crash_gate(i);
            if required || requested {
                gated_completions.insert(i, seq);
            } else {
                let id = delivery_id(&crash_sub(i), seq);
                expected.insert(id.clone(), (i, "task.run_completed", seq));
                this_cycle.push(id);
                final_seq.insert(i, seq);
            }
        }
        if cycle == 1 {
            // The approvals of the gated runs (completed in the first cycle).
            for i in 0..4 {
                approval_sent_at.insert(i, clock.fetch_add(1, Ordering::SeqCst));
                let seq = append_one(
                    &s,
                    &task_ev(
                        &crash_task(i),
                        "task.run_review_approved",
                        json!({"run_id": "r1", "reviewer": "rev"}),
                    ),
                )
                .await;
                let id = delivery_id(&crash_sub(i), seq);
                expected.insert(id.clone(), (i, "task.run_review_approved", seq));
                this_cycle.push(id);
                final_seq.insert(i, seq);
            }
        }

        // The bridge has every envelope of this cycle and has confirmed none.
        wait_for(
            WAIT,
            &format!("cycle {cycle}: every envelope at the bridge"),
            || async {
                let got: HashSet<String> = hook
                    .hits()
                    .iter()
                    .map(|h| h.delivery_id().to_owned())
                    .collect();
                this_cycle.iter().all(|id| got.contains(id)).then_some(())
            },
        )
        .await;
        for id in &this_cycle {
            let (i, _, _) = expected[id];
            let c = sub_cursor(&s, &crash_sub(i), &crash_task(i)).await;
            // Each subscription has one terminal notification to deliver: still at 0.
            assert_eq!(
                c["last_sequence"], 0,
                "cycle {cycle}: {id} was not confirmed, yet the cursor moved: {c}"
            );
        }
        let held: HashMap<String, usize> = counts(&hook.hits());

        s.kill9();
        hook.set_gate(true);
        s.restart().await;
        for id in &this_cycle {
            let (i, _, seq) = expected[id];
            let c = wait_cursor_at(&s, &crash_sub(i), &crash_task(i), seq).await;
            assert_eq!(c["last_delivery_id"], id.as_str(), "{c}");
        }
        let now = counts(&hook.hits());
        for id in &this_cycle {
            assert!(
                now[id] > held[id],
                "cycle {cycle}: {id} was held by the bridge at the kill, unconfirmed, and was \
                 not sent again after the restart (received {} times before, {} after)",
                held[id],
                now[id]
            );
        }
    }

    // Everything the bridge ever got.
    let hits = hook.hits();
    let got = counts(&hits);
    for h in &hits {
        assert_signed(h, CRASH_SECRET);
        let id = h.delivery_id();
        let Some(&(i, ty, seq)) = expected.get(id) else {
            panic!(
                "the bridge got a delivery that is no accepted-final terminal event: {}",
                h.json
            );
        };
        let run = "r1";
        assert_eq!(
            h.json,
            envelope(
                &crash_sub(i),
                &crash_task(i),
                CRASH_BRIDGE,
                "reply",
                seq,
                ty,
                run
            ),
            "envelope of {id}"
        );
        if let Some(sent) = approval_sent_at.get(&i) {
            assert!(
                h.tick > *sent,
                "{id} of gated task {} reached the bridge before its approval was appended",
                crash_task(i)
            );
        }
    }
    for (i, seq) in &gated_completions {
        let id = delivery_id(&crash_sub(*i), *seq);
        assert!(
            !got.contains_key(&id),
            "the completion of gated run {} was delivered ({id})",
            crash_task(*i)
        );
    }
    for id in expected.keys() {
        assert!(
            got.get(id).is_some_and(|n| *n >= 1),
            "{id} was never delivered"
        );
    }
    // No terminal notification skipped: each cursor ends at its final terminal event.
    for (i, seq) in &final_seq {
        let c = sub_cursor(&s, &crash_sub(*i), &crash_task(*i)).await;
        assert_eq!(c["last_sequence"], *seq, "{}: {c}", crash_sub(*i));
        assert_eq!(
            c["last_delivery_id"],
            delivery_id(&crash_sub(*i), *seq).as_str(),
            "{c}"
        );
    }
    assert_eq!(
        final_seq.len(),
        CRASH_TASKS,
        "every subscription has a final event"
    );
    let mismatches: Vec<Value> = s
        .read_all("stream=task_events")
        .await
        .into_iter()
        .filter(|e| e["type"] == "notification.terminal_state_mismatch")
        .collect();
    assert!(
        mismatches.is_empty(),
        "no mismatch expected: {mismatches:?}"
    );
}

fn counts(hits: &[Hit]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for h in hits {
        *m.entry(h.delivery_id().to_owned()).or_default() += 1;
    }
    m
}

// ---------------------------------------------------------------------------------------------
// 4. Pull long-poll across many subscriptions of one bridge

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_over_fifty_subscriptions_wakes_on_a_commit() {
    const N: usize = 50;
    let s = Server::start(ServerOpts::default()).await;
    let task = |i: usize| format!("lp-t{i:02}");
    let sub = |i: usize| format!("lp-s{i:02}");
    let mut events = Vec::new();
    for i in 0..N {
        events.push(task_ev(
            &task(i),
            "task.created",
            json!({"project_id": "lp"}),
        ));
        events.push(task_ev(
            &task(i),
            "task.run_started",
            json!({"run_id": "r1"}),
        ));
    }
    append_ok(&s, &json!({ "events": events })).await;
    for i in 0..N {
        subscribe(&s, &task(i), &pull_body(&sub(i), "bx")).await;
    }
    assert!(pull(&s, "bx", 0).await.is_empty(), "nothing terminal yet");

    // A long-poll waits; one terminal event wakes it with that delivery.
    let api = s.api();
    let poll = tokio::spawn(async move { pull(&api, "bx", 20_000).await });
    // Give the request time to park (not an assertion: a poll that is not parked yet answers
    // with the delivery just the same).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seq = append_one(
        &s,
        &task_ev(&task(17), "task.run_completed", json!({"run_id": "r1"})),
    )
    .await;
    // Without a wake-up the poll would answer at its deadline with what it saw before the
    // append (nothing), so the answer's content is what tells them apart, not its timing.
    let got = poll.await.expect("poll task");
    assert_eq!(
        got,
        vec![envelope(
            &sub(17),
            &task(17),
            "bx",
            "reply",
            seq,
            "task.run_completed",
            "r1"
        )]
    );
    let c = ack(&s, "bx", &delivery_id(&sub(17), seq)).await;
    assert_eq!(c["last_sequence"], seq, "{c}");
    assert!(pull(&s, "bx", 0).await.is_empty(), "acked: nothing pending");

    // The others, in one batch: one envelope per subscription, each acked, nothing left.
    let rest: Vec<usize> = (0..N).filter(|i| *i != 17).collect();
    let batch: Vec<Value> = rest
        .iter()
        .map(|i| task_ev(&task(*i), "task.run_completed", json!({"run_id": "r1"})))
        .collect();
    let receipts = append_ok(&s, &json!({ "events": batch })).await;
    let want: HashMap<String, u64> = rest
        .iter()
        .zip(&receipts)
        .map(|(i, r)| (delivery_id(&sub(*i), r.1), r.1))
        .collect();
    let mut acked: HashSet<String> = HashSet::new();
    for _ in 0..100 {
        if acked.len() == want.len() {
            break;
        }
        for env in pull(&s, "bx", 5_000).await {
            let id = env["delivery_id"].as_str().expect("delivery_id").to_owned();
            let seq = want
                .get(&id)
                .unwrap_or_else(|| panic!("an envelope that is not pending: {env}"));
            assert_eq!(env["seq"], *seq, "{env}");
            assert!(acked.insert(id.clone()), "{id} pulled again after its ack");
            let c = ack(&s, "bx", &id).await;
            assert_eq!(c["last_sequence"], *seq, "{c}");
        }
    }
    assert_eq!(acked.len(), want.len(), "every delivery pulled and acked");
    assert!(pull(&s, "bx", 0).await.is_empty(), "nothing left");
    for i in 0..N {
        let c = sub_cursor(&s, &sub(i), &task(i)).await;
        assert!(c["last_sequence"].as_u64().is_some_and(|x| x > 0), "{c}");
        assert_eq!(c["last_error"], Value::Null, "{c}");
    }
}

/// Bridges of several tenants (spec section 20) on one node with two shards: the default
/// tenant, acme (shard 1) and beta (shard 0, beside the default) each subscribe with the same
/// subscription and bridge ids; each tenant's webhook gets its own POST and each tenant's pull
/// long-poll wakes on its own commit with its own delivery, and never another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenants_bridges_deliver_their_own_under_the_same_ids() {
    let hook = Receiver::start(Arc::new(AtomicU64::new(0)), |_| Answer::Status(200)).await;
    let s = Server::start(ServerOpts::default().config("[log]\nshards = 2\n")).await;
    let api = s.api();
    for name in ["acme", "beta"] {
        let r = api
            .send(
                api.request(reqwest::Method::POST, "/v1/tenants")
                    .json(&json!({"name": name, "reason": "onboarding"})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    let tenants = [
        ("default", api.clone()),
        ("acme", api.under("/tenants/acme", None)),
        ("beta", api.under("/tenants/beta", None)),
    ];
    for (name, t) in &tenants {
        task_with_run(t, "task-1", false).await;
        task_with_run(t, "task-2", false).await;
        let url = hook.url(&format!("/hooks/{name}"));
        subscribe(t, "task-1", &webhook_body("sub-w", "b-1", &url, "s3cret")).await;
        subscribe(t, "task-2", &pull_body("sub-p", "b-1")).await;
    }
    // Each tenant's webhook: its own POST, confirmed in its own cursor.
    let mut want = Vec::new();
    for (name, t) in &tenants {
        let done = task_ev("task-1", "task.run_completed", json!({"run_id": "r1"}));
        let seq = append_one(t, &done).await;
        wait_cursor_at(t, "sub-w", "task-1", seq).await;
        want.push((format!("/hooks/{name}"), delivery_id("sub-w", seq)));
    }
    let mut got: Vec<(String, String)> = hook
        .hits()
        .iter()
        .map(|h| (h.path.clone(), h.delivery_id().to_owned()))
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "one POST per tenant, to its own receiver");
    // Each tenant's long-poll wakes on its own commit (without a wake-up it would answer at
    // its deadline with what it saw before: nothing).
    let mut pending = Vec::new();
    for (name, t) in &tenants {
        let poller = t.clone();
        let poll = tokio::spawn(async move { pull(&poller, "b-1", 20_000).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let done = task_ev("task-2", "task.run_completed", json!({"run_id": "r1"}));
        let seq = append_one(t, &done).await;
        let env = envelope(
            "sub-p",
            "task-2",
            "b-1",
            "reply",
            seq,
            "task.run_completed",
            "r1",
        );
        assert_eq!(poll.await.expect("poll"), vec![env.clone()], "{name}");
        pending.push((name, t, env, seq));
    }
    // Nothing acked yet: each tenant's bridge shows its own delivery alone, then none.
    for (name, t, env, seq) in &pending {
        assert_eq!(pull(t, "b-1", 0).await, vec![env.clone()], "{name}");
        let c = ack(t, "b-1", &delivery_id("sub-p", *seq)).await;
        assert_eq!(c["last_sequence"], *seq, "{name}: {c}");
        assert!(pull(t, "b-1", 0).await.is_empty(), "{name}: acked");
    }
    assert_eq!(hook.count(), 3, "no POST more");
}

/// Webhook URLs may be https (the client speaks TLS): against a plain-HTTP listener the TLS
/// handshake fails, which is recorded as the cursor's last_error (without the URL) while the
/// cursor stays put; other schemes are refused at creation.
#[tokio::test]
async fn an_https_webhook_is_attempted_with_tls_and_its_failure_recorded() {
    let s = Server::start(ServerOpts::default().config(RETRY_CONFIG)).await;
    // A plain TCP listener that is not TLS: it accepts and sends garbage.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut sock, _)) = listener.accept().await {
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let task = "t-https";
    task_with_run(&s, task, false).await;
    let url = format!("https://127.0.0.1:{port}/hook");
    subscribe(&s, task, &webhook_body("s-https", "b-https", &url, "k")).await;
    append_one(
        &s,
        &task_ev(task, "task.run_completed", json!({"run_id": "r1"})),
    )
    .await;
    let c = wait_for(WAIT, "the https failure in last_error", || async {
        let c = sub_cursor(&s, "s-https", task).await;
        c["last_error"].as_str().is_some().then_some(c)
    })
    .await;
    assert_eq!(c["last_sequence"], 0, "{c}");
    let err = c["last_error"].as_str().unwrap();
    assert!(
        !err.contains("127.0.0.1"),
        "the URL stays out of errors: {err}"
    );
    let r = s
        .send(
            s.request(
                reqwest::Method::POST,
                &format!("/v1/tasks/{task}/notifications/bridges"),
            )
            .json(&webhook_body("s-ftp", "b-https", "ftp://127.0.0.1/x", "k")),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
}

/// Section 6's Standard Webhooks signature, checked by a stock verifier: the `standardwebhooks`
/// package from PyPI (installed by `.ci/run`), called on the exact headers and body the
/// receiver got, for a `whsec_<base64>` secret (the form those libraries take) and for a plain
/// secret (its UTF-8 bytes as the key). A rewritten body, id or timestamp is refused by the same
/// verifier, and the legacy `tidemark-signature` still verifies beside it.
#[tokio::test]
async fn a_stock_standard_webhooks_verifier_accepts_the_signature() {
    use base64::Engine as _;
    let clock = Arc::new(AtomicU64::new(0));
    let hook = Receiver::start(clock, |_| Answer::Status(200)).await;
    let s = Server::start(ServerOpts::default()).await;
    let whsec = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(random_token(32))
    );
    let plain = format!("plain-{}", random_token(24));
    let mut checks = Vec::new();
    for (i, secret) in [&whsec, &plain].into_iter().enumerate() {
        let (task, sub) = (format!("sw-task-{i}"), format!("sw-sub-{i}"));
        task_with_run(&s, &task, false).await;
        subscribe(
            &s,
            &task,
            &webhook_body(&sub, "b-sw", &hook.url(&format!("/sw/{i}")), secret),
        )
        .await;
        let seq = append_one(
            &s,
            &task_ev(&task, "task.run_completed", json!({"run_id": "r1"})),
        )
        .await;
        wait_cursor_at(&s, &sub, &task, seq).await;
        let hit = hook
            .hits()
            .into_iter()
            .find(|h| h.path == format!("/sw/{i}"))
            .expect("the POST of this subscription");
        let h = |n: &str| {
            hit.headers
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_else(|| panic!("no {n} header"))
                .to_owned()
        };
        assert!(h("webhook-signature").starts_with("v1,"), "{hit:?}");
        assert_eq!(h("user-agent"), crate::e2e_dispatch::USER_AGENT, "{hit:?}");
        // The legacy header is the same HMAC in hex.
        let legacy = h("tidemark-signature");
        let std_bytes = base64::engine::general_purpose::STANDARD
            .decode(&h("webhook-signature")[3..])
            .expect("base64 signature");
        assert_eq!(legacy, format!("v1={}", hex::encode(&std_bytes)));
        checks.push(json!({
            "secret": secret,
            "raw_key": !secret.starts_with("whsec_"),
            "body": String::from_utf8(hit.body.clone()).expect("utf-8 body"),
            "headers": {
                "webhook-id": h("webhook-id"),
                "webhook-timestamp": h("webhook-timestamp"),
                "webhook-signature": h("webhook-signature"),
            },
        }));
    }
    // The stock verifier: every genuine request passes; each tampered one is refused.
    let script = r#"
import json, sys
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
out = []
for c in json.load(sys.stdin):
    wh = Webhook(c["secret"].encode() if c["raw_key"] else c["secret"])
    wh.verify(c["body"], c["headers"])
    tampered = [
        (c["body"].replace("final", "finaL"), c["headers"]),
        (c["body"], {**c["headers"], "webhook-id": c["headers"]["webhook-id"] + "x"}),
        (c["body"], {**c["headers"], "webhook-timestamp": str(int(c["headers"]["webhook-timestamp"]) - 1)}),
    ]
    refused = 0
    for body, headers in tampered:
        try:
            wh.verify(body, headers)
        except WebhookVerificationError:
            refused += 1
    out.append({"verified": True, "tampered_refused": refused})
print(json.dumps(out))
"#;
    let what = "the Standard Webhooks verifier refused a request (is `standardwebhooks` \
                installed? .ci/run installs tests/webhooks/requirements.txt)";
    let got = python_json(script, &Value::Array(checks), what).await;
    assert_eq!(
        got,
        json!([{"verified": true, "tampered_refused": 3}, {"verified": true, "tampered_refused": 3}])
    );
}

// ---------------------------------------------------------------------------------------------
// A webhook subscription's endpoint (spec section 17): health, a circuit, disable and enable.

/// The endpoint `bridge:<sub>` of `GET /v1/outbox/endpoints` (`Null` when it is not listed).
async fn bridge_endpoint(api: &Api, sub: &str) -> Value {
    let r = api.get("/v1/outbox/endpoints").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json["endpoints"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["route"] == format!("bridge:{sub}")))
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_webhook_subscription_opens_its_circuit_and_an_operator_switches_it() {
    let status = Arc::new(std::sync::atomic::AtomicU16::new(503));
    let answer = status.clone();
    let hook = Receiver::start(Arc::new(AtomicU64::new(0)), move |_| {
        Answer::Status(answer.load(Ordering::SeqCst))
    })
    .await;
    let s = Server::start(ServerOpts::default().config(format!(
        "{RETRY_CONFIG}[notifications.circuit]\nfailures = 2\ncool_down = \"1s\"\n[notifications.outbox]\nstuck_after = \"1s\"\n"
    )))
    .await;
    let (task, sub) = ("cb-task", "cb-sub");
    task_with_run(&s, task, false).await;
    subscribe(
        &s,
        task,
        &webhook_body(sub, "b-cb", &hook.url("/cb"), "cb-secret"),
    )
    .await;
    // A pull subscription has no endpoint; the webhook one is listed before its first POST.
    let e = bridge_endpoint(&s, sub).await;
    assert_eq!(
        (e["kind"].as_str(), e["state"].as_str()),
        (Some("bridge"), Some("ok")),
        "{e}"
    );
    assert_eq!(e["circuit_failures"], 2, "{e}");
    let seq = append_one(
        &s,
        &task_ev(task, "task.run_completed", json!({"run_id": "r1"})),
    )
    .await;

    // Two failed POSTs open the circuit; the probe's failure opens it again. Between two
    // openings the log holds one failed POST, the probe's.
    let opened = wait_for(WAIT, "the circuit opened twice", || async {
        let evs = s
            .read_all(&format!(
                "stream=endpoints&type=endpoint.circuit_opened&subject=bridge:{sub}"
            ))
            .await;
        (evs.len() >= 3).then_some(evs)
    })
    .await;
    assert_eq!(opened[0]["payload"]["error_code"], "http_503", "{opened:?}");
    let failed = s.read_all("stream=cursors&type=cursor.failed").await;
    let (from, to) = (opened[1]["seq"].as_u64(), opened[2]["seq"].as_u64());
    let between = failed
        .iter()
        .filter(|e| e["seq"].as_u64() > from && e["seq"].as_u64() < to)
        .count();
    assert_eq!(between, 1, "one probe per cool-down: {failed:?}");
    let e = bridge_endpoint(&s, sub).await;
    assert_eq!(e["state"], "open", "{e}");
    assert_eq!(e["last_failure_code"], "http_503", "{e}");
    assert!(
        e["consecutive_failures"].as_u64().is_some_and(|n| n >= 3),
        "{e}"
    );

    // The receiver recovers: the next probe succeeds, the circuit closes, the cursor moves.
    status.store(200, Ordering::SeqCst);
    wait_cursor_at(&s, sub, task, seq).await;
    let closed = s
        .read_all(&format!(
            "stream=endpoints&type=endpoint.circuit_closed&subject=bridge:{sub}"
        ))
        .await;
    assert_eq!(closed.len(), 1, "{closed:?}");
    let e = wait_for(WAIT, "the endpoint ok", || async {
        let e = bridge_endpoint(&s, sub).await;
        (e["state"] == "ok").then_some(e)
    })
    .await;
    assert_eq!(
        (e["successes"].as_u64(), e["consecutive_failures"].as_u64()),
        (Some(1), Some(0)),
        "{e}"
    );

    // Disabled, a second subscription's terminal notification waits; enabled, it goes.
    let (task2, sub2) = ("cb-task-2", "cb-sub-2");
    task_with_run(&s, task2, false).await;
    subscribe(
        &s,
        task2,
        &webhook_body(sub2, "b-cb", &hook.url("/cb2"), "cb-secret"),
    )
    .await;
    let path = |a: &str| format!("/v1/outbox/endpoints/bridge:{sub2}/{a}");
    let r = post_json(
        &s,
        &path("disable"),
        &json!({"reason": "the receiver moves"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["endpoint"]["state"], "disabled", "{}", r.text);
    let r = post_json(
        &s,
        "/v1/outbox/endpoints/bridge:nobody/disable",
        &json!({"reason": "x"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let posts = hook.count();
    let seq2 = append_one(
        &s,
        &task_ev(task2, "task.run_completed", json!({"run_id": "r1"})),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(hook.count(), posts, "a disabled endpoint's POST waits");
    assert_eq!(sub_cursor(&s, sub2, task2).await["last_sequence"], 0);
    // Past stuck_after, the lag view says why it waits instead of flagging it stalled.
    let lag = s.get("/v1/consumers/lag").await;
    let held = lag.json["consumers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["consumer_id"] == consumer(sub2)))
        .cloned()
        .unwrap_or_default();
    assert_eq!(held["held_by"], "endpoint_disabled", "{held}");
    assert_eq!(held["stalled"], false, "{held}");
    let r = post_json(&s, &path("enable"), &json!({"reason": "moved"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    wait_cursor_at(&s, sub2, task2, seq2).await;
    assert_eq!(hook.count(), posts + 1);
    let switched = s.read_all("stream=endpoints&type=endpoint.disabled").await;
    assert_eq!(switched.len(), 1, "{switched:?}");
    assert_eq!(switched[0]["subject"], format!("bridge:{sub2}"));
    for model in ["bridges", "deliveries"] {
        crate::e2e_endpoints::verified(&s, model).await;
    }
}
