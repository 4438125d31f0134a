//! Crash consistency on the fault layer (I1, I2, I9, I10): random workloads — appends of fresh
//! batches, resends of earlier batches (duplicates), batches reusing an id with other content
//! (conflicts), cursor advances through the engine — run on a [`FaultStore`]; the power is cut
//! after a random number of storage operations (every later operation fails, the log poisons);
//! the disk is rebuilt from what was synced plus a random subset of what was not (none, all, or
//! each write by a coin); and the log is reopened from it. Checked against what the workload
//! was told:
//! - seqs are dense from 1 and every `event_id` is in the log at most once;
//! - every acknowledged append is there, at the seqs it was acknowledged with, with its content;
//! - no batch is partly there (each event carries its batch's tag and size);
//! - the cursor is at or past the last acknowledged advance, and only at a seq some advance
//!   asked for;
//! - every projection, rebuilt from the reopened log, is identical to the one that was folded
//!   live (I3 across a crash);
//! - every acknowledgement was preceded by a sync (the fault layer counts them).
//!
//! `TIDEMARK_CRASH_CASES` sets the number of workloads (default 150; CI runs the default),
//! `TIDEMARK_CRASH_SEED` the first seed. A failure names its seed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tidemark_engine::Engine;
use tidemark_engine::commands::cursors::Advance;
use tidemark_log::fault::FaultStore;
use tidemark_log::storage::Storage;
use tidemark_log::{AppendError, EventLog, LogConfig, NewEvent};

use common::{events_after, rt};

/// One batch as sent: its events (id, payload with the batch's tag and size).
#[derive(Debug, Clone)]
struct Batch {
    events: Vec<(String, Value)>,
}

impl Batch {
    fn new_events(&self) -> Vec<NewEvent> {
        self.events
            .iter()
            .map(|(id, p)| {
                NewEvent::new(Some(id.clone()), "crash", id.clone(), "crash.appended", p).unwrap()
            })
            .collect()
    }
}

#[derive(Debug, Default)]
struct Told {
    /// Acknowledged appends: event id → (seq, payload).
    acked: BTreeMap<String, (u64, Value)>,
    /// Every batch sent, by tag, with its size.
    sizes: BTreeMap<u64, usize>,
    /// Acknowledged cursor advances, in order.
    advances_acked: Vec<u64>,
    /// Every seq an advance asked for.
    advances_tried: BTreeSet<u64>,
    /// Appends and commands acknowledged that appended something (each needs a sync before
    /// its acknowledgement).
    acks: u64,
}

/// The engine's three files on fault-injecting stores of one machine (one power supply): the
/// log's redb file and journal, and the models store.
#[derive(Clone)]
struct Disk {
    db: FaultStore,
    /// The journal's first segment (the one a log writes until it turns to the second).
    journal: FaultStore,
    journal_b: FaultStore,
    models: FaultStore,
}

impl Default for Disk {
    fn default() -> Self {
        let db = FaultStore::new();
        let journal = db.sibling();
        let journal_b = db.sibling();
        let models = db.sibling();
        Disk {
            db,
            journal,
            journal_b,
            models,
        }
    }
}

/// The engine on `disk`'s files, its log opened with `cfg`.
fn open_on(
    cfg: &LogConfig,
    disk: &Disk,
) -> Result<(Engine, tidemark_log::OpenReport), tidemark_log::OpenError> {
    let models = tidemark_projections::ModelsConfig {
        path: "/fault-store/models.redb".into(),
        cache_bytes: 1 << 20,
        store: Some(Arc::new(disk.models.clone())),
    };
    Engine::open_with(cfg, &models)
}

/// The engine on `disk` with [`config`].
fn open(disk: &Disk, merge_threshold: usize) -> (Engine, tidemark_log::OpenReport) {
    open_on(&config(disk, merge_threshold), disk).unwrap()
}

impl Disk {
    /// What the disk holds after a power loss now; `keep` decides each unsynced write.
    fn crash(&self, mut keep: impl FnMut(usize) -> bool) -> Disk {
        let db = self.db.crash(&mut keep);
        let journal = self.journal.crash_on(&db, &mut keep);
        let journal_b = self.journal_b.crash_on(&db, &mut keep);
        let models = self.models.crash_on(&db, &mut keep);
        Disk {
            db,
            journal,
            journal_b,
            models,
        }
    }

