//! Bad input is refused with the documented status and problem `code`, as
//! `application/problem+json`, never with a 5xx, and never changes the log.

use rand::{Rng, SeedableRng};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Reply, Server, ServerOpts, assert_problem_for, tail};

use crate::common::{ev, receipts};

/// A server with three events appended after its start events, and the head after them.
async fn seeded() -> (Server, u64) {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    let (st, body) = s
        .append(&json!({"events": [
            ev("seed-1", "orders", "o-1", "order.placed", json!({})),
            ev("seed-2", "orders", "o-2", "order.placed", json!({})),
            ev("seed-3", "orders", "o-3", "order.placed", json!({})),
        ]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(body["last_seq"], base + 3, "{body}");
    (s, base + 3)
}

#[track_caller]
fn check(r: &Reply, status: u16, code: &str, what: &str) {
    assert!(
        !r.status.is_server_error(),
        "{what}: a 5xx answer to bad input: {} {}",
        r.status,
        tail(&r.text, 1000)
    );
    assert_problem_for(r, status, code, what);
}

async fn post_text(s: &Server, body: impl Into<reqwest::Body>) -> Reply {
    s.post_raw(body).await
}

#[tokio::test]
async fn malformed_json_wrong_types_and_unknown_fields() {
    let (s, h) = seeded().await;
    let cases: &[(&str, &str)] = &[
        ("not json", "hello"),
        ("truncated", r#"{"stream": "orders", "type": "#),
        ("empty body", ""),
        ("a JSON string", r#""event""#),
        ("a JSON array", r#"[{"stream":"s","type":"t"}]"#),
        ("stream is a number", r#"{"stream": 5, "type": "t"}"#),
        ("type is null", r#"{"stream": "s", "type": null}"#),
        (
            "event_id is a number",
            r#"{"event_id": 7, "stream": "s", "type": "t"}"#,
        ),
        (
            "subject is a bool",
            r#"{"stream": "s", "subject": true, "type": "t"}"#,
        ),
        (
            "events is an object",
            r#"{"events": {"stream": "s", "type": "t"}}"#,
        ),
        ("an event is a string", r#"{"events": ["x"]}"#),
        ("missing stream", r#"{"type": "t"}"#),
        ("missing type", r#"{"stream": "s"}"#),
        (
            "unknown field",
            r#"{"stream": "s", "type": "t", "colour": "red"}"#,
        ),
        (
            "seq sent by the client",
            r#"{"stream": "s", "type": "t", "seq": 9}"#,
        ),
        (
            "unknown field in a batch event",
            r#"{"events": [{"stream": "s", "type": "t", "extra": 1}]}"#,
        ),
        (
            "unknown field next to events",
            r#"{"events": [{"stream": "s", "type": "t"}], "extra": 1}"#,
        ),
        ("trailing garbage", r#"{"stream": "s", "type": "t"} x"#),
        (
            "a raw control character inside a string",
            "{\"stream\": \"s\", \"type\": \"t\", \"subject\": \"a\u{1}b\"}",
        ),
    ];
    for (what, body) in cases {
        let r = post_text(&s, *body).await;
        check(&r, 400, "malformed_json", what);
        assert_eq!(s.head().await, h, "{what}: the head moved");
    }
    let bytes: Vec<u8> =
        b"{\"stream\": \"s\", \"type\": \"t\", \"subject\": \"\xff\xfe\"}".to_vec();
    let r = post_text(&s, bytes).await;
    check(&r, 400, "malformed_json", "bytes that are not UTF-8");

    let r = post_text(&s, r#"{"events": []}"#).await;
    check(&r, 400, "empty_batch", "empty batch");

    let r = s
        .send(
            s.request(Method::POST, "/v1/events")
                .header("Content-Type", "text/plain")
                .body(r#"{"stream": "s", "type": "t"}"#),
        )
        .await;
    check(&r, 415, "unsupported_media_type", "text/plain");
    let r = s
        .send(
            s.request(Method::POST, "/v1/events")
                .body(r#"{"stream": "s", "type": "t"}"#),
        )
        .await;
    check(&r, 415, "unsupported_media_type", "no content type");
    assert_eq!(s.head().await, h);
}

#[tokio::test]
async fn limits_of_body_batch_and_payload() {
    let (s, h) = seeded().await;
    // > 1 MiB body made of valid events (20 × 60 KiB payloads).
    let events: Vec<Value> = (0..20)
        .map(|i| {
            ev(
                &format!("big-{i}"),
                "s",
                "",
                "t",
                json!({ "p": "x".repeat(60 * 1024) }),
            )
        })
        .collect();
    let body = serde_json::to_vec(&json!({ "events": events })).expect("json");
    assert!(body.len() > 1024 * 1024);
    let r = post_text(&s, body).await;
    check(&r, 413, "body_too_large", "body over 1 MiB");
    assert_eq!(s.head().await, h);

    // A body over the limit that is not even JSON: the size is checked first.
    let r = post_text(&s, vec![b'['; 1024 * 1024 + 1]).await;
    check(&r, 413, "body_too_large", "1 MiB + 1 of garbage");
    assert_eq!(s.head().await, h);

    let events: Vec<Value> = (0..1001)
        .map(|i| json!({"event_id": format!("n-{i}"), "stream": "s", "type": "t"}))
        .collect();
    let r = s
        .send(
            s.request(Method::POST, "/v1/events")
                .json(&json!({ "events": events })),
        )
        .await;
    check(&r, 413, "batch_too_large", "1001 events");
    assert_eq!(s.head().await, h);

    // Exactly 1000 is fine.
    let events: Vec<Value> = (0..1000)
        .map(|i| json!({"event_id": format!("k-{i}"), "stream": "s", "type": "t"}))
        .collect();
    let (st, body) = s.append(&json!({ "events": events })).await;
    assert_eq!(
        st,
        StatusCode::CREATED,
        "1000 events: {}",
        tail(&body.to_string(), 500)
    );
    assert_eq!(s.head().await, h + 1000);

    let r = s
        .send(s.request(Method::POST, "/v1/events").json(&ev(
            "huge",
            "s",
            "",
            "t",
            json!({ "p": "x".repeat(65 * 1024) }),
        )))
        .await;
    check(&r, 413, "payload_too_large", "65 KiB payload");
    assert_eq!(s.head().await, h + 1000);
}

#[tokio::test]
async fn fields_breaking_their_rules_are_invalid_field() {
    let (s, h) = seeded().await;
    let long = |n: usize| "a".repeat(n);
    let cases: Vec<(&str, Value)> = vec![
        (
            "event_id",
            json!({"event_id": "", "stream": "s", "type": "t"}),
        ),
        (
            "event_id",
            json!({"event_id": "a b", "stream": "s", "type": "t"}),
        ),
        (
            "event_id",
            json!({"event_id": "a/b", "stream": "s", "type": "t"}),
        ),
        (
            "event_id",
            json!({"event_id": "é", "stream": "s", "type": "t"}),
        ),
        (
            "event_id",
            json!({"event_id": long(129), "stream": "s", "type": "t"}),
        ),
        ("stream", json!({"stream": "", "type": "t"})),
        ("stream", json!({"stream": "Orders", "type": "t"})),
        ("stream", json!({"stream": "a b", "type": "t"})),
        ("stream", json!({"stream": "a:b", "type": "t"})),
        ("stream", json!({"stream": long(65), "type": "t"})),
        (
            "subject",
            json!({"stream": "s", "subject": long(129), "type": "t"}),
        ),
        (
            "subject",
            json!({"stream": "s", "subject": "a\u{7}b", "type": "t"}),
        ),
        (
            "subject",
            json!({"stream": "s", "subject": "line\nbreak", "type": "t"}),
        ),
        ("type", json!({"stream": "s", "type": ""})),
        ("type", json!({"stream": "s", "type": "Order.placed"})),
        ("type", json!({"stream": "s", "type": "order-placed"})),
        ("type", json!({"stream": "s", "type": "order placed"})),
        ("type", json!({"stream": "s", "type": long(65)})),
        (
            "payload",
            json!({"stream": "s", "type": "t", "payload": [1, 2]}),
        ),
        (
            "payload",
            json!({"stream": "s", "type": "t", "payload": "text"}),
        ),
        ("payload", json!({"stream": "s", "type": "t", "payload": 3})),
    ];
    for (field, body) in &cases {
        let r = s
            .send(s.request(Method::POST, "/v1/events").json(body))
            .await;
        let what = format!("{field} in {body}");
        check(&r, 400, "invalid_field", &what);
        assert_eq!(
            r.json["field"], *field,
            "{what}: problem `field`: {}",
            r.text
        );
        assert_eq!(r.json["index"], 0, "{what}: problem `index`: {}", r.text);
        assert_eq!(s.head().await, h, "{what}: the head moved");
    }
    // The index names the position in the batch.
    let r = s
        .send(
            s.request(Method::POST, "/v1/events")
                .json(&json!({"events": [
                    {"stream": "s", "type": "t"},
                    {"stream": "s", "type": "t"},
                    {"stream": "s", "type": "t"},
                    {"stream": "s", "type": "BAD"},
                ]})),
        )
        .await;
    check(&r, 400, "invalid_field", "bad type at index 3");
    assert_eq!(r.json["index"], 3, "{}", r.text);
    assert_eq!(r.json["field"], "type", "{}", r.text);
    assert_eq!(s.head().await, h);
}

#[tokio::test]
async fn server_only_types_and_schema_violations() {
    let (s, h) = seeded().await;
    let server_only = [
        ("notifications", "n-1", "notification.created"),
        ("deliveries", "dlv:n-1:desktop", "delivery.created"),
        ("deliveries", "dlv:n-1:desktop", "delivery.leased"),
        ("deliveries", "dlv:n-1:desktop", "delivery.sent"),
        ("cursors", "c-1", "cursor.advanced"),
        ("cursors", "c-1", "cursor.reset"),
        ("bridges", "sub-1", "bridge.subscribed"),
        ("settings", "", "settings.updated"),
        (
            "task_events",
            "task-1",
            "notification.terminal_state_mismatch",
        ),
    ];
    for (stream, subject, ty) in server_only {
        let r = s
            .send(s.request(Method::POST, "/v1/events").json(&json!({
                "stream": stream, "subject": subject, "type": ty,
                "payload": {"priority": "info", "title": "x", "source_seq": 1}
            })))
            .await;
        check(&r, 403, "server_only_type", ty);
        assert_eq!(s.head().await, h, "{ty}: the head moved");
    }

    let schema: Vec<(&str, Value)> = vec![
        (
            "task.run_started without run_id",
            json!({"stream": "task_events", "subject": "t1", "type": "task.run_started",
                   "payload": {}}),
        ),
        (
            "task.run_started with a numeric run_id",
            json!({"stream": "task_events", "subject": "t1", "type": "task.run_started",
                   "payload": {"run_id": 5}}),
        ),
        (
            "task.created without project_id",
            json!({"stream": "task_events", "subject": "t1", "type": "task.created",
                   "payload": {"title": "x"}}),
        ),
        (
            "notification.requested with an unknown priority",
            json!({"stream": "notifications", "subject": "n1", "type": "notification.requested",
                   "payload": {"priority": "whenever", "title": "x"}}),
        ),
        (
            "notification.requested without title",
            json!({"stream": "notifications", "subject": "n1", "type": "notification.requested",
                   "payload": {"priority": "info"}}),
        ),
        (
            "task.run_started on the wrong stream",
            json!({"stream": "orders", "subject": "t1", "type": "task.run_started",
                   "payload": {"run_id": "r1"}}),
        ),
        (
            "an unknown type with a reserved prefix",
            json!({"stream": "task_events", "subject": "t1", "type": "task.exploded",
                   "payload": {}}),
        ),
        (
            "recipient.updated with tz out of range",
            json!({"stream": "recipients", "subject": "r1", "type": "recipient.updated",
                   "payload": {"tz_offset_minutes": 900}}),
        ),
    ];
    for (what, body) in &schema {
        let r = s
            .send(s.request(Method::POST, "/v1/events").json(body))
            .await;
        check(&r, 422, "schema_violation", what);
        assert_eq!(s.head().await, h, "{what}: the head moved");
    }
    // The valid form of the same reserved event is accepted.
    let (st, body) = s
        .append(
            &json!({"stream": "task_events", "subject": "t1", "type": "task.run_started",
                        "payload": {"run_id": "r1"}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(receipts(&body)[0].1, h + 1);
}

#[tokio::test]
async fn bad_queries_and_last_event_ids() {
    let (s, h) = seeded().await;
    let queries = [
        "after_sequence=abc",
        "after_sequence=-1",
        "after_sequence=1.5",
        "after_sequence=99999999999999999999999",
        "limit=0",
        "limit=1001",
        "limit=x",
        "limit=-5",
    ];
    for q in queries {
        let r = s.get(&format!("/v1/events?{q}")).await;
        check(&r, 400, "invalid_query", q);
    }
    for q in ["after_sequence=abc", "after_sequence=-1"] {
        let r = s.sse(q, None).await.err().unwrap_or_else(|| {
            panic!("GET /v1/events/stream?{q} opened a stream instead of answering 400")
        });
        check(&r, 400, "invalid_query", &format!("stream?{q}"));
    }
    for id in ["abc", "-1", "1.5", "0x10", "1 2", "+"] {
        let r = s
            .sse("after_sequence=0", Some(id))
            .await
            .err()
            .unwrap_or_else(|| {
                panic!("Last-Event-ID {id:?} opened a stream instead of answering 400")
            });
        check(&r, 400, "invalid_last_event_id", id);
    }
    let r = s.get("/v1/no-such-thing").await;
    check(&r, 404, "not_found", "unknown path");
    assert_eq!(s.head().await, h);
}

/// Filters are checked by the rules of their fields: a filter no event can match because it
/// breaks the rule is a client error, not an empty page.
#[tokio::test]
async fn filters_breaking_their_rules_are_invalid_query() {
    let (s, h) = seeded().await;
    let long_subject = "a".repeat(129);
    let queries = [
        "stream=Not%20A%20Stream".to_owned(),
        "stream=".to_owned(),
        "type=Bad-Type".to_owned(),
        "type=UPPER".to_owned(),
        format!("subject={long_subject}"),
        "subject=a%07b".to_owned(),
    ];
    for q in &queries {
        let r = s.get(&format!("/v1/events?{q}")).await;
        check(&r, 400, "invalid_query", q);
        let r = s.sse(q, None).await.err().unwrap_or_else(|| {
            panic!("GET /v1/events/stream?{q} opened a stream instead of answering 400")
        });
        check(&r, 400, "invalid_query", &format!("stream?{q}"));
    }
    assert_eq!(s.head().await, h);
}

/// Random corruptions of valid requests must never produce a 5xx, and the head moves exactly
/// by the events the server acknowledged.
#[tokio::test]
async fn mutated_bodies_never_get_a_5xx() {
    let (s, h) = seeded().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(20_261_121);
    let template = serde_json::to_vec(&json!({"events": [
        {"event_id": "m-1", "stream": "task_events", "subject": "t1", "type": "task.run_started",
         "payload": {"run_id": "r1"}},
        {"event_id": "m-2", "stream": "notifications", "subject": "m-2",
         "type": "notification.requested", "payload": {"priority": "info", "title": "hi"}},
        {"event_id": "m-3", "stream": "orders", "subject": "o", "type": "order.x",
         "payload": {"a": [1, 2, {"b": null}]}},
    ]}))
    .expect("json");
    let alphabet = b"{}[]\",:0123456789abcxyz-_. \\\x00\xff";
    let mut head = h;
    let mut accepted = 0;
    for round in 0..300 {
        let mut body = template.clone();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..body.len());
            match rng.random_range(0..3) {
                0 => body[at] = alphabet[rng.random_range(0..alphabet.len())],
                1 => {
                    body.remove(at);
                }
                _ => body.insert(at, alphabet[rng.random_range(0..alphabet.len())]),
            }
        }
        // Fresh ids per round so an accepted body always appends.
        let text = String::from_utf8_lossy(&body).replace("m-", &format!("m{round}-"));
        let r = post_text(&s, text.clone()).await;
        assert!(
            !r.status.is_server_error(),
            "a 5xx for {text:?}: {} {}",
            r.status,
            tail(&r.text, 500)
        );
        if r.status == StatusCode::CREATED {
            accepted += 1;
            let new = receipts(&r.json).iter().filter(|x| !x.2).count();
            head += u64::try_from(new).expect("count");
        } else {
            let ct = r.content_type.as_deref().unwrap_or("");
            assert!(
                ct.starts_with("application/problem+json") && r.code().is_some(),
                "a refusal that is not problem+json with a code for {text:?}: {} {ct} {}",
                r.status,
                tail(&r.text, 500)
            );
        }
        assert_eq!(s.head().await, head, "head after {text:?}");
    }
    eprintln!("mutated bodies: {accepted} of 300 accepted");
    assert!(
        accepted > 0,
        "no mutated body was accepted: the template itself is refused"
    );
}

/// The schemas of the lifecycle and notification types: a missing `run_id`, an unknown
/// priority or an oversize title is a 422 `schema_violation` that appends nothing (and so
/// routes nothing); the limits themselves are allowed.
#[tokio::test]
async fn lifecycle_and_notification_schemas() {
    let (s, h) = seeded().await;
    let task = |ty: &str, payload: Value| json!({"stream": "task_events", "subject": "sch-t1", "type": ty, "payload": payload});
    let notif = |id: &str, payload: Value| {
        json!({"event_id": id, "stream": "notifications", "subject": id,
               "type": "notification.requested", "payload": payload})
    };
    let mut cases: Vec<(String, Value)> = Vec::new();
    for ty in [
        "task.run_started",
        "task.run_completed",
        "task.run_failed",
        "task.run_canceled",
        "task.run_review_requested",
        "task.run_review_approved",
        "task.run_review_rejected",
    ] {
        cases.push((format!("{ty} without run_id"), task(ty, json!({}))));
        cases.push((
            format!("{ty} with an empty run_id"),
            task(ty, json!({"run_id": ""})),
        ));
        cases.push((
            format!("{ty} with run_id null"),
            task(ty, json!({"run_id": null, "error": "e", "reviewer": "rv"})),
        ));
        cases.push((
            format!("{ty} with a numeric run_id"),
            task(ty, json!({"run_id": 7})),
        ));
    }
    cases.push((
        "task.run_failed with a numeric error".into(),
        task("task.run_failed", json!({"run_id": "r1", "error": 5})),
    ));
    cases.push((
        "task.run_review_rejected with continuation as a string".into(),
        task(
            "task.run_review_rejected",
            json!({"run_id": "r1", "continuation": "yes"}),
        ),
    ));
    cases.push((
        "task.created with a title of 513 characters".into(),
        task(
            "task.created",
            json!({"project_id": "p", "title": "t".repeat(513)}),
        ),
    ));
    cases.push((
        "task.created with review_required as a string".into(),
        task(
            "task.created",
            json!({"project_id": "p", "review_required": "true"}),
        ),
    ));
    cases.push((
        "task.canceled without a subject".into(),
        json!({"stream": "task_events", "subject": "", "type": "task.canceled", "payload": {}}),
    ));
    for prio in ["loud", "URGENT", "", "Info"] {
        cases.push((
            format!("notification.requested with priority {prio:?}"),
            notif("sch-n1", json!({"priority": prio, "title": "t"})),
        ));
    }
    cases.push((
        "notification.requested with a numeric priority".into(),
        notif("sch-n1", json!({"priority": 1, "title": "t"})),
    ));
    cases.push((
        "notification.requested with a title of 257 characters".into(),
        notif(
            "sch-n1",
            json!({"priority": "info", "title": "t".repeat(257)}),
        ),
    ));
    cases.push((
        "notification.requested with a title of 257 two-byte characters".into(),
        notif(
            "sch-n1",
            json!({"priority": "info", "title": "é".repeat(257)}),
        ),
    ));
    cases.push((
        "notification.requested with an empty title".into(),
        notif("sch-n1", json!({"priority": "info", "title": ""})),
    ));
    cases.push((
        "notification.requested whose subject is not its event_id".into(),
        json!({"event_id": "sch-n1", "stream": "notifications", "subject": "sch-n2",
               "type": "notification.requested", "payload": {"priority": "info", "title": "t"}}),
    ));
    cases.push((
        "notification.requested with deliver_after that is not a time".into(),
        notif(
            "sch-n1",
            json!({"priority": "info", "title": "t", "deliver_after": "tomorrow"}),
        ),
    ));
    for (what, body) in &cases {
        let r = s
            .send(s.request(Method::POST, "/v1/events").json(body))
            .await;
        check(&r, 422, "schema_violation", what);
        assert_eq!(s.head().await, h, "{what}: the head moved");
        // In a batch after a valid event: the whole batch is refused, and the problem points
        // at the bad event.
        let r = s
            .send(
                s.request(Method::POST, "/v1/events")
                    .json(&json!({"events": [
                        {"stream": "sch", "subject": "x", "type": "sch.ok"},
                        body,
                    ]})),
            )
            .await;
        check(&r, 422, "schema_violation", &format!("{what}, in a batch"));
        assert_eq!(r.json["index"], 1, "{what}: problem `index`: {}", r.text);
        assert_eq!(s.head().await, h, "{what} in a batch: the head moved");
    }
    // Nothing was routed from the refused lifecycle events, and no notification exists.
    let (st, body) = s.get_json("/v1/notifications").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(
        body["notifications"],
        json!([]),
        "refused events made notifications"
    );
    assert_eq!(
        s.get("/v1/tasks/sch-t1").await.status,
        StatusCode::NOT_FOUND,
        "refused lifecycle events made a task"
    );

    // The limits themselves are fine (lengths are in characters).
    let ok = [
        task(
            "task.created",
            json!({"project_id": "p", "title": "é".repeat(512), "review_required": true}),
        ),
        notif(
            "sch-ok-1",
            json!({"priority": "action", "title": "é".repeat(256)}),
        ),
        notif(
            "sch-ok-2",
            json!({"priority": "warning", "title": "t".repeat(256), "deliver_after": "2026-11-21T10:00:00Z"}),
        ),
    ];
    let (st, body) = s.append(&json!({ "events": ok })).await;
    assert_eq!(st, StatusCode::CREATED, "the limits are allowed: {body}");
    assert_eq!(body["last_seq"], h + 3, "{body}");
    let (st, t) = s.get_json("/v1/tasks/sch-t1").await;
    assert_eq!(st, StatusCode::OK, "{t}");
    assert_eq!(t["title"].as_str().map(|x| x.chars().count()), Some(512));
    assert_eq!(t["review_required"], true, "{t}");
}

/// Event ids under the prefixes of derived events are refused for client events, whatever
/// their type, alone or in a batch; ids that merely resemble them are fine.
#[tokio::test]
async fn reserved_event_ids_are_refused() {
    let (s, h) = seeded().await;
    let prefixes = [
        "ntf:",
        "dlv:",
        "notif:",
        "mismatch:",
        "cursor:",
        "settings:",
    ];
    for prefix in prefixes {
        for id in [
            format!("{prefix}1"),
            format!("{prefix}x:desktop"),
            prefix.to_owned(),
        ] {
            let bodies = [
                json!({"event_id": id, "stream": "orders", "subject": "o", "type": "order.x"}),
                json!({"event_id": id, "stream": "task_events", "subject": "t-r",
                       "type": "task.run_completed", "payload": {"run_id": "r1"}}),
                json!({"event_id": id, "stream": "notifications", "subject": id,
                       "type": "notification.requested",
                       "payload": {"priority": "info", "title": "t"}}),
            ];
            for body in &bodies {
                let what = format!("event_id {id:?} on {}", body["type"]);
                let r = s
                    .send(s.request(Method::POST, "/v1/events").json(body))
                    .await;
                check(&r, 422, "reserved_event_id", &what);
                assert_eq!(r.json["index"], 0, "{what}: problem `index`: {}", r.text);
                assert_eq!(
                    r.json["field"], "event_id",
                    "{what}: problem `field`: {}",
                    r.text
                );
                assert_eq!(s.head().await, h, "{what}: the head moved");
            }
            let r = s
                .send(
                    s.request(Method::POST, "/v1/events")
                        .json(&json!({"events": [
                            {"event_id": "res-ok-1", "stream": "orders", "type": "order.x"},
                            {"event_id": "res-ok-2", "stream": "orders", "type": "order.x"},
                            bodies[0].clone(),
                        ]})),
                )
                .await;
            check(&r, 422, "reserved_event_id", &format!("{id:?} in a batch"));
            assert_eq!(r.json["index"], 2, "{id:?} in a batch: {}", r.text);
            assert_eq!(s.head().await, h, "{id:?} in a batch: the head moved");
        }
    }
    // A notification.requested without event_id takes its subject as id: a reserved subject
    // is a reserved id.
    let r = s
        .send(s.request(Method::POST, "/v1/events").json(&json!({
            "stream": "notifications", "subject": "ntf:77", "type": "notification.requested",
            "payload": {"priority": "info", "title": "t"}
        })))
        .await;
    check(
        &r,
        422,
        "reserved_event_id",
        "notification.requested with subject ntf:77 and no event_id",
    );
    assert_eq!(s.head().await, h);

    // Look-alikes are ordinary ids.
    let ok: Vec<Value> = [
        "ntf",
        "ntf-1",
        "xntf:1",
        "dlv",
        "my:ntf:1",
        "notif-1",
        "settings.1",
    ]
    .iter()
    .map(|id| json!({"event_id": id, "stream": "orders", "subject": "o", "type": "order.x"}))
    .collect();
    let n = u64::try_from(ok.len()).expect("small");
    let (st, body) = s.append(&json!({ "events": ok })).await;
    assert_eq!(
        st,
        StatusCode::CREATED,
        "look-alike ids are allowed: {body}"
    );
    assert_eq!(s.head().await, h + n);
}

/// Every id a read's path names is checked as one before anything else (issue 42: `PathId` in
/// every handler): too long, or holding a control character, it is `400 invalid_path`, even
/// where the query is bad too and where the id would otherwise just not be found.
#[tokio::test]
async fn an_id_in_a_path_is_checked_before_anything_else() {
    let s = Server::start(ServerOpts::default()).await;
    let long = "x".repeat(129);
    for id in [long.as_str(), "a%01b"] {
        for path in [
            format!("/v1/deliveries/{id}"),
            format!("/v1/deliveries/{id}?min_seq=bogus"),
            format!("/v1/notifications/{id}"),
            format!("/v1/tasks/{id}"),
            format!("/v1/tasks/{id}?min_seq=bogus"),
            format!("/v1/tasks/{id}/stream"),
            format!("/v1/tasks/{id}/notifications/bridges"),
            format!("/v1/bridges/{id}/deliveries"),
            format!("/v1/bridges/{id}/deliveries?wait_ms=bogus"),
        ] {
            let r = s.get(&path).await;
            check(&r, 400, "invalid_path", &path);
        }
    }
    // A good id that names nothing is still not found.
    let r = s.get("/v1/tasks/no-such-task").await;
    check(&r, 404, "not_found", "a task nobody created");
    assert_eq!(r.json["detail"], "no task \"no-such-task\"", "{}", r.text);
}
