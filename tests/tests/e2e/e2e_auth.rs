//! Authentication and scopes: open on loopback without tokens, refusal to start open on a
//! public address, bearer tokens stored as SHA-256 with scopes enforced per route, and token
//! texts never written to the log output.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tidemark_tests::{
    Reply, Server, ServerOpts, StartError, assert_problem, random_token, sha256_hex,
};

#[tokio::test]
async fn open_on_loopback_without_tokens() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    let (st, body) = s
        .append(&json!({"event_id": "o-1", "stream": "s", "type": "t"}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let (st, body) = s
        .get_json(&format!("/v1/events?after_sequence={base}"))
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["events"][0]["event_id"], "o-1");
    let mut stream = s
        .sse(&format!("after_sequence={base}"), None)
        .await
        .expect("open stream");
    let e = stream.expect_event(Duration::from_secs(30)).await;
    assert_eq!(e.seq(), base + 1);
    assert_eq!(e.data["event_id"], "o-1");
}

#[tokio::test]
async fn refuses_to_start_open_on_a_public_address() {
    let started = tokio::time::timeout(
        Duration::from_secs(40),
        Server::try_start(ServerOpts::default().listen("0.0.0.0:0")),
    )
    .await
    .expect("the server neither started nor exited within 40 s");
    match started {
        Ok(s) => panic!(
            "the server started open on 0.0.0.0 without tokens (listening on {})",
            s.addr()
        ),
        Err(StartError::Exited { status, stderr }) => {
            assert!(
                !status.success(),
                "it must exit non-zero, exited with {status}"
            );
            assert!(
                stderr.to_lowercase().contains("token"),
                "stderr must say that a token is needed; it was:\n{stderr}"
            );
        }
        Err(e) => panic!("{e}"),
    }
}

async fn call(s: &Server, method: Method, path: &str, token: Option<&str>) -> Reply {
    let mut rb = s.client.request(method.clone(), s.url(path));
    if method == Method::POST {
        rb = rb.json(&json!({"stream": "auth", "type": "auth.t", "payload": {"n": 1}}));
    }
    if let Some(t) = token {
        rb = rb.header("Authorization", format!("Bearer {t}"));
    }
    s.send(rb).await
}

/// `HEAD` runs a route's `GET` handler (axum routes it there), so it needs what `GET` needs:
/// no token is 401, a token without the scope 403, and the scope's token gets the `GET`
/// answer's status without its body.
#[tokio::test]
async fn head_needs_what_get_needs() {
    let reader = format!("tm-read-{}", random_token(24));
    let appender = format!("tm-append-{}", random_token(24));
    let config = format!(
        "[[auth.tokens]]\nname = \"reader\"\nsha256 = \"{}\"\nscopes = [\"read\"]\n\n\
         [[auth.tokens]]\nname = \"appender\"\nsha256 = \"{}\"\nscopes = [\"append\"]\n",
        sha256_hex(&reader),
        sha256_hex(&appender),
    );
    let s = Server::start(ServerOpts::default().config(config)).await;
    for (path, found) in [
        ("/v1/events?after_sequence=0", StatusCode::OK),
        ("/v1/deliveries/none-such", StatusCode::NOT_FOUND),
        ("/v1/notifications/none-such", StatusCode::NOT_FOUND),
        ("/v1/admin/projections", StatusCode::FORBIDDEN),
        (
            "/v1/bridges/b1/deliveries?wait_ms=30000",
            StatusCode::FORBIDDEN,
        ),
    ] {
        let r = call(&s, Method::HEAD, path, None).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "HEAD {path}");
        let r = call(&s, Method::HEAD, path, Some(&appender)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "HEAD {path} with append");
        let r = call(&s, Method::HEAD, path, Some(&reader)).await;
        assert_eq!(r.status, found, "HEAD {path} with read");
    }
}

