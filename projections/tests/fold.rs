//! I3 on a real log: for random task/review/notification traffic (with duplicates and
//! out-of-order lifecycle events), the live projections and a from-scratch rebuild have the
//! same digests, and the tasks model matches a reference written here from the spec's rules.

use std::collections::HashMap;

use proptest::prelude::*;
use serde_json::json;
use tidemark_log::{Log, LogConfig, NewEvent};
use tidemark_projections::{read, rebuild};

#[derive(Debug, Clone)]
enum Op {
    Created {
        task: u8,
        review: bool,
    },
    Started {
        task: u8,
        run: u8,
    },
    Ended {
        task: u8,
        run: u8,
        kind: u8,
    },
    ReviewRequested {
        task: u8,
        run: u8,
    },
    Approved {
        task: u8,
        run: u8,
    },
    Rejected {
        task: u8,
        run: u8,
        continuation: bool,
    },
    Canceled {
        task: u8,
    },
    Notify {
        id: u8,
        prio: u8,
    },
    /// Re-send an earlier op's exact event (same event_id): a duplicate.
    Repeat(usize),
    Other {
        task: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let t = 0u8..4;
    let r = 0u8..3;
    prop_oneof![
        (t.clone(), any::<bool>()).prop_map(|(task, review)| Op::Created { task, review }),
        (t.clone(), r.clone()).prop_map(|(task, run)| Op::Started { task, run }),
        (t.clone(), r.clone(), 0u8..3).prop_map(|(task, run, kind)| Op::Ended { task, run, kind }),
        (t.clone(), r.clone()).prop_map(|(task, run)| Op::ReviewRequested { task, run }),
        (t.clone(), r.clone()).prop_map(|(task, run)| Op::Approved { task, run }),
        (t.clone(), r.clone(), any::<bool>()).prop_map(|(task, run, continuation)| Op::Rejected {
            task,
            run,
            continuation
        }),
        t.clone().prop_map(|task| Op::Canceled { task }),
        (0u8..5, 0u8..4).prop_map(|(id, prio)| Op::Notify { id, prio }),
        (0usize..50).prop_map(Op::Repeat),
        t.prop_map(|task| Op::Other { task }),
    ]
}

fn to_event(i: usize, op: &Op) -> Option<NewEvent> {
    let id = Some(format!("e{i}"));
    let te = |task: &u8, ty: &str, p: serde_json::Value| {
        NewEvent::new(id.clone(), "task_events", format!("task-{task}"), ty, &p).unwrap()
    };
    Some(match op {
        Op::Created { task, review } => te(
            task,
            "task.created",
            json!({"project_id": "p", "review_required": review}),
        ),
        Op::Started { task, run } => te(
            task,
            "task.run_started",
            json!({"run_id": format!("r{run}")}),
        ),
        Op::Ended { task, run, kind } => {
            let ty = ["task.run_completed", "task.run_failed", "task.run_canceled"][*kind as usize];
            te(
                task,
                ty,
                json!({"run_id": format!("r{run}"), "error": "boom"}),
            )
        }
        Op::ReviewRequested { task, run } => te(
            task,
            "task.run_review_requested",
            json!({"run_id": format!("r{run}")}),
        ),
        Op::Approved { task, run } => te(
            task,
            "task.run_review_approved",
            json!({"run_id": format!("r{run}"), "reviewer": "rv"}),
        ),
        Op::Rejected {
            task,
            run,
            continuation,
        } => te(
            task,
            "task.run_review_rejected",
            json!({"run_id": format!("r{run}"), "continuation": continuation}),
        ),
        Op::Canceled { task } => te(task, "task.canceled", json!({"reason": "no"})),
        Op::Notify { id, prio } => {
            let nid = format!("n{id}");
            let p = ["urgent", "action", "warning", "info"][*prio as usize];
            NewEvent::new(
                Some(nid.clone()),
                "notifications",
                nid,
                "notification.requested",
                &json!({"priority": p, "title": "t"}),
            )
            .unwrap()
        }
        Op::Other { task } => NewEvent::new(
            id,
            "comments",
            format!("task-{task}"),
            "comment.added",
            &json!({}),
        )
        .unwrap(),
        Op::Repeat(_) => return None,
    })
}

/// The reference: status rules of the spec, written plainly.
#[derive(Debug, Default, Clone, PartialEq)]
struct RefTask {
    status: String,
    current: Option<String>,
    review_required: bool,
    canceled: bool,
    runs: HashMap<String, (String, String, bool, bool)>, // outcome, review state, requested, required
    latest: u64,
}

fn reference(events: &[(u64, NewEvent)]) -> HashMap<String, RefTask> {
    let mut m: HashMap<String, RefTask> = HashMap::new();
    for (seq, e) in events {
        if e.stream != "task_events" {
            if let Some(t) = m.get_mut(&e.subject) {
                t.latest = *seq;
            }
            continue;
        }
        let t = m.entry(e.subject.clone()).or_insert_with(|| RefTask {
            status: "open".into(),
            ..Default::default()
        });
        t.latest = *seq;
        let p: serde_json::Value = serde_json::from_slice(e.payload_bytes()).unwrap();
        let run = p["run_id"].as_str().unwrap_or("").to_owned();
        let req = t.review_required;
        let ensure = |t: &mut RefTask| {
            if !t.runs.contains_key(&run) {
                t.runs
                    .insert(run.clone(), ("running".into(), "none".into(), false, req));
                if t.current.is_none() {
                    t.current = Some(run.clone());
                }
            }
        };
        let set = |t: &mut RefTask, s: &str| {
            if !t.canceled {
                t.status = s.into();
            }
        };
        match e.event_type.as_str() {
            "task.created" => t.review_required = p["review_required"].as_bool().unwrap_or(false),
            "task.run_started" => {
                ensure(t);
                t.current = Some(run.clone());
                set(t, "running");
            }
            ty @ ("task.run_completed" | "task.run_failed" | "task.run_canceled") => {
                ensure(t);
                let outcome = match ty {
                    "task.run_completed" => "completed",
                    "task.run_failed" => "failed",
                    _ => "canceled",
                };
                let r = t.runs.get_mut(&run).unwrap();
                r.0 = outcome.into();
                let gated = t.review_required || r.3 || r.2;
                let awaiting = outcome == "completed" && gated && r.1 != "approved";
                if t.current.as_deref() == Some(&run) {
                    set(t, if awaiting { "awaiting_review" } else { outcome });
                }
            }
            "task.run_review_requested" => {
                ensure(t);
                let r = t.runs.get_mut(&run).unwrap();
                r.2 = true;
                r.1 = "pending".into();
                if t.current.as_deref() == Some(&run) {
                    set(t, "awaiting_review");
                }
            }
            "task.run_review_approved" => {
                ensure(t);
                t.runs.get_mut(&run).unwrap().1 = "approved".into();
                if t.current.as_deref() == Some(&run) {
                    set(t, "completed");
                }
            }
            "task.run_review_rejected" => {
                ensure(t);
                let c = p["continuation"].as_bool().unwrap_or(false);
                let r = t.runs.get_mut(&run).unwrap();
                r.1 = "rejected".into();
                if c {
                    r.0 = "running".into();
                }
                if t.current.as_deref() == Some(&run) {
                    set(t, if c { "running" } else { "open" });
                }
            }
            "task.canceled" => {
                set(t, "canceled");
                t.canceled = true;
            }
            _ => {}
        }
    }
    m
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn live_equals_rebuild_and_reference(ops in proptest::collection::vec(op(), 1..50), chunked in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let rt = rt();
        let mut cfg = LogConfig::new(dir.path().join("log.redb"));
        cfg.cache_bytes = 4 << 20;
        cfg.merge_threshold = 7;
        let (log, _) = Log::open_with(&cfg, vec![tidemark_projections::projector()]).unwrap();
        let mut sent: Vec<NewEvent> = Vec::new();
        let mut stored: Vec<(u64, NewEvent)> = Vec::new();
        let mut pending: Vec<NewEvent> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let ev = match op {
                Op::Repeat(k) if !sent.is_empty() => sent[k % sent.len()].clone(),
                Op::Repeat(_) => continue,
                other => match to_event(i, other) { Some(e) => e, None => continue },
            };
            sent.push(ev.clone());
            pending.push(ev);
            // Flush in small batches, or one by one.
            if !chunked || pending.len() >= 3 {
                let batch = std::mem::take(&mut pending);
                match rt.block_on(log.append(batch.clone())) {
                    Ok(r) => {
                        for (e, a) in batch.into_iter().zip(r.events) {
                            if !a.duplicate { stored.push((a.seq, e)); }
                        }
                    }
                    // A batch repeating a notification id with other content conflicts: fine.
                    Err(tidemark_log::AppendError::Conflict { .. }) => {}
                    Err(e) => prop_assert!(false, "append failed: {e}"),
                }
            }
        }
        if !pending.is_empty() {
            let batch = std::mem::take(&mut pending);
            if let Ok(r) = rt.block_on(log.append(batch.clone())) {
                for (e, a) in batch.into_iter().zip(r.events) {
                    if !a.duplicate { stored.push((a.seq, e)); }
                }
            }
        }
        stored.sort_by_key(|(s, _)| *s);
        // The tasks model against the reference.
        let want = reference(&stored);
        for (id, rt_) in &want {
            let got = read::task(log.db(), id).unwrap().expect("task row");
            prop_assert_eq!(&got.status, &rt_.status, "status of {}", id);
            prop_assert_eq!(&got.current_run_id, &rt_.current);
            prop_assert_eq!(got.latest_event_seq, rt_.latest);
            prop_assert_eq!(got.runs.len(), rt_.runs.len());
            for r in &got.runs {
                let w = &rt_.runs[&r.run_id];
                prop_assert_eq!(&r.outcome, &w.0);
                prop_assert_eq!(&r.review.state, &w.1);
            }
        }
        // Every projection: verify (no swap) and rebuild (swap) are identical to live.
        let head = log.head();
        for p in tidemark_projections::all() {
            let before = read::projections(log.db(), head).unwrap().into_iter().find(|i| i.name == p.name()).unwrap();
            prop_assert_eq!(before.checkpoint, head);
            let v = rt.block_on(rebuild::rebuild(&log, p, false, |_, _| {})).unwrap();
            prop_assert!(v.identical, "verify of {} diverged at {:?}", p.name(), v.first_divergent_seq);
            prop_assert_eq!(&v.digest, &before.digest);
            let r = rt.block_on(rebuild::rebuild(&log, p, true, |_, _| {})).unwrap();
            prop_assert!(r.identical);
            prop_assert_eq!(r.events_replayed, head);
            let after = read::projections(log.db(), head).unwrap().into_iter().find(|i| i.name == p.name()).unwrap();
            prop_assert_eq!(&after.digest, &before.digest);
            prop_assert_eq!(after.generation, before.generation + 1);
        }
        // After the swap the read model still answers the same.
        for (id, rt_) in &want {
            let got = read::task(log.db(), id).unwrap().expect("task row after rebuild");
            prop_assert_eq!(&got.status, &rt_.status);
        }
        rt.block_on(log.close());
    }
}

