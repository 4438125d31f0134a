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

use crate::common::{append_ok, notif_ev, wait_for};
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

    // Bad input changes nothing: an unknown key, a missing sink, a bad URL, a bad priority, no
    // reason, a built-in name, a bad name, the file's route.
    let bad: [(&str, Value, StatusCode, &str, &str); 8] = [
        (
            "teams",
            json!({"route": {"sink": "webhook", "url": url, "sinc": 1}, "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_route",
            "route.sinc is not a known key",
        ),
        (
            "teams",
            json!({"route": {"types": ["a"]}, "reason": "x"}),
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
            "Bad%20Name",
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
    let out = tidemark_tests::run_cli(
        &["routes", "list", "--url", &base, "-o", "json"],
        "",
        Duration::from_secs(30),
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let args = [
        "routes",
        "set",
        "ops",
        "--sink",
        "app",
        "--priority",
        "urgent",
        "--json",
        r#"{"delay": ["0s", "1s"]}"#,
        "--reason",
        "ops app",
        "--url",
        &base,
    ];
    let out = tidemark_tests::run_cli(&args, "", Duration::from_secs(30)).await;
    assert!(
        out.status.success(),
        "{} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
