//! Two independent deciders over one log (spec section 3, I7): two engines, each with a
//! models store of its own, share one log and race claims, completes, compare-and-swap
//! cursor advances, bridge acknowledgements and source watermarks. Neither knows of the other; only the log's conditions keep their
//! decisions apart. Every answer is a success or a documented refusal, every delivery is
//! leased by one claimer only (the leases are long: none expires), and the combined log
//! replays legally through the independent checker of `e2e_races`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use tidemark_log::EventLog;

use serde_json::{Value, json};
use tidemark_engine::commands::Completed;
use tidemark_engine::commands::bridges::{ConfirmOne, Confirmation, Subscribe};
use tidemark_engine::commands::cursors::Advance;
use tidemark_engine::commands::outbox::{Claim, Complete, Route};
use tidemark_engine::{CommandError, Engine};
use tidemark_log::{Log, LogConfig, NewEvent, ReadQuery};
use tidemark_projections::ModelsConfig;
use tidemark_projections::names::{Sink, ids};

use crate::e2e_races::Checker;

const DELIVERIES: usize = 240;

/// Runs of the bridged task: each ends in a terminal event a bridge acknowledges.
const RUNS: usize = 40;

fn all_events(log: &Log) -> Vec<tidemark_log::Event> {
    let mut out: Vec<tidemark_log::Event> = Vec::new();
    loop {
        let after = out.last().map_or(0, |e| e.seq);
        let query = ReadQuery {
            after,
            limit: 1000,
            ..ReadQuery::default()
        };
        let page = log.read(&query).unwrap().events;
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// An urgent `notification.requested` of `id` (its event id and subject) for `recipient`.
fn urgent(id: String, recipient: String) -> NewEvent {
    let payload = json!({"priority": "urgent", "title": "t", "recipient": recipient});
    let ty = "notification.requested";
    NewEvent::new(Some(id.clone()), "notifications", id, ty, &payload).unwrap()
}

/// A claim of up to `limit` deliveries of `sink` by `owner`, leased for ten minutes (none
/// expires during a test).
fn long_claim(sink: Sink, owner: &str, limit: usize, share: tidemark_log::Share) -> Claim {
    Claim {
        sink,
        owner: owner.to_owned(),
        limit,
        lease_ms: 600_000,
        share,
    }
}

/// Claim with `claim` by `engine`: its rows, or `None` when it leased nothing (one more idle
/// round, after a yield).
async fn claim_round(
    engine: &Engine<Log>,
    claim: Claim,
    idle: &mut usize,
) -> Option<Vec<tidemark_projections::deliveries::Delivery>> {
    let rows = claimed(engine, claim).await;
    if rows.is_empty() {
        *idle += 1;
        tokio::task::yield_now().await;
        return None;
    }
    *idle = 0;
    Some(rows)
}

/// A command's answer must be a success or a refusal documented for racers.
#[track_caller]
fn allowed<T>(r: Result<T, CommandError>, what: &str) {
    match r {
        Ok(_) => {}
        Err(e) if refused_as_documented(&e) => {}
        Err(e) => panic!("{what}: {e:?}"),
    }
}

fn as_json(e: &tidemark_log::Event) -> Value {
    json!({"seq": e.seq, "type": e.event_type, "subject": e.subject,
           "payload": serde_json::from_str::<Value>(e.payload.get()).unwrap()})
}

/// A refusal one of the racers may meet: the documented ones of section 5 and 6, or
/// `contended` after too many re-decisions. Anything else fails the test.
fn refused_as_documented(e: &CommandError) -> bool {
    use tidemark_engine::Rejection as R;
    e.rejection().is_some_and(|r| {
        [
            R::NotLeaseOwner,
            R::IllegalTransition,
            R::LeaseExpired,
            R::Contended,
            R::CursorConflict,
            R::NonMonotonicCursor,
            R::WatermarkConflict,
        ]
        .contains(&r)
    })
}

/// Both deciders route every event of `log` at once (racing for the same deliveries).
async fn route_on_both(a: &Engine<Log>, b: &Engine<Log>, log: &Log) {
    let source = all_events(log);
    let (ra, rb) = tokio::join!(
        a.execute(Route {
            source: source.clone()
        }),
        b.execute(Route { source })
    );
    ra.unwrap();
    rb.unwrap();
}

/// `claim` decided by `engine`: its rows, none when refused as documented (a race lost).
async fn claimed(
    engine: &Engine<Log>,
    claim: Claim,
) -> Vec<tidemark_projections::deliveries::Delivery> {
    let owner = claim.owner.clone();
    match engine.execute(claim).await {
        Ok((rows, _)) => rows,
        Err(e) if refused_as_documented(&e) => Vec::new(),
        Err(e) => panic!("claim by {owner}: {e:?}"),
    }
}

/// The task a bridge follows, with [`RUNS`] runs started and completed, and a pull
/// subscription on it; the seqs of the terminal (deliverable) events, in order.
async fn bridged_task(log: &Log, engine: &Engine<Log>) -> Vec<u64> {
    let mut evs = vec![
        NewEvent::new(
            Some("bt".into()),
            "task_events",
            "bt",
            "task.created",
            &json!({"project_id": "race"}),
        )
        .unwrap(),
    ];
    for r in 0..RUNS {
        for ty in ["task.run_started", "task.run_completed"] {
            evs.push(
                NewEvent::new(
                    None,
                    "task_events",
                    "bt",
                    ty,
                    &json!({"run_id": format!("r{r}")}),
                )
                .unwrap(),
            );
        }
    }
    log.append(evs).await.unwrap();
    let target = serde_json::from_value(json!({
        "task_id": "bt", "bridge_id": "race-bridge", "mode": "post", "sink": {"kind": "pull"}
    }))
    .unwrap();
    engine
        .execute(Subscribe {
            id: "race-sub".into(),
            target,
        })
        .await
        .unwrap();
    all_events(log)
        .iter()
        .filter(|e| e.event_type == "task.run_completed")
        .map(|e| e.seq)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_deciders_over_one_log_keep_i7_by_the_logs_conditions() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(&LogConfig::in_dir(dir.path())).unwrap();
    let a = Engine::on_log(log.clone(), &ModelsConfig::in_dir(&dir.path().join("a"))).unwrap();
    let b = Engine::on_log(log.clone(), &ModelsConfig::in_dir(&dir.path().join("b"))).unwrap();
    let engines = [("a", a.clone()), ("b", b.clone())];

    // Notifications, routed by both deciders at once (the same deterministic deliveries).
    let notes: Vec<NewEvent> = (0..DELIVERIES)
        .map(|i| urgent(format!("dd-{i}"), format!("r{}", i % 7)))
        .collect();
    for chunk in notes.chunks(100) {
        log.append(chunk.to_vec()).await.unwrap();
    }
    let terminal = bridged_task(&log, &a).await;
    route_on_both(&a, &b, &log).await;
    let created: Vec<(String, Value)> = all_events(&log)
        .iter()
        .filter(|e| e.event_type == "delivery.created")
        .map(|e| (e.subject.clone(), as_json(e)["payload"].clone()))
        .collect();
    assert!(
        created.len() >= DELIVERIES,
        "{} deliveries were created",
        created.len()
    );

    // Claimers on both deciders, each completing what it leased; a cursor advanced by both
    // with compare-and-swap.
    let leased: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let twice: Arc<Mutex<Vec<String>>> = Arc::default();
    let acks: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let mut racers = Vec::new();
    for (index, (name, engine)) in engines.iter().enumerate() {
        for k in 0..6 {
            let (engine, leased, twice) = (engine.clone(), leased.clone(), twice.clone());
            let owner = format!("{name}-{k}");
            // Half the claimers take the deciders' shares first (as nodes of a cluster do),
            // half race for the same deliveries.
            let share = if k % 2 == 0 {
                tidemark_log::Share { index, of: 2 }
            } else {
                tidemark_log::Share::ALL
            };
            racers.push(tokio::spawn(async move {
                let mut idle = 0;
                while idle < 3 {
                    let claim = long_claim(Sink::App, &owner, 5, share);
                    let Some(rows) = claim_round(&engine, claim, &mut idle).await else {
                        continue;
                    };
                    {
                        let mut m = leased.lock().unwrap();
                        for r in &rows {
                            if let Some(prev) = m.insert(r.id.to_string(), owner.clone()) {
                                twice
                                    .lock()
                                    .unwrap()
                                    .push(format!("{} leased by {prev} and by {owner}", r.id));
                            }
                        }
                    }
                    let items = rows.iter().map(|r| (r.id.clone(), None)).collect();
                    let (done, _) = engine
                        .execute(Complete {
                            owner: owner.clone(),
                            items,
                            resolved_targets: Vec::new(),
                        })
                        .await
                        .unwrap();
                    for c in done {
                        if let Completed::Refused { .. } = c {
                            panic!("{owner}'s complete of its own lease was refused: {c:?}");
                        }
                    }
                }
            }));
        }
        for k in 0..3 {
            // A source's watermark moved by compare-and-swap from both deciders.
            let engine = engine.clone();
            racers.push(tokio::spawn(async move {
                for _ in 0..30 {
                    let from = engine
                        .read()
                        .source("race-src")
                        .ok()
                        .flatten()
                        .and_then(|r| r.watermark);
                    let n: u64 = from
                        .as_deref()
                        .and_then(|w| w.strip_prefix('w'))
                        .and_then(|w| w.parse().ok())
                        .unwrap_or(0);
                    let r = engine
                        .execute(tidemark_engine::commands::sources::Advance {
                            name: "race-src".into(),
                            from,
                            to: format!("w{:06}", n + 1),
                        })
                        .await;
                    allowed(r, &format!("watermark advance {k}"));
                }
            }));
        }
        for k in 0..3 {
            let engine = engine.clone();
            let tag = format!("{name}-{k}");
            racers.push(tokio::spawn(async move {
                for n in 0..40u64 {
                    let at = engine
                        .read()
                        .cursors(Some("race-consumer"), 10)
                        .map(|c| c.first().map_or(0, |c| c.last_sequence))
                        .unwrap_or(0);
                    let r = engine
                        .execute(Advance {
                            consumer_id: "race-consumer".into(),
                            stream_name: "task_events".into(),
                            subject_id: "t".into(),
                            last_sequence: at + 1,
                            delivery_id: format!("{tag}-{n}"),
                            expected_sequence: Some(at),
                        })
                        .await;
                    allowed(r, &format!("advance by {tag}"));
                }
            }));
        }
        for k in 0..3 {
            // A bridge acknowledging its deliveries one by one from both deciders, each at the
            // cursor its own models show (compare-and-swap): every acknowledgement that moved
            // the cursor is recorded as (from, to).
            let (engine, terminal, acks) = (engine.clone(), terminal.clone(), acks.clone());
            let tag = format!("{name}-{k}");
            racers.push(tokio::spawn(async move {
                for _ in 0..RUNS * 20 {
                    let at = engine
                        .read()
                        .cursors(Some(&ids::bridge_consumer("race-sub")), 10)
                        .map(|c| c.first().map_or(0, |c| c.last_sequence))
                        .unwrap_or(0);
                    let Some(&next) = terminal.iter().find(|&&s| s > at) else {
                        return;
                    };
                    let r = engine
                        .execute(ConfirmOne(Confirmation {
                            subscription_id: "race-sub".into(),
                            task_id: "bt".into(),
                            seq: next,
                            expected: Some(at),
                        }))
                        .await;
                    match r {
                        Ok((Ok(cur), receipt)) => {
                            if !receipt.events.is_empty() {
                                assert_eq!(cur.last_sequence, next, "ack by {tag}");
                                acks.lock().unwrap().push((at, next));
                            }
                        }
                        Ok((Err(e), _)) | Err(e) if refused_as_documented(&e) => {}
                        Ok((Err(e), _)) | Err(e) => panic!("ack by {tag}: {e:?}"),
                    }
                }
                panic!("ack racer {tag} never saw every terminal event acknowledged");
            }));
        }
    }
    for r in racers {
        r.await.unwrap();
    }

    let twice = twice.lock().unwrap().clone();
    assert!(twice.is_empty(), "double leases: {twice:?}");
    let leased = leased.lock().unwrap().clone();
    let app: HashSet<String> = created
        .iter()
        .filter(|(_, p)| p["sink"] == "app")
        .map(|(id, _)| id.clone())
        .collect();
    assert!(
        leased.len() == app.len() && !leased.is_empty(),
        "{} of {} app deliveries were leased",
        leased.len(),
        app.len()
    );
    let events: Vec<Value> = all_events(&log).iter().map(as_json).collect();
    // No watermark skipped or moved twice from one place: each advance starts where the one
    // before it in the log ended.
    let mut watermark = Value::Null;
    let mut advances = 0;
    for e in events
        .iter()
        .filter(|e| e["type"] == "source.watermark_advanced")
    {
        assert_eq!(
            e["payload"]["from"], watermark,
            "seq {}: a watermark advance from a stale watermark",
            e["seq"]
        );
        watermark = e["payload"]["to"].clone();
        advances += 1;
    }
    assert!(advances > 0, "the watermark moved");
    // No acknowledgement lost: the cursor moves the racers were told of chain from 0, each
    // from where the one before it ended, through the bridged task's terminal events in
    // order; the log holds exactly those moves, in that order.
    let mut acks = acks.lock().unwrap().clone();
    acks.sort_unstable();
    let mut from = 0;
    for &(at, to) in &acks {
        assert_eq!(at, from, "an acknowledgement from a stale cursor: {acks:?}");
        from = to;
    }
    assert_eq!(
        acks.iter().map(|a| a.1).collect::<Vec<_>>(),
        terminal,
        "every terminal event acknowledged once"
    );
    let moved: Vec<u64> = events
        .iter()
        .filter(|e| {
            e["type"] == "cursor.advanced" && e["subject"] == ids::bridge_consumer("race-sub")
        })
        .map(|e| e["payload"]["last_sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(moved, terminal, "the bridge's cursor moves in the log");
    let violations = Checker::check_log(&events);
    assert!(violations.is_empty(), "{violations:#?}");
    let leased_by = |decider: &str| {
        let leased = |e: &&Value| {
            let owner = e["payload"]["owner"].as_str().unwrap_or_default();
            e["type"] == "delivery.leased" && owner.starts_with(&format!("{decider}-"))
        };
        events.iter().filter(leased).count()
    };
    let (by_a, by_b) = (leased_by("a"), leased_by("b"));
    // Both deciders followed the same log to the same models: every delivery leased (by
    // whichever) is sent in each one's read models.
    for id in leased.keys() {
        for (name, e) in &engines {
            let (row, _) = e
                .read()
                .delivery(&id.as_str().into())
                .unwrap()
                .expect("row");
            assert_eq!(row.status.as_str(), "sent", "{id} in {name}'s models");
        }
    }
    eprintln!(
        "two deciders: {} leases (a {by_a}, b {by_b}), {advances} watermark advances, {} bridge \
         acks, {} events, re-decided a {} b {}",
        leased.len(),
        acks.len(),
        events.len(),
        a.redecided(),
        b.redecided()
    );
    // The log's condition did refuse stale decisions (else the race never happened and the
    // checks above would hold by luck).
    assert!(
        a.redecided() + b.redecided() > 0,
        "no decision was refused by the log's condition: the deciders never raced"
    );
    a.close().await;
    b.close().await;
}

/// `max_pending` across deciders (spec section 16): two engines over one log, sharing the
/// outbox bound as the nodes of a cluster do, admit notification requests from many clients
/// at once. However their admissions interleave, the deliveries they make never exceed the
/// bound: an admission that adds deliveries appends on the condition that no other admission
/// came in since the models it was judged on. Every request is accepted or refused
/// `outbox_full`, and the accepted ones are exactly those in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_pending_holds_across_two_deciders() {
    const MAX_PENDING: u64 = 30;
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(&LogConfig::in_dir(dir.path())).unwrap();
    let a = Engine::on_log(log.clone(), &ModelsConfig::in_dir(&dir.path().join("a")))
        .unwrap()
        .with_shared_outbox(true);
    let b = Engine::on_log(log.clone(), &ModelsConfig::in_dir(&dir.path().join("b")))
        .unwrap()
        .with_shared_outbox(true);
    let accepted: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut clients = Vec::new();
    for (name, engine) in [("a", a.clone()), ("b", b.clone())] {
        for k in 0..6 {
            let (engine, accepted) = (engine.clone(), accepted.clone());
            clients.push(tokio::spawn(async move {
                let mut full = 0;
                for i in 0..20 {
                    let id = format!("mp-{name}-{k}-{i}");
                    let ev = NewEvent::new(
                        Some(id.clone()),
                        "notifications",
                        id.clone(),
                        "notification.requested",
                        &json!({"priority": "action", "title": "t"}),
                    )
                    .unwrap();
                    match engine.append_from_client(vec![ev], MAX_PENDING).await {
                        Ok(r) => {
                            assert_eq!(r.events.len(), 1, "answered for its own event");
                            accepted.lock().unwrap().push(id);
                        }
                        Err(tidemark_engine::ClientAppendError::OutboxFull { .. }) => full += 1,
                        Err(tidemark_engine::ClientAppendError::Command(e))
                            if refused_as_documented(&e) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                full
            }));
        }
    }
    let mut full = 0;
    for c in clients {
        full += c.await.unwrap();
    }
    assert!(full > 0, "the bound was reached");
    let events = all_events(&log);
    let requested: HashSet<String> = events
        .iter()
        .filter(|e| e.event_type == "notification.requested")
        .map(|e| e.subject.clone())
        .collect();
    let accepted: HashSet<String> = accepted.lock().unwrap().iter().cloned().collect();
    assert_eq!(
        requested, accepted,
        "the accepted requests are those in the log"
    );
    // Route them all: the deliveries they make are within the bound.
    a.execute(Route {
        source: events.clone(),
    })
    .await
    .unwrap();
    let created = all_events(&log)
        .iter()
        .filter(|e| e.event_type == "delivery.created")
        .count() as u64;
    assert!(created > 0);
    assert!(
        created <= MAX_PENDING,
        "{created} deliveries pending, above max_pending {MAX_PENDING}"
    );
    a.close().await;
    b.close().await;
}

/// An endpoint's circuit with two deciders over one log (spec section 17): claimers on both
/// lease and fail the deliveries of one webhook route at once. The circuit opens once — the
/// decider that loses the race for the endpoint's subject decides again and sees it open — and
/// from that event on neither decider leases another delivery of the route (its cool-down is
/// an hour: no probe), while the deliveries left wait with the attempts they had.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_deciders_open_an_endpoints_circuit_once() {
    // Each race is short: several make a lost one likely to show.
    for _ in 0..8 {
        circuit_race().await;
    }
}

async fn circuit_race() {
    use tidemark_engine::commands::outbox::{Fail, Failure};
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(&LogConfig::in_dir(dir.path())).unwrap();
    let a = Engine::on_log(log.clone(), &ModelsConfig::in_dir(&dir.path().join("a"))).unwrap();
    let b = Engine::on_log(log.clone(), &ModelsConfig::in_dir(&dir.path().join("b"))).unwrap();
    let settings = json!({
        "routing": {"urgent": ["hook"]},
        "routes": {"hook": {"sink": "webhook", "circuit": {"failures": 4, "cool_down": "1h"}}},
    });
    let mut events =
        vec![NewEvent::new(None, "settings", "", "settings.updated", &settings).unwrap()];
    events.extend((0..60).map(|i| urgent(format!("cb-{i}"), "r".to_owned())));
    log.append(events).await.unwrap();
    route_on_both(&a, &b, &log).await;

    let mut racers = Vec::new();
    for (name, engine) in [("a", a.clone()), ("b", b.clone())] {
        for k in 0..3 {
            let engine = engine.clone();
            let owner = format!("dispatcher:{name}-{k}");
            racers.push(tokio::spawn(async move {
                let mut idle = 0;
                while idle < 20 {
                    let claim = long_claim(Sink::Webhook, &owner, 2, tidemark_log::Share::ALL);
                    let Some(rows) = claim_round(&engine, claim, &mut idle).await else {
                        continue;
                    };
                    for r in rows {
                        let failed = engine
                            .execute(Fail {
                                id: r.id.clone(),
                                owner: owner.clone(),
                                failure: Failure {
                                    error_code: "http_503".into(),
                                    error: "unavailable".into(),
                                    retryable: true,
                                    retry_after_ms: Some(0),
                                },
                            })
                            .await;
                        allowed(failed, &format!("fail by {owner}"));
                    }
                }
            }));
        }
    }
    for r in racers {
        r.await.unwrap();
    }
    let all = all_events(&log);
    let opened: Vec<&tidemark_log::Event> = all
        .iter()
        .filter(|e| e.event_type == "endpoint.circuit_opened")
        .collect();
    assert_eq!(opened.len(), 1, "the circuit opened once: {opened:?}");
    assert_eq!(opened[0].subject, "hook");
    let at = opened[0].seq;
    let late: Vec<String> = all
        .iter()
        .filter(|e| e.seq > at && e.event_type == "delivery.leased")
        .map(|e| e.subject.clone())
        .collect();
    assert!(late.is_empty(), "leased after the circuit opened: {late:?}");
    assert!(
        !all.iter()
            .any(|e| e.event_type == "endpoint.circuit_probed"),
        "no probe within the hour's cool-down"
    );
    // The deliveries left wait: none was parked, most were never tried.
    let failed = all
        .iter()
        .filter(|e| e.event_type == "delivery.attempt_failed")
        .count();
    assert!(failed >= 4, "{failed} failures");
    assert!(
        !all.iter().any(|e| e.event_type == "delivery.parked"
            || (e.event_type == "delivery.attempt_failed"
                && as_json(e)["payload"]["parked"] == true)),
        "a delivery was parked"
    );
    assert!(
        failed < 60,
        "every delivery was tried: the circuit held none"
    );
    // Both deciders' models agree on the endpoint.
    for engine in [&a, &b] {
        let eps = engine.read().endpoints().unwrap();
        let (e, policy) = eps.iter().find(|(e, _)| e.route == "hook").expect("listed");
        assert_eq!(e.state(), "open", "{e:?}");
        assert_eq!(policy.failures, 4);
        assert_eq!(e.attempts, failed as u64, "{e:?}");
    }
}
