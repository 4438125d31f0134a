//! The delivery runtime over HTTP (spec sections 1 (I7, I8), 5 and 7): claim, complete, fail,
//! extend by the lease owner; retry and discard by an operator; leases that expire (also across
//! `kill -9`); backpressure on notification requests; the outbox KPIs and their gauges; bad
//! input and scopes of every delivery endpoint; and the acceptance test of the issue: 10,000
//! urgent notifications claimed by 32 concurrent claimers, each delivered once, none lost,
//! never leased to two owners at once.
//!
//! Urgent `notification.requested` events become one delivery `dlv:<id>:desktop` on sink `app`
//! a few ms later (the scheduler routes asynchronously), so every test waits (bounded) for its
//! deliveries before it claims them. Waits are bounds against hanging, never speed assertions.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{
    Api, Reply, Server, ServerOpts, assert_problem_for, encode_path, random_token, sha256_hex, tail,
};

use crate::common::{
    append_ok, check_time, civil_micros, list_after, list_notifications, notif_ev, now_us,
    post_empty, wait_for,
};

const WAIT: Duration = Duration::from_secs(30);
/// Slack between the test's clock reads and the server's (same machine, same clock), µs.
const SLACK_US: i64 = 5_000;

// ---------------------------------------------------------------------------------------------
// 1. Happy path
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn claim_then_complete_is_sent_once() {
    let s = Server::start(ServerOpts::default()).await;
    let note = json!({"priority": "urgent", "title": "Build broke", "body": "details",
                      "recipient": "alice", "task_id": "task-hp"});
    append_ok(&s, &notif_ev("hp-1", note)).await;
    let id = dlv("hp-1");
    let row = wait_status(&s, &id, "queued").await;
    assert_eq!(row["id"], id.as_str(), "{row}");
    assert_eq!(row["notification_id"], "hp-1", "{row}");
    assert_eq!(row["route"], "desktop", "{row}");
    assert_eq!(row["sink"], "app", "{row}");
    assert_eq!(row["recipient"], "alice", "{row}");
    assert_eq!(row["priority"], "urgent", "{row}");
    assert_eq!(row["title"], "Build broke", "{row}");
    assert_eq!(row["body"], "details", "{row}");
    assert_eq!(row["task_id"], "task-hp", "{row}");
    assert_eq!(row["sound"], true, "urgent is a sound priority: {row}");
    assert_eq!(row["attempts"], 0, "{row}");
    assert_eq!(
        row["max_attempts"], 5,
        "the default retry.max_attempts: {row}"
    );
    assert_eq!(row["lease_owner"], Value::Null, "{row}");
    assert_eq!(row["lease_expires_at"], Value::Null, "{row}");
    assert_eq!(row["delivered_at"], Value::Null, "{row}");
    check_time(row["created_at"].as_str().expect("created_at"));
    check_time(row["next_attempt_at"].as_str().expect("next_attempt_at"));
    assert_eq!(row["items"].as_array().map(Vec::len), Some(1), "{row}");
    assert_eq!(row["items"][0]["notification_id"], "hp-1", "{row}");

    let t0 = now_us();
    let got = claim(&s, "owner-a", 10, 60_000).await;
    let t1 = now_us();
    assert_eq!(ids(&got), vec![id.clone()], "the one due delivery");
    let leased = &got[0];
    assert_eq!(leased["attempts"], 1, "{leased}");
    let expires = us(&leased["lease_expires_at"]);
    assert!(
        expires >= t0 + 60_000_000 - SLACK_US && expires <= t1 + 60_000_000 + SLACK_US,
        "lease_expires_at must be the claim time + lease_ms: {leased}"
    );
    let g = get_dlv(&s, &id).await;
    assert_eq!(g["status"], "leased", "{g}");
    assert_eq!(g["lease_owner"], "owner-a", "{g}");
    assert_eq!(g["attempts"], 1, "{g}");
    assert_eq!(g["lease_expires_at"], leased["lease_expires_at"], "{g}");

    let done = json!({"owner": "owner-a", "external_id": "ext-1"});
    let r = act(&s, &id, "complete", &done).await;
    assert_eq!(r.status, StatusCode::OK, "complete: {}", r.text);
    let sent = r.json.clone();
    assert_eq!(sent["status"], "sent", "{sent}");
    assert_eq!(sent["external_id"], "ext-1", "{sent}");
    assert_eq!(sent["attempts"], 1, "{sent}");
    let delivered = us(&sent["delivered_at"]);

    let g = get_dlv(&s, &id).await;
    assert_eq!(g["status"], "sent", "{g}");
    assert_eq!(g["delivered_at"], sent["delivered_at"], "{g}");
    let tl = assert_steps(&g, &["created", "leased", "sent"]);
    assert_eq!(tl[1]["owner"], "owner-a", "{g}");
    assert_eq!(tl[1]["attempt"], 1, "{g}");
    assert_eq!(tl[2]["owner"], "owner-a", "{g}");
    assert_eq!(
        us(&tl[2]["at"]),
        delivered,
        "delivered_at is the sent step: {g}"
    );
    assert_timeline_ordered(&g);

    // Every transition is an event of stream `deliveries`, subject = the delivery id.
    let evs = s
        .read_all(&format!("stream=deliveries&subject={}", encode_path(&id)))
        .await;
    let types: Vec<&str> = evs
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        types,
        ["delivery.created", "delivery.leased", "delivery.sent"],
        "{evs:?}"
    );
    let ev_seqs: Vec<u64> = evs
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect();
    let tl_seqs: Vec<u64> = tl.iter().map(|t| t["seq"].as_u64().expect("seq")).collect();
    assert_eq!(ev_seqs, tl_seqs, "the timeline names the events' seqs");

    // Completing again by the owner answers the same row and appends nothing.
    let head = s.head().await;
    let r = act(&s, &id, "complete", &done).await;
    assert_eq!(r.status, StatusCode::OK, "repeated complete: {}", r.text);
    assert_eq!(r.json, sent, "a repeated complete answers the same row");
    assert_eq!(s.head().await, head, "a repeated complete appends nothing");

    // Another owner cannot complete it.
    let r = act(&s, &id, "complete", &json!({"owner": "owner-b"})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "complete by B: {}", r.text);
    assert!(
        matches!(r.code(), Some("not_lease_owner" | "illegal_transition")),
        "complete by B: {}",
        r.text
    );
    assert_eq!(s.head().await, head, "a refused complete appends nothing");
    assert_eq!(get_dlv(&s, &id).await["status"], "sent");

    // Nothing is left to claim.
    assert!(claim(&s, "owner-b", 10, 60_000).await.is_empty());
    assert_eq!(s.head().await, head, "an empty claim appends nothing");
}

// ---------------------------------------------------------------------------------------------
// 2. The state machine over HTTP
// ---------------------------------------------------------------------------------------------

const RETRY_CONFIG: &str = "[notifications.retry]\nmax_attempts = 3\nbase_delay = \"100ms\"\n\
                            max_delay = \"400ms\"\n";

/// A route's own `[notifications.routes.<route>.retry]` overrides the global one: here a
/// linear strategy (`base · n`) with its own attempts, while the global one stays exponential.
#[tokio::test]
async fn a_route_retries_with_its_own_linear_strategy() {
    let s = Server::start(ServerOpts::default().config(
        "[notifications.retry]\nmax_attempts = 2\nbase_delay = \"1s\"\n\
         [notifications.routes.desktop.retry]\nstrategy = \"linear\"\nmax_attempts = 4\n\
         base_delay = \"200ms\"\nmax_delay = \"10s\"\njitter = 0.0\n",
    ))
    .await;
    let api = s.api();
    append_ok(&s, &urgent("ln-a")).await;
    let row = wait_status(&s, &dlv("ln-a"), "queued").await;
    assert_eq!(row["max_attempts"], 4, "the route's max_attempts: {row}");
    // base · n
    fail_and_check_waits(&s, &api, &dlv("ln-a"), &[200_000, 400_000, 600_000]).await;
}

