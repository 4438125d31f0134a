//! The status record of a notification (spec section 14): `GET /v1/notifications/{id}` reaches
//! every status through the API a client and an operator use — `dashboard_only`, `skipped`,
//! `pending`, `delivered`, `parked`, `discarded`, `cancelled` — with the attempts, last error,
//! times and deliveries of each, a notification that joined a digest counting the digest's
//! delivery as its own; and `GET /v1/deliveries?notification_id=` finds the same deliveries
//! from an index.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Reply, Server, ServerOpts, assert_problem_for, encode_path};

use crate::common::{append_ok, check_time, get_list, notif_ev, task_ev, wait_for};

const WAIT: Duration = Duration::from_secs(30);

/// Info notifications also go to `pager`, a route nothing defines (skipped, `unknown_route`);
/// the desktop route collects notifications of one recipient and group into a digest.
const CFG: &str = "[notifications.routing]\ninfo = [\"dashboard\", \"pager\"]\n\n\
                   [notifications.routes.desktop]\ndigest = { window = \"10m\", max_items = 3 }\n";

async fn post(api: &Api, path: &str, body: &Value) -> Reply {
    api.send(api.request(Method::POST, path).json(body)).await
}

async fn status(api: &Api, id: &str) -> Value {
    let r = api
        .get(&format!("/v1/notifications/{}", encode_path(id)))
        .await;
    assert_eq!(r.status, StatusCode::OK, "status of {id}: {}", r.text);
    assert!(r.json["as_of_seq"].is_u64(), "{}", r.text);
    r.json
}

/// Wait (bounded) until notification `id` has status `want`.
async fn wait_status(api: &Api, id: &str, want: &str) -> Value {
    wait_for(WAIT, &format!("notification {id} to be {want}"), || async {
        let s = status(api, id).await;
        (s["status"] == want).then_some(s)
    })
    .await
}

async fn deliveries_of(api: &Api, notification_id: &str) -> Vec<String> {
    let id = encode_path(notification_id);
    let path = format!("/v1/deliveries?notification_id={id}&limit=10");
    let rows = get_list(api, &path, "deliveries").await;
    rows.iter()
        .map(|d| d["id"].as_str().expect("id").to_owned())
        .collect()
}

fn urgent(id: &str, extra: Value) -> Value {
    let mut p = json!({"priority": "urgent", "title": format!("title of {id}")});
    for (k, v) in extra.as_object().expect("object") {
        p[k] = v.clone();
    }
    notif_ev(id, p)
}

