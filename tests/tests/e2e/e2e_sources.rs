//! Sources (spec section 12) against the built binary and a real upstream written for the
//! tests: an HTTP server on loopback (port 0) that serves items after a watermark in pages
//! (`hasMore` / `nextAfterId`), answers scripted faults (429 with `Retry-After`, 500, 401, 400,
//! malformed JSON, a body over the limit, a hang past the timeout), and records every request
//! and ack.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post as post_route};
use reqwest::Method;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts};

use crate::common::{cli_at, cli_ok, serve_local, wait_for};

/// What the upstream answers instead of a page (consumed one per list request).
#[derive(Debug, Clone)]
enum Fault {
    /// Answer as usual (to script a fault on a later request).
    Pass,
    Status(u16, Option<u64>),
    /// This status with `Retry-After: <HTTP date this many seconds on>`.
    RetryAt(u16, u64),
    /// This status with `{"retryAfter": <seconds>}` in its body and no header (seed 004).
    RetryAfterBody(u16, u64),
    Malformed,
    Oversize,
    Hang,
    /// The headers and the start of a page, then the connection ends (a network failure).
    Cut,
    /// An item whose id is not a string.
    BadItem,
}

#[derive(Default)]
struct Upstream {
    /// Item ids in order (fixed width, so they compare as strings).
    items: Vec<(String, Value)>,
    faults: VecDeque<Fault>,
    /// Every list request: (when, afterId, limit, authorization header).
    requests: Vec<(Instant, Option<String>, u32, Option<String>)>,
    /// Every ack: (idempotency key, ids).
    acks: Vec<(String, Vec<String>)>,
    /// Every ack's body.
    ack_bodies: Vec<Value>,
    /// Every list request's `X-Request-ID`, `Idempotency-Key` and `User-Agent` headers.
    request_ids: Vec<(Option<String>, Option<String>, Option<String>)>,
    /// Delay before answering an ack.
    ack_delay: Duration,
    /// With OAuth (seed 004): the bearer tokens the list answers (any other gets 401);
    /// `None`: no check.
    valid_tokens: Option<std::collections::HashSet<String>>,
    /// Tokens the token endpoint gave, in order, and how many it gave.
    issued: u32,
    /// Every token request's grant, scope and basic client id.
    token_requests: Vec<(String, Option<String>, String)>,
    /// Seconds each token lives (`expires_in`).
    token_life_s: u64,
    /// List requests answered 401 for want of a valid token.
    refused_401: u32,
}

#[derive(Clone)]
pub(crate) struct Up(Arc<Mutex<Upstream>>);

impl Up {
    fn with<T>(&self, f: impl FnOnce(&mut Upstream) -> T) -> T {
        f(&mut self.0.lock().unwrap())
    }
    pub(crate) fn add_items(&self, from: usize, to: usize) {
        self.with(|u| {
            for i in from..to {
                let id = format!("{i:06}");
                let item = json!({"id": id, "plan": {"name": format!("plan {i}")}});
                u.items.push((id, item));
            }
        });
    }
    fn requests(&self) -> usize {
        self.with(|u| u.requests.len())
    }
    /// Wait (bounded) until the upstream has had more than `n` list requests.
    async fn wait_requests_past(&self, n: usize, what: &str) {
        wait_for(Duration::from_secs(30), what, || async {
            (self.requests() > n).then_some(())
        })
        .await;
    }
}

#[derive(serde::Deserialize)]
struct ListQuery {
    #[serde(rename = "afterId")]
    after_id: Option<String>,
    limit: u32,
}

async fn list(State(up): State<Up>, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let header = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let ids = (
        header("x-request-id"),
        header("idempotency-key"),
        header("user-agent"),
    );
    let refused = up.with(|u| {
        u.valid_tokens.as_ref().is_some_and(|valid| {
            !auth
                .as_deref()
                .and_then(|a| a.strip_prefix("Bearer "))
                .is_some_and(|t| valid.contains(t))
        })
    });
    let (fault, page) = up.with(|u| {
        u.requests
            .push((Instant::now(), q.after_id.clone(), q.limit, auth));
        u.request_ids.push(ids);
        let fault = u.faults.pop_front();
        let page: Vec<(String, Value)> = match &q.after_id {
            // The bootstrap `latest` asks for one item without a watermark: the newest.
            None if q.limit == 1 => u.items.last().cloned().into_iter().collect(),
            None => u.items.iter().take(q.limit as usize).cloned().collect(),
            Some(a) => u
                .items
                .iter()
                .filter(|(id, _)| id.as_str() > a.as_str())
                .take(q.limit as usize)
                .cloned()
                .collect(),
        };
        let more = match page.last() {
            Some((last, _)) => u.items.iter().any(|(id, _)| id > last),
            None => false,
        };
        (fault, (page, more))
    });
    if refused {
        up.with(|u| u.refused_401 += 1);
        return (StatusCode::UNAUTHORIZED, "{\"error\": \"unauthorized\"}").into_response();
    }
    match fault {
        Some(Fault::Status(code, retry_after)) => {
            let mut r = (
                StatusCode::from_u16(code).unwrap(),
                json!({"error": "scripted"}).to_string(),
            )
                .into_response();
            if let Some(s) = retry_after {
                r.headers_mut()
                    .insert("retry-after", s.to_string().parse().unwrap());
            }
            return r;
        }
        Some(Fault::RetryAt(code, secs)) => {
            let at = std::time::SystemTime::now() + Duration::from_secs(secs);
            return (
                StatusCode::from_u16(code).unwrap(),
                [("retry-after", httpdate::fmt_http_date(at))],
                json!({"error": "scripted"}).to_string(),
            )
                .into_response();
        }
        Some(Fault::RetryAfterBody(code, secs)) => {
            return (
                StatusCode::from_u16(code).unwrap(),
                axum::Json(
                    json!({"error": "Rate limit exceeded", "code": "RATE_LIMIT_EXCEEDED",
                                  "retryAfter": secs, "requestId": "req_jkl012"}),
                ),
            )
                .into_response();
        }
        Some(Fault::Malformed) => return (StatusCode::OK, "{\"data\": [").into_response(),
        Some(Fault::Oversize) => {
            return (StatusCode::OK, vec![b' '; 11 << 20]).into_response();
        }
        Some(Fault::Hang) => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Some(Fault::Cut) => {
            let body = axum::body::Body::from_stream(futures::stream::iter([
                Ok(axum::body::Bytes::from_static(b"{\"data\": [")),
                Err(std::io::Error::other("cut (scripted)")),
            ]));
            return (StatusCode::OK, body).into_response();
        }
        Some(Fault::Pass) => {}
        Some(Fault::BadItem) => {
            return axum::Json(
                json!({"data": [{"id": 7}], "pagination": {"nextAfterId": "x", "hasMore": false}}),
            )
            .into_response();
        }
        None => {}
    }
    let (page, more) = page;
    let next = page.last().map(|(id, _)| id.clone());
    axum::Json(json!({
        "data": page.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
        "pagination": {"nextAfterId": next, "hasMore": more},
    }))
    .into_response()
}

async fn ack(State(up): State<Up>, headers: HeaderMap, body: axum::Json<Value>) -> StatusCode {
    let key = headers
        .get("x-idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let ids: Vec<String> = body["ids"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let delay = up.with(|u| {
        u.acks.push((key, ids));
        u.ack_bodies.push(body.0.clone());
        u.ack_delay
    });
    tokio::time::sleep(delay).await;
    StatusCode::OK
}

/// The upstream's OAuth 2 token endpoint (client credentials): it checks the client's basic
/// credentials and gives a new token each time, valid for `token_life_s`.
async fn token(
    State(up): State<Up>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<std::collections::HashMap<String, String>>,
) -> Response {
    use base64::Engine as _;
    let basic = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    let (id, secret) = basic.split_once(':').unwrap_or(("", ""));
    let ok = id == "poller" && secret == OAUTH_SECRET;
    up.with(|u| {
        u.token_requests.push((
            form.get("grant_type").cloned().unwrap_or_default(),
            form.get("scope").cloned(),
            id.to_owned(),
        ));
        if !ok {
            return (
                StatusCode::UNAUTHORIZED,
                axum::Json(json!({"error": "invalid_client"})),
            )
                .into_response();
        }
        u.issued += 1;
        let t = tidemark_tests::secret(format!(
            "tok-{}-{}",
            u.issued,
            tidemark_tests::random_token(16)
        ));
        u.valid_tokens
            .get_or_insert_with(Default::default)
            .insert(t.clone());
        axum::Json(json!({"access_token": t, "token_type": "bearer", "expires_in": u.token_life_s}))
            .into_response()
    })
}

/// The client secret the test's token endpoint takes.
const OAUTH_SECRET: &str = "oauth-client-secret-9c2e7f1b";

/// [`start_upstream`] holding the items `000000`.. (`n` of them).
async fn upstream_with(n: usize) -> (Up, SocketAddr) {
    let (up, addr) = start_upstream().await;
    up.add_items(0, n);
    (up, addr)
}

pub(crate) async fn start_upstream() -> (Up, SocketAddr) {
    let up = Up(Arc::new(Mutex::new(Upstream::default())));
    let app = axum::Router::new()
        .route("/items", get(list))
        .route("/ack", post_route(ack))
        .route("/token", post_route(token))
        .with_state(up.clone());
    let addr = serve_local(app).await;
    (up, addr)
}

