//! Power loss under the write path's order — durable (the journal's sync), visible, indexed
//! later (redb, by the indexer) — on the fault-injecting stores (I1, I2, I10):
//! - the power is cut at a random operation while redb lags the journal by 0..K groups (the
//!   indexer held for a random stretch of groups), with segments turning and the index tail
//!   merging;
//! - every write not synced before the cut is torn at 512-byte sectors, each sector kept or
//!   lost on its own and in any order;
//! - the log is reopened from what the disks hold.
//!
//! Checked: seqs dense from 1, each id once; every event any read returned before the cut is
//! back with the same seq, id, time and bytes (nothing was visible before it was durable);
//! every acknowledged append is back at its seqs; each batch is all there or not at all; and a
//! batch resent after the reopen is answered as duplicates with its original seqs, whether or
//! not redb held it at the cut.
//!
//! `TIDEMARK_POWER_CASES` sets the number of cases (default 60), `TIDEMARK_POWER_SEED` the
//! first seed. A failure names its seed.

mod common;
use common::rt;
use std::collections::BTreeMap;
use std::sync::Arc;
use tidemark_log::EventLog;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tidemark_log::fault::FaultStore;
use tidemark_log::storage::Storage;
use tidemark_log::{Log, LogConfig, NewEvent, ReadQuery};

struct Disk {
    db: FaultStore,
    j0: FaultStore,
    j1: FaultStore,
}

impl Disk {
    fn new() -> Disk {
        let db = FaultStore::new();
        Disk {
            j0: db.sibling(),
            j1: db.sibling(),
            db,
        }
    }

    fn crash(&self, rng: &mut StdRng) -> Disk {
        let mode = rng.random_range(0..3);
        let mut keep = |_: usize, _: u64| match mode {
            0 => false,
            1 => true,
            _ => rng.random_bool(0.5),
        };
        let db = self.db.crash_sectors(&mut keep);
        let j0 = FaultStore::crash_on(&self.j0.crash_sectors(&mut keep), &db, |_| true);
        let j1 = FaultStore::crash_on(&self.j1.crash_sectors(&mut keep), &db, |_| true);
        Disk { db, j0, j1 }
    }

    fn config(&self, merge_threshold: usize, checkpoint_groups: u64, prealloc: u64) -> LogConfig {
        let mut c = LogConfig::new("/fault-store/log.redb");
        c.cache_bytes = 1 << 20;
        c.merge_threshold = merge_threshold;
        // Every ordinary commit of the indexer ends after one event, so redb's head, and a
        // checkpoint's, fall inside groups (the journal holds the rest of each).
        c.index_commit_bytes = 1;
        c.checkpoint_groups = checkpoint_groups;
        c.journal_prealloc = prealloc;
        c.storage = Storage::Stores {
            db: Arc::new(self.db.clone()),
            journal: [Arc::new(self.j0.clone()), Arc::new(self.j1.clone())],
        };
        c
    }
}

/// A batch of `n` events tagged `tag` (each carries its batch's tag and size).
fn batch(tag: u64, n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| {
            NewEvent::new(
                Some(format!("b{tag}-{i}")),
                "power",
                format!("s{}", (tag + i as u64) % 5),
                "power.appended",
                &json!({"tag": tag, "size": n, "i": i}),
            )
            .unwrap()
        })
        .collect()
}

/// Every event of the log, through the API, as (seq, id, time, payload).
fn everything(log: &Log) -> Vec<(u64, String, i64, String)> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = log
            .read(&ReadQuery {
                after,
                limit: 64,
                ..ReadQuery::default()
            })
            .unwrap();
        out.extend(page.events.into_iter().map(|e| {
            (
                e.seq,
                e.event_id.clone(),
                e.time_us,
                e.payload.get().to_owned(),
            )
        }));
        if page.next_after >= page.head {
            return out;
        }
        after = page.next_after;
    }
}

