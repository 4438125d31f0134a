//! The crash campaign (issue 17, item 2): N `kill -9` cycles of the real server under a mixed
//! load. The suite runs three cycles; the campaign proper is one command, outside `.ci/run`:
//!
//! ```sh
//! cargo build --workspace --bins
//! TIDEMARK_CAMPAIGN_CYCLES=100 cargo test -p tidemark-tests --test e2e -- crash_campaign --nocapture
//! ```
//!
//! Each cycle runs, for a random 300–1500 ms, four appenders (batches of new events, resends of
//! acknowledged ones, urgent notifications that become deliveries), a claimer that claims and
//! completes deliveries, a bridge driver that ends task runs and pulls and acknowledges their
//! terminal notifications, a rebuild of a random projection, and a source polling a local
//! upstream that keeps growing; then the server is killed with SIGKILL at that random moment
//! and restarted on the same data. After every restart it checks that no acknowledged event
//! was lost or moved (same seq), that no event id is in the log twice, that every completed
//! delivery is still `sent`, that no acknowledged cursor advance was lost, that no upstream
//! item was appended twice, and that every projection verifies identical to a replay of the
//! log. It prints the totals at the end (the figures in docs/crash-campaign.md).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, encode_path};

use crate::common::{assert_dense_unique, assert_projections_sound, id_of, receipts};

const REBUILT: [&str; 3] = ["tasks", "deliveries", "cursors"];

#[derive(Default)]
struct Ledger {
    /// Every event sent, by id.
    sent: HashMap<String, Value>,
    /// Acknowledged event id → seq.
    acked: HashMap<String, u64>,
    /// Deliveries whose complete was acknowledged.
    completed: HashSet<String>,
    /// Subscription → the highest seq whose ack was acknowledged.
    cursor_acked: BTreeMap<String, u64>,
    /// Resends of acknowledged events answered as duplicates with the same seq.
    duplicates_confirmed: u64,
    /// Answers that break the contract (a resend at another seq, a refusal under plain load).
    violations: Vec<String>,
    cursor_advances: u64,
}

type Shared = Arc<Mutex<Ledger>>;

fn lock(l: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

fn record(l: &Shared, batch: &[Value], body: &Value) {
    let mut g = lock(l);
    for (id, seq, dup) in receipts(body) {
        match g.acked.insert(id.clone(), seq) {
            Some(prev) if prev != seq => g.violations.push(format!(
                "{id} acknowledged at seq {prev} and again at {seq}"
            )),
            Some(_) if dup => g.duplicates_confirmed += 1,
            _ => {}
        }
    }
    for e in batch {
        g.sent.insert(id_of(e).to_owned(), e.clone());
    }
}

async fn appender(api: Api, cycle: u64, who: u64, seed: u64, stop: Arc<AtomicBool>, l: Shared) {
    let mut rng = StdRng::seed_from_u64(seed);
    for n in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut batch: Vec<Value> = Vec::new();
        for k in 0..rng.random_range(1..=4) {
            let id = format!("cmp-{cycle}-{who}-{n}-{k}");
            batch.push(if rng.random_bool(0.25) {
                json!({"event_id": id, "stream": "notifications", "subject": id,
                       "type": "notification.requested",
                       "payload": {"priority": "urgent", "title": format!("campaign {id}")}})
            } else {
                json!({"event_id": id, "stream": "campaign", "subject": format!("w{who}"),
                       "type": "campaign.tick", "payload": {"n": n}})
            });
        }
        // A resend of something acknowledged earlier: must answer its seq as a duplicate.
        if rng.random_bool(0.3) {
            let g = lock(&l);
            if let Some((id, _)) = g
                .acked
                .iter()
                .nth(rng.random_range(0..g.acked.len().max(1)))
                && let Some(e) = g.sent.get(id)
            {
                batch.push(e.clone());
            }
        }
        match api.try_append(&json!({ "events": batch })).await {
            Ok((StatusCode::CREATED, body)) => record(&l, &batch, &body),
            Ok((StatusCode::TOO_MANY_REQUESTS, _)) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok((st, body)) => {
                lock(&l)
                    .violations
                    .push(format!("append answered {st}: {body}"));
                return;
            }
            Err(_) => return, // killed under us: the batch's fate is unknown, and that is fine
        }
    }
}

