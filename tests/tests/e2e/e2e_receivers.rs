//! The receivers people have (spec section 4, "What a receiver accepts"): a webhook route's
//! `body` preset (`slack`, `teams`, `discord`) POSTs what each service documents for its
//! incoming webhooks, checked here by receivers on loopback that refuse (400) any other
//! shape, as the services do; a template renders the notification, signed over the bytes
//! sent, with the route's `headers`; a template that cannot render is refused when the route
//! is set; `POST /v1/routes/{name}/preview` renders without sending.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode as AxStatus};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts, assert_problem};

use crate::common::{append_ok, notif_ev, post_json, serve_local, wait_for};

type Hit = (String, HeaderMap, Vec<u8>, u16);

/// Whether `body` is what the service at `path` documents for an incoming webhook.
fn documented(path: &str, v: &Value) -> bool {
    let s = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
    match path {
        // Slack: `text`, or `blocks` of known types whose text objects are mrkdwn/plain_text.
        "/slack" => {
            let blocks_ok = v["blocks"].as_array().is_some_and(|b| {
                b.len() <= 50
                    && b.iter().all(|b| match b["type"].as_str() {
                        Some("section") => {
                            ["mrkdwn", "plain_text"]
                                .contains(&b["text"]["type"].as_str().unwrap_or(""))
                                && b["text"]["text"]
                                    .as_str()
                                    .is_some_and(|t| t.chars().count() <= 3000)
                        }
                        Some("context") => b["elements"].as_array().is_some_and(|e| !e.is_empty()),
                        Some("header") => b["text"]["type"] == "plain_text",
                        _ => false,
                    })
            });
            s(&v["text"]) && (v.get("blocks").is_none() || blocks_ok)
        }
        // Teams: a message whose attachment is an Adaptive Card.
        "/teams" => {
            let a = &v["attachments"][0];
            v["type"] == "message"
                && a["contentType"] == "application/vnd.microsoft.card.adaptive"
                && a["content"]["type"] == "AdaptiveCard"
                && s(&a["content"]["version"])
                && a["content"]["body"]
                    .as_array()
                    .is_some_and(|b| b.iter().all(|e| e["type"].as_str().is_some()))
        }
        // Discord: `content` (≤ 2000) or `embeds` (≤ 10; title ≤ 256, description ≤ 4096).
        "/discord" => {
            let content_ok = v["content"]
                .as_str()
                .is_none_or(|c| c.chars().count() <= 2000);
            let embeds_ok = v["embeds"].as_array().is_none_or(|e| {
                e.len() <= 10
                    && e.iter().all(|e| {
                        e["title"].as_str().is_none_or(|t| t.chars().count() <= 256)
                            && e["description"]
                                .as_str()
                                .is_none_or(|t| t.chars().count() <= 4096)
                    })
            });
            (s(&v["content"]) || v["embeds"].as_array().is_some_and(|e| !e.is_empty()))
                && content_ok
                && embeds_ok
        }
        _ => true,
    }
}

async fn receivers() -> (Arc<Mutex<Vec<Hit>>>, u16) {
    let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
    let h = hits.clone();
    let app = axum::Router::new().fallback(axum::routing::post(
        move |uri: axum::http::Uri, headers: HeaderMap, body: axum::body::Bytes| {
            let h = h.clone();
            async move {
                let path = uri.path().to_owned();
                let json_ok = headers
                    .get("content-type")
                    .is_some_and(|c| c.as_bytes().starts_with(b"application/json"));
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let ok = path == "/plain" || json_ok && documented(&path, &v);
                let status = if ok {
                    AxStatus::OK
                } else {
                    AxStatus::BAD_REQUEST
                };
                h.lock()
                    .unwrap()
                    .push((path, headers, body.to_vec(), status.as_u16()));
                status
            }
        },
    ));
    let port = serve_local(app).await.port();
    (hits, port)
}

const SECRET: &str = "whsec_receivers_test_secret";

