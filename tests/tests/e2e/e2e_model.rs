//! A model-based fuzzer of the HTTP contract (issue 17, item 1): proptest draws sequences of
//! operations — appends (new, duplicate, conflicting, malformed), notifications that become
//! deliveries, claims, completes, fails, retries, discards, cursor advances and resets, bridge
//! subscriptions (create, same again, other content, delete), task runs whose terminal
//! notifications bridges pull and acknowledge (the pending one, or one past it) — runs each
//! against a fresh
//! server (the built binary, its own data directory) and against a small in-memory model of
//! the spec, and compares every answer (status, code, seq, duplicate flag, delivery status,
//! cursor position) and, at the end, the read models (every event at its seq, every delivery's
//! status, every cursor, the outbox counts). Proptest shrinks a failing sequence.
//!
//! `.ci/run` runs the default number of cases; more on demand:
//! `TIDEMARK_MODEL_CASES=500 cargo test -p tidemark-tests --test e2e -- model_`.
//!
//! Time never decides an answer here: leases are long (10 min), failures are permanent (a
//! retryable failure would wait for a backoff), and a notification's delivery (made by the
//! scheduler a moment after the append) is waited for before the next operation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Reply, Server, ServerOpts, encode_path};

use crate::common::{receipts, wait_for};

const OWNERS: [&str; 2] = ["w1", "w2"];
const CONSUMERS: [&str; 2] = ["model-a", "model-b"];

#[derive(Debug, Clone)]
enum Op {
    /// `n` new events.
    Append(usize),
    /// The k-th event sent so far, again.
    Resend(usize),
    /// The k-th event's id with other content.
    Conflict(usize),
    /// A malformed request (which kind).
    Malformed(usize),
    /// An urgent notification: a delivery on sink `app`.
    Notify,
    Claim {
        owner: usize,
        limit: u32,
    },
    Complete {
        d: usize,
        owner: usize,
    },
    Fail {
        d: usize,
        owner: usize,
    },
    Retry(usize),
    Discard(usize),
    /// Advance consumer c to the k-th acknowledged seq, with delivery id `did`.
    Advance {
        c: usize,
        k: usize,
        did: usize,
    },
    Reset {
        c: usize,
        k: usize,
    },
    Subscribe {
        sub: usize,
        bridge: usize,
    },
    Unsubscribe(usize),
    /// A run of the model task starts and completes: a terminal event every active
    /// subscription is offered, one at a time, in seq order.
    EndRun,
    /// A bridge fetches its pending envelopes.
    Pull(usize),
    /// A bridge acknowledges subscription `sub`'s pending envelope (`later`: one past it).
    Ack {
        sub: usize,
        later: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1..4usize).prop_map(Op::Append),
        2 => any::<usize>().prop_map(Op::Resend),
        1 => any::<usize>().prop_map(Op::Conflict),
        1 => (0..5usize).prop_map(Op::Malformed),
        3 => Just(Op::Notify),
        3 => (0..2usize, 1..4u32).prop_map(|(owner, limit)| Op::Claim { owner, limit }),
        3 => (any::<usize>(), 0..2usize).prop_map(|(d, owner)| Op::Complete { d, owner }),
        2 => (any::<usize>(), 0..2usize).prop_map(|(d, owner)| Op::Fail { d, owner }),
        2 => any::<usize>().prop_map(Op::Retry),
        1 => any::<usize>().prop_map(Op::Discard),
        3 => (0..2usize, any::<usize>(), 0..2usize)
            .prop_map(|(c, k, did)| Op::Advance { c, k, did }),
        1 => (0..2usize, any::<usize>()).prop_map(|(c, k)| Op::Reset { c, k }),
        3 => (0..3usize, 0..2usize).prop_map(|(sub, bridge)| Op::Subscribe { sub, bridge }),
        1 => (0..3usize).prop_map(Op::Unsubscribe),
        3 => Just(Op::EndRun),
        2 => (0..2usize).prop_map(Op::Pull),
        4 => (0..3usize, any::<bool>()).prop_map(|(sub, later)| Op::Ack { sub, later }),
    ]
}

