//! The log against its invariants, on a real redb file: I1 (dense, durable order) and I2
//! (idempotent, atomic append), across group commits, index merges and reopens.

mod common;
use common::rt;
use std::collections::HashMap;
use tidemark_log::EventLog;
use tidemark_log::Lookups;

use proptest::prelude::*;
use serde_json::json;
use tidemark_log::{AppendError, Log, LogConfig, NewEvent, ReadQuery};

fn ev(id: Option<&str>, subject: &str, ty: &str, payload: serde_json::Value) -> NewEvent {
    NewEvent::new(id.map(str::to_owned), "task_events", subject, ty, &payload).unwrap()
}

fn cfg(dir: &tempfile::TempDir, merge_threshold: usize) -> LogConfig {
    let mut c = LogConfig::new(dir.path().join("log.redb"));
    c.merge_threshold = merge_threshold;
    c.cache_bytes = 8 * 1024 * 1024;
    c
}

/// A config whose redb file and journal are fault stores; the journal's, to hold or break.
fn on_fault_stores(dir: &tempfile::TempDir) -> (LogConfig, tidemark_log::fault::FaultStore) {
    use tidemark_log::fault::FaultStore;
    let mut c = cfg(dir, 100);
    let journal = FaultStore::new();
    c.storage = tidemark_log::storage::Storage::Stores {
        db: std::sync::Arc::new(FaultStore::new()),
        journal: [
            std::sync::Arc::new(journal.clone()),
            std::sync::Arc::new(journal.sibling()),
        ],
    };
    (c, journal)
}

fn all(log: &Log, q: ReadQuery) -> Vec<tidemark_log::Event> {
    let mut out = Vec::new();
    let mut q = q;
    q.limit = 7;
    loop {
        let page = log.read(&q).unwrap();
        out.extend(page.events);
        if page.next_after >= page.head {
            return out;
        }
        assert!(page.next_after > q.after, "a read must make progress");
        q.after = page.next_after;
    }
}

#[test]
fn dense_idempotent_and_atomic() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let (log, rep) = Log::open(&cfg(&dir, 3)).unwrap();
        assert_eq!(rep.head, 0);
        let r = log
            .append(vec![
                ev(Some("a"), "t1", "x.y", json!({"k": 1})),
                ev(None, "t2", "x.y", json!({})),
            ])
            .await
            .unwrap();
        assert_eq!(
            r.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(r.last_seq, 2);
        assert!(r.events[1].event_id.starts_with("evt-"));
        // Same id, same content (other key order): duplicate naming the original seq.
        let payload: serde_json::Value = serde_json::from_str(r#"{ "k" : 1 }"#).unwrap();
        let d = log
            .append(vec![ev(Some("a"), "t1", "x.y", payload)])
            .await
            .unwrap();
        assert_eq!(d.events[0].seq, 1);
        assert!(d.events[0].duplicate);
        // Same id, other content, in a batch with a new event: the whole batch is refused.
        let c = log
            .append(vec![
                ev(Some("b"), "t1", "x.y", json!({})),
                ev(Some("a"), "t1", "x.y", json!({"k": 2})),
            ])
            .await
            .unwrap_err();
        assert!(matches!(c, AppendError::Conflict { seq: 1, .. }), "{c:?}");
        assert_eq!(log.head(), 2);
        assert!(log.get(3).unwrap().is_none());
        // A batch repeating an id it introduces: the second is a duplicate of the first.
        let r = log
            .append(vec![
                ev(Some("c"), "t1", "x.y", json!({})),
                ev(Some("c"), "t1", "x.y", json!({})),
            ])
            .await
            .unwrap();
        assert_eq!(
            (r.events[0].seq, r.events[1].seq, r.events[1].duplicate),
            (3, 3, true)
        );
        // Enough events to merge the tail several times; ids stay deduplicated across merges.
        for i in 0..10 {
            log.append(vec![ev(
                Some(&format!("m{i}")),
                "t3",
                "x.z",
                json!({"i": i}),
            )])
            .await
            .unwrap();
        }
        let d = log
            .append(vec![
                ev(Some("b2"), "t1", "x.y", json!({})),
                ev(Some("m0"), "t3", "x.z", json!({"i": 0})),
            ])
            .await
            .unwrap();
        assert!(d.events[1].duplicate);
        assert_eq!(d.events[1].seq, 4);
        let t3 = all(
            &log,
            ReadQuery {
                subject: Some("t3".into()),
                ..Default::default()
            },
        );
        assert_eq!(t3.len(), 10);
        let t1 = all(
            &log,
            ReadQuery {
                subject: Some("t1".into()),
                ..Default::default()
            },
        );
        assert_eq!(t1.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 3, 14]);
        let xz = all(
            &log,
            ReadQuery {
                event_type: Some("x.z".into()),
                ..Default::default()
            },
        );
        assert_eq!(xz.len(), 10);
        let none = all(
            &log,
            ReadQuery {
                stream: Some("other".into()),
                subject: Some("t1".into()),
                ..Default::default()
            },
        );
        assert!(none.is_empty());
        log.close().await;
    });
    // Reopen: same content, ids still known, seqs continue densely.
    rt().block_on(async {
        let (log, rep) = Log::open(&cfg(&dir, 3)).unwrap();
        assert_eq!(rep.head, 14);
        let d = log
            .append(vec![ev(Some("a"), "t1", "x.y", json!({"k": 1}))])
            .await
            .unwrap();
        assert_eq!((d.events[0].seq, d.events[0].duplicate), (1, true));
        let n = log
            .append(vec![ev(None, "t1", "x.y", json!({}))])
            .await
            .unwrap();
        assert_eq!(n.events[0].seq, 15);
        let events = all(&log, ReadQuery::default());
        assert_eq!(
            events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=15).collect::<Vec<_>>()
        );
        let times: Vec<i64> = events.iter().map(|e| e.time_us).collect();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "time never goes backwards along seq"
        );
        log.close().await;
    });
}