#[tokio::test]
async fn scopes_are_enforced() {
    let reader = format!("tm-read-{}", random_token(24));
    let appender = format!("tm-append-{}", random_token(24));
    let admin = format!("tm-admin-{}", random_token(24));
    let bridge = format!("tm-bridge-{}", random_token(24));
    let config = format!(
        "[[auth.tokens]]\nname = \"reader\"\nsha256 = \"{}\"\nscopes = [\"read\"]\n\n\
         [[auth.tokens]]\nname = \"appender\"\nsha256 = \"{}\"\nscopes = [\"append\"]\n\n\
         [[auth.tokens]]\nname = \"root\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n\n\
         [[auth.tokens]]\nname = \"bridge\"\nsha256 = \"{}\"\nscopes = [\"bridge\"]\n",
        sha256_hex(&reader),
        sha256_hex(&appender),
        sha256_hex(&admin),
        sha256_hex(&bridge),
    );
    // With tokens, a public address is allowed (the harness connects through loopback).
    let s = Server::start(
        ServerOpts::default()
            .listen("0.0.0.0:0")
            .config(config)
            .env("RUST_LOG", "debug"),
    )
    .await;
    // /healthz is open: the harness read the head at start without a token.
    let base = s.start_head();
    let events = "/v1/events?after_sequence=0";

    // No token, a wrong token, the hash instead of the text, another scheme.
    let wrong = random_token(30);
    let hash = sha256_hex(&admin);
    for token in [None, Some(wrong.as_str()), Some(hash.as_str())] {
        for (m, p) in [(Method::POST, "/v1/events"), (Method::GET, events)] {
            let r = call(&s, m.clone(), p, token).await;
            assert_problem(&r, 401, "unauthorized");
        }
        let r = s
            .sse_with_token("after_sequence=0", None, token)
            .await
            .err()
            .expect("the stream must be refused without a valid token");
        assert_problem(&r, 401, "unauthorized");
    }
    let r = s
        .send(
            s.client
                .get(s.url(events))
                .header("Authorization", format!("Basic {admin}")),
        )
        .await;
    assert_problem(&r, 401, "unauthorized");

    // read: can read, cannot append.
    let r = call(&s, Method::POST, "/v1/events", Some(&reader)).await;
    assert_problem(&r, 403, "forbidden_scope");
    let r = call(&s, Method::GET, events, Some(&reader)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json["latest_event_seq"], base,
        "refused appends appended nothing"
    );
    assert!(
        s.sse_with_token("after_sequence=0", None, Some(&reader))
            .await
            .is_ok(),
        "a read token opens the stream"
    );

    // append: can append, cannot read.
    let r = call(&s, Method::POST, "/v1/events", Some(&appender)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["events"][0]["seq"], base + 1);
    let r = call(&s, Method::GET, events, Some(&appender)).await;
    assert_problem(&r, 403, "forbidden_scope");
    let r = s
        .sse_with_token("after_sequence=0", None, Some(&appender))
        .await
        .err()
        .expect("an append token must not open the stream");
    assert_problem(&r, 403, "forbidden_scope");

    // bridge alone: neither.
    let r = call(&s, Method::POST, "/v1/events", Some(&bridge)).await;
    assert_problem(&r, 403, "forbidden_scope");
    let r = call(&s, Method::GET, events, Some(&bridge)).await;
    assert_problem(&r, 403, "forbidden_scope");

    // admin: both.
    let r = call(&s, Method::POST, "/v1/events", Some(&admin)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["events"][0]["seq"], base + 2);
    let r = call(&s, Method::GET, events, Some(&admin)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["latest_event_seq"], base + 2);
    let mut st = s
        .sse_with_token("after_sequence=0", None, Some(&admin))
        .await
        .expect("an admin token opens the stream");
    assert_eq!(st.expect_event(Duration::from_secs(30)).await.seq(), 1);

    // Operational endpoints stay open.
    for p in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let r = call(&s, Method::GET, p, None).await;
        assert_eq!(r.status, StatusCode::OK, "{p} without a token: {}", r.text);
    }

    let r = call(&s, Method::GET, events, Some(&admin)).await;
    assert_eq!(
        r.json["latest_event_seq"],
        base + 2,
        "only the two allowed appends landed"
    );

    let stderr = s.stderr();
    for (name, t) in [
        ("reader", &reader),
        ("appender", &appender),
        ("admin", &admin),
        ("bridge", &bridge),
        ("wrong", &wrong),
    ] {
        assert!(
            !stderr.contains(t.as_str()),
            "the {name} token text appears in the server's stderr"
        );
    }
    assert!(
        !stderr.is_empty(),
        "the server logged nothing at all; the check above is empty"
    );
}

