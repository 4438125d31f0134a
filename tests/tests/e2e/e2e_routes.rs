//! Routes managed at runtime (spec section 4) against the built binary and a real HTTP
//! receiver: `PUT /v1/routes/{name}` records `route.updated` and the next notification is
//! routed and delivered by it, with no restart; a change and a delete take effect from the next
//! event on while deliveries already made keep their route; the configuration file's routes are
//! listed beside them and stay the file's (`409 route_from_config`); a secret is never served
//! or logged; a file naming a route the API holds refuses the start; the CLI does the same.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts};

use crate::common::{
    append_ok, cli_at, cli_ok, cli_with, notif_ev, python_json, serve_local, wait_for, wait_hit,
    webhook_id,
};
use crate::e2e_deliveries::wait_status;
use crate::e2e_dispatch::{delivery, receiver};

const CONFIG: &str = r#"
[notifications.routes.pager]
sink = "app"
types = ["page"]
[notifications.routing]
urgent = ["dashboard", "desktop", "pager"]
"#;

fn notification(id: &str, priority: &str) -> Value {
    notif_ev(
        id,
        json!({"priority": priority, "title": format!("title of {id}"), "recipient": "ops@example.org"}),
    )
}

async fn put_route(s: &Server, name: &str, body: &Value) -> tidemark_tests::Reply {
    s.send(
        s.request(reqwest::Method::PUT, &format!("/v1/routes/{name}"))
            .json(body),
    )
    .await
}

async fn delete_route(s: &Server, name: &str, body: &Value) -> tidemark_tests::Reply {
    s.send(
        s.request(reqwest::Method::DELETE, &format!("/v1/routes/{name}"))
            .json(body),
    )
    .await
}

/// Wait until the router has handled `id` (its desktop delivery exists), then say whether it
/// made a delivery on `route`.
async fn routed_to(s: &Server, id: &str, route: &str) -> bool {
    wait_for(
        Duration::from_secs(30),
        &format!("notification {id} routed"),
        || async {
            let d = delivery(s, &format!("dlv:{id}:desktop")).await;
            (!d.is_null()).then_some(())
        },
    )
    .await;
    !delivery(s, &format!("dlv:{id}:{route}")).await.is_null()
}

