//! Scopes from one table (spec section 8): every operation of `/openapi.json` declares the scope
//! it needs as its `security` requirement; this test reads that table from the running server,
//! checks it against the spec's table, and tries every operation with a token of every scope
//! and with none: no token → 401, a token without the scope → 403 `forbidden_scope` (nothing
//! done), the scope or `admin` → past authorization. `GET /v1/whoami` answers who is calling.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use tidemark_tests::{Server, ServerOpts, random_token, sha256_hex};

const SCOPES: [&str; 5] = ["append", "read", "bridge", "operator", "admin"];

/// The spec's table: the one scope each operation needs ("" for any valid token).
fn spec_scope(method: &str, path: &str) -> &'static str {
    match (method, path) {
        ("get", "/v1/whoami") => "",
        ("post", "/v1/events") => "append",
        ("post", "/v1/cursors/reset")
        | ("post", "/v1/sources/{name}/reset")
        | ("post", "/v1/admin/retention/run")
        | ("post", "/v1/admin/backup")
        // The same backup streamed to the caller (issue 40): the whole log, as the backup.
        | ("get", "/v1/admin/backup/stream")
        | ("put" | "delete", "/v1/lists/{name}")
        | ("put" | "delete", "/v1/routes/{name}")
        // Route writes are admin (section 8); the preview shows what a route sends, with its
        // headers (masked), so it is admin too.
        | ("post", "/v1/routes/{name}/preview")
        // Tenants are created and removed by the deployment's admins (section 20); the
        // directory is read by its operators.
        | ("post", "/v1/tenants" | "/v1/tenants/{name}/move")
        | ("delete", "/v1/tenants/{name}") => "admin",
        ("get", "/v1/tenants" | "/v1/tenants/{name}" | "/v1/shards") => "operator",
        (_, p) if p.starts_with("/v1/admin/") => "operator",
        ("post", p) if p.ends_with("/retry") || p.ends_with("/discard") || p.ends_with("/resend") => {
            "operator"
        }
        ("post", "/v1/deliveries/recover")
        | ("post", "/v1/outbox/endpoints/{route}/disable")
        | ("post", "/v1/outbox/endpoints/{route}/enable") => "operator",
        ("post", p)
            if p.starts_with("/v1/sources/")
                && (p.ends_with("/poll") || p.ends_with("/pause") || p.ends_with("/resume")) =>
        {
            "operator"
        }
        // Pull, ack, nack of bridges; claims and settlements of deliveries; cursor advances;
        // creating and deleting bridge subscriptions.
        (_, p) if p.starts_with("/v1/bridges/") => "bridge",
        ("post", p) if p.starts_with("/v1/deliveries") => "bridge",
        ("post", "/v1/cursors/advance") => "bridge",
        ("post" | "delete", p)
            if p.starts_with("/v1/tasks/") && p.contains("/notifications/bridges") =>
        {
            "bridge"
        }
        ("get", p) if p.starts_with("/v1/") => "read",
        (m, p) => panic!("the spec's table has no scope for {m} {p}"),
    }
}

