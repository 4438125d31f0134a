//! Operational endpoints: health, readiness, Prometheus metrics and the OpenAPI document.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tidemark_tests::{Server, ServerOpts};

use crate::common::metric_sum;

#[tokio::test]
async fn healthz_and_readyz() {
    let s = Server::start(ServerOpts::default()).await;
    let (st, body) = s.get_json("/healthz").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(body["status"], "ok", "{body}");
    assert_eq!(
        body["head"],
        s.head().await,
        "/healthz names the log head: {body}"
    );
    let (st, appended) = s
        .append(&json!({"events": [
            {"stream": "h", "type": "h.t"}, {"stream": "h", "type": "h.t"},
        ]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{appended}");
    let (_, body) = s.get_json("/healthz").await;
    assert_eq!(
        body,
        json!({"status": "ok", "head": appended["last_seq"]}),
        "/healthz follows the head"
    );
    let r = s.get("/readyz").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn metrics_count_appends() {
    let s = Server::start(ServerOpts::default()).await;
    let batch: Vec<_> = (0..3)
        .map(|i| json!({"event_id": format!("m-{i}"), "stream": "m", "type": "m.t"}))
        .collect();
    let (st, body) = s.append(&json!({ "events": batch })).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let base = s.start_head();
    let mut stream = s
        .sse(&format!("after_sequence={base}"), None)
        .await
        .expect("stream");
    assert_eq!(
        stream.expect_event(Duration::from_secs(30)).await.seq(),
        base + 1
    );

    let r = s.get("/metrics").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.content_type
            .as_deref()
            .unwrap_or("")
            .starts_with("text/plain"),
        "Prometheus text format, got {:?}",
        r.content_type
    );
    let appended = metric_sum(&r.text, "tidemark_events_appended_total")
        .unwrap_or_else(|| panic!("no tidemark_events_appended_total in:\n{}", r.text));
    assert!(
        appended >= 3.0,
        "3 events were appended, the counter says {appended}"
    );
    for name in [
        "tidemark_append_duration_seconds_bucket",
        "tidemark_append_duration_seconds_count",
        "tidemark_sse_clients",
        "tidemark_http_requests_total",
    ] {
        assert!(
            metric_sum(&r.text, name).is_some(),
            "no {name} in /metrics:\n{}",
            r.text
        );
    }
    let clients = metric_sum(&r.text, "tidemark_sse_clients").unwrap_or_default();
    assert!(
        clients >= 1.0,
        "one SSE client is connected, the gauge says {clients}"
    );
}

#[tokio::test]
async fn openapi_lists_every_path() {
    let s = Server::start(ServerOpts::default()).await;
    let (st, doc) = s.get_json("/openapi.json").await;
    assert_eq!(st, StatusCode::OK);
    let version = doc["openapi"].as_str().unwrap_or_default();
    assert!(version.starts_with("3.1"), "OpenAPI 3.1, got {version:?}");
    let paths = doc["paths"]
        .as_object()
        .unwrap_or_else(|| panic!("no `paths` object in {doc}"));
    for p in [
        "/v1/events",
        "/v1/events/stream",
        "/v1/tasks",
        "/v1/tasks/{id}",
        "/v1/tasks/{id}/stream",
        "/v1/notifications",
        "/v1/admin/projections",
        "/v1/admin/projections/{name}/rebuild",
        "/v1/admin/projections/{name}/verify",
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/deliveries",
        "/v1/deliveries/{id}",
        "/v1/deliveries/claim",
        "/v1/deliveries/complete",
        "/v1/deliveries/{id}/complete",
        "/v1/deliveries/{id}/fail",
        "/v1/deliveries/{id}/extend",
        "/v1/deliveries/{id}/retry",
        "/v1/deliveries/{id}/discard",
        "/v1/outbox/kpis",
        "/v1/cursors",
        "/v1/cursors/advance",
        "/v1/cursors/reset",
        "/v1/consumers/lag",
        "/v1/tasks/{id}/notifications/bridges",
        "/v1/tasks/{id}/notifications/bridges/{subscription_id}",
        "/v1/tasks/{id}/notifications/bridges/{subscription_id}/explain",
        "/v1/bridges/{bridge_id}/deliveries",
        "/v1/bridges/{bridge_id}/deliveries/ack",
        "/v1/bridges/{bridge_id}/deliveries/{delivery_id}/ack",
        "/v1/bridges/{bridge_id}/deliveries/{delivery_id}/nack",
    ] {
        assert!(
            paths.contains_key(p),
            "openapi.json has no path {p}; it has {:?}",
            paths.keys().collect::<Vec<_>>()
        );
    }
    assert!(
        paths["/v1/events"].get("post").is_some() && paths["/v1/events"].get("get").is_some(),
        "/v1/events documents both POST and GET: {}",
        paths["/v1/events"]
    );
    let subs = &paths["/v1/tasks/{id}/notifications/bridges"];
    assert!(
        subs.get("post").is_some() && subs.get("get").is_some(),
        "subscriptions: POST and GET on one path: {subs}"
    );
    let one = &paths["/v1/tasks/{id}/notifications/bridges/{subscription_id}"];
    assert!(
        one.get("get").is_some() && one.get("delete").is_some(),
        "subscription: GET and DELETE on one path: {one}"
    );
}

/// Stuck work is visible in metrics (spec section 10): a subscription stopped at a mismatch
/// shows up in the gauges as stopped (at once), behind, and not stalled (it has nothing it
/// could deliver).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_and_stopped_subscriptions_are_in_the_metrics() {
    let s = Server::start(ServerOpts::default().config(
        "[notifications.outbox]\nstuck_after = \"1s\"\n[notifications.desktop]\nenabled = false\n",
    ))
    .await;
    let task = |ty: &str, p: serde_json::Value| json!({"stream": "task_events", "subject": "m-task", "type": ty, "payload": p});
    let (st, body) = s
        .append(&json!({"events": [
            task("task.created", json!({"project_id": "p"})),
            task("task.run_started", json!({"run_id": "r1"})),
        ]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let api = s.api();
    let r = api
        .send(
            api.request(reqwest::Method::POST, "/v1/tasks/m-task/notifications/bridges")
                .json(&json!({"subscription_id": "m-sub", "bridge_id": "m-bridge", "sink": {"kind": "pull"}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // Completed, then failed: the completion contradicts the run's state (mismatch).
    let (st, body) = s
        .append(&json!({"events": [
            task("task.run_completed", json!({"run_id": "r1"})),
            task("task.run_failed", json!({"run_id": "r1", "error": "late"})),
        ]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = s.get("/metrics").await;
        assert_eq!(m.status, StatusCode::OK);
        let stopped = metric_sum(&m.text, "tidemark_bridge_subscriptions_stopped");
        let stalled = metric_sum(&m.text, "tidemark_consumer_cursors_stalled");
        let cursors_stopped = metric_sum(&m.text, "tidemark_consumer_cursors_stopped");
        let behind = metric_sum(&m.text, "tidemark_consumer_cursors_behind");
        let lag = metric_sum(&m.text, "tidemark_consumer_lag_events_max");
        if stopped == Some(1.0) && cursors_stopped == Some(1.0) && behind == Some(1.0) {
            assert!(
                lag.is_some_and(|l| l >= 2.0),
                "lag of the stopped cursor: {lag:?}"
            );
            assert_eq!(stalled, Some(0.0), "stopped is not stalled");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metrics never showed the stopped, stalled subscription: stopped {stopped:?}, \
             stalled {stalled:?}, behind {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, lag) = s.get_json("/v1/consumers/lag").await;
    assert_eq!(lag["stalled"], 0, "{lag}");
    assert_eq!(lag["stopped"], 1, "{lag}");
}

/// Collect every `$ref` in `v`.
fn refs<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x.as_str()) {
                    ("$ref", Some(r)) => out.push(r),
                    _ => refs(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

/// The document a client generator reads (issue 16): every operation has an `operationId`,
/// each one unique; every `$ref` resolves; every path parameter is declared on its
/// operation; every operation documents a 2xx answer.
#[tokio::test]
async fn the_openapi_document_has_unique_operation_ids_and_resolving_refs() {
    let s = Server::start(ServerOpts::default()).await;
    let (st, doc) = s.get_json("/openapi.json").await;
    assert_eq!(st, StatusCode::OK);
    let mut seen = std::collections::BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if !["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                continue;
            }
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            // A verb and what it acts on, camelCase: `getHealth`, not `health`.
            assert!(
                id.chars().all(|c| c.is_ascii_alphanumeric())
                    && id.starts_with(|c: char| c.is_ascii_lowercase())
                    && id.chars().any(|c| c.is_ascii_uppercase()),
                "{method} {path}: operationId {id:?} is not a descriptive camelCase name"
            );
            if let Some(other) = seen.insert(id.to_owned(), format!("{method} {path}")) {
                panic!("operationId {id:?} is used by {other} and {method} {path}");
            }
            let params: Vec<&str> = op["parameters"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|p| p["in"] == "path")
                        .filter_map(|p| p["name"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            for seg in path.split('/') {
                if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    assert!(
                        params.contains(&name),
                        "{method} {path}: path parameter {name} is not declared"
                    );
                }
            }
            let responses = op["responses"].as_object().expect("responses");
            assert!(
                responses.keys().any(|c| c.starts_with('2')),
                "{method} {path} documents no 2xx answer"
            );
        }
    }
    assert!(seen.len() >= 45, "{} operations", seen.len());
    // Links (create→get/act chains) name operations that exist, with their parameters.
    let mut links = 0;
    for item in doc["paths"].as_object().expect("paths").values() {
        for op in item.as_object().expect("path item").values() {
            for (status, resp) in op["responses"].as_object().into_iter().flatten() {
                for (name, link) in resp["links"].as_object().into_iter().flatten() {
                    links += 1;
                    let to = link["operationId"].as_str().expect("operationId");
                    let target = doc["paths"]
                        .as_object()
                        .expect("paths")
                        .values()
                        .flat_map(|i| i.as_object().expect("item").values())
                        .find(|o| o["operationId"] == to)
                        .unwrap_or_else(|| panic!("link {name} ({status}) to unknown {to}"));
                    let declared: Vec<&str> = target["parameters"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p["name"].as_str())
                        .collect();
                    for (p, expr) in link["parameters"].as_object().into_iter().flatten() {
                        assert!(
                            declared.contains(&p.as_str()),
                            "link {name}: {to} has no {p}"
                        );
                        let e = expr.as_str().expect("expression");
                        assert!(
                            e.starts_with("$response.body#/") || e.starts_with("$request."),
                            "link {name}: {e}"
                        );
                    }
                }
            }
        }
    }
    assert!(links >= 20, "{links} links");
    let mut all = Vec::new();
    refs(&doc, &mut all);
    for r in all {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("external $ref {r}"));
        assert!(
            doc.pointer(pointer).is_some(),
            "$ref {r} does not resolve in the document"
        );
    }
}

/// Operations (issue 16): every metric family has help text; the log's commit and fsync
/// latencies are histograms; each projection's lag and the build are exported; the outbox
/// gauges are per sink only (a sum over sinks counts each delivery once).
#[tokio::test]
async fn every_metric_family_has_help_and_the_log_has_latency_histograms() {
    let s = Server::start(ServerOpts::default()).await;
    let (st, body) = s
        .append(&json!({"event_id": "h-1", "stream": "m", "type": "m.t"}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let histograms = [
        "tidemark_log_commit_duration_seconds_bucket",
        "tidemark_log_fsync_duration_seconds_bucket",
        "tidemark_log_commit_items_bucket",
        "tidemark_build_info",
    ];
    // The writer records a group's histograms after it has answered the group's appends: a
    // scrape right after the answer may come first (a loaded machine), so wait for them.
    let mut r = s.get("/metrics").await;
    for _ in 0..200 {
        if histograms.iter().all(|n| metric_sum(&r.text, n).is_some()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        r = s.get("/metrics").await;
    }
    assert_eq!(r.status, StatusCode::OK);
    let mut families = Vec::new();
    let mut helped = Vec::new();
    for line in r.text.lines() {
        let mut w = line.split_whitespace();
        match (w.next(), w.next(), w.next()) {
            (Some("#"), Some("TYPE"), Some(name)) => families.push(name.to_owned()),
            (Some("#"), Some("HELP"), Some(name)) => helped.push(name.to_owned()),
            _ => {}
        }
    }
    assert!(families.len() > 10, "{}", r.text);
    for f in families.iter().filter(|f| f.starts_with("tidemark_")) {
        assert!(
            helped.contains(f),
            "metric family {f} has no # HELP:\n{}",
            r.text
        );
    }
    for name in histograms {
        assert!(
            metric_sum(&r.text, name).is_some(),
            "no {name} in /metrics:\n{}",
            r.text
        );
    }
    for p in ["tasks", "notifications", "deliveries"] {
        assert!(
            r.text.contains(&format!(
                "tidemark_projection_lag_events{{projection=\"{p}\"}}"
            )),
            "no lag of {p}:\n{}",
            r.text
        );
    }
    assert!(!r.text.contains("sink=\"all\""), "{}", r.text);
}

/// A 401 names the scheme (RFC 6750).
#[tokio::test]
async fn unauthorized_answers_carry_www_authenticate() {
    let (s, _) = with_a_read_token().await;
    let r = s
        .send(reqwest::Client::new().get(s.url("/v1/events")))
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    assert_eq!(
        r.headers
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer realm=\"tidemark\""),
        "{:?}",
        r.headers
    );
}

/// The console is embedded files under a policy that allows only the server itself; the page
/// talks to the public API only (its scripts name no other origin and no private path).
#[tokio::test]
async fn the_console_is_served_from_the_binary_under_a_strict_policy() {
    let s = Server::start(ServerOpts::default()).await;
    // The scripts the page loads, in its order.
    let page = s.get("/").await.text;
    let scripts: Vec<String> = page
        .split("<script src=\"")
        .skip(1)
        .map(|t| t.split('"').next().unwrap_or_default().to_owned())
        .collect();
    assert!(
        scripts.len() > 1
            && scripts
                .iter()
                .all(|p| p.starts_with("/console/") && p.ends_with(".js")),
        "{scripts:?}"
    );
    assert_eq!(
        scripts.last().map(String::as_str),
        Some("/console/app.js"),
        "app.js wires the rest: last"
    );
    let mut files = vec![
        ("/".to_owned(), "text/html", "/console/app.js"),
        ("/console/app.css".to_owned(), "text/css", ".tile"),
    ];
    files.extend(
        scripts
            .iter()
            .map(|p| (p.clone(), "text/javascript", "'use strict';")),
    );
    for (path, ty, needle) in files {
        let path = path.as_str();
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
        let h = |n: &str| {
            r.headers
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert!(
            h("content-type").starts_with(ty),
            "{path}: {}",
            h("content-type")
        );
        let csp = h("content-security-policy");
        assert!(
            csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
            "{path}: {csp}"
        );
        assert_eq!(h("x-content-type-options"), "nosniff", "{path}");
        assert!(r.text.contains(needle), "{path} lacks {needle}");
        assert!(
            !r.text.contains("http://") && !r.text.contains("https://"),
            "{path} refers to another origin"
        );
    }
    // Its icon, linked from the page and where browsers look without a link: every load of
    // the page used to log a 404 for /favicon.ico.
    for path in ["/console/favicon.svg", "/favicon.ico"] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
        let ty = r.content_type.as_deref().unwrap_or_default();
        assert!(ty.starts_with("image/svg+xml"), "{path}: {ty}");
        assert!(r.text.starts_with("<svg"), "{path}: {}", r.text);
    }
    assert!(
        s.get("/")
            .await
            .text
            .contains(r#"rel="icon" href="/console/favicon.svg""#),
        "the page links its icon"
    );
    // An unknown file is a 404 problem, not the page.
    let r = s.get("/console/nope.js").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert_eq!(r.json["code"], "not_found", "{}", r.text);
    // Every path the scripts call is a documented operation under /v1.
    let mut js = String::new();
    for p in &scripts {
        js.push_str(&s.get(p).await.text);
    }
    let doc = s.get("/openapi.json").await.json;
    let paths: Vec<&String> = doc["paths"].as_object().expect("paths").keys().collect();
    for used in [
        "/v1/whoami",
        "/v1/outbox/kpis",
        "/v1/deliveries",
        "/v1/events/stream",
        "/v1/consumers/lag",
        "/v1/sources",
        "/v1/admin/projections",
        "/v1/tasks",
    ] {
        assert!(js.contains(used), "the console does not use {used}");
        assert!(
            paths.iter().any(|p| p.as_str() == used),
            "{used} is not in the OpenAPI document"
        );
    }
}

/// `X-Request-ID` (section 8): the client's id (1–128 printable characters) is echoed, else
/// the server makes one (a UUID), on every answer — a success, a 404, a 401, a 405 — and it
/// is on the request's log lines.
#[tokio::test]
async fn every_answer_carries_a_request_id_and_the_log_shows_it() {
    let (s, token) = with_a_read_token().await;
    let c = reqwest::Client::new();
    let id_of = |r: &tidemark_tests::Reply| {
        r.headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let given = "req-7f3a 2026/11/27";
    let r = s
        .send(
            c.get(s.url("/v1/whoami"))
                .bearer_auth(&token)
                .header("x-request-id", given),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(id_of(&r).as_deref(), Some(given));
    for (what, rb) in [
        ("no token", c.get(s.url("/v1/events"))),
        ("no such path", c.get(s.url("/v1/nope")).bearer_auth(&token)),
        (
            "wrong method",
            c.patch(s.url("/v1/events")).bearer_auth(&token),
        ),
        ("health", c.get(s.url("/healthz"))),
        (
            "too long an id",
            c.get(s.url("/healthz"))
                .header("x-request-id", "x".repeat(129)),
        ),
    ] {
        let r = s.send(rb).await;
        let id = id_of(&r).unwrap_or_else(|| panic!("{what}: no x-request-id: {:?}", r.headers));
        assert!(
            uuid::Uuid::parse_str(&id).is_ok(),
            "{what}: a made id is a UUID, not {id:?}"
        );
    }
    // Two answers without an id get different ones.
    let a = id_of(&s.send(c.get(s.url("/healthz"))).await);
    let b = id_of(&s.send(c.get(s.url("/healthz"))).await);
    assert_ne!(a, b);
    // A refusal the server logs at info names the request.
    let r = s
        .send(
            c.get(s.url("/v1/admin/projections"))
                .bearer_auth(&token)
                .header("x-request-id", "req-scope-1"),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    // On the request's log lines.
    let log = s.stderr();
    assert!(
        log.lines()
            .any(|l| l.contains("request refused: missing scope")
                && l.contains("request_id=req-scope-1")),
        "the refusal's log line names the request"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("request_id=\"req-7f3a 2026/11/27\"") && l.contains("/v1/whoami")),
        "no log line of the request carries its id: {:?}",
        log.lines()
            .filter(|l| l.contains("whoami"))
            .collect::<Vec<_>>()
    );
}

/// CORS (section 8): with `[server] cors_origins`, a listed origin's preflight is answered
/// with the methods and headers a client needs, and its requests see `x-request-id`,
/// `retry-after` and the `ratelimit-*` headers; another origin gets no CORS headers (its
/// browser refuses). Without the setting nothing is allowed and `OPTIONS` is 405.
#[tokio::test]
async fn cors_allows_only_the_listed_origins() {
    let s = Server::start(
        ServerOpts::default().config("[server]\ncors_origins = [\"https://ops.example.org\"]\n"),
    )
    .await;
    let c = reqwest::Client::new();
    let preflight = |origin: &str| {
        c.request(reqwest::Method::OPTIONS, s.url("/v1/events"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type, x-request-id",
            )
    };
    let h = |r: &tidemark_tests::Reply, k: &str| {
        r.headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    let r = s.send(preflight("https://ops.example.org")).await;
    assert!(r.status.is_success(), "{} {:?}", r.status, r.headers);
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        "https://ops.example.org"
    );
    let allowed = h(&r, "access-control-allow-headers");
    for k in [
        "authorization",
        "content-type",
        "last-event-id",
        "x-request-id",
    ] {
        assert!(allowed.contains(k), "{k} not allowed: {allowed}");
    }
    assert!(h(&r, "access-control-allow-methods").contains("post"));
    let r = s
        .send(
            c.get(s.url("/v1/events"))
                .header("origin", "https://ops.example.org"),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        "https://ops.example.org"
    );
    let exposed = h(&r, "access-control-expose-headers");
    for k in ["x-request-id", "retry-after", "ratelimit-remaining"] {
        assert!(exposed.contains(k), "{k} not exposed: {exposed}");
    }
    for r in [
        s.send(preflight("https://evil.example.org")).await,
        s.send(
            c.get(s.url("/v1/events"))
                .header("origin", "https://evil.example.org"),
        )
        .await,
    ] {
        assert_eq!(h(&r, "access-control-allow-origin"), "", "{:?}", r.headers);
    }
    // Not configured: nothing allowed.
    let plain = Server::start(ServerOpts::default()).await;
    let r = plain
        .send(
            c.request(reqwest::Method::OPTIONS, plain.url("/v1/events"))
                .header("origin", "https://ops.example.org")
                .header("access-control-request-method", "POST"),
        )
        .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.text);
    assert_eq!(h(&r, "access-control-allow-origin"), "");
}

/// Unknown keys anywhere in the configuration refuse the start, naming the key (section 8):
/// inside a route, its digest and retry, the notification sections, and `cors_origins` that
/// is not an origin.
#[test]
fn unknown_configuration_keys_refuse_the_start_naming_the_key() {
    let run = |toml: &str| crate::common::refused_start(toml, &[]);
    for (toml, key) in [
        (
            "[notifications.routes.desktop]\nquiet_hour = [\"22:00\", \"07:00\"]\n",
            "notifications.routes.desktop.quiet_hour",
        ),
        (
            "[notifications.routes.desktop]\ndigest = { window = \"5m\", max_item = 5 }\n",
            "notifications.routes.desktop.digest.max_item",
        ),
        (
            "[notifications.routes.desktop.retry]\nmax_attempt = 3\n",
            "notifications.routes.desktop.retry.max_attempt",
        ),
        (
            "[notifications.desktop]\nsound = true\n",
            "notifications.desktop.sound",
        ),
        (
            "[notifications]\nrouting_x = 1\n",
            "notifications.routing_x",
        ),
        ("[server]\ncors_origin = []\n", "cors_origin"),
        (
            "[server]\ncors_origins = [\"https://ops.example.org/path\"]\n",
            "server.cors_origins",
        ),
    ] {
        let err = run(toml);
        assert!(err.contains(key), "{toml}: {err}");
    }
}

/// A server whose one token, `r`, has the read scope; and that token.
async fn with_a_read_token() -> (Server, String) {
    let token = tidemark_tests::random_token(24);
    let config = format!(
        "[[auth.tokens]]\nname = \"r\"\nsha256 = \"{}\"\nscopes = [\"read\"]\n",
        tidemark_tests::sha256_hex(&token)
    );
    (
        Server::start(ServerOpts::default().config(config)).await,
        token,
    )
}

/// A server started and stopped cleanly (its data directory kept).
async fn stopped_server() -> Server {
    let mut s = Server::start(ServerOpts::default()).await;
    s.sigterm();
    assert!(s.wait_exit(Duration::from_secs(60)).await.success());
    s
}

/// `tidemark serve` on `data`, run behind `prefix` (e.g. `setpriv …`), which must refuse to
/// start (exit 1): its stderr.
async fn refused_serve(prefix: &[&str], data: &std::path::Path) -> String {
    let binary = tidemark_tests::binary();
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = tokio::process::Command::new(first);
            c.args(rest).arg(&binary);
            c
        }
        None => tokio::process::Command::new(&binary),
    };
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .env_remove("TIDEMARK_CONFIG")
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .expect("the refused server exits")
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
}

/// A second `tidemark serve` on a data directory a running server holds is refused as "in use
/// by another tidemark process", exit 1, and never with advice to restore a backup (section 1,
/// I10: that advice is for damage only, and following it here would overwrite good data). The
/// running server is untouched.
#[tokio::test]
async fn a_second_server_on_a_held_data_directory_is_told_it_is_in_use() {
    let s = tidemark_tests::Server::start(tidemark_tests::ServerOpts::default()).await;
    let err = refused_serve(&[], s.data_dir()).await;
    // The holder by its pid (found in /proc: the suite runs as root, or as the server's user).
    assert!(
        err.contains(&format!("in use by another process (pid {})", s.pid())),
        "{err}"
    );
    assert!(err.contains("nothing is damaged"), "{err}");
    assert!(!err.to_lowercase().contains("backup"), "{err}");
    assert!(!err.contains("unreadable"), "{err}");
    let r = s.get("/healthz").await;
    assert_eq!(r.status, reqwest::StatusCode::OK, "{}", r.text);
}

/// A data directory its user cannot open (a restore run as root leaves `root:root` files, 0644,
/// that the service's user cannot write) is refused with the path, its owner and mode, the user
/// tidemark runs as and the `chown` that fixes it; never with advice to restore a backup. Run as
/// root (as CI runs the suite): the refused server runs as `nobody` through `setpriv`.
#[tokio::test]
async fn a_data_directory_its_user_cannot_open_names_the_user_and_the_owner() {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        nix::unistd::getuid().is_root(),
        "this test runs as root (CI does) to start a server as another user"
    );
    let s = stopped_server().await;
    // The directories traversable by all, as /var/lib is: only the files are root's.
    for d in [s.data_dir(), s.data_dir().parent().unwrap()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let as_nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let err = refused_serve(&as_nobody, s.data_dir()).await;
    let log = s.data_dir().join("log.redb");
    for want in [
        format!("cannot open {}", log.display()),
        "Permission denied".to_owned(),
        "tidemark runs as user nobody (uid 65534)".to_owned(),
        format!("{} belongs to root (uid 0) with mode 644", log.display()),
        format!("chown -R nobody: {}", s.data_dir().display()),
        "nothing is damaged".to_owned(),
    ] {
        assert!(err.contains(&want), "{want:?} in: {err}");
    }
    assert!(!err.to_lowercase().contains("backup"), "{err}");
}

/// Advice to restore from a backup is given for damage the log has verified, and only then: a
/// log file whose header is overwritten is refused as damaged, naming the restore.
#[tokio::test]
async fn a_damaged_log_file_is_the_one_refusal_that_advises_a_restore() {
    use std::io::{Seek, Write};
    let s = stopped_server().await;
    let log = s.data_dir().join("log.redb");
    let mut f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    f.write_all(&[0x5a; 64]).unwrap();
    drop(f);
    let err = refused_serve(&[], s.data_dir()).await;
    assert!(err.contains(&log.display().to_string()), "{err}");
    assert!(err.contains("damaged"), "{err}");
    assert!(err.contains("restore it from a backup"), "{err}");
}

/// `docs/http-contract.md` says what the binary serves (issue 53): its "Every operation" table
/// lists each operation of `/openapi.json` with its operationId, scope and statuses, no more
/// and no less; and every refusal code of the engine is in one of its errors tables.
#[tokio::test]
async fn the_http_contract_lists_every_operation_and_code() {
    let s = Server::start(ServerOpts::default()).await;
    let doc = s.get("/openapi.json").await.json;
    let mut want = std::collections::BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            let scope = match op["security"].as_array() {
                None => "open".to_owned(),
                Some(reqs) if reqs.is_empty() => "open".to_owned(),
                Some(reqs) => {
                    let scopes: Vec<&str> = reqs
                        .iter()
                        .filter_map(|r| r.as_object())
                        .flat_map(|r| r.values())
                        .flat_map(|v| v.as_array().into_iter().flatten())
                        .filter_map(|v| v.as_str())
                        .collect();
                    if scopes.is_empty() {
                        "any token".to_owned()
                    } else {
                        scopes.join(", ")
                    }
                }
            };
            let mut statuses: Vec<&String> = op["responses"]
                .as_object()
                .expect("responses")
                .keys()
                .collect();
            statuses.sort();
            want.insert(format!(
                "| {} | `{path}` | `{}` | {scope} | {} |",
                method.to_uppercase(),
                op["operationId"].as_str().expect("operationId"),
                statuses
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/http-contract.md"),
    )
    .expect("docs/http-contract.md");
    let table = text
        .split("## Every operation")
        .nth(1)
        .expect("an \"Every operation\" section");
    let have: std::collections::BTreeSet<String> = table
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("| `/"))
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = want.difference(&have).collect();
    let stale: Vec<&String> = have.difference(&want).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/http-contract.md's operations differ from /openapi.json.\nmissing or changed:\n{}\n\
         not served:\n{}\nthe table as served:\n| method | path | operationId | scope | statuses |\n|---|---|---|---|---|\n{}",
        missing
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        stale
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        want.iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The codes of the errors tables: `| <status> | code / code |`.
    let codes: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| {
            let mut cells = l.split('|').map(str::trim).skip(1);
            let status = cells.next()?;
            (status.len() == 3 && status.bytes().all(|b| b.is_ascii_digit()))
                .then(|| cells.next())
                .flatten()
        })
        .flat_map(|c| c.split(['/', ',']).map(str::trim))
        .collect();
    let undocumented: Vec<&str> = tidemark_engine::Rejection::ALL
        .iter()
        .map(|r| r.code())
        .filter(|c| !codes.contains(c))
        .collect();
    assert!(
        undocumented.is_empty(),
        "refusal codes missing from the errors tables of docs/http-contract.md: {undocumented:?}"
    );
}