#[derive(Debug, Clone, PartialEq)]
struct Dlv {
    status: &'static str,
    owner: Option<String>,
}

#[derive(Debug, Default)]
struct Model {
    /// Events sent and acknowledged, in order: (id, body, seq).
    events: Vec<(String, Value, u64)>,
    deliveries: BTreeMap<String, Dlv>,
    /// Creation order of the deliveries (claims take the oldest first).
    created: Vec<String>,
    /// (consumer) → (last_sequence, last_delivery_id).
    cursors: BTreeMap<String, (u64, Option<String>)>,
    /// subscription → (bridge, active).
    subs: BTreeMap<String, (String, bool)>,
    /// subscription → its cursor's last_sequence (kept across delete and re-create).
    sub_cursor: BTreeMap<String, u64>,
    /// Seqs of the model task's terminal events (run completions), in order.
    terminal: Vec<u64>,
    notes: usize,
    runs: usize,
}

fn nth<T: Clone>(v: &[T], k: usize) -> Option<T> {
    (!v.is_empty()).then(|| v[k % v.len()].clone())
}

async fn post(api: &Api, path: &str, body: &Value) -> Reply {
    api.send(api.request(Method::POST, path).json(body)).await
}

#[track_caller]
fn expect(r: &Reply, status: u16, code: Option<&str>, what: &str) {
    assert_eq!(r.status.as_u16(), status, "{what}: {}", r.text);
    if let Some(c) = code {
        assert_eq!(r.code(), Some(c), "{what}: {}", r.text);
    }
}

impl Model {
    fn delivery_at(&self, k: usize) -> Option<String> {
        nth(&self.created, k)
    }

    /// The envelope a subscription is offered: its first terminal event past its cursor.
    fn pending(&self, sub: &str) -> Option<u64> {
        let at = self.sub_cursor.get(sub).copied().unwrap_or(0);
        self.terminal.iter().copied().find(|s| *s > at)
    }

    fn due(&self) -> Vec<String> {
        self.created
            .iter()
            .filter(|id| self.deliveries[*id].status == "queued")
            .cloned()
            .collect()
    }
}

