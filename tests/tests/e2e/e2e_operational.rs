//! Operators told where they already look (spec section 17): `[notifications.operational]`
//! names a route that receives what an operator must know, made from the log's own events —
//! here a chat-style (Slack-shaped) webhook on loopback. An endpoint that fails 50 times and
//! recovers is told opened once and closed once, however often its probe fails; parks are told
//! at once, then summed up per window.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode as AxStatus;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts};

use crate::common::{append_ok, notif_ev, serve_local, task_ev, wait_for};

type Posts = Arc<Mutex<Vec<(String, String)>>>;

/// `/ops` records the Slack `text` it is sent; `/flaky` answers 503 to its first 50 POSTs and
/// 200 after; `/strict` refuses every POST (400, permanent).
async fn receivers() -> (Posts, u16) {
    let posts: Posts = Arc::default();
    let flaky = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let p = posts.clone();
    let app = axum::Router::new().fallback(axum::routing::post(
        move |uri: axum::http::Uri, body: axum::body::Bytes| {
            let (p, flaky) = (p.clone(), flaky.clone());
            async move {
                let path = uri.path().to_owned();
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let text = v["text"].as_str().unwrap_or_default().to_owned();
                p.lock().unwrap().push((path.clone(), text));
                match path.as_str() {
                    "/flaky" if flaky.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 50 => {
                        AxStatus::SERVICE_UNAVAILABLE
                    }
                    "/strict" => AxStatus::BAD_REQUEST,
                    _ => AxStatus::OK,
                }
            }
        },
    ));
    let port = serve_local(app).await.port();
    (posts, port)
}

fn told(posts: &Posts, what: &str) -> Vec<String> {
    posts
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, text)| path == "/ops" && text.contains(what))
        .map(|(_, t)| t.clone())
        .collect()
}

#[tokio::test]
async fn an_endpoint_that_fails_50_times_is_told_opened_once_and_closed_once() {
    let (posts, port) = receivers().await;
    let cfg = format!(
        r#"
[notifications.operational]
route = "ops"
every = "2s"
[notifications.routing]
urgent = ["dashboard", "flaky"]
action = ["dashboard", "strict"]
[notifications.routes.ops]
sink = "webhook"
url = "http://127.0.0.1:{port}/ops"
body = "slack"
[notifications.routes.flaky]
sink = "webhook"
url = "http://127.0.0.1:{port}/flaky"
circuit = {{ failures = 45, cool_down = "1s" }}
[notifications.routes.flaky.retry]
max_attempts = 100
base_delay = "10ms"
max_delay = "50ms"
jitter = 0.0
[notifications.routes.strict]
sink = "webhook"
url = "http://127.0.0.1:{port}/strict"
[notifications.routes.strict.retry]
max_attempts = 1
"#
    );
    let s = Server::start(ServerOpts::default().config(cfg)).await;
    let events: Vec<Value> = (0..60)
        .map(|i| {
            notif_ev(
                &format!("fl-{i}"),
                json!({"priority": "urgent", "title": format!("f{i}")}),
            )
        })
        .chain((0..5).map(|i| {
            notif_ev(
                &format!("st-{i}"),
                json!({"priority": "action", "title": format!("s{i}")}),
            )
        }))
        .collect();
    append_ok(&s, &json!({"events": events})).await;
    let r = s.get("/v1/routes/ops").await;
    assert_eq!(
        r.json["operational"], true,
        "GET /v1/routes marks it: {}",
        r.text
    );
    let r = s.get("/v1/routes/flaky").await;
    assert!(r.json.get("operational").is_none(), "{}", r.text);

    // Parks: the first told at once, the other four as one summary when the window ends.
    wait_for(Duration::from_secs(60), "the parks' summary", || async {
        (!told(&posts, "4 more").is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        told(&posts, "Delivery parked on route strict").len(),
        1,
        "{:?}",
        posts.lock().unwrap()
    );
    // The flaky endpoint: 45 failures open it, five probes fail, the sixth closes it.
    wait_for(
        Duration::from_secs(120),
        "every flaky delivery sent",
        || async {
            let ok = posts
                .lock()
                .unwrap()
                .iter()
                .filter(|(p, _)| p == "/flaky")
                .count();
            (ok >= 50 + 60).then_some(())
        },
    )
    .await;
    wait_for(
        Duration::from_secs(30),
        "the circuit told closed",
        || async { (!told(&posts, "flaky: circuit closed").is_empty()).then_some(()) },
    )
    .await;
    // Time for a second "opened" or "closed" to come, if one would.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let opened = told(&posts, "flaky: circuit opened");
    let closed = told(&posts, "flaky: circuit closed");
    assert_eq!(
        (opened.len(), closed.len()),
        (1, 1),
        "opened {opened:?}, closed {closed:?}"
    );
    let page = s.get("/v1/events?stream=endpoints&limit=1000").await;
    let reopened = page.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "endpoint.circuit_opened")
        .count();
    assert!(
        reopened > 1,
        "the circuit opened again at a failed probe ({reopened}): {}",
        page.text
    );
    // The notifications are the log's, of their own type, with ids of the events they tell.
    let page = s
        .get("/v1/events?stream=notifications&type=notification.requested&limit=1000")
        .await;
    let ops: Vec<&Value> = page.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "tidemark.operational")
        .collect();
    assert_eq!(
        ops.len(),
        4,
        "opened, closed, a park and its summary: {ops:?}"
    );
    assert!(
        ops.iter()
            .all(|e| e["event_id"].as_str().is_some_and(|i| i.starts_with("op:"))),
        "{ops:?}"
    );
    for d in posts.lock().unwrap().iter().filter(|(p, _)| p != "/ops") {
        assert!(
            !d.1.contains("circuit"),
            "an operational notification outside ops: {d:?}"
        );
    }
}