#[test]
fn concurrent_appenders_get_dense_unique_seqs() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let (log, _) = Log::open(&cfg(&dir, 500)).unwrap();
        let mut tasks = Vec::new();
        for t in 0..64 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..40 {
                    let id = format!("w{t}-{i}");
                    let r = log
                        .append(vec![ev(
                            Some(&id),
                            &format!("s{}", i % 5),
                            "x.y",
                            json!({"t": t}),
                        )])
                        .await
                        .unwrap();
                    seqs.push((id, r.events[0].seq));
                }
                seqs
            }));
        }
        let mut got: Vec<(String, u64)> = Vec::new();
        for t in tasks {
            got.extend(t.await.unwrap());
        }
        let mut seqs: Vec<u64> = got.iter().map(|g| g.1).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=64 * 40).collect::<Vec<_>>());
        let events = all(&log, ReadQuery::default());
        let by_seq: HashMap<u64, String> =
            events.into_iter().map(|e| (e.seq, e.event_id)).collect();
        for (id, seq) in got {
            assert_eq!(by_seq[&seq], id);
        }
        log.close().await;
    });
}

/// I2 across the id index's compactions, made in steps between the indexer's commits while
/// appends go on: with a merge every 4 events, 1,600 ids make hundreds of runs merged into
/// levels 1 to 3, across a reopen; every id resent afterwards is answered as a duplicate at
/// its first seq.
#[test]
fn ids_stay_unique_across_compactions_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let append_all = |log: &Log, round: usize| {
        let mut tasks = Vec::new();
        for t in 0..16 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..50 {
                    let id = format!("r{round}-w{t}-{i}");
                    let r = log
                        .append(vec![ev(Some(&id), "s", "x.y", json!({"i": i}))])
                        .await
                        .unwrap();
                    got.push((id, r.events[0].seq, r.events[0].duplicate));
                }
                got
            }));
        }
        tasks
    };
    rt().block_on(async {
        let mut first: Vec<(String, u64)> = Vec::new();
        for round in 0..2 {
            let (log, _) = Log::open(&cfg(&dir, 4)).unwrap();
            for t in append_all(&log, round) {
                for (id, seq, dup) in t.await.unwrap() {
                    assert!(!dup, "{id}");
                    first.push((id, seq));
                }
            }
            log.close().await;
        }
        let (log, _) = Log::open(&cfg(&dir, 4)).unwrap();
        assert_eq!(log.head(), 1600);
        for round in 0..2 {
            for t in append_all(&log, round) {
                for (id, seq, dup) in t.await.unwrap() {
                    assert!(dup, "{id} appended twice, at {seq}");
                    let want = first.iter().find(|f| f.0 == id).unwrap().1;
                    assert_eq!(seq, want, "{id}");
                }
            }
        }
        assert_eq!(log.head(), 1600);
        log.close().await;
    });
}

