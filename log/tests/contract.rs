//! The log contract: what every log backend must do, checked only through the narrow
//! [`EventLog`] interface (spec section 3), so a second backend (NATS JetStream, section 16)
//! runs the same suite by adding one [`Backend`] and one `contract!` line.
//!
//! Dense seqs from 1 (I1), idempotent appends and conflicts (I2), atomic batches (also across
//! `kill -9` in the middle of commits, with a child process that appends until it is killed),
//! reads by range and filters with paging, lookups by seq and by `event_id`, the commit
//! notifier, and everything surviving a reopen.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;
use tidemark_log::{
    AppendError, Condition, ConditionOn, Event, EventLog, Log, LogConfig, NewEvent, ReadQuery,
};

/// How the suite gets a backend's log: open (or reopen) the one kept in `dir`, close it.
trait Backend {
    type L: EventLog;
    fn open(dir: &Path) -> Self::L;
    fn close(log: Self::L, rt: &tokio::runtime::Runtime);
}

/// The embedded redb backend.
struct Redb;

impl Backend for Redb {
    type L = Log;
    fn open(dir: &Path) -> Log {
        // A small merge threshold, so lookups and conditions also go through the merged
        // indexes, not only the in-memory tail.
        let mut cfg = LogConfig::new(dir.join("log.redb"));
        cfg.merge_threshold = 16;
        Log::open(&cfg).expect("open the log").0
    }
    fn close(log: Log, rt: &tokio::runtime::Runtime) {
        rt.block_on(log.close());
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn ev(id: &str, stream: &str, subject: &str, ty: &str, payload: serde_json::Value) -> NewEvent {
    NewEvent::new(Some(id.into()), stream, subject, ty, &payload).expect("valid event")
}

/// Every event, read through pages of `limit` (checks that paging is gapless and ordered).
fn read_all<L: EventLog>(log: &L, mut q: ReadQuery, limit: usize) -> Vec<Event> {
    q.limit = limit;
    let mut out = Vec::new();
    loop {
        let page = log.read(&q).expect("read");
        assert!(page.events.len() <= limit, "a page holds at most its limit");
        for e in &page.events {
            assert!(
                e.seq > q.after && e.seq <= page.next_after,
                "event outside its page"
            );
        }
        out.extend(page.events);
        if page.next_after >= page.head {
            return out;
        }
        assert!(page.next_after > q.after, "paging must advance");
        q.after = page.next_after;
    }
}

fn dense_seqs_and_reads<B: Backend>() {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = B::open(dir.path());
    assert_eq!(log.head(), 0);
    let mut notified = log.subscribe();
    let r = rt
        .block_on(log.append(vec![ev("a", "s1", "x", "t.one", json!({"n": 1}))]))
        .unwrap();
    assert_eq!(
        (r.events[0].seq, r.events[0].duplicate, r.last_seq),
        (1, false, 1)
    );
    assert!(notified.has_changed().unwrap(), "the commit notifier fired");
    assert_eq!(*notified.borrow_and_update(), 1);
    let r = rt
        .block_on(log.append(vec![
            ev("b", "s1", "y", "t.two", json!({"n": 2})),
            ev("c", "s2", "x", "t.one", json!({"n": 3})),
            ev("d", "s1", "x", "t.two", json!({"n": 4})),
        ]))
        .unwrap();
    let seqs: Vec<u64> = r.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![2, 3, 4], "a batch takes the next seqs, in order");
    assert_eq!((r.last_seq, log.head()), (4, 4));
    // Every page size gives the same events, in order.
    for limit in [1, 2, 3, 1000] {
        let all = read_all(&log, ReadQuery::default(), limit);
        let ids: Vec<&str> = all.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "d"], "limit {limit}");
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
    }
    // Filters.
    let by = |stream: Option<&str>, subject: Option<&str>, ty: Option<&str>| {
        let q = ReadQuery {
            stream: stream.map(Into::into),
            subject: subject.map(Into::into),
            event_type: ty.map(Into::into),
            ..ReadQuery::default()
        };
        read_all(&log, q, 1)
            .iter()
            .map(|e| e.event_id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(by(Some("s1"), None, None), ["a", "b", "d"]);
    assert_eq!(by(Some("s1"), Some("x"), None), ["a", "d"]);
    assert_eq!(by(None, None, Some("t.one")), ["a", "c"]);
    assert_eq!(by(Some("s2"), Some("y"), None), Vec::<String>::new());
    // From a position.
    let q = ReadQuery {
        after: 2,
        ..ReadQuery::default()
    };
    assert_eq!(read_all(&log, q, 10).len(), 2);
    // Lookups.
    let c = log.get(3).unwrap().expect("seq 3");
    assert_eq!(
        (c.event_id.as_str(), c.stream.as_str(), c.subject.as_str()),
        ("c", "s2", "x")
    );
    assert_eq!(c.payload_value(), json!({"n": 3}));
    assert_eq!(log.get_by_id("c").unwrap().map(|e| e.seq), Some(3));
    assert!(log.get(5).unwrap().is_none() && log.get(0).unwrap().is_none());
    assert!(log.get_by_id("nope").unwrap().is_none());
    // Times never go backwards along seq.
    let all = read_all(&log, ReadQuery::default(), 100);
    assert!(all.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    B::close(log, &rt);
}

fn idempotent_appends_and_conflicts<B: Backend>() {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = B::open(dir.path());
    rt.block_on(log.append(vec![ev("a", "s", "x", "t", json!({"k": 1, "j": [1, 2]}))]))
        .unwrap();
    // The same event again (keys in another order): the original seq, nothing appended.
    let r = rt
        .block_on(log.append(vec![ev("a", "s", "x", "t", json!({"j": [1, 2], "k": 1}))]))
        .unwrap();
    assert_eq!(
        (r.events[0].seq, r.events[0].duplicate, log.head()),
        (1, true, 1)
    );
    // Other content under the same id, in any field: a conflict, nothing appended.
    for other in [
        ev("a", "s", "x", "t", json!({"k": 2, "j": [1, 2]})),
        ev("a", "s2", "x", "t", json!({"k": 1, "j": [1, 2]})),
        ev("a", "s", "y", "t", json!({"k": 1, "j": [1, 2]})),
        ev("a", "s", "x", "t2", json!({"k": 1, "j": [1, 2]})),
    ] {
        match rt.block_on(log.append(vec![other])) {
            Err(AppendError::Conflict { event_id, seq }) => {
                assert_eq!((event_id.as_str(), seq), ("a", 1))
            }
            r => panic!("expected a conflict, got {r:?}"),
        }
        assert_eq!(log.head(), 1);
    }
    // A batch with a conflict is refused whole: its new events are not in the log.
    let r = rt.block_on(log.append(vec![
        ev("new-1", "s", "x", "t", json!({})),
        ev("a", "s", "x", "t", json!({"k": 9})),
        ev("new-2", "s", "x", "t", json!({})),
    ]));
    assert!(matches!(r, Err(AppendError::Conflict { .. })), "{r:?}");
    assert_eq!(log.head(), 1);
    assert!(log.get_by_id("new-1").unwrap().is_none());
    // A batch with a duplicate of an earlier event and new ones: the duplicate keeps its seq.
    let r = rt
        .block_on(log.append(vec![
            ev("new-1", "s", "x", "t", json!({})),
            ev("a", "s", "x", "t", json!({"k": 1, "j": [1, 2]})),
            ev("new-2", "s", "x", "t", json!({})),
        ]))
        .unwrap();
    let got: Vec<(u64, bool)> = r.events.iter().map(|e| (e.seq, e.duplicate)).collect();
    assert_eq!(got, [(2, false), (1, true), (3, false)]);
    assert_eq!(log.head(), 3);
    // The same id twice inside one batch: the second is a duplicate of the first; with other
    // content, the batch is a conflict.
    let r = rt
        .block_on(log.append(vec![
            ev("twice", "s", "x", "t", json!({"v": 1})),
            ev("twice", "s", "x", "t", json!({"v": 1})),
        ]))
        .unwrap();
    let got: Vec<(u64, bool)> = r.events.iter().map(|e| (e.seq, e.duplicate)).collect();
    assert_eq!(got, [(4, false), (4, true)]);
    let r = rt.block_on(log.append(vec![
        ev("thrice", "s", "x", "t", json!({"v": 1})),
        ev("thrice", "s", "x", "t", json!({"v": 2})),
    ]));
    assert!(matches!(r, Err(AppendError::Conflict { .. })), "{r:?}");
    assert_eq!(log.head(), 4);
    // An empty batch is invalid.
    assert!(matches!(
        rt.block_on(log.append(vec![])),
        Err(AppendError::Invalid { .. })
    ));
    B::close(log, &rt);
}

fn everything_survives_a_reopen<B: Backend>() {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = B::open(dir.path());
    let batch: Vec<NewEvent> = (0..50)
        .map(|i| {
            ev(
                &format!("e{i}"),
                "s",
                &format!("sub{}", i % 3),
                "t",
                json!({"i": i}),
            )
        })
        .collect();
    rt.block_on(log.append(batch)).unwrap();
    let before = read_all(&log, ReadQuery::default(), 7);
    B::close(log, &rt);
    let log = B::open(dir.path());
    assert_eq!(log.head(), 50);
    let after = read_all(&log, ReadQuery::default(), 1000);
    assert_eq!(before.len(), after.len());
    for (a, b) in before.iter().zip(&after) {
        assert_eq!(
            (a.seq, &a.event_id, &a.subject, a.time_us, a.payload.get()),
            (b.seq, &b.event_id, &b.subject, b.time_us, b.payload.get())
        );
    }
    assert_eq!(log.get_by_id("e17").unwrap().map(|e| e.seq), Some(18));
    // Idempotency holds across the reopen.
    let r = rt
        .block_on(log.append(vec![ev("e3", "s", "sub0", "t", json!({"i": 3}))]))
        .unwrap();
    assert_eq!((r.events[0].seq, r.events[0].duplicate), (4, true));
    let r = rt
        .block_on(log.append(vec![ev("e51", "s", "x", "t", json!({}))]))
        .unwrap();
    assert_eq!(r.events[0].seq, 51, "seqs continue densely after a reopen");
    B::close(log, &rt);
}

fn conditional_appends<B: Backend>() {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = B::open(dir.path());
    let head_is = Condition::head;
    let subj = Condition::subject;
    // On the head.
    rt.block_on(log.append_if(vec![ev("h1", "s", "x", "t", json!({}))], head_is(0)))
        .unwrap();
    let r = rt.block_on(log.append_if(vec![ev("h2", "s", "x", "t", json!({}))], head_is(0)));
    match r {
        Err(AppendError::ExpectationFailed {
            on,
            expected,
            actual,
        }) => {
            assert_eq!((on, expected, actual), (ConditionOn::Head, 0, 1))
        }
        r => panic!("expected ExpectationFailed, got {r:?}"),
    }
    assert_eq!(log.head(), 1);
    assert!(
        log.get_by_id("h2").unwrap().is_none(),
        "a failed condition appends nothing"
    );
    // A retried conditional append that had succeeded is answered as a duplicate.
    let r = rt
        .block_on(log.append_if(vec![ev("h1", "s", "x", "t", json!({}))], head_is(0)))
        .unwrap();
    assert!(r.events[0].duplicate);
    // On a subject's last seq: other streams and subjects do not count.
    rt.block_on(log.append(vec![
        ev("o1", "other", "x", "t", json!({})),
        ev("o2", "s", "y", "t", json!({})),
    ]))
    .unwrap();
    let r = rt
        .block_on(log.append_if(vec![ev("c1", "s", "x", "t", json!({}))], subj("s", "x", 1)))
        .unwrap();
    assert_eq!(r.events[0].seq, 4);
    assert!(
        rt.block_on(log.append_if(vec![ev("c2", "s", "x", "t", json!({}))], subj("s", "x", 1)))
            .is_err()
    );
    assert!(
        rt.block_on(log.append_if(
            vec![ev("n1", "s", "new", "t", json!({}))],
            subj("s", "new", 0)
        ))
        .is_ok()
    );
    assert!(
        rt.block_on(log.append_if(
            vec![ev("n2", "s", "new", "t", json!({}))],
            subj("s", "new", 0)
        ))
        .is_err()
    );
    // Past the in-memory index (merges every 16 events in the redb backend) and a reopen.
    let filler: Vec<NewEvent> = (0..40)
        .map(|i| ev(&format!("f{i}"), "fill", &format!("f{i}"), "t", json!({})))
        .collect();
    rt.block_on(log.append(filler)).unwrap();
    B::close(log, &rt);
    let log = B::open(dir.path());
    assert!(
        rt.block_on(log.append_if(vec![ev("c3", "s", "x", "t", json!({}))], subj("s", "x", 3)))
            .is_err()
    );
    let r = rt
        .block_on(log.append_if(vec![ev("c3", "s", "x", "t", json!({}))], subj("s", "x", 4)))
        .unwrap();
    assert!(!r.events[0].duplicate);
    // Racers on the head: each success moves it by one; the log stays dense.
    let log = std::sync::Arc::new(log);
    let start = log.head();
    let wins: u64 = rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..8 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut won = 0u64;
                for k in 0..25 {
                    let h = log.head();
                    let e = ev(&format!("race-{t}-{k}"), "race", "r", "t", json!({}));
                    match log.append_if(vec![e], Condition::head(h)).await {
                        Ok(_) => won += 1,
                        Err(AppendError::ExpectationFailed { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                won
            }));
        }
        let mut n = 0;
        for t in tasks {
            n += t.await.unwrap();
        }
        n
    });
    assert!(wins >= 8, "each round has a winner: {wins}");
    assert_eq!(log.head(), start + wins, "only the winners appended");
    let all = read_all(&*log, ReadQuery::default(), 1000);
    assert_eq!(all.len() as u64, log.head());
    match std::sync::Arc::try_unwrap(log) {
        Ok(log) => B::close(log, &rt),
        Err(_) => panic!("the log is still shared"),
    }
}

