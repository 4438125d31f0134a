//! I1 from the outside: acknowledged appends survive `kill -9`, and a crash never leaves a
//! gap, a duplicate or a torn event. Sixteen HTTP appenders load the server, which is killed
//! at a random moment, restarted on the same data, and loaded again, several times.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts};

use crate::common::{assert_dense_unique, assert_projections_sound, id_of, receipts, seq_of};

const APPENDERS: u64 = 16;
const ROUNDS: u64 = 4;

#[derive(Default)]
struct Record {
    /// Every event ever sent, by id (acknowledged or not).
    sent: HashMap<String, Value>,
    /// Acknowledged event_id → seq.
    acked: HashMap<String, u64>,
    /// Batches whose request failed (connection lost at the kill): their fate is unknown.
    unknown: Vec<Vec<Value>>,
    /// Non-201 answers that are not transport errors.
    refusals: Vec<String>,
}

fn event(round: u64, task: u64, n: u64, k: u64) -> Value {
    let id = format!("c{round}-{task}-{n}-{k}");
    json!({
        "event_id": id, "stream": "crash", "subject": format!("w{task}"), "type": "crash.tick",
        "payload": {"id": id, "round": round, "pad": "p".repeat(usize::try_from(k * 40).unwrap_or(0))}
    })
}

/// Record one acknowledged batch, checking the receipt names the batch's ids in order.
fn ack(rec: &Mutex<Record>, batch: &[Value], body: &Value) {
    let r = receipts(body);
    let ids: Vec<&str> = batch.iter().map(id_of).collect();
    let got: Vec<&str> = r.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(got, ids, "the receipt names the batch's events in order");
    let mut rec = rec.lock().expect("lock");
    for (id, seq, _) in r {
        if let Some(prev) = rec.acked.insert(id.clone(), seq) {
            assert_eq!(prev, seq, "event {id} acknowledged at two seqs");
        }
    }
}

async fn appender(
    api: Api,
    round: u64,
    task: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
    rec: Arc<Mutex<Record>>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    for n in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let size = rng.random_range(1..=5);
        let batch: Vec<Value> = (0..size).map(|k| event(round, task, n, k)).collect();
        {
            let mut r = rec.lock().expect("lock");
            for e in &batch {
                r.sent.insert(id_of(e).to_owned(), e.clone());
            }
        }
        match api.try_append(&json!({ "events": batch })).await {
            Ok((StatusCode::CREATED, body)) => ack(&rec, &batch, &body),
            Ok((status, body)) => {
                let overloaded = status == StatusCode::TOO_MANY_REQUESTS;
                {
                    let mut r = rec.lock().expect("lock");
                    r.unknown.push(batch);
                    if !overloaded {
                        r.refusals.push(format!("{status}: {body}"));
                    }
                }
                if !overloaded {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => {
                // The server died under us: the batch may or may not be in the log.
                rec.lock().expect("lock").unknown.push(batch);
                return;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_appends_survive_kill_9() {
    let seed: u64 = rand::random();
    eprintln!("crash test seed: {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let rec = Arc::new(Mutex::new(Record::default()));
    let mut s = Server::start(ServerOpts::default()).await;
    let mut acked_per_round = Vec::new();

    for round in 0..ROUNDS {
        let before = rec.lock().expect("lock").acked.len();
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..APPENDERS)
            .map(|task| {
                tokio::spawn(appender(
                    s.api(),
                    round,
                    task,
                    rng.random(),
                    stop.clone(),
                    rec.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..=600))).await;
        let status = s.kill9();
        assert!(!status.success(), "kill -9 ends the process abnormally");
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("an appender did not stop within 30 s after the kill")
                .expect("appender task panicked");
        }
        {
            let r = rec.lock().expect("lock");
            assert!(
                r.refusals.is_empty(),
                "appends were refused under plain load: {:?}",
                r.refusals
            );
            acked_per_round.push(r.acked.len() - before);
        }

        s.restart().await;
        let head = s.head().await;
        let acked: Vec<(String, u64)> = {
            let r = rec.lock().expect("lock");
            r.acked.iter().map(|(k, v)| (k.clone(), *v)).collect()
        };
        let max_acked = acked.iter().map(|x| x.1).max().unwrap_or(0);
        assert!(
            head >= max_acked,
            "after the kill the head is {head}, but seq {max_acked} had been acknowledged"
        );

        // Re-sending acknowledged events gives duplicates with the same seq.
        let resend: Vec<&(String, u64)> = acked.iter().take(20).collect();
        for (id, seq) in resend {
            let e = rec.lock().expect("lock").sent[id].clone();
            let (st, body) = s.append(&e).await;
            assert_eq!(st, StatusCode::CREATED, "re-send of {id}: {body}");
            assert_eq!(
                receipts(&body),
                vec![(id.clone(), *seq, true)],
                "re-sent acknowledged event {id} must be a duplicate of seq {seq}"
            );
        }
        // Batches in flight at the kill: whatever happened to them, re-sending each gives
        // one copy; a duplicate names the seq the log holds.
        let unknown = std::mem::take(&mut rec.lock().expect("lock").unknown);
        for batch in unknown {
            let (st, body) = s.append(&json!({ "events": batch })).await;
            assert_eq!(
                st,
                StatusCode::CREATED,
                "re-send of an in-flight batch: {body}"
            );
            ack(&rec, &batch, &body);
        }
        assert_eq!(
            s.head().await,
            head + new_since(&rec, head),
            "the head moves exactly by the new events"
        );
    }
    s.kill9();
    s.restart().await;

    let head = s.head().await;
    let all = s.read_all("").await;
    assert_dense_unique(&all, head);
    // The read models kept up through every crash: no lag, and a replay of the log gives
    // the same models (I3).
    assert_projections_sound(&s, "after kill -9 under load").await;
    let r = rec.lock().expect("lock");
    let by_id: HashMap<&str, &Value> = all.iter().map(|e| (id_of(e), e)).collect();
    for (id, seq) in &r.acked {
        let e = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("acknowledged event {id} (seq {seq}) is not in the log"));
        assert_eq!(seq_of(e), *seq, "acknowledged event {id} moved");
    }
    let mut server_made = 0;
    for e in &all {
        let id = id_of(e);
        if !r.sent.contains_key(id) && e["stream"] == "settings" && e["type"] == "settings.updated"
        {
            // Recorded by the server itself at its first start (the config never changed).
            server_made += 1;
            continue;
        }
        let sent = r
            .sent
            .get(id)
            .unwrap_or_else(|| panic!("the log holds an event nobody sent: {e}"));
        for k in ["stream", "subject", "type", "payload"] {
            assert_eq!(e[k], sent[k], "event {id} is torn: `{k}` differs");
        }
    }
    assert_eq!(
        server_made, 1,
        "one settings.updated at the first start, none at the restarts with the same config"
    );
    let ids: HashSet<&str> = all.iter().map(id_of).collect();
    assert_eq!(ids.len(), all.len());
    let total: usize = acked_per_round.iter().sum();
    eprintln!("crash test: acknowledged per round {acked_per_round:?}, head {head}");
    assert!(
        total >= 16,
        "too few appends were acknowledged ({total}) for the test to mean anything"
    );
}

/// How many acknowledged events have a seq above `head`.
fn new_since(rec: &Mutex<Record>, head: u64) -> u64 {
    let n = rec
        .lock()
        .expect("lock")
        .acked
        .values()
        .filter(|s| **s > head)
        .count();
    u64::try_from(n).expect("count")
}