#[derive(Debug, Clone)]
enum Op {
    /// A batch of (id index, content variant, subject index); id None = server-made id.
    Append(Vec<(Option<u8>, u8, u8)>),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => proptest::collection::vec((proptest::option::weighted(0.8, 0u8..12), 0u8..2, 0u8..3), 1..5).prop_map(Op::Append),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random interleavings of appends, duplicates, conflicting ids and reopens, checked against
    /// a model: seqs dense from 1, duplicates return the first seq, conflicts change nothing.
    #[test]
    fn log_matches_model(ops in proptest::collection::vec(op(), 1..25), threshold in 1usize..6) {
        let dir = tempfile::tempdir().unwrap();
        let rt = rt();
        // Model: seq-ordered list of (event_id, subject, variant).
        let mut model: Vec<(String, u8, u8)> = Vec::new();
        let mut log = Some(rt.block_on(async { Log::open(&cfg(&dir, threshold)).unwrap().0 }));
        for op in ops {
            match op {
                Op::Reopen => {
                    let l = log.take().unwrap();
                    rt.block_on(l.close());
                    drop(l);
                    log = Some(Log::open(&cfg(&dir, threshold)).unwrap().0);
                }
                Op::Append(batch) => {
                    let l = log.as_ref().unwrap();
                    let events: Vec<NewEvent> = batch.iter().map(|(id, v, s)| {
                        ev(id.map(|i| format!("id{i}")).as_deref(), &format!("s{s}"), "x.y", json!({"v": v}))
                    }).collect();
                    // Expected outcome from the model.
                    let mut staged: Vec<(String, u8, u8)> = Vec::new();
                    let mut expect: Result<Vec<(u64, bool)>, u64> = Ok(Vec::new());
                    for (id, v, s) in &batch {
                        let Some(i) = id else {
                            let seq = (model.len() + staged.len() + 1) as u64;
                            staged.push((String::new(), *s, *v));
                            if let Ok(e) = &mut expect { e.push((seq, false)); }
                            continue;
                        };
                        let id = format!("id{i}");
                        let found = model.iter().chain(staged.iter()).position(|m| m.0 == id);
                        match found {
                            Some(p) => {
                                let orig = if p < model.len() { &model[p] } else { &staged[p - model.len()] };
                                if orig.1 == *s && orig.2 == *v {
                                    if let Ok(e) = &mut expect { e.push((p as u64 + 1, true)); }
                                } else if expect.is_ok() {
                                    expect = Err(p as u64 + 1);
                                }
                            }
                            None => {
                                let seq = (model.len() + staged.len() + 1) as u64;
                                staged.push((id, *s, *v));
                                if let Ok(e) = &mut expect { e.push((seq, false)); }
                            }
                        }
                    }
                    let got = rt.block_on(l.append(events));
                    match (expect, got) {
                        (Ok(want), Ok(r)) => {
                            let got: Vec<(u64, bool)> = r.events.iter().map(|e| (e.seq, e.duplicate)).collect();
                            prop_assert_eq!(want, got);
                            for (i, e) in r.events.iter().enumerate() {
                                if !e.duplicate && batch[i].0.is_none() {
                                    // Record the server-made id in the model.
                                    let pos = (e.seq as usize) - model.len() - 1;
                                    staged[pos].0 = e.event_id.clone();
                                }
                            }
                            model.extend(staged);
                        }
                        (Err(seq), Err(AppendError::Conflict { seq: got, .. })) => prop_assert_eq!(seq, got),
                        (want, got) => prop_assert!(false, "model {:?} but log {:?}", want, got),
                    }
                }
            }
            let l = log.as_ref().unwrap();
            prop_assert_eq!(l.head(), model.len() as u64);
        }
        let l = log.as_ref().unwrap();
        let events = all(l, ReadQuery::default());
        prop_assert_eq!(events.len(), model.len());
        for (e, m) in events.iter().zip(&model) {
            prop_assert_eq!(&e.event_id, &m.0);
            prop_assert_eq!(&e.subject, &format!("s{}", m.1));
        }
        for s in 0..3u8 {
            let subject = format!("s{s}");
            let got: Vec<u64> = all(l, ReadQuery { subject: Some(subject.clone()), ..Default::default() }).iter().map(|e| e.seq).collect();
            let want: Vec<u64> = model.iter().enumerate().filter(|(_, m)| m.1 == s).map(|(i, _)| i as u64 + 1).collect();
            prop_assert_eq!(got, want);
        }
        rt.block_on(l.close());
    }
}

