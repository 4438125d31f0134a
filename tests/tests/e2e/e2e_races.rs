//! Concurrent command races over HTTP, and the log they leave replayed through an independent
//! checker of the delivery state machine (spec section 5) and of cursor monotonicity (section
//! 6, I4) — written here from the spec, not with the projections' code, so a bug shared by the
//! commands and the fold is still caught. Races: compare-and-swap cursor advances, duplicate
//! bridge acks, completes racing lease expiry and other claimers, operator retries racing
//! claims. Every answer must be a success or a documented 409, never anything else.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, encode_path};

use crate::common::{append_ok, notif_ev, task_ev, wait_for};

/// One delivery as the checker sees it.
#[derive(Debug, Default, Clone)]
struct D {
    status: String,
    owner: Option<String>,
    lease_expires_at_us: i64,
    next_attempt_at_us: i64,
}

/// Replays `deliveries` and `cursors` events and records every step the spec forbids.
#[derive(Default)]
pub(crate) struct Checker {
    deliveries: HashMap<String, D>,
    cursors: HashMap<(String, String, String), (u64, String)>,
    violations: Vec<String>,
}

impl Checker {
    fn apply(&mut self, e: &Value) {
        let ty = e["type"].as_str().unwrap_or("");
        let subject = e["subject"].as_str().unwrap_or("").to_owned();
        let p = &e["payload"];
        let seq = e["seq"].as_u64().unwrap_or(0);
        let i64_of = |k: &str| p[k].as_i64();
        if let Some(kind) = ty.strip_prefix("delivery.") {
            let at = i64_of("at_us").unwrap_or(0);
            let mut bad = |why: String| {
                self.violations
                    .push(format!("seq {seq} {ty} {subject}: {why}"));
            };
            let Some(d) = self.deliveries.get(&subject).cloned() else {
                if kind == "created" {
                    self.deliveries.insert(
                        subject,
                        D {
                            status: "queued".into(),
                            next_attempt_at_us: i64_of("next_attempt_at_us").unwrap_or(at),
                            ..D::default()
                        },
                    );
                } else {
                    bad("before delivery.created".into());
                }
                return;
            };
            let owner = p["owner"].as_str().map(str::to_owned);
            let mut n = d.clone();
            match (d.status.as_str(), kind) {
                ("queued", "leased") => {}
                ("retry_wait", "leased") if at >= d.next_attempt_at_us => {}
                ("retry_wait", "leased") => bad("claimed before its next_attempt_at".into()),
                (_, "leased") => bad(format!("leased while {}", d.status)),
                ("leased", "sent" | "attempt_failed" | "lease_extended") => {
                    if owner != d.owner {
                        bad(format!("by {owner:?}, the lease is {:?}'s", d.owner));
                    }
                    if at > d.lease_expires_at_us {
                        bad("after the lease expired".into());
                    }
                }
                ("leased", "lease_expired") if at >= d.lease_expires_at_us => {}
                ("leased", "lease_expired") => bad("expired before its lease_expires_at".into()),
                ("parked", "retried" | "discarded") => {}
                ("queued" | "retry_wait", "skipped" | "cancelled") => {}
                (_, "joined" | "deferred") => {}
                (s, k) => bad(format!("{k} while {s}")),
            }
            match kind {
                "leased" => {
                    n.status = "leased".into();
                    n.owner = owner;
                    n.lease_expires_at_us = i64_of("lease_expires_at_us").unwrap_or(0);
                }
                "lease_extended" => {
                    n.lease_expires_at_us = i64_of("lease_expires_at_us").unwrap_or(0);
                }
                "sent" | "skipped" | "cancelled" | "discarded" => n.status = kind.into(),
                "attempt_failed" | "lease_expired" => {
                    n.owner = None;
                    n.status = if p["parked"] == true {
                        "parked"
                    } else if kind == "attempt_failed" {
                        "retry_wait"
                    } else {
                        "queued"
                    }
                    .into();
                    n.next_attempt_at_us = i64_of("next_attempt_at_us").unwrap_or(at);
                }
                "retried" => n.status = "queued".into(),
                _ => {}
            }
            self.deliveries.insert(subject, n);
        } else if ty == "cursor.advanced" || ty == "cursor.reset" {
            let key = (
                subject,
                p["stream_name"].as_str().unwrap_or("").to_owned(),
                p["subject_id"].as_str().unwrap_or("").to_owned(),
            );
            let (last, last_id) = self.cursors.get(&key).cloned().unwrap_or_default();
            if ty == "cursor.reset" {
                let to = p["to"].as_u64().unwrap_or(0);
                if p["reason"].as_str().is_none_or(str::is_empty) {
                    self.violations
                        .push(format!("seq {seq}: reset without a reason"));
                }
                self.cursors.insert(key, (to, String::new()));
                return;
            }
            let to = p["last_sequence"].as_u64().unwrap_or(0);
            let id = p["delivery_id"].as_str().unwrap_or("").to_owned();
            if to < last || (to == last && id != last_id) {
                self.violations.push(format!(
                    "seq {seq}: cursor {key:?} from {last} ({last_id}) to {to} ({id})"
                ));
            }
            self.cursors.insert(key, (to, id));
        }
    }