/// The operational route alone, as a Slack-shaped webhook to `/ops`, told at once.
fn ops_only(port: u16) -> String {
    format!(
        r#"
[notifications.desktop]
enabled = false
[notifications.operational]
route = "ops"
every = "2s"
[notifications.routes.ops]
sink = "webhook"
url = "http://127.0.0.1:{port}/ops"
body = "slack"
"#
    )
}

/// The `node.*` events the log holds, by type.
/// Append a notification through `api`, arm the decider's panic (`flag`, the file
/// `TIDEMARK_FAULT_DECIDER_PANIC_WHEN` names), and append another: a notification is admitted
/// by a command, so the round that decides it panics and the append answers
/// `models_unavailable`.
async fn poison(api: &tidemark_tests::Api, flag: &std::path::Path) {
    append_ok(
        api,
        &notif_ev("before", json!({"priority": "info", "title": "b"})),
    )
    .await;
    std::fs::write(flag, b"").unwrap();
    let (st, body) = api
        .append(&notif_ev(
            "after",
            json!({"priority": "info", "title": "a"}),
        ))
        .await;
    assert_eq!(body["code"], "models_unavailable", "{st}: {body}");
}

async fn node_events(s: &tidemark_tests::Api) -> Vec<Value> {
    s.read_all("stream=nodes").await
}