fn case(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let rt = rt();
    let disk = Disk::new();
    let merge = rng.random_range(4..40);
    let checkpoint = rng.random_range(2..12);
    let prealloc = [0, 4096, 64 << 10][rng.random_range(0..3)];
    let cfg = disk.config(merge, checkpoint, prealloc);
    let (log, _) = Log::open(&cfg).map_err(|e| format!("open: {e}"))?;
    // Acknowledged batches: tag -> seqs.
    let mut acked: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut sizes: BTreeMap<u64, usize> = BTreeMap::new();
    let groups = rng.random_range(5..40);
    let cut_at = rng.random_range(0..groups);
    let mut seen = Vec::new();
    for tag in 0..groups {
        // Hold the indexer for stretches: redb lags the journal by that many groups.
        if rng.random_bool(0.2) {
            log.pause_indexer(rng.random_bool(0.6));
        }
        if tag == cut_at {
            seen = everything(&log);
            disk.db.cut_after(rng.random_range(0..60));
        }
        let n = rng.random_range(1..6);
        sizes.insert(tag, n);
        if let Ok(r) = rt.block_on(log.append(batch(tag, n))) {
            acked.insert(tag, r.events.iter().map(|e| e.seq).collect());
        }
    }
    let lag = log.head() - log.indexed();
    // The power is out (the cut, if not reached, comes now), before the log is dropped: a
    // dropped log's indexer would checkpoint everything first.
    disk.db.cut_after(0);
    drop(log);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let after = disk.crash(&mut rng);
    let (log, _) = Log::open(&after.config(merge, checkpoint, prealloc))
        .map_err(|e| format!("reopen (redb {lag} behind at the cut): {e}"))?;
    let all = everything(&log);
    for (i, (seq, ..)) in all.iter().enumerate() {
        if *seq != i as u64 + 1 {
            return Err(format!("seq {seq} at position {i}: a gap or a repeat"));
        }
    }
    let by_id: BTreeMap<&str, &(u64, String, i64, String)> =
        all.iter().map(|e| (e.1.as_str(), e)).collect();
    if by_id.len() != all.len() {
        return Err("an event id twice".into());
    }
    for e in &seen {
        if by_id.get(e.1.as_str()) != Some(&e) {
            return Err(format!(
                "{e:?}, returned by a read before the cut, is not back as it was"
            ));
        }
    }
    // Batches: all or nothing, acknowledged ones at their seqs.
    let mut present: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (seq, _, _, payload) in &all {
        let p: serde_json::Value = serde_json::from_str(payload).unwrap();
        present
            .entry(p["tag"].as_u64().unwrap())
            .or_default()
            .push(*seq);
    }
    for (tag, seqs) in &present {
        if seqs.len() != sizes[tag] {
            return Err(format!(
                "batch {tag} is partly there: {} of {}",
                seqs.len(),
                sizes[tag]
            ));
        }
    }
    for (tag, seqs) in &acked {
        if present.get(tag) != Some(seqs) {
            return Err(format!(
                "acknowledged batch {tag} at {seqs:?} is {:?} after the cut",
                present.get(tag)
            ));
        }
        let again = rt
            .block_on(log.append(batch(*tag, sizes[tag])))
            .map_err(|e| format!("resending batch {tag}: {e}"))?;
        let got: Vec<(u64, bool)> = again.events.iter().map(|e| (e.seq, e.duplicate)).collect();
        let want: Vec<(u64, bool)> = seqs.iter().map(|s| (*s, true)).collect();
        if got != want {
            return Err(format!("batch {tag} resent: {got:?}, not {want:?}"));
        }
    }
    rt.block_on(log.close());
    Ok(())
}

#[test]
fn a_cut_while_redb_lags_the_journal_keeps_every_acknowledged_group() {
    let cases: u64 = std::env::var("TIDEMARK_POWER_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let first: u64 = std::env::var("TIDEMARK_POWER_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for seed in first..first + cases {
        if let Err(e) = case(seed) {
            panic!("seed {seed}: {e}");
        }
    }
}

/// A group held in memory only (the indexer paused) is readable at once, and after a power
/// loss that tears the journal's unsynced tail at sectors it is back from the journal, with
/// its time; its resend is a duplicate with the original seqs.
#[test]
fn groups_redb_never_held_come_back_from_the_journal() {
    let rt = rt();
    let disk = Disk::new();
    let cfg = disk.config(1000, u64::MAX, 0);
    let (log, _) = Log::open(&cfg).unwrap();
    rt.block_on(log.append(batch(0, 3))).unwrap();
    rt.block_on(log.flush_index()).unwrap();
    log.pause_indexer(true);
    let mut acked = Vec::new();
    for tag in 1..6 {
        acked.push(rt.block_on(log.append(batch(tag, 2))).unwrap());
    }
    assert_eq!(log.indexed(), 3, "redb holds only the first batch");
    let seen = everything(&log);
    assert_eq!(seen.len(), 13, "memory serves what redb does not hold");
    disk.db.cut_after(0);
    drop(log);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut rng = StdRng::seed_from_u64(7);
    let after = disk.crash(&mut rng);
    let (log, report) = Log::open(&after.config(1000, u64::MAX, 0)).unwrap();
    assert_eq!(report.head, 13);
    assert!(report.replayed >= 10, "{report:?}");
    assert_eq!(everything(&log), seen);
    for (tag, r) in (1..6).zip(&acked) {
        let again = rt.block_on(log.append(batch(tag, 2))).unwrap();
        assert_eq!(
            again
                .events
                .iter()
                .map(|e| (e.seq, e.duplicate))
                .collect::<Vec<_>>(),
            r.events.iter().map(|e| (e.seq, true)).collect::<Vec<_>>()
        );
    }
    rt.block_on(log.close());
}