/// I8: when the writer's queue is full an append is refused at once with `Overloaded`
/// (retryable) and nothing of it is appended; accepted appends are not dropped. The writer is
/// held busy inside a commit (its journal's sync held on a fault store), so the queue fills
/// deterministically.
#[test]
fn a_full_queue_refuses_explicitly_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, journal) = on_fault_stores(&dir);
    c.queue_capacity = 2;
    rt().block_on(async {
        let (log, _) = Log::open(&c).unwrap();
        journal.hold_syncs(true);
        let busy = {
            let log = log.clone();
            tokio::spawn(async move {
                log.append(vec![ev(Some("q0"), "s", "x.y", json!({}))])
                    .await
            })
        };
        while journal.syncs_waiting() == 0 {
            tokio::task::yield_now().await;
        }
        // The writer is inside the command: two appends fill the queue, the third is refused.
        let a = tokio::spawn({
            let log = log.clone();
            async move {
                log.append(vec![ev(Some("q1"), "s", "x.y", json!({}))])
                    .await
            }
        });
        let b = tokio::spawn({
            let log = log.clone();
            async move {
                log.append(vec![ev(Some("q2"), "s", "x.y", json!({}))])
                    .await
            }
        });
        // Let both reach the channel.
        while log.queued() < 2 {
            tokio::task::yield_now().await;
        }
        let refused = log
            .append(vec![ev(Some("q3"), "s", "x.y", json!({}))])
            .await
            .unwrap_err();
        assert!(
            matches!(refused, AppendError::Overloaded { .. }),
            "{refused:?}"
        );
        assert!(refused.is_retryable());
        journal.hold_syncs(false);
        assert_eq!(busy.await.unwrap().unwrap().events[0].seq, 1);
        let mut seqs = vec![
            a.await.unwrap().unwrap().events[0].seq,
            b.await.unwrap().unwrap().events[0].seq,
        ];
        seqs.sort_unstable();
        assert_eq!(seqs, vec![2, 3]);
        let ids: Vec<String> = all(&log, ReadQuery::default())
            .into_iter()
            .map(|e| e.event_id)
            .collect();
        assert!(
            !ids.contains(&"q3".to_owned()),
            "the refused append is not in the log"
        );
        // Once the queue drains, the same append is accepted.
        let r = log
            .append(vec![ev(Some("q3"), "s", "x.y", json!({}))])
            .await
            .unwrap();
        assert_eq!(r.events[0].seq, 4);
        log.close().await;
    });
}

/// Every event `q` matches, read in pages of 1000.
fn pages(log: &Log, mut q: ReadQuery) -> Vec<tidemark_log::Event> {
    let mut out = Vec::new();
    q.limit = 1000;
    loop {
        let page = log.read(&q).unwrap();
        out.extend(page.events);
        if page.next_after >= page.head {
            return out;
        }
        q.after = page.next_after;
    }
}