/// A bridge subscription stopped at a mismatch (its task's completed run failed after) is told
/// once, with the seq it stopped at, through the operational route.
#[tokio::test]
async fn a_bridge_subscription_stopped_at_a_mismatch_is_told() {
    let (posts, port) = receivers().await;
    let s = Server::start(ServerOpts::default().config(ops_only(port))).await;
    let task = "t-op-stop";
    let step = |ty: &'static str, payload: Value| {
        let s = s.api();
        async move { append_ok(&s, &task_ev(task, ty, payload)).await[0].1 }
    };
    step("task.created", json!({"project_id": "p", "title": task})).await;
    let r = s
        .api()
        .send(
            s.request(
                reqwest::Method::POST,
                &format!("/v1/tasks/{task}/notifications/bridges"),
            )
            .json(&json!({"subscription_id": "s-op", "bridge_id": "b-op",
                              "thread_id": "th-op", "sink": {"kind": "pull"}})),
        )
        .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text);
    step("task.run_started", json!({"run_id": "r1"})).await;
    let done = step("task.run_completed", json!({"run_id": "r1"})).await;
    step("task.run_failed", json!({"run_id": "r1", "error": "late"})).await;
    let title = format!("Bridge subscription s-op stopped at seq {done}");
    wait_for(Duration::from_secs(60), "the stop told", || async {
        (!told(&posts, &title).is_empty()).then_some(())
    })
    .await;
    // Time for a second one to come, if one would (the notifier looks again at each page).
    step("task.run_started", json!({"run_id": "r2"})).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        told(&posts, "s-op stopped").len(),
        1,
        "{:?}",
        posts.lock().unwrap()
    );
}