async fn step(s: &Server, m: &mut Model, op: &Op, case: u64) {
    let what = format!("{op:?}");
    match op {
        Op::Append(n) => {
            let batch: Vec<Value> = (0..*n)
                .map(|i| {
                    let id = format!("m{case}-{}-{i}", m.events.len());
                    json!({"event_id": id, "stream": "model", "subject": "s",
                           "type": "model.tick", "payload": {"i": i}})
                })
                .collect();
            let (st, body) = s.append(&json!({ "events": batch })).await;
            assert_eq!(st, StatusCode::CREATED, "{what}: {body}");
            let last = m.events.last().map_or(0, |e| e.2);
            let got = receipts(&body);
            for (i, (e, (id, seq, dup))) in batch.iter().zip(got).enumerate() {
                assert_eq!(id, e["event_id"].as_str().unwrap(), "{what}");
                assert!(!dup, "{what}: a new event answered as a duplicate");
                assert!(seq > last, "{what}: seq {seq} not after {last}");
                if i > 0 {
                    assert_eq!(
                        seq,
                        m.events.last().unwrap().2 + 1,
                        "{what}: a batch is dense"
                    );
                }
                m.events.push((id, e.clone(), seq));
            }
        }
        Op::Resend(k) => {
            let Some((id, body, seq)) = nth(&m.events, *k) else {
                return;
            };
            let (st, r) = s.append(&body).await;
            assert_eq!(st, StatusCode::CREATED, "{what}: {r}");
            assert_eq!(receipts(&r), vec![(id, seq, true)], "{what}");
        }
        Op::Conflict(k) => {
            let Some((_, mut body, _)) = nth(&m.events, *k) else {
                return;
            };
            // Other content that is still valid (a notification keeps its required fields).
            if body["type"] == "notification.requested" {
                body["payload"]["title"] = json!("other content");
            } else if body["stream"] == "task_events" {
                body["payload"]["run_id"] = json!("other-run");
            } else {
                body["payload"] = json!({"other": true});
            }
            let r = s
                .send(s.request(Method::POST, "/v1/events").json(&body))
                .await;
            expect(&r, 409, Some("event_id_conflict"), &what);
        }
        Op::Malformed(kind) => {
            let rb = s.request(Method::POST, "/v1/events");
            let r = match kind {
                0 => {
                    s.send(rb.header("content-type", "application/json").body("{"))
                        .await
                }
                1 => s.send(rb.json(&json!({"stream": "", "type": "t"}))).await,
                2 => {
                    s.send(rb.json(&json!({"stream": "s", "type": "Bad Type"})))
                        .await
                }
                3 => s.send(rb.json(&json!({"events": []}))).await,
                _ => {
                    s.send(rb.json(&json!({"stream": "s", "type": "t", "extra": 1})))
                        .await
                }
            };
            assert!(
                matches!(r.status.as_u16(), 400 | 422),
                "{what}: a malformed append must be 400 or 422: {}",
                r.text
            );
        }
        Op::Notify => {
            m.notes += 1;
            let id = format!("mn{case}-{}", m.notes);
            let ev = json!({"event_id": id, "stream": "notifications", "subject": id,
                            "type": "notification.requested",
                            "payload": {"priority": "urgent", "title": format!("n {id}")}});
            let (st, body) = s.append(&ev).await;
            assert_eq!(st, StatusCode::CREATED, "{what}: {body}");
            let seq = receipts(&body)[0].1;
            m.events.push((id.clone(), ev, seq));
            let d = format!("dlv:{id}:desktop");
            // The scheduler makes the delivery a moment later: wait for it (bounded).
            wait_for(
                Duration::from_secs(30),
                &format!("delivery {d}"),
                || async {
                    let r = s.get(&format!("/v1/deliveries/{}", encode_path(&d))).await;
                    (r.status == StatusCode::OK).then_some(())
                },
            )
            .await;
            m.deliveries.insert(
                d.clone(),
                Dlv {
                    status: "queued",
                    owner: None,
                },
            );
            m.created.push(d);
        }
        Op::Claim { owner, limit } => {
            let owner = OWNERS[*owner];
            let r = post(
                s,
                "/v1/deliveries/claim",
                &json!({"sink": "app", "owner": owner, "limit": limit, "lease_ms": 600_000}),
            )
            .await;
            expect(&r, 200, None, &what);
            let due = m.due();
            let got: Vec<String> = r.json["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["id"].as_str().unwrap().to_owned())
                .collect();
            let want: Vec<String> = due.into_iter().take(*limit as usize).collect();
            assert_eq!(
                got.iter().collect::<BTreeSet<_>>(),
                want.iter().collect::<BTreeSet<_>>(),
                "{what}: a claim takes the oldest due deliveries"
            );
            for id in got {
                m.deliveries.insert(
                    id,
                    Dlv {
                        status: "leased",
                        owner: Some(owner.into()),
                    },
                );
            }
        }
        Op::Complete { d, owner } | Op::Fail { d, owner } => {
            let Some(id) = m.delivery_at(*d) else { return };
            let owner = OWNERS[*owner];
            let complete = matches!(op, Op::Complete { .. });
            let path = format!(
                "/v1/deliveries/{}/{}",
                encode_path(&id),
                if complete { "complete" } else { "fail" }
            );
            let body = if complete {
                json!({"owner": owner})
            } else {
                json!({"owner": owner, "error_code": "model", "retryable": false})
            };
            let r = post(s, &path, &body).await;
            let cur = m.deliveries[&id].clone();
            let mine = cur.owner.as_deref() == Some(owner);
            match (cur.status, mine) {
                ("leased", true) => {
                    expect(&r, 200, None, &what);
                    let next = if complete { "sent" } else { "parked" };
                    assert_eq!(r.json["status"], next, "{what}: {}", r.text);
                    m.deliveries.get_mut(&id).unwrap().status = next;
                }
                // Repeating the complete that made it sent is idempotent.
                ("sent", true) if complete => {
                    expect(&r, 200, None, &what);
                    assert_eq!(r.json["status"], "sent", "{what}");
                }
                _ => {
                    assert_eq!(
                        r.status,
                        StatusCode::CONFLICT,
                        "{what} on {cur:?}: {}",
                        r.text
                    );
                    assert!(
                        matches!(r.code(), Some("not_lease_owner" | "illegal_transition")),
                        "{what}: {}",
                        r.text
                    );
                }
            }
        }
        Op::Retry(d) | Op::Discard(d) => {
            let Some(id) = m.delivery_at(*d) else { return };
            let retry = matches!(op, Op::Retry(_));
            let path = format!(
                "/v1/deliveries/{}/{}",
                encode_path(&id),
                if retry { "retry" } else { "discard" }
            );
            let r = post(s, &path, &json!({})).await;
            let cur = m.deliveries[&id].clone();
            if cur.status == "parked" {
                expect(&r, 200, None, &what);
                let next = if retry { "queued" } else { "discarded" };
                assert_eq!(r.json["status"], next, "{what}: {}", r.text);
                let row = m.deliveries.get_mut(&id).unwrap();
                row.status = next;
                row.owner = None;
                if retry {
                    // A retried delivery is due again, after the ones already waiting.
                    m.created.retain(|x| x != &id);
                    m.created.push(id);
                }
            } else {
                expect(
                    &r,
                    409,
                    Some("illegal_transition"),
                    &format!("{what} on {cur:?}"),
                );
            }
        }
        Op::Advance { c, k, did } => {
            let Some((_, _, seq)) = nth(&m.events, *k) else {
                return;
            };
            let consumer = CONSUMERS[*c];
            let did = format!("d{did}");
            let r = post(
                s,
                "/v1/cursors/advance",
                &json!({"consumer_id": consumer, "stream_name": "model", "subject_id": "",
                        "last_sequence": seq, "delivery_id": did}),
            )
            .await;
            let (last, last_did) = m.cursors.get(consumer).cloned().unwrap_or((0, None));
            if seq > last {
                expect(&r, 200, None, &what);
                m.cursors.insert(consumer.into(), (seq, Some(did)));
            } else if seq == last && last_did.as_deref() == Some(did.as_str()) {
                expect(&r, 200, None, &format!("{what}: an idempotent replay"));
            } else {
                expect(&r, 409, Some("non_monotonic_cursor"), &what);
            }
            let (at, _) = m.cursors.get(consumer).cloned().unwrap_or((0, None));
            assert_eq!(r.json["last_sequence"].as_u64().unwrap_or(at), at, "{what}");
        }
        Op::Reset { c, k } => {
            let seq = nth(&m.events, *k).map_or(0, |e| e.2);
            let consumer = CONSUMERS[*c];
            let r = post(
                s,
                "/v1/cursors/reset",
                &json!({"consumer_id": consumer, "stream_name": "model", "subject_id": "",
                        "last_sequence": seq, "reason": "model"}),
            )
            .await;
            expect(&r, 200, None, &what);
            assert_eq!(r.json["last_sequence"], seq, "{what}");
            // A reset forgets the old position's delivery id (section 6, issue 26): a later
            // replay of the advance before it is no longer the same delivery.
            assert_eq!(r.json["last_delivery_id"], Value::Null, "{what}");
            m.cursors.insert(consumer.into(), (seq, None));
        }
        Op::Subscribe { sub, bridge } => {
            let sub_id = format!("ms{sub}");
            let bridge_id = format!("mb{bridge}");
            let r = post(
                s,
                "/v1/tasks/model-task/notifications/bridges",
                &json!({"subscription_id": sub_id, "bridge_id": bridge_id,
                        "sink": {"kind": "pull"}}),
            )
            .await;
            match m.subs.get(&sub_id) {
                Some((b, true)) if *b == bridge_id => expect(&r, 200, None, &what),
                Some((_, true)) => assert_eq!(r.status, StatusCode::CONFLICT, "{what}: {}", r.text),
                _ => {
                    expect(&r, 201, None, &what);
                    m.subs.insert(sub_id, (bridge_id, true));
                }
            }
        }
        Op::EndRun | Op::Pull(_) | Op::Ack { .. } => bridge_steps(s, m, op, case).await,
        Op::Unsubscribe(sub) => {
            let sub_id = format!("ms{sub}");
            let r = s
                .send(s.request(
                    Method::DELETE,
                    &format!("/v1/tasks/model-task/notifications/bridges/{sub_id}"),
                ))
                .await;
            match m.subs.get_mut(&sub_id) {
                Some((_, active @ true)) => {
                    assert!(r.status.is_success(), "{what}: {}", r.text);
                    *active = false;
                }
                _ => assert_eq!(r.status, StatusCode::NOT_FOUND, "{what}: {}", r.text),
            }
        }
    }
}

async fn bridge_steps(s: &Server, m: &mut Model, op: &Op, case: u64) {
    let what = format!("{op:?}");
    match op {
        Op::EndRun => {
            m.runs += 1;
            let run = format!("r{case}-{}", m.runs);
            let batch: Vec<Value> = ["task.run_started", "task.run_completed"]
                .iter()
                .map(|ty| {
                    json!({"event_id": format!("{run}-{ty}"), "stream": "task_events",
                           "subject": "model-task", "type": ty, "payload": {"run_id": run}})
                })
                .collect();
            let (st, body) = s.append(&json!({ "events": batch })).await;
            assert_eq!(st, StatusCode::CREATED, "{what}: {body}");
            for (e, (id, seq, _)) in batch.iter().zip(receipts(&body)) {
                m.events.push((id, e.clone(), seq));
            }
            m.terminal.push(m.events.last().unwrap().2);
        }
        Op::Pull(b) => {
            let bridge = format!("mb{b}");
            let r = s.get(&format!("/v1/bridges/{bridge}/deliveries")).await;
            expect(&r, 200, None, &what);
            let got: BTreeSet<String> = r.json["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["delivery_id"].as_str().unwrap().to_owned())
                .collect();
            let want: BTreeSet<String> = m
                .subs
                .iter()
                .filter(|(_, (br, active))| *active && *br == bridge)
                .filter_map(|(sub, _)| m.pending(sub).map(|seq| format!("notif:{sub}:{seq}")))
                .collect();
            assert_eq!(
                got, want,
                "{what}: each active subscription's pending envelope"
            );
        }
        Op::Ack { sub, later } => {
            let sub = format!("ms{sub}");
            let Some((bridge, true)) = m.subs.get(&sub).cloned() else {
                return;
            };
            let Some(pending) = m.pending(&sub) else {
                return;
            };
            let seq = if *later {
                let Some(next) = m.terminal.iter().copied().find(|x| *x > pending) else {
                    return;
                };
                next
            } else {
                pending
            };
            let path = format!("/v1/bridges/{bridge}/deliveries/notif:{sub}:{seq}/ack");
            let r = post(s, &path, &json!({})).await;
            if *later {
                expect(&r, 409, Some("not_pending"), &what);
            } else {
                expect(&r, 200, None, &what);
                assert_eq!(r.json["cursor"]["last_sequence"], seq, "{what}: {}", r.text);
                m.sub_cursor.insert(sub, seq);
            }
        }
        _ => unreachable!(),
    }
}

/// The read models against the model, at the end of a sequence.
async fn compare(s: &Server, m: &Model) {
    let all = s.read_all("").await;
    let by_seq: BTreeMap<u64, &Value> = all
        .iter()
        .map(|e| (e["seq"].as_u64().unwrap(), e))
        .collect();
    for (id, body, seq) in &m.events {
        let e = by_seq
            .get(seq)
            .unwrap_or_else(|| panic!("event {id} missing at {seq}"));
        assert_eq!(e["event_id"], id.as_str(), "the event at seq {seq}");
        assert_eq!(e["type"], body["type"], "{id}");
        assert_eq!(e["payload"], body["payload"], "{id}");
    }
    let ids: BTreeSet<&str> = all
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), all.len(), "an event id appears twice in the log");
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for (id, d) in &m.deliveries {
        let r = s.get(&format!("/v1/deliveries/{}", encode_path(id))).await;
        assert_eq!(r.json["status"], d.status, "delivery {id}: {}", r.text);
        *counts.entry(d.status).or_default() += 1;
    }
    let k = s.get("/v1/outbox/kpis").await;
    for status in ["queued", "leased", "parked"] {
        assert_eq!(
            k.json[status].as_u64().unwrap_or(0),
            counts.get(status).copied().unwrap_or(0),
            "KPI {status}: {}",
            k.text
        );
    }
    for c in CONSUMERS {
        let r = s
            .get(&format!(
                "/v1/cursors?consumer_id={c}&stream_name=model&subject_id="
            ))
            .await;
        let (want, want_did) = m.cursors.get(c).cloned().unwrap_or((0, None));
        assert_eq!(
            r.json["cursors"][0]["last_sequence"], want,
            "cursor {c}: {}",
            r.text
        );
        assert_eq!(
            r.json["cursors"][0]["last_delivery_id"].as_str(),
            want_did.as_deref(),
            "cursor {c}: {}",
            r.text
        );
    }
    let r = s.get("/v1/tasks/model-task/notifications/bridges").await;
    let active: BTreeSet<String> = r.json["subscriptions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["active"] == true)
        .map(|x| x["subscription_id"].as_str().unwrap().to_owned())
        .collect();
    let want: BTreeSet<String> = m
        .subs
        .iter()
        .filter(|(_, (_, a))| *a)
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(active, want, "active subscriptions");
    for (sub, seq) in &m.sub_cursor {
        let r = s
            .get(&format!(
                "/v1/cursors?consumer_id=bridge_task_subscription:{sub}&stream_name=task_events&subject_id=model-task"
            ))
            .await;
        assert_eq!(
            r.json["cursors"][0]["last_sequence"], *seq,
            "cursor of {sub}: {}",
            r.text
        );
    }
}

/// A fresh server with the model task the subscriptions and runs belong to.
async fn model_server() -> Server {
    let s = Server::start(ServerOpts::default()).await;
    let r = s
        .append(&json!({"event_id": "model-task", "stream": "task_events",
                        "subject": "model-task", "type": "task.created",
                        "payload": {"project_id": "model"}}))
        .await;
    assert_eq!(r.0, StatusCode::CREATED, "{}", r.1);
    s
}

fn cases() -> u32 {
    std::env::var("TIDEMARK_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn model_every_answer_and_read_model_agree(ops in proptest::collection::vec(op(), 1..60)) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = model_server().await;
            let mut m = Model::default();
            let case = u64::from(rand::random::<u32>());
            for op in &ops {
                step(&s, &mut m, op, case).await;
            }
            compare(&s, &m).await;
            if std::env::var_os("TIDEMARK_MODEL_STATS").is_some() {
                let mut by: BTreeMap<&str, usize> = BTreeMap::new();
                for d in m.deliveries.values() {
                    *by.entry(d.status).or_default() += 1;
                }
                eprintln!(
                    "model case: {} ops, {} events, deliveries {by:?}, cursors {:?}, \
                     subscriptions {:?}, subscription cursors {:?}, {} terminal events",
                    ops.len(), m.events.len(), m.cursors, m.subs, m.sub_cursor, m.terminal.len()
                );
            }
        });
    }
}

/// The model's bridge steps in a fixed order (a check that the fuzzer's ops reach the paths
/// they name): subscribe, a run ends, the bridge pulls and acknowledges, two more runs end, an
/// ack of the later one is refused, the pending one is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_bridge_round_trip() {
    let s = model_server().await;
    let mut m = Model::default();
    let ops = [
        Op::Subscribe { sub: 0, bridge: 0 },
        Op::Pull(0),
        Op::EndRun,
        Op::Pull(0),
        Op::Ack {
            sub: 0,
            later: false,
        },
        Op::Pull(0),
        Op::EndRun,
        Op::EndRun,
        Op::Ack {
            sub: 0,
            later: true,
        },
        Op::Unsubscribe(0),
        Op::Pull(0),
        Op::Subscribe { sub: 0, bridge: 1 },
        Op::Pull(1),
        Op::Ack {
            sub: 0,
            later: false,
        },
        Op::Pull(1),
    ];
    for op in &ops {
        step(&s, &mut m, op, 0).await;
    }
    compare(&s, &m).await;
    assert_eq!(
        m.sub_cursor.get("ms0"),
        m.terminal.get(1),
        "two acks moved the cursor"
    );
}