async fn claimer(api: Api, stop: Arc<AtomicBool>, l: Shared) {
    while !stop.load(Ordering::Relaxed) {
        let r = api
            .try_send(api.request(Method::POST, "/v1/deliveries/claim").json(
                &json!({"sink": "app", "owner": "campaign", "limit": 20, "lease_ms": 600_000}),
            ))
            .await;
        let Ok(r) = r else { return };
        if r.status != StatusCode::OK {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        for d in r.json["deliveries"].as_array().into_iter().flatten() {
            let id = d["id"].as_str().unwrap_or_default().to_owned();
            let path = format!("/v1/deliveries/{}/complete", encode_path(&id));
            match api
                .try_send(
                    api.request(Method::POST, &path)
                        .json(&json!({"owner": "campaign"})),
                )
                .await
            {
                Ok(c) if c.status == StatusCode::OK => {
                    lock(&l).completed.insert(id);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Ends runs of the campaign's task and acknowledges the terminal notifications it pulls.
async fn bridge(api: Api, cycle: u64, stop: Arc<AtomicBool>, l: Shared) {
    let task = "campaign-task";
    for run in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let id = format!("c{cycle}-r{run}");
        let events: Vec<Value> = [("task.run_started", 0), ("task.run_completed", 1)]
            .iter()
            .map(|(ty, k)| {
                json!({"event_id": format!("{id}-{k}"), "stream": "task_events", "subject": task,
                       "type": ty, "payload": {"run_id": id}})
            })
            .collect();
        match api.try_append(&json!({ "events": events })).await {
            Ok((StatusCode::CREATED, body)) => record(&l, &events, &body),
            Ok(_) => continue,
            Err(_) => return,
        }
        let Ok(p) = api
            .try_send(api.request(
                Method::GET,
                "/v1/bridges/campaign-bridge/deliveries?wait_ms=300",
            ))
            .await
        else {
            return;
        };
        for env in p.json["deliveries"].as_array().into_iter().flatten() {
            let did = env["delivery_id"].as_str().unwrap_or_default();
            let seq = env["seq"].as_u64().unwrap_or(0);
            let path = format!(
                "/v1/bridges/campaign-bridge/deliveries/{}/ack",
                encode_path(did)
            );
            match api
                .try_send(api.request(Method::POST, &path).json(&json!({})))
                .await
            {
                Ok(a) if a.status == StatusCode::OK => {
                    let mut g = lock(&l);
                    g.cursor_advances += 1;
                    let e = g.cursor_acked.entry("campaign-sub".into()).or_default();
                    *e = (*e).max(seq);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }
}

/// Three cycles in the suite (so the campaign itself stays sound); 100 and more by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_campaign() {
    let cycles: u64 = std::env::var("TIDEMARK_CAMPAIGN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let seed: u64 = std::env::var("TIDEMARK_CAMPAIGN_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    println!("crash campaign: {cycles} cycles, seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let (up, addr) = crate::e2e_sources::start_upstream().await;
    up.add_items(0, 10);
    let config = crate::e2e_sources::source_toml("campaign", addr, "every = \"200ms\"\n");
    let mut s = Server::start(ServerOpts::default().config(config).env(
        "TEST_SOURCE_TOKEN",
        tidemark_tests::secret(crate::e2e_sources::SECRET),
    ))
    .await;
    let l: Shared = Arc::default();
    let r = s
        .append(
            &json!({"event_id": "campaign-task-created", "stream": "task_events",
                        "subject": "campaign-task", "type": "task.created",
                        "payload": {"project_id": "campaign"}}),
        )
        .await;
    assert_eq!(r.0, StatusCode::CREATED, "{}", r.1);
    let r = s
        .send(
            s.request(
                Method::POST,
                "/v1/tasks/campaign-task/notifications/bridges",
            )
            .json(
                &json!({"subscription_id": "campaign-sub", "bridge_id": "campaign-bridge",
                    "sink": {"kind": "pull"}}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);

    let started = Instant::now();
    let mut items = 10;
    for cycle in 0..cycles {
        up.add_items(items, items + 5);
        items += 5;
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for who in 0..4 {
            tasks.push(tokio::spawn(appender(
                s.api(),
                cycle,
                who,
                rng.random(),
                stop.clone(),
                l.clone(),
            )));
        }
        tasks.push(tokio::spawn(claimer(s.api(), stop.clone(), l.clone())));
        tasks.push(tokio::spawn(bridge(
            s.api(),
            cycle,
            stop.clone(),
            l.clone(),
        )));
        let api = s.api();
        let projection = REBUILT[rng.random_range(0..REBUILT.len())];
        let rebuild_after = rng.random_range(0..800);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(rebuild_after)).await;
            let path = format!("/v1/admin/projections/{projection}/rebuild");
            let _ = api.try_send(api.request(Method::POST, &path)).await;
        }));
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..=1500))).await;
        s.kill9();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("a load task did not stop after the kill")
                .expect("a load task panicked");
        }
        s.restart().await;
        check(&s, &l, cycle).await;
        if cycle % 10 == 9 {
            println!("cycle {}: ok ({:?})", cycle + 1, started.elapsed());
        }
    }
    // The source catches up with the upstream: every item once.
    crate::common::wait_for(Duration::from_secs(60), "the source to catch up", || {
        let api = s.api();
        async move {
            let n = crate::e2e_sources::item_events(&api).await.len();
            (n + 1 >= items).then_some(())
        }
    })
    .await;
    let item_events = crate::e2e_sources::item_events(&s).await;
    let distinct: HashSet<&String> = item_events.iter().map(|(id, _)| id).collect();
    assert_eq!(
        distinct.len(),
        item_events.len(),
        "an upstream item appended twice"
    );
    let g = lock(&l);
    println!(
        "crash campaign done: {cycles} kill -9 cycles in {:?}; {} events acknowledged, 0 lost, \
         0 moved; {} resends answered as duplicates at their seq, 0 duplicated in the log; {} \
         deliveries completed, none reverted; {} cursor advances acknowledged, none lost; {} \
         upstream items appended once each; every projection identical to a replay after each \
         cycle",
        started.elapsed(),
        g.acked.len(),
        g.duplicates_confirmed,
        g.completed.len(),
        g.cursor_advances,
        item_events.len()
    );
}

/// After a restart: the acknowledged state is all there.
async fn check(s: &Server, l: &Shared, cycle: u64) {
    let (acked, completed, cursor, violations) = {
        let g = lock(l);
        (
            g.acked.clone(),
            g.completed.clone(),
            g.cursor_acked.clone(),
            g.violations.clone(),
        )
    };
    assert!(violations.is_empty(), "cycle {cycle}: {violations:?}");
    // The reactors append after the restart too (deliveries of notifications routed before
    // the kill, source items): read the log, then check it against the head after the read.
    let all = s.read_all("").await;
    let head = s.head().await;
    let read = u64::try_from(all.len()).expect("len");
    assert!(
        read <= head,
        "cycle {cycle}: read {read} events past the head {head}"
    );
    assert_dense_unique(&all, read);
    let by_id: HashMap<&str, u64> = all
        .iter()
        .map(|e| (id_of(e), e["seq"].as_u64().unwrap_or(0)))
        .collect();
    for (id, seq) in &acked {
        assert_eq!(
            by_id.get(id.as_str()),
            Some(seq),
            "cycle {cycle}: acknowledged event {id} (seq {seq}) lost or moved"
        );
    }
    for id in &completed {
        let r = s.get(&format!("/v1/deliveries/{}", encode_path(id))).await;
        assert_eq!(
            r.json["status"], "sent",
            "cycle {cycle}: completed delivery {id} is no longer sent: {}",
            r.text
        );
    }
    for (sub, seq) in &cursor {
        let r = s
            .get(&format!(
                "/v1/tasks/campaign-task/notifications/bridges/{sub}"
            ))
            .await;
        let at = r.json["cursor"]["last_sequence"].as_u64().unwrap_or(0);
        assert!(
            at >= *seq,
            "cycle {cycle}: the cursor of {sub} is at {at}, below the acknowledged {seq}"
        );
    }
    assert_projections_sound(s, &format!("cycle {cycle}")).await;
}