#[tokio::test]
async fn every_status_is_reached_through_the_api() {
    let s = Server::start(ServerOpts::default().config(CFG)).await;

    // Three urgent ones, claimed together: one is completed, two fail for good (parked), and
    // an operator discards one of those.
    append_ok(
        &s,
        &json!({"events": [
            urgent("s-sent", json!({})),
            urgent("s-park", json!({})),
            urgent("s-disc", json!({})),
        ]}),
    )
    .await;
    for id in ["s-sent", "s-park", "s-disc"] {
        let st = wait_status(&s, id, "pending").await;
        assert_eq!(st["deliveries"][0]["status"], "queued", "{st}");
    }
    let claim = json!({"sink": "app", "owner": "w", "limit": 10, "lease_ms": 60_000});
    let r = post(&s, "/v1/deliveries/claim", &claim).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let claimed = r.json["deliveries"].as_array().map(Vec::len);
    assert_eq!(claimed, Some(3), "{}", r.text);
    let leased = status(&s, "s-sent").await;
    assert_eq!(
        leased["status"], "pending",
        "a leased delivery is pending: {leased}"
    );
    assert_eq!(leased["attempts"], 1, "{leased}");
    let owner = json!({"owner": "w"});
    let r = post(&s, "/v1/deliveries/dlv:s-sent:desktop/complete", &owner).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for id in ["s-park", "s-disc"] {
        let fail = json!({"owner": "w", "error_code": "gone",
                          "error": format!("receiver of {id} gone"), "retryable": false});
        let r = post(&s, &format!("/v1/deliveries/dlv:{id}:desktop/fail"), &fail).await;
        assert_eq!(r.json["status"], "parked", "{}", r.text);
    }
    let reason = json!({"reason": "not needed"});
    let r = post(&s, "/v1/deliveries/dlv:s-disc:desktop/discard", &reason).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // A task's cancellation cancels its undelivered delivery; a warning is dashboard-only; an
    // info one is also routed to an undefined route (skipped); two of one group form a digest.
    append_ok(
        &s,
        &json!({"events": [
            task_ev("t-canc", "task.created", json!({"project_id": "p"})),
            urgent("s-canc", json!({"task_id": "t-canc"})),
            urgent("s-pend", json!({})),
            notif_ev("s-dash", json!({"priority": "warning", "title": "heads up"})),
            notif_ev("s-skip", json!({"priority": "info", "title": "fyi"})),
            notif_ev("s-g1", json!({"priority": "action", "title": "one", "recipient": "ann",
                                    "group_key": "g"})),
            notif_ev("s-g2", json!({"priority": "action", "title": "two", "recipient": "ann",
                                    "group_key": "g"})),
        ]}),
    )
    .await;
    wait_status(&s, "s-canc", "pending").await;
    append_ok(
        &s,
        &task_ev("t-canc", "task.canceled", json!({"reason": "stop"})),
    )
    .await;

    let sent = wait_status(&s, "s-sent", "delivered").await;
    assert_eq!(sent["attempts"], 1, "{sent}");
    assert_eq!(sent["last_error"], Value::Null, "{sent}");
    check_time(sent["delivered_at"].as_str().expect("delivered_at"));
    assert_eq!(sent["notification"]["notification_id"], "s-sent", "{sent}");
    assert_eq!(sent["notification"]["title"], "title of s-sent", "{sent}");
    assert_eq!(
        sent["enqueued_at"], sent["created_at"],
        "no source: the event time"
    );
    assert_eq!(sent["created_at"], sent["notification"]["time"], "{sent}");
    assert_eq!(
        sent["deliveries"],
        json!([{"id": "dlv:s-sent:desktop", "route": "desktop", "sink": "app",
                "status": "sent", "attempts": 1}]),
        "{sent}"
    );

    let parked = wait_status(&s, "s-park", "parked").await;
    assert_eq!(parked["last_error"], "receiver of s-park gone", "{parked}");
    assert_eq!(parked["attempts"], 1, "{parked}");
    assert_eq!(parked["delivered_at"], Value::Null, "{parked}");

    let discarded = wait_status(&s, "s-disc", "discarded").await;
    assert_eq!(
        discarded["last_error"], "receiver of s-disc gone",
        "{discarded}"
    );

    let cancelled = wait_status(&s, "s-canc", "cancelled").await;
    assert_eq!(
        cancelled["deliveries"][0]["status"], "cancelled",
        "{cancelled}"
    );

    let pending = wait_status(&s, "s-pend", "pending").await;
    assert_eq!(pending["attempts"], 0, "{pending}");

    let dash = status(&s, "s-dash").await;
    assert_eq!(dash["status"], "dashboard_only", "{dash}");
    assert_eq!(dash["deliveries"], json!([]), "{dash}");
    assert_eq!(dash["notification"]["priority"], "warning", "{dash}");

    let skipped = wait_status(&s, "s-skip", "skipped").await;
    assert_eq!(skipped["deliveries"][0]["route"], "pager", "{skipped}");
    assert_eq!(skipped["deliveries"][0]["sink"], "none", "{skipped}");

    // s-g2 joined the digest delivery of s-g1: it is its own, in the record and the filter.
    let g2 = wait_for(WAIT, "s-g2 to join the digest", || async {
        let st = status(&s, "s-g2").await;
        (st["deliveries"].as_array().is_some_and(|d| !d.is_empty())).then_some(st)
    })
    .await;
    assert_eq!(g2["status"], "pending", "{g2}");
    assert_eq!(g2["deliveries"][0]["id"], "dlv:s-g1:desktop", "{g2}");
    assert_eq!(deliveries_of(&s, "s-g2").await, ["dlv:s-g1:desktop"]);
    assert_eq!(deliveries_of(&s, "s-g1").await, ["dlv:s-g1:desktop"]);

    // The filter finds each notification's own deliveries and nothing else.
    assert_eq!(deliveries_of(&s, "s-sent").await, ["dlv:s-sent:desktop"]);
    assert_eq!(deliveries_of(&s, "s-skip").await, ["dlv:s-skip:pager"]);
    assert!(deliveries_of(&s, "s-dash").await.is_empty());
    assert!(deliveries_of(&s, "nobody").await.is_empty());
    let r = s
        .get("/v1/deliveries?notification_id=s-park&status=parked&sink=app")
        .await;
    assert_eq!(
        r.json["deliveries"].as_array().map(Vec::len),
        Some(1),
        "{}",
        r.text
    );
    let r = s
        .get("/v1/deliveries?notification_id=s-park&status=sent")
        .await;
    assert_eq!(r.json["deliveries"], json!([]), "{}", r.text);

    // Unknown ids, bad ids and unknown parameters.
    let r = s.get("/v1/notifications/no-such-thing").await;
    assert_problem_for(&r, 404, "notification_not_found", "an unknown id");
    let r = s.get("/v1/notifications/a%07b").await;
    assert_problem_for(&r, 400, "invalid_path", "a control character");
    let r = s.get("/v1/notifications/s-sent?verbose=1").await;
    assert_problem_for(&r, 400, "unknown_parameter", "an unknown parameter");
    let r = s
        .get(&format!(
            "/v1/deliveries?notification_id={}",
            "x".repeat(300)
        ))
        .await;
    assert_problem_for(&r, 400, "invalid_query", "an over-long notification id");

    // A rebuild of the deliveries model gives the same answers (the index is derived).
    let before = status(&s, "s-g2").await;
    let r = post(&s, "/v1/admin/projections/deliveries/rebuild", &json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["identical"], true, "{}", r.text);
    let after = status(&s, "s-g2").await;
    assert_eq!(before["deliveries"], after["deliveries"]);
    assert_eq!(deliveries_of(&s, "s-g2").await, ["dlv:s-g1:desktop"]);
}