#[tokio::test]
async fn a_route_added_through_the_api_delivers_from_the_next_event_on() {
    let (hits, port) = receiver().await;
    let secret = tidemark_tests::secret("whsec-routes-api-literal-5f2e9a");
    let mut s = Server::start(ServerOpts::default().config(CONFIG)).await;

    // The file's route is listed, as the file's.
    let r = s.get("/v1/routes").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let pager = r.json["routes"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == "pager"))
        .cloned()
        .unwrap_or_else(|| panic!("the file's route is listed: {}", r.text));
    assert_eq!(pager["origin"], "config", "{pager}");
    assert_eq!(pager["route"]["sink"], "app", "{pager}");
    assert_eq!(pager["route"]["priorities"], json!(["urgent"]), "{pager}");

    // Before the route exists, an urgent notification goes nowhere else.
    append_ok(&s, &notification("r-before", "urgent")).await;
    assert!(!routed_to(&s, "r-before", "teams").await);

    // Add a webhook route through the API: the next urgent notification is POSTed to it.
    let url = format!("http://127.0.0.1:{port}/hook");
    let body = json!({"route": {"sink": "webhook", "url": url, "secret": secret,
                                "priorities": ["urgent"]},
                      "reason": "the teams channel wants urgent ones"});
    let r = put_route(&s, "teams", &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["origin"], "api", "{}", r.text);
    assert_eq!(r.json["route"]["secret"], "***", "{}", r.text);
    assert_eq!(
        r.json["route"]["url"],
        format!("http://127.0.0.1:{port}"),
        "the URL by scheme, host and port: {}",
        r.text
    );
    assert_eq!(r.json["reason"], "the teams channel wants urgent ones");
    assert!(
        r.json["updated_seq"].as_u64().is_some_and(|q| q > 0),
        "{}",
        r.text
    );
    assert!(
        !r.text.contains(&secret),
        "the secret is served: {}",
        r.text
    );

    append_ok(&s, &notification("r-one", "urgent")).await;
    let sent = wait_status(&s, "dlv:r-one:teams", "sent").await;
    assert_eq!(sent["sink"], "webhook", "{sent}");
    assert_eq!(sent["route"], "teams", "{sent}");
    let hit = wait_for(Duration::from_secs(30), "the POST", || async {
        hits.lock()
            .unwrap()
            .iter()
            .find(|(_, b)| b["delivery_id"] == "dlv:r-one:teams")
            .cloned()
    })
    .await;
    assert_eq!(hit.0["webhook-id"], "dlv:r-one:teams");
    assert!(
        hit.0["webhook-signature"]
            .to_str()
            .unwrap_or_default()
            .starts_with("v1,"),
        "signed under the route's secret: {:?}",
        hit.0
    );

    // The event records the route; served, its secret reads "[redacted]".
    let evs = s.read_all("stream=routes").await;
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0]["type"], "route.updated");
    assert_eq!(evs[0]["subject"], "teams");
    assert_eq!(evs[0]["payload"]["route"]["secret"], "[redacted]");
    assert_eq!(
        evs[0]["payload"]["reason"],
        "the teams channel wants urgent ones"
    );
    assert!(
        evs[0]["payload"].get("by").is_some(),
        "by is recorded (null in open mode)"
    );
    let all = s.get("/v1/events?limit=1000").await.text;
    assert!(!all.contains(&secret), "the secret is served in the events");

    // Bad input changes nothing: an unknown key, a missing sink (a new route's, a removed
    // one), a bad URL, a bad priority, no reason, a built-in name, a name too long, the file's
    // route.
    let long_name = "n".repeat(129);
    let bad: [(&str, Value, StatusCode, &str, &str); 9] = [
        (
            "teams",
            json!({"route": {"sink": "webhook", "url": url, "sinc": 1}, "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_route",
            "route.sinc is not a known key",
        ),
        // A new route needs a sink (a change of a held one keeps the sink it omits, spec
        // section 4; removing it with null is the same mistake).
        (
            "fresh",
            json!({"route": {"types": ["a"]}, "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_route",
            "route.sink is required",
        ),
        (
            "teams",
            json!({"route": {"sink": null}, "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_route",
            "route.sink is required",
        ),
        (
            "teams",
            json!({"route": {"sink": "webhook", "url": "ftp://x/"}, "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_route",
            "route.url",
        ),
        (
            "teams",
            json!({"route": {"sink": "app", "priorities": ["loud"]}, "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_route",
            "route.priorities",
        ),
        (
            "teams",
            json!({"route": {"sink": "app"}, "reason": " "}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "reason_required",
            "",
        ),
        (
            "desktop",
            json!({"route": {"sink": "app"}, "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_route",
            "built-in",
        ),
        (
            &long_name,
            json!({"route": {"sink": "app"}, "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_route",
            "a route name",
        ),
        (
            "pager",
            json!({"route": {"sink": "app"}, "reason": "x"}),
            StatusCode::CONFLICT,
            "route_from_config",
            "configured in the file",
        ),
    ];
    let head = s.head().await;
    for (name, body, status, code, says) in bad {
        let r = put_route(&s, name, &body).await;
        assert_eq!(r.status, status, "PUT {name} {body}: {}", r.text);
        assert_eq!(r.json["code"], code, "{}", r.text);
        assert!(r.text.contains(says), "{says:?} in {}", r.text);
    }
    let r = delete_route(&s, "pager", &json!({"reason": "x"})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let r = delete_route(&s, "nope", &json!({"reason": "x"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert_eq!(r.json["code"], "route_not_found", "{}", r.text);
    assert_eq!(s.head().await, head, "a refused change appended nothing");

    // Moved to `action`: an urgent notification no longer takes it, an action one does; the
    // delivery made before keeps its route.
    let moved = json!({"route": {"sink": "webhook", "url": url, "secret": secret,
                                 "priorities": ["action"]},
                       "reason": "urgent ones page now; actions go to teams"});
    let r = put_route(&s, "teams", &moved).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json["route"]["priorities"],
        json!(["action"]),
        "{}",
        r.text
    );
    append_ok(&s, &notification("r-urgent", "urgent")).await;
    assert!(
        !routed_to(&s, "r-urgent", "teams").await,
        "urgent no longer takes teams"
    );
    append_ok(&s, &notification("r-action", "action")).await;
    wait_status(&s, "dlv:r-action:teams", "sent").await;
    assert_eq!(delivery(&s, "dlv:r-one:teams").await["status"], "sent");

    // A restart keeps it (it is in the log, not the file).
    s.sigterm();
    s.wait_exit(Duration::from_secs(30)).await;
    s.restart().await;
    append_ok(&s, &notification("r-restarted", "action")).await;
    wait_status(&s, "dlv:r-restarted:teams", "sent").await;

    // The CLI lists and shows it, without the secret.
    let base = s.base().to_owned();
    let text = cli_ok(&cli_at(&base, "routes list -o json").await, "routes list");
    assert!(text.contains("teams") && text.contains("pager"), "{text}");
    assert!(!text.contains(&secret), "{text}");

    // Deleted: the next action notification does not take it; the route is gone.
    let r = delete_route(&s, "teams", &json!({"reason": "channel archived"})).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    assert_eq!(
        s.get("/v1/routes/teams").await.status,
        StatusCode::NOT_FOUND
    );
    append_ok(&s, &notification("r-after", "action")).await;
    assert!(!routed_to(&s, "r-after", "teams").await);
    let evs = s.read_all("stream=routes").await;
    assert_eq!(
        evs.iter()
            .map(|e| e["type"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["route.updated", "route.updated", "route.deleted"]
    );
    assert_eq!(evs[2]["payload"]["reason"], "channel archived");
}

/// The CLI sets a route, and a file that names a route the API holds refuses the start,
/// naming it.
#[tokio::test]
async fn a_file_naming_a_route_the_api_holds_refuses_the_start() {
    let mut s = Server::start(ServerOpts::default().config(CONFIG)).await;
    let base = s.base().to_owned();
    let more = [
        "--json",
        r#"{"delay": ["0s", "1s"]}"#,
        "--reason",
        "ops app",
    ];
    let set = "routes set ops --sink app --priority urgent";
    cli_ok(&cli_with(&base, set, &more).await, set);
    let r = s.get("/v1/routes/ops").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["route"]["delay"], json!(["0s", "1s"]), "{}", r.text);
    s.sigterm();
    s.wait_exit(Duration::from_secs(30)).await;
    let clash = format!("{CONFIG}[notifications.routes.ops]\nsink = \"app\"\n");
    let err = match Server::try_start(
        ServerOpts::default()
            .config(clash)
            .seed_data(s.data_dir().to_path_buf()),
    )
    .await
    {
        Ok(_) => panic!("started with a file naming the API's route"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("notifications.routes.ops") && err.contains("managed through the API"),
        "{err}"
    );
}

/// Rotate a webhook route's secret with no gap (spec section 4): after the change the POST
/// carries both signatures (`webhook-signature: v1,<new> v1,<old>`) for the route's
/// `rotation_overlap`, and the stock Standard Webhooks verifier accepts the message with either
/// key; with an overlap of `0s` only the new key signs, and the old one is refused.
#[tokio::test]
async fn a_secret_rotates_with_both_signatures_during_the_overlap() {
    use base64::Engine as _;
    let (hits, port) = receiver().await;
    let s = Server::start(ServerOpts::default().config(CONFIG)).await;
    let key = || {
        tidemark_tests::secret(format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(tidemark_tests::random_token(32))
        ))
    };
    let (old, new, newest) = (key(), key(), key());
    let url = format!("http://127.0.0.1:{port}/hook");
    let route = |secret: &str, overlap: &str| {
        json!({"route": {"sink": "webhook", "url": url, "secret": secret,
                         "rotation_overlap": overlap, "priorities": ["urgent"]},
               "reason": "rotate the signing key"})
    };
    let r = put_route(&s, "rot", &route(&old, "1h")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.json.get("previous_secret_until").is_none(), "{}", r.text);
    let r = put_route(&s, "rot", &route(&new, "1h")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.json["previous_secret_until"].is_string(), "{}", r.text);
    assert!(
        !r.text.contains(&old) && !r.text.contains(&new),
        "{}",
        r.text
    );

    let posted = |id: &'static str| {
        let hits = hits.clone();
        async move { wait_hit(&hits, "the POST", |(_, b)| b["delivery_id"] == id).await }
    };
    append_ok(&s, &notification("rot-1", "urgent")).await;
    let (headers, body) = posted("dlv:rot-1:rot").await;
    let sig = headers["webhook-signature"].to_str().unwrap().to_owned();
    assert_eq!(sig.split(' ').count(), 2, "both signatures: {sig}");
    assert!(sig.split(' ').all(|p| p.starts_with("v1,")), "{sig}");

    // With no overlap the old key stops signing at once.
    let r = put_route(&s, "rot", &route(&newest, "0s")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.json.get("previous_secret_until").is_none(), "{}", r.text);
    append_ok(&s, &notification("rot-2", "urgent")).await;
    let (headers2, body2) = posted("dlv:rot-2:rot").await;
    let sig2 = headers2["webhook-signature"].to_str().unwrap().to_owned();
    assert_eq!(sig2.split(' ').count(), 1, "one signature: {sig2}");

    // The stock verifier, on the exact headers and body each POST carried.
    let h = |m: &axum::http::HeaderMap| {
        json!({
            "webhook-id": m["webhook-id"].to_str().unwrap(),
            "webhook-timestamp": m["webhook-timestamp"].to_str().unwrap(),
            "webhook-signature": m["webhook-signature"].to_str().unwrap(),
        })
    };
    let cases = json!([
        {"key": old, "body": body.to_string(), "headers": h(&headers), "want": true},
        {"key": new, "body": body.to_string(), "headers": h(&headers), "want": true},
        {"key": newest, "body": body.to_string(), "headers": h(&headers), "want": false},
        {"key": newest, "body": body2.to_string(), "headers": h(&headers2), "want": true},
        {"key": new, "body": body2.to_string(), "headers": h(&headers2), "want": false},
    ]);
    let script = r#"
import json, sys
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
out = []
for c in json.load(sys.stdin):
    try:
        Webhook(c["key"]).verify(c["body"], c["headers"])
        out.append(True)
    except WebhookVerificationError:
        out.append(False)
print(json.dumps(out))
"#;
    let what = "the Standard Webhooks verifier failed (tests/webhooks/requirements.txt)";
    let got = python_json(script, &cases, what).await;
    let want: Vec<Value> = cases
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["want"].clone())
        .collect();
    assert_eq!(
        got,
        Value::Array(want),
        "verified with old, new, newest; then newest, new"
    );
}

/// A receiver answering each POST with the status `answer` holds, recording each `webhook-id`.
pub(crate) async fn scripted_receiver(
    answer: std::sync::Arc<std::sync::atomic::AtomicU16>,
) -> (std::sync::Arc<std::sync::Mutex<Vec<String>>>, u16) {
    use std::sync::{Arc, Mutex};
    let ids: Arc<Mutex<Vec<String>>> = Arc::default();
    let i = ids.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let (i, answer) = (i.clone(), answer.clone());
            async move {
                let id = webhook_id(&headers);
                i.lock().unwrap().push(id);
                StatusCode::from_u16(answer.load(std::sync::atomic::Ordering::SeqCst))
                    .unwrap_or(StatusCode::OK)
            }
        }),
    );
    let port = serve_local(app).await.port();
    (ids, port)
}

/// Resend and recover (spec section 17): an operator resends a sent delivery, which is POSTed
/// again as a new attempt on its timeline with the same `webhook-id`; and retries, in one
/// call, every parked delivery of a route made since a time, answered with the count. Both
/// need a reason; a resend of a delivery that is not sent is `409`.
#[tokio::test]
async fn an_operator_resends_a_delivery_and_recovers_a_routes_parked_ones() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU16, Ordering};
    let answer = Arc::new(AtomicU16::new(200));
    let (ids, port) = scripted_receiver(answer.clone()).await;
    let s = Server::start(ServerOpts::default().config(CONFIG)).await;
    let r = put_route(
        &s,
        "rec",
        &json!({"route": {"sink": "webhook", "url": format!("http://127.0.0.1:{port}/hook"),
                          "priorities": ["urgent"]}, "reason": "recover test"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let post = |path: &str, body: Value| {
        let rb = s.request(reqwest::Method::POST, path).json(&body);
        s.send(rb)
    };

    // Resend a sent delivery: the same webhook-id again, a new attempt on its timeline.
    append_ok(&s, &notification("rs-1", "urgent")).await;
    wait_status(&s, "dlv:rs-1:rec", "sent").await;
    let r = post("/v1/deliveries/dlv:rs-1:rec/resend", json!({"reason": " "})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(r.json["code"], "reason_required", "{}", r.text);
    let r = post(
        "/v1/deliveries/dlv:rs-1:rec/resend",
        json!({"reason": "the receiver lost it"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "queued", "{}", r.text);
    wait_for(Duration::from_secs(30), "the second POST", || async {
        (ids.lock()
            .unwrap()
            .iter()
            .filter(|i| *i == "dlv:rs-1:rec")
            .count()
            == 2)
            .then_some(())
    })
    .await;
    let d = wait_status(&s, "dlv:rs-1:rec", "sent").await;
    let steps: Vec<&str> = d["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .filter_map(|t| t["event"].as_str())
        .collect();
    assert_eq!(
        steps,
        ["created", "leased", "sent", "resent", "leased", "sent"],
        "{d}"
    );
    let resent = s.read_all("stream=deliveries&type=delivery.resent").await;
    assert_eq!(resent.len(), 1, "{resent:?}");
    assert_eq!(resent[0]["payload"]["reason"], "the receiver lost it");

    // A resend of a delivery that is not sent changes nothing.
    answer.store(404, Ordering::SeqCst);
    let since = tidemark_log::time::format_micros(tidemark_log::time::now_micros());
    for id in ["rp-1", "rp-2"] {
        append_ok(&s, &notification(id, "urgent")).await;
    }
    for id in ["dlv:rp-1:rec", "dlv:rp-2:rec"] {
        let d = wait_status(&s, id, "parked").await;
        assert_eq!(d["last_error_code"], "http_404", "{d}");
    }
    let r = post(
        "/v1/deliveries/dlv:rp-1:rec/resend",
        json!({"reason": "not sent yet"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.json["code"], "illegal_transition", "{}", r.text);

    // Recover: every parked delivery of the route since `since`, in one call.
    answer.store(200, Ordering::SeqCst);
    let r = post(
        "/v1/deliveries/recover",
        json!({"route": "rec", "since": "2999-01-01T00:00:00Z", "reason": "too late"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json, json!({"retried": 0, "more": false}));
    let r = post(
        "/v1/deliveries/recover",
        json!({"route": "rec", "since": since, "reason": "the endpoint is fixed"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json, json!({"retried": 2, "more": false}));
    for id in ["dlv:rp-1:rec", "dlv:rp-2:rec"] {
        wait_status(&s, id, "sent").await;
    }
    let retried = s.read_all("stream=deliveries&type=delivery.retried").await;
    assert_eq!(retried.len(), 2, "{retried:?}");
    assert!(
        retried
            .iter()
            .all(|e| e["payload"]["reason"] == "the endpoint is fixed"),
        "{retried:?}"
    );
    let r = post(
        "/v1/deliveries/recover",
        json!({"route": "rec", "since": "yesterday", "reason": "x"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    // The CLI: nothing is parked any more.
    let base = s.base().to_owned();
    let recover = format!("deliveries recover --route rec --since {since} --reason again -o json");
    let out = cli_at(&base, &recover).await;
    let v: Value = serde_json::from_str(&cli_ok(&out, &recover)).expect("JSON");
    assert_eq!(v, json!({"retried": 0, "more": false}));
}

/// Run the CLI against `base` (`cmd`, then the words `more`); its stdout, once it succeeded.
async fn cli_stdout(base: &str, cmd: &str, more: &[&str]) -> String {
    cli_ok(&cli_with(base, cmd, more).await, cmd)
}

/// The CLI sets a route's body, order and pace with flags of their own (and keeps them across
/// an edit that names none), and previews what the route sends.
#[tokio::test]
async fn the_cli_sets_a_body_an_order_and_a_pace_and_previews_the_route() {
    let s = Server::start(ServerOpts::default().config(CONFIG)).await;
    let base = s.base().to_owned();
    let set = "routes set chat --sink webhook \
               --webhook-url https://chat.example.org/hooks/T000/B000/secret-path \
               --body slack --order-by task --on-park skip --rate 5/s --priority urgent";
    cli_stdout(&base, set, &["--reason", "the team's chat"]).await;
    let r = s.get("/v1/routes/chat").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["route"]["body"], "slack", "{}", r.text);
    assert_eq!(
        r.json["route"]["ordering"],
        json!({"key": "task", "on_park": "skip"}),
        "{}",
        r.text
    );
    assert_eq!(r.json["route"]["rate"], "5/s", "{}", r.text);
    // An edit that names none of them keeps them.
    let set = "routes set chat --priority action";
    cli_stdout(&base, set, &["--reason", "and action"]).await;
    let r = s.get("/v1/routes/chat").await;
    assert_eq!(
        (
            r.json["route"]["body"].as_str(),
            r.json["route"]["rate"].as_str()
        ),
        (Some("slack"), Some("5/s")),
        "{}",
        r.text
    );
    // The preview: Slack's `text`, nothing sent, the URL's path nowhere.
    let out = cli_stdout(&base, "routes preview chat", &[]).await;
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let body: Value = serde_json::from_str(v["body"].as_str().unwrap_or_default()).unwrap();
    assert!(
        body["text"].as_str().is_some_and(|t| !t.is_empty()),
        "{out}"
    );
    assert!(!out.contains("secret-path"), "{out}");
    // A rate that is not one is refused, naming the form.
    let bad = cli_at(&base, "routes set chat --rate fast --reason r").await;
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("<n>/<s|m|h>"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
