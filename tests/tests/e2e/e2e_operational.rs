//! Operators told where they already look (spec section 17): `[notifications.operational]`
//! names a route that receives what an operator must know, made from the log's own events —
//! here a chat-style (Slack-shaped) webhook on loopback. An endpoint that fails 50 times and
//! recovers is told opened once and closed once, however often its probe fails; parks are told
//! at once, then summed up per window.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode as AxStatus;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts};

use crate::common::{append_ok, notif_ev, wait_for};

type Posts = Arc<Mutex<Vec<(String, String)>>>;

/// `/ops` records the Slack `text` it is sent; `/flaky` answers 503 to its first 50 POSTs and
/// 200 after; `/strict` refuses every POST (400, permanent).
async fn receivers() -> (Posts, u16) {
    let posts: Posts = Arc::default();
    let flaky = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let p = posts.clone();
    let app = axum::Router::new().fallback(axum::routing::post(
        move |uri: axum::http::Uri, body: axum::body::Bytes| {
            let (p, flaky) = (p.clone(), flaky.clone());
            async move {
                let path = uri.path().to_owned();
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let text = v["text"].as_str().unwrap_or_default().to_owned();
                p.lock().unwrap().push((path.clone(), text));
                match path.as_str() {
                    "/flaky" if flaky.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 50 => {
                        AxStatus::SERVICE_UNAVAILABLE
                    }
                    "/strict" => AxStatus::BAD_REQUEST,
                    _ => AxStatus::OK,
                }
            }
        },
    ));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (posts, port)
}

fn told(posts: &Posts, what: &str) -> Vec<String> {
    posts
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, text)| path == "/ops" && text.contains(what))
        .map(|(_, t)| t.clone())
        .collect()
}

#[tokio::test]
async fn an_endpoint_that_fails_50_times_is_told_opened_once_and_closed_once() {
    let (posts, port) = receivers().await;
    let cfg = format!(
        r#"
[notifications.operational]
route = "ops"
every = "2s"
[notifications.routing]
urgent = ["dashboard", "flaky"]
action = ["dashboard", "strict"]
[notifications.routes.ops]
sink = "webhook"
url = "http://127.0.0.1:{port}/ops"
body = "slack"
[notifications.routes.flaky]
sink = "webhook"
url = "http://127.0.0.1:{port}/flaky"
circuit = {{ failures = 45, cool_down = "1s" }}
[notifications.routes.flaky.retry]
max_attempts = 100
base_delay = "10ms"
max_delay = "50ms"
jitter = 0.0
[notifications.routes.strict]
sink = "webhook"
url = "http://127.0.0.1:{port}/strict"
[notifications.routes.strict.retry]
max_attempts = 1
"#
    );
    let s = Server::start(ServerOpts::default().config(cfg)).await;
    let events: Vec<Value> = (0..60)
        .map(|i| {
            notif_ev(
                &format!("fl-{i}"),
                json!({"priority": "urgent", "title": format!("f{i}")}),
            )
        })
        .chain((0..5).map(|i| {
            notif_ev(
                &format!("st-{i}"),
                json!({"priority": "action", "title": format!("s{i}")}),
            )
        }))
        .collect();
    append_ok(&s, &json!({"events": events})).await;
    let r = s.get("/v1/routes/ops").await;
    assert_eq!(
        r.json["operational"], true,
        "GET /v1/routes marks it: {}",
        r.text
    );
    let r = s.get("/v1/routes/flaky").await;
    assert!(r.json.get("operational").is_none(), "{}", r.text);

    // Parks: the first told at once, the other four as one summary when the window ends.
    wait_for(Duration::from_secs(60), "the parks' summary", || async {
        (!told(&posts, "4 more").is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        told(&posts, "Delivery parked on route strict").len(),
        1,
        "{:?}",
        posts.lock().unwrap()
    );
    // The flaky endpoint: 45 failures open it, five probes fail, the sixth closes it.
    wait_for(
        Duration::from_secs(120),
        "every flaky delivery sent",
        || async {
            let ok = posts
                .lock()
                .unwrap()
                .iter()
                .filter(|(p, _)| p == "/flaky")
                .count();
            (ok >= 50 + 60).then_some(())
        },
    )
    .await;
    wait_for(
        Duration::from_secs(30),
        "the circuit told closed",
        || async { (!told(&posts, "flaky: circuit closed").is_empty()).then_some(()) },
    )
    .await;
    // Time for a second "opened" or "closed" to come, if one would.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let opened = told(&posts, "flaky: circuit opened");
    let closed = told(&posts, "flaky: circuit closed");
    assert_eq!(
        (opened.len(), closed.len()),
        (1, 1),
        "opened {opened:?}, closed {closed:?}"
    );
    let page = s.get("/v1/events?stream=endpoints&limit=1000").await;
    let reopened = page.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "endpoint.circuit_opened")
        .count();
    assert!(
        reopened > 1,
        "the circuit opened again at a failed probe ({reopened}): {}",
        page.text
    );
    // The notifications are the log's, of their own type, with ids of the events they tell.
    let page = s
        .get("/v1/events?stream=notifications&type=notification.requested&limit=1000")
        .await;
    let ops: Vec<&Value> = page.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "tidemark.operational")
        .collect();
    assert_eq!(
        ops.len(),
        4,
        "opened, closed, a park and its summary: {ops:?}"
    );
    assert!(
        ops.iter()
            .all(|e| e["event_id"].as_str().is_some_and(|i| i.starts_with("op:"))),
        "{ops:?}"
    );
    for d in posts.lock().unwrap().iter().filter(|(p, _)| p != "/ops") {
        assert!(
            !d.1.contains("circuit"),
            "an operational notification outside ops: {d:?}"
        );
    }
}