/// `[notifications.dashboard]`: `limit` is the default page size of the dashboard list, and
/// `enabled = false` makes it answer an empty list with `"dashboard_enabled": false` (the
/// notifications and their status records are still kept).
#[tokio::test]
async fn the_dashboard_knobs_are_honoured() {
    let s =
        Server::start(ServerOpts::default().config("[notifications.dashboard]\nlimit = 3\n")).await;
    let batch: Vec<Value> = (0..5)
        .map(|i| notif_ev(&format!("k-{i}"), json!({"priority": "info", "title": "t"})))
        .collect();
    append_ok(&s, &json!({ "events": batch })).await;
    let r = s.get("/v1/notifications").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json["notifications"].as_array().map(Vec::len),
        Some(3),
        "{}",
        r.text
    );
    assert!(r.json.get("dashboard_enabled").is_none(), "{}", r.text);
    let r = s.get("/v1/notifications?limit=5").await;
    assert_eq!(
        r.json["notifications"].as_array().map(Vec::len),
        Some(5),
        "{}",
        r.text
    );
    drop(s);

    let s =
        Server::start(ServerOpts::default().config("[notifications.dashboard]\nenabled = false\n"))
            .await;
    append_ok(
        &s,
        &notif_ev("k-off", json!({"priority": "info", "title": "t"})),
    )
    .await;
    let r = s.get("/v1/notifications").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["notifications"], json!([]), "{}", r.text);
    assert_eq!(r.json["dashboard_enabled"], false, "{}", r.text);
    assert_eq!(status(&s, "k-off").await["status"], "dashboard_only");
    let r =
        Server::try_start(ServerOpts::default().config("[notifications.dashboard]\nlimit = 0\n"))
            .await;
    assert!(r.is_err(), "a limit outside 1–500 is refused at start");
}