/// A rebuild that differs from the live model names the first seq where they part. The live
/// model is tampered with by folding one event twice into it (as a buggy projection would).
#[test]
fn divergence_is_located() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let cfg = LogConfig::new(dir.path().join("log.redb"));
    let (log, _) = Log::open_with(&cfg, vec![tidemark_projections::projector()]).unwrap();
    for i in 0..5 {
        let e = NewEvent::new(
            None,
            "task_events",
            format!("t{i}"),
            "task.created",
            &json!({"project_id": "p"}),
        )
        .unwrap();
        rt.block_on(log.append(vec![e])).unwrap();
    }
    rt.block_on(log.close());
    drop(log);
    // Tamper: rewrite the live digest recorded at seq 3 directly in the file.
    {
        let db = redb::Database::open(dir.path().join("log.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<u64, &[u8]> =
                redb::TableDefinition::new("p.tasks.digests.g0");
            let mut t = txn.open_table(def).unwrap();
            t.insert(3u64, [7u8; 32].as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let (log, _) = Log::open_with(&cfg, vec![tidemark_projections::projector()]).unwrap();
    let p = tidemark_projections::by_name("tasks").unwrap();
    let v = rt
        .block_on(rebuild::rebuild(&log, p, false, |_, _| {}))
        .unwrap();
    assert!(!v.identical);
    assert_eq!(v.first_divergent_seq, Some(3));
    rt.block_on(log.close());
}

/// The story: a rebuild chunk used to read the log through its own read transaction, while
/// the writer had grouped it with appends that were staged but not committed. Those events
/// were skipped, the checkpoint still moved past them, and after the swap the model lacked
/// acknowledged writes. Rebuilds now read through the writer's transaction; this test runs
/// rebuilds and verifies while appenders keep the writer's groups full.
#[test]
fn rebuild_under_concurrent_appends_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let cfg = LogConfig::new(dir.path().join("log.redb"));
    let (log, _) = Log::open_with(&cfg, vec![tidemark_projections::projector()]).unwrap();
    rt.block_on(async {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut appenders = Vec::new();
        for a in 0..8 {
            let log = log.clone();
            let stop = stop.clone();
            appenders.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let e = NewEvent::new(
                        None,
                        "task_events",
                        format!("t{a}-{n}"),
                        "task.created",
                        &json!({"project_id": "p"}),
                    )
                    .unwrap();
                    log.append(vec![e]).await.unwrap();
                    n += 1;
                }
                n
            }));
        }
        let p = tidemark_projections::by_name("tasks").unwrap();
        for i in 0..12 {
            let r = rebuild::rebuild(&log, p, i % 2 == 0, |_, _| {})
                .await
                .unwrap();
            assert!(
                r.identical,
                "round {i}: diverged at {:?}",
                r.first_divergent_seq
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut total = 0;
        for a in appenders {
            total += a.await.unwrap();
        }
        let (tasks, _) = read::tasks(
            log.db(),
            &read::TaskFilter {
                limit: 100_000,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            tasks.len() as u64,
            total,
            "every acknowledged task.created is in the model"
        );
        let info = read::projections(log.db(), log.head()).unwrap();
        assert!(info.iter().all(|i| i.lag == 0));
        log.close().await;
    });
}

/// A projection whose stored format is older than the code (its `version` differs) is rebuilt
/// from the log at open, into a new generation, rather than folded on rows of another shape.
/// The stored version is rewritten in the file to stand in for a release that bumped it.
#[test]
fn an_old_projection_format_is_rebuilt_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let cfg = LogConfig::new(dir.path().join("log.redb"));
    let (log, _) = Log::open_with(&cfg, vec![tidemark_projections::projector()]).unwrap();
    for i in 0..20 {
        let e = NewEvent::new(
            None,
            "task_events",
            format!("t{i}"),
            "task.created",
            &json!({"project_id": "p"}),
        )
        .unwrap();
        rt.block_on(log.append(vec![e])).unwrap();
    }
    let before = read::projections(log.db(), log.head()).unwrap();
    rt.block_on(log.close());
    drop(log);
    {
        let db = redb::Database::open(dir.path().join("log.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("projections");
            let mut t = txn.open_table(def).unwrap();
            let mut m: tidemark_projections::Meta = postcard::from_bytes(
                redb::ReadableTable::get(&t, "tasks")
                    .unwrap()
                    .unwrap()
                    .value(),
            )
            .unwrap();
            m.version = 0;
            let bytes = postcard::to_stdvec(&m).unwrap();
            t.insert("tasks", bytes.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let (log, _) = Log::open_with(&cfg, vec![tidemark_projections::projector()]).unwrap();
    let after = read::projections(log.db(), log.head()).unwrap();
    let (b, a) = (&before[0], &after[0]);
    assert_eq!(a.name, "tasks");
    assert_eq!(
        a.generation,
        b.generation + 1,
        "rebuilt into a new generation"
    );
    assert_eq!(a.digest, b.digest, "the same log folds to the same model");
    assert_eq!(a.lag, 0);
    assert_eq!(
        read::task(log.db(), "t19")
            .unwrap()
            .unwrap()
            .project_id
            .as_deref(),
        Some("p")
    );
    rt.block_on(log.close());
}