/// A type filter reads the type index, and a stream filter alone the stream index (merged runs
/// and the in-memory tail alike): a page holds up to `limit` matches whenever they exist,
/// however many other events lie between them, and every read agrees with a full scan. A log
/// written before the indexes existed is indexed at its first open and answers the same.
#[test]
fn a_type_filter_fills_its_page_from_the_index() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(&cfg(&dir, 5_000)).unwrap();
    let mut rare = Vec::new();
    for chunk in 0..30u64 {
        let mut batch: Vec<NewEvent> = (0..998)
            .map(|i| {
                ev(
                    None,
                    &format!("s{}", i % 7),
                    "common.happened",
                    json!({"i": i}),
                )
            })
            .collect();
        if chunk % 10 == 9 {
            batch.push(ev(None, "r", "rare.happened", json!({"chunk": chunk})));
            batch.push(
                NewEvent::new(None, "other_stream", "r", "rare.happened", &json!({})).unwrap(),
            );
        }
        let r = rt.block_on(log.append(batch)).unwrap();
        if chunk % 10 == 9 {
            rare.push(r.last_seq - 1);
            rare.push(r.last_seq);
        }
    }
    let check = |log: &Log, what: &str| {
        let q = ReadQuery {
            event_type: Some("rare.happened".into()),
            limit: 100,
            ..ReadQuery::default()
        };
        let page = log.read(&q).unwrap();
        let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, rare, "{what}: one page holds every match");
        // With a stream too, and against a full scan with every combination.
        let q = ReadQuery {
            event_type: Some("rare.happened".into()),
            stream: Some("task_events".into()),
            limit: 100,
            ..ReadQuery::default()
        };
        let want: Vec<u64> = rare.iter().copied().step_by(2).collect();
        let got: Vec<u64> = log.read(&q).unwrap().events.iter().map(|e| e.seq).collect();
        assert_eq!(got, want, "{what}: type and stream");
        // A rare stream alone: one page.
        let q = ReadQuery {
            stream: Some("other_stream".into()),
            limit: 100,
            ..ReadQuery::default()
        };
        let want: Vec<u64> = rare.iter().copied().skip(1).step_by(2).collect();
        let got: Vec<u64> = log.read(&q).unwrap().events.iter().map(|e| e.seq).collect();
        assert_eq!(got, want, "{what}: a stream alone");
        for (ty, stream) in [
            (Some("rare.happened"), None),
            (Some("common.happened"), Some("task_events")),
            (Some("nothing.happened"), None),
            (None, Some("task_events")),
            (None, Some("other_stream")),
            (None, Some("no_stream")),
        ] {
            let q = ReadQuery {
                event_type: ty.map(str::to_owned),
                stream: stream.map(str::to_owned),
                after: 2_500,
                ..ReadQuery::default()
            };
            let scan: Vec<u64> = pages(
                log,
                ReadQuery {
                    after: 2_500,
                    ..ReadQuery::default()
                },
            )
            .into_iter()
            .filter(|e| {
                ty.is_none_or(|t| t == e.event_type) && stream.is_none_or(|s| s == e.stream)
            })
            .map(|e| e.seq)
            .collect();
            let got: Vec<u64> = pages(log, q).iter().map(|e| e.seq).collect();
            assert_eq!(got, scan, "{what}: {ty:?} {stream:?}");
        }
    };
    check(&log, "live");
    rt.block_on(log.close());
    drop(log);
    // As an earlier release left it: no posting blocks, a subject index of one row per event
    // (dropped at the open), no type or stream index.
    let meta = redb::TableDefinition::<&str, u64>::new("log_meta");
    {
        let db = redb::Database::create(dir.path().join("log.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        for table in ["subject_blocks", "type_blocks", "stream_blocks"] {
            assert!(
                txn.delete_table(redb::TableDefinition::<(&str, u64), &[u8]>::new(table))
                    .unwrap(),
                "{table}"
            );
        }
        txn.open_table(redb::TableDefinition::<(&str, u64), &str>::new(
            "subject_seq",
        ))
        .unwrap()
        .insert(("a subject", 1), "a stream")
        .unwrap();
        txn.open_table(meta)
            .unwrap()
            .remove("posting_blocks")
            .unwrap()
            .expect("the blocks' marker");
        txn.commit().unwrap();
    }
    let (log, _) = Log::open(&cfg(&dir, 5_000)).unwrap();
    check(&log, "reopened without the index");
    rt.block_on(log.close());
    drop(log);
    let db = redb::Database::create(dir.path().join("log.redb")).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    assert!(
        txn.open_table(redb::TableDefinition::<(&str, u64), &str>::new(
            "subject_seq"
        ))
        .is_err(),
        "the earlier release's index is gone"
    );
    let marker = txn.open_table(meta).unwrap().get("posting_blocks").unwrap();
    assert_eq!(marker.map(|g| g.value()), Some(1));
}