    pub(crate) fn check_log(events: &[Value]) -> Vec<String> {
        let mut c = Checker::default();
        for e in events {
            c.apply(e);
        }
        c.violations
    }
}

#[test]
fn the_checker_finds_illegal_logs() {
    let ev = |seq: u64, ty: &str, subject: &str, p: Value| json!({"seq": seq, "type": ty, "subject": subject, "payload": p});
    let created = ev(
        1,
        "delivery.created",
        "d",
        json!({"at_us": 0, "next_attempt_at_us": 0}),
    );
    let leased = |seq, owner: &str, at: i64| {
        ev(
            seq,
            "delivery.leased",
            "d",
            json!({"at_us": at, "owner": owner, "lease_expires_at_us": at + 100}),
        )
    };
    let advanced = |seq: u64, to: u64, id: &str| {
        ev(
            seq,
            "cursor.advanced",
            "c",
            json!({"stream_name": "s", "subject_id": "", "last_sequence": to, "delivery_id": id}),
        )
    };
    // Legal: lease, expire, lease by another, complete.
    let ok = [
        created.clone(),
        leased(2, "a", 0),
        ev(3, "delivery.lease_expired", "d", json!({"at_us": 100})),
        leased(4, "b", 150),
        ev(5, "delivery.sent", "d", json!({"at_us": 200, "owner": "b"})),
    ];
    assert_eq!(Checker::check_log(&ok), Vec::<String>::new());
    for (what, log) in [
        (
            "two leases at once",
            vec![created.clone(), leased(2, "a", 0), leased(3, "b", 10)],
        ),
        (
            "sent by another owner",
            vec![
                created.clone(),
                leased(2, "a", 0),
                ev(3, "delivery.sent", "d", json!({"at_us": 5, "owner": "b"})),
            ],
        ),
        (
            "sent after expiry",
            vec![
                created.clone(),
                leased(2, "a", 0),
                ev(3, "delivery.sent", "d", json!({"at_us": 500, "owner": "a"})),
            ],
        ),
        (
            "expired early",
            vec![
                created.clone(),
                leased(2, "a", 0),
                ev(3, "delivery.lease_expired", "d", json!({"at_us": 50})),
            ],
        ),
        (
            "sent twice",
            vec![
                created.clone(),
                leased(2, "a", 0),
                ev(3, "delivery.sent", "d", json!({"at_us": 5, "owner": "a"})),
                ev(4, "delivery.sent", "d", json!({"at_us": 6, "owner": "a"})),
            ],
        ),
        (
            "cursor down",
            vec![advanced(1, 5, "x"), advanced(2, 4, "y")],
        ),
        (
            "cursor same seq, other delivery",
            vec![advanced(1, 5, "x"), advanced(2, 5, "y")],
        ),
    ] {
        assert!(
            !Checker::check_log(&log).is_empty(),
            "the checker missed: {what}"
        );
    }
}