#[tokio::test]
async fn every_route_is_tried_with_every_scope() {
    let tokens: Vec<(&str, String)> = SCOPES
        .iter()
        .map(|s| (*s, format!("tm-{s}-{}", random_token(24))))
        .collect();
    let config: String = tokens
        .iter()
        .map(|(scope, text)| {
            format!(
                "[[auth.tokens]]\nname = \"tok-{scope}\"\nsha256 = \"{}\"\nscopes = [\"{scope}\"]\n\n",
                sha256_hex(text)
            )
        })
        .collect();
    let s = Server::start(ServerOpts::default().config(config)).await;
    let doc = s.get("/openapi.json").await.json;
    let paths = doc["paths"].as_object().expect("paths");
    let mut tried = 0;
    for (path, item) in paths {
        for (method, op) in item.as_object().expect("path item") {
            let Some(security) = op.get("security") else {
                assert!(
                    !path.starts_with("/v1/"),
                    "{method} {path} has no scope in the OpenAPI document"
                );
                continue;
            };
            let declared: Vec<&str> = security[0]["bearer"]
                .as_array()
                .unwrap_or_else(|| panic!("{method} {path}: security {security}"))
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            let declared = declared.first().copied().unwrap_or("");
            assert_eq!(
                declared,
                spec_scope(method, path),
                "{method} {path} is served under another scope than the spec's table says"
            );
            // Path parameters filled with a name that exists nowhere; an empty JSON body.
            let concrete = path
                .split('/')
                .map(|seg| {
                    if seg.starts_with('{') {
                        "scope-test"
                    } else {
                        seg
                    }
                })
                .collect::<Vec<_>>()
                .join("/");
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            for token in std::iter::once(None).chain(tokens.iter().map(Some)) {
                let mut rb = s.client.request(m.clone(), s.url(&concrete));
                if m == Method::POST {
                    rb = rb.json(&json!({}));
                }
                if let Some((_, text)) = token {
                    rb = rb.bearer_auth(text);
                }
                // Headers only: SSE and long polls would not end by themselves.
                let resp = tokio::time::timeout(Duration::from_secs(30), rb.send())
                    .await
                    .unwrap_or_else(|_| panic!("{method} {concrete}: no answer"))
                    .unwrap_or_else(|e| panic!("{method} {concrete}: {e}"));
                let status = resp.status().as_u16();
                let code = if status == 401 || status == 403 {
                    // Read as every answer of the suite is: a duplicate key fails the test.
                    tidemark_tests::Reply::read(resp)
                        .await
                        .ok()
                        .and_then(|r| r.code().map(str::to_owned))
                } else {
                    None
                };
                let who = token.map_or("no token", |(scope, _)| scope);
                match token {
                    None => assert_eq!(
                        (status, code.as_deref()),
                        (401, Some("unauthorized")),
                        "{method} {concrete} without a token"
                    ),
                    Some((scope, _))
                        if declared.is_empty() || *scope == declared || *scope == "admin" =>
                    {
                        assert!(
                            status != 401 && status != 403,
                            "{method} {concrete} with {who}: {status} {code:?}"
                        );
                    }
                    Some(_) => assert_eq!(
                        (status, code.as_deref()),
                        (403, Some("forbidden_scope")),
                        "{method} {concrete} with {who} (needs {declared})"
                    ),
                }
                tried += 1;
            }
        }
    }
    assert!(
        tried >= 6 * 34,
        "only {tried} requests: the table looks empty"
    );
    // Nothing was appended by a refused request (a token without `append` tried POST /events).
    let head = s.health_head().await;
    assert_eq!(
        head,
        s.start_head(),
        "a refused or invalid request appended events"
    );
}

#[tokio::test]
async fn whoami_names_the_token_and_its_scopes() {
    let text = format!("tm-who-{}", random_token(24));
    let config = format!(
        "[[auth.tokens]]\nname = \"slack-bridge\"\nsha256 = \"{}\"\nscopes = [\"bridge\", \"read\"]\n",
        sha256_hex(&text)
    );
    let s = Server::start(ServerOpts::default().config(config)).await;
    let r = s
        .send(s.client.get(s.url("/v1/whoami")).bearer_auth(&text))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"name": "slack-bridge", "scopes": ["bridge", "read"], "open": false, "tenant": "*"})
    );
    assert!(!r.text.contains(&text), "the token is never echoed");
    let r = s.send(s.client.get(s.url("/v1/whoami"))).await;
    assert_eq!(
        (r.status.as_u16(), r.json["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let r = s
        .send(s.client.get(s.url("/v1/whoami")).bearer_auth("not-a-token"))
        .await;
    assert_eq!(r.status, 401);

    // Open mode: every scope, no name.
    let open = Server::start(ServerOpts::default()).await;
    let r = open.get("/v1/whoami").await;
    assert_eq!(
        r.json,
        json!({"name": null, "scopes": SCOPES, "open": true, "tenant": "*"}),
        "{}",
        r.text
    );
}
