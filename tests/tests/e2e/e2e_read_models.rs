//! Reads of the read models (spec section 7): every JSON answer carries `as_of_seq`, at least
//! the head at the request's arrival (a client reads its own writes, with no sleep) or the
//! `min_seq` it names; a `min_seq` the models cannot reach in 5 s is `503 projection_lagging`
//! with `Retry-After`. And every operation refuses a query parameter it does not take with
//! `400 unknown_parameter`, naming it.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::json;
use tidemark_tests::{Server, ServerOpts};

use crate::common::{append_ok, ev};

/// The read-model endpoints, with a path that exists once the events below are appended.
const READS: [&str; 8] = [
    "/v1/tasks",
    "/v1/tasks/rm-1",
    "/v1/notifications",
    "/v1/deliveries",
    "/v1/outbox/kpis",
    "/v1/cursors?consumer_id=c1",
    "/v1/cursors?consumer_id=c1&stream_name=task_events",
    "/v1/tasks/rm-1/notifications/bridges",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_model_answer_carries_as_of_seq_at_least_the_callers_writes() {
    let s = Server::start(ServerOpts::default()).await;
    let api = s.api();
    for round in 0..3 {
        let receipt = append_ok(
            &api,
            &ev(
                &format!("rm-ev-{round}"),
                "task_events",
                "rm-1",
                "task.created",
                json!({"project_id": "p"}),
            ),
        )
        .await;
        let seq = receipt[0].1;
        for path in READS {
            // No sleep: the answer reflects the append just acknowledged.
            let (st, body) = api.get_json(path).await;
            assert_eq!(st, StatusCode::OK, "{path}: {body}");
            let as_of = body["as_of_seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("{path}: no as_of_seq in {body}"));
            assert!(
                as_of >= seq,
                "{path}: as_of_seq {as_of} < {seq}, the caller's own write"
            );
        }
        let (_, task) = api.get_json("/v1/tasks/rm-1").await;
        assert_eq!(task["task_id"], "rm-1", "{task}");
        assert_eq!(
            task["latest_event_seq"], seq,
            "the task row has the caller's write: {task}"
        );
    }
    // A min_seq at or under the head is answered at once; one past it waits 5 s, then 503.
    let head = api.head().await;
    let sep = |p: &str| if p.contains('?') { '&' } else { '?' };
    for path in READS {
        let (st, body) = api
            .get_json(&format!("{path}{}min_seq={head}", sep(path)))
            .await;
        assert_eq!(st, StatusCode::OK, "{path}: {body}");
        assert!(body["as_of_seq"].as_u64().unwrap() >= head, "{body}");
    }
    let started = Instant::now();
    let r = api
        .get(&format!("/v1/tasks?min_seq={}", head + 1_000_000))
        .await;
    let waited = started.elapsed();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_eq!(r.json["code"], "projection_lagging", "{}", r.text);
    assert!(
        r.headers.contains_key(reqwest::header::RETRY_AFTER),
        "{:?}",
        r.headers
    );
    assert!(
        waited >= Duration::from_secs(5),
        "answered after {waited:?}, before the 5 s wait"
    );
    let r = api.get("/v1/tasks?min_seq=soon").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    // The admin listing and the lags never wait, and carry no floor.
    for path in ["/v1/admin/projections", "/v1/consumers/lag", "/healthz"] {
        let r = api.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_refuses_an_unknown_query_parameter() {
    let s = Server::start(ServerOpts::default()).await;
    let api = s.api();
    let doc = api.get("/openapi.json").await.json;
    let mut tried = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let concrete = path
                .split('/')
                .map(|seg| {
                    if seg.starts_with('{') {
                        "param-test"
                    } else {
                        seg
                    }
                })
                .collect::<Vec<_>>()
                .join("/");
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let mut rb = api.request(m.clone(), &format!("{concrete}?no_such_param=1"));
            if m == Method::POST {
                rb = rb.json(&json!({}));
            }
            let r = tokio::time::timeout(Duration::from_secs(30), api.send(rb))
                .await
                .unwrap_or_else(|_| panic!("{method} {concrete}: no answer"));
            assert_eq!(
                r.status,
                StatusCode::BAD_REQUEST,
                "{method} {path}: {}",
                r.text
            );
            assert_eq!(
                r.json["code"], "unknown_parameter",
                "{method} {path}: {}",
                r.text
            );
            assert!(
                r.json["detail"]
                    .as_str()
                    .unwrap_or("")
                    .contains("no_such_param"),
                "{method} {path}: {}",
                r.text
            );
            // The documented parameters are not refused as unknown.
            let documented: Vec<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .filter_map(|p| p["name"].as_str())
                .collect();
            if m == Method::GET && !documented.is_empty() && !path.ends_with("/stream") {
                let q: Vec<String> = documented.iter().map(|n| format!("{n}=")).collect();
                let r = api.get(&format!("{concrete}?{}", q.join("&"))).await;
                assert_ne!(
                    r.json["code"], "unknown_parameter",
                    "{method} {path}: {}",
                    r.text
                );
            }
            tried += 1;
        }
    }
    assert!(tried >= 30, "only {tried} operations in the document");
    // Silently ignoring a filter was the bug: `?notification_id=` on deliveries.
    let r = api.get("/v1/deliveries?notification_idx=n1").await;
    assert_eq!(r.json["code"], "unknown_parameter", "{}", r.text);
}