    /// A power loss that may also tear writes: `keep(i, len)` bytes of each unsynced write.
    fn crash_torn(&self, mut keep: impl FnMut(usize, usize) -> usize) -> Disk {
        let db = self.db.crash_torn(&mut keep);
        let journal = FaultStore::crash_on(&self.journal.crash_torn(&mut keep), &db, |_| true);
        let journal_b = FaultStore::crash_on(&self.journal_b.crash_torn(&mut keep), &db, |_| true);
        let models = FaultStore::crash_on(&self.models.crash_torn(&mut keep), &db, |_| true);
        Disk {
            db,
            journal,
            journal_b,
            models,
        }
    }
    /// The power goes out after `n` more operations on either file.
    fn cut_after(&self, n: u64) {
        self.db.cut_after(n);
    }
    fn ops(&self) -> u64 {
        self.db.ops()
    }
    fn syncs(&self) -> u64 {
        self.db.syncs() + self.journal.syncs() + self.journal_b.syncs()
    }
    fn unsynced(&self) -> usize {
        self.db.unsynced()
            + self.journal.unsynced()
            + self.journal_b.unsynced()
            + self.models.unsynced()
    }
}

fn config(disk: &Disk, merge_threshold: usize) -> LogConfig {
    let mut cfg = LogConfig::new("/fault-store/log.redb");
    cfg.cache_bytes = 1 << 20;
    cfg.merge_threshold = merge_threshold;
    cfg.journal_prealloc = 0;
    cfg.storage = Storage::Stores {
        db: Arc::new(disk.db.clone()),
        journal: [
            Arc::new(disk.journal.clone()),
            Arc::new(disk.journal_b.clone()),
        ],
    };
    cfg
}

/// Run one workload on `store`, cut after `cut` operations; what the workload was told.
fn workload(rt: &tokio::runtime::Runtime, engine: &Engine, rng: &mut StdRng, steps: usize) -> Told {
    let mut told = Told::default();
    let mut sent: Vec<Batch> = Vec::new();
    let mut next_tag = 1u64;
    let mut next_id = 0u64;
    for _ in 0..steps {
        let roll = rng.random_range(0..10);
        if roll < 6 || sent.is_empty() {
            // A fresh batch; one in four reuses an earlier id with other content.
            let n = rng.random_range(1..=3);
            let tag = next_tag;
            next_tag += 1;
            let mut events = Vec::new();
            for i in 0..n {
                let id = if i == 0 && !sent.is_empty() && rng.random_bool(0.25) {
                    let b = &sent[rng.random_range(0..sent.len())];
                    b.events[0].0.clone()
                } else {
                    next_id += 1;
                    format!("e{next_id}")
                };
                events.push((id, json!({"tag": tag, "n": n, "i": i})));
            }
            let b = Batch { events };
            told.sizes.insert(tag, n);
            append(rt, engine, &b, &mut told);
            sent.push(b);
        } else if roll < 8 {
            // A resend of an earlier batch: duplicates when it is in the log.
            let b = sent[rng.random_range(0..sent.len())].clone();
            append(rt, engine, &b, &mut told);
        } else {
            let seq = rng.random_range(1..=40);
            told.advances_tried.insert(seq);
            let a = advance_to(seq);
            if let Ok((_, r)) = rt.block_on(engine.execute(a)) {
                told.advances_acked.push(seq);
                // An idempotent replay appends nothing and has nothing to sync.
                told.acks += u64::from(!r.events.is_empty());
            }
        }
    }
    told
}

/// Event `<prefix><i>` of the crash stream.
fn one(prefix: &str, i: u64) -> NewEvent {
    NewEvent::new(
        Some(format!("{prefix}{i}")),
        "crash",
        "s",
        "crash.appended",
        &json!({"i": i}),
    )
    .unwrap()
}

/// Advance consumer `c` on the crash stream to `seq`.
fn advance_to(seq: u64) -> Advance {
    Advance {
        consumer_id: "c".into(),
        stream_name: "crash".into(),
        subject_id: String::new(),
        last_sequence: seq,
        delivery_id: format!("d{seq}"),
        expected_sequence: None,
    }
}

