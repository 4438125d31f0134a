//! The store's runtime: metas, folding events into every projection ([`catch_up`]), the
//! lowest checkpoint, and putting the tables in order at open ([`prepare`]).

use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};
use tidemark_log::{EventChunk, EventLog, EventRef, StorageError};

use super::access::TxMut;
use super::{Bytes, META, Meta, Projection, Store};

pub(crate) fn read_meta_opt(
    txn: &WriteTransaction,
    name: &str,
) -> Result<Option<Meta>, StorageError> {
    meta_in(txn, META, name)
}

/// The [`Meta`] stored under `name` in `table` (the live metas, or the snapshots').
pub(super) fn meta_in(
    txn: &WriteTransaction,
    table: TableDefinition<&str, &[u8]>,
    name: &str,
) -> Result<Option<Meta>, StorageError> {
    let t = txn.open_table(table).map_err(StorageError::of)?;
    let v = t.get(name).map_err(StorageError::of)?;
    match v {
        Some(b) => postcard::from_bytes(b.value())
            .map(Some)
            .map_err(StorageError::of),
        None => Ok(None),
    }
}

pub(crate) fn read_meta(txn: &WriteTransaction, name: &str) -> Result<Meta, StorageError> {
    Ok(read_meta_opt(txn, name)?.unwrap_or_default())
}

pub(crate) fn write_meta(txn: &WriteTransaction, name: &str, m: &Meta) -> Result<(), StorageError> {
    let mut t = txn.open_table(META).map_err(StorageError::of)?;
    let b = postcard::to_stdvec(m).map_err(StorageError::of)?;
    t.insert(name, b.as_slice()).map_err(StorageError::of)?;
    Ok(())
}