async fn put_route(s: &Server, name: &str, route: Value) -> tidemark_tests::Reply {
    s.send(
        s.request(reqwest::Method::PUT, &format!("/v1/routes/{name}"))
            .json(&json!({"route": route, "reason": "the receivers test"})),
    )
    .await
}

#[tokio::test]
async fn each_receiver_gets_the_body_it_accepts_signed_as_sent() {
    let (hits, port) = receivers().await;
    let hook = |p: &str| format!("http://127.0.0.1:{port}{p}");
    // The README's example: a file route named teams, with body = "teams".
    let cfg = format!(
        r#"
[notifications.routing]
urgent = ["dashboard", "teams"]
[notifications.routes.teams]
sink = "webhook"
url = "{}"
body = "teams"
"#,
        hook("/teams")
    );
    let s = Server::start(
        ServerOpts::default()
            .config(cfg)
            .env("TEST_HOOK_TOKEN", "token-from-env"),
    )
    .await;
    for (name, route) in [
        (
            "slack",
            json!({"sink": "webhook", "url": hook("/slack"), "body": "slack"}),
        ),
        (
            "discord",
            json!({"sink": "webhook", "url": hook("/discord"), "body": "discord"}),
        ),
        (
            "custom",
            json!({"sink": "webhook", "url": hook("/custom"), "secret": SECRET,
                   "body": {"template": r#"{"msg": {{ notification.title }}, "who": {{ notification.recipient }}, "task": {{ task.id }}, "link": {{ console_url }}}"#},
                   "headers": {"X-Team": "ops", "Authorization": "env:TEST_HOOK_TOKEN"}}),
        ),
        (
            "plain",
            json!({"sink": "webhook", "url": hook("/plain"),
                   "body": {"template": "{{ notification.priority|upper }}: {{ notification.title }}", "content_type": "text/plain; charset=utf-8"}}),
        ),
    ] {
        let mut r = route;
        r["priorities"] = json!(["urgent"]);
        let put = put_route(&s, name, r).await;
        assert_eq!(put.status, StatusCode::OK, "{name}: {}", put.text);
    }
    // Served as set, with the header values hidden.
    let got = s.get("/v1/routes/custom").await;
    assert_eq!(
        got.json["route"]["headers"]["X-Team"], "***",
        "{}",
        got.text
    );
    assert_eq!(
        got.json["route"]["headers"]["Authorization"],
        "env:TEST_HOOK_TOKEN"
    );
    assert!(!got.text.contains("token-from-env") && !got.text.contains(SECRET));

    append_ok(
        &s,
        &notif_ev(
            "rcv-1",
            json!({"priority": "urgent", "title": "Build \"1042\" failed", "body": "3 tests failed",
                   "recipient": "ana@example.org", "task_id": "t-rcv"}),
        ),
    )
    .await;
    let all = wait_for(Duration::from_secs(30), "five receivers", || async {
        let h = hits.lock().unwrap().clone();
        let paths: std::collections::BTreeSet<String> = h.iter().map(|x| x.0.clone()).collect();
        (paths.len() == 5).then_some(h)
    })
    .await;
    for (path, headers, body, status) in &all {
        assert_eq!(
            *status,
            200,
            "{path} refused {}",
            String::from_utf8_lossy(body)
        );
        assert!(
            headers.get("webhook-id").is_some(),
            "{path}: the Standard Webhooks id"
        );
    }
    let by = |p: &str| all.iter().find(|h| h.0 == p).unwrap().clone();
    let teams = strict_body(&by("/teams").2);
    let card = &teams["attachments"][0]["content"];
    assert_eq!(card["body"][0]["text"], "Build \"1042\" failed");
    let link = card["actions"][0]["url"].as_str().unwrap();
    assert!(
        link.starts_with("http://127.0.0.1:")
            && link.ends_with("/console#deliveries/dlv:rcv-1:teams"),
        "{link}"
    );
    let (_, headers, body, _) = by("/custom");
    let v = strict_body(&body);
    assert_eq!(v["msg"], "Build \"1042\" failed");
    assert_eq!(v["who"], "ana@example.org");
    assert_eq!(v["task"], "t-rcv");
    assert_eq!(headers["x-team"], "ops");
    assert_eq!(headers["authorization"], "token-from-env");
    tidemark_client::webhooks::verify(&[SECRET], &headers, &body)
        .expect("the signature covers the body sent");
    let (_, headers, body, _) = by("/plain");
    assert_eq!(body, b"URGENT: Build \"1042\" failed");
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");

    // The preview: the sample, or the delivery; nothing sent.
    let before = hits.lock().unwrap().len();
    let p = post_json(&s, "/v1/routes/custom/preview", &json!({})).await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.text);
    let sample = tidemark_tests::strict_json(p.json["body"].as_str().unwrap()).unwrap();
    assert_eq!(sample["msg"], "Build 1042 failed on main");
    assert_eq!(p.json["headers"]["X-Team"], "***");
    let p = post_json(
        &s,
        "/v1/routes/custom/preview",
        &json!({"delivery_id": "dlv:rcv-1:custom"}),
    )
    .await;
    assert!(
        p.json["body"].as_str().unwrap().contains("ana@example.org"),
        "{}",
        p.text
    );
    let p = post_json(&s, "/v1/routes/teams/preview", &json!({})).await;
    assert!(
        p.json["body"].as_str().unwrap().contains("AdaptiveCard"),
        "{}",
        p.text
    );
    let p = post_json(
        &s,
        "/v1/routes/custom/preview",
        &json!({"delivery_id": "dlv:none:custom"}),
    )
    .await;
    assert_problem(&p, 404, "delivery_not_found");
    let p = post_json(&s, "/v1/routes/desktop/preview", &json!({})).await;
    assert_problem(&p, 409, "not_a_webhook_route");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        hits.lock().unwrap().len(),
        before,
        "a preview sends nothing"
    );

    // Refused when set, naming why; nothing changes.
    let head = s.head().await;
    for (route, why) in [
        (
            json!({"sink": "webhook", "url": hook("/x"), "body": {"template": "{{ notification.titel }}"}}),
            "route.body",
        ),
        (
            json!({"sink": "webhook", "url": hook("/x"), "body": {"template": "{\"t\": \"{{ notification.title }}\"}"}}),
            "not JSON",
        ),
        (
            json!({"sink": "webhook", "url": hook("/x"), "body": "msteams"}),
            "route.body",
        ),
        (
            json!({"sink": "webhook", "url": hook("/x"), "headers": {"Content-Type": "text/plain"}}),
            "route.headers",
        ),
        (
            json!({"sink": "webhook", "url": hook("/x"), "headers": {"X-Key": "env:TEST_NOT_SET_HERE"}}),
            "TEST_NOT_SET_HERE",
        ),
        (json!({"sink": "app", "body": "slack"}), "route.body"),
    ] {
        let r = put_route(&s, "bad", route.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{route}: {}",
            r.text
        );
        assert!(r.text.contains(why), "{route}: {}", r.text);
    }
    assert_eq!(s.head().await, head, "no refusal appended anything");

    // Headers sent back as served keep their values.
    let put = put_route(
        &s,
        "custom",
        json!({"headers": {"X-Team": "***", "Authorization": "env:TEST_HOOK_TOKEN", "X-New": "1"}}),
    )
    .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.text);
    append_ok(
        &s,
        &notif_ev(
            "rcv-2",
            json!({"priority": "urgent", "title": "second", "task_id": "t-rcv"}),
        ),
    )
    .await;
    let (_, headers, _, _) = wait_for(
        Duration::from_secs(30),
        "the second custom POST",
        || async {
            hits.lock()
                .unwrap()
                .iter()
                .filter(|h| h.0 == "/custom")
                .nth(1)
                .cloned()
        },
    )
    .await;
    assert_eq!(headers["x-team"], "ops", "kept");
    assert_eq!(headers["x-new"], "1");
}

/// A body tidemark sent, read as a strict receiver reads it (a key named twice is refused).
fn strict_body(body: &[u8]) -> Value {
    tidemark_tests::strict_json(std::str::from_utf8(body).expect("UTF-8"))
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}