fn append(rt: &tokio::runtime::Runtime, engine: &Engine, b: &Batch, told: &mut Told) {
    match rt.block_on(engine.log().append(b.new_events())) {
        Ok(r) => {
            // A batch of duplicates only is answered from what is already durable.
            told.acks += u64::from(r.events.iter().any(|e| !e.duplicate));
            for ((id, p), a) in b.events.iter().zip(&r.events) {
                told.acked.insert(id.clone(), (a.seq, p.clone()));
            }
        }
        // Refused (a conflict) or failed (the power is out): checked from the log.
        Err(AppendError::Conflict { .. } | AppendError::Storage(_) | AppendError::Poisoned(_)) => {}
        Err(e) => panic!("unexpected append error: {e}"),
    }
}

/// Check the reopened log against what the workload was told; `Err` says what is wrong.
fn check(rt: &tokio::runtime::Runtime, engine: &Engine, told: &Told) -> Result<(), String> {
    let events = events_after(engine, 0);
    let head = engine.head();
    if events.len() as u64 != head {
        return Err(format!("{} events read, head {head}", events.len()));
    }
    let mut ids = BTreeMap::new();
    let mut per_tag: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, ev) in events.iter().enumerate() {
        if ev.seq != i as u64 + 1 {
            return Err(format!("seq {} at position {}: not dense", ev.seq, i + 1));
        }
        if ev.stream != "crash" {
            continue;
        }
        if ids
            .insert(ev.event_id.clone(), (ev.seq, ev.payload_value()))
            .is_some()
        {
            return Err(format!("{} twice in the log", ev.event_id));
        }
        let tag = ev.payload_value()["tag"].as_u64().unwrap();
        *per_tag.entry(tag).or_default() += 1;
    }
    for (id, (seq, p)) in &told.acked {
        match ids.get(id) {
            Some((s, q)) if s == seq && q == p => {}
            Some((s, q)) => {
                return Err(format!(
                    "{id} acknowledged at {seq} as {p}, the log has {s} {q}"
                ));
            }
            None => return Err(format!("acknowledged {id} (seq {seq}) lost")),
        }
    }
    for (tag, n) in &per_tag {
        if told.sizes.get(tag) != Some(n) {
            return Err(format!(
                "batch {tag} is partly in the log: {n} of {:?} events",
                told.sizes.get(tag)
            ));
        }
    }
    let cur = engine
        .read()
        .cursor("c", "crash", "")
        .map_err(|e| e.to_string())?;
    if let Some(last) = told.advances_acked.last()
        && cur.last_sequence < *last
    {
        return Err(format!(
            "cursor at {} after an acknowledged advance to {last}",
            cur.last_sequence
        ));
    }
    if cur.last_sequence != 0 && !told.advances_tried.contains(&cur.last_sequence) {
        return Err(format!(
            "cursor at {}, which no advance asked for",
            cur.last_sequence
        ));
    }
    for p in tidemark_projections::all() {
        let v = rt
            .block_on(engine.rebuild(p.name(), false, |_, _| {}))
            .expect("a projection")
            .map_err(|e| e.to_string())?;
        if !v.identical {
            return Err(format!(
                "{} after the crash differs from its rebuild at {:?}",
                p.name(),
                v.first_divergent_seq
            ));
        }
    }
    Ok(())
}

/// One case: returns (operations run before the cut, writes the crash dropped or kept).
fn case(seed: u64) -> Result<(u64, usize), String> {
    let rt = rt();
    let mut rng = StdRng::seed_from_u64(seed);
    let store = Disk::default();
    let merge = rng.random_range(2..40);
    let checkpoint = rng.random_range(1..20);
    // A journal that grows, or one written full of zeros first and then overwritten round
    // after round (whose older records must never come back).
    let prealloc = if rng.random_bool(0.5) { 0 } else { 16 << 10 };
    // The indexer's commits end between groups, or inside them (after about one event).
    let commit_bytes = if rng.random_bool(0.5) { 8 << 20 } else { 1 };
    let cfg = |d: &Disk| {
        let mut c = config(d, merge);
        c.checkpoint_groups = checkpoint;
        c.journal_prealloc = prealloc;
        c.index_commit_bytes = commit_bytes;
        c
    };
    let (engine, _) = open_on(&cfg(&store), &store).map_err(|e| e.to_string())?;
    let opened_at = store.ops();
    let syncs_before = store.syncs();
    // Cut somewhere inside the workload, or after it (then the crash only drops unsynced
    // writes).
    store.cut_after(rng.random_range(0..120));
    let steps = rng.random_range(5..50);
    let told = workload(&rt, &engine, &mut rng, steps);
    let ops = store.ops() - opened_at;
    // Every acknowledgement had a sync before it.
    if store.syncs() - syncs_before < told.acks {
        return Err(format!(
            "{} acknowledgements with only {} syncs",
            told.acks,
            store.syncs() - syncs_before
        ));
    }
    rt.block_on(engine.close());
    drop(engine);
    let unsynced = store.unsynced();
    // Unsynced writes: none, all, each by a coin, or each by a coin and possibly torn.
    let keep = rng.random_range(0..4);
    let image = store.crash_torn(|_, len| match keep {
        0 => 0,
        1 => len,
        2 => {
            if rng.random_bool(0.5) {
                len
            } else {
                0
            }
        }
        _ => match rng.random_range(0..3) {
            0 => 0,
            1 => len,
            _ => rng.random_range(0..=len),
        },
    });
    let (engine, _) =
        open_on(&cfg(&image), &image).map_err(|e| format!("reopen after the crash failed: {e}"))?;
    let r = check(&rt, &engine, &told);
    rt.block_on(engine.close());
    r.map(|()| (ops, unsynced))
}