async fn post(api: &Api, path: &str, body: Value) -> (StatusCode, Value) {
    let r = api
        .send(api.request(reqwest::Method::POST, path).json(&body))
        .await;
    (r.status, r.json)
}

/// A success, or a 409 with one of `codes`; anything else fails the test.
#[track_caller]
fn ok_or_409(what: &str, (status, body): &(StatusCode, Value), codes: &[&str]) -> bool {
    if status.is_success() {
        return true;
    }
    assert!(
        *status == StatusCode::CONFLICT && codes.contains(&body["code"].as_str().unwrap_or("")),
        "{what}: {status} {body}"
    );
    false
}

#[tokio::test]
async fn concurrent_commands_leave_a_legal_log() {
    let s = Server::start(ServerOpts::default()).await;
    let api: Arc<Api> = Arc::new((*s).clone());

    // 1. Compare-and-swap cursor advances: 12 racers, each reading and advancing by one.
    let racers = (0..12).map(|t| {
        let api = api.clone();
        async move {
            let mut won = 0u64;
            for _ in 0..15 {
                let cur = api
                    .get("/v1/cursors?consumer_id=race&stream_name=s&subject_id=")
                    .await
                    .json["cursors"][0]["last_sequence"]
                    .as_u64()
                    .expect("cursor");
                let r = post(
                    &api,
                    "/v1/cursors/advance",
                    json!({
                    "consumer_id": "race", "stream_name": "s", "subject_id": "",
                    "last_sequence": cur + 1, "delivery_id": format!("d-{}-{t}", cur + 1),
                    "expected_sequence": cur}),
                )
                .await;
                if ok_or_409("advance", &r, &["cursor_conflict", "non_monotonic_cursor"]) {
                    won += 1;
                }
            }
            won
        }
    });
    let won: u64 = join_all(racers).await.into_iter().sum();
    let last = api
        .get("/v1/cursors?consumer_id=race&stream_name=s&subject_id=")
        .await
        .json["cursors"][0]["last_sequence"]
        .as_u64()
        .unwrap();
    assert_eq!(
        last, won,
        "every successful compare-and-swap moved the cursor by one"
    );

    // 2. Duplicate acks of one bridge envelope: one cursor advance.
    append_ok(
        &api,
        &json!({"events": [
            task_ev("race-task", "task.created", json!({"project_id": "p"})),
            task_ev("race-task", "task.run_started", json!({"run_id": "r1"})),
        ]}),
    )
    .await;
    post(
        &api,
        "/v1/tasks/race-task/notifications/bridges",
        json!({
        "subscription_id": "race-sub", "bridge_id": "race-bridge", "sink": {"kind": "pull"}}),
    )
    .await;
    append_ok(
        &api,
        &task_ev("race-task", "task.run_completed", json!({"run_id": "r1"})),
    )
    .await;
    let envelope = wait_for(Duration::from_secs(30), "the envelope", || async {
        api.get("/v1/bridges/race-bridge/deliveries").await.json["deliveries"][0]
            .get("delivery_id")
            .cloned()
    })
    .await;
    let id = envelope.as_str().unwrap().to_owned();
    let acks = (0..8).map(|_| {
        let (api, id) = (api.clone(), id.clone());
        async move {
            let r = post(
                &api,
                &format!(
                    "/v1/bridges/race-bridge/deliveries/{}/ack",
                    encode_path(&id)
                ),
                json!({}),
            )
            .await;
            ok_or_409(
                "ack",
                &r,
                &["not_pending", "cursor_conflict", "non_monotonic_cursor"],
            );
        }
    });
    join_all(acks).await;

    // 3. Completes racing lease expiry and another claimer.
    let batch: Vec<Value> = (0..40)
        .map(|i| {
            notif_ev(
                &format!("race-n-{i}"),
                json!({"priority": "urgent", "title": "t", "recipient": "r"}),
            )
        })
        .collect();
    append_ok(&api, &json!({"events": batch})).await;
    wait_for(
        Duration::from_secs(30),
        "40 claimable deliveries",
        || async {
            let n = api.get("/v1/deliveries?status=queued&limit=100").await.json["deliveries"]
                .as_array()
                .map_or(0, Vec::len);
            (n >= 40).then_some(())
        },
    )
    .await;
    let (_, a) = post(
        &api,
        "/v1/deliveries/claim",
        json!({"sink": "app", "owner": "A", "limit": 40, "lease_ms": 100}),
    )
    .await;
    let ids: Vec<String> = a["deliveries"]
        .as_array()
        .expect("A's claim")
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 40);
    let completer = {
        let (api, ids) = (api.clone(), ids.clone());
        async move {
            for (i, id) in ids.iter().enumerate() {
                // Half right away, half once the 100 ms lease has surely ended (a lower bound only).
                if i == 20 {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                let r = post(
                    &api,
                    &format!("/v1/deliveries/{}/complete", encode_path(id)),
                    json!({"owner": "A"}),
                )
                .await;
                ok_or_409(
                    "complete by A",
                    &r,
                    &["lease_expired", "not_lease_owner", "illegal_transition"],
                );
            }
        }
    };
    let claimer = {
        let api = api.clone();
        async move {
            let mut got = Vec::new();
            for _ in 0..30 {
                let (st, b) = post(
                    &api,
                    "/v1/deliveries/claim",
                    json!({"sink": "app", "owner": "B", "limit": 40, "lease_ms": 60000}),
                )
                .await;
                assert!(st.is_success(), "claim by B: {st} {b}");
                got.extend(
                    b["deliveries"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|d| d["id"].as_str().unwrap().to_owned()),
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            got
        }
    };
    let ((), b_ids) = tokio::join!(completer, claimer);
    for id in &b_ids {
        let r = post(
            &api,
            &format!("/v1/deliveries/{}/fail", encode_path(id)),
            json!({"owner": "B", "error_code": "gone", "retryable": false}),
        )
        .await;
        ok_or_409(
            "fail by B",
            &r,
            &["lease_expired", "not_lease_owner", "illegal_transition"],
        );
    }

    // 4. Operator retries racing claims of the parked deliveries.
    let retries = b_ids.iter().map(|id| {
        let (api, id) = (api.clone(), id.clone());
        async move {
            let r = post(
                &api,
                &format!("/v1/deliveries/{}/retry", encode_path(&id)),
                json!({"reason": "race"}),
            )
            .await;
            ok_or_409("retry", &r, &["illegal_transition"]);
        }
    });
    let claims = (0..5).map(|k| {
        let api = api.clone();
        async move {
            let (st, b) = post(
                &api,
                "/v1/deliveries/claim",
                json!({"sink": "app", "owner": format!("C{k}"), "limit": 10, "lease_ms": 60000}),
            )
            .await;
            assert!(st.is_success(), "claim by C{k}: {st} {b}");
        }
    });
    tokio::join!(join_all(retries), join_all(claims));

    // The log the races left obeys the state machine and the cursor rules.
    crate::common::wait_quiet(&api).await;
    let log = api.read_all("").await;
    let violations = Checker::check_log(&log);
    assert!(
        violations.is_empty(),
        "illegal steps in the log:\n{}",
        violations.join("\n")
    );
    let advances = log
        .iter()
        .filter(|e| e["type"] == "cursor.advanced" && e["payload"]["delivery_id"] == id.as_str())
        .count();
    assert_eq!(
        advances, 1,
        "8 duplicate acks of {id} advanced the cursor once"
    );
    let sent_twice = log.iter().filter(|e| e["type"] == "delivery.sent").fold(
        HashMap::<&str, u32>::new(),
        |mut m, e| {
            *m.entry(e["subject"].as_str().unwrap()).or_default() += 1;
            m
        },
    );
    assert!(
        sent_twice.values().all(|n| *n == 1),
        "a delivery sent twice: {sent_twice:?}"
    );
    assert!(
        log.iter().any(|e| e["type"] == "delivery.lease_expired"),
        "no lease expired during the race: the race with expiry was not exercised"
    );
}
