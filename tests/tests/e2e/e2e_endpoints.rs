//! Health and a circuit per endpoint (spec section 17) against the built binary and a real HTTP
//! receiver: each delivering route has a health record folded from the log (attempts,
//! successes, failures in a row, the last failure's code); after the route's
//! `circuit.failures` the circuit opens (`endpoint.circuit_opened`) and its deliveries wait,
//! spending no attempt; one probe goes out per cool-down (`endpoint.circuit_probed`), its
//! failure opens it again and a success closes it (`endpoint.circuit_closed`), after which the
//! waiting deliveries go. An operator disables and enables an endpoint (`endpoint.disabled` /
//! `endpoint.enabled`, with the reason and `by`); a disabled endpoint's deliveries wait. The
//! CLI lists and switches endpoints; the metrics show each endpoint's state.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Reply, Server, ServerOpts};

use crate::common::{append_ok, cli_at, cli_ok, get_list, notif_ev, post_json, wait_for};
use crate::e2e_deliveries::wait_status;
use crate::e2e_routes::scripted_receiver;

const CONFIG: &str = r#"
[notifications.routes.pager]
sink = "app"
types = ["page"]
"#;

fn notification(id: &str) -> Value {
    notif_ev(
        id,
        json!({"priority": "urgent", "title": format!("title of {id}"), "recipient": "ops@example.org",
               "source": {"site_id": "site-1"}}),
    )
}

async fn endpoint(s: &Server, route: &str) -> Value {
    let r = s.get("/v1/outbox/endpoints").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json["endpoints"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["route"] == route))
        .cloned()
        .unwrap_or(Value::Null)
}

async fn events(s: &Server, ty: &str) -> Vec<Value> {
    s.read_all(&format!("stream=endpoints&type={ty}")).await
}

/// Wait until the endpoint log holds `n` events of type `ty`.
async fn wait_events(s: &Server, ty: &str, n: usize) -> Vec<Value> {
    wait_for(Duration::from_secs(60), &format!("{n} × {ty}"), || async {
        let e = events(s, ty).await;
        (e.len() >= n).then_some(e)
    })
    .await
}

/// `POST /v1/outbox/endpoints/{route}/disable` for `reason`.
async fn disable(api: &Api, route: &str, reason: &str) -> Reply {
    let path = format!("/v1/outbox/endpoints/{route}/disable");
    post_json(api, &path, &json!({"reason": reason})).await
}

/// The attempts of every delivery of `route`, summed.
async fn attempts_of(s: &Server, route: &str) -> u64 {
    let path = format!("/v1/deliveries?route={route}&limit=100");
    let rows = get_list(s, &path, "deliveries").await;
    rows.iter()
        .map(|d| d["attempts"].as_u64().unwrap_or(0))
        .sum()
}

/// `POST /v1/admin/projections/{name}/verify`: identical to a replay of the log.
pub(crate) async fn verified(s: &Server, name: &str) {
    let r = crate::common::post_empty(s, &format!("/v1/admin/projections/{name}/verify")).await;
    assert_eq!(r.status, StatusCode::OK, "verify {name}: {}", r.text);
    assert_eq!(r.json["identical"], true, "verify {name}: {}", r.text);
}

