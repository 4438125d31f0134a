//! Rebuild and verify: fold the whole log into a fresh generation of a projection, chunk by
//! chunk, each in a transaction of the models store (the log is only read: appends never wait
//! for a rebuild; the models' follower waits at most one chunk), compare its digest chain with
//! the live one, and — for a rebuild — switch to it in the transaction that catches up with
//! the head.

use std::time::Instant;
use tidemark_log::StorageError;

use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::Serialize;
use tidemark_log::{EventChunk, EventLog, EventRef};

use crate::models::Models;

use crate::framework::{
    DIGEST_EVERY, DIGESTS, Meta, Projection, TxMut, drop_other_generations, fold_events, read_meta,
    restore_snapshot, table_name, write_meta,
};

/// Events folded per transaction of the models store. The decider (commands, and appends of
/// notifications, which it admits) waits for at most one chunk's transaction: 10,000 events
/// keep that wait to tens of milliseconds.
pub const CHUNK: u64 = 10_000;

/// Chunks in a row after which the head had moved further away than before them: the rebuild
/// then folds the rest up to the head in one transaction, so it ends under any load.
const OUTPACED: u32 = 3;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RebuildReport {
    pub name: String,
    pub events_replayed: u64,
    pub duration_ms: u64,
    /// Hex digest of the rebuilt model.
    pub digest: String,
    /// The rebuilt model has the same digest chain as the live one.
    pub identical: bool,
    /// The first seq at which the rebuilt model's chain differs from the live one.
    pub first_divergent_seq: Option<u64>,
    /// Whether the rebuilt model replaced the live one (`false` for verify).
    pub swapped: bool,
}

struct Progress {
    new: Meta,
    live_generation: u32,
    first_divergent: Option<u64>,
    done: bool,
}

/// The digest of generation `g` at boundary `b`: the last row at or before it (the zero digest
/// before the first change). Reads both layouts: a row at every boundary, or (written before
/// the boundaries) a row at every changing event.
fn digest_at(txn: &WriteTransaction, name: &str, g: u32, b: u64) -> Result<[u8; 32], StorageError> {
    let tn = table_name(name, DIGESTS, g);
    let def: TableDefinition<u64, &[u8]> = TableDefinition::new(&tn);
    let t = txn.open_table(def).map_err(StorageError::of)?;
    let last = t.range(..=b).map_err(StorageError::of)?.next_back();
    Ok(match last {
        Some(row) => {
            let (_, v) = row.map_err(StorageError::of)?;
            v.value().try_into().unwrap_or([0; 32])
        }
        None => [0; 32],
    })
}

/// The first range `(a, b]` in `(after, upto]` (boundaries every [`DIGEST_EVERY`], and `upto`
/// itself when `at_end`, where the live model's digest is `live_end`) where the two
/// generations' digests differ.
fn first_differing_range(
    txn: &WriteTransaction,
    name: &str,
    (live, new): (u32, u32),
    (after, upto): (u64, u64),
    at_end: Option<([u8; 32], [u8; 32])>,
) -> Result<Option<(u64, u64)>, StorageError> {
    let mut a = after;
    let mut b = (after / DIGEST_EVERY + 1) * DIGEST_EVERY;
    while b <= upto {
        if digest_at(txn, name, live, b)? != digest_at(txn, name, new, b)? {
            return Ok(Some((a, b)));
        }
        a = b;
        b += DIGEST_EVERY;
    }
    match at_end {
        Some((x, y)) if x != y => Ok(Some((a, upto))),
        _ => Ok(None),
    }
}

/// Rebuild (`swap = true`) or verify (`swap = false`) one projection. `progress(done, head)` is
/// called after each chunk. Blocking.
pub fn rebuild(
    models: &Models,
    log: &impl EventLog,
    p: &'static dyn Projection,
    swap: bool,
    progress: impl Fn(u64, u64),
) -> Result<RebuildReport, StorageError> {
    let mut reports = rebuild_many(models, log, vec![p], swap, progress)?;
    Ok(reports.remove(0))
}