/// Every combination of subject, type and stream is one leapfrog join over their indexes: a
/// page holds up to `limit` matches however far apart they are. Here the rare matches of a
/// subject with a type, or with a stream, stand behind 25,000 events of the same subject that
/// do not match (the old reader checked at most 20,000 candidates per page and answered an
/// empty page with a cursor), in merged index runs and the in-memory tail alike.
#[test]
fn combined_filters_fill_their_page_from_the_indexes() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(&cfg(&dir, 5_000)).unwrap();
    let mut rare_type = Vec::new();
    let mut rare_stream = Vec::new();
    for chunk in 0..26u64 {
        let mut batch: Vec<NewEvent> = (0..990)
            .map(|i| ev(None, "hot", "common.happened", json!({"i": i})))
            .collect();
        if chunk == 25 || chunk == 12 {
            batch.push(ev(None, "hot", "rare.happened", json!({})));
            batch.push(
                NewEvent::new(None, "rare_stream", "hot", "common.happened", &json!({})).unwrap(),
            );
        }
        let r = rt.block_on(log.append(batch)).unwrap();
        if chunk == 25 || chunk == 12 {
            rare_type.push(r.last_seq - 1);
            rare_stream.push(r.last_seq);
        }
    }
    let seqs = |q: ReadQuery| -> (Vec<u64>, u64, u64) {
        let page = log.read(&q).unwrap();
        (
            page.events.iter().map(|e| e.seq).collect(),
            page.next_after,
            page.head,
        )
    };
    let q = |subject: &str, ty: Option<&str>, stream: Option<&str>| ReadQuery {
        subject: Some(subject.into()),
        event_type: ty.map(str::to_owned),
        stream: stream.map(str::to_owned),
        limit: 1,
        ..ReadQuery::default()
    };
    let (got, next, _) = seqs(q("hot", Some("rare.happened"), None));
    assert_eq!(
        got,
        rare_type[..1],
        "subject and type: the first page holds the first match"
    );
    assert_eq!(next, rare_type[0]);
    let (got, next, head) = seqs(ReadQuery {
        after: next,
        ..q("hot", Some("rare.happened"), None)
    });
    assert_eq!(got, rare_type[1..], "and the next page the second");
    assert_eq!(next, rare_type[1]);
    let (got, next, _) = seqs(ReadQuery {
        after: next,
        ..q("hot", Some("rare.happened"), None)
    });
    assert!(got.is_empty());
    assert_eq!(next, head, "an empty page is the end");
    let (got, _, _) = seqs(ReadQuery {
        limit: 10,
        ..q("hot", None, Some("rare_stream"))
    });
    assert_eq!(got, rare_stream, "subject and stream");
    let (got, _, _) = seqs(ReadQuery {
        limit: 10,
        ..q("hot", Some("common.happened"), Some("rare_stream"))
    });
    assert_eq!(got, rare_stream, "subject, type and stream");
    let (got, _, _) = seqs(ReadQuery {
        limit: 10,
        ..q("hot", Some("rare.happened"), Some("rare_stream"))
    });
    assert!(got.is_empty(), "no event is in all three");
    rt.block_on(log.close());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random events over small alphabets of subjects, types and streams, with index merges
    /// between the appends: every filter combination, paged with any limit, gives exactly the
    /// matches of a full scan, and every page but the last holds `limit` of them.
    #[test]
    fn filtered_pages_are_the_scan_filtered(
        events in proptest::collection::vec((0..4u8, 0..3u8, 0..3u8), 1..400),
        merge in 5usize..200,
        queries in proptest::collection::vec(
            (proptest::option::of(0..5u8), proptest::option::of(0..4u8), proptest::option::of(0..4u8), 1usize..9, 0u64..50),
            1..8,
        ),
    ) {
        let rt = rt();
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = Log::open(&cfg(&dir, merge)).unwrap();
        for chunk in events.chunks(37) {
            let batch: Vec<NewEvent> = chunk
                .iter()
                .map(|(s, t, st)| {
                    NewEvent::new(None, format!("st{st}"), format!("s{s}"), format!("t{t}.x"), &json!({}))
                        .unwrap()
                })
                .collect();
            rt.block_on(log.append(batch)).unwrap();
        }
        let scan = pages(&log, ReadQuery::default());
        for (s, t, st, limit, after) in queries {
            let subject = s.map(|s| format!("s{s}"));
            let ty = t.map(|t| format!("t{t}.x"));
            let stream = st.map(|st| format!("st{st}"));
            let want: Vec<u64> = scan
                .iter()
                .filter(|e| e.seq > after)
                .filter(|e| subject.as_deref().is_none_or(|s| s == e.subject))
                .filter(|e| ty.as_deref().is_none_or(|t| t == e.event_type))
                .filter(|e| stream.as_deref().is_none_or(|s| s == e.stream))
                .map(|e| e.seq)
                .collect();
            let mut q = ReadQuery { after, limit, subject, event_type: ty, stream, tenant: None };
            let mut got = Vec::new();
            loop {
                let page = log.read(&q).unwrap();
                let n = page.events.len();
                got.extend(page.events.iter().map(|e| e.seq));
                if page.next_after >= page.head {
                    break;
                }
                prop_assert_eq!(n, limit, "a page before the end is full");
                prop_assert!(page.next_after > q.after);
                q.after = page.next_after;
            }
            prop_assert_eq!(got, want);
        }
        rt.block_on(log.close());
    }
}