/// Models poisoned (the decider panics, by a test knob, on a node that has run) are recorded
/// as `node.models_poisoned` and told as an urgent operational notification at once; the node
/// itself cannot route it (its decider is gone), so it reaches the receiver after the restart,
/// exactly once.
#[tokio::test]
async fn poisoned_models_are_recorded_at_once_and_told_once_a_decider_works() {
    let (posts, port) = receivers().await;
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("poison-now");
    let mut s = Server::start(
        ServerOpts::default()
            .config(ops_only(port))
            .env("TIDEMARK_FAULT_DECIDER_PANIC_WHEN", flag.to_str().unwrap()),
    )
    .await;
    poison(&s.api(), &flag).await;
    let poisoned = wait_for(Duration::from_secs(60), "node.models_poisoned", || async {
        node_events(&s.api())
            .await
            .into_iter()
            .find(|e| e["type"] == "node.models_poisoned")
    })
    .await;
    assert!(
        poisoned["payload"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("TIDEMARK_FAULT_DECIDER_PANIC_WHEN")),
        "{poisoned}"
    );
    let id = format!("op:{}", poisoned["seq"]);
    let op = wait_for(Duration::from_secs(60), "its notification", || async {
        s.read_all("stream=notifications&type=notification.requested")
            .await
            .into_iter()
            .find(|e| e["event_id"] == id.as_str())
    })
    .await;
    assert_eq!(op["payload"]["priority"], "urgent", "{op}");
    std::fs::remove_file(&flag).unwrap();
    s.kill9();
    s.restart().await;
    wait_for(Duration::from_secs(60), "the poisoning told", || async {
        (!told(&posts, "models poisoned").is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        told(&posts, "models poisoned").len(),
        1,
        "{:?}",
        posts.lock().unwrap()
    );
    assert_eq!(
        node_events(&s.api()).await.len(),
        1,
        "the restarted node is not poisoned"
    );
}

/// Free space where the log is kept (a tmpfs the test mounts; the suite runs as root, as for
/// the full-disk tests): told low as it falls under twice the reserve, while appends are still
/// taken; once the reserve is reached appends are refused, and when space returns the node
/// tells that it was reached, for how long, and that space recovered: each once.
#[tokio::test]
async fn free_space_near_and_at_the_reserve_is_told() {
    let (posts, port) = receivers().await;
    let fs = crate::e2e_disk_full::Mount::tmpfs("128m");
    let s = Server::try_start(ServerOpts {
        data_dir: Some(fs.path().join("data")),
        config: Some(format!(
            "[log]\ncache_mb = 8\nmin_free = \"16MiB\"\n{}",
            ops_only(port)
        )),
        ..ServerOpts::default()
    })
    .await
    .expect("a server on the small filesystem");
    let api = s.api();
    append_ok(
        &api,
        &task_ev("sp-0", "task.created", json!({"project_id": "p"})),
    )
    .await;
    assert!(
        node_events(&api).await.is_empty(),
        "plenty of space at first"
    );

    // Under twice the reserve (24 of 32 MiB): appends are taken, and it is told.
    let low = fs.path().join("low");
    std::fs::write(
        &low,
        vec![0u8; fs.available().saturating_sub(24 << 20) as usize],
    )
    .unwrap();
    append_ok(
        &api,
        &task_ev("sp-1", "task.created", json!({"project_id": "p"})),
    )
    .await;
    wait_for(Duration::from_secs(60), "free space told low", || async {
        (!told(&posts, "free space low").is_empty()).then_some(())
    })
    .await;

    // Under the reserve: refused.
    let full = fs.path().join("full");
    std::fs::write(
        &full,
        vec![0u8; fs.available().saturating_sub(8 << 20) as usize],
    )
    .unwrap();
    let (st, body) = api
        .append(&task_ev("sp-2", "task.created", json!({"project_id": "p"})))
        .await;
    assert_eq!(st.as_u16(), 507, "{body}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::remove_file(&full).unwrap();
    std::fs::remove_file(&low).unwrap();
    wait_for(
        Duration::from_secs(60),
        "the reserve told reached",
        || async {
            (!told(&posts, "reached its free-space reserve").is_empty()
                && !told(&posts, "free space recovered").is_empty())
            .then_some(())
        },
    )
    .await;
    append_ok(
        &api,
        &task_ev("sp-3", "task.created", json!({"project_id": "p"})),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for what in [
        "free space low",
        "reached its free-space reserve",
        "free space recovered",
    ] {
        assert_eq!(
            told(&posts, what).len(),
            1,
            "{what}: {:?}",
            posts.lock().unwrap()
        );
    }
    let types: Vec<Value> = node_events(&api)
        .await
        .iter()
        .map(|e| e["type"].clone())
        .collect();
    assert_eq!(
        types,
        [
            "node.space_low",
            "node.space_reserve_reached",
            "node.space_recovered"
        ],
        "in the order they happened"
    );
    let reached = &node_events(&api).await[1];
    assert!(
        reached["payload"]["refused_ms"]
            .as_u64()
            .is_some_and(|ms| ms >= 500),
        "refused for at least the second the test waited: {reached}"
    );
    assert_eq!(reached["payload"]["min_free"], 16 << 20, "{reached}");
}

/// Each tenant's operational notifications are made of its own events and told through its
/// own route (spec section 20): bridge subscriptions stopped in the default tenant, in beta
/// (shard 0, beside it) and in acme (shard 1, whose route `acme-ops` is set with
/// `"operational": true`) — the default tenant's route (the file's) is told of its own alone,
/// acme's of acme's alone, beta (no operational route) nothing, and each note is in its own
/// tenant's log. Before, beta's stop was told through the default tenant's route, naming
/// beta's subscription to the default tenant's operators, and acme could name no route.
#[tokio::test]
async fn a_tenants_route_is_told_of_its_own_events_only() {
    let (posts, port) = receivers().await;
    let s = Server::start(
        ServerOpts::default().config(format!("[log]\nshards = 2\n{}", ops_only(port))),
    )
    .await;
    let api = s.api();
    for (name, shard) in [("acme", 1), ("beta", 0)] {
        let r = api
            .send(
                api.request(reqwest::Method::POST, "/v1/tenants")
                    .json(&json!({"name": name, "reason": "operational test"})),
            )
            .await;
        assert_eq!(r.status.as_u16(), 201, "{}", r.text);
        assert_eq!(r.json["shard"], shard);
    }
    let acme = api.under("/tenants/acme", None);
    let r = acme
        .send(
            acme.request(reqwest::Method::PUT, "/v1/routes/acme-ops")
                .json(&json!({"route": {"sink": "webhook",
                    "url": format!("http://127.0.0.1:{port}/acme-ops"), "body": "slack",
                    "operational": true}, "reason": "acme's operators"})),
        )
        .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    assert_eq!(r.json["operational"], true, "{}", r.text);
    assert_eq!(r.json["route"]["operational"], true, "{}", r.text);
    let r = acme
        .send(
            acme.request(reqwest::Method::PUT, "/v1/routes/bad-ops")
                .json(&json!({"route": {"sink": "app", "operational": "yes"},
                              "reason": "x"})),
        )
        .await;
    assert_eq!(r.status.as_u16(), 422, "{}", r.text);
    assert_eq!(r.json["code"], "invalid_route", "{}", r.text);
    let mut stopped_at = Vec::new();
    for name in ["acme", "beta", "default"] {
        let t = match name {
            "default" => api.clone(),
            _ => api.under(&format!("/tenants/{name}"), None),
        };
        let task = format!("t-{name}");
        let step = |ty: &'static str, payload: Value| {
            let (t, task) = (t.clone(), task.clone());
            async move { append_ok(&t, &task_ev(&task, ty, payload)).await[0].1 }
        };
        step("task.created", json!({"project_id": "p", "title": "x"})).await;
        let r = t
            .send(
                t.request(
                    reqwest::Method::POST,
                    &format!("/v1/tasks/{task}/notifications/bridges"),
                )
                .json(
                    &json!({"subscription_id": format!("s-{name}"), "bridge_id": "b",
                              "thread_id": "th", "sink": {"kind": "pull"}}),
                ),
            )
            .await;
        assert_eq!(r.status.as_u16(), 201, "{}", r.text);
        step("task.run_started", json!({"run_id": "r1"})).await;
        let done = step("task.run_completed", json!({"run_id": "r1"})).await;
        step("task.run_failed", json!({"run_id": "r1", "error": "late"})).await;
        stopped_at.push((name, t, done));
    }
    // Each stop is in its tenant's log (the mismatch its notifier records).
    for (name, t, _) in &stopped_at {
        wait_for(Duration::from_secs(60), "the mismatch", || async {
            let m = t
                .read_all("&type=notification.terminal_state_mismatch")
                .await;
            (m.len() == 1).then_some(())
        })
        .await;
        let _ = name;
    }
    let done = stopped_at[2].2;
    let title = format!("Bridge subscription s-default stopped at seq {done}");
    wait_for(
        Duration::from_secs(60),
        "the default tenant's stop told",
        || async { (!told(&posts, &title).is_empty()).then_some(()) },
    )
    .await;
    let at_acme = |what: &str| {
        posts
            .lock()
            .unwrap()
            .iter()
            .filter(|(path, text)| path == "/acme-ops" && text.contains(what))
            .count()
    };
    let done = stopped_at[0].2;
    let title = format!("Bridge subscription s-acme stopped at seq {done}");
    wait_for(
        Duration::from_secs(60),
        "acme's stop told to acme",
        || async { (at_acme(&title) == 1).then_some(()) },
    )
    .await;
    // Time for another tenant's to come, if one would.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for other in ["s-acme", "s-beta"] {
        assert!(
            told(&posts, other).is_empty(),
            "{:?}",
            posts.lock().unwrap()
        );
    }
    for other in ["s-default", "s-beta"] {
        assert_eq!(at_acme(other), 0, "{:?}", posts.lock().unwrap());
    }
    for (name, t, _) in &stopped_at {
        let ops: Vec<Value> = t
            .read_all("&type=notification.requested")
            .await
            .into_iter()
            .filter(|n| n["payload"]["type"] == "tidemark.operational")
            .collect();
        let want = usize::from(*name != "beta");
        assert_eq!(ops.len(), want, "{name}: {ops:?}");
    }
}

/// Another shard's models poisoned are recorded in the home shard (spec section 20: the
/// deployment's `node.*` records are there) naming the shard, and told through the default
/// tenant's operational route at once, the home shard's decider working; before, only the
/// home shard's poisoning was recorded.
#[tokio::test]
async fn another_shards_poisoned_models_are_told_through_the_home_shard() {
    let (posts, port) = receivers().await;
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("poison-now");
    let s = Server::start(
        ServerOpts::default()
            .config(format!("[log]\nshards = 2\n{}", ops_only(port)))
            .env("TIDEMARK_FAULT_DECIDER_PANIC_WHEN", flag.to_str().unwrap()),
    )
    .await;
    let api = s.api();
    let r = api
        .send(
            api.request(reqwest::Method::POST, "/v1/tenants")
                .json(&json!({"name": "acme", "reason": "poison test"})),
        )
        .await;
    assert_eq!(r.json["shard"], 1, "{}", r.text);
    let acme = api.under("/tenants/acme", None);
    // acme's admission is shard 1's decider's command: its round panics with it.
    poison(&acme, &flag).await;
    std::fs::remove_file(&flag).unwrap();
    let poisoned = wait_for(Duration::from_secs(60), "node.models_poisoned", || async {
        node_events(&api)
            .await
            .into_iter()
            .find(|e| e["type"] == "node.models_poisoned")
    })
    .await;
    assert!(
        poisoned["payload"]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("shard 1: ")),
        "{poisoned}"
    );
    wait_for(Duration::from_secs(60), "the poisoning told", || async {
        (!told(&posts, "models of shard 1 poisoned").is_empty()).then_some(())
    })
    .await;
    // The home shard still takes commands: the default tenant's notification is admitted.
    append_ok(
        &api,
        &notif_ev("home-ok", json!({"priority": "info", "title": "h"})),
    )
    .await;
}

/// A tenant created after the start is told of its endpoint's circuit opening through its own
/// operational route, and the default tenant's route hears nothing of it. (The reactor meets
/// such a tenant first in a page; it starts with nothing open rather than with its models'
/// circuits, which have folded that page. This test did not reproduce that race: the
/// attempt's failure came in a page before the opening.)
#[tokio::test]
async fn a_new_tenants_first_circuit_opening_is_told() {
    let (posts, port) = receivers().await;
    let s = Server::start(ServerOpts::default().config(ops_only(port))).await;
    let api = s.api();
    let r = api
        .send(
            api.request(reqwest::Method::POST, "/v1/tenants")
                .json(&json!({"name": "acme", "reason": "circuit test"})),
        )
        .await;
    assert_eq!(r.status.as_u16(), 201, "{}", r.text);
    let acme = api.under("/tenants/acme", None);
    for (name, route) in [
        (
            "acme-ops",
            json!({"sink": "webhook", "url": format!("http://127.0.0.1:{port}/acme-ops"),
                   "body": "slack", "operational": true}),
        ),
        (
            "flaky",
            json!({"sink": "webhook", "url": format!("http://127.0.0.1:{port}/flaky"),
                   "priorities": ["urgent"], "circuit": {"failures": 1, "cool_down": "1h"}}),
        ),
    ] {
        let r = acme
            .send(
                acme.request(reqwest::Method::PUT, &format!("/v1/routes/{name}"))
                    .json(&json!({"route": route, "reason": "setup"})),
            )
            .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    }
    append_ok(
        &acme,
        &notif_ev("n-1", json!({"priority": "urgent", "title": "t"})),
    )
    .await;
    wait_for(
        Duration::from_secs(60),
        "the opening told to acme",
        || async {
            posts
                .lock()
                .unwrap()
                .iter()
                .any(|(path, text)| {
                    path == "/acme-ops" && text.contains("Endpoint flaky: circuit opened")
                })
                .then_some(())
        },
    )
    .await;
    assert!(
        told(&posts, "flaky").is_empty(),
        "{:?}",
        posts.lock().unwrap()
    );
}
