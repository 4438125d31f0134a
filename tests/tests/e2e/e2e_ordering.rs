//! Order per key (spec section 4, "Order"): a route with `ordering` keeps at most one delivery
//! of a key in flight, the next pushed or claimed only once the one before it is sent; a
//! waiting delivery says so (`held_by: "ordering"`, `waits_for`). Against a webhook receiver
//! on loopback that fails one attempt in five, across a `kill -9` of the server, and through
//! the app sink's claim.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode as AxStatus};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts};

use crate::common::{append_ok, notif_ev, post_json, serve_local, wait_for, webhook_id};

const KEYS: usize = 20;
const PER_KEY: usize = 100;

/// A receiver that answers every fifth POST 503 and records the others' `webhook-id`, in the
/// order they were received.
async fn flaky_receiver() -> (Arc<Mutex<Vec<String>>>, u16) {
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let g = got.clone();
    let app = axum::Router::new().fallback(axum::routing::post(move |headers: HeaderMap| {
        let g = g.clone();
        let calls = calls.clone();
        async move {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n % 5 == 4 {
                return AxStatus::SERVICE_UNAVAILABLE;
            }
            let id = webhook_id(&headers);
            g.lock().unwrap().push(id);
            AxStatus::OK
        }
    }));
    let port = serve_local(app).await.port();
    (got, port)
}

/// `GET /v1/deliveries/{id}` once the router has made it.
async fn routed(s: &Server, id: &str) -> tidemark_tests::Reply {
    wait_for(Duration::from_secs(30), id, || async {
        let r = s.get(&format!("/v1/deliveries/{id}")).await;
        (r.status == StatusCode::OK).then_some(r)
    })
    .await
}

/// `dlv:o-<key>-<n>:ordered` → (key, n).
fn key_and_n(id: &str) -> Option<(usize, usize)> {
    let nid = id.strip_prefix("dlv:o-")?.strip_suffix(":ordered")?;
    let (k, n) = nid.split_once('-')?;
    Some((k.parse().ok()?, n.parse().ok()?))
}

#[tokio::test]
async fn each_key_is_received_in_seq_order_across_a_kill_9() {
    let (got, port) = flaky_receiver().await;
    let cfg = format!(
        r#"
[notifications.routing]
urgent = ["dashboard", "ordered"]
[notifications.routes.ordered]
sink = "webhook"
url = "http://127.0.0.1:{port}/hook"
ordering = {{ key = "task" }}
[notifications.routes.ordered.retry]
max_attempts = 50
base_delay = "20ms"
max_delay = "100ms"
lease_ttl = "3s"
"#
    );
    let mut s = Server::start(ServerOpts::default().config(cfg)).await;
    // Notification n of key k is appended after n − 1 of every key: per key, seq order is n.
    let all: Vec<(usize, usize)> = (0..PER_KEY)
        .flat_map(|n| (0..KEYS).map(move |k| (k, n)))
        .collect();
    for chunk in all.chunks(100) {
        let events: Vec<Value> = chunk
            .iter()
            .map(|(k, n)| {
                notif_ev(
                    &format!("o-{k}-{n}"),
                    json!({"priority": "urgent", "title": format!("{k}/{n}"), "task_id": format!("task-{k}")}),
                )
            })
            .collect();
        append_ok(&s, &json!({"events": events})).await;
    }
    let total = KEYS * PER_KEY;
    // A waiting delivery says whom it waits for: the first of its key not yet sent.
    let held = routed(&s, "dlv:o-3-99:ordered").await;
    assert_eq!(held.json["held_by"], "ordering", "{}", held.text);
    let first = held.json["waits_for"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (k, n) = key_and_n(&first).unwrap_or_else(|| panic!("waits for {first:?}"));
    assert!(k == 3 && n < 99, "waits for {first}");

    // Halfway, the server is killed; what it had in flight is tried again after a restart.
    wait_for(Duration::from_secs(120), "half the deliveries", || async {
        (got.lock().unwrap().len() >= total / 2).then_some(())
    })
    .await;
    s.kill9();
    s.restart().await;
    let receipts = wait_for(Duration::from_secs(300), "every delivery", || async {
        let g = got.lock().unwrap().clone();
        let distinct: std::collections::BTreeSet<&String> = g.iter().collect();
        (distinct.len() >= total).then_some(g)
    })
    .await;
    let mut per_key: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for id in &receipts {
        let (k, n) = key_and_n(id).unwrap_or_else(|| panic!("an unknown webhook-id {id:?}"));
        let seen = per_key.entry(k).or_default();
        // At least once: an attempt whose success the kill cut off comes again, right away
        // (nothing of its key goes before it is sent).
        if seen.last() != Some(&n) {
            seen.push(n);
        }
    }
    let want: Vec<usize> = (0..PER_KEY).collect();
    assert_eq!(per_key.len(), KEYS);
    for (k, seen) in &per_key {
        assert_eq!(seen, &want, "key {k} was received out of seq order");
    }
    let d = s.get("/v1/deliveries/dlv:o-3-99:ordered").await;
    assert_eq!(d.json["status"], "sent", "{}", d.text);
    assert!(d.json.get("held_by").is_none(), "{}", d.text);
}

#[tokio::test]
async fn the_app_sinks_claimers_see_the_same_order() {
    let cfg = r#"
[notifications.routes.desktop]
ordering = { key = "recipient", on_park = "skip" }
[notifications.routes.desktop.retry]
max_attempts = 1
"#;
    let s = Server::start(ServerOpts::default().config(cfg)).await;
    let events: Vec<Value> = ["a1", "b1", "a2", "a3", "b2"]
        .iter()
        .map(|id| {
            notif_ev(
                id,
                json!({"priority": "urgent", "title": id, "recipient": format!("r-{}", &id[..1])}),
            )
        })
        .collect();
    append_ok(&s, &json!({"events": events})).await;
    routed(&s, "dlv:b2:desktop").await;
    let claim = || async {
        let r = post_json(
            &s,
            "/v1/deliveries/claim",
            &json!({"sink": "app", "owner": "w", "limit": 10, "lease_ms": 60_000}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let mut ids: Vec<String> = r.json["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["notification_id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    // One of each recipient, the first of each.
    assert_eq!(claim().await, ["a1", "b1"]);
    let a2 = s.get("/v1/deliveries/dlv:a2:desktop").await;
    assert_eq!(a2.json["held_by"], "ordering", "{}", a2.text);
    assert_eq!(a2.json["waits_for"], "dlv:a1:desktop");
    let a3 = s.get("/v1/deliveries/dlv:a3:desktop").await;
    assert_eq!(a3.json["waits_for"], "dlv:a1:desktop");
    assert!(
        claim().await.is_empty(),
        "nothing else goes while a1 and b1 are out"
    );
    let done = post_json(
        &s,
        "/v1/deliveries/dlv:a1:desktop/complete",
        &json!({"owner": "w"}),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.text);
    assert_eq!(claim().await, ["a2"]);
    // With on_park = "skip", a parked delivery lets the next of its key go.
    let failed = post_json(
        &s,
        "/v1/deliveries/dlv:a2:desktop/fail",
        &json!({"owner": "w", "error_code": "refused", "error": "no", "retryable": false}),
    )
    .await;
    assert_eq!(failed.status, StatusCode::OK, "{}", failed.text);
    assert_eq!(failed.json["status"], "parked", "{}", failed.text);
    assert_eq!(claim().await, ["a3"]);
    let b2 = s.get("/v1/deliveries/dlv:b2:desktop").await;
    assert_eq!(b2.json["waits_for"], "dlv:b1:desktop", "{}", b2.text);
}