/// I10: a writer that panics (here: code under it, a store, panics inside a group commit)
/// poisons the log. The append in flight and every later one are refused as `Poisoned` with
/// the panic named, never answered `Closed` as if the log had been shut down on purpose, and
/// what was acknowledged before is still read.
#[test]
fn a_panicking_writer_poisons_the_log() {
    use tidemark_log::fault::Op;
    let dir = tempfile::tempdir().unwrap();
    let (c, journal) = on_fault_stores(&dir);
    rt().block_on(async {
        let (log, _) = Log::open(&c).unwrap();
        log.append(vec![ev(Some("p1"), "s", "x.y", json!({}))])
            .await
            .unwrap();
        journal.panic_on(Op::Write);
        let in_flight = log
            .append(vec![ev(Some("p2"), "s", "x.y", json!({}))])
            .await
            .unwrap_err();
        assert!(
            matches!(&in_flight, AppendError::Poisoned(why) if why.to_string().contains("panicked")),
            "{in_flight:?}"
        );
        assert!(log.is_poisoned());
        let later = log
            .append(vec![ev(Some("p3"), "s", "x.y", json!({}))])
            .await
            .unwrap_err();
        assert!(matches!(later, AppendError::Poisoned(_)), "{later:?}");
        let ids: Vec<String> = all(&log, ReadQuery::default())
            .into_iter()
            .map(|e| e.event_id)
            .collect();
        assert_eq!(ids, vec!["p1".to_owned()]);
    });
}

/// Two owners of one log may each close it (two engines over one log do): the second close,
/// and any job after the first, are answered at once, not left waiting for a stopped indexer.
#[test]
fn closing_twice_returns_and_later_calls_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let (log, _) = Log::open(&cfg(&dir, 100)).unwrap();
        let other = log.clone();
        log.append(vec![ev(Some("c1"), "t", "x.y", json!({}))])
            .await
            .unwrap();
        let closed = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            log.close().await;
            other.close().await;
        })
        .await;
        assert!(closed.is_ok(), "a second close hung");
        assert!(matches!(other.compact(1).await, Err(AppendError::Closed)));
        assert!(matches!(
            other
                .append(vec![ev(Some("c2"), "t", "x.y", json!({}))])
                .await,
            Err(AppendError::Closed)
        ));
    });
    let (log, rep) = Log::open(&cfg(&dir, 100)).unwrap();
    assert_eq!(
        (rep.head, rep.replayed),
        (1, 0),
        "a clean close leaves nothing to replay"
    );
    drop(log);
}

