//! Rebuild and verify: fold the whole log into a fresh generation of a projection, chunk by
//! chunk inside the writer (appends go on between chunks), compare its digest chain with the
//! live one, and — for a rebuild — switch to it in the transaction that catches up with the
//! head.

use std::time::Instant;
use tidemark_log::StorageError;

use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::Serialize;
use tidemark_log::{CommandError, Log, scan_events};

use crate::framework::{
    Meta, Projection, drop_other_generations, fold_all, read_meta, table_name, write_meta,
};

/// Events folded per writer transaction.
pub const CHUNK: u64 = 50_000;

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

/// First seq in `(after, upto]` where the digest chains of two generations differ.
fn first_difference(
    txn: &WriteTransaction,
    name: &str,
    live: u32,
    new: u32,
    after: u64,
    upto: u64,
) -> Result<Option<u64>, StorageError> {
    let open = |g: u32| -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let tn = table_name(name, "digests", g);
        let def: TableDefinition<u64, &[u8]> = TableDefinition::new(&tn);
        let t = txn.open_table(def).map_err(StorageError::of)?;
        let mut out = Vec::new();
        for row in t.range(after + 1..=upto).map_err(StorageError::of)? {
            let (k, v) = row.map_err(StorageError::of)?;
            out.push((k.value(), v.value().to_vec()));
        }
        Ok(out)
    };
    let a = open(live)?;
    let b = open(new)?;
    for i in 0..a.len().max(b.len()) {
        match (a.get(i), b.get(i)) {
            (Some(x), Some(y)) if x == y => continue,
            (Some(x), Some(y)) => return Ok(Some(x.0.min(y.0))),
            (Some(x), None) => return Ok(Some(x.0)),
            (None, Some(y)) => return Ok(Some(y.0)),
            (None, None) => break,
        }
    }
    Ok(None)
}

/// Rebuild (`swap = true`) or verify (`swap = false`) one projection. `progress(done, head)` is
/// called after each chunk.
pub async fn rebuild(
    log: &Log,
    p: &'static dyn Projection,
    swap: bool,
    progress: impl Fn(u64, u64),
) -> Result<RebuildReport, CommandError> {
    let started = Instant::now();
    let name = p.name();
    let st = CommandError::Storage;
    // Start a fresh generation, clearing what an interrupted rebuild may have left.
    let (mut state, _) = log
        .command(true, move |txn, _head| {
            let live = read_meta(txn, name).map_err(st)?;
            drop_other_generations(txn, name, live.generation).map_err(st)?;
            let new = Meta {
                generation: live.generation + 1,
                version: p.version(),
                ..Meta::default()
            };
            Ok((
                Progress {
                    new,
                    live_generation: live.generation,
                    first_divergent: None,
                    done: false,
                },
                Vec::new(),
            ))
        })
        .await?;
    while !state.done {
        let (next, _) = log
            .command(true, move |txn, head| {
                // The live models follow the log: bring them to the head first, so the live
                // chain this chunk is compared with is complete.
                crate::framework::catch_up(txn, &crate::all(), head, u64::MAX).map_err(st)?;
                let mut s = state;
                let from = s.new.checkpoint;
                let upto = head.min(from + CHUNK);
                let mut batch = Vec::new();
                scan_events(txn, from, upto, |ev| {
                    batch.push(ev);
                    Ok(true)
                })
                .map_err(st)?;
                fold_all(txn, p, s.new.generation, &batch, &mut s.new).map_err(st)?;
                s.new.checkpoint = upto;
                if s.first_divergent.is_none() {
                    s.first_divergent = first_difference(
                        txn,
                        name,
                        s.live_generation,
                        s.new.generation,
                        from,
                        upto,
                    )
                    .map_err(st)?;
                }
                if upto == head {
                    s.done = true;
                    if swap {
                        write_meta(txn, name, &s.new).map_err(st)?;
                        drop_other_generations(txn, name, s.new.generation).map_err(st)?;
                    } else {
                        drop_other_generations(txn, name, s.live_generation).map_err(st)?;
                    }
                }
                let head_now = head;
                Ok(((s, head_now), Vec::new()))
            })
            .await?;
        let (s, head) = next;
        progress(s.new.checkpoint, head);
        state = s;
    }
    let report = RebuildReport {
        name: name.to_owned(),
        events_replayed: state.new.checkpoint,
        duration_ms: started.elapsed().as_millis() as u64,
        digest: hex::encode(state.new.digest),
        identical: state.first_divergent.is_none(),
        first_divergent_seq: state.first_divergent,
        swapped: swap,
    };
    tracing::info!(
        projection = name,
        events = report.events_replayed,
        identical = report.identical,
        swapped = swap,
        ms = report.duration_ms,
        "rebuild finished"
    );
    Ok(report)
}