#[test]
fn every_cut_keeps_what_was_acknowledged_and_no_partial_batch() {
    let cases: u64 = std::env::var("TIDEMARK_CRASH_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let first: u64 = std::env::var("TIDEMARK_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut ops = 0;
    let mut unsynced = 0;
    let mut failures = Vec::new();
    for seed in first..first + cases {
        match case(seed) {
            Ok((o, u)) => {
                ops += o;
                unsynced += u;
            }
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    eprintln!(
        "crash consistency: {cases} cuts tried, {ops} storage operations before them, {unsynced} unsynced writes at the cuts, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A sync that fails once poisons the log (I10): the batch it was for is refused, every later
/// append and command is refused too although the disk works again, nothing refused is in
/// the log, and a restart (reopening the same disk) recovers with every acknowledged event.
#[test]
fn a_failed_sync_poisons_the_log_until_a_restart() {
    let rt = rt();
    let disk = Disk::default();
    // The group's durable point is the journal's sync.
    let store = disk.journal.clone();
    let (engine, _) = open(&disk, 8);
    let ev = |i: u64| one("p", i);
    let mut acked = Vec::new();
    for i in 0..5 {
        acked.push(
            rt.block_on(engine.log().append(vec![ev(i)]))
                .unwrap()
                .last_seq,
        );
    }
    store.fail_nth(tidemark_log::fault::Op::Sync, 1, std::io::ErrorKind::Other);
    let failed = rt.block_on(engine.log().append(vec![ev(5)]));
    assert!(matches!(failed, Err(AppendError::Storage(_))), "{failed:?}");
    assert!(engine.is_poisoned());
    for i in 6..8 {
        let r = rt.block_on(engine.log().append(vec![ev(i)]));
        assert!(matches!(r, Err(AppendError::Poisoned(_))), "{r:?}");
    }
    let advance = advance_to(1);
    let r = rt.block_on(engine.execute(advance));
    assert!(
        matches!(
            r,
            Err(tidemark_engine::CommandError::Append(
                AppendError::Poisoned(_)
            ))
        ),
        "{r:?}"
    );
    // Reads of acknowledged data keep working.
    assert_eq!(events_after(&engine, 0).len(), 5);
    rt.block_on(engine.close());
    drop(engine);
    // The restart: the same disk, as a power loss would leave it, reopened.
    let (engine, _) = open(&disk.crash(|_| false), 8);
    let events = events_after(&engine, 0);
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(
        ids,
        ["p0", "p1", "p2", "p3", "p4"],
        "the acknowledged events, nothing else"
    );
    assert_eq!(acked, [1, 2, 3, 4, 5]);
    let r = rt.block_on(engine.log().append(vec![ev(9)])).unwrap();
    assert_eq!(r.last_seq, 6);
    rt.block_on(engine.close());
}

/// Short of space (I10): appends and commands are refused with `InsufficientStorage` before
/// anything reaches the store, nothing refused is in the log, reads keep working, and writes
/// resume by themselves once space returns — no poison, no restart.
#[test]
fn short_of_space_refuses_writes_until_space_returns() {
    let rt = rt();
    let disk = Disk::default();
    let store = disk.db.clone();
    let mut cfg = config(&disk, 8);
    cfg.min_free = 1 << 20;
    let (engine, _) = open_on(&cfg, &disk).unwrap();
    let ev = |i: u64| one("f", i);
    rt.block_on(engine.log().append(vec![ev(0)])).unwrap();
    store.set_available(Some(1000));
    let writes = store.writes() + disk.journal.writes();
    let r = rt.block_on(engine.log().append(vec![ev(1), ev(2)]));
    assert!(
        matches!(
            r,
            Err(AppendError::InsufficientStorage {
                available: 1000,
                ..
            })
        ),
        "{r:?}"
    );
    let advance = advance_to(1);
    let r = rt.block_on(engine.execute(advance.clone()));
    assert!(
        matches!(
            r,
            Err(tidemark_engine::CommandError::Append(
                AppendError::InsufficientStorage { .. }
            ))
        ),
        "{r:?}"
    );
    assert_eq!(
        store.writes() + disk.journal.writes(),
        writes,
        "a refused write reached the store"
    );
    assert!(engine.check_space().is_err());
    assert!(!engine.is_poisoned());
    assert_eq!(
        events_after(&engine, 0).len(),
        1,
        "reads work, nothing refused is there"
    );
    store.set_available(Some(10 << 20));
    assert!(engine.check_space().is_ok());
    let r = rt
        .block_on(engine.log().append(vec![ev(1), ev(2)]))
        .unwrap();
    assert_eq!(r.last_seq, 3);
    rt.block_on(engine.execute(advance)).unwrap();
    rt.block_on(engine.close());
}

/// What one durable group commit costs the store, counted through the fault layer: exactly one
/// sync before each acknowledgement (I1's "acknowledged = durable", and the lean commit's one
/// `fdatasync` per group); the bytes written per one-event append are printed for the notes.
#[test]
fn every_group_commit_syncs_before_it_answers() {
    let rt = rt();
    let disk = Disk::default();
    let (engine, _) = open(&disk, 100_000);
    let bytes_written = |d: &Disk| d.db.bytes_written() + d.journal.bytes_written();
    let (syncs, bytes) = (disk.syncs(), bytes_written(&disk));
    let n = 200u64;
    for i in 0..n {
        let ev = NewEvent::new(
            Some(format!("g{i}")),
            "crash",
            format!("s{}", i % 10),
            "crash.appended",
            &json!({"pad": "x".repeat(200)}),
        )
        .unwrap();
        rt.block_on(engine.log().append(vec![ev])).unwrap();
    }
    let per_sync = (disk.syncs() - syncs) as f64 / n as f64;
    let per_bytes = (bytes_written(&disk) - bytes) as f64 / n as f64;
    eprintln!("one-event appends: {per_sync:.2} syncs and {per_bytes:.0} bytes written per append");
    assert!(per_sync >= 1.0, "{per_sync} syncs per acknowledged append");
    // The lean commit: the journal's one sync per group (checkpoints come every 512 groups).
    assert!(
        per_sync <= 1.01,
        "{per_sync} syncs per one-event append, more than one per group"
    );
    rt.block_on(engine.close());
}

/// A disk that fills up anyway (ENOSPC on the journal's write, past the `min_free` check):
/// the group is refused with `InsufficientStorage`, the log is not poisoned, writes resume
/// once space returns, and a restart finds exactly the acknowledged events.
#[test]
fn enospc_on_the_journal_refuses_the_group_and_the_log_goes_on() {
    let rt = rt();
    let disk = Disk::default();
    let (engine, _) = open(&disk, 8);
    let ev = |i: u64| one("n", i);
    rt.block_on(engine.log().append(vec![ev(0)])).unwrap();
    disk.journal.set_full(true);
    let r = rt.block_on(engine.log().append(vec![ev(1), ev(2)]));
    assert!(
        matches!(r, Err(AppendError::InsufficientStorage { .. })),
        "{r:?}"
    );
    assert!(!engine.is_poisoned());
    assert_eq!(events_after(&engine, 0).len(), 1);
    disk.journal.set_full(false);
    let r = rt.block_on(engine.log().append(vec![ev(3)])).unwrap();
    assert_eq!(r.last_seq, 2, "the refused group left no seq behind");
    rt.block_on(engine.close());
    drop(engine);
    let (engine, _) = open(&disk.crash(|_| false), 8);
    let ids: Vec<String> = events_after(&engine, 0)
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(ids, ["n0", "n3"]);
    rt.block_on(engine.close());
}

/// ENOSPC reported by the sync (copy-on-write filesystems, thin provisioning) may come after a
/// complete record reached the disk: the log is poisoned rather than told the group was
/// refused, and after a restart the group is wholly there or not at all.
#[test]
fn enospc_on_the_sync_poisons_and_the_group_is_all_or_nothing() {
    let rt = rt();
    for keep_unsynced in [false, true] {
        let disk = Disk::default();
        let (engine, _) = open(&disk, 8);
        rt.block_on(engine.log().append(vec![one("s", 0)])).unwrap();
        disk.journal.fail_nth(
            tidemark_log::fault::Op::Sync,
            1,
            std::io::ErrorKind::StorageFull,
        );
        let r = rt.block_on(engine.log().append(vec![one("s", 1), one("s", 2)]));
        assert!(matches!(r, Err(AppendError::Storage(_))), "{r:?}");
        assert!(engine.is_poisoned());
        rt.block_on(engine.close());
        drop(engine);
        let (engine, _) = open(&disk.crash(|_| keep_unsynced), 8);
        let ids: Vec<String> = events_after(&engine, 0)
            .into_iter()
            .map(|e| e.event_id)
            .collect();
        let want: &[&str] = if keep_unsynced {
            &["s0", "s1", "s2"]
        } else {
            &["s0"]
        };
        assert_eq!(ids, want);
        rt.block_on(engine.close());
    }
}

/// A disk that fills up inside redb (past the `min_free` check, e.g. another process took the
/// last space): the redb commit fails with ENOSPC, and redb refuses every later call until it
/// is reopened. Appends are refused with `InsufficientStorage` (not poisoned); once space
/// returns the writer reopens the log in process by itself — no request needed, no restart —
/// and every acknowledged event is there, the unanswered group wholly or not at all.
#[test]
fn enospc_inside_redb_reopens_the_log_in_process_once_space_returns() {
    let rt = rt();
    let disk = Disk::default();
    let (engine, _) = open(&disk, 8);
    let mut acked: Vec<String> = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    for i in 0..4 {
        rt.block_on(engine.log().append(vec![one("r", i)])).unwrap();
        acked.push(format!("r{i}"));
    }
    disk.db.set_full(true);
    // Appends go on (the journal takes them) until a merge's redb commit has to grow the file.
    let batch = |i: u64| -> Vec<NewEvent> {
        (0..20)
            .map(|k| {
                NewEvent::new(
                    Some(format!("r{i}.{k}")),
                    "crash",
                    "s",
                    "crash.appended",
                    &json!({"pad": "x".repeat(2000)}),
                )
                .unwrap()
            })
            .collect()
    };
    let ids =
        |b: &[NewEvent]| -> Vec<String> { b.iter().map(|e| e.event_id.clone().unwrap()).collect() };
    let mut refused = None;
    for i in 4..2000 {
        let b = batch(i);
        let names = ids(&b);
        match rt.block_on(engine.log().append(b)) {
            Ok(_) => acked.extend(names),
            Err(AppendError::Storage(why)) => {
                // The group's journal record may be durable: its outcome is unknown.
                assert!(why.is_storage_full(), "{why}");
                unknown.extend(names);
            }
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
    }
    let (i, e) = refused.expect("a full disk refuses appends");
    eprintln!(
        "full inside redb after {} acknowledged events ({} of unknown outcome, batch {i})",
        acked.len(),
        unknown.len()
    );
    assert!(
        matches!(e, AppendError::InsufficientStorage { .. }),
        "{e:?}"
    );
    assert!(!engine.is_poisoned(), "a full disk does not poison");
    assert!(
        engine.check_space().is_err(),
        "health reports the full disk"
    );
    let r = rt.block_on(engine.log().append(batch(i)));
    assert!(
        matches!(r, Err(AppendError::InsufficientStorage { .. })),
        "{r:?}"
    );
    disk.db.set_full(false);
    // The writer looks for space every 250 ms: recovered without any request (5 s, 5× slack).
    let started = std::time::Instant::now();
    while engine.check_space().is_err() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(25),
            "not reopened 25 s after space returned"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let r = rt
        .block_on(engine.log().append(vec![one("r", 1000)]))
        .unwrap();
    acked.push("r1000".into());
    let check = |engine: &Engine, last_seq: Option<u64>| {
        let evs = events_after(engine, 0);
        let seqs: Vec<u64> = evs.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=evs.len() as u64).collect::<Vec<_>>(), "dense");
        if let Some(last) = last_seq {
            assert_eq!(last, evs.len() as u64);
        }
        let ids: Vec<String> = evs.into_iter().map(|e| e.event_id).collect();
        let got: Vec<&String> = ids.iter().filter(|id| !unknown.contains(id)).collect();
        let want: Vec<&String> = acked.iter().collect();
        assert_eq!(
            got, want,
            "every acknowledged event, in order, nothing refused"
        );
    };
    check(&engine, Some(r.last_seq));
    rt.block_on(engine.close());
    drop(engine);
    // And after a power loss now.
    let (engine, _) = open(&disk.crash(|_| false), 8);
    check(&engine, None);
    rt.block_on(engine.close());
}

/// I10: the models store is its own fault domain. A full disk under it (ENOSPC) and then an
/// I/O error in it stop the read models for a while — reads wait, then answer `Lagging` — but
/// never the log: appends go on and are acknowledged, the log is not poisoned, and once the
/// store works again the decider reopens it and the models catch up with every event, the
/// same digests a rebuild finds.
#[test]
fn a_failing_models_store_never_poisons_the_log() {
    let rt = rt();
    let disk = Disk::default();
    let (engine, _) = open(&disk, 8);
    rt.block_on(engine.log().append(vec![one("m", 0)])).unwrap();
    engine.read().floor(0).unwrap();
    for fault in ["full", "eio"] {
        let kind = match fault {
            "full" => std::io::ErrorKind::StorageFull,
            _ => std::io::ErrorKind::Other,
        };
        disk.models.fail_writes(Some(kind));
        for i in 1..20 {
            rt.block_on(engine.log().append(vec![one(fault, i)]))
                .unwrap_or_else(|e| panic!("append {i} with the models store {fault}: {e}"));
        }
        assert!(!engine.is_poisoned(), "{fault}: the log was poisoned");
        // The models store fails at its next sync at the latest (one a second): the models
        // stop following.
        let mut lagged = false;
        for i in 20..200 {
            rt.block_on(engine.log().append(vec![one(fault, i)]))
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(25));
            if engine.read().lag() > 0 && engine.read().floor(0).is_err() {
                lagged = true;
                break;
            }
        }
        assert!(
            lagged,
            "{fault}: the models store did not fail (the test would prove nothing)"
        );
        // A command meanwhile is refused as the models' failure (a full disk said as such),
        // never as the log's.
        match rt.block_on(engine.execute(advance_to(1))) {
            Err(tidemark_engine::CommandError::Models(e)) => {
                assert_eq!(e.is_storage_full(), fault == "full", "{fault}: {e}");
            }
            other => panic!("{fault}: a command on a failing models store: {other:?}"),
        }
        assert!(!engine.is_poisoned(), "{fault}: the log was poisoned");
        disk.models.fail_writes(None);
        // The decider reopens the store and folds every event.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if engine.read().floor(0).is_ok_and(|at| at >= engine.head()) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{fault}: the models never caught up"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    for p in tidemark_projections::all() {
        let v = rt
            .block_on(engine.rebuild(p.name(), false, |_, _| {}))
            .unwrap()
            .unwrap();
        assert!(v.identical, "{}: {:?}", p.name(), v.first_divergent_seq);
    }
    assert!(!engine.is_poisoned());
    rt.block_on(engine.close());
}

/// I10: a panic in the decider (the models store's writer) poisons the models, not the log:
/// the command in its hands and every later one is answered with the poison (never left
/// waiting, never `shutting_down`), appends go on, and the engine still closes.
#[test]
fn a_panicking_decider_poisons_the_models_not_the_log() {
    let rt = rt();
    let disk = Disk::default();
    let (engine, _) = open(&disk, 8);
    let panic_now = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wall = tidemark_engine::wall_clock();
    let trip = panic_now.clone();
    let engine = engine.with_clock(Arc::new(move || {
        if trip.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("injected into the decider's clock");
        }
        wall()
    }));
    rt.block_on(engine.log().append(vec![one("p", 0)])).unwrap();
    rt.block_on(engine.execute(advance_to(1))).unwrap();
    assert!(engine.models_poisoned().is_none());
    panic_now.store(true, std::sync::atomic::Ordering::SeqCst);
    // The command in its hands is told its outcome is not known; those after it that nothing
    // was appended.
    for attempt in 0..3 {
        match rt.block_on(engine.execute(advance_to(1))) {
            Err(tidemark_engine::CommandError::Poisoned(why)) => {
                assert!(why.contains("panicked"), "{attempt}: {why}");
                let known = if attempt == 0 {
                    "is not known"
                } else {
                    "nothing of this command was appended"
                };
                assert!(why.contains(known), "{attempt}: {why}");
            }
            other => panic!("{attempt}: a command after the decider panicked: {other:?}"),
        }
    }
    assert!(
        engine
            .models_poisoned()
            .is_some_and(|why| why.to_string().contains("injected")),
        "{:?}",
        engine.models_poisoned()
    );
    panic_now.store(false, std::sync::atomic::Ordering::SeqCst);
    let r = rt.block_on(engine.log().append(vec![one("p", 1)])).unwrap();
    assert_eq!(r.last_seq, engine.head());
    assert!(
        !engine.is_poisoned(),
        "the log was poisoned by the decider's panic"
    );
    rt.block_on(engine.close());
    // Restarted, the models fold the log again and commands are decided.
    drop(engine);
    let (engine, _) = open(&disk, 8);
    rt.block_on(engine.execute(advance_to(2))).unwrap();
    assert!(engine.models_poisoned().is_none());
    rt.block_on(engine.close());
}

/// A rebuild runs on a thread of its own at a lower priority (nice 10): CPU-bound for seconds,
/// it must not take a core from the log's writer and the requests.
#[cfg(target_os = "linux")]
#[test]
fn a_rebuild_runs_at_a_lower_priority() {
    let rt = rt();
    let disk = Disk::default();
    let (engine, _) = open(&disk, 8);
    rt.block_on(engine.log().append(vec![one("n", 0)])).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let report = rt
        .block_on(engine.rebuild("tasks", false, move |_, _| {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            // After "pid (comm) ": state is field 3, nice field 19.
            let fields = &stat[stat.rfind(')').unwrap() + 2..];
            let nice: i64 = fields.split(' ').nth(16).unwrap().parse().unwrap();
            record.lock().unwrap().push(nice);
        }))
        .unwrap()
        .unwrap();
    assert!(report.identical);
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty(), "the rebuild reported no progress");
    // 10, or more when the tests themselves run at a higher nice (a thread cannot lower it).
    assert!(seen.iter().all(|n| *n >= 10), "nice values seen: {seen:?}");
    drop(seen);
    rt.block_on(engine.close());
}

/// I10 on a read: a query that meets a failure of the models store is that store's failure
/// (`QueryError::Models`: `503 models_unavailable` over HTTP), never the log's; appends go on,
/// and the query answers again once the store can be read.
#[test]
fn a_query_on_a_failing_models_store_is_the_models_failure() {
    use tidemark_engine::QueryError;
    use tidemark_projections::tasks::read::TaskFilter;
    let rt = rt();
    let disk = Disk::default();
    let (engine, _) = open(&disk, 1000);
    // More tasks than the models store's 1 MiB page cache holds, so a listing of all of
    // them reads pages from the store.
    let title = "t".repeat(300);
    for b in 0..40 {
        let batch = (0..100)
            .map(|i| {
                NewEvent::new(
                    Some(format!("tc-{b}-{i}")),
                    "task_events",
                    format!("t-{b}-{i}"),
                    "task.created",
                    &json!({ "title": title }),
                )
                .unwrap()
            })
            .collect();
        rt.block_on(engine.log().append(batch)).unwrap();
    }
    let all = |e: &Engine| {
        e.read().tasks(&TaskFilter {
            limit: 10_000,
            ..TaskFilter::default()
        })
    };
    assert_eq!(all(&engine).unwrap().0.len(), 4000);
    disk.models.fail_reads(Some(std::io::ErrorKind::Other));
    match all(&engine) {
        Err(QueryError::Models(_)) => {}
        other => panic!("a listing on a store that fails its reads: {other:?}"),
    }
    assert!(
        !engine.is_poisoned(),
        "the log was poisoned by the models' failure"
    );
    rt.block_on(engine.log().append(vec![one("after", 0)]))
        .expect("appends go on");
    disk.models.fail_reads(None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match all(&engine) {
            Ok((tasks, _)) if tasks.len() == 4000 => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "the listing never answered again: {other:?}"
            ),
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    rt.block_on(engine.close());
}
