//! The checks on a client's append that requests notifications (spec section 14): the crisis
//! hard-block (a notification for a recipient suppressed at the head is refused `409
//! recipient_blocked`, the whole batch with it, and nothing of it is kept anywhere: not in the
//! log, not in a read model, not in the server's log), the order of the checks (a conflicting
//! `event_id` is `409 conflict` first), suppressions applied in the batch's own order, and exact
//! duplicates answered `duplicate: true` — never blocked, and not refused by a full outbox.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, assert_problem_for};

use crate::common::{append_ok, notif_ev, task_ev};

fn recipient_ev(who: &str, ty: &str, payload: Value) -> Value {
    json!({"stream": "recipients", "subject": who, "type": ty, "payload": payload})
}

/// A notification whose title and body carry `secret`, a text that must never be kept when it
/// is blocked.
fn private_notif(id: &str, who: &str, secret: &str) -> Value {
    notif_ev(
        id,
        json!({"priority": "urgent", "title": format!("about {secret}"),
               "body": format!("details of {secret}"), "recipient": who}),
    )
}

async fn append(api: &Api, body: &Value) -> tidemark_tests::Reply {
    api.send(api.request(Method::POST, "/v1/events").json(body))
        .await
}

/// Every place a blocked request could have left its text: the log, the dashboard, the
/// deliveries, the status record and the server's log.
async fn assert_nowhere(s: &Server, secret: &str) {
    for what in [
        "/v1/events?limit=1000",
        "/v1/notifications?limit=500",
        "/v1/deliveries?limit=1000",
    ] {
        let r = s.get(what).await;
        assert_eq!(r.status, StatusCode::OK, "{what}: {}", r.text);
        assert!(
            !r.text.contains(secret),
            "{what} holds the blocked text: {}",
            r.text
        );
    }
    assert!(
        !s.all_stderr().contains(secret),
        "the server log holds the blocked text"
    );
}

#[tokio::test]
async fn a_suppressed_recipient_blocks_the_whole_batch_and_nothing_is_kept() {
    let s = Server::start(ServerOpts::default().env("RUST_LOG", "debug")).await;
    append_ok(
        &s,
        &json!({"events": [
            recipient_ev("carol", "recipient.suppressed", json!({"reason": "crisis"})),
            recipient_ev("erin", "recipient.suppressed",
                         json!({"reason": "old", "until": "2020-01-01T00:00:00Z"})),
        ]}),
    )
    .await;
    let head = s.head().await;

    // A mixed batch: a lifecycle event, a notification for someone else, one for carol.
    let r = append(
        &s,
        &json!({"events": [
            task_ev("t-1", "task.created", json!({"project_id": "p"})),
            private_notif("n-dave", "dave", "nothing secret"),
            private_notif("n-carol", "carol", "SECRET-CAROL-1"),
        ]}),
    )
    .await;
    assert_problem_for(
        &r,
        409,
        "recipient_blocked",
        "a batch with carol's notification",
    );
    assert_eq!(r.json["blocked"], json!([2]), "{}", r.text);
    assert_eq!(r.json["outcome"], "blocked", "{}", r.text);
    assert_eq!(r.json["status"], 409, "{}", r.text);
    assert!(
        !r.text.contains("SECRET-CAROL-1") && !r.text.contains("carol"),
        "{}",
        r.text
    );
    assert_eq!(s.head().await, head, "nothing of the batch is appended");
    let r = s.get("/v1/notifications/n-dave").await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "the batch went whole: {}",
        r.text
    );

    // Suppressions are applied in the batch's order: suppress, then notify → blocked;
    // unsuppress, then notify → accepted.
    let r = append(
        &s,
        &json!({"events": [
            recipient_ev("frank", "recipient.suppressed", json!({"reason": "now"})),
            private_notif("n-frank", "frank", "SECRET-FRANK"),
        ]}),
    )
    .await;
    assert_problem_for(
        &r,
        409,
        "recipient_blocked",
        "suppressed earlier in the batch",
    );
    assert_eq!(r.json["blocked"], json!([1]), "{}", r.text);
    append_ok(
        &s,
        &json!({"events": [
            recipient_ev("carol", "recipient.unsuppressed", json!({})),
            notif_ev("n-carol-ok", json!({"priority": "urgent", "title": "hello", "recipient": "carol"})),
        ]}),
    )
    .await;
    // A suppression whose `until` has passed does not block.
    append_ok(
        &s,
        &notif_ev(
            "n-erin",
            json!({"priority": "urgent", "title": "hi", "recipient": "erin"}),
        ),
    )
    .await;
    assert_eq!(
        s.get("/v1/notifications/n-erin").await.status,
        StatusCode::OK
    );

    // Accepted before a suppression: sending it again is a duplicate, never blocked; the same
    // id with other content is the conflict, checked before the block.
    let dave = notif_ev(
        "n-dave-2",
        json!({"priority": "urgent", "title": "t", "recipient": "dave"}),
    );
    let first = append_ok(&s, &dave).await;
    append_ok(
        &s,
        &recipient_ev("dave", "recipient.suppressed", json!({"reason": "crisis"})),
    )
    .await;
    let again = append_ok(&s, &dave).await;
    assert_eq!(again[0].1, first[0].1, "the same seq");
    assert!(again[0].2, "answered as a duplicate");
    let other = notif_ev(
        "n-dave-2",
        json!({"priority": "urgent", "title": "other", "recipient": "dave"}),
    );
    let r = append(&s, &other).await;
    assert_problem_for(
        &r,
        409,
        "event_id_conflict",
        "an event_id with other content",
    );
    let r = append(&s, &private_notif("n-dave-3", "dave", "SECRET-DAVE")).await;
    assert_problem_for(&r, 409, "recipient_blocked", "dave is suppressed now");

    assert_nowhere(&s, "SECRET-CAROL-1").await;
    assert_nowhere(&s, "SECRET-FRANK").await;
    assert_nowhere(&s, "SECRET-DAVE").await;
}

/// With the outbox full, a duplicate of an accepted notification is still answered
/// `duplicate: true` (it adds nothing), while a new one is refused `429 outbox_full`.
#[tokio::test]
async fn a_duplicate_is_answered_even_when_the_outbox_is_full() {
    let config = "[notifications.outbox]\nmax_pending = 2\n";
    let s = Server::start(ServerOpts::default().config(config)).await;
    let n = |id: &str| {
        notif_ev(
            id,
            json!({"priority": "urgent", "title": format!("t {id}")}),
        )
    };
    for id in ["f-1", "f-2"] {
        append_ok(&s, &n(id)).await;
    }
    // Full: a third would be above the bound, routed or not yet.
    let r = append(&s, &n("f-3")).await;
    assert_problem_for(&r, 429, "outbox_full", "a new notification before routing");
    crate::common::wait_for(
        std::time::Duration::from_secs(30),
        "two pending deliveries",
        || async {
            let r = s.get("/v1/outbox/kpis").await;
            (r.json["queue_depth"].as_u64() == Some(2)).then_some(())
        },
    )
    .await;
    let r = append(&s, &n("f-4")).await;
    assert_problem_for(&r, 429, "outbox_full", "a new notification");
    let head = s.head().await;
    let again = append_ok(&s, &n("f-2")).await;
    assert!(again[0].2, "a duplicate: {again:?}");
    assert_eq!(s.head().await, head, "nothing appended");
}