/// Batches of this many events, each with ids `<prefix>-<batch>-<i>`.
const KILL_BATCH: u64 = 20;

/// The child of [`all_or_nothing_across_kill`]: append batches from 4 tasks until killed,
/// printing `ACK <batch>` once each is acknowledged.
fn child_writer<B: Backend>() {
    let Ok(dir) = std::env::var("CONTRACT_CHILD_DIR") else {
        return; // run by hand or by `--ignored` without the parent: nothing to do
    };
    let prefix = std::env::var("CONTRACT_CHILD_PREFIX").unwrap();
    let rt = rt();
    let log = std::sync::Arc::new(B::open(Path::new(&dir)));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..4u64 {
            let (log, prefix) = (log.clone(), prefix.clone());
            tasks.push(tokio::spawn(async move {
                for k in 0..100_000u64 {
                    let b = k * 4 + t;
                    let batch: Vec<NewEvent> = (0..KILL_BATCH)
                        .map(|i| {
                            ev(
                                &format!("{prefix}-{b}-{i}"),
                                "kill",
                                &format!("{prefix}-{b}"),
                                "t",
                                json!({"i": i, "pad": "x".repeat(200)}),
                            )
                        })
                        .collect();
                    log.append(batch).await.expect("append");
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "ACK {b}");
                    let _ = out.flush();
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
}

fn all_or_nothing_across_kill<B: Backend>(child_test: &str) {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let exe = std::env::current_exe().unwrap();
    let mut acked: Vec<String> = Vec::new();
    for cycle in 0..4u32 {
        let prefix = format!("c{cycle}");
        let mut child = Command::new(&exe)
            .args([
                child_test,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CONTRACT_CHILD_DIR", dir.path())
            .env("CONTRACT_CHILD_PREFIX", &prefix)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the child writer");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        // Kill after a different number of acknowledgements each cycle, with batches in
        // flight from the other tasks.
        let kill_after = 40 + 23 * cycle as usize;
        let mut n = 0;
        for line in stdout.lines() {
            let line = line.expect("child output");
            if let Some(b) = line.strip_prefix("ACK ") {
                acked.push(format!("{prefix}-{b}"));
                n += 1;
                if n >= kill_after {
                    break;
                }
            }
        }
        assert!(
            n >= kill_after,
            "the child stopped before {kill_after} acknowledgements"
        );
        child.kill().expect("kill -9 the child");
        let _ = child.wait();

        let log = B::open(dir.path());
        let all = read_all(&log, ReadQuery::default(), 1000);
        // I1: dense from 1, no event twice.
        let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
        assert_eq!(
            seqs,
            (1..=log.head()).collect::<Vec<_>>(),
            "cycle {cycle}: dense seqs"
        );
        let ids: HashSet<&str> = all.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids.len(), all.len(), "cycle {cycle}: an event_id twice");
        // Every batch in the log is whole and contiguous.
        let mut batches: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for e in &all {
            batches.entry(e.subject.as_str()).or_default().push(e.seq);
        }
        for (b, seqs) in &batches {
            assert_eq!(
                seqs.len() as u64,
                KILL_BATCH,
                "cycle {cycle}: batch {b} is partial"
            );
            assert!(
                seqs.windows(2).all(|w| w[1] == w[0] + 1),
                "batch {b} not contiguous"
            );
        }
        // Every acknowledged batch is there (lookups by id agree with the scan).
        for b in &acked {
            assert!(
                batches.contains_key(b.as_str()),
                "cycle {cycle}: acknowledged batch {b} lost"
            );
            let first = log.get_by_id(&format!("{b}-0")).unwrap().expect("by id");
            assert_eq!(Some(&first.seq), batches[b.as_str()].first());
        }
        B::close(log, &rt);
    }
}

macro_rules! contract {
    ($backend:ty, $module:literal) => {
        #[test]
        fn dense_seqs_and_reads() {
            super::dense_seqs_and_reads::<$backend>();
        }
        #[test]
        fn idempotent_appends_and_conflicts() {
            super::idempotent_appends_and_conflicts::<$backend>();
        }
        #[test]
        fn everything_survives_a_reopen() {
            super::everything_survives_a_reopen::<$backend>();
        }
        #[test]
        fn conditional_appends() {
            super::conditional_appends::<$backend>();
        }
        #[test]
        fn all_or_nothing_across_kill() {
            super::all_or_nothing_across_kill::<$backend>(concat!($module, "::child_writer"));
        }
        /// Run only as the child of `all_or_nothing_across_kill`.
        #[test]
        #[ignore = "the child process of all_or_nothing_across_kill"]
        fn child_writer() {
            super::child_writer::<$backend>();
        }
    };
}

mod redb_backend {
    use super::Redb;
    contract!(Redb, "redb_backend");
}