/// The read models need `read`; projection administration needs `operator` (or `admin`).
#[tokio::test]
async fn read_models_and_projection_admin_need_their_scopes() {
    let tokens: Vec<(&str, String, &str)> = vec![
        ("reader", format!("tm-r-{}", random_token(24)), "read"),
        ("appender", format!("tm-a-{}", random_token(24)), "append"),
        ("operator", format!("tm-o-{}", random_token(24)), "operator"),
        ("root", format!("tm-x-{}", random_token(24)), "admin"),
        ("bridge", format!("tm-b-{}", random_token(24)), "bridge"),
    ];
    let config: String = tokens
        .iter()
        .map(|(name, text, scope)| {
            format!(
                "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = [\"{scope}\"]\n\n",
                sha256_hex(text)
            )
        })
        .collect();
    let s = Server::start(ServerOpts::default().config(config)).await;
    let tok = |name: &str| {
        tokens
            .iter()
            .find(|t| t.0 == name)
            .map(|t| t.1.clone())
            .expect("token")
    };
    let r = s
        .send(
            s.client
                .post(s.url("/v1/events"))
                .bearer_auth(tok("appender"))
                .json(
                    &json!({"stream": "task_events", "subject": "sc-1", "type": "task.created",
                              "payload": {"project_id": "p"}}),
                ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);

    let get = |path: &'static str, token: Option<String>| {
        let mut rb = s.client.get(s.url(path));
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        s.send(rb)
    };
    let post = |path: &'static str, token: Option<String>| {
        let mut rb = s.client.post(s.url(path));
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        s.send(rb)
    };
    for path in ["/v1/tasks", "/v1/tasks/sc-1", "/v1/notifications"] {
        assert_problem(&get(path, None).await, 401, "unauthorized");
        for name in ["appender", "bridge"] {
            let r = get(path, Some(tok(name))).await;
            assert_eq!(
                r.status,
                StatusCode::FORBIDDEN,
                "{name} on {path}: {}",
                r.text
            );
            assert_problem(&r, 403, "forbidden_scope");
        }
        for name in ["reader", "root"] {
            let r = get(path, Some(tok(name))).await;
            assert_eq!(r.status, StatusCode::OK, "{name} on {path}: {}", r.text);
        }
    }
    let r = s
        .sse_at("/v1/tasks/sc-1/stream?after_sequence=0", None, None)
        .await
        .err()
        .expect("the task stream without a token");
    assert_problem(&r, 401, "unauthorized");
    let r = s
        .sse_at(
            "/v1/tasks/sc-1/stream?after_sequence=0",
            None,
            Some(&tok("appender")),
        )
        .await
        .err()
        .expect("the task stream with an append token");
    assert_problem(&r, 403, "forbidden_scope");
    let mut st = s
        .sse_at(
            "/v1/tasks/sc-1/stream?after_sequence=0",
            None,
            Some(&tok("reader")),
        )
        .await
        .unwrap_or_else(|r| panic!("a read token opens the task stream: {}", r.text));
    assert_eq!(
        st.expect_event(Duration::from_secs(30)).await.data["subject"],
        "sc-1"
    );

    let list = "/v1/admin/projections";
    let verify = "/v1/admin/projections/tasks/verify";
    let rebuild = "/v1/admin/projections/settings/rebuild";
    assert_problem(&get(list, None).await, 401, "unauthorized");
    assert_problem(&post(verify, None).await, 401, "unauthorized");
    for name in ["reader", "appender", "bridge"] {
        assert_problem(&get(list, Some(tok(name))).await, 403, "forbidden_scope");
        assert_problem(&post(verify, Some(tok(name))).await, 403, "forbidden_scope");
        assert_problem(
            &post(rebuild, Some(tok(name))).await,
            403,
            "forbidden_scope",
        );
    }
    for name in ["operator", "root"] {
        let r = get(list, Some(tok(name))).await;
        assert_eq!(r.status, StatusCode::OK, "{name}: {}", r.text);
        for path in [verify, rebuild] {
            let r = post(path, Some(tok(name))).await;
            assert_eq!(r.status, StatusCode::OK, "{name} on {path}: {}", r.text);
            assert_eq!(r.json["identical"], true, "{}", r.text);
        }
    }
    let stderr = s.stderr();
    for (name, text, _) in &tokens {
        assert!(
            !stderr.contains(text.as_str()),
            "the {name} token text appears in the server's stderr"
        );
    }
}

