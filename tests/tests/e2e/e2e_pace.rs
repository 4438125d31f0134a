//! A pace per endpoint (spec section 4, "Pace"): a route's `rate` lets at most `n` attempts out
//! in any period; the deliveries beyond it wait, due, spending no attempt, and say so
//! (`held_by: "rate_limited"`); the endpoints view shows the rate and the wait. Measured at a
//! receiver on loopback.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode as AxStatus;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts};

use crate::common::{append_ok, notif_ev, serve_local, wait_for};

const TOTAL: usize = 600;
const RATE: usize = 10;

#[tokio::test]
async fn a_paced_route_is_received_no_faster_than_its_rate() {
    let got: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let g = got.clone();
    let app = axum::Router::new().fallback(axum::routing::post(move || {
        let g = g.clone();
        async move {
            g.lock().unwrap().push(Instant::now());
            AxStatus::OK
        }
    }));
    let port = serve_local(app).await.port();
    let cfg = format!(
        r#"
[notifications.routing]
urgent = ["dashboard", "paced"]
[notifications.routes.paced]
sink = "webhook"
url = "http://127.0.0.1:{port}/hook"
rate = "{RATE}/s"
"#
    );
    let s = Server::start(ServerOpts::default().config(cfg)).await;
    let events: Vec<Value> = (0..TOTAL)
        .map(|i| {
            notif_ev(
                &format!("p-{i}"),
                json!({"priority": "urgent", "title": format!("p{i}")}),
            )
        })
        .collect();
    for chunk in events.chunks(100) {
        append_ok(&s, &json!({"events": chunk})).await;
    }
    // While it goes, the last waits at the pace, due, and the endpoints view says so.
    let last = format!("/v1/deliveries/dlv:p-{}:paced", TOTAL - 1);
    let held = wait_for(
        Duration::from_secs(30),
        "the last delivery held at the pace",
        || async {
            let r = s.get(&last).await;
            (r.status == StatusCode::OK && r.json["held_by"] == "rate_limited").then_some(r)
        },
    )
    .await;
    let (status, attempts) = (&held.json["status"], &held.json["attempts"]);
    assert_eq!(status, "queued", "{}", held.text);
    assert_eq!(attempts, 0, "waiting spends no attempt: {}", held.text);
    let paced = paced_endpoint(&s).await;
    assert_eq!(paced["rate"], "10/s", "{paced}");
    assert!(paced["paced_until"].is_string(), "the wait: {paced}");

    let times = wait_for(Duration::from_secs(300), "every delivery", || async {
        let t = got.lock().unwrap().clone();
        (t.len() >= TOTAL).then_some(t)
    })
    .await;
    assert_eq!(times.len(), TOTAL, "each delivered once");
    // In any w seconds at the receiver, at most the rate's w seconds' worth, with one second's
    // worth of slack: the pace is kept on the leases, and a lease's POST arrives a little
    // later or earlier than the one before it (the exact window is the pacer's unit test).
    for w in [1u64, 5, 10] {
        let mut most = 0;
        for (i, t) in times.iter().enumerate() {
            let within = times[i..]
                .iter()
                .take_while(|u| u.duration_since(*t) < Duration::from_secs(w))
                .count();
            most = most.max(within);
        }
        let bound = RATE * (w as usize + 1);
        assert!(
            most <= bound,
            "{most} received within {w} s at {RATE}/s (at most {bound})"
        );
    }
    let span = times[TOTAL - 1].duration_since(times[0]);
    assert!(
        span >= Duration::from_secs(((TOTAL - RATE) / RATE - 2) as u64),
        "{TOTAL} at {RATE}/s took only {span:?}"
    );
    // None failed: every attempt was the first, and succeeded.
    let paced = paced_endpoint(&s).await;
    assert_eq!(paced["attempts"], TOTAL, "{paced}");
    assert_eq!(paced["successes"], TOTAL, "{paced}");
    let d = s.get(&last).await;
    assert_eq!(d.json["status"], "sent", "{}", d.text);
    assert_eq!(d.json["attempts"], 1, "{}", d.text);
    assert!(d.json.get("held_by").is_none(), "{}", d.text);
}

/// The route `paced` of `GET /v1/outbox/endpoints`.
async fn paced_endpoint(api: &tidemark_tests::Api) -> Value {
    let ep = api.get("/v1/outbox/endpoints").await;
    ep.json["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["route"] == "paced")
        .cloned()
        .unwrap_or_else(|| panic!("no endpoint for the route: {}", ep.text))
}
