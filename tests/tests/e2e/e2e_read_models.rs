//! Reads of the read models (spec section 7): every JSON answer carries `as_of_seq`, at least
//! the head at the request's arrival (a client reads its own writes, with no sleep) or the
//! `min_seq` it names; a `min_seq` the models cannot reach in 5 s is `503 projection_lagging`
//! with `Retry-After`. And every operation refuses a query parameter it does not take with
//! `400 unknown_parameter`, naming it.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, encode_path};

use crate::common::{append_ok, ev, notif_ev, wait_for, wait_quiet};

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

/// Routes warning notifications also to an unknown route: a skipped delivery on sink `none`.
const CFG_PAGER: &str = "[notifications.routing]\nwarning = [\"dashboard\", \"pager\"]\n";

/// Bulk rows in front of the rare matches. The lists used to stop at a scan budget of 20,000
/// rows examined, answering an empty first page with a cursor while the matches were further
/// on; they now walk the filters' indexes (a zig-zag join of every filter given), so the
/// answer no longer depends on how many rows are in front. 20,500 is past the old budget.
const BULK: usize = 20_500;

/// Walk `GET {path}?{query}&limit={limit}` with the list's cursor (`after` / `next_after` for
/// deliveries, `before_seq` / `next_before_seq` for notifications), checking every page but
/// the last is full; the items' `key` fields, in order.
async fn walk(api: &Api, path: &str, query: &str, limit: usize, key: &str) -> Vec<String> {
    let (items, next_field, cursor) = match path {
        "/v1/deliveries" => ("deliveries", "next_after", "after"),
        _ => ("notifications", "next_before_seq", "before_seq"),
    };
    let mut out = Vec::new();
    let mut at: Option<String> = None;
    for _ in 0..1000 {
        let mut q = format!("{path}?{query}&limit={limit}");
        if let Some(a) = &at {
            q = format!("{q}&{cursor}={}", encode_path(a));
        }
        let (st, body) = api.get_json(&q).await;
        assert_eq!(st, StatusCode::OK, "GET {q}: {body}");
        let page: Vec<String> = body[items]
            .as_array()
            .unwrap_or_else(|| panic!("GET {q}: {body}"))
            .iter()
            .map(|x| x[key].as_str().expect("key").to_owned())
            .collect();
        assert!(page.len() <= limit, "GET {q}: over limit: {body}");
        out.extend(page.iter().cloned());
        match &body[next_field] {
            Value::Null => return out,
            next => {
                assert_eq!(
                    page.len(),
                    limit,
                    "GET {q}: a short page before the end: {body}"
                );
                at = Some(match next {
                    Value::String(s) => s.clone(),
                    n => n.to_string(),
                });
            }
        }
    }
    panic!("GET {path}?{query}: paging did not end");
}

/// A page holds up to `limit` matches whenever that many exist past the cursor (spec section
/// 7), for every list filter and combination of them: a recipient with a handful of
/// notifications and deliveries behind 20,500 of another recipient (the oldest notifications,
/// the last delivery ids) is on the first page of `?priority=urgent&recipient=` and of
/// `?sink=app&recipient=`, and pages of 2 are full until the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rare_recipient_behind_many_rows_fills_the_first_page() {
    let s = Server::start(ServerOpts::default().config(CFG_PAGER)).await;
    let api = s.api();
    // The rare recipient first: urgent (a desktop delivery on sink `app`), warning (a skipped
    // delivery on sink `none`: same recipient, other sink) and info (no delivery).
    let mut rare = Vec::new();
    for i in 0..3 {
        rare.push(notif_ev(
            &format!("z-urgent-{i}"),
            json!({"priority": "urgent", "title": "t", "recipient": "rare"}),
        ));
    }
    for i in 0..4 {
        for p in ["warning", "info"] {
            rare.push(notif_ev(
                &format!("z-{p}-{i}"),
                json!({"priority": p, "title": "t", "recipient": "rare"}),
            ));
        }
    }
    append_ok(&api, &json!({ "events": rare })).await;
    // The bulk: urgent, sink `app`, another recipient; newer notifications, smaller ids.
    for b in 0..BULK.div_ceil(1000) {
        let batch: Vec<Value> = (b * 1000..((b + 1) * 1000).min(BULK))
            .map(|i| {
                notif_ev(
                    &format!("b-{i:05}"),
                    json!({"priority": "urgent", "title": "t", "recipient": "bulk"}),
                )
            })
            .collect();
        append_ok(&api, &json!({ "events": batch })).await;
    }
    // Routing is asynchronous: wait (bounded) for every delivery.
    wait_for(Duration::from_secs(300), "the bulk's deliveries", || {
        let api = api.clone();
        async move {
            let (_, k) = api.get_json("/v1/outbox/kpis").await;
            (k["queued"] == BULK + 3).then_some(())
        }
    })
    .await;
    wait_quiet(&api).await;

    // Notifications: priority and recipient, newest first.
    let (st, body) = api
        .get_json("/v1/notifications?priority=urgent&recipient=rare&limit=10")
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let got: Vec<&str> = body["notifications"]
        .as_array()
        .expect("notifications")
        .iter()
        .map(|n| n["notification_id"].as_str().unwrap())
        .collect();
    assert_eq!(got, ["z-urgent-2", "z-urgent-1", "z-urgent-0"], "{body}");
    assert_eq!(body["next_before_seq"], Value::Null, "{body}");
    let q = "priority=urgent&recipient=rare";
    let walked = walk(&api, "/v1/notifications", q, 2, "notification_id").await;
    assert_eq!(walked, ["z-urgent-2", "z-urgent-1", "z-urgent-0"]);
    let q = "recipient=rare";
    let walked = walk(&api, "/v1/notifications", q, 4, "notification_id").await;
    assert_eq!(walked.len(), 11, "{walked:?}");
    let q = "priority=warning&recipient=bulk";
    assert_eq!(
        walk(&api, "/v1/notifications", q, 5, "notification_id").await,
        Vec::<String>::new()
    );

    // Deliveries: sink and recipient, by id.
    let want: Vec<String> = (0..3)
        .map(|i| format!("dlv:z-urgent-{i}:desktop"))
        .collect();
    let (st, body) = api
        .get_json("/v1/deliveries?sink=app&recipient=rare&limit=10")
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let got: Vec<&str> = body["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, want, "{body}");
    assert_eq!(body["next_after"], Value::Null, "{body}");
    let walked = walk(&api, "/v1/deliveries", "sink=app&recipient=rare", 2, "id").await;
    assert_eq!(walked, want);
    // With the status and the route too, and each filter alone.
    let q = "sink=app&recipient=rare&status=queued&route=desktop";
    assert_eq!(walk(&api, "/v1/deliveries", q, 2, "id").await, want);
    let walked = walk(&api, "/v1/deliveries", "recipient=rare", 3, "id").await;
    assert_eq!(walked.len(), 7, "{walked:?}");
    let walked = walk(&api, "/v1/deliveries", "sink=none", 3, "id").await;
    let skipped: Vec<String> = (0..4).map(|i| format!("dlv:z-warning-{i}:pager")).collect();
    assert_eq!(walked, skipped);
    assert_eq!(
        walk(
            &api,
            "/v1/deliveries",
            "route=pager&status=skipped",
            10,
            "id"
        )
        .await,
        skipped
    );
    assert_eq!(
        walk(&api, "/v1/deliveries", "sink=none&recipient=bulk", 10, "id").await,
        Vec::<String>::new()
    );
}
