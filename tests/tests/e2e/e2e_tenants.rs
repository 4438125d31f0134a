//! Tenants through the real server (spec section 20, issue 58): the directory made and
//! unmade at runtime with reasons; tokens of a tenant act for it alone (no prefix needed,
//! another tenant's prefix `403 tenant_forbidden`, the deployment's operations refused); a `*`
//! token names a tenant by the `/tenants/{tenant}` prefix; every route tried with a tenant's
//! token on another tenant's ids leaves that tenant's state as it was; and two tenants' clients
//! append, stream, route and claim deliveries, and advance cursors at once, with nothing
//! crossing.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, SseNext, random_token, run_cli, sha256_hex};

use crate::common::{notif_ev, wait_for};

pub(crate) struct Tokens {
    pub(crate) op: String,
    pub(crate) acme: String,
    pub(crate) beta: String,
}

fn config(t: &Tokens) -> String {
    let token = |name: &str, text: &str, tenant: &str| {
        format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\ntenant = \"{tenant}\"\n\n",
            sha256_hex(text)
        )
    };
    [
        token("op", &t.op, "*"),
        token("acme-admin", &t.acme, "acme"),
        token("beta-admin", &t.beta, "beta"),
    ]
    .concat()
}

async fn start() -> (Server, Tokens) {
    start_with("").await
}

/// A server with the three tokens and `extra` configuration before them.
pub(crate) async fn start_with(extra: &str) -> (Server, Tokens) {
    let t = Tokens {
        op: format!("tm-op-{}", random_token(24)),
        acme: format!("tm-acme-{}", random_token(24)),
        beta: format!("tm-beta-{}", random_token(24)),
    };
    let s = Server::start(ServerOpts::default().config(format!("{extra}\n{}", config(&t)))).await;
    (s, t)
}

async fn create(op: &Api, name: &str) -> tidemark_tests::Reply {
    op.send(
        op.request(Method::POST, "/v1/tenants")
            .json(&json!({"name": name, "reason": "onboarding"})),
    )
    .await
}

fn ev(id: &str, subject: &str, n: u64) -> Value {
    json!({"event_id": id, "stream": "orders", "subject": subject, "type": "order.placed",
           "payload": {"n": n}})
}