/// A `[[sources]]` block polling `addr`.
pub(crate) fn source_toml(name: &str, addr: SocketAddr, extra: &str) -> String {
    format!(
        r#"
[[sources]]
name = "{name}"
url = "http://{addr}/items"
headers = {{ authorization = "env:TEST_SOURCE_TOKEN" }}
page_size = 100
timeout = "2s"
{extra}
[sources.watermark]
request_field = "afterId"
next = "/pagination/nextAfterId"
has_more = "/pagination/hasMore"
limit_field = "limit"
[sources.items]
path = "/data"
id = "/id"
[sources.retry]
strategy = "exponential"
base_delay = "200ms"
max_delay = "1s"
jitter = 0.0
retry_after_max = "10s"
"#
    )
}

pub(crate) const SECRET: &str = "Bearer upstream-secret-3f9a";

async fn start(config: String) -> Server {
    Server::start(
        ServerOpts::default()
            .config(config)
            .env("TEST_SOURCE_TOKEN", tidemark_tests::secret(SECRET)),
    )
    .await
}

async fn source(api: &Api, name: &str) -> Value {
    let r = api.get(&format!("/v1/sources/{name}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json
}

/// Waits on a page name its watermark too: the page's items and the watermark are two
/// commands (section 12), so a read between them sees the new items and the old watermark.
async fn wait_source(api: &Api, name: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    wait_for(Duration::from_secs(30), what, || async {
        let s = source(api, name).await;
        f(&s).then_some(s)
    })
    .await
}

/// Every `source.item` event of the log, as (event_id, seq).
pub(crate) async fn item_events(api: &Api) -> Vec<(String, u64)> {
    api.read_all("&type=source.item")
        .await
        .iter()
        .map(|e| {
            (
                e["event_id"].as_str().unwrap().to_owned(),
                e["seq"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn post(api: &Api, path: &str, body: Value) -> tidemark_tests::Reply {
    api.send(api.request(Method::POST, path).json(&body)).await
}

/// `POST /v1/sources/{name}/reset` to `watermark` for `reason`.
async fn reset(api: &Api, name: &str, watermark: Value, reason: &str) -> tidemark_tests::Reply {
    let body = json!({"watermark": watermark, "reason": reason});
    post(api, &format!("/v1/sources/{name}/reset"), body).await
}

/// Wait for source `name` to back off, for backpressure; its state.
async fn wait_backpressure(api: &Api, name: &str, what: &str) -> Value {
    let st = wait_source(api, name, what, |v| v["state"] == "backing_off").await;
    let error = st["last_error"].as_str().unwrap_or("");
    assert!(error.contains("backpressure"), "{st}");
    st
}

/// A backlog of three pages is appended exactly once and in order, page by page, with one
/// notification for the poll about all of its items (`count` 250), one ack of them with its
/// idempotency key and its `acknowledgedAt`, and one watermark move; the watermark ends at the last `nextAfterId`; a second poll with nothing new appends nothing; the header
/// secret reaches the upstream and appears nowhere in tidemark's answers or log output; a
/// rebuild reproduces the source's state.
#[tokio::test]
async fn a_backlog_is_appended_once_in_order_and_acknowledged() {
    let test_start_us = tidemark_log::time::now_micros();
    let (up, addr) = upstream_with(250).await;
    let notify = r#"every = "1h"
[sources.notify]
priority = "info"
recipient = "ana"
group_key = "starred"
title_one = "{/plan/name} has been updated"
title_many = "You have {count} new updates"
"#;
    let ack = format!("[sources.ack]\nurl = \"http://{addr}/ack\"\nfield = \"ids\"\n");
    let s = start(source_toml("plans", addr, &format!("{notify}{ack}"))).await;
    let st = wait_source(&s, "plans", "the backlog", |v| {
        v["watermark"] == "000249" && v["state"] == "idle" && v["next_poll_at"].is_string()
    })
    .await;
    assert_eq!(st["items_total"], 250, "{st}");
    assert_eq!(st["consecutive_failures"], 0);
    assert_eq!(st["stale"], false);
    assert!(
        st["last_success_at"].is_string() && st["next_poll_at"].is_string(),
        "{st}"
    );
    let items = item_events(&s).await;
    let ids: Vec<String> = items.iter().map(|(id, _)| id.clone()).collect();
    let want: Vec<String> = (0..250).map(|i| format!("src:plans:{i:06}")).collect();
    assert_eq!(ids, want, "every item once, in upstream order");
    // One notification for the poll, about all of its items.
    let notes = s.read_all("&type=notification.requested").await;
    let note_ids: Vec<&str> = notes
        .iter()
        .map(|n| n["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(note_ids, ["src:plans:notify:000000"]);
    assert_eq!(notes[0]["payload"]["title"], "You have 250 new updates");
    assert_eq!(notes[0]["payload"]["count"], 250);
    // The first 100 ids are listed (the payload stays small); `count` is all of them.
    assert_eq!(
        notes[0]["payload"]["items"].as_array().map(Vec::len),
        Some(100)
    );
    assert_eq!(notes[0]["payload"]["recipient"], "ana");
    // One ack of the poll's items, keyed by its watermark move, and one move.
    let acks = up.with(|u| u.acks.clone());
    let keys: Vec<&str> = acks.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["ack:plans::000249"]);
    assert_eq!(acks[0].1.len(), 250);
    // Saying when, as seed 004's upstream takes it: UTC to the second, sent during this test.
    let body = up.with(|u| u.ack_bodies[0].clone());
    let at = body["acknowledgedAt"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"));
    assert!(
        at.len() == 20 && at.ends_with('Z') && !at.contains('.'),
        "acknowledgedAt {at:?}"
    );
    let at_us = tidemark_log::time::parse_rfc3339_micros(at).expect("RFC 3339");
    let now_us = tidemark_log::time::now_micros();
    assert!(
        at_us >= test_start_us - 1_000_000 && at_us <= now_us,
        "acknowledgedAt {at} is not in the test's time"
    );
    let moves = s.read_all("&type=source.watermark_advanced").await;
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0]["payload"]["to"], "000249");
    // The secret reached the upstream.
    assert!(
        up.with(|u| u.requests.iter().all(|r| r.3.as_deref() == Some(SECRET))),
        "the configured header is sent"
    );
    // A second poll with nothing new appends nothing.
    let head = s.head().await;
    let before = up.requests();
    let r = post(&s, "/v1/sources/plans/poll", json!({})).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    up.wait_requests_past(before, "the second poll").await;
    wait_source(&s, "plans", "idle again", |v| v["state"] == "idle").await;
    let (_, after_id, _, _) = up.with(|u| u.requests.last().unwrap().clone());
    assert_eq!(
        after_id.as_deref(),
        Some("000249"),
        "polls after the watermark"
    );
    assert_eq!(s.head().await, head, "nothing new, nothing appended");
    // One new item: appended alone, with a notification about it only.
    up.add_items(250, 251);
    post(&s, "/v1/sources/plans/poll", json!({})).await;
    wait_source(&s, "plans", "the new item", |v| v["watermark"] == "000250").await;
    let notes = s.read_all("&type=notification.requested").await;
    assert_eq!(notes.len(), 2);
    assert_eq!(notes[1]["payload"]["title"], "plan 250 has been updated");
    assert_eq!(notes[1]["payload"]["count"], 1);
    // Metrics: polls by outcome, items, poll duration, seconds since the last success.
    let m = s.get("/metrics").await.text;
    for want in [
        "tidemark_source_polls_total{source=\"plans\",outcome=\"ok\"}",
        "tidemark_source_items_total{source=\"plans\"} 251",
        "tidemark_source_poll_duration_seconds_count{source=\"plans\"}",
        "tidemark_source_seconds_since_success{source=\"plans\"}",
        "tidemark_source_stale{source=\"plans\"} 0",
    ] {
        assert!(m.contains(want), "metrics lack {want}");
    }
    // The list, the secret nowhere, and a rebuild reproduces the state.
    let list = s.get("/v1/sources").await;
    assert_eq!(list.json["sources"][0]["name"], "plans", "{}", list.text);
    assert!(list.json["as_of_seq"].as_u64().unwrap() > 0);
    let v = crate::common::rebuild_or_verify(&s, "sources", "rebuild").await;
    assert_eq!(v["identical"], true, "{v}");
    let again = source(&s, "plans").await;
    assert_eq!(again["watermark"], "000250");
    assert_eq!(again["items_total"], 251);
    for text in [
        list.text.clone(),
        s.get("/v1/sources/plans").await.text,
        s.all_stderr(),
    ] {
        assert!(!text.contains("upstream-secret"), "a header secret leaked");
    }
}

/// An upstream's wait is read however it says it. `Retry-After` was once read only as whole
/// seconds: a 429 whose header was an HTTP date, or (seed 004's upstream) whose JSON body said
/// `"retryAfter": 60`, fell back to the 200 ms backoff and the poller came back at once.
#[tokio::test]
async fn retry_after_is_read_as_an_http_date_and_from_the_body() {
    let (up, addr) = upstream_with(4).await;
    up.with(|u| {
        // A date to the second, 3 s on: at least 2 s from when it is read.
        u.faults.push_back(Fault::RetryAt(503, 3));
        u.faults.push_back(Fault::RetryAfterBody(429, 2));
    });
    let s = start(source_toml("waits", addr, "every = \"1h\"")).await;
    let st = wait_source(&s, "waits", "recovery after both waits", |v| {
        v["watermark"] == "000003"
    })
    .await;
    assert_eq!(st["items_total"], 4, "{st}");
    let times = up.with(|u| u.requests.iter().map(|r| r.0).collect::<Vec<_>>());
    assert!(times.len() >= 3, "{} requests", times.len());
    let gap = |a: usize, b: usize| times[b].duration_since(times[a]);
    assert!(
        gap(0, 1) >= Duration::from_millis(1_900),
        "Retry-After: <a date 3 s on> waited only {:?}",
        gap(0, 1)
    );
    assert!(
        gap(1, 2) >= Duration::from_millis(1_900),
        "{{\"retryAfter\": 2}} waited only {:?}",
        gap(1, 2)
    );
}

/// Failures as section 12 says: `Retry-After` is honoured (the next request does not come
/// earlier), a 5xx backs off and recovers, a 401 twice parks, a schema violation parks with
/// the JSON pointer in `last_error`, `resume` continues from the same watermark, and `poll`
/// on a parked source is `409 source_not_active`.
#[tokio::test]
async fn failures_back_off_park_and_resume() {
    let (up, addr) = upstream_with(10).await;
    up.with(|u| u.faults.push_back(Fault::Status(429, Some(2))));
    let s = start(source_toml("flaky", addr, "every = \"1h\"")).await;
    let st = wait_source(&s, "flaky", "recovery after the 429", |v| {
        v["watermark"] == "000009"
    })
    .await;
    assert_eq!(st["items_total"], 10);
    let times = up.with(|u| u.requests.iter().map(|r| r.0).collect::<Vec<_>>());
    assert!(
        times[1].duration_since(times[0]) >= Duration::from_millis(1900),
        "Retry-After 2 s: the next request came after {:?}",
        times[1].duration_since(times[0])
    );
    // 500 twice: backs off (200 ms, 400 ms), then recovers.
    up.add_items(10, 12);
    up.with(|u| {
        u.faults.push_back(Fault::Status(500, None));
        u.faults.push_back(Fault::Status(500, None));
    });
    let n0 = up.requests();
    post(&s, "/v1/sources/flaky/poll", json!({})).await;
    wait_source(&s, "flaky", "recovery after 5xx", |v| {
        v["watermark"] == "000011"
    })
    .await;
    let times = up.with(|u| u.requests[n0..].iter().map(|r| r.0).collect::<Vec<_>>());
    assert!(times.len() >= 3, "two failures and a success");
    assert!(times[1].duration_since(times[0]) >= Duration::from_millis(190));
    assert!(times[2].duration_since(times[1]) >= Duration::from_millis(390));
    // 401 twice: parked.
    up.with(|u| {
        u.faults.push_back(Fault::Status(401, None));
        u.faults.push_back(Fault::Status(401, None));
    });
    post(&s, "/v1/sources/flaky/poll", json!({})).await;
    let st = wait_source(&s, "flaky", "parked after two 401s", |v| {
        v["state"] == "parked"
    })
    .await;
    assert_eq!(st["last_error"], "status 401", "{st}");
    let r = post(&s, "/v1/sources/flaky/poll", json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.code(), Some("source_not_active"));
    // Resume continues from the same watermark.
    up.add_items(12, 13);
    let n1 = up.requests();
    let r = post(&s, "/v1/sources/flaky/resume", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    wait_source(&s, "flaky", "resumed", |v| v["watermark"] == "000012").await;
    assert_eq!(
        up.with(|u| u.requests[n1].1.clone()).as_deref(),
        Some("000011"),
        "the resumed poll starts at the watermark"
    );
    // A schema violation parks with the pointer; so do malformed JSON and an oversize body.
    for (fault, want) in [
        (Fault::BadItem, "/data/0/id"),
        (Fault::Malformed, "not JSON"),
        (Fault::Oversize, "over 10485760 bytes"),
        (Fault::Status(400, None), "status 400"),
    ] {
        up.with(|u| u.faults.push_back(fault.clone()));
        post(&s, "/v1/sources/flaky/poll", json!({})).await;
        let st = wait_source(&s, "flaky", "parked", |v| v["state"] == "parked").await;
        let e = st["last_error"].as_str().unwrap_or("");
        assert!(
            e.contains(want),
            "{fault:?}: last_error {e:?} should name {want}"
        );
        post(&s, "/v1/sources/flaky/resume", json!({})).await;
        wait_source(&s, "flaky", "active again", |v| v["state"] != "parked").await;
    }
    // Parked and resumed are in the log (parked with its error), and a rebuild agrees.
    let parked = s.read_all("&type=source.parked").await;
    assert_eq!(parked.len(), 5);
    let v = crate::common::rebuild_or_verify(&s, "sources", "verify").await;
    assert_eq!(v["identical"], true, "{v}");
    let items = item_events(&s).await;
    assert_eq!(items.len(), 13, "nothing twice");
}

/// Two sources, one of whose upstream hangs past its timeout: the other keeps its schedule.
#[tokio::test]
async fn a_hanging_source_does_not_delay_another() {
    let (slow, slow_addr) = start_upstream().await;
    let (fast, fast_addr) = start_upstream().await;
    slow.with(|u| {
        for _ in 0..100 {
            u.faults.push_back(Fault::Hang);
        }
    });
    fast.add_items(0, 1);
    let cfg = format!(
        "{}{}",
        source_toml("slow", slow_addr, "every = \"1s\"")
            .replace("timeout = \"2s\"", "timeout = \"30s\""),
        source_toml("fast", fast_addr, "every = \"1s\"")
    );
    let s = start(cfg).await;
    fast.wait_requests_past(4, "five polls of the fast source")
        .await;
    assert_eq!(
        slow.requests(),
        1,
        "the slow source's one poll is still hanging"
    );
    assert_eq!(source(&s, "slow").await["state"], "polling");
    assert_eq!(source(&s, "fast").await["items_total"], 1);
    // No success for three intervals (3 s, counted from the start): stale, and said so in the
    // metrics; the fast one is not.
    let slow_state = wait_source(&s, "slow", "stale", |v| v["stale"] == true).await;
    assert!(slow_state["last_success_at"].is_null());
    assert_eq!(source(&s, "fast").await["stale"], false);
    let m = s.get("/metrics").await.text;
    assert!(
        m.contains("tidemark_source_stale{source=\"slow\"} 1"),
        "metrics say stale"
    );
    assert!(m.contains("tidemark_source_stale{source=\"fast\"} 0"));
}

/// Bootstrap `latest` skips the history (the newest item's id becomes the watermark, nothing
/// is appended); `all` takes it. `reset` moves the watermark back only with a reason and the
/// admin scope, recorded as an event with the token's name; the next poll re-reads from there
/// and appends only the items not yet in the log.
#[tokio::test]
async fn bootstrap_and_reset() {
    let (up, addr) = upstream_with(30).await;
    let latest = source_toml("news", addr, "every = \"1h\"").replace(
        "limit_field = \"limit\"",
        "limit_field = \"limit\"\nbootstrap = \"latest\"",
    );
    let all = source_toml("history", addr, "every = \"1h\"");
    let tokens = r#"
[[auth.tokens]]
name = "ops-admin"
sha256 = "SHA_ADMIN"
scopes = ["admin"]
[[auth.tokens]]
name = "ops-operator"
sha256 = "SHA_OP"
scopes = ["operator", "read"]
"#
    .replace("SHA_ADMIN", &sha("admin-token"))
    .replace("SHA_OP", &sha("operator-token"));
    let mut s = start(format!("{tokens}{latest}{all}")).await;
    s.set_token(Some("admin-token"));
    let news = wait_source(&s, "news", "bootstrap latest", |v| {
        v["watermark"] == "000029"
    })
    .await;
    assert_eq!(news["items_total"], 0, "latest appends no history");
    wait_source(&s, "history", "bootstrap all", |v| v["items_total"] == 30).await;
    assert_eq!(
        up.with(|u| u
            .requests
            .iter()
            .filter(|r| r.1.is_none() && r.2 == 1)
            .count()),
        1,
        "latest asked for one item without a watermark"
    );
    // Reset needs admin and a reason.
    s.set_token(Some("operator-token"));
    let r = reset(&s, "news", json!("000019"), "replay").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    s.set_token(Some("admin-token"));
    let r = reset(&s, "news", json!("000019"), " ").await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let r = reset(&s, "news", json!("000019"), "replay the last ten").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let news = wait_source(&s, "news", "the replay", |v| {
        v["items_total"] == 10 && v["watermark"] == "000029"
    })
    .await;
    assert_eq!(news["watermark"], "000029");
    let resets = s.read_all("&type=source.reset").await;
    assert_eq!(resets.len(), 1);
    assert_eq!(resets[0]["payload"]["from"], "000029");
    assert_eq!(resets[0]["payload"]["to"], "000019");
    assert_eq!(resets[0]["payload"]["by"], "ops-admin");
    // Back over items already in the log, one of which changed upstream since: the history
    // source is reset to the start and appends nothing twice, and the changed item is left
    // out (not a conflict that stops the source).
    up.with(|u| u.items[5].1["plan"]["name"] = json!("renamed"));
    // Counted before the reset: the reset wakes the poller, whose request may come at once.
    let n = up.requests();
    let r = reset(&s, "history", json!(null), "audit").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    up.wait_requests_past(n, "the re-read").await;
    let h = wait_source(&s, "history", "re-read done", |v| {
        v["watermark"] == "000029" && v["state"] == "idle"
    })
    .await;
    assert_eq!(h["items_total"], 30);
    assert_eq!(h["consecutive_failures"], 0, "{h}");
    assert_eq!(h["last_error"], Value::Null, "{h}");
    let items = item_events(&s).await;
    assert_eq!(
        items.len(),
        40,
        "30 history items and 10 news items, none twice"
    );
    // Pause is recorded with the token's name and stops polls.
    let r = post(
        &s,
        "/v1/sources/news/pause",
        json!({"reason": "maintenance"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["state"], "paused");
    let paused = s.read_all("&type=source.paused").await;
    assert_eq!(paused[0]["payload"]["by"], "ops-admin");
    // Unknown sources and bad bodies.
    assert_eq!(
        s.get("/v1/sources/nope").await.status,
        StatusCode::NOT_FOUND
    );
    let r = post(
        &s,
        "/v1/sources/news/reset",
        json!({"reason": "x", "extra": 1}),
    )
    .await;
    assert_eq!(r.status.as_u16() / 100, 4, "{}", r.text);
}

fn sha(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// `kill -9` of tidemark at random points of polls (while the upstream answers a page,
/// while it answers an ack, right after) loses nothing and duplicates no event: after each
/// restart the source resumes from its watermark, items already in the log are left out,
/// and every ack the upstream sees again carries the same idempotency key for the same ids.
#[tokio::test]
async fn kill9_during_polls_loses_and_duplicates_nothing() {
    let (up, addr) = start_upstream().await;
    up.with(|u| u.ack_delay = Duration::from_millis(300));
    let ack = format!(
        "every = \"1s\"\n[sources.notify]\npriority = \"info\"\ntitle_one = \"one\"\ntitle_many = \"{{count}} new\"\n[sources.ack]\nurl = \"http://{addr}/ack\"\nfield = \"ids\"\n"
    );
    let mut s =
        start(source_toml("crashy", addr, &ack).replace("page_size = 100", "page_size = 7")).await;
    let mut total = 0;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for cycle in 0..6 {
        total += 20;
        up.add_items(total - 20, total);
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // Kill somewhere in the next poll: during a page, an ack, or between them.
        let acks_before = up.with(|u| u.acks.len());
        wait_for(Duration::from_secs(30), "a poll under way", || async {
            (up.with(|u| u.acks.len()) > acks_before).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(seed % 400)).await;
        s.kill9();
        s.restart().await;
        let _ = cycle;
    }
    // Let the last restart finish the backlog.
    let want = format!("{:06}", total - 1);
    wait_source(&s, "crashy", "the whole backlog", |v| {
        v["watermark"] == want.as_str()
    })
    .await;
    let items = item_events(&s).await;
    let ids: Vec<String> = items.iter().map(|(id, _)| id.clone()).collect();
    let expected: Vec<String> = (0..total).map(|i| format!("src:crashy:{i:06}")).collect();
    assert_eq!(ids, expected, "every item exactly once, in order");
    let mut seqs: Vec<u64> = items.iter().map(|(_, s)| *s).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), total);
    // Notifications: never twice, and together they cover every item exactly once (a poll
    // cut by a crash between its pages notifies, when replayed, about all of its items).
    let notes = s.read_all("&type=notification.requested").await;
    let mut nids: Vec<&str> = notes
        .iter()
        .map(|n| n["event_id"].as_str().unwrap())
        .collect();
    let n = nids.len();
    nids.sort();
    nids.dedup();
    assert_eq!(nids.len(), n, "a replayed poll notifies once");
    // (each lists up to 100 ids; a poll here covers far fewer)
    let mut covered: Vec<String> = notes
        .iter()
        .flat_map(|n| {
            n["payload"]["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|v| format!("src:crashy:{}", v.as_str().unwrap()))
        .collect();
    covered.sort();
    assert_eq!(covered, expected, "every item in exactly one notification");
    for note in &notes {
        assert_eq!(
            note["payload"]["count"].as_u64(),
            note["payload"]["items"].as_array().map(|a| a.len() as u64)
        );
    }
    // Acks repeated only with the same key for the same ids.
    let acks = up.with(|u| u.acks.clone());
    let mut by_key = std::collections::HashMap::new();
    for (k, ids) in &acks {
        if let Some(prev) = by_key.insert(k.clone(), ids.clone()) {
            assert_eq!(&prev, ids, "ack {k} repeated with other ids");
        }
    }
    let v = crate::common::rebuild_or_verify(&s, "sources", "verify").await;
    assert_eq!(v["identical"], true, "{v}");
}

/// A source configured wrong stops the server at start with an error naming the key (and
/// never the header value).
#[tokio::test]
async fn a_bad_source_config_is_refused_at_start_naming_the_key() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    for (cfg, key) in [
        (
            source_toml("bad", addr, "every = \"often\""),
            "sources.bad.every",
        ),
        (
            source_toml("bad", addr, "cron = \"0 9 * * *\"\ntz = \"Europe/Nowhere\""),
            "sources.bad.tz",
        ),
        (
            source_toml("bad", addr, "every = \"1m\"").replace(
                "next = \"/pagination/nextAfterId\"",
                "next = \"nextAfterId\"",
            ),
            "sources.bad.watermark.next",
        ),
        (
            source_toml("Bad!", addr, "every = \"1m\""),
            "[a-z0-9_-]{1,64}",
        ),
    ] {
        let started = tokio::time::timeout(
            Duration::from_secs(40),
            Server::try_start(
                ServerOpts::default()
                    .config(cfg)
                    .env("TEST_SOURCE_TOKEN", tidemark_tests::secret(SECRET)),
            ),
        )
        .await
        .expect("the server neither started nor exited");
        match started {
            Ok(_) => panic!("a server started with a bad source ({key})"),
            Err(tidemark_tests::StartError::Exited { status, stderr }) => {
                assert!(!status.success());
                assert!(stderr.contains(key), "stderr should name {key}:\n{stderr}");
                assert!(!stderr.contains("upstream-secret"), "{stderr}");
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// `tidemark sources list|show|poll|pause|resume|reset` against a running server.
#[tokio::test]
async fn the_cli_lists_and_acts_on_sources() {
    let (up, addr) = upstream_with(3).await;
    let s = start(source_toml("cli", addr, "every = \"1h\"")).await;
    wait_source(&s, "cli", "the first poll", |v| {
        v["items_total"] == 3 && v["watermark"] == "000002"
    })
    .await;
    let limit = Duration::from_secs(60);
    let run = |args: Vec<String>| async move {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = tidemark_tests::run_cli(&a, "", limit).await;
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let url = s.base().to_owned();
    let cmd = |xs: &[&str]| {
        let mut v: Vec<String> = vec!["sources".into()];
        v.extend(xs.iter().map(|x| x.to_string()));
        v.push("--url".into());
        v.push(url.clone());
        v
    };
    // Off a terminal a list is one JSON array (`-o json`); `-o jsonl` prints a line each.
    let list: Value = serde_json::from_str(&run(cmd(&["list"])).await).unwrap();
    let row = list[0].clone();
    let lines = run(cmd(&["list", "-o", "jsonl"])).await;
    let line: Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(line, row);
    assert_eq!(row["name"], "cli");
    assert_eq!(row["items_total"], 3);
    let shown: Value = serde_json::from_str(&run(cmd(&["show", "cli"])).await).unwrap();
    assert_eq!(shown["watermark"], "000002");
    let paused: Value =
        serde_json::from_str(&run(cmd(&["pause", "cli", "--reason", "cli test"])).await).unwrap();
    assert_eq!(paused["state"], "paused");
    let out =
        tidemark_tests::run_cli(&["sources", "poll", "cli", "--url", s.base()], "", limit).await;
    assert!(!out.status.success(), "poll of a paused source fails");
    assert!(String::from_utf8_lossy(&out.stderr).contains("source_not_active"));
    run(cmd(&["resume", "cli"])).await;
    let reset: Value = serde_json::from_str(
        &run(cmd(&[
            "reset",
            "cli",
            "--watermark",
            "000000",
            "--reason",
            "re-read",
        ]))
        .await,
    )
    .unwrap();
    assert_eq!(reset["name"], "cli");
    up.add_items(3, 4);
    run(cmd(&["poll", "cli"])).await;
    wait_source(&s, "cli", "the new item", |v| v["items_total"] == 4).await;
}

/// A source configuration the server refuses at start, naming `key`.
fn refused_naming(toml: &str, key: &str) {
    let err = crate::common::refused_start(toml, &[("TEST_SOURCE_TOKEN", "x")]);
    assert!(err.contains(key), "{err}");
}

/// Source `name` with an urgent notification (one delivery each) under `max_pending`, after
/// its first (empty) poll.
async fn outbox_bound_source(name: &str, max_pending: u64) -> (Up, Server) {
    let (up, addr) = start_upstream().await;
    let notify = "every = \"1h\"\n[sources.notify]\npriority = \"urgent\"\ntitle_one = \"one\"\ntitle_many = \"{count} new\"\n";
    let s = start(format!(
        "[notifications.outbox]\nmax_pending = {max_pending}\n{}",
        source_toml(name, addr, notify)
    ))
    .await;
    wait_source(&s, name, "the first (empty) poll", |v| {
        v["last_success_at"].is_string()
    })
    .await;
    (up, s)
}

/// A client's batch of urgent notifications `<prefix>-n<from>` … `<prefix>-n<to - 1>`.
fn urgent_batch(prefix: &str, from: usize, to: usize) -> Value {
    let events: Vec<Value> = (from..to)
        .map(|i| {
            json!({"event_id": format!("{prefix}-n{i}"), "stream": "notifications",
                   "subject": format!("{prefix}-n{i}"), "type": "notification.requested",
                   "payload": {"priority": "urgent", "title": "t"}})
        })
        .collect();
    json!({ "events": events })
}

/// A full outbox never wedges a source: a page whose notification would go past
/// `max_pending` is refused whole (nothing appended), the source backs off, and once the
/// outbox drains the same page is appended with its notification.
#[tokio::test]
async fn a_full_outbox_backs_the_source_off_until_it_drains() {
    let (up, s) = outbox_bound_source("busy", 2).await;
    // Two pending deliveries: the bound reached (a request over it is refused, section 5).
    let (st, body) = s.append(&urgent_batch("busy", 0, 2)).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    wait_for(
        Duration::from_secs(30),
        "two pending deliveries",
        || async {
            let k = s.get("/v1/outbox/kpis").await.json;
            (k["queue_depth"] == 2).then_some(())
        },
    )
    .await;
    up.add_items(0, 3);
    post(&s, "/v1/sources/busy/poll", json!({})).await;
    let st = wait_backpressure(&s, "busy", "backing off").await;
    assert!(
        item_events(&s).await.is_empty(),
        "a refused page appends nothing"
    );
    // Nothing drained lately: the computed Retry-After is long, capped by retry_after_max
    // (10 s here), not a constant 5 s.
    let wait = crate::e2e_deliveries::us(&st["next_poll_at"])
        - crate::e2e_deliveries::us(&st["last_poll_at"]);
    assert!(wait >= 9_000_000, "waits the capped drain estimate: {st}");
    let m = s.get("/metrics").await.text;
    assert!(
        m.contains("tidemark_source_backpressure{source=\"busy\"} 1"),
        "the backpressure gauge"
    );
    // Drain the outbox: claim and complete both.
    let r = post(
        &s,
        "/v1/deliveries/claim",
        json!({"sink": "app", "owner": "drain", "limit": 10}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for d in r.json["deliveries"].as_array().unwrap() {
        let id = d["id"].as_str().unwrap();
        let c = post(
            &s,
            &format!(
                "/v1/deliveries/{}/complete",
                tidemark_tests::encode_path(id)
            ),
            json!({"owner": "drain"}),
        )
        .await;
        assert_eq!(c.status, StatusCode::OK, "{}", c.text);
    }
    post(&s, "/v1/sources/busy/poll", json!({})).await;
    let st = wait_source(&s, "busy", "the page after the drain", |v| {
        v["items_total"] == 3 && v["watermark"] == "000002"
    })
    .await;
    assert_eq!(st["watermark"], "000002");
    let notes = s.read_all("&type=notification.requested").await;
    assert!(
        notes
            .iter()
            .any(|n| n["event_id"] == "src:busy:notify:000000" && n["payload"]["title"] == "3 new"),
        "the page's notification went in with it"
    );
}

/// A notify recipient who is suppressed (the crisis block) never wedges a source: the page's
/// items are appended without the notification.
#[tokio::test]
async fn a_blocked_notify_recipient_gets_no_notification_and_the_items_go_in() {
    let (up, addr) = start_upstream().await;
    let notify = "every = \"1h\"\n[sources.notify]\npriority = \"info\"\nrecipient = \"ana\"\ntitle_one = \"one\"\ntitle_many = \"{count} new\"\n";
    let s = start(source_toml("quiet", addr, notify)).await;
    wait_source(&s, "quiet", "the first (empty) poll", |v| {
        v["last_success_at"].is_string()
    })
    .await;
    let (st, body) = s
        .append(
            &json!({"stream": "recipients", "subject": "ana", "type": "recipient.suppressed",
                        "payload": {"reason": "crisis"}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    up.add_items(0, 4);
    post(&s, "/v1/sources/quiet/poll", json!({})).await;
    let st = wait_source(&s, "quiet", "the page", |v| {
        v["items_total"] == 4 && v["watermark"] == "000003" && v["state"] == "idle"
    })
    .await;
    assert_eq!(st["state"], "idle", "{st}");
    assert_eq!(st["watermark"], "000003");
    assert!(
        s.read_all("&type=notification.requested").await.is_empty(),
        "no notification to a suppressed recipient"
    );
    // Unsuppressed, the next page notifies again.
    s.append(&json!({"stream": "recipients", "subject": "ana", "type": "recipient.unsuppressed", "payload": {}}))
        .await;
    up.add_items(4, 5);
    post(&s, "/v1/sources/quiet/poll", json!({})).await;
    wait_source(&s, "quiet", "the next page", |v| v["items_total"] == 5).await;
    let notes = s.read_all("&type=notification.requested").await;
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0]["event_id"], "src:quiet:notify:000004");
}

/// Seed 004: one poll that fetches 8 changes in 3 pages makes one notification ("8 new"), one
/// upstream ack and one watermark move; `kill -9` between its pages (the second page hangs)
/// and a restart still make one notification, about all 8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_notification_one_ack_one_move_per_poll_also_after_a_crash_between_pages() {
    let notify = "every = \"1h\"\n[sources.notify]\npriority = \"info\"\ntitle_one = \"one\"\ntitle_many = \"{count} new\"\n";
    for crash in [false, true] {
        let (up, addr) = upstream_with(8).await;
        if crash {
            up.with(|u| u.faults.extend([Fault::Pass, Fault::Hang]));
        }
        let ack = format!("[sources.ack]\nurl = \"http://{addr}/ack\"\nfield = \"ids\"\n");
        let cfg = source_toml("eight", addr, &format!("{notify}{ack}"))
            .replace("page_size = 100", "page_size = 3");
        let mut s = start(cfg).await;
        if crash {
            // The first page is in, the second hangs: kill the server there.
            wait_source(&s, "eight", "the first page", |v| v["items_total"] == 3).await;
            up.wait_requests_past(1, "the second page's request").await;
            assert!(
                s.read_all("&type=notification.requested").await.is_empty(),
                "no notification before the poll's last page"
            );
            s.kill9();
            s.restart().await;
        }
        wait_source(&s, "eight", "the poll", |v| {
            v["watermark"] == "000007" && v["items_total"] == 8
        })
        .await;
        let notes = s.read_all("&type=notification.requested").await;
        assert_eq!(notes.len(), 1, "crash {crash}: {notes:?}");
        assert_eq!(notes[0]["event_id"], "src:eight:notify:000000");
        assert_eq!(notes[0]["payload"]["title"], "8 new");
        assert_eq!(notes[0]["payload"]["count"], 8);
        let acks = up.with(|u| u.acks.clone());
        assert_eq!(acks.len(), 1, "crash {crash}: one ack: {acks:?}");
        assert_eq!(acks[0].0, "ack:eight::000007");
        assert_eq!(acks[0].1.len(), 8);
        let moves = s.read_all("&type=source.watermark_advanced").await;
        assert_eq!(
            moves.len(),
            1,
            "crash {crash}: one watermark move: {moves:?}"
        );
        let m = s.get("/metrics").await.text;
        assert!(
            m.contains("tidemark_source_notifications_generated_total{source=\"eight\"} 1"),
            "the per-source counter"
        );
        let v = crate::common::rebuild_or_verify(&s, "sources", "verify").await;
        assert_eq!(v["identical"], true, "{v}");
    }
}

/// A digest counts changes, not notifications (section 12): two polls of 3 and 5 new items
/// make two notifications (`count` 3 and 5) that join one digest delivery titled with 8.
#[tokio::test]
async fn a_digest_of_poll_notifications_counts_their_changes() {
    let (up, addr) = upstream_with(3).await;
    let notify = "every = \"1h\"\n[sources.notify]\npriority = \"urgent\"\nrecipient = \"ana\"\n\
                  group_key = \"starred\"\ntitle_one = \"one\"\ntitle_many = \"{count} new\"\n";
    let cfg = format!(
        "[notifications.routes.desktop]\ndigest = {{ window = \"1h\", max_items = 5 }}\n{}",
        source_toml("dg", addr, notify)
    );
    let s = start(cfg).await;
    wait_source(&s, "dg", "the first poll", |v| v["items_total"] == 3).await;
    up.add_items(3, 8);
    post(&s, "/v1/sources/dg/poll", json!({})).await;
    wait_source(&s, "dg", "the second poll", |v| v["items_total"] == 8).await;
    let d = wait_for(Duration::from_secs(30), "the digest of both", || async {
        let r = s.get("/v1/deliveries?route=desktop").await;
        let rows = r.json["deliveries"].as_array().cloned().unwrap_or_default();
        (rows.len() == 1 && rows[0]["items"].as_array().map(Vec::len) == Some(2))
            .then(|| rows[0].clone())
    })
    .await;
    // 8 changes, past `summary_after` (= max_items, 5): the summary, with 8 (not 2).
    assert_eq!(d["title"], "You have 8 new updates", "{d}");
}

/// Early backpressure (seed 004, section 12): with `backpressure_threshold` 0.8 and
/// `max_pending` 10, a source waits once 8 deliveries are pending, while clients may still
/// append up to 10; with 7 pending its poll's notification (one more) goes in.
#[tokio::test]
async fn a_source_waits_at_its_backpressure_threshold_before_the_outbox_is_full() {
    let (up, s) = outbox_bound_source("early", 10).await;
    let depth = |n: u64| {
        let s = &s;
        async move {
            wait_for(Duration::from_secs(30), "the queue depth", || async {
                let k = s.get("/v1/outbox/kpis").await.json;
                (k["queue_depth"] == n).then_some(())
            })
            .await;
        }
    };
    // 7 pending: the poll's notification makes 8, at the threshold: it goes in.
    let (st, body) = s.append(&urgent_batch("early", 0, 7)).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    depth(7).await;
    up.add_items(0, 2);
    post(&s, "/v1/sources/early/poll", json!({})).await;
    wait_source(&s, "early", "the first items", |v| v["items_total"] == 2).await;
    depth(8).await;
    // 8 pending: the next poll waits, though the outbox (10) is not full.
    up.add_items(2, 4);
    post(&s, "/v1/sources/early/poll", json!({})).await;
    wait_backpressure(&s, "early", "backpressure").await;
    assert_eq!(
        source(&s, "early").await["items_total"],
        2,
        "nothing appended"
    );
    // A client may still append up to max_pending.
    let (st, body) = s.append(&urgent_batch("early", 7, 9)).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let m = s.get("/metrics").await.text;
    assert!(m.contains("tidemark_source_backpressure{source=\"early\"} 1"));
}

/// Every poll request carries a request id of its own (a UUID) and, with `idempotency_header`,
/// an idempotency key naming the source, the watermark it reads after and the poll's series:
/// the same when a failed poll is retried, a new one for the next poll after a success; and
/// names tidemark and its release as its `User-Agent`.
#[tokio::test]
async fn poll_requests_carry_a_request_id_and_an_idempotency_key() {
    let (up, addr) = upstream_with(5).await;
    // The first request fails: the retry repeats its key.
    up.with(|u| u.faults.push_back(Fault::Status(502, None)));
    let cfg = source_toml(
        "ids",
        addr,
        "every = \"1h\"\nidempotency_header = \"Idempotency-Key\"",
    )
    .replace("page_size = 100", "page_size = 2");
    let s = start(cfg).await;
    wait_source(&s, "ids", "the backlog", |v| v["items_total"] == 5).await;
    post(&s, "/v1/sources/ids/poll", json!({})).await;
    wait_for(Duration::from_secs(30), "the next poll", || async {
        (up.with(|u| u.request_ids.len()) >= 5).then_some(())
    })
    .await;
    let (reqs, ids) = up.with(|u| (u.requests.clone(), u.request_ids.clone()));
    let mut seen = std::collections::HashSet::new();
    let mut series = Vec::new();
    for ((_, after, _, _), (rid, key, agent)) in reqs.iter().zip(&ids) {
        assert_eq!(
            agent.as_deref(),
            Some(crate::e2e_dispatch::USER_AGENT),
            "{ids:?}"
        );
        let rid = rid.as_deref().expect("x-request-id");
        assert!(uuid::Uuid::parse_str(rid).is_ok(), "{rid}");
        assert!(seen.insert(rid.to_owned()), "request ids repeat");
        let key = key.as_deref().expect("idempotency-key");
        let prefix = format!("poll:ids:{}:", after.as_deref().unwrap_or(""));
        let s = key.strip_prefix(&prefix).unwrap_or_else(|| panic!("{key}"));
        assert!(uuid::Uuid::parse_str(s).is_ok() && s != rid, "{key}");
        series.push(s.to_owned());
    }
    // Failed request, its retry and the rest of that poll: one series; the next poll: another.
    let first = &series[0];
    let n = series.iter().take_while(|s| *s == first).count();
    assert!(
        n >= 4,
        "the failed poll's retry and pages share its key: {series:?}"
    );
    assert_ne!(
        series.last(),
        Some(first),
        "a poll after a success is a new series"
    );
    // A header name that is not one refuses the start.
    let bad = source_toml(
        "ids",
        addr,
        "every = \"1h\"\nidempotency_header = \"bad header\"",
    );
    refused_naming(&bad, "sources.ids.idempotency_header");
}

/// Per-class retry limits (`[sources.retry] limits`): three 5xx in a row park a source whose
/// `server_error` limit is 3, naming the class; a failure of another class or a success in
/// between starts the count again;
/// an unknown class refuses the start.
#[tokio::test]
async fn a_class_of_transient_errors_parks_the_source_at_its_limit() {
    let (up, addr) = upstream_with(1).await;
    // The retry table is the last of the block: the limits go at its end.
    let cfg = source_toml("flaky", addr, "every = \"1h\"") + "limits = { server_error = 3 }\n";
    // 502, 502, a 429 with Retry-After (another class: the run of 5xx ends), 502, 502,
    // then a success: never three 5xx in a row, not parked.
    up.with(|u| {
        u.faults.extend([
            Fault::Status(502, None),
            Fault::Status(502, None),
            Fault::Status(429, Some(1)),
            Fault::Status(502, None),
            Fault::Status(502, None),
        ]);
    });
    let s = start(cfg.clone()).await;
    wait_source(&s, "flaky", "the item after the failures", |v| {
        v["items_total"] == 1 && v["state"] == "idle"
    })
    .await;
    // Three in a row: parked, naming the class.
    up.add_items(1, 2);
    up.with(|u| u.faults.extend((0..3).map(|_| Fault::Status(503, None))));
    post(&s, "/v1/sources/flaky/poll", json!({})).await;
    let st = wait_source(&s, "flaky", "parked", |v| v["state"] == "parked").await;
    let err = st["last_error"].as_str().unwrap_or("");
    assert!(
        err.contains("3 consecutive server_error failures") && err.contains("status 503"),
        "{st}"
    );
    // The count beside the message is the message's (it read 2: the parking failure was not
    // counted).
    assert_eq!(st["consecutive_failures"], 3, "{st}");
    assert_eq!(st["items_total"], 1);
    // Resumed, it goes on.
    post(&s, "/v1/sources/flaky/resume", json!({})).await;
    wait_source(&s, "flaky", "resumed", |v| v["items_total"] == 2).await;
    // An unknown class refuses the start.
    let bad = cfg.replace("server_error = 3", "server_errors = 3");
    refused_naming(&bad, "sources.flaky.retry.limits.server_errors");
}

/// A source's titles in the notify recipient's locale (`[notifications.templates.<locale>.
/// sources.<name>]`, `de-AT` falling back to `de`), the configured ones otherwise; a misspelt
/// title key refuses the start naming it.
#[tokio::test]
async fn source_titles_follow_the_recipients_locale() {
    let (up, addr) = start_upstream().await;
    let notify = "every = \"1h\"\n[sources.notify]\npriority = \"info\"\nrecipient = \"ana\"\n\
                  title_one = \"{/plan/name} has been updated\"\ntitle_many = \"You have {count} new updates\"\n";
    let templates = "[notifications.templates.de.sources.loc]\n\
                     title_one = \"{/plan/name} wurde aktualisiert\"\n\
                     title_many = \"Sie haben {count} neue Änderungen\"\n";
    let cfg = format!("{templates}{}", source_toml("loc", addr, notify));
    let s = start(cfg.clone()).await;
    wait_source(&s, "loc", "the first (empty) poll", |v| {
        v["last_success_at"].is_string()
    })
    .await;
    // No locale yet: as configured.
    up.add_items(0, 1);
    post(&s, "/v1/sources/loc/poll", json!({})).await;
    wait_source(&s, "loc", "one", |v| v["items_total"] == 1).await;
    // ana reads Austrian German: the de titles.
    let (st, body) = s
        .append(
            &json!({"event_id": "ana-de", "stream": "recipients", "subject": "ana",
                        "type": "recipient.updated", "payload": {"locale": "de-AT"}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    up.add_items(1, 2);
    post(&s, "/v1/sources/loc/poll", json!({})).await;
    wait_source(&s, "loc", "two", |v| v["items_total"] == 2).await;
    up.add_items(2, 5);
    post(&s, "/v1/sources/loc/poll", json!({})).await;
    wait_source(&s, "loc", "five", |v| v["items_total"] == 5).await;
    let titles: Vec<String> = s
        .read_all("&type=notification.requested")
        .await
        .iter()
        .map(|n| n["payload"]["title"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        titles,
        [
            "plan 0 has been updated",
            "plan 1 wurde aktualisiert",
            "Sie haben 3 neue Änderungen"
        ]
    );
    // A misspelt title key refuses the start, naming it.
    let bad = cfg.replace("title_many = \"Sie", "title_lots = \"Sie");
    refused_naming(&bad, "notifications.templates.de.sources.loc.title_lots");
}

/// The title's placeholders read the first item the poll's notification covers, also when it
/// is on an earlier page behind an item already in the log: after a reset back to 000000, the
/// poll's first page is [000001 (old), 000002 (new)] and its second [000003 (new)].
#[tokio::test]
async fn the_title_reads_the_first_covered_item_across_pages() {
    let (up, addr) = upstream_with(2).await;
    let notify = "every = \"1h\"\n[sources.notify]\npriority = \"info\"\ntitle_one = \"one\"\n\
                  title_many = \"{count} new, from {/plan/name}\"\n";
    let cfg = source_toml("first", addr, notify).replace("page_size = 100", "page_size = 2");
    let s = start(cfg).await;
    wait_source(&s, "first", "the first poll", |v| v["items_total"] == 2).await;
    let r = reset(&s, "first", json!("000000"), "re-read").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    up.add_items(2, 4);
    post(&s, "/v1/sources/first/poll", json!({})).await;
    wait_source(&s, "first", "the new items", |v| v["items_total"] == 4).await;
    let notes = s.read_all("&type=notification.requested").await;
    let last = notes.last().unwrap();
    assert_eq!(last["payload"]["title"], "2 new, from plan 2", "{last}");
    assert_eq!(last["payload"]["items"], json!(["000002", "000003"]));
}

/// A `cron` source polls at its schedule's times only: not at start (it did, outside its
/// schedule); `poll_at_start = true` asks for that poll, and "Poll now" still polls. An
/// `every` source polls at start, as before.
#[tokio::test]
async fn a_cron_source_first_polls_at_its_schedule_unless_told_to_poll_at_start() {
    let (quiet_up, quiet) = start_upstream().await;
    let (eager_up, eager) = start_upstream().await;
    quiet_up.add_items(0, 1);
    eager_up.add_items(0, 1);
    // Once a year: its next time is months away, whenever this runs.
    let yearly = "cron = \"0 0 1 1 *\"";
    let s = start(format!(
        "{}{}",
        source_toml("quiet", quiet, yearly),
        source_toml("eager", eager, &format!("{yearly}\npoll_at_start = true"))
    ))
    .await;
    wait_source(&s, "eager", "the start poll", |v| v["items_total"] == 1).await;
    // The eager source's start poll is done; the quiet one started as early and asked nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let q = source(&s, "quiet").await;
    assert_eq!(
        quiet_up.requests(),
        0,
        "a cron source polled outside its schedule: {q}"
    );
    assert_eq!(q["items_total"], 0, "{q}");
    assert!(q["next_poll_at"].is_string(), "{q}");
    post(&s, "/v1/sources/quiet/poll", json!({})).await;
    wait_source(&s, "quiet", "the poll asked for", |v| v["items_total"] == 1).await;
    assert!(quiet_up.requests() >= 1);
}

/// Seed 004's item schema: an item its `[sources.items] schema` refuses is skipped with the
/// reason (`source.item_skipped`, counted in `items_skipped` and
/// `tidemark_source_items_skipped_total`), never turned into an event or notified, but
/// acknowledged; the watermark still moves past it; a replayed poll records and counts it
/// once; a schema that is not one refuses the start. The acknowledgement carries
/// `[sources.ack] extra`.
#[tokio::test]
async fn items_an_upstream_schema_refuses_are_skipped_and_counted() {
    let (up, addr) = upstream_with(3).await;
    up.with(|u| {
        // Item 1 breaks the schema: its plan's name is a number.
        u.items[1].1["plan"]["name"] = json!(7);
    });
    let extra = format!(
        "every = \"1h\"\n[sources.notify]\npriority = \"info\"\ntitle_one = \"one\"\ntitle_many = \"{{count}} new\"\n\
         [sources.ack]\nurl = \"http://{addr}/ack\"\nfield = \"ids\"\n\
         extra = {{ clientVersion = \"TimeSafari-DailyNotificationPlugin/1.0.0\" }}\n"
    );
    let schema = "schema = { type = \"object\", required = [\"id\", \"plan\"], properties = { plan = { type = \"object\", required = [\"name\"], properties = { name = { type = \"string\" } } } } }";
    let cfg = source_toml("typed", addr, &extra)
        .replace("id = \"/id\"", &format!("id = \"/id\"\n{schema}"));
    let s = start(cfg.clone()).await;
    let st = wait_source(&s, "typed", "the page", |v| v["watermark"] == "000002").await;
    assert_eq!(st["items_total"], 2, "{st}");
    assert_eq!(st["items_skipped"], 1, "{st}");
    assert_eq!(
        skipped_metric(&s).await,
        Some(1.0),
        "the skipped item is counted"
    );
    let items: Vec<String> = item_events(&s)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(items, ["src:typed:000000", "src:typed:000002"]);
    let skipped = s.read_all("&type=source.item_skipped").await;
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0]["payload"]["id"], "000001");
    let reason = skipped[0]["payload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("/plan/name") && reason.contains("string"),
        "{reason}"
    );
    let notes = s.read_all("&type=notification.requested").await;
    assert_eq!(notes.len(), 1);
    assert_eq!(
        notes[0]["payload"]["count"], 2,
        "the skipped item is not notified"
    );
    // The ack names the items appended, with the extra field.
    let acks = up.with(|u| u.ack_bodies.clone());
    assert_eq!(acks.len(), 1, "{acks:?}");
    // The skipped item is acknowledged with the others: it was received and recorded (an
    // upstream that resends what is not acknowledged would send it for ever).
    assert_eq!(
        acks[0]["ids"],
        json!(["000000", "000001", "000002"]),
        "{acks:?}"
    );
    assert_eq!(
        acks[0]["clientVersion"],
        "TimeSafari-DailyNotificationPlugin/1.0.0"
    );
    // A reset replays the page: the skipped item is recorded once.
    let r = reset(&s, "typed", json!(null), "replay").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    post(&s, "/v1/sources/typed/poll", json!({})).await;
    wait_source(&s, "typed", "the replay", |v| v["watermark"] == "000002").await;
    assert_eq!(s.read_all("&type=source.item_skipped").await.len(), 1);
    assert_eq!(source(&s, "typed").await["items_skipped"], 1);
    assert_eq!(
        skipped_metric(&s).await,
        Some(1.0),
        "a replayed skip is not counted again"
    );
    crate::common::assert_projections_sound(&s, "after a skipped item").await;
    // A schema that is not one refuses the start, naming the key.
    let bad = cfg.replace("type = \"string\"", "type = \"text\"");
    refused_naming(&bad, "sources.typed.items.schema");
    let bad = cfg.replace("clientVersion", "ids");
    refused_naming(&bad, "sources.typed.ack.extra.ids");
}

/// `tidemark_source_items_skipped_total` of the source `typed`.
async fn skipped_metric(s: &Server) -> Option<f64> {
    let metrics = s.get("/metrics").await.text;
    crate::common::metric_sum(
        &metrics,
        "tidemark_source_items_skipped_total{source=\"typed\"}",
    )
}

/// Seed 004's retry matrix: each class of failure waits its own backoff
/// (`[sources.retry.classes]`), counted by its failures in a row: 5xx on a fixed 1.5 s, a 429
/// without `Retry-After` on a fixed 1 s, a timeout (the request's 2 s) on a fixed 1.8 s, a
/// connection cut mid-answer (`network`) on a fixed 1.4 s and a 401 (`auth`, retried once) on
/// a fixed 1.2 s, where the source's own backoff is 200 ms to 1 s (and a 401 without a class
/// of its own is retried at once); an unknown class refuses the start.
#[tokio::test]
async fn each_class_of_failure_waits_its_own_backoff() {
    let (up, addr) = upstream_with(1).await;
    let class = |name: &str, ms: u64| {
        format!(
            "[sources.retry.classes.{name}]\nstrategy = \"fixed\"\nbase_delay = \"{ms}ms\"\n\
             max_delay = \"{ms}ms\"\n"
        )
    };
    let cfg = source_toml("matrix", addr, "every = \"1h\"").replace(
        "retry_after_max = \"10s\"",
        &format!(
            "retry_after_max = \"10s\"\n{}{}{}{}{}",
            class("server_error", 1500),
            class("rate_limited", 1000),
            class("timeout", 1800),
            class("network", 1400),
            class("auth", 1200),
        ),
    );
    up.with(|u| {
        u.faults.extend([
            Fault::Status(500, None),
            Fault::Status(502, None),
            Fault::Status(429, None),
            Fault::Hang,
            Fault::Cut,
            Fault::Status(401, None),
        ]);
    });
    let s = start(cfg.clone()).await;
    // About 11 s of waits in all; the bound is ten times that.
    wait_for(
        Duration::from_secs(120),
        "the item after the failures",
        || async {
            let v = source(&s, "matrix").await;
            (v["items_total"] == 1 && v["state"] == "idle").then_some(())
        },
    )
    .await;
    let times: Vec<Instant> = up.with(|u| u.requests.iter().map(|r| r.0).collect());
    assert_eq!(times.len(), 7, "six failures, then the page");
    let gap = |i: usize| times[i + 1] - times[i];
    // Lower bounds only (the machine may be slow; it cannot be early), each above what the
    // source's own backoff (at most 1 s) would wait.
    for (i, what, at_least_ms) in [
        (0, "a 500 (server_error)", 1400),
        (1, "a 502 (server_error)", 1400),
        (2, "a 429 (rate_limited)", 900),
        (
            3,
            "a timeout: the request's 2 s, then its class's 1.8 s",
            3650,
        ),
        (4, "a cut connection (network)", 1300),
        (5, "a 401 (auth)", 1100),
    ] {
        assert!(
            gap(i) >= Duration::from_millis(at_least_ms),
            "after {what}: {:?}",
            gap(i)
        );
    }
    let bad = cfg.replace("classes.rate_limited", "classes.slow");
    refused_naming(&bad, "sources.matrix.retry.classes.slow");
}

/// Seed 004's authenticated polling by the OAuth 2 client-credentials flow: the token is
/// asked for with the client's credentials from the environment (basic auth, the scope
/// given), sent as the bearer of every list and ack request in place of the configured
/// header, renewed before it expires (no request is refused meanwhile), and asked for again
/// once when the upstream answers 401 (revoked early), after which the poll succeeds; the
/// secret and the tokens are in no answer or log line; credentials the endpoint refuses park
/// the source.
#[tokio::test]
async fn an_upstream_token_comes_from_client_credentials_and_is_renewed() {
    let (up, addr) = upstream_with(2).await;
    up.with(|u| {
        u.valid_tokens = Some(Default::default());
        u.token_life_s = 4;
    });
    let auth = format!(
        "every = \"1s\"\n[sources.ack]\nurl = \"http://{addr}/ack\"\nfield = \"ids\"\n\
         [sources.auth]\ntoken_url = \"http://{addr}/token\"\nclient_id = \"env:TEST_OAUTH_ID\"\n\
         client_secret = \"env:TEST_OAUTH_SECRET\"\nscope = \"plans:read\"\nrefresh_before = \"2s\"\n"
    );
    let cfg = source_toml("oauth", addr, &auth);
    let s = Server::start(
        ServerOpts::default()
            .config(cfg.clone())
            .env("TEST_SOURCE_TOKEN", tidemark_tests::secret(SECRET))
            .env("TEST_OAUTH_ID", "poller")
            .env("TEST_OAUTH_SECRET", tidemark_tests::secret(OAUTH_SECRET)),
    )
    .await;
    wait_source(&s, "oauth", "the first items", |v| v["items_total"] == 2).await;
    // Polls every second for a while: the 4 s token is renewed 2 s before its end.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (requests, tokens, refused) = up.with(|u| {
        let refused = u
            .requests
            .iter()
            .filter(|r| {
                !r.3.as_deref()
                    .and_then(|a| a.strip_prefix("Bearer "))
                    .is_some_and(|t| t.starts_with("tok-"))
            })
            .count();
        (u.requests.len(), u.token_requests.clone(), refused)
    });
    assert!(requests >= 4, "{requests} polls");
    assert_eq!(
        refused, 0,
        "every request carried a token, never the configured header"
    );
    assert!(tokens.len() >= 2, "renewed before it expired: {tokens:?}");
    assert!(
        tokens
            .iter()
            .all(|(grant, scope, id)| grant == "client_credentials"
                && scope.as_deref() == Some("plans:read")
                && id == "poller"),
        "{tokens:?}"
    );
    assert_eq!(
        up.with(|u| u.refused_401),
        0,
        "no 401 while the tokens were renewed"
    );
    // Tokens that live an hour from now on: once one is held, nothing renews it on its own.
    up.with(|u| u.token_life_s = 3600);
    let issued = up.with(|u| u.token_requests.len());
    wait_for(Duration::from_secs(30), "a token of an hour", || async {
        (up.with(|u| u.token_requests.len()) > issued).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Revoked early: the next poll is refused once, one new token is asked for, and it goes
    // on.
    let before = up.with(|u| {
        u.valid_tokens = Some(Default::default());
        u.token_requests.len()
    });
    up.add_items(2, 3);
    wait_source(&s, "oauth", "the item after the revocation", |v| {
        v["items_total"] == 3
    })
    .await;
    let (after, refused) = up.with(|u| (u.token_requests.len(), u.refused_401));
    assert_eq!(refused, 1, "the revoked token was refused once");
    assert_eq!(after, before + 1, "one new token after the 401");
    let st = source(&s, "oauth").await;
    assert_eq!(st["state"], "idle", "{st}");
    assert_eq!(st["consecutive_failures"], 0, "{st}");
    let acks = up.with(|u| u.acks.len());
    assert!(acks >= 2, "the acks went with the token too");
    // Refused credentials park the source, saying so (and nothing of the secret).
    drop(s);
    let bad = Server::start(
        ServerOpts::default()
            .config(cfg.replace("\"oauth\"", "\"oauthbad\""))
            .env("TEST_SOURCE_TOKEN", tidemark_tests::secret(SECRET))
            .env("TEST_OAUTH_ID", "poller")
            .env(
                "TEST_OAUTH_SECRET",
                tidemark_tests::secret("not-the-secret-0000"),
            ),
    )
    .await;
    let st = wait_source(&bad, "oauthbad", "parked", |v| v["state"] == "parked").await;
    assert!(
        st["last_error"]
            .as_str()
            .unwrap()
            .contains("token endpoint answered 401"),
        "{st}"
    );
}

/// A resumed `cron` source polls at its schedule's next time, not at once (issue 53: with
/// `bootstrap = "all"` a resume could pull an upstream's whole history outside its window);
/// `{"now": true}` (`tidemark sources resume --now`) polls at once.
#[tokio::test]
async fn a_resumed_cron_source_waits_for_its_schedule() {
    let (up, addr) = upstream_with(2).await;
    // Once a year (1 January, 00:00 UTC): never during this test.
    let s = start(source_toml(
        "yearly",
        addr,
        "cron = \"0 0 1 1 *\"\ntz = \"UTC\"",
    ))
    .await;
    let st = wait_source(&s, "yearly", "waiting for its schedule", |v| {
        v["next_poll_at"].is_string()
    })
    .await;
    let scheduled = st["next_poll_at"].clone();
    assert!(
        scheduled.as_str().unwrap().contains("-01-01T00:00:00"),
        "{st}"
    );
    let r = post(&s, "/v1/sources/yearly/pause", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = post(&s, "/v1/sources/yearly/resume", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Back to its schedule: the poll time it shows is the schedule's, and nothing was asked.
    let st = wait_source(&s, "yearly", "resumed", |v| {
        v["state"] == "idle" && v["next_poll_at"].is_string()
    })
    .await;
    assert_eq!(st["next_poll_at"], scheduled, "{st}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(up.requests(), 0, "a resume polled outside the schedule");
    assert_eq!(source(&s, "yearly").await["items_total"], 0);
    // Paused and resumed with `now`: it polls at once, through the CLI.
    post(&s, "/v1/sources/yearly/pause", json!({})).await;
    let out = cli_at(s.base(), "sources resume yearly --now").await;
    cli_ok(&out, "sources resume");
    wait_source(&s, "yearly", "the poll at once", |v| v["items_total"] == 2).await;
    assert_eq!(up.requests(), 1);
    // Parked (a 400 on an operator's poll), then resumed: it waits for its schedule again.
    up.add_items(2, 3);
    up.with(|u| u.faults.push_back(Fault::Status(400, None)));
    post(&s, "/v1/sources/yearly/poll", json!({})).await;
    wait_source(&s, "yearly", "parked", |v| v["state"] == "parked").await;
    let polled = up.requests();
    post(&s, "/v1/sources/yearly/resume", json!({})).await;
    let st = wait_source(&s, "yearly", "resumed after the park", |v| {
        v["state"] == "idle" && v["next_poll_at"].is_string()
    })
    .await;
    assert_eq!(st["next_poll_at"], scheduled, "{st}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        up.requests(),
        polled,
        "a resume after a park polled outside the schedule"
    );
}

/// A tenant's source (spec section 20: `tenant` in its `[[sources]]` block) polls into its
/// tenant's log in the tenant's shard: it waits while the tenant does not exist, starts once
/// it is created, its items and state are the tenant's alone (the default tenant neither lists
/// nor reaches it, under the same API), and its metrics carry the tenant.
#[tokio::test]
async fn a_tenants_source_polls_into_its_tenant_in_its_shard() {
    let (_up, addr) = upstream_with(3).await;
    let (_mine, mine) = upstream_with(2).await;
    let config = format!(
        "[log]\nshards = 2\n{}{}",
        source_toml("acme-plans", addr, "tenant = \"acme\"\nevery = \"1h\"\n"),
        source_toml("plans", mine, "every = \"1h\"\n"),
    );
    let s = start(config).await;
    // The default tenant's source polls; acme's waits for acme.
    wait_source(&s, "plans", "the default tenant's items", |v| {
        v["watermark"] == "000001"
    })
    .await;
    let list = s.get("/v1/sources").await;
    let names: Vec<&str> = list.json["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["plans"], "{}", list.text);
    assert_eq!(
        s.get("/v1/sources/acme-plans").await.status,
        StatusCode::NOT_FOUND
    );
    let r = post(
        &s,
        "/v1/tenants",
        json!({"name": "acme", "reason": "sources test"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["shard"], 1);
    let acme = s.api().under("/tenants/acme", None);
    let st = wait_source(&acme, "acme-plans", "acme's items", |v| {
        v["watermark"] == "000002" && v["state"] == "idle"
    })
    .await;
    assert_eq!(st["items_total"], 3, "{st}");
    assert_eq!(st["last_error"], Value::Null, "{st}");
    let list = acme.get("/v1/sources").await;
    assert_eq!(
        list.json["sources"].as_array().unwrap().len(),
        1,
        "{}",
        list.text
    );
    assert_eq!(
        acme.get("/v1/sources/plans").await.status,
        StatusCode::NOT_FOUND
    );
    // Its items are acme's events, at acme's shard's seqs from 1 (its shard holds nothing
    // else); the default tenant's log has none of them.
    let items = item_events(&acme).await;
    assert_eq!(
        items,
        (0..3)
            .map(|i| (format!("src:acme-plans:{i:06}"), i as u64 + 1))
            .collect::<Vec<_>>()
    );
    let default_items = item_events(&s).await;
    assert_eq!(default_items.len(), 2, "{default_items:?}");
    assert!(
        default_items
            .iter()
            .all(|(id, _)| id.starts_with("src:plans:"))
    );
    // Acted on under its tenant.
    let r = post(&acme, "/v1/sources/acme-plans/poll", json!({})).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let r = post(&s, "/v1/sources/acme-plans/poll", json!({})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let m = s.get("/metrics").await.text;
    assert!(
        m.contains("tidemark_source_stale{source=\"acme-plans\",tenant=\"acme\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("tidemark_source_stale{source=\"plans\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("tidemark_source_items_total{source=\"acme-plans\",tenant=\"acme\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("tidemark_source_items_total{source=\"plans\"} 2"),
        "{m}"
    );
}