/// Fold `events` into projection `p` at `generation`, advancing `meta`; answers (when
/// `note_changes`) the seqs of the events that changed the model.
pub(crate) fn fold_events(
    tx: TxMut<'_>,
    p: &dyn Projection,
    generation: u32,
    events: &[EventRef<'_>],
    meta: &mut Meta,
    note_changes: bool,
) -> Result<Vec<u64>, StorageError> {
    let mut st = Store::new(tx, p.name(), generation);
    if note_changes {
        st.changed_at = Some(Vec::new());
    }
    for ev in events {
        st.fold(p, ev, meta)?;
    }
    st.flush()?;
    Ok(st.changed_at.take().unwrap_or_default())
}

/// Drop every table of projection `name` (every tenant's) whose generation is not `keep`.
pub(crate) fn drop_other_generations(
    txn: &WriteTransaction,
    name: &str,
    keep: u32,
) -> Result<usize, StorageError> {
    let (prefix, of_tenant) = (format!("p.{name}."), format!("p.{name}@"));
    let keep_suffix = format!(".g{keep}");
    let stale: Vec<String> = txn
        .list_tables()
        .map_err(StorageError::of)?
        .map(|h| h.name().to_owned())
        .filter(|n| {
            (n.starts_with(&prefix) || n.starts_with(&of_tenant)) && !n.ends_with(&keep_suffix)
        })
        .collect();
    for n in &stale {
        // Table types differ (digests are u64-keyed); delete by untyped name.
        let def: TableDefinition<Bytes, Bytes> = TableDefinition::new(n);
        if txn.delete_table(def).is_err() {
            let def: TableDefinition<u64, &[u8]> = TableDefinition::new(n);
            txn.delete_table(def).map_err(StorageError::of)?;
        }
    }
    Ok(stale.len())
}

/// Where a fold failed: reading the log's events (the log's fault domain: the models are
/// as they were), or the models store's tables.
#[derive(Debug, thiserror::Error)]
pub enum FoldError {
    #[error("reading the log: {0}")]
    Log(StorageError),
    #[error(transparent)]
    Models(#[from] StorageError),
}

impl From<FoldError> for StorageError {
    /// For a caller with one fault domain (a rebuild, the start, tools): the log's failure
    /// keeps its context.
    fn from(e: FoldError) -> Self {
        match e {
            FoldError::Log(e) => e.context("reading the log"),
            FoldError::Models(e) => e,
        }
    }
}

/// Fold every projection of `projections` forward from its checkpoint towards `upto` — at
/// most `max` events past the lowest checkpoint — in `txn` (a transaction of the models
/// store), with the fold code a rebuild uses; the events are read from `log` once for all of
/// them, into `chunk` (a buffer reused from one call to the next). The subjects' last seqs
/// ([`crate::framework::subjects`]) follow too. Returns the lowest checkpoint after.
pub fn catch_up(
    mut tx: TxMut<'_>,
    projections: &[&'static dyn Projection],
    log: &impl EventLog,
    upto: u64,
    max: u64,
    chunk: &mut EventChunk,
) -> Result<u64, FoldError> {
    let mut metas = Vec::with_capacity(projections.len());
    {
        let src = tx.src();
        for p in projections {
            metas.push(src.meta(p.name())?.unwrap_or_else(|| Meta {
                version: p.version(),
                ..Meta::default()
            }));
        }
    }
    let subjects_at = crate::framework::subjects::checkpoint(tx.src(), log)?;
    let from = metas
        .iter()
        .map(|m| m.checkpoint)
        .min()
        .unwrap_or(upto)
        .min(subjects_at);
    if from >= upto {
        return Ok(from);
    }
    let end = upto.min(from.saturating_add(max.max(1)));
    chunk
        .read(log, from, end)
        .map_err(|e| FoldError::Log(StorageError::of(e)))?;
    let events = chunk.events().map_err(FoldError::Log)?;
    for (p, meta) in projections.iter().zip(metas.iter_mut()) {
        if meta.checkpoint >= end {
            continue;
        }
        let start = events.partition_point(|e| e.seq <= meta.checkpoint);
        fold_events(
            tx.reborrow(),
            *p,
            meta.generation,
            &events[start..],
            meta,
            false,
        )?;
        meta.checkpoint = end;
        tx.put_meta(p.name(), meta)?;
    }
    if subjects_at < end {
        let start = events.partition_point(|e| e.seq <= subjects_at);
        crate::framework::subjects::record(tx.reborrow(), &events[start..], end)?;
    }
    Ok(metas.iter().map(|m| m.checkpoint).min().unwrap_or(end))
}

/// The lowest checkpoint of `projections` in one read transaction: every read model reflects
/// the log at least up to it.
pub fn checkpoint(
    db: &crate::framework::ModelsRead,
    projections: &[&'static dyn Projection],
) -> Result<u64, StorageError> {
    let snap = db.snapshot()?;
    let mut low = u64::MAX;
    for p in projections {
        low = low.min(snap.src().meta(p.name())?.unwrap_or_default().checkpoint);
    }
    Ok(if low == u64::MAX { 0 } else { low })
}

/// Put the projections' tables in order at open: drop what an interrupted rebuild left, and
/// start over (a new generation, folded from the log) a projection whose format changed.
/// Catching up with the log is the follower's work.
pub fn prepare(
    txn: &WriteTransaction,
    projections: &[&'static dyn Projection],
) -> Result<(), StorageError> {
    for p in projections {
        let stored = read_meta_opt(txn, p.name())?;
        let meta = match &stored {
            None => Meta {
                version: p.version(),
                ..Meta::default()
            },
            Some(m) if m.version != p.version() => {
                tracing::warn!(
                    projection = p.name(),
                    stored = m.version,
                    code = p.version(),
                    "projection format changed; rebuilding it from the log"
                );
                Meta {
                    generation: m.generation + 1,
                    version: p.version(),
                    ..Meta::default()
                }
            }
            Some(m) => m.clone(),
        };
        let dropped = drop_other_generations(txn, p.name(), meta.generation)?;
        if dropped > 0 {
            tracing::warn!(
                projection = p.name(),
                tables = dropped,
                "dropped tables of an unfinished rebuild or of an older projection format"
            );
        }
        if stored.as_ref() != Some(&meta) {
            write_meta(txn, p.name(), &meta)?;
        }
    }
    Ok(())
}