/// Rebuild or verify several projections in one pass over the log: each chunk of events is
/// read and decoded once and folded into every projection's new generation (a rebuild of all
/// six read the log six times). Each report's `duration_ms` is the whole pass. Blocking.
pub fn rebuild_many(
    models: &Models,
    log: &impl EventLog,
    projections: Vec<&'static dyn Projection>,
    swap: bool,
    progress: impl Fn(u64, u64),
) -> Result<Vec<RebuildReport>, StorageError> {
    let started = Instant::now();
    // Start a fresh generation of each, clearing what an interrupted rebuild may have left:
    // empty, or — when the log was compacted (spec section 13) — a copy of the projection's
    // snapshot, folded forward from the snapshot's seq.
    let first = log.first_seq()?;
    let (mut states, mut from) = {
        let txn = models.begin_synced()?;
        let mut states = Vec::with_capacity(projections.len());
        let mut from: Option<u64> = None;
        for p in &projections {
            let live = read_meta(&txn, p.name())?;
            drop_other_generations(&txn, p.name(), live.generation)?;
            let generation = live.generation + 1;
            let new = if first > 1 {
                let snap = restore_snapshot(&txn, *p, generation)?
                    .filter(|m| m.checkpoint + 1 >= first && m.version == p.version())
                    .ok_or_else(|| {
                        StorageError::msg(format!(
                            "the log starts at seq {first} (compacted) and projection {} \
                             has no snapshot of this format at or after it",
                            p.name()
                        ))
                    })?;
                if from.is_some_and(|f| f != snap.checkpoint) {
                    return Err(StorageError::msg(
                        "the projections' snapshots are at different seqs: rebuild them \
                         one at a time",
                    ));
                }
                from = Some(snap.checkpoint);
                snap
            } else {
                Meta {
                    generation,
                    version: p.version(),
                    ..Meta::default()
                }
            };
            states.push(Progress {
                new,
                live_generation: live.generation,
                first_divergent: None,
                done: false,
            });
        }
        txn.commit().map_err(StorageError::of)?;
        (states, from.unwrap_or(0))
    };
    // One buffer for every chunk's events (2 MB at 10,000 events: fresh memory per chunk
    // was a tenth of a rebuild, in the kernel zeroing pages), and one for the live models'.
    let mut events = EventChunk::default();
    let mut live = EventChunk::default();
    // The events a transaction folds: one chunk while the rebuild gains on the head; doubled
    // each time the head got further away during the last one (appends outpacing the fold),
    // and after [`OUTPACED`] such chunks in a row, the rest up to the head at once. With fixed
    // chunks a rebuild under appends faster than its fold chased the head for ever; doubling
    // alone still does when they are more than twice as fast. Only the transactions that must
    // be longer are.
    let mut step = CHUNK;
    let mut last_gap = u64::MAX;
    let mut outpaced = 0;
    while !states.iter().all(|s| s.done) {
        let txn = models.begin_synced()?;
        // The live models follow the log: bring them to the head first, so the live digests
        // this chunk is compared with are complete.
        let head = log.head();
        crate::framework::catch_up(
            crate::framework::TxMut::Redb(&txn),
            &crate::all(),
            log,
            head,
            u64::MAX,
            &mut live,
        )?;
        let gap = head.saturating_sub(from);
        if gap >= last_gap {
            outpaced += 1;
            step = if outpaced >= OUTPACED {
                u64::MAX
            } else {
                step.saturating_mul(2)
            };
        } else {
            outpaced = 0;
        }
        last_gap = gap;
        let upto = head.min(from.saturating_add(step));
        events.read(log, from, upto).map_err(StorageError::of)?;
        {
            let batch = events.events()?;
            for (p, s) in projections.iter().zip(states.iter_mut()) {
                chunk(&txn, *p, s, &batch, (from, upto), head, swap)?;
            }
        }
        txn.commit().map_err(StorageError::of)?;
        progress(upto, head);
        from = upto;
    }
    let duration_ms = started.elapsed().as_millis() as u64;
    let reports: Vec<RebuildReport> = projections
        .iter()
        .zip(states)
        .map(|(p, s)| RebuildReport {
            name: p.name().to_owned(),
            events_replayed: s.new.checkpoint,
            duration_ms,
            digest: hex::encode(s.new.digest),
            identical: s.first_divergent.is_none(),
            first_divergent_seq: s.first_divergent,
            swapped: swap,
        })
        .collect();
    for r in &reports {
        tracing::info!(
            projection = r.name,
            events = r.events_replayed,
            identical = r.identical,
            swapped = swap,
            ms = r.duration_ms,
            "rebuild finished"
        );
    }
    Ok(reports)
}

/// Fold one chunk `(from, upto]` of the log into `p`'s new generation, compare it with the
/// live one, and at the head switch to it (`swap`) or drop it.
fn chunk(
    txn: &WriteTransaction,
    p: &'static dyn Projection,
    s: &mut Progress,
    batch: &[EventRef<'_>],
    (from, upto): (u64, u64),
    head: u64,
    swap: bool,
) -> Result<(), StorageError> {
    let name = p.name();
    let changed = fold_events(
        TxMut::Redb(txn),
        p,
        s.new.generation,
        batch,
        &mut s.new,
        true,
    )?;
    s.new.checkpoint = upto;
    if s.first_divergent.is_none() {
        let at_end = if upto == head {
            Some((read_meta(txn, name)?.digest, s.new.digest))
        } else {
            None
        };
        let range = first_differing_range(
            txn,
            name,
            (s.live_generation, s.new.generation),
            (from, upto),
            at_end,
        )?;
        // Locate it within the range: the first event there that changed the rebuilt model
        // (the digests agree before the range, so the live one parted at an event the fold
        // changes, or — when the rebuilt model did not change in the range at all — at its
        // start).
        s.first_divergent = range.map(|(a, b)| {
            changed
                .iter()
                .copied()
                .find(|c| *c > a && *c <= b)
                .unwrap_or(a + 1)
        });
    }
    if upto == head {
        s.done = true;
        if swap {
            write_meta(txn, name, &s.new)?;
            drop_other_generations(txn, name, s.new.generation)?;
        } else {
            drop_other_generations(txn, name, s.live_generation)?;
        }
    }
    Ok(())
}