/// Claim `id` and report it failed once per entry of `waits_us`, checking that each failure
/// schedules the next attempt that many microseconds after it.
async fn fail_and_check_waits(s: &Server, api: &Api, id: &str, waits_us: &[i64]) {
    for (k, want) in waits_us.iter().enumerate() {
        let got = claim_some(api, "w1").await;
        assert_eq!(ids(&got), vec![id.to_owned()], "attempt {}", k + 1);
        let r = act(
            s,
            id,
            "fail",
            &json!({"owner": "w1", "error_code": "timeout"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "fail #{}: {}", k + 1, r.text);
        assert_eq!(r.json["status"], "retry_wait", "{}", r.text);
        let g = get_dlv(s, id).await;
        let step = timeline(&g).last().cloned().expect("a step");
        assert_eq!(
            us(&r.json["next_attempt_at"]) - us(&step["at"]),
            *want,
            "attempt {}: {g}",
            k + 1
        );
    }
}

/// `retry.strategy = "fixed"` (the outbox design's fixed interval): every retry waits
/// `base_delay`, the backoff every delivery and source poll uses (`routing::backoff_ms`).
#[tokio::test]
async fn a_fixed_retry_strategy_waits_the_same_after_every_failure() {
    let s = Server::start(ServerOpts::default().config(
        "[notifications.retry]\nstrategy = \"fixed\"\nmax_attempts = 4\nbase_delay = \"300ms\"\n\
         max_delay = \"10s\"\njitter = 0.0\n",
    ))
    .await;
    let api = s.api();
    append_ok(&s, &urgent("fx-a")).await;
    wait_status(&s, &dlv("fx-a"), "queued").await;
    // The fixed interval, not base · 2^(k−1).
    fail_and_check_waits(&s, &api, &dlv("fx-a"), &[300_000, 300_000, 300_000]).await;
}

#[tokio::test]
async fn state_machine_backoff_parking_and_operator_actions() {
    let s = Server::start(ServerOpts::default().config(RETRY_CONFIG)).await;
    let api = s.api();

    // A: retryable failures with backoff until max_attempts parks it.
    append_ok(&s, &urgent("sm-a")).await;
    let id_a = dlv("sm-a");
    let row = wait_status(&s, &id_a, "queued").await;
    assert_eq!(row["max_attempts"], 3, "the configured max_attempts: {row}");
    for k in 1..=3u64 {
        let got = claim_some(&api, "w1").await;
        assert_eq!(ids(&got), vec![id_a.clone()], "attempt {k}");
        assert_eq!(got[0]["attempts"], k, "attempt {k}: {}", got[0]);
        let t0 = now_us();
        let r = act(
            &s,
            &id_a,
            "fail",
            &json!({"owner": "w1", "error_code": "timeout", "error": format!("attempt {k} timed out")}),
        )
        .await;
        let t1 = now_us();
        assert_eq!(r.status, StatusCode::OK, "fail #{k}: {}", r.text);
        let f = &r.json;
        assert_eq!(f["attempts"], k, "{f}");
        assert_eq!(f["last_error_code"], "timeout", "{f}");
        assert_eq!(f["last_error"], format!("attempt {k} timed out"), "{f}");
        assert_eq!(
            f["lease_owner"],
            Value::Null,
            "a failure ends the lease: {f}"
        );
        assert_eq!(f["lease_expires_at"], Value::Null, "{f}");
        let g = get_dlv(&s, &id_a).await;
        let tl = timeline(&g);
        let step = tl.last().expect("a step");
        assert_eq!(step["event"], "attempt_failed", "{g}");
        assert_eq!(step["attempt"], k, "{g}");
        assert_eq!(step["owner"], "w1", "{g}");
        assert_eq!(step["error_code"], "timeout", "{g}");
        assert_eq!(step["error"], format!("attempt {k} timed out"), "{g}");
        let at = us(&step["at"]);
        assert!(
            at >= t0 - SLACK_US && at <= t1 + SLACK_US,
            "the failure time is the time of the request: {g}"
        );
        if k < 3 {
            assert_eq!(f["status"], "retry_wait", "fail #{k}: {f}");
            let next = us(&f["next_attempt_at"]);
            assert_eq!(step["next_attempt_at"], f["next_attempt_at"], "{g}");
            assert!(next > at, "next_attempt_at must be in the future: {g}");
            // min(max_delay, base · 2^(k−1)), ±20 % jitter, capped at max_delay.
            let raw = (100i64 << (k - 1)).min(400);
            let lo = raw * 800 - 1_000;
            let hi = (raw * 1_200 + 1_000).min(400_000);
            let delay = next - at;
            assert!(
                (lo..=hi).contains(&delay),
                "attempt {k}: next_attempt_at − failure time = {delay} µs, outside the backoff \
                 {lo}..={hi} µs: {g}"
            );
        } else {
            assert_eq!(f["status"], "parked", "the last attempt parks: {f}");
            assert_eq!(f["reason"], "max_attempts", "{f}");
            assert_eq!(g["status"], "parked", "{g}");
        }
    }
    let g = get_dlv(&s, &id_a).await;
    let failed = ["leased", "attempt_failed"];
    assert_steps(&g, &[&["created"][..], &failed, &failed, &failed].concat());
    assert_timeline_ordered(&g);
    let head = s.head().await;
    assert!(
        claim(&s, "w1", 10, 60_000).await.is_empty(),
        "a parked delivery is never claimed"
    );
    assert_eq!(s.head().await, head);

    // B: retry_after_ms replaces the backoff.
    let id_b = queued_claimed(&s, "sm-b", "w1").await;
    let body = json!({"owner": "w1", "error_code": "rate_limited", "retry_after_ms": 60_000});
    let t0 = now_us();
    let r = act(&s, &id_b, "fail", &body).await;
    let t1 = now_us();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "retry_wait", "{}", r.text);
    let next = us(&r.json["next_attempt_at"]);
    let g = get_dlv(&s, &id_b).await;
    let step = timeline(&g).last().cloned().expect("step");
    assert_eq!(step["event"], "attempt_failed", "{g}");
    assert_eq!(
        next - us(&step["at"]),
        60_000_000,
        "next_attempt_at = failure time + retry_after_ms: {g}"
    );
    assert!(
        next >= t0 + 60_000_000 - SLACK_US && next <= t1 + 60_000_000 + SLACK_US,
        "next_attempt_at ≈ now + retry_after_ms: {g}"
    );
    let head = s.head().await;
    assert!(
        claim(&s, "w1", 10, 60_000).await.is_empty(),
        "a retry_wait delivery is not claimable before next_attempt_at"
    );
    assert_eq!(s.head().await, head);
    let r = act(&s, &id_b, "complete", &json!({"owner": "w1"})).await;
    assert_problem_for(&r, 409, "illegal_transition", "complete a retry_wait row");
    let r = post_empty(&s, &format!("/v1/deliveries/{}/retry", encode_path(&id_b))).await;
    assert_problem_for(&r, 409, "illegal_transition", "retry a retry_wait row");
    assert_eq!(s.head().await, head);

    // C: retry_after_ms is capped at one hour.
    let id_c = queued_claimed(&s, "sm-c", "w1").await;
    let capped = json!({"owner": "w1", "error_code": "rate_limited", "retry_after_ms": 36_000_000});
    let r = act(&s, &id_c, "fail", &capped).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let g = get_dlv(&s, &id_c).await;
    let step = timeline(&g).last().cloned().expect("step");
    assert_eq!(
        us(&g["next_attempt_at"]) - us(&step["at"]),
        3_600_000_000,
        "retry_after_ms is capped at 1 h: {g}"
    );

    // P: a permanent failure parks at once; the operator retries it: queued, attempts 0.
    let id_p = queued_claimed(&s, "sm-p", "w1").await;
    let permanent = json!({"owner": "w1", "error_code": "bad_address", "error": "no such user",
                           "retryable": false});
    let r = act(&s, &id_p, "fail", &permanent).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "parked", "{}", r.text);
    assert_eq!(r.json["reason"], "permanent_failure", "{}", r.text);
    assert_eq!(r.json["attempts"], 1, "{}", r.text);
    let retry = json!({"by": "ops-1", "reason": "fixed the address"});
    let r = act(&s, &id_p, "retry", &retry).await;
    assert_eq!(r.status, StatusCode::OK, "operator retry: {}", r.text);
    assert_eq!(r.json["status"], "queued", "{}", r.text);
    assert_eq!(r.json["attempts"], 0, "{}", r.text);
    assert_eq!(r.json["reason"], Value::Null, "{}", r.text);
    let g = get_dlv(&s, &id_p).await;
    let step = timeline(&g).last().cloned().expect("step");
    assert_eq!(step["event"], "retried", "{g}");
    // Open mode: `by` is null (section 8), the body's `by` is not recorded, no lease owner.
    assert!(
        step.get("by").is_none_or(Value::is_null) && step["owner"].is_null(),
        "{g}"
    );
    assert_eq!(step["reason"], "fixed the address", "{g}");
    let got = claim_some(&api, "w2").await;
    assert_eq!(ids(&got), vec![id_p.clone()], "claimable again after retry");
    assert_eq!(
        got[0]["attempts"], 1,
        "attempts start again from 0: {}",
        got[0]
    );
    let r = act(&s, &id_p, "complete", &json!({"owner": "w2"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "sent", "{}", r.text);
    let g = get_dlv(&s, &id_p).await;
    let retried = ["attempt_failed", "retried", "leased", "sent"];
    assert_steps(&g, &[&["created", "leased"][..], &retried].concat());
    let head = s.head().await;
    let operator = [("retry", json!({})), ("discard", json!({}))];
    refused_all(&s, &id_p, &operator, ILLEGAL, "a sent row").await;
    let what = "refused operator actions append nothing";
    assert_eq!(s.head().await, head, "{what}");

    // Discard the parked A (no body), then nothing more is allowed on it.
    let r = post_empty(
        &s,
        &format!("/v1/deliveries/{}/discard", encode_path(&id_a)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "discard a parked row: {}", r.text);
    assert_eq!(r.json["status"], "discarded", "{}", r.text);
    let g = get_dlv(&s, &id_a).await;
    assert_eq!(g["status"], "discarded", "{g}");
    assert_eq!(
        timeline(&g).last().expect("step")["event"],
        "discarded",
        "{g}"
    );
    let head = s.head().await;
    refused_all(&s, &id_a, &operator, ILLEGAL, "a discarded row").await;
    assert_eq!(s.head().await, head);

    // Illegal transitions on queued and leased rows: 409 with stable codes, nothing appended.
    append_ok(&s, &json!({"events": [urgent("sm-q"), urgent("sm-r")]})).await;
    let (id_q, id_r) = (dlv("sm-q"), dlv("sm-r"));
    wait_status(&s, &id_q, "queued").await;
    wait_status(&s, &id_r, "queued").await;
    let head = s.head().await;
    let every = [&owner_calls("w1")[..], &operator].concat();
    refused_all(&s, &id_q, &every, ILLEGAL, "a queued row").await;
    assert_eq!(s.head().await, head, "refused transitions append nothing");
    assert_eq!(get_dlv(&s, &id_q).await["status"], "queued");

    let got = claim(&s, "w1", 1, 60_000).await;
    assert_eq!(got.len(), 1, "limit 1");
    let x = got[0]["id"].as_str().expect("id").to_owned();
    assert!(x == id_q || x == id_r, "{x}");
    let head = s.head().await;
    refused_all(&s, &x, &owner_calls("w2"), NOT_OWNER, "by a non-owner").await;
    refused_all(&s, &x, &operator, ILLEGAL, "a leased row").await;
    assert_eq!(s.head().await, head, "refused transitions append nothing");
    let g = get_dlv(&s, &x).await;
    assert_eq!(g["status"], "leased", "{g}");
    assert_eq!(g["lease_owner"], "w1", "{g}");
    assert_eq!(g["lease_expires_at"], got[0]["lease_expires_at"], "{g}");
    assert_eq!(g["attempts"], 1, "{g}");

    // Unknown ids.
    let nope = "dlv:nope:desktop";
    refused_all(&s, nope, &every, NOT_FOUND, "of an unknown id").await;
    let r = s
        .get(&format!("/v1/deliveries/{}", encode_path(nope)))
        .await;
    assert_problem_for(&r, 404, "delivery_not_found", "GET of an unknown id");
    assert_eq!(s.head().await, head);

    // The filters of the list agree with the states reached above.
    for (status, want) in [
        ("discarded", vec![id_a.clone()]),
        ("retry_wait", vec![id_b.clone(), id_c.clone()]),
        ("sent", vec![id_p.clone()]),
        ("leased", vec![x.clone()]),
        ("parked", vec![]),
    ] {
        let got = ids(&list_deliveries(&s, &format!("status={status}"), 2).await);
        assert_eq!(got, want, "GET /v1/deliveries?status={status}");
    }
    let all = ids(&list_deliveries(&s, "sink=app&route=desktop", 1).await);
    assert_eq!(all.len(), 6, "{all:?}");
    assert!(list_deliveries(&s, "sink=none", 10).await.is_empty());

    // The deliveries model is a function of the log (I3): the backoff draws are in the events.
    assert_deliveries_verified(&s).await;
}

// ---------------------------------------------------------------------------------------------
// 3. Extend
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn extend_pushes_the_lease_and_an_expired_lease_cannot_be_extended() {
    let s = Server::start(ServerOpts::default()).await;
    let (id, got) = claimed(&s, "ex-1", "A", 10, 60_000).await;
    let first = us(&got[0]["lease_expires_at"]);
    let lease = |owner: &str, ms: u64| json!({"owner": owner, "lease_ms": ms});
    let t0 = now_us();
    let r = act(&s, &id, "extend", &lease("A", 120_000)).await;
    let t1 = now_us();
    assert_eq!(r.status, StatusCode::OK, "extend: {}", r.text);
    let pushed = us(&r.json["lease_expires_at"]);
    assert!(
        pushed > first,
        "extend must push lease_expires_at: {}",
        r.text
    );
    assert!(
        pushed >= t0 + 120_000_000 - SLACK_US && pushed <= t1 + 120_000_000 + SLACK_US,
        "lease_expires_at = now + lease_ms: {}",
        r.text
    );
    assert_eq!(r.json["status"], "leased", "{}", r.text);
    assert_eq!(r.json["lease_owner"], "A", "{}", r.text);
    assert_eq!(
        r.json["attempts"], 1,
        "an extension is not an attempt: {}",
        r.text
    );
    let g = get_dlv(&s, &id).await;
    assert_eq!(g["lease_expires_at"], r.json["lease_expires_at"], "{g}");
    let step = timeline(&g).last().cloned().expect("step");
    assert_eq!(step["event"], "lease_extended", "{g}");
    assert_eq!(step["owner"], "A", "{g}");
    assert_eq!(step["lease_expires_at"], r.json["lease_expires_at"], "{g}");

    let head = s.head().await;
    let r = act(&s, &id, "extend", &lease("B", 120_000)).await;
    assert_problem_for(&r, 409, "not_lease_owner", "extend by another owner");
    assert_eq!(s.head().await, head);
    let r = act(&s, &id, "complete", &json!({"owner": "A"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = act(&s, &id, "extend", &json!({"owner": "A"})).await;
    assert_problem_for(&r, 409, "illegal_transition", "extend a sent row");
    drop(s);

    // A short lease, waited out: extending it is refused with lease_expired. The 1 s expiry
    // tick may release the lease between its expiry and our request (then the row is queued
    // again and the answer is illegal_transition); that race is retried on a fresh server.
    let mut saw = false;
    for attempt in 0..5 {
        let s = Server::start(ServerOpts::default()).await;
        let (id, got) = claimed(&s, "ex-2", "A", 10, 300).await;
        let expires = us(&got[0]["lease_expires_at"]);
        while now_us() <= expires + 20_000 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let head = s.head().await;
        let r = act(&s, &id, "extend", &lease("A", 60_000)).await;
        if r.code() == Some("lease_expired") {
            assert_problem_for(&r, 409, "lease_expired", "extend after the lease expired");
            assert_eq!(s.head().await, head, "a refused extend appends nothing");
            let g = get_dlv(&s, &id).await;
            assert_ne!(
                timeline(&g).last().expect("step")["event"],
                "lease_extended",
                "{g}"
            );
            saw = true;
            break;
        }
        assert_problem_for(
            &r,
            409,
            "illegal_transition",
            &format!("try {attempt}: extend of an expired lease"),
        );
        let g = get_dlv(&s, &id).await;
        assert!(
            step_names(&timeline(&g)).contains(&"lease_expired".to_owned()),
            "try {attempt}: not lease_expired, but the tick did not release it either: {g}"
        );
    }
    assert!(saw, "five tries all raced with the expiry tick");
}

// ---------------------------------------------------------------------------------------------
// 4. Concurrency: the acceptance test of the issue
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn ten_thousand_deliveries_32_claimers_each_sent_once() {
    const TOTAL: usize = 10_000;
    const CLAIMERS: usize = 32;
    let s = Server::start(ServerOpts::default()).await;
    for b in 0..TOTAL / 1000 {
        let batch: Vec<Value> = (0..1000)
            .map(|k| {
                let i = b * 1000 + k;
                notif_ev(
                    &format!("cc-{i:05}"),
                    json!({"priority": "urgent", "title": format!("n {i}")}),
                )
            })
            .collect();
        let r = append_ok(&s, &json!({ "events": batch })).await;
        assert_eq!(r.len(), 1000);
        assert!(r.iter().all(|x| !x.2), "unique ids are never duplicates");
    }
    let want: BTreeSet<String> = (0..TOTAL).map(|i| dlv(&format!("cc-{i:05}"))).collect();
    let api = s.api();
    wait_for(Duration::from_secs(300), "10,000 queued deliveries", || {
        let api = api.clone();
        async move {
            let k = kpis(&api, "").await;
            assert!(
                k["queue_depth"].as_u64().is_some_and(|n| n <= TOTAL as u64),
                "more deliveries than notifications: {k}"
            );
            (k["queued"] == TOTAL).then_some(())
        }
    })
    .await;
    let k = kpis(&s, "").await;
    assert_eq!(k["queue_depth"], TOTAL, "{k}");
    assert_eq!(k["by_sink"]["app"]["queue_depth"], TOTAL, "{k}");

    let mut tasks = Vec::new();
    for c in 0..CLAIMERS {
        let api = s.api();
        tasks.push(tokio::spawn(async move {
            let owner = format!("claimer-{c:02}");
            let mut claims: Vec<Vec<String>> = Vec::new();
            let mut empty_in_a_row = 0u32;
            loop {
                let rows = claim(&api, &owner, 50, 60_000).await;
                if rows.is_empty() {
                    let k = kpis(&api, "").await;
                    if k["queue_depth"] == 0 {
                        return (owner, claims);
                    }
                    empty_in_a_row += 1;
                    assert!(
                        empty_in_a_row < 20_000,
                        "{owner}: nothing to claim but queue_depth stays {}",
                        k["queue_depth"]
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                empty_in_a_row = 0;
                let mut got = Vec::new();
                for row in &rows {
                    let id = row["id"].as_str().expect("id").to_owned();
                    assert_eq!(row["attempts"], 1, "no delivery is leased twice: {row}");
                    let r = act(&api, &id, "complete", &json!({"owner": owner})).await;
                    assert_eq!(
                        r.status,
                        StatusCode::OK,
                        "{owner} completes {id}: {}",
                        r.text
                    );
                    assert_eq!(r.json["status"], "sent", "{}", r.text);
                    assert_eq!(r.json["lease_owner"], owner.as_str(), "{}", r.text);
                    got.push(id);
                }
                claims.push(got);
            }
        }));
    }
    let mut by_claim: HashMap<String, String> = HashMap::new();
    let mut claims_total = 0usize;
    let joined = tokio::time::timeout(Duration::from_secs(1200), futures::future::join_all(tasks))
        .await
        .expect("the claimers did not finish within 20 minutes");
    for j in joined {
        let (owner, claims) = j.expect("a claimer panicked");
        for c in claims {
            claims_total += 1;
            for id in c {
                if let Some(prev) = by_claim.insert(id.clone(), owner.clone()) {
                    panic!("{id} was returned by a claim of {prev} and a claim of {owner}");
                }
            }
        }
    }
    let claimed: BTreeSet<String> = by_claim.keys().cloned().collect();
    assert_eq!(
        claimed.len(),
        TOTAL,
        "every delivery claimed once ({claims_total} claims)"
    );
    assert_eq!(
        claimed, want,
        "the claimed ids are the deliveries of the notifications"
    );
    let owners: HashSet<&String> = by_claim.values().collect();
    assert!(owners.len() > 1, "the work was shared by several claimers");

    // Every delivery is sent; none lost.
    let sent = list_deliveries(&s, "status=sent", 1000).await;
    let sent_ids: BTreeSet<String> = sent
        .iter()
        .map(|d| d["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(
        sent.len(),
        TOTAL,
        "list status=sent has every delivery once"
    );
    assert_eq!(sent_ids, want);
    for d in &sent {
        let id = d["id"].as_str().expect("id");
        assert_eq!(d["lease_owner"], by_claim[id].as_str(), "{d}");
        assert_eq!(d["attempts"], 1, "{d}");
    }
    let all = list_deliveries(&s, "", 1000).await;
    assert_eq!(all.len(), TOTAL, "no other delivery exists");
    let k = kpis(&s, "interval_s=3600").await;
    assert_eq!(k["queue_depth"], 0, "{k}");
    assert_eq!(k["leased"], 0, "{k}");
    assert_eq!(k["parked"], 0, "{k}");
    assert_eq!(k["sent_last_interval"], TOTAL, "{k}");

    // The log: per delivery exactly created, leased, sent, by the one owner of its claim.
    let evs = s.read_all("stream=deliveries").await;
    let mut per: BTreeMap<String, Vec<(String, Option<String>)>> = BTreeMap::new();
    for e in &evs {
        per.entry(e["subject"].as_str().expect("subject").to_owned())
            .or_default()
            .push((
                e["type"].as_str().expect("type").to_owned(),
                e["payload"]["owner"].as_str().map(str::to_owned),
            ));
    }
    assert_eq!(
        per.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "the deliveries stream is about exactly these deliveries"
    );
    for (id, steps) in &per {
        let types: Vec<&str> = steps.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            types,
            ["delivery.created", "delivery.leased", "delivery.sent"],
            "events of {id}: {steps:?}"
        );
        let owner = Some(by_claim[id].clone());
        assert_eq!(steps[1].1, owner, "leased owner of {id}: {steps:?}");
        assert_eq!(steps[2].1, owner, "sent owner of {id}: {steps:?}");
    }
    assert_deliveries_verified(&s).await;
}

// ---------------------------------------------------------------------------------------------
// 5. Lease expiry
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_expired_lease_goes_to_the_next_claimer() {
    let s = Server::start(ServerOpts::default()).await;
    let want = queued_batch(&s, "le", 20).await;
    let got_a = claim(&s, "A", 20, 500).await;
    let a_ids: BTreeSet<String> = ids(&got_a).into_iter().collect();
    assert_eq!(a_ids, want, "A leases all 20");
    let a_expiry = lease_expiries(&got_a);
    // A dies. B polls until it has the same 20.
    let b_ids = collect_claims(&s.api(), "B", &want).await;
    assert_eq!(b_ids, want);

    let head = s.head().await;
    for id in &want {
        let g = get_dlv(&s, id).await;
        assert_eq!(g["status"], "leased", "{g}");
        assert_eq!(g["lease_owner"], "B", "{g}");
        assert_eq!(g["attempts"], 2, "each lease is an attempt: {g}");
        let tl = timeline(&g);
        assert_eq!(
            step_names(&tl),
            ["created", "leased", "lease_expired", "leased"],
            "{g}"
        );
        assert_eq!(tl[1]["owner"], "A", "{g}");
        assert_eq!(tl[3]["owner"], "B", "{g}");
        assert!(
            tl[2]["owner"].is_null() || tl[2]["owner"] == "A",
            "the expired lease is A's: {g}"
        );
        assert!(
            us(&tl[2]["at"]) >= a_expiry[id],
            "a lease is never released before it expires: {g}"
        );
        assert!(us(&tl[3]["at"]) >= a_expiry[id], "{g}");
        assert_timeline_ordered(&g);
        // A comes back: its lease is gone.
        let r = act(&s, id, "complete", &json!({"owner": "A"})).await;
        assert_problem_for(
            &r,
            409,
            "not_lease_owner",
            "A completes after its lease expired",
        );
        let r = act(&s, id, "fail", &json!({"owner": "A", "error_code": "late"})).await;
        assert_problem_for(
            &r,
            409,
            "not_lease_owner",
            "A fails after its lease expired",
        );
    }
    assert_eq!(s.head().await, head, "A's refused reports append nothing");
    for id in &want {
        let r = act(&s, id, "complete", &json!({"owner": "B"})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.json["status"], "sent", "{}", r.text);
        assert_eq!(r.json["attempts"], 2, "{}", r.text);
    }
    let k = kpis(&s, "").await;
    assert_eq!(k["queue_depth"], 0, "{k}");
    assert_deliveries_verified(&s).await;
}

#[tokio::test]
async fn a_lease_held_across_kill9_is_released_after_restart() {
    let mut s = Server::start(ServerOpts::default()).await;
    let want = queued_batch(&s, "rs", 10).await;
    let got_a = claim(&s, "A", 10, 1_500).await;
    assert_eq!(ids(&got_a).into_iter().collect::<BTreeSet<_>>(), want);
    let a_expiry = lease_expiries(&got_a);
    s.kill9();
    s.restart().await;

    // Nobody claims: the start-up expiry and the tick release A's leases on their own.
    for id in &want {
        let g = wait_status(&s, id, "queued").await;
        let tl = timeline(&g);
        assert_eq!(
            step_names(&tl),
            ["created", "leased", "lease_expired"],
            "{g}"
        );
        assert_eq!(tl[1]["owner"], "A", "{g}");
        assert!(
            us(&tl[2]["at"]) >= a_expiry[id],
            "released before the lease expired: {g}"
        );
        assert_eq!(g["lease_owner"], Value::Null, "{g}");
    }
    let b_ids = collect_claims(&s.api(), "B", &want).await;
    assert_eq!(b_ids, want);
    for id in &want {
        let r = act(&s, id, "complete", &json!({"owner": "B"})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let g = get_dlv(&s, id).await;
        assert_eq!(g["status"], "sent", "{g}");
        let tl = timeline(&g);
        assert_eq!(
            step_names(&tl),
            ["created", "leased", "lease_expired", "leased", "sent"],
            "{g}"
        );
        assert_eq!(tl[3]["owner"], "B", "{g}");
        assert_eq!(tl[4]["owner"], "B", "{g}");
        let r = act(&s, id, "complete", &json!({"owner": "A"})).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    }
    assert_deliveries_verified(&s).await;
}

#[tokio::test]
async fn an_expired_last_attempt_is_parked() {
    let s = start_with("[notifications.retry]\nmax_attempts = 1\n").await;
    let (id, got) = claimed(&s, "lp-1", "A", 10, 100).await;
    let expires = us(&got[0]["lease_expires_at"]);
    // Released by the tick (or by a claim of B): either way the last attempt is used up.
    let api = s.api();
    let g = wait_for(WAIT, "the expired last attempt to be parked", || {
        let api = api.clone();
        let id = id.clone();
        async move {
            let rows = claim(&api, "B", 10, 60_000).await;
            assert!(
                rows.is_empty(),
                "a used-up delivery was leased again: {rows:?}"
            );
            let g = get_dlv(&api, &id).await;
            (g["status"] == "parked").then_some(g)
        }
    })
    .await;
    assert_eq!(g["reason"], "max_attempts", "{g}");
    assert_eq!(g["attempts"], 1, "{g}");
    assert_eq!(g["lease_owner"], Value::Null, "{g}");
    let tl = timeline(&g);
    assert_eq!(
        step_names(&tl),
        ["created", "leased", "lease_expired"],
        "{g}"
    );
    assert!(us(&tl[2]["at"]) >= expires, "{g}");
    assert_eq!(kpis(&s, "").await["parked"], 1);
    let r = act(&s, &id, "complete", &json!({"owner": "A"})).await;
    assert_problem_for(&r, 409, "illegal_transition", "complete of a parked row");
    let r = act(&s, &id, "retry", &json!({"by": "ops"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "queued", "{}", r.text);
    assert_eq!(r.json["attempts"], 0, "{}", r.text);
    let got = claim(&s, "B", 10, 60_000).await;
    assert_eq!(
        ids(&got),
        vec![id.clone()],
        "claimable again after the operator's retry"
    );
    assert_deliveries_verified(&s).await;
}

// ---------------------------------------------------------------------------------------------
// 6. Backpressure
// ---------------------------------------------------------------------------------------------

/// The bound is hard (section 5): six pending with `max_pending = 6` is full, and a request
/// that would make a seventh is refused (it used to allow one batch past the bound: 6 pending
/// with `max_pending = 5`). Only requests that create deliveries are refused.
#[tokio::test]
async fn a_full_outbox_refuses_notification_requests_only() {
    let s = start_with("[notifications.outbox]\nmax_pending = 6\n").await;
    let batch: Vec<Value> = (0..6).map(|i| urgent(&format!("bp-{i}"))).collect();
    append_ok(&s, &json!({ "events": batch })).await;
    let api = s.api();
    wait_for(WAIT, "6 pending deliveries", || {
        let api = api.clone();
        async move { (kpis(&api, "").await["queue_depth"] == 6).then_some(()) }
    })
    .await;

    // Under the default stuck_after (10 min) fresh rows are not stuck.
    let k = kpis(&s, "").await;
    assert_eq!(k["stuck"], 0, "{k}");
    assert_eq!(k["by_sink"]["app"]["stuck"], 0, "{k}");
    assert!(
        k["oldest_pending_age_s"]
            .as_f64()
            .is_some_and(|a| (0.0..600.0).contains(&a)),
        "{k}"
    );

    let head = s.head().await;
    let r = s
        .send(s.request(Method::POST, "/v1/events").json(&urgent("bp-7")))
        .await;
    assert_problem_for(&r, 429, "outbox_full", "6 pending + 1 > max_pending 6");
    assert_eq!(s.head().await, head, "a refused request appends nothing");
    assert_eq!(
        retry_after(&r),
        3600,
        "nothing completed in the last minute: the longest wait"
    );
    // A notification that makes no delivery (dashboard only) and a duplicate of an accepted
    // one are still answered.
    let r = append_ok(
        &s,
        &notif_ev("bp-info", json!({"priority": "info", "title": "fyi"})),
    )
    .await;
    assert!(!r[0].2, "{r:?}");
    let r = append_ok(&s, &urgent("bp-3")).await;
    assert!(r[0].2, "a duplicate: {r:?}");
    let head = s.head().await;
    // A batch with a notification request is refused whole.
    let r = s
        .send(
            s.request(Method::POST, "/v1/events")
                .json(&json!({"events": [
                    {"stream": "task_events", "subject": "bp-task-2", "type": "task.created",
                     "payload": {"project_id": "p"}},
                    urgent("bp-8"),
                ]})),
        )
        .await;
    assert_problem_for(
        &r,
        429,
        "outbox_full",
        "a batch holding a notification request",
    );
    assert_eq!(s.head().await, head, "a refused request appends nothing");
    let listed: Vec<String> = list_notifications(&s, "", 500)
        .await
        .iter()
        .map(|n| n["notification_id"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(
        !listed.iter().any(|n| n == "bp-7" || n == "bp-8"),
        "a refused notification is not listed: {listed:?}"
    );
    let r = s.get("/v1/tasks/bp-task-2").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);

    // Lifecycle events are still accepted.
    let r = append_ok(
        &s,
        &json!({"events": [
            {"stream": "task_events", "subject": "bp-task", "type": "task.created",
             "payload": {"project_id": "p"}},
            {"stream": "task_events", "subject": "bp-task", "type": "task.run_started",
             "payload": {"run_id": "r1"}},
        ]}),
    )
    .await;
    assert_eq!(r.len(), 2);
    assert_eq!(s.head().await, head + 2);

    // Deliver one: 5 pending, one below the limit: the same request is accepted.
    let got = claim(&s, "bp-worker", 1, 60_000).await;
    assert_eq!(got.len(), 1);
    let id = got[0]["id"].as_str().expect("id").to_owned();
    let r = act(&s, &id, "complete", &json!({"owner": "bp-worker"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(kpis(&s, "").await["queue_depth"], 5);
    // A batch of two would make 7: refused whole, waiting for one completion at the rate of
    // one a minute (ceil(1 × 60 / 1) s).
    let r = s
        .send(
            s.request(Method::POST, "/v1/events")
                .json(&json!({"events": [urgent("bp-7"), urgent("bp-8")]})),
        )
        .await;
    assert_problem_for(&r, 429, "outbox_full", "5 + 2 > 6");
    assert!(
        (1..=60).contains(&retry_after(&r)),
        "Retry-After follows the drain rate: {:?}",
        r.headers
    );
    let r = append_ok(&s, &urgent("bp-7")).await;
    assert_eq!(r.len(), 1);
    assert!(!r[0].2, "bp-7 was never appended before: {r:?}");
    let listed = list_notifications(&s, "", 500).await;
    assert!(
        listed.iter().any(|n| n["notification_id"] == "bp-7"),
        "the accepted notification is listed"
    );
    // Its delivery makes 6 pending again: full, refused again — also before the router has
    // made bp-7's delivery (it is counted while unrouted), so the bound is never exceeded.
    // (The router may append that delivery meanwhile, so the head is no measure here.)
    let r = s
        .send(s.request(Method::POST, "/v1/events").json(&urgent("bp-9")))
        .await;
    assert_problem_for(&r, 429, "outbox_full", "full again");
    let r = s.get("/v1/notifications/bp-9").await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "nothing of it appended: {}",
        r.text
    );
    wait_status(&s, &dlv("bp-7"), "queued").await;
    assert_eq!(
        kpis(&s, "").await["queue_depth"],
        6,
        "never above the bound"
    );
}

/// The `Retry-After` of a 429, in whole seconds.
fn retry_after(r: &Reply) -> u64 {
    let v = r
        .headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("429 without Retry-After: {:?}", r.headers));
    v.trim()
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After must be whole seconds: {v:?}"))
}

// ---------------------------------------------------------------------------------------------
// 7. KPIs
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn kpis_count_a_known_mix() {
    let config = "[notifications.outbox]\nstuck_after = \"1s\"\n\n\
                  [notifications.routing]\ninfo = [\"dashboard\", \"pager\"]\n";
    let s = Server::start(ServerOpts::default().config(config)).await;
    let batch: Vec<Value> = (0..8).map(|i| urgent(&format!("k-{i}"))).collect();
    append_ok(&s, &json!({ "events": batch })).await;
    append_ok(
        &s,
        &notif_ev("k-info", json!({"priority": "info", "title": "fyi"})),
    )
    .await;
    for i in 0..8 {
        wait_status(&s, &dlv(&format!("k-{i}")), "queued").await;
    }
    let skipped = wait_status(&s, "dlv:k-info:pager", "skipped").await;
    assert_eq!(skipped["reason"], "unknown_route", "{skipped}");
    assert_eq!(skipped["sink"], "none", "{skipped}");
    // Kept (section 4), and said at start: a WARN naming the route and its priority.
    let warned = s.stderr().lines().any(|l| {
        l.contains("WARN") && l.contains("notifications.routing.info names the route \"pager\"")
    });
    assert!(
        warned,
        "no start warning for the unknown route: {}",
        s.stderr()
    );

    let got = claim(&s, "A", 5, 60_000).await;
    assert_eq!(got.len(), 5);
    let g: Vec<String> = ids(&got);
    for id in &g[0..2] {
        let r = act(&s, id, "complete", &json!({"owner": "A"})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let r = act(
        &s,
        &g[2],
        "fail",
        &json!({"owner": "A", "error_code": "busy", "retry_after_ms": 600_000}),
    )
    .await;
    assert_eq!(r.json["status"], "retry_wait", "{}", r.text);
    let r = act(
        &s,
        &g[3],
        "fail",
        &json!({"owner": "A", "error_code": "gone", "retryable": false}),
    )
    .await;
    assert_eq!(r.json["status"], "parked", "{}", r.text);
    // g[4] stays leased; 3 stay queued.
    let want = [
        ("queue_depth", 5u64),
        ("queued", 3),
        ("leased", 1),
        ("retry_wait", 1),
        ("parked", 1),
        ("sent_last_interval", 2),
    ];
    let k = kpis(&s, "interval_s=3600").await;
    assert_eq!(k["interval_s"], 3600, "{k}");
    for (field, n) in want {
        assert_eq!(k[field], n, "overall `{field}`: {k}");
        assert_eq!(k["by_sink"]["app"][field], n, "by_sink.app `{field}`: {k}");
    }
    let k = kpis(&s, "").await;
    assert_eq!(k["interval_s"], 60, "the default interval: {k}");
    assert!(
        k["sent_last_interval"].as_u64().is_some_and(|n| n <= 2),
        "{k}"
    );
    for stat in [
        "queue_depth",
        "stuck",
        "parked",
        "sent_last_interval",
        "oldest_pending_age_s",
    ] {
        assert!(k[stat].is_number(), "`{stat}` is a number: {k}");
        assert!(
            k["by_sink"]["app"][stat].is_number(),
            "`{stat}` of app: {k}"
        );
    }
    assert!(
        k["stuck"].as_u64().is_some_and(|n| n <= 3),
        "only due rows can be stuck: {k}"
    );
    for (query, n) in [
        ("status=queued", 3),
        ("status=leased", 1),
        ("status=retry_wait", 1),
        ("status=parked", 1),
        ("status=sent", 2),
        ("status=skipped", 1),
        ("sink=app", 8),
        ("sink=none", 1),
        ("route=pager", 1),
        ("route=desktop&status=sent", 2),
    ] {
        assert_eq!(
            list_deliveries(&s, query, 3).await.len(),
            n,
            "GET /v1/deliveries?{query}"
        );
    }
    // Skipped rows of the `none` sink are not pending.
    if let Some(none) = k["by_sink"].get("none") {
        assert_eq!(none["queue_depth"], 0, "{k}");
    }

    // stuck_after = 1 s: the 3 queued rows, due and never claimed, become stuck; the leased
    // row (a live 60 s lease) and the one backing off for 10 minutes are not due, and parked
    // and sent ones are terminal (section 5).
    let api = s.api();
    let k = wait_for(WAIT, "3 stuck deliveries", || {
        let api = api.clone();
        async move {
            let k = kpis(&api, "interval_s=3600").await;
            assert!(k["stuck"].as_u64().is_some_and(|n| n <= 3), "{k}");
            (k["stuck"] == 3).then_some(k)
        }
    })
    .await;
    assert_eq!(k["by_sink"]["app"]["stuck"], 3, "{k}");
    assert!(
        k["oldest_pending_age_s"].as_f64().is_some_and(|a| a >= 1.0),
        "the oldest pending row is older than stuck_after: {k}"
    );
    for (field, n) in want {
        assert_eq!(k[field], n, "overall `{field}` later: {k}");
    }
    // Nothing was sent in the last second once a second has passed since the completes.
    let last_sent = g[0..2]
        .iter()
        .map(|id| async { us(&get_dlv(&s, id).await["delivered_at"]) });
    let last_sent = futures::future::join_all(last_sent)
        .await
        .into_iter()
        .max()
        .expect("two");
    while now_us() < last_sent + 1_100_000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(kpis(&s, "interval_s=1").await["sent_last_interval"], 0);

    // The Prometheus gauges agree.
    let r = s.get("/metrics").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for (name, n) in [
        ("tidemark_outbox_queue_depth", 5.0),
        ("tidemark_outbox_parked", 1.0),
        ("tidemark_outbox_stuck", 3.0),
    ] {
        assert_eq!(
            gauge(&r.text, &format!("{name}{{sink=\"app\"}}")),
            Some(n),
            "{name}{{sink=\"app\"}} in /metrics:\n{}",
            tail(&r.text, 4000)
        );
    }
    assert!(
        gauge(
            &r.text,
            "tidemark_outbox_oldest_pending_age_seconds{sink=\"app\"}"
        )
        .is_some_and(|a| a >= 1.0),
        "{}",
        tail(&r.text, 4000)
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Bad input and scopes
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn bad_input_to_delivery_endpoints_is_refused_and_changes_nothing() {
    let s = Server::start(ServerOpts::default()).await;
    let (id, _) = claimed(&s, "bi-1", "A", 1, 60_000).await;
    let before = get_dlv(&s, &id).await;
    let head = s.head().await;

    let long_sink = "a".repeat(65);
    let long_owner = "o".repeat(129);
    // Per endpoint: the spec of its bad bodies (see `bad_posts`).
    let claim_spec = json!({"malformed": "{\"sink\":\"app\",\"owner\":",
        "good": {"sink": "app", "owner": "A"}, "unknown": {"bogus": 1},
        "invalid": [{"sink": null}, {"owner": null}, {"owner": ""}, {"owner": long_owner},
                    {"owner": "a\u{1}b"}, {"sink": "APP!"}, {"sink": long_sink}, {"sink": ""},
                    {"limit": 0}, {"limit": 1001}, {"limit": -1}, {"limit": "5"},
                    {"lease_ms": 10}, {"lease_ms": 3_600_001}]});
    let retry = json!({"malformed": "{\"by\":", "text": "by=me",
        "good": {"by": "me"}, "unknown": {"bogus": 1}, "invalid": [{"by": ""}, {"by": 5}]});
    let specs = json!({
        "complete": {"malformed": "{\"owner\":", "good": {"owner": "A"},
                     "unknown": {"bogus": true},
                     "invalid": [{"owner": null}, {"owner": ""}, {"owner": 7},
                                 {"external_id": ""}]},
        "fail": {"malformed": "{", "good": {"owner": "A", "error_code": "x"},
                 "unknown": {"bogus": 1},
                 "invalid": [{"error_code": null}, {"owner": null}, {"owner": ""},
                             {"error_code": ""}, {"retryable": "yes"}, {"retry_after_ms": -5},
                             {"error": "e".repeat(5000)}]},
        "extend": {"malformed": "{\"owner\"", "good": {"owner": "A"}, "unknown": {"bogus": 1},
                   "invalid": [{"owner": null}, {"owner": ""}, {"lease_ms": 10},
                               {"lease_ms": 3_600_001}]},
        "retry": retry,
        "discard": retry,
    });
    // (path, content type, body, allowed statuses, code when it is fixed)
    let claim_p = "/v1/deliveries/claim";
    let mut cases: Vec<BadPost> = bad_posts(claim_p, &claim_spec);
    for body in ["[]", ""] {
        cases.push((claim_p.to_owned(), JSON, body.to_owned(), &[400], None));
    }
    for target in [id.as_str(), "dlv:nope:desktop"] {
        let base = format!("/v1/deliveries/{}", encode_path(target));
        for verb in ["complete", "fail", "extend", "retry", "discard"] {
            cases.extend(bad_posts(&format!("{base}/{verb}"), &specs[verb]));
        }
    }
    for (path, ct, body, statuses, code) in &cases {
        let what = format!("POST {path} ({ct}) {}", tail(body, 120));
        let r = s
            .send(
                s.request(Method::POST, path)
                    .header(reqwest::header::CONTENT_TYPE, *ct)
                    .body(body.clone()),
            )
            .await;
        assert_refused(&r, statuses, *code, &what);
        assert_eq!(s.head().await, head, "{what} changed the log");
    }

    // Queries and paths of the reads.
    let long_id = format!("/v1/deliveries/{}", "x".repeat(129));
    let gets: Vec<(&str, &[u16], Option<&str>)> = vec![
        ("/v1/deliveries?status=bogus", &[400], Some("invalid_query")),
        ("/v1/deliveries?status=SENT", &[400], Some("invalid_query")),
        ("/v1/deliveries?limit=0", &[400], Some("invalid_query")),
        ("/v1/deliveries?limit=1001", &[400], Some("invalid_query")),
        ("/v1/deliveries?limit=abc", &[400], Some("invalid_query")),
        ("/v1/deliveries?limit=-1", &[400], Some("invalid_query")),
        (&long_id, &[400, 404], None),
        (
            "/v1/outbox/kpis?interval_s=0",
            &[400],
            Some("invalid_query"),
        ),
        (
            "/v1/outbox/kpis?interval_s=86401",
            &[400],
            Some("invalid_query"),
        ),
        (
            "/v1/outbox/kpis?interval_s=abc",
            &[400],
            Some("invalid_query"),
        ),
        (
            "/v1/outbox/kpis?interval_s=-1",
            &[400],
            Some("invalid_query"),
        ),
    ];
    for (path, statuses, code) in gets {
        let r = s.get(path).await;
        assert_refused(&r, statuses, code, &format!("GET {path}"));
    }
    assert_eq!(s.head().await, head, "refused reads changed the log");
    let after = get_dlv(&s, &id).await;
    assert_eq!(after, before, "refused requests changed the delivery");
    let r = s.get("/v1/deliveries?status=leased&limit=1000").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json["deliveries"].as_array().map(Vec::len),
        Some(1),
        "{}",
        r.text
    );
}

#[tokio::test]
async fn delivery_endpoints_enforce_scopes() {
    let reader = format!("tm-read-{}", random_token(24));
    let bridge = format!("tm-bridge-{}", random_token(24));
    let operator = format!("tm-op-{}", random_token(24));
    let appender = format!("tm-append-{}", random_token(24));
    let mut config = String::new();
    for (name, tok, scope) in [
        ("reader", &reader, "read"),
        ("bridge", &bridge, "bridge"),
        ("operator", &operator, "operator"),
        ("appender", &appender, "append"),
    ] {
        config.push_str(&format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = [\"{scope}\"]\n\n",
            sha256_hex(tok)
        ));
    }
    let s = Server::start(ServerOpts::default().config(config)).await;
    let r = call(
        &s,
        Method::POST,
        "/v1/events",
        Some(&appender),
        Some(&urgent("au-1")),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let id = dlv("au-1");
    let path = format!("/v1/deliveries/{}", encode_path(&id));
    wait_for(WAIT, "the delivery of au-1", || {
        let (s, reader, path) = (&s, &reader, &path);
        async move {
            let r = call(s, Method::GET, path, Some(reader), None).await;
            (r.status == StatusCode::OK && r.json["status"] == "queued").then_some(())
        }
    })
    .await;
    let head = s.health_head().await;

    let claim_body = json!({"sink": "app", "owner": "A", "limit": 10, "lease_ms": 60_000});
    let owner = json!({"owner": "A"});
    let failure = json!({"owner": "A", "error_code": "x"});
    let empty = json!({});
    let complete_p = format!("{path}/complete");
    let fail_p = format!("{path}/fail");
    let extend_p = format!("{path}/extend");
    let retry_p = format!("{path}/retry");
    let discard_p = format!("{path}/discard");
    let claim_p = "/v1/deliveries/claim";
    let bridge_calls: Vec<(&str, &Value)> = vec![
        (claim_p, &claim_body),
        (&complete_p, &owner),
        (&fail_p, &failure),
        (&extend_p, &owner),
    ];
    let operator_calls: Vec<(&str, &Value)> = vec![(&retry_p, &empty), (&discard_p, &empty)];
    let reads = ["/v1/deliveries", path.as_str(), "/v1/outbox/kpis"];

    // No token, a wrong token: 401 everywhere.
    let wrong = random_token(30);
    for tok in [None, Some(wrong.as_str())] {
        for (p, b) in bridge_calls.iter().chain(&operator_calls) {
            let r = call(&s, Method::POST, p, tok, Some(b)).await;
            assert_problem_for(&r, 401, "unauthorized", &format!("POST {p} with {tok:?}"));
        }
        for p in reads {
            let r = call(&s, Method::GET, p, tok, None).await;
            assert_problem_for(&r, 401, "unauthorized", &format!("GET {p} with {tok:?}"));
        }
    }
    // Without the bridge scope: claim, complete, fail, extend are 403; without the operator
    // scope: retry and discard are 403.
    for (toks, calls, scope) in [
        ([&reader, &operator, &appender], &bridge_calls, "bridge"),
        ([&reader, &bridge, &appender], &operator_calls, "operator"),
    ] {
        for tok in toks {
            for (p, b) in calls {
                let r = call(&s, Method::POST, p, Some(tok), Some(b)).await;
                let what = format!("POST {p} without {scope}");
                assert_problem_for(&r, 403, "forbidden_scope", &what);
            }
        }
    }
    // Without the read scope: the reads are 403.
    for tok in [&bridge, &operator, &appender] {
        for p in reads {
            let r = call(&s, Method::GET, p, Some(tok), None).await;
            assert_problem_for(&r, 403, "forbidden_scope", &format!("GET {p} without read"));
        }
    }
    assert_eq!(
        s.health_head().await,
        head,
        "refused calls appended nothing"
    );
    let r = call(&s, Method::GET, &path, Some(&reader), None).await;
    assert_eq!(r.json["status"], "queued", "{}", r.text);

    // With the right scope each call gets through auth.
    for p in reads {
        let r = call(&s, Method::GET, p, Some(&reader), None).await;
        assert_eq!(r.status, StatusCode::OK, "GET {p} with read: {}", r.text);
    }
    let r = call(&s, Method::POST, claim_p, Some(&bridge), Some(&claim_body)).await;
    assert_eq!(r.status, StatusCode::OK, "claim with bridge: {}", r.text);
    assert_eq!(r.json["deliveries"][0]["id"], id.as_str(), "{}", r.text);
    let r = call(&s, Method::POST, &extend_p, Some(&bridge), Some(&owner)).await;
    assert_eq!(r.status, StatusCode::OK, "extend with bridge: {}", r.text);
    let r = call(&s, Method::POST, &retry_p, Some(&operator), Some(&empty)).await;
    assert_problem_for(
        &r,
        409,
        "illegal_transition",
        "operator retry of a leased row",
    );
    let fail_perm = json!({"owner": "A", "error_code": "x", "retryable": false});
    let r = call(&s, Method::POST, &fail_p, Some(&bridge), Some(&fail_perm)).await;
    assert_eq!(r.status, StatusCode::OK, "fail with bridge: {}", r.text);
    assert_eq!(r.json["status"], "parked", "{}", r.text);
    let r = call(&s, Method::POST, &retry_p, Some(&operator), Some(&empty)).await;
    assert_eq!(r.status, StatusCode::OK, "retry with operator: {}", r.text);
    let r = call(&s, Method::POST, claim_p, Some(&bridge), Some(&claim_body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = call(&s, Method::POST, &complete_p, Some(&bridge), Some(&owner)).await;
    assert_eq!(r.status, StatusCode::OK, "complete with bridge: {}", r.text);
    assert_eq!(r.json["status"], "sent", "{}", r.text);
}

// ---------------------------------------------------------------------------------------------
// 9. OpenAPI
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn openapi_documents_every_delivery_path() {
    let s = Server::start(ServerOpts::default()).await;
    let r = s.get("/openapi.json").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let paths = r.json["paths"]
        .as_object()
        .unwrap_or_else(|| panic!("no `paths` object: {}", tail(&r.text, 2000)));
    for (path, method) in [
        ("/v1/deliveries/claim", "post"),
        ("/v1/deliveries/{id}/complete", "post"),
        ("/v1/deliveries/{id}/fail", "post"),
        ("/v1/deliveries/{id}/extend", "post"),
        ("/v1/deliveries/{id}/retry", "post"),
        ("/v1/deliveries/{id}/discard", "post"),
        ("/v1/deliveries", "get"),
        ("/v1/deliveries/{id}", "get"),
        ("/v1/outbox/kpis", "get"),
    ] {
        let item = paths.get(path).unwrap_or_else(|| {
            panic!(
                "/openapi.json lacks {path}; it has {:?}",
                paths.keys().collect::<Vec<_>>()
            )
        });
        assert!(
            item.get(method).is_some(),
            "/openapi.json: {path} has no {method}: {item}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The delivery id of the desktop route of notification `nid`.
/// The batch form of complete: one command settles many deliveries; each item is judged on
/// its own (a foreign, a queued and an unknown id are refused without affecting the others),
/// a repeat is answered with the same rows, and bad batches are refused whole.
#[tokio::test]
async fn batch_complete_settles_each_item_on_its_own() {
    let s = Server::start(ServerOpts::default()).await;
    let api = s.api();
    let ids: Vec<String> = (0..6).map(|i| format!("bc-{i}")).collect();
    for id in &ids {
        append_ok(&api, &urgent(id)).await;
    }
    let mut mine = Vec::new();
    while mine.len() < 4 {
        let rows = claim(&api, "owner-a", (4 - mine.len()) as u32, 60_000).await;
        mine.extend(ids_of(&rows));
        if rows.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Routing is in log order: with four claimed, the other two exist; owner-b takes one.
    let mut theirs = Vec::new();
    while theirs.is_empty() {
        theirs = claim(&api, "owner-b", 1, 60_000).await;
    }
    let foreign = theirs[0]["id"].as_str().unwrap().to_owned();
    // What is left unclaimed stays queued.
    let queued: Vec<String> = ids
        .iter()
        .map(|i| dlv(i))
        .filter(|d| !mine.contains(d) && *d != foreign)
        .collect();
    let head = s.head().await;
    let mut items: Vec<Value> = mine.iter().map(|id| json!({"id": id})).collect();
    items.push(json!({"id": foreign}));
    items.push(json!({"id": "dlv:nope:desktop"}));
    assert_eq!(queued.len(), 1, "one delivery left queued: {queued:?}");
    items.push(json!({"id": queued[0]}));
    let r = complete_batch(&api, &items).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let results = r.json["results"].as_array().expect("results").clone();
    assert_eq!(results.len(), items.len(), "{}", r.text);
    for (i, res) in results.iter().enumerate() {
        assert_eq!(
            res["id"], items[i]["id"],
            "results in request order: {}",
            r.text
        );
    }
    for res in &results[..mine.len()] {
        assert_eq!(res["status"], 200, "{res}");
        assert_eq!(res["delivery"]["status"], "sent", "{res}");
        assert_eq!(res["delivery"]["lease_owner"], "owner-a", "{res}");
    }
    assert_eq!(results[mine.len()]["status"], 409, "{}", r.text);
    assert_eq!(results[mine.len()]["code"], "not_lease_owner", "{}", r.text);
    assert_eq!(results[mine.len() + 1]["status"], 404, "{}", r.text);
    assert_eq!(
        results[mine.len() + 1]["code"],
        "delivery_not_found",
        "{}",
        r.text
    );
    if !queued.is_empty() {
        assert_eq!(
            results[mine.len() + 2]["code"],
            "illegal_transition",
            "{}",
            r.text
        );
    }
    // Exactly one delivery.sent per completed item, nothing for the refused ones.
    let after = s.head().await;
    assert_eq!(
        after - head,
        mine.len() as u64,
        "one event per completed item"
    );
    assert_eq!(get_dlv(&api, &foreign).await["status"], "leased");
    for q in &queued {
        assert_eq!(get_dlv(&api, q).await["status"], "queued");
    }
    // A repeat answers the same rows and appends nothing.
    let again: Vec<Value> = mine.iter().map(|id| json!({"id": id})).collect();
    let r = complete_batch(&api, &again).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.json["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["status"] == 200 && x["delivery"]["status"] == "sent"),
        "{}",
        r.text
    );
    assert_eq!(s.head().await, after, "a repeat appends nothing");
    // Bad batches are refused whole.
    for (body, code) in [
        (json!({"owner": "owner-a", "deliveries": []}), 422),
        (json!({"owner": "", "deliveries": [{"id": "x"}]}), 422),
        // A missing field is `422 field_required` (issue 53: one error for one mistake; it
        // was `400 malformed_json`).
        (json!({"owner": "owner-a"}), 422),
        (
            json!({"owner": "owner-a", "deliveries": [{"id": "x", "extra": 1}]}),
            400,
        ),
    ] {
        let r = post(&api, "/v1/deliveries/complete", &body).await;
        assert_eq!(r.status.as_u16(), code, "{body}: {}", r.text);
        assert!(r.code().is_some(), "{}", r.text);
    }
    let too_many: Vec<Value> = (0..1001)
        .map(|i| json!({"id": format!("dlv:{i}:desktop")}))
        .collect();
    let r = complete_batch(&api, &too_many).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(s.head().await, after);
    assert_deliveries_verified(&api).await;
}

/// `POST /v1/deliveries/complete` of `items` (`{"id": ..}` each) by `owner-a`.
async fn complete_batch(api: &Api, items: &[Value]) -> Reply {
    let body = json!({"owner": "owner-a", "deliveries": items});
    post(api, "/v1/deliveries/complete", &body).await
}

fn ids_of(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect()
}

fn dlv(nid: &str) -> String {
    format!("dlv:{nid}:desktop")
}

/// An urgent `notification.requested` with id `id`.
fn urgent(id: &str) -> Value {
    notif_ev(
        id,
        json!({"priority": "urgent", "title": format!("title of {id}")}),
    )
}

/// `POST path` with a JSON body.
pub(crate) async fn post(api: &Api, path: &str, body: &Value) -> Reply {
    api.send(api.request(Method::POST, path).json(body)).await
}

/// `POST /v1/deliveries/{id}/{verb}` with a JSON body.
pub(crate) async fn act(api: &Api, id: &str, verb: &str, body: &Value) -> Reply {
    post(
        api,
        &format!("/v1/deliveries/{}/{verb}", encode_path(id)),
        body,
    )
    .await
}

/// Claim on sink `app`; panics unless 200 with leased rows of `owner`, at most `limit`.
pub(crate) async fn claim(api: &Api, owner: &str, limit: u32, lease_ms: u64) -> Vec<Value> {
    let body = json!({"sink": "app", "owner": owner, "limit": limit, "lease_ms": lease_ms});
    let r = post(api, "/v1/deliveries/claim", &body).await;
    assert_eq!(r.status, StatusCode::OK, "claim {body}: {}", r.text);
    let rows = r.json["deliveries"]
        .as_array()
        .unwrap_or_else(|| panic!("claim: no `deliveries` array: {}", r.text))
        .clone();
    assert!(
        rows.len() <= usize::try_from(limit).expect("small"),
        "claim answered more than limit {limit}: {}",
        r.text
    );
    for row in &rows {
        assert_eq!(row["status"], "leased", "claimed row: {row}");
        assert_eq!(row["lease_owner"], owner, "claimed row: {row}");
        assert_eq!(row["sink"], "app", "claimed row: {row}");
        check_time(row["lease_expires_at"].as_str().expect("lease_expires_at"));
    }
    rows
}

/// Poll claim (limit 10, 60 s lease) until it answers something.
pub(crate) async fn claim_some(api: &Api, owner: &str) -> Vec<Value> {
    wait_for(
        WAIT,
        &format!("a claim by {owner} to lease something"),
        || {
            let api = api.clone();
            let owner = owner.to_owned();
            async move {
                let rows = claim(&api, &owner, 10, 60_000).await;
                (!rows.is_empty()).then_some(rows)
            }
        },
    )
    .await
}

/// Poll claims of `owner` (60 s leases) until it holds every id of `want`; a claim of any other
/// id, or of one id twice, fails the test.
async fn collect_claims(api: &Api, owner: &str, want: &BTreeSet<String>) -> BTreeSet<String> {
    let mut have: BTreeSet<String> = BTreeSet::new();
    let deadline = std::time::Instant::now() + WAIT;
    while have.len() < want.len() {
        for id in ids(&claim(api, owner, 50, 60_000).await) {
            assert!(want.contains(&id), "{owner} claimed an unexpected {id}");
            assert!(have.insert(id.clone()), "{owner} was given {id} twice");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{owner} got only {} of {} expired leases within {WAIT:?}",
            have.len(),
            want.len()
        );
        if have.len() < want.len() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    have
}

fn ids(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| {
            r["id"]
                .as_str()
                .unwrap_or_else(|| panic!("delivery without id: {r}"))
                .to_owned()
        })
        .collect()
}

/// `GET /v1/deliveries/{id}`; panics unless 200.
pub(crate) async fn get_dlv(api: &Api, id: &str) -> Value {
    let r = api
        .get(&format!("/v1/deliveries/{}", encode_path(id)))
        .await;
    assert_eq!(r.status, StatusCode::OK, "GET delivery {id}: {}", r.text);
    r.json
}

/// Wait (bounded) until delivery `id` exists with `status`; returns it.
pub(crate) async fn wait_status(api: &Api, id: &str, status: &str) -> Value {
    wait_for(WAIT, &format!("delivery {id} to be {status}"), || {
        let api = api.clone();
        let id = id.to_owned();
        let status = status.to_owned();
        async move {
            let r = api
                .get(&format!("/v1/deliveries/{}", encode_path(&id)))
                .await;
            assert!(
                r.status == StatusCode::OK || r.status == StatusCode::NOT_FOUND,
                "GET delivery {id}: {}",
                r.text
            );
            (r.status == StatusCode::OK && r.json["status"] == status.as_str()).then_some(r.json)
        }
    })
    .await
}

/// `GET /v1/outbox/kpis?<query>`; panics unless 200.
async fn kpis(api: &Api, query: &str) -> Value {
    let r = api.get(&format!("/v1/outbox/kpis?{query}")).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "GET /v1/outbox/kpis?{query}: {}",
        r.text
    );
    r.json
}

/// Every delivery of `GET /v1/deliveries?<query>`, paging with `limit` via `after`/`next_after`.
async fn list_deliveries(api: &Api, query: &str, limit: u32) -> Vec<Value> {
    list_after(api, "/v1/deliveries", "deliveries", query, limit).await
}

pub(crate) fn timeline(row: &Value) -> Vec<Value> {
    row["timeline"]
        .as_array()
        .unwrap_or_else(|| panic!("no `timeline` array: {row}"))
        .clone()
}

/// The timeline of `row`, whose steps must be `want`.
#[track_caller]
fn assert_steps(row: &Value, want: &[&str]) -> Vec<Value> {
    let tl = timeline(row);
    assert_eq!(step_names(&tl), want, "timeline: {row}");
    tl
}

/// Request the urgent notification `nid` and wait for its delivery to be queued; answers the
/// delivery id.
async fn queued(api: &Api, nid: &str) -> String {
    append_ok(api, &urgent(nid)).await;
    let id = dlv(nid);
    wait_status(api, &id, "queued").await;
    id
}

/// Request the urgent notifications `{prefix}-00`.. (`n` of them) in one batch and wait until
/// their deliveries are queued; answers the delivery ids.
async fn queued_batch(api: &Api, prefix: &str, n: usize) -> BTreeSet<String> {
    let nids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:02}")).collect();
    let batch: Vec<Value> = nids.iter().map(|nid| urgent(nid)).collect();
    append_ok(api, &json!({ "events": batch })).await;
    let want: BTreeSet<String> = nids.iter().map(|nid| dlv(nid)).collect();
    for id in &want {
        wait_status(api, id, "queued").await;
    }
    want
}

/// The `lease_expires_at` (µs) of each claimed row, by delivery id.
fn lease_expiries(rows: &[Value]) -> HashMap<String, i64> {
    let expiry = |r: &Value| us(&r["lease_expires_at"]);
    ids(rows).into_iter().zip(rows.iter().map(expiry)).collect()
}

/// A server with `config`.
async fn start_with(config: &str) -> Server {
    Server::start(ServerOpts::default().config(config)).await
}

/// [`queued`], then claim it as `owner` with `limit` and `lease_ms` (the only delivery due);
/// answers the delivery id and the claimed rows.
async fn claimed(
    api: &Api,
    nid: &str,
    owner: &str,
    limit: u32,
    lease_ms: u64,
) -> (String, Vec<Value>) {
    let id = queued(api, nid).await;
    let got = claim(api, owner, limit, lease_ms).await;
    assert_eq!(ids(&got), vec![id.clone()]);
    (id, got)
}

/// [`queued`], then claim it as `owner` (the only delivery due); answers the delivery id.
async fn queued_claimed(api: &Api, nid: &str, owner: &str) -> String {
    let id = queued(api, nid).await;
    let got = claim_some(api, owner).await;
    assert_eq!(ids(&got), vec![id.clone()]);
    id
}

/// The calls of a lease owner `owner` (complete, fail, extend), as `(verb, body)`.
fn owner_calls(owner: &str) -> [(&'static str, Value); 3] {
    [
        ("complete", json!({"owner": owner})),
        ("fail", json!({"owner": owner, "error_code": "x"})),
        ("extend", json!({"owner": owner})),
    ]
}

/// The problems (status and code) of refused delivery calls.
const ILLEGAL: (u16, &str) = (409, "illegal_transition");
const NOT_OWNER: (u16, &str) = (409, "not_lease_owner");
const NOT_FOUND: (u16, &str) = (404, "delivery_not_found");

/// Each `(verb, body)` of `calls` on delivery `id` is refused with `problem` (status, code).
async fn refused_all(
    api: &Api,
    id: &str,
    calls: &[(&str, Value)],
    problem: (u16, &str),
    what: &str,
) {
    let (status, code) = problem;
    for (verb, body) in calls {
        let r = act(api, id, verb, body).await;
        assert_problem_for(&r, status, code, &format!("{verb} {what}"));
    }
}

fn step_names(tl: &[Value]) -> Vec<String> {
    tl.iter()
        .map(|t| t["event"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// Timeline seqs strictly increase and times never go back.
#[track_caller]
fn assert_timeline_ordered(row: &Value) {
    let tl = timeline(row);
    for w in tl.windows(2) {
        assert!(
            w[1]["seq"].as_u64() > w[0]["seq"].as_u64(),
            "timeline seqs must increase: {row}"
        );
        assert!(
            us(&w[1]["at"]) >= us(&w[0]["at"]),
            "timeline times go back: {row}"
        );
    }
}

/// A bad `POST`: path, content type, body, the statuses allowed, the code when it is fixed.
type BadPost = (
    String,
    &'static str,
    String,
    &'static [u16],
    Option<&'static str>,
);

const JSON: &str = "application/json";
const TEXT: &str = "text/plain";

/// The bad `POST`s to `path` that its `spec` describes: the `malformed` body (400
/// malformed_json); a body sent as `text/plain` (415: `text`, else the `good` body); the `good`
/// body with the fields of `unknown` added (400); and the `good` body with each patch of
/// `invalid` applied, a `null` leaving the field out (400 or 422).
fn bad_posts(path: &str, spec: &Value) -> Vec<BadPost> {
    let good = &spec["good"];
    let patched = |patch: &Value| {
        let mut b = good.clone();
        for (k, v) in patch.as_object().expect("a patch is an object") {
            match v {
                Value::Null => drop(b.as_object_mut().and_then(|o| o.remove(k))),
                v => b[k] = v.clone(),
            }
        }
        b.to_string()
    };
    let text = spec["text"]
        .as_str()
        .map_or_else(|| good.to_string(), str::to_owned);
    let malformed = spec["malformed"].as_str().expect("malformed").to_owned();
    let mut out: Vec<BadPost> = vec![
        (
            path.to_owned(),
            JSON,
            malformed,
            &[400],
            Some("malformed_json"),
        ),
        (path.to_owned(), TEXT, text, &[415], None),
        (
            path.to_owned(),
            JSON,
            patched(&spec["unknown"]),
            &[400],
            None,
        ),
    ];
    for patch in spec["invalid"].as_array().expect("invalid") {
        out.push((path.to_owned(), JSON, patched(patch), &[400, 422], None));
    }
    out
}

/// `POST /v1/admin/projections/deliveries/verify`: a replay of the log gives the live model.
async fn assert_deliveries_verified(api: &Api) {
    let r = post_empty(api, "/v1/admin/projections/deliveries/verify").await;
    assert_eq!(r.status, StatusCode::OK, "verify deliveries: {}", r.text);
    assert_eq!(r.json["identical"], true, "verify deliveries: {}", r.text);
    assert_eq!(r.json["first_divergent_seq"], Value::Null, "{}", r.text);
}

/// A request with an explicit bearer token (or none).
async fn call(
    s: &Server,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Reply {
    let mut rb = s.client.request(method, s.url(path));
    if let Some(b) = body {
        rb = rb.json(b);
    }
    if let Some(t) = token {
        rb = rb.header("Authorization", format!("Bearer {t}"));
    }
    s.send(rb).await
}

/// A refused request: one of `statuses`, a problem document with a `code` (this one when
/// given), never 5xx.
#[track_caller]
fn assert_refused(r: &Reply, statuses: &[u16], code: Option<&str>, what: &str) {
    assert!(
        !r.status.is_server_error(),
        "[{what}] 5xx: {} {}",
        r.status,
        tail(&r.text, 1000)
    );
    assert!(
        statuses.contains(&r.status.as_u16()),
        "[{what}] expected one of {statuses:?}, got {}: {}",
        r.status,
        tail(&r.text, 1000)
    );
    let ct = r.content_type.as_deref().unwrap_or("");
    assert!(
        ct.starts_with("application/problem+json"),
        "[{what}] not a problem document ({ct:?}): {}",
        tail(&r.text, 1000)
    );
    let got = r
        .code()
        .unwrap_or_else(|| panic!("[{what}] problem without a `code`: {}", tail(&r.text, 1000)));
    assert!(!got.is_empty(), "[{what}] empty code");
    if let Some(c) = code {
        assert_eq!(got, c, "[{what}] code: {}", tail(&r.text, 1000));
    }
    assert_eq!(
        r.json["status"].as_u64(),
        Some(u64::from(r.status.as_u16())),
        "[{what}] `status` member: {}",
        tail(&r.text, 1000)
    );
}

/// The value of the Prometheus sample whose name and labels are exactly `series`.
fn gauge(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name.trim() == series).then(|| value.trim().parse().ok())?
    })
}

/// Microseconds since the epoch of an RFC 3339 UTC time with six fractional digits.
#[track_caller]
pub(crate) fn us(v: &Value) -> i64 {
    let t = v
        .as_str()
        .unwrap_or_else(|| panic!("expected an RFC 3339 time, got {v}"));
    let stamp = check_time(t);
    let n = |r: std::ops::Range<usize>| stamp[r].parse::<i64>().expect("digits");
    let date = (n(0..4), n(5..7), n(8..10));
    civil_micros(date, (n(11..13), n(14..16), n(17..19)), n(20..26))
}

/// The console's filters of section 7: a creation time range, stuck (judged at the read
/// against `outbox.stuck_after`), and a case-insensitive title search that still fills a page
/// with up to `limit` matches; each row says whether it is stuck. Bad values are 400 and change
/// nothing.
#[tokio::test]
async fn time_range_stuck_and_title_filters() {
    let s = Server::start(
        ServerOpts::default().config("[notifications.outbox]\nstuck_after = \"1s\"\n"),
    )
    .await;
    let titled =
        |id: &str, title: &str| notif_ev(id, json!({"priority": "urgent", "title": title}));
    append_ok(&s, &titled("f-1", "Disk full on db-1")).await;
    append_ok(&s, &titled("f-2", "Build broke")).await;
    let first = wait_status(&s, &dlv("f-2"), "queued").await;
    wait_status(&s, &dlv("f-1"), "queued").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    append_ok(&s, &titled("f-3", "disk SLOW on db-2")).await;
    let third = wait_status(&s, &dlv("f-3"), "queued").await;
    // The range is half-open: created_after includes its time, created_before excludes it.
    let cut = third["created_at"].as_str().expect("created_at").to_owned();
    assert!(first["stuck"] == false, "fresh rows are not stuck: {first}");

    let ids_of = |q: &str| {
        let s = s.clone();
        let q = q.to_owned();
        async move {
            let r = s.get(&format!("/v1/deliveries?{q}")).await;
            assert_eq!(r.status, StatusCode::OK, "{q}: {}", r.text);
            r.json["deliveries"]
                .as_array()
                .expect("deliveries")
                .iter()
                .map(|d| d["id"].as_str().expect("id").to_owned())
                .collect::<Vec<_>>()
        }
    };
    let enc = |t: &str| t.replace(':', "%3A").replace('+', "%2B");
    assert_eq!(
        ids_of(&format!("created_after={}", enc(&cut))).await,
        vec![dlv("f-3")]
    );
    assert_eq!(
        ids_of(&format!("created_before={}", enc(&cut))).await,
        vec![dlv("f-1"), dlv("f-2")]
    );
    assert_eq!(ids_of("q=DISK").await, vec![dlv("f-1"), dlv("f-3")]);
    assert_eq!(
        ids_of("q=disk&status=queued&sink=app").await,
        vec![dlv("f-1"), dlv("f-3")]
    );
    assert_eq!(ids_of("q=no+such+title").await, Vec::<String>::new());
    // Pages of one: each holds a match although non-matching rows lie between them.
    let p1 = s.get("/v1/deliveries?q=disk&limit=1").await;
    assert_eq!(
        p1.json["deliveries"][0]["id"],
        dlv("f-1").as_str(),
        "{}",
        p1.text
    );
    let next = p1.json["next_after"]
        .as_str()
        .expect("next_after")
        .to_owned();
    let p2 = s
        .get(&format!(
            "/v1/deliveries?q=disk&limit=1&after={}",
            encode_path(&next)
        ))
        .await;
    assert_eq!(
        p2.json["deliveries"][0]["id"],
        dlv("f-3").as_str(),
        "{}",
        p2.text
    );

    // Nothing is stuck until stuck_after has passed; then all three pending rows are.
    assert_eq!(
        ids_of("stuck=true").await.len(),
        0,
        "stuck before stuck_after"
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        ids_of("stuck=true").await,
        vec![dlv("f-1"), dlv("f-2"), dlv("f-3")]
    );
    let row = s
        .get(&format!("/v1/deliveries/{}", encode_path(&dlv("f-1"))))
        .await;
    assert_eq!(row.json["stuck"], true, "{}", row.text);
    let kpis = s.get("/v1/outbox/kpis").await;
    assert_eq!(
        kpis.json["stuck"], 3,
        "the stuck filter and the KPI agree: {}",
        kpis.text
    );
    // Claimed: under a live lease nothing is due, so nothing is stuck (section 5); sent is
    // terminal.
    let got = claim(&s, "o", 10, 60_000).await;
    assert_eq!(got.len(), 3);
    let r = act(&s, &dlv("f-2"), "complete", &json!({"owner": "o"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        ids_of("stuck=true").await,
        Vec::<String>::new(),
        "leased rows are not due"
    );
    assert_eq!(
        ids_of("stuck=false").await,
        vec![dlv("f-1"), dlv("f-2"), dlv("f-3")],
        "leased and sent rows are not stuck"
    );
    let row = s
        .get(&format!("/v1/deliveries/{}", encode_path(&dlv("f-2"))))
        .await;
    assert_eq!(row.json["stuck"], false, "{}", row.text);
    let kpis = s.get("/v1/outbox/kpis").await;
    assert_eq!(kpis.json["stuck"], 0, "{}", kpis.text);

    let head = s.head().await;
    for bad in [
        "stuck=yes",
        "stuck=",
        "created_after=yesterday",
        "created_before=2026-13-01T00:00:00Z",
        "q=",
        "q=%07bell",
    ] {
        let r = s.get(&format!("/v1/deliveries?{bad}")).await;
        assert_problem_for(&r, 400, "invalid_query", bad);
    }
    assert_eq!(s.head().await, head, "bad filters change nothing");
}

/// Claims take the most pressing priority first (section 5): urgent, action, warning, info,
/// the oldest due first within a priority. An info delivery due long before is claimed last;
/// a retry due later than a fresh urgent one waits for it.
#[tokio::test]
async fn claims_take_urgent_first_then_the_oldest_within_a_priority() {
    let s = Server::start(ServerOpts::default().config(
        "[notifications.routing]\nurgent = [\"desktop\"]\naction = [\"desktop\"]\n\
         warning = [\"desktop\"]\ninfo = [\"desktop\"]\n\
         [notifications.desktop]\npriorities = [\"urgent\", \"action\", \"warning\", \"info\"]\n",
    ))
    .await;
    let note = |id: &str, prio: &str| notif_ev(id, json!({"priority": prio, "title": id}));
    // Oldest first: info, warning, action, then two urgent ones (the later last).
    for (id, prio) in [
        ("pr-info", "info"),
        ("pr-warning", "warning"),
        ("pr-action", "action"),
        ("pr-urgent-1", "urgent"),
        ("pr-urgent-2", "urgent"),
    ] {
        append_ok(&s, &note(id, prio)).await;
        wait_status(&s, &format!("dlv:{id}:desktop"), "queued").await;
    }
    let mut order = Vec::new();
    for _ in 0..5 {
        let got = claim(&s, "prio", 1, 60_000).await;
        assert_eq!(got.len(), 1, "one due delivery per claim");
        order.push(got[0]["notification_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        order,
        [
            "pr-urgent-1",
            "pr-urgent-2",
            "pr-action",
            "pr-warning",
            "pr-info"
        ]
    );
    // A batch claim takes them in the same order.
    for id in ["pr-b-info", "pr-b-action"] {
        let prio = id.rsplit('-').next().unwrap();
        append_ok(&s, &note(id, prio)).await;
        wait_status(&s, &format!("dlv:{id}:desktop"), "queued").await;
    }
    let got = claim(&s, "prio", 10, 60_000).await;
    let ids: Vec<&str> = got
        .iter()
        .map(|d| d["notification_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["pr-b-action", "pr-b-info"]);
}

/// Operator actions record who did it as `by` (section 8): the token's name, `null` in open
/// mode (never the lease `owner`); a `by` in the body is not recorded. The retention run by
/// hand records its `by` too.
#[tokio::test]
async fn operator_actions_record_by_the_token_and_null_in_open_mode() {
    // Park one delivery with a permanent failure; answers its id.
    async fn parked(s: &Server, id: &str, token: Option<&str>) -> String {
        let r = call(s, Method::POST, "/v1/events", token, Some(&urgent(id))).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        let d = dlv(id);
        let body = json!({"sink": "app", "owner": "w", "limit": 10, "lease_ms": 60_000});
        wait_for(WAIT, "the claim", || async {
            let r = call(s, Method::POST, "/v1/deliveries/claim", token, Some(&body)).await;
            (r.json["deliveries"].as_array().map(Vec::len) == Some(1)).then_some(())
        })
        .await;
        let fail = json!({"owner": "w", "error_code": "gone", "retryable": false});
        let path = format!("/v1/deliveries/{}/fail", encode_path(&d));
        let r = call(s, Method::POST, &path, token, Some(&fail)).await;
        assert_eq!(r.json["status"], "parked", "{}", r.text);
        d
    }
    async fn last_payload(s: &Server, id: &str, token: Option<&str>) -> Value {
        let r = call(
            s,
            Method::GET,
            "/v1/events?stream=deliveries&limit=1000",
            token,
            None,
        )
        .await;
        r.json["events"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|e| e["subject"] == id)
            .map(|e| e["payload"].clone())
            .unwrap()
    }
    // Open mode.
    let s = Server::start(ServerOpts::default()).await;
    let d = parked(&s, "by-open", None).await;
    let path = format!("/v1/deliveries/{}/retry", encode_path(&d));
    let r = call(
        &s,
        Method::POST,
        &path,
        None,
        Some(&json!({"by": "mallory"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let p = last_payload(&s, &d, None).await;
    assert_eq!(p.get("by"), Some(&Value::Null), "{p}");
    assert!(p.get("owner").is_none(), "{p}");
    let step = r.json["timeline"]
        .as_array()
        .and_then(|t| t.last().cloned());
    assert!(step.is_none_or(|s| s.get("by").is_none()), "{}", r.text);
    // With a token: its name.
    let op = format!("tm-op-{}", random_token(24));
    let cfg = format!(
        "[retention]\nwindow = \"2s\"\nrun_every = \"1h\"\n\
         [[auth.tokens]]\nname = \"night-shift\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
        sha256_hex(&op)
    );
    let s = Server::start(ServerOpts::default().config(cfg)).await;
    let d = parked(&s, "by-token", Some(&op)).await;
    let path = format!("/v1/deliveries/{}/discard", encode_path(&d));
    let body = json!({"by": "mallory", "reason": "duplicate"});
    let r = call(&s, Method::POST, &path, Some(&op), Some(&body)).await;
    assert_eq!(r.json["status"], "discarded", "{}", r.text);
    let p = last_payload(&s, &d, Some(&op)).await;
    assert_eq!(p["by"], "night-shift", "{p}");
    assert!(p.get("owner").is_none(), "{p}");
    let path = format!("/v1/deliveries/{}", encode_path(&d));
    let row = call(&s, Method::GET, &path, Some(&op), None).await.json;
    let last = row["timeline"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (&last["event"], &last["by"]),
        (&json!("discarded"), &json!("night-shift")),
        "{row}"
    );
    // Past the window, the discarded delivery is purged by a run by hand.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let r = call(&s, Method::POST, "/v1/admin/retention/run", Some(&op), None).await;
    assert_eq!(r.json["purged"]["deliveries"], 1, "{}", r.text);
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let retention = "/v1/events?stream=retention";
    let r = call(&s, Method::GET, retention, Some(&op), None).await;
    let runs = r.json["events"].as_array().unwrap();
    assert!(
        !runs.is_empty() && runs.iter().all(|e| e["payload"]["by"] == "night-shift"),
        "{}",
        r.text
    );
}