#[tokio::test]
async fn the_directory_is_made_at_runtime_and_only_by_the_deployments_operators() {
    let (s, t) = start().await;
    let op = s.api().under("", Some(&t.op));
    let acme = s.api().under("", Some(&t.acme));
    // Before acme exists, its token finds nothing of it.
    let r = acme.append(&json!({"events": [ev("e-1", "o-1", 1)]})).await;
    assert_eq!(r.0, StatusCode::NOT_FOUND, "{}", r.1);
    assert_eq!(r.1["code"], "tenant_not_found");

    let r = create(&op, "acme").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(
        (r.json["name"].as_str(), r.json["shard"].as_u64()),
        (Some("acme"), Some(0))
    );
    assert_eq!(
        (r.json["reason"].as_str(), r.json["by"].as_str()),
        (Some("onboarding"), Some("op"))
    );
    // Refusals, each with its code, and nothing recorded.
    for (body, status, code) in [
        (
            json!({"name": "acme", "reason": "again"}),
            409,
            "tenant_exists",
        ),
        (
            json!({"name": "default", "reason": "x"}),
            422,
            "invalid_tenant",
        ),
        (
            json!({"name": "Acme", "reason": "x"}),
            422,
            "invalid_tenant",
        ),
        (
            json!({"name": "9lives", "reason": "x"}),
            422,
            "invalid_tenant",
        ),
        (
            json!({"name": "zeta", "reason": " "}),
            422,
            "reason_required",
        ),
        (json!({"name": "zeta"}), 422, "reason_required"),
    ] {
        let r = op
            .send(op.request(Method::POST, "/v1/tenants").json(&body))
            .await;
        assert_eq!(r.status.as_u16(), status, "{body}: {}", r.text);
        assert_eq!(r.json["code"], code, "{body}: {}", r.text);
    }
    let r = op.get("/v1/tenants").await;
    let names: Vec<&str> = r.json["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["acme"], "{}", r.text);
    // A tenant's token: the directory and the deployment's operations are not its.
    for (method, path) in [
        (Method::GET, "/v1/tenants"),
        (Method::GET, "/v1/tenants/acme"),
        (Method::POST, "/v1/tenants"),
        (Method::GET, "/v1/shards"),
        (Method::GET, "/v1/admin/projections"),
        (Method::POST, "/v1/admin/retention/run"),
    ] {
        let r = acme
            .send(
                acme.request(method.clone(), path)
                    .json(&json!({"name": "x", "reason": "x"})),
            )
            .await;
        assert_eq!(
            (r.status, r.json["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("tenant_forbidden")),
            "{method} {path}: {}",
            r.text
        );
    }
    // Whoami names the tenant.
    assert_eq!(acme.get("/v1/whoami").await.json["tenant"], "acme");
    // Removed: the token finds nothing again, the name is not given twice.
    let r = op
        .send(
            op.request(Method::DELETE, "/v1/tenants/acme")
                .json(&json!({"reason": "offboarded"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let r = acme.append(&json!({"events": [ev("e-1", "o-1", 1)]})).await;
    assert_eq!(
        (r.0, r.1["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("tenant_not_found"))
    );
    assert_eq!(create(&op, "acme").await.json["code"], "tenant_exists");
    let r = op.get("/v1/tenants/acme").await;
    assert_eq!(r.json["removed"]["reason"], "offboarded", "{}", r.text);
    // The operator's prefix on a tenant that is not one.
    let r = op
        .under("/tenants/nope", Some(&t.op))
        .get("/v1/events")
        .await;
    assert_eq!(
        (r.status, r.json["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("tenant_not_found"))
    );
}

/// The same event ids in three tenants are three events; each token reads its tenant's alone,
/// with or without the prefix; another tenant's prefix is refused.
#[tokio::test]
async fn tenants_append_and_read_their_own_events() {
    let (s, t) = start().await;
    let op = s.api().under("", Some(&t.op));
    for name in ["acme", "beta"] {
        assert_eq!(create(&op, name).await.status, StatusCode::CREATED);
    }
    let acme = s.api().under("", Some(&t.acme));
    let beta = s.api().under("", Some(&t.beta));
    let acme_by_op = s.api().under("/tenants/acme", Some(&t.op));
    let mut seqs = Vec::new();
    for (api, n) in [(&acme, 1), (&beta, 2), (&op, 3)] {
        let (st, body) = api.append(&json!({"events": [ev("e-1", "o-1", n)]})).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
        assert_eq!(body["events"][0]["duplicate"], false, "{body}");
        seqs.push(body["events"][0]["seq"].as_u64().unwrap());
    }
    // The operator's prefixed resend of acme's event is acme's duplicate.
    let (_, body) = acme_by_op
        .append(&json!({"events": [ev("e-1", "o-1", 1)]}))
        .await;
    assert_eq!(
        (
            body["events"][0]["seq"].as_u64(),
            body["events"][0]["duplicate"].as_bool()
        ),
        (Some(seqs[0]), Some(true)),
        "{body}"
    );
    // Prefixed with its own tenant: the same; with another's: refused.
    let acme_prefixed = s.api().under("/tenants/acme", Some(&t.acme));
    assert_eq!(acme_prefixed.read_all("").await.len(), 1);
    let r = s
        .api()
        .under("/tenants/beta", Some(&t.acme))
        .get("/v1/events")
        .await;
    assert_eq!(
        (r.status, r.json["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("tenant_forbidden"))
    );
    // The CLI acts for the tenant `--tenant` names (the operator's token), appending and
    // reading that tenant's events alone; a tenant's token with another's is refused.
    let url = s.base().to_owned();
    let cli = |args: Vec<String>, stdin: String| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_cli(&args, &stdin, Duration::from_secs(60)).await
    };
    let with = |extra: &[&str], token: &str, tenant: &str| -> Vec<String> {
        let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for x in [
            "--url", &url, "--token", token, "--tenant", tenant, "-o", "json",
        ] {
            a.push(x.to_owned());
        }
        a
    };
    let out = cli(
        with(&["append"], &t.op, "beta"),
        format!("{}\n", ev("e-2", "o-2", 4)),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tail = ["tail", "--after", "0", "--count", "2"];
    let out = cli(with(&tail, &t.op, "beta"), String::new()).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tailed: Value = serde_json::from_slice(&out.stdout).expect("json");
    let tailed: Vec<(&str, &str)> = tailed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["tenant"].as_str().unwrap_or("-"),
                e["event_id"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(tailed, [("beta", "e-1"), ("beta", "e-2")]);
    let out = cli(with(&tail, &t.acme, "beta"), String::new()).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tenant_forbidden"),
        "{out:?}"
    );
    // The Rust client library: `Client::tenant` scopes every call to a tenant.
    let client = tidemark_client::Client::new(s.base().to_owned(), Some(t.op.clone()))
        .unwrap()
        .tenant("acme")
        .unwrap();
    let r = client
        .append([
            tidemark_client::NewEvent::new("orders", "o-1", "order.placed", json!({"n": 1}))
                .with_id("e-1"),
        ])
        .await
        .unwrap();
    assert_eq!((r.events[0].seq, r.events[0].duplicate), (seqs[0], true));
    let anon = tidemark_client::Client::new(s.base().to_owned(), None).unwrap();
    assert!(anon.tenant("Nope").is_err());
    for (api, tenant, n) in [
        (&acme, Some("acme"), 1),
        (&beta, Some("beta"), 2),
        (&op, None, 3),
    ] {
        let all = api.read_all("").await;
        let orders: Vec<&Value> = all.iter().filter(|e| e["stream"] == "orders").collect();
        assert_eq!(orders.len(), 1 + usize::from(n == 2), "{tenant:?}: {all:?}");
        assert_eq!(orders[0]["payload"]["n"], n);
        assert_eq!(orders[0]["tenant"].as_str(), tenant);
        assert!(
            all.iter().all(|e| e["tenant"].as_str() == tenant),
            "{tenant:?}: {all:?}"
        );
    }
}

/// A snapshot of what a tenant's API shows, to compare before and after another tenant tried
/// every route on its ids.
async fn state_of(api: &Api) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for path in [
        "/v1/events?limit=1000",
        "/v1/lists",
        "/v1/routes",
        "/v1/tasks",
        "/v1/notifications",
        "/v1/deliveries",
        "/v1/cursors",
        "/v1/tasks/t-1/notifications/bridges",
    ] {
        let mut v = api.get(path).await.json;
        strip_positions(&mut v);
        out.push((path.to_owned(), v));
    }
    out
}

/// A page's `as_of_seq` and head move with any tenant's appends: not the tenant's state.
fn strip_positions(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        for k in [
            "as_of_seq",
            "latest_event_seq",
            "next_after_sequence",
            "next_after",
        ] {
            o.remove(k);
        }
    }
}

/// Every operation of the OpenAPI document, tried with beta's token on acme's ids, changes
/// nothing of acme's and shows none of it.
#[tokio::test]
async fn every_route_with_another_tenants_ids_reaches_nothing_of_it() {
    let (s, t) = start().await;
    let op = s.api().under("", Some(&t.op));
    for name in ["acme", "beta"] {
        assert_eq!(create(&op, name).await.status, StatusCode::CREATED);
    }
    let acme = s.api().under("", Some(&t.acme));
    let beta = s.api().under("", Some(&t.beta));
    // Acme's things: a list, a route, a task with a notification, a cursor, a subscription.
    let marker = "acme-private-7d1f";
    let r = acme
        .send(
            acme.request(Method::PUT, "/v1/lists/l-1")
                .json(&json!({"members": [format!("{marker}@example.org")], "reason": "setup"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = acme
        .send(
            acme.request(Method::PUT, "/v1/routes/r-1")
                .json(&json!({"route": {"sink": "app"}, "reason": "setup"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let (st, body) = acme
        .append(&json!({"events": [
            {"event_id": "t-1-created", "stream": "task_events", "subject": "t-1",
             "type": "task.created", "payload": {"title": marker, "project_id": "p-1"}},
            notif_ev("n-1", json!({"priority": "urgent", "title": marker, "recipient": "ops@example.org"})),
        ]}))
        .await;
    assert!(st.is_success(), "{body}");
    let r = acme
        .send(
            acme.request(Method::POST, "/v1/cursors/advance")
                .json(&json!({
            "consumer_id": "c-1", "stream_name": "orders", "last_sequence": 1,
            "delivery_id": "d-1"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Routed in acme: a delivery of n-1.
    let delivery = wait_for(
        Duration::from_secs(30),
        "acme's delivery of n-1",
        || async {
            let r = acme.get("/v1/deliveries").await;
            r.json["deliveries"]
                .as_array()
                .and_then(|a| a.first().cloned())
                .and_then(|d| d["id"].as_str().map(str::to_owned))
        },
    )
    .await;
    let before = state_of(&acme).await;
    let text = serde_json::to_string(&before).unwrap();
    assert!(
        text.contains(marker),
        "acme's state shows its things: {text}"
    );

    // Every operation, acme's ids in every path parameter, with beta's token.
    let doc = op.get("/openapi.json").await.json;
    let ids = |param: &str| -> String {
        match param {
            "name" | "route" => "l-1".into(),
            "id" => delivery.clone(),
            "task_id" => "t-1".into(),
            "subscription_id" | "bridge_id" => "s-1".into(),
            "delivery_id" => delivery.clone(),
            other => format!("{other}-1"),
        }
    };
    let mut tried = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.starts_with("/v1/")
            || path.starts_with("/v1/admin")
            || path.starts_with("/v1/tenants")
            || path == "/v1/shards"
        {
            continue;
        }
        for (method, _) in item.as_object().unwrap() {
            let mut p = path.clone();
            while let Some(start) = p.find('{') {
                let end = p[start..].find('}').unwrap() + start;
                let value = ids(&p[start + 1..end]);
                p.replace_range(start..=end, &value);
            }
            for variant in [p.clone(), p.replace("/l-1", "/r-1")] {
                let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                let body = json!({"reason": "cross", "owner": "x", "sink": "app", "limit": 10,
                    "lease_ms": 1000, "consumer_id": "c-1", "stream_name": "orders",
                    "last_sequence": 9, "delivery_id": "d-9", "to_sequence": 0,
                    "members": [], "route": {"sink": "app"}, "error_code": "x",
                    "items": [{"id": delivery.clone()}], "ids": [delivery.clone()]});
                if variant.ends_with("/stream") {
                    continue;
                }
                let r = beta.send(beta.request(m, &variant).json(&body)).await;
                tried += 1;
                assert!(
                    !r.text.contains(marker),
                    "{method} {variant} with beta's token showed acme's data: {}",
                    r.text
                );
            }
        }
    }
    assert!(tried > 40, "only {tried} operations tried");
    let mut after = state_of(&acme).await;
    // Beta's own writes are beta's: acme's state is as it was.
    for ((path, b), (_, a)) in before.iter().zip(after.iter_mut()) {
        assert_eq!(a, b, "acme's {path} changed under beta's requests");
    }
}

/// Two tenants' clients at once: appends, live streams, routing and claims, cursors. Nothing
/// crosses.
#[tokio::test]
async fn two_tenants_at_once_with_nothing_crossing() {
    two_tenants_at_once("", [0, 0]).await;
}

/// The same with the tenants in two shards (spec section 20): acme in shard 1, beta with the
/// default tenant in shard 0.
#[tokio::test]
async fn two_tenants_in_two_shards_at_once_with_nothing_crossing() {
    two_tenants_at_once("[log]\nshards = 2\n", [1, 0]).await;
}

async fn two_tenants_at_once(extra: &str, shards: [u64; 2]) {
    let (s, t) = start_with(extra).await;
    let op = s.api().under("", Some(&t.op));
    for (name, shard) in ["acme", "beta"].into_iter().zip(shards) {
        let r = create(&op, name).await;
        assert_eq!(r.status, StatusCode::CREATED);
        assert_eq!(r.json["shard"], shard, "{}", r.json);
    }
    let clients = [
        ("acme", s.api().under("", Some(&t.acme))),
        ("beta", s.api().under("/tenants/beta", Some(&t.op))),
    ];
    const N: u64 = 60;
    let runs = clients.iter().map(|(tenant, api)| async move {
        let mut sse = api.sse("after_sequence=0", None).await.expect("stream");
        // A route of the tenant's own: its notifications are routed by it.
        let r = api
            .send(
                api.request(Method::PUT, "/v1/routes/app-1")
                    .json(&json!({"route": {"sink": "app"}, "reason": "setup"})),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{tenant}: {}", r.text);
        for i in 0..N {
            let mut events = vec![ev(&format!("e-{i}"), &format!("{tenant}-{i}"), i)];
            if i % 10 == 0 {
                events.push(notif_ev(
                    &format!("n-{i}"),
                    json!({"priority": "urgent", "title": format!("{tenant} {i}"), "recipient": "ops@example.org"}),
                ));
            }
            let (st, body) = api.append(&json!({"events": events})).await;
            assert_eq!(st, StatusCode::CREATED, "{tenant}: {body}");
            let r = api
                .send(api.request(Method::POST, "/v1/cursors/advance").json(&json!({
                    "consumer_id": "c-1", "stream_name": "orders",
                    "last_sequence": body["events"][0]["seq"], "delivery_id": format!("d-{i}")})))
                .await;
            assert_eq!(r.status, StatusCode::OK, "{tenant}: {}", r.text);
        }
        // The live stream: the tenant's orders, all of them, in order, nothing else's.
        let mut seen = 0;
        while seen < N {
            match sse.next(Duration::from_secs(30)).await {
                SseNext::Event(e) => {
                    assert_eq!(e.data["tenant"], *tenant, "{tenant}'s stream: {}", e.data);
                    if e.data["stream"] == "orders" {
                        assert_eq!(e.data["payload"]["n"], seen, "{tenant}: {}", e.data);
                        seen += 1;
                    }
                }
                other => panic!("{tenant}'s stream: {other:?}"),
            }
        }
        // Its notifications routed into its deliveries, claimed by its bridge.
        let mut claimed: Vec<String> = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while (claimed.iter().filter(|n| n.starts_with("n-")).count() as u64) < N / 10 {
            assert!(std::time::Instant::now() < deadline, "{tenant}: claimed only {claimed:?}");
            let r = api
                .send(api.request(Method::POST, "/v1/deliveries/claim").json(
                    &json!({"sink": "app", "owner": "b", "limit": 100, "lease_ms": 60_000}),
                ))
                .await;
            assert_eq!(r.status, StatusCode::OK, "{tenant}: {}", r.text);
            for d in r.json["deliveries"].as_array().unwrap() {
                claimed.push(d["notification_id"].as_str().unwrap().to_owned());
            }
            claimed.sort();
            claimed.dedup();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let cursor = api.get("/v1/cursors?consumer_id=c-1").await;
        (tenant.to_string(), cursor.json, claimed)
    });
    let results = futures::future::join_all(runs).await;
    for (tenant, cursors, claimed) in &results {
        let c = &cursors["cursors"][0];
        assert_eq!(
            cursors["cursors"].as_array().map(Vec::len),
            Some(1),
            "{tenant}: {cursors}"
        );
        let own = clients
            .iter()
            .find(|(t, _)| t == tenant)
            .unwrap()
            .1
            .read_all("stream=orders")
            .await;
        assert_eq!(
            c["last_sequence"],
            own.last().unwrap()["seq"],
            "{tenant}: {cursors}"
        );
        let want: Vec<String> = (0..N).step_by(10).map(|i| format!("n-{i}")).collect();
        let mut got: Vec<String> = claimed
            .iter()
            .filter(|n| n.starts_with("n-"))
            .cloned()
            .collect();
        got.sort_by_key(|n| n[2..].parse::<u64>().unwrap());
        assert_eq!(got, want, "{tenant}'s claims");
    }
    // The default tenant saw none of it.
    let mine = op.read_all("stream=orders").await;
    assert!(mine.is_empty(), "{mine:?}");
    // Orders of the default tenant's own, past every tenant's cursor: another tenant's lag
    // counts its own events alone (none behind its cursor).
    let (st, body) = op.append(&json!({"events": [ev("d-1", "d-1", 0)]})).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    for (tenant, api) in &clients {
        let lag = api.get("/v1/consumers/lag").await;
        let c = &lag.json["consumers"][0];
        assert_eq!(c["consumer_id"], "c-1", "{tenant}: {}", lag.json);
        assert_eq!(c["lag_events"], 0, "{tenant}: {}", lag.json);
    }
}

/// The metrics' `tenant` label (spec section 20): a tenant's appends, commands, lease calls and
/// requests are counted under its name, the bound (`server.metrics_tenant_labels = 1` here)
/// names only the first tenant met and counts the later ones as `other`, and a name the
/// directory does not hold never takes a label.
#[tokio::test]
async fn metrics_name_tenants_up_to_the_bound() {
    let t = Tokens {
        op: format!("tm-op-{}", random_token(24)),
        acme: format!("tm-acme-{}", random_token(24)),
        beta: format!("tm-beta-{}", random_token(24)),
    };
    let s = Server::start(ServerOpts::default().config(format!(
        "[server]\nmetrics_tenant_labels = 1\n\n{}",
        config(&t)
    )))
    .await;
    let op = s.api().under("", Some(&t.op));
    for name in ["acme", "beta"] {
        assert_eq!(create(&op, name).await.status, StatusCode::CREATED);
    }
    // A name nobody created, asked for by the operator, first: it must not take the one label.
    let r = s
        .api()
        .under("/tenants/ghost", Some(&t.op))
        .get("/v1/events")
        .await;
    assert_eq!(r.json["code"], "tenant_not_found", "{}", r.json);
    let acme = s.api().under("", Some(&t.acme));
    let beta = s.api().under("", Some(&t.beta));
    for (api, n) in [(&acme, 3), (&beta, 2)] {
        let events: Vec<Value> = (0..n).map(|i| ev(&format!("e-{i}"), "o-1", i)).collect();
        let (st, body) = api.append(&json!({"events": events})).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
    }
    let (st, _) = op.append(&json!({"events": [ev("e-d", "o-1", 0)]})).await;
    assert_eq!(st, StatusCode::CREATED);
    let text = op.get("/metrics").await.text;
    let series = |name: &str, tenant: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| l.contains(&format!("tenant=\"{tenant}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        series("tidemark_events_appended_total", "acme"),
        3.0,
        "{text}"
    );
    assert_eq!(
        series("tidemark_events_appended_total", "other"),
        2.0,
        "{text}"
    );
    assert_eq!(
        series("tidemark_events_appended_total", "default"),
        1.0,
        "{text}"
    );
    assert!(
        series("tidemark_http_requests_total", "acme") >= 1.0,
        "{text}"
    );
    assert!(
        series("tidemark_http_requests_total", "other") >= 2.0,
        "{text}"
    );
    assert!(
        series("tidemark_commands_total", "default") >= 2.0,
        "{text}"
    );
    for absent in ["beta", "ghost"] {
        assert!(
            !text.contains(&format!("tenant=\"{absent}\"")),
            "{absent} is past the bound or not a tenant:\n{text}"
        );
    }
}