/// A token with `rate = "3/m"` gets three requests, then `429 rate_limited` with `Retry-After`
/// (the seconds until one more is allowed: 20 at 3 a minute, give or take the time the test
/// took) and `RateLimit-Remaining` on every answer; another token is unaffected, and the
/// limited token's requests are refused before they act.
#[tokio::test]
async fn a_token_rate_limit_refuses_past_its_burst_and_spares_other_tokens() {
    let (limited, free) = (random_token(32), random_token(32));
    let config = format!(
        "[[auth.tokens]]\nname = \"limited\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\nrate = \"3/m\"\n\n\
         [[auth.tokens]]\nname = \"free\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
        sha256_hex(&limited),
        sha256_hex(&free),
    );
    let s = Server::start(ServerOpts::default().config(config)).await;
    let get = |token: String| {
        let s = s.api();
        async move {
            s.send(
                s.request(Method::GET, "/v1/events?after_sequence=0")
                    .bearer_auth(token),
            )
            .await
        }
    };
    for left in ["2", "1", "0"] {
        let r = get(limited.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(
            r.headers
                .get("ratelimit-remaining")
                .and_then(|v| v.to_str().ok()),
            Some(left),
            "{:?}",
            r.headers
        );
    }
    let head = s.health_head().await;
    let r = s
        .send(
            s.request(Method::POST, "/v1/events")
                .bearer_auth(&limited)
                .json(&json!({"stream": "s", "type": "t"})),
        )
        .await;
    assert_problem(&r, 429, "rate_limited");
    let wait: u64 = r
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("429 without Retry-After: {:?}", r.headers));
    assert!((1..=20).contains(&wait), "Retry-After {wait}");
    assert_eq!(
        r.headers
            .get("ratelimit-remaining")
            .and_then(|v| v.to_str().ok()),
        Some("0")
    );
    assert_eq!(
        s.health_head().await,
        head,
        "a refused request appends nothing"
    );
    for _ in 0..10 {
        let r = get(free.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert!(r.headers.get("ratelimit-remaining").is_none());
    }
    assert!(
        !s.all_stderr().contains(&limited),
        "the token text is never logged"
    );
}

/// An operator action records the token that made it (spec section 8), whatever `by` the body
/// claims.
#[tokio::test]
async fn an_operator_action_records_the_calling_token() {
    let ana = random_token(32);
    let config = format!(
        "[[auth.tokens]]\nname = \"ops-ana\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
        sha256_hex(&ana)
    );
    let mut s = Server::start(ServerOpts::default().config(config)).await;
    s.set_token(Some(&ana));
    let r = s
        .send(s.request(Method::POST, "/v1/events").json(&json!({
            "event_id": "op-1", "stream": "notifications", "subject": "op-1",
            "type": "notification.requested", "payload": {"priority": "urgent", "title": "t"}})))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let id = "dlv:op-1:desktop";
    let claimed = crate::common::wait_for(Duration::from_secs(30), "a claim to lease it", || {
        let s = s.api();
        async move {
            let r = s
                .send(
                    s.request(Method::POST, "/v1/deliveries/claim")
                        .json(&json!({"sink": "app", "owner": "w", "limit": 1, "lease_ms": 60000})),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            r.json["deliveries"]
                .as_array()
                .is_some_and(|d| !d.is_empty())
                .then_some(r.json)
        }
    })
    .await;
    assert_eq!(claimed["deliveries"][0]["id"], id);
    let post = |path: String, body: serde_json::Value| {
        let s = s.api();
        async move { s.send(s.request(Method::POST, &path).json(&body)).await }
    };
    let r = post(
        format!("/v1/deliveries/{id}/fail"),
        json!({"owner": "w", "error_code": "gone", "retryable": false}),
    )
    .await;
    assert_eq!(r.json["status"], "parked", "{}", r.text);
    let r = post(
        format!("/v1/deliveries/{id}/discard"),
        json!({"by": "mallory", "reason": "spam"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.get(&format!("/v1/deliveries/{id}")).await;
    let last = r.json["timeline"]
        .as_array()
        .and_then(|t| t.last())
        .cloned()
        .expect("a timeline");
    assert_eq!(last["event"], "discarded", "{last}");
    assert_eq!(
        last["by"], "ops-ana",
        "the token's name, not the body's: {last}"
    );
    assert!(last["owner"].is_null(), "`by`, not the lease owner: {last}");
    // A cursor reset records the token too.
    let r = post(
        "/v1/cursors/reset".to_owned(),
        json!({"consumer_id": "c-1", "stream_name": "task_events", "subject_id": "t-1",
               "last_sequence": 1, "reason": "replay from the start"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let resets = s.read_all("stream=cursors&type=cursor.reset").await;
    assert_eq!(resets.len(), 1, "{resets:?}");
    assert_eq!(resets[0]["payload"]["by"], "ops-ana", "{}", resets[0]);
}

/// Issue 17, item 4: secrets never reach the server log, at any level. The suite's servers all
/// run at debug (tidemark's crates at trace) and every server is checked when dropped against
/// the secrets the suite registered; this test drives each kind of secret through the paths
/// that log most: a valid and a wrong token, a webhook subscription whose deliveries fail, a
/// source whose upstream fails with its header configured, and the privacy key; then it
/// searches the whole log itself.
#[tokio::test]
async fn secrets_never_reach_the_log_at_any_level() {
    let token = random_token(32);
    let wrong = random_token(32);
    let webhook_secret = random_token(40);
    let source_header = tidemark_tests::secret(format!("Bearer {}", random_token(32)));
    let privacy_key = random_token(48);
    let config = format!(
        r#"
[[auth.tokens]]
name = "logs-admin"
sha256 = "{}"
scopes = ["admin"]

[privacy]
hmac_key = "env:TM_LOG_TEST_KEY"

[notifications.routes.desktop]
redact = true

[[sources]]
name = "upstream"
url = "http://127.0.0.1:9/items"
headers = {{ authorization = "env:TM_LOG_TEST_SOURCE" }}
timeout = "1s"
every = "1h"
[sources.watermark]
request_field = "after"
next = "/next"
has_more = "/more"
[sources.items]
path = "/data"
id = "/id"
"#,
        sha256_hex(&token)
    );
    let mut s = Server::start(
        ServerOpts::default()
            .config(config)
            .env("TM_LOG_TEST_KEY", &privacy_key)
            .env("TM_LOG_TEST_SOURCE", &source_header),
    )
    .await;
    s.set_token(Some(&wrong));
    let r = s.get("/v1/tasks").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    s.set_token(Some(&token));
    let r = s
        .send(
            s.request(Method::POST, "/v1/tasks/t-logs/notifications/bridges")
                .json(&json!({"subscription_id": "s-logs", "bridge_id": "b-logs",
                              "sink": {"kind": "webhook", "url": "http://127.0.0.1:9/hook",
                                       "secret": webhook_secret}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    for (id, ty, payload) in [
        ("logs-1", "task.created", json!({"project_id": "p"})),
        ("logs-2", "task.run_started", json!({"run_id": "r1"})),
        ("logs-3", "task.run_completed", json!({"run_id": "r1"})),
    ] {
        let r = s
            .append(
                &json!({"event_id": id, "stream": "task_events", "subject": "t-logs",
                           "type": ty, "payload": payload}),
            )
            .await;
        assert_eq!(r.0, StatusCode::CREATED, "{}", r.1);
    }
    let r = s
        .append(
            &json!({"event_id": "logs-n", "stream": "notifications", "subject": "logs-n",
                       "type": "notification.requested",
                       "payload": {"priority": "urgent", "title": "private", "recipient": "ana"}}),
        )
        .await;
    assert_eq!(r.0, StatusCode::CREATED, "{}", r.1);
    let r = s
        .send(s.request(Method::POST, "/v1/sources/upstream/poll"))
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    // Wait (bounded) until the webhook has failed and the source poll has failed: both log.
    crate::common::wait_for(
        Duration::from_secs(30),
        "a failed webhook attempt and a failed poll",
        || {
            let s = s.api();
            async move {
                let sub = s.get("/v1/tasks/t-logs/notifications/bridges/s-logs").await;
                let src = s.get("/v1/sources/upstream").await;
                (sub.json["cursor"]["last_error"].is_string() && src.json["last_error"].is_string())
                    .then_some(())
            }
        },
    )
    .await;
    let log = s.all_stderr();
    assert!(
        log.contains("DEBUG") || log.contains("TRACE"),
        "the server did not log at debug level"
    );
    let leaked = tidemark_tests::leaked_secrets(&log);
    assert!(leaked.is_empty(), "secrets in the log: {leaked:?}");
    for (what, v) in [
        ("token", &token),
        ("wrong token", &wrong),
        ("webhook secret", &webhook_secret),
        ("source header", &source_header),
        ("privacy key", &privacy_key),
    ] {
        assert!(!log.contains(v.as_str()), "the {what} is in the server log");
    }
}
