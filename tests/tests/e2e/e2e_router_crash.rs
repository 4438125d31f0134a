//! The notification router across crashes: every routed lifecycle event gets exactly one
//! `notification.created` (`ntf:<source_seq>`), none missing, none twice, whether the process
//! is killed while the router holds events it has read but not yet appended (fault injection
//! `TIDEMARK_FAULT_ROUTER_DELAY_MS`), or at random moments under load (restarts included,
//! without fault injection). After each recovery the projections have no lag and a replay of
//! the log verifies identical.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts};

use crate::common::{
    append_ok, assert_dense_unique, assert_projections_sound, assert_routed_exactly_once,
    list_notifications, receipts, routed_priority, task_ev, wait_routed, whole_quiet_log,
};

const DELAY_ENV: &str = "TIDEMARK_FAULT_ROUTER_DELAY_MS";
const WAIT: Duration = Duration::from_secs(60);

/// The dashboard holds every routed notification once.
async fn check_dashboard(api: &Api, sources: &[u64]) {
    let dash = list_notifications(api, "", 500).await;
    let mut seen = HashSet::new();
    for n in &dash {
        let id = n["notification_id"].as_str().expect("notification_id");
        assert!(seen.insert(id.to_owned()), "{id} twice on the dashboard");
    }
    for src in sources {
        assert!(
            seen.contains(&format!("ntf:{src}")),
            "ntf:{src} is not on the dashboard"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_inside_the_router_delay_window_loses_and_duplicates_nothing() {
    let mut s = match Server::try_start(ServerOpts::default().env(DELAY_ENV, "1500")).await {
        Ok(s) => s,
        Err(e) => panic!(
            "the server does not start with the router's fault injection {DELAY_ENV}=1500: {e}"
        ),
    };
    let mut inside_window = 0;
    const ROUNDS: u32 = 3;
    for round in 0..ROUNDS {
        if round > 0 {
            // The previous round left a server without the delay: start one with it.
            s.kill9();
            s.set_env(DELAY_ENV, Some("1500"));
            s.restart().await;
        }
        let t = format!("crash-task-{round}");
        let batch = json!({"events": [
            task_ev(&t, "task.created", json!({"project_id": "pc"})),
            task_ev(&t, "task.run_started", json!({"run_id": "r1"})),
            task_ev(&t, "task.run_review_requested", json!({"run_id": "r1"})),
            task_ev(&t, "task.run_completed", json!({"run_id": "r1"})),
            {"stream": "comments", "subject": t, "type": "comment.added"},
        ]});
        let first = append_ok(&s, &batch).await;
        let second = append_ok(
            &s,
            &task_ev(&t, "task.run_failed", json!({"run_id": "r1", "error": "x"})),
        )
        .await;
        let new_sources = [first[2].1, first[3].1, second[0].1];
        // The router has read them and waits: their notifications do not exist yet.
        let dash = list_notifications(&s, "", 500).await;
        let present: Vec<u64> = new_sources
            .iter()
            .copied()
            .filter(|src| {
                dash.iter()
                    .any(|n| n["notification_id"] == format!("ntf:{src}").as_str())
            })
            .collect();
        if present.is_empty() {
            inside_window += 1;
        } else {
            eprintln!(
                "round {round}: the notifications of {present:?} existed before the kill \
                 (the delay window had passed)"
            );
        }
        let status = s.kill9();
        assert!(!status.success());

        s.set_env(DELAY_ENV, None);
        s.restart().await;
        let (sources, created) = wait_routed(&s, WAIT).await;
        for src in new_sources {
            assert!(
                sources.contains_key(&src),
                "acknowledged lifecycle event {src} lost"
            );
        }
        assert_routed_exactly_once(&sources, &created);
        assert_eq!(
            created.len(),
            3 * usize::try_from(round + 1).expect("small"),
            "three notifications per round"
        );
        check_dashboard(&s, &sources.keys().copied().collect::<Vec<_>>()).await;
        assert_projections_sound(&s, &format!("round {round} after kill -9")).await;
    }
    eprintln!("router delay window: {inside_window} of {ROUNDS} kills inside it");
    assert!(
        inside_window > 0,
        "no kill landed inside the 1.5 s router delay window in {ROUNDS} rounds"
    );
    let (all, head) = whole_quiet_log(&s, WAIT).await;
    assert_dense_unique(&all, head);
}

#[derive(Default)]
struct Record {
    /// Acknowledged routed lifecycle events: seq → type.
    acked_routed: HashMap<u64, String>,
    /// Non-201 answers that are not transport errors.
    refusals: Vec<String>,
    batches: u64,
}

/// The lifecycle script an appender cycles through for its task: runs that complete, fail,
/// get canceled, or go through review; free-form events in between.
fn script_step(task: &str, n: u64, rng: &mut StdRng) -> Value {
    let run = format!("r{}", n / 4);
    match n % 4 {
        0 if n == 0 => task_ev(
            task,
            "task.created",
            json!({"project_id": "load", "review_required": rng.random_bool(0.3)}),
        ),
        0 => task_ev(task, "task.run_started", json!({"run_id": run})),
        1 => {
            if rng.random_bool(0.5) {
                task_ev(task, "task.run_review_requested", json!({"run_id": run}))
            } else {
                json!({"stream": "comments", "subject": task, "type": "comment.added",
                       "payload": {"n": n}})
            }
        }
        2 => {
            let ty = [
                // The first run's start is the task's creation (n == 0): its completion would
                // be a mismatch (run_not_started), which routes nothing.
                if n < 4 {
                    "task.run_failed"
                } else {
                    "task.run_completed"
                },
                "task.run_failed",
                "task.run_canceled",
                "task.run_review_rejected",
            ][rng.random_range(0..4)];
            task_ev(
                task,
                ty,
                json!({"run_id": run, "error": "e", "continuation": false}),
            )
        }
        _ => {
            if rng.random_bool(0.5) {
                task_ev(task, "task.run_review_approved", json!({"run_id": run}))
            } else {
                json!({"stream": "other", "subject": task, "type": "other.thing"})
            }
        }
    }
}

async fn appender(
    api: Api,
    task: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    rec: Arc<Mutex<Record>>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let size = rng.random_range(1..=4);
        let batch: Vec<Value> = (0..size)
            .map(|k| script_step(&task, n + k, &mut rng))
            .collect();
        n += size;
        match api.try_append(&json!({ "events": batch })).await {
            Ok((StatusCode::CREATED, body)) => {
                let mut r = rec.lock().expect("lock");
                r.batches += 1;
                for ((_, seq, dup), e) in receipts(&body).into_iter().zip(&batch) {
                    assert!(!dup, "a fresh event answered as a duplicate");
                    let ty = e["type"].as_str().unwrap_or_default();
                    if routed_priority(ty).is_some() {
                        r.acked_routed.insert(seq, ty.to_owned());
                    }
                }
            }
            Ok((StatusCode::TOO_MANY_REQUESTS, _)) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok((status, body)) => {
                rec.lock()
                    .expect("lock")
                    .refusals
                    .push(format!("{status}: {body}"));
                return;
            }
            // The server was killed under us: the batch's fate is unknown, and its events
            // have server-made ids, so it is not re-sent; whatever is in the log is checked.
            Err(_) => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_at_random_moments_under_load_route_each_event_once() {
    let seed: u64 = rand::random();
    eprintln!("router crash test seed: {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let rec = Arc::new(Mutex::new(Record::default()));
    let mut s = Server::start(ServerOpts::default()).await;
    const ROUNDS: u64 = 4;
    const APPENDERS: u64 = 6;
    for round in 0..ROUNDS {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..APPENDERS)
            .map(|k| {
                tokio::spawn(appender(
                    s.api(),
                    format!("load-{round}-{k}"),
                    rng.random(),
                    stop.clone(),
                    rec.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.random_range(150..=700))).await;
        s.kill9();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("an appender did not stop within 30 s after the kill")
                .expect("appender panicked");
        }
        let refusals = rec.lock().expect("lock").refusals.clone();
        assert!(
            refusals.is_empty(),
            "appends refused under load: {refusals:?}"
        );
        s.restart().await;
        // A restart may itself be killed while the router catches up.
        if rng.random_bool(0.5) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
            s.kill9();
            s.restart().await;
        }
    }
    s.kill9();
    s.restart().await;

    let (sources, created) = wait_routed(&s, WAIT).await;
    // The appenders are done: take what they recorded.
    let r = std::mem::take(&mut *rec.lock().expect("lock"));
    for (seq, ty) in &r.acked_routed {
        let got = sources
            .get(seq)
            .unwrap_or_else(|| panic!("acknowledged {ty} at seq {seq} is not in the log"));
        assert_eq!(got["type"], ty.as_str(), "seq {seq} holds another event");
    }
    assert_routed_exactly_once(&sources, &created);
    check_dashboard(&s, &sources.keys().copied().collect::<Vec<_>>()).await;
    let (all, head) = whole_quiet_log(&s, WAIT).await;
    assert_dense_unique(&all, head);
    assert_projections_sound(&s, "after the last kill -9").await;
    eprintln!(
        "router crash: {} batches acknowledged, {} routed events acknowledged, {} in the log, \
         {} notifications, head {head}",
        r.batches,
        r.acked_routed.len(),
        sources.len(),
        created.len()
    );
    assert!(
        r.acked_routed.len() >= 10,
        "too few routed events were acknowledged ({}) for the test to mean anything",
        r.acked_routed.len()
    );
}
