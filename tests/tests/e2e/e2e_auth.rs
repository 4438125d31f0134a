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
    let (st, body) = s
        .append(&json!({"event_id": "o-1", "stream": "s", "type": "t"}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let (st, body) = s.get_json("/v1/events?after_sequence=0").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["events"][0]["event_id"], "o-1");
    let mut stream = s.sse("after_sequence=0", None).await.expect("open stream");
    assert_eq!(stream.expect_event(Duration::from_secs(30)).await.seq(), 1);
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
        r.json["latest_event_seq"], 0,
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
    assert_eq!(r.json["events"][0]["seq"], 1);
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
    assert_eq!(r.json["events"][0]["seq"], 2);
    let r = call(&s, Method::GET, events, Some(&admin)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["latest_event_seq"], 2);
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
        r.json["latest_event_seq"], 2,
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