/// What a cursor still needs (`Lookups::next_of`, read from the merged index) is its tenant's:
/// another tenant's events of the same stream and subject are not.
#[test]
fn next_of_is_the_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let (log, _) = Log::open(&cfg(&dir, 16)).unwrap();
    let of = |t: &str, subject: &str| {
        NewEvent::new(None, "orders", subject, "order.placed", &json!({}))
            .unwrap()
            .in_tenant(t)
            .unwrap()
    };
    for (t, subject) in [
        ("default", "x"),
        ("acme", "x"),
        ("beta", "x"),
        ("beta", "y"),
    ] {
        rt.block_on(log.append(vec![of(t, subject)])).unwrap();
    }
    // Past the merge threshold, so the index tables hold them.
    for _ in 0..40 {
        rt.block_on(log.append(vec![of("zeta", "x")])).unwrap();
    }
    rt.block_on(log.flush_index()).unwrap();
    assert_eq!(
        log.next_of(Some("beta"), "orders", "x", 0).unwrap(),
        Some(3)
    );
    assert_eq!(log.next_of(Some("beta"), "orders", "", 3).unwrap(), Some(4));
    assert_eq!(log.next_of(Some("acme"), "orders", "x", 2).unwrap(), None);
    assert_eq!(log.next_of(None, "orders", "", 0).unwrap(), Some(1));
    assert_eq!(log.next_of(None, "orders", "", 1).unwrap(), None);
    rt.block_on(log.close());
}

/// An export names each event's tenant (the default tenant's lines are as before), and an
/// import puts every event back in its tenant: the same seqs, ids, tenants and bytes.
#[test]
fn export_and_import_keep_tenants() {
    let (dir, into) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let rt = rt();
    let (log, _) = Log::open(&cfg(&dir, 16)).unwrap();
    let of = |t: &str, id: &str| {
        NewEvent::new(
            Some(id.into()),
            "orders",
            "x",
            "order.placed",
            &json!({"id": id}),
        )
        .unwrap()
        .in_tenant(t)
        .unwrap()
    };
    for (t, id) in [
        ("default", "a"),
        ("acme", "a"),
        ("acme", "b"),
        ("default", "b"),
    ] {
        rt.block_on(log.append(vec![of(t, id)])).unwrap();
    }
    let mut out = Vec::new();
    tidemark_log::transfer::export(&log, 0, u64::MAX, &mut out).unwrap();
    let lines: Vec<serde_json::Value> = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let tenants: Vec<_> = lines.iter().map(|l| l.get("tenant").cloned()).collect();
    assert_eq!(
        tenants,
        [None, Some(json!("acme")), Some(json!("acme")), None]
    );
    let before = all(&log, ReadQuery::default());
    rt.block_on(log.close());
    let target = into.path().join("data");
    let cfg2 = LogConfig::in_dir(&target);
    rt.block_on(tidemark_log::transfer::import(
        &target,
        &cfg2,
        0,
        vec![(0, std::io::Cursor::new(out))],
    ))
    .unwrap();
    let (log, _) = Log::open(&cfg2).unwrap();
    let after = all(&log, ReadQuery::default());
    let key = |e: &tidemark_log::Event| {
        (
            e.seq,
            e.tenant.clone(),
            e.event_id.clone(),
            e.payload.get().to_owned(),
        )
    };
    assert_eq!(
        after.iter().map(key).collect::<Vec<_>>(),
        before.iter().map(key).collect::<Vec<_>>()
    );
    assert_eq!(
        log.get_by_id(Some("acme"), "b").unwrap().map(|e| e.seq),
        Some(3)
    );
    rt.block_on(log.close());
}