#[tokio::test]
async fn a_failing_endpoint_opens_its_circuit_probes_once_per_cool_down_and_closes() {
    let answer = Arc::new(AtomicU16::new(503));
    let (_posts, port) = scripted_receiver(answer.clone()).await;
    let s = Server::start(ServerOpts::default().config(format!(
        "{CONFIG}\n[notifications.outbox]\nstuck_after = \"1s\"\n"
    )))
    .await;
    let route = json!({"route": {
        "sink": "webhook", "url": format!("http://127.0.0.1:{port}/hook"),
        "priorities": ["urgent"],
        "retry": {"max_attempts": 100, "base_delay": "100ms", "max_delay": "200ms"},
        "circuit": {"failures": 3, "cool_down": "1s"}},
        "reason": "circuit test"});
    let r = s
        .send(
            s.request(reqwest::Method::PUT, "/v1/routes/cb")
                .json(&route),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // A delivering route is listed before its first attempt; the app route is not.
    let e = endpoint(&s, "cb").await;
    assert_eq!(e["state"], "ok", "{e}");
    assert_eq!(e["sink"], "webhook", "{e}");
    assert_eq!(e["attempts"], 0, "{e}");
    assert_eq!(e["circuit_failures"], 3, "{e}");
    assert_eq!(e["circuit_cool_down_ms"], 1000, "{e}");
    assert!(endpoint(&s, "pager").await.is_null());

    // Failures open the circuit after three in a row.
    for i in 0..4 {
        append_ok(&s, &notification(&format!("cb-{i}"))).await;
    }
    let opened = wait_events(&s, "endpoint.circuit_opened", 1).await;
    assert_eq!(opened[0]["subject"], "cb", "{opened:?}");
    assert_eq!(opened[0]["payload"]["error_code"], "http_503", "{opened:?}");
    assert!(
        opened[0]["payload"]["failures"]
            .as_u64()
            .is_some_and(|n| n >= 3),
        "{opened:?}"
    );

    // While it is open one probe goes out per cool-down: its failure opens it again. The log
    // says so whatever the timing: between two openings, one probe, one lease and one failed
    // attempt of the route, the probe's.
    let e = wait_for(Duration::from_secs(60), "the circuit open", || async {
        let e = endpoint(&s, "cb").await;
        (e["state"] == "open").then_some(e)
    })
    .await;
    assert_eq!(e["last_failure_code"], "http_503", "{e}");
    assert!(e["open"]["probe_at"].is_string(), "{e}");
    let opened = wait_events(&s, "endpoint.circuit_opened", 3).await;
    let probes = events(&s, "endpoint.circuit_probed").await;
    let leases = s.read_all("stream=deliveries&type=delivery.leased").await;
    let failed = s
        .read_all("stream=deliveries&type=delivery.attempt_failed")
        .await;
    for w in opened.windows(2).skip(1) {
        let (from, to) = (w[0]["seq"].as_u64(), w[1]["seq"].as_u64());
        let inside = |evs: &[Value]| -> Vec<String> {
            evs.iter()
                .filter(|e| e["seq"].as_u64() > from && e["seq"].as_u64() < to)
                .map(|e| e["subject"].as_str().unwrap_or("").to_owned())
                .collect()
        };
        let probe: Vec<String> = probes
            .iter()
            .filter(|e| e["seq"].as_u64() > from && e["seq"].as_u64() < to)
            .map(|e| {
                e["payload"]["delivery_id"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect();
        assert_eq!(probe.len(), 1, "one probe between two openings: {probes:?}");
        assert!(probe[0].starts_with("dlv:cb-"), "{probe:?}");
        assert_eq!(inside(&leases), probe, "one lease, the probe's");
        assert_eq!(inside(&failed), probe, "one failed attempt, the probe's");
    }
    // The others wait, queued or waiting for a retry, never parked, and say why.
    for i in 0..4 {
        let d = crate::e2e_dispatch::delivery(&s, &format!("dlv:cb-{i}:cb")).await;
        assert!(
            ["queued", "retry_wait", "leased"].contains(&d["status"].as_str().unwrap_or("")),
            "{d}"
        );
        if d["status"] != "leased" {
            assert_eq!(d["held_by"], "circuit_open", "{d}");
        }
    }

    // Held deliveries wait by design: pending, never stuck (per sink or per site), however
    // long the circuit stays open (stuck_after is 1 s here; the three openings took longer).
    let k = s.get("/v1/outbox/kpis").await;
    assert_eq!(k.status, StatusCode::OK, "{}", k.text);
    let (sink, site) = (
        &k.json["by_sink"]["webhook"],
        &k.json["by_source_site"]["site-1"],
    );
    assert!(
        sink["queue_depth"].as_u64().is_some_and(|n| n >= 3),
        "{sink}"
    );
    let leased = sink["leased"].as_u64().unwrap_or(0);
    assert!(
        sink["stuck"].as_u64().is_some_and(|n| n <= leased),
        "{sink}"
    );
    // The site's other four are the desktop route's, which no app claims here: stuck.
    assert!(
        site["stuck"]
            .as_u64()
            .is_some_and(|n| (4..=4 + leased).contains(&n)),
        "{site}"
    );

    // The receiver recovers: the next probe succeeds and closes the circuit; every waiting
    // delivery goes.
    answer.store(200, Ordering::SeqCst);
    let closed = wait_events(&s, "endpoint.circuit_closed", 1).await;
    assert_eq!(closed[0]["subject"], "cb", "{closed:?}");
    for i in 0..4 {
        wait_status(&s, &format!("dlv:cb-{i}:cb"), "sent").await;
    }
    let e = wait_for(Duration::from_secs(30), "the endpoint ok", || async {
        let e = endpoint(&s, "cb").await;
        (e["state"] == "ok" && e["successes"] == 4).then_some(e)
    })
    .await;
    assert_eq!(e["consecutive_failures"], 0, "{e}");
    assert!(e["open"].is_null(), "{e}");
    assert!(e["last_success_at"].is_string(), "{e}");
    assert!(e["last_failure_at"].is_string(), "{e}");
    assert_eq!(
        e["attempts"].as_u64(),
        Some(attempts_of(&s, "cb").await),
        "every attempt counted once: {e}"
    );

    // A replay of the log gives the live models: the endpoints' records and the index moves
    // of the held rows are a function of the events.
    verified(&s, "deliveries").await;

    // The metrics show each endpoint's state.
    let m = s.get("/metrics").await;
    assert!(
        m.text
            .contains(r#"tidemark_endpoint_state{route="cb",state="ok"} 1"#),
        "{}",
        m.text
    );
}

#[tokio::test]
async fn an_operator_disables_and_enables_an_endpoint() {
    let answer = Arc::new(AtomicU16::new(200));
    let (ids, port) = scripted_receiver(answer.clone()).await;
    let s = Server::start(
        ServerOpts::default().config(format!(
            "{CONFIG}\n[notifications.routes.hook]\nsink = \"webhook\"\nurl = \"http://127.0.0.1:{port}/hook\"\n[notifications.routing]\nurgent = [\"hook\"]\n"
        )),
    )
    .await;
    append_ok(&s, &notification("dis-0")).await;
    wait_status(&s, "dlv:dis-0:hook", "sent").await;

    // Bad input changes nothing.
    let r = disable(&s, "hook", " ").await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(r.json["code"], "reason_required", "{}", r.text);
    for route in ["nope", "pager"] {
        let r = disable(&s, route, "x").await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
        assert_eq!(r.json["code"], "endpoint_not_found", "{}", r.text);
    }
    let long = "x".repeat(129);
    for path in ["%FF", "%09tab", long.as_str()] {
        let r = disable(&s, path, "x").await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path}: {}",
            r.text
        );
        assert_eq!(r.json["code"], "invalid_route", "{}", r.text);
    }
    assert!(events(&s, "endpoint.disabled").await.is_empty());

    // Disabled: a new delivery waits, spending no attempt.
    let r = disable(&s, "hook", "the receiver is being moved").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["endpoint"]["state"], "disabled", "{}", r.text);
    assert_eq!(
        r.json["endpoint"]["disabled"]["reason"], "the receiver is being moved",
        "{}",
        r.text
    );
    // Disabling it again records nothing more.
    let r = disable(&s, "hook", "again").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let disabled = events(&s, "endpoint.disabled").await;
    assert_eq!(disabled.len(), 1, "{disabled:?}");
    assert_eq!(
        disabled[0]["payload"]["reason"],
        "the receiver is being moved"
    );
    assert!(disabled[0]["payload"].get("by").is_some(), "{disabled:?}");
    let posts = ids.lock().unwrap().len();
    append_ok(&s, &notification("dis-1")).await;
    wait_status(&s, "dlv:dis-1:hook", "queued").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let d = crate::e2e_dispatch::delivery(&s, "dlv:dis-1:hook").await;
    assert_eq!(d["status"], "queued", "{d}");
    assert_eq!(d["attempts"], 0, "{d}");
    assert_eq!(d["held_by"], "endpoint_disabled", "{d}");
    assert_eq!(ids.lock().unwrap().len(), posts, "nothing is POSTed");
    assert_eq!(endpoint(&s, "hook").await["state"], "disabled");

    // The CLI lists it and enables it: the delivery goes.
    let base = s.base().to_owned();
    let out = cli_at(&base, "endpoints list -o json").await;
    let v: Value = serde_json::from_str(&cli_ok(&out, "endpoints list")).expect("JSON");
    assert!(
        v.as_array().is_some_and(|a| a
            .iter()
            .any(|e| e["route"] == "hook" && e["state"] == "disabled")),
        "{v}"
    );
    let out = cli_at(&base, "endpoints enable hook --reason moved").await;
    cli_ok(&out, "endpoints enable");
    wait_status(&s, "dlv:dis-1:hook", "sent").await;
    let enabled = events(&s, "endpoint.enabled").await;
    assert_eq!(enabled.len(), 1, "{enabled:?}");
    assert_eq!(enabled[0]["payload"]["reason"], "moved");
    let e = endpoint(&s, "hook").await;
    assert_eq!(e["state"], "ok", "{e}");
    assert_eq!(e["enabled"]["reason"], "moved", "{e}");
    assert_eq!(
        (e["attempts"].as_u64(), e["successes"].as_u64()),
        (Some(2), Some(2))
    );

    verified(&s, "deliveries").await;
    // A client cannot write an endpoint event.
    let (code, body) = s
        .append(&json!({"stream": "endpoints", "subject": "hook",
                        "type": "endpoint.enabled", "payload": {"reason": "x"}}))
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
}
