//! The projection framework: pure folds over the log, kept in redb tables of the log's file,
//! each with a checkpoint written in the same transaction as its state and a running digest.
//! The engine's follower folds committed events in batches ([`catch_up`]); a command catches
//! the models up to the head before it decides; readers wait until the models reach the head
//! of their request's arrival (`tidemark_engine::Queries`). Fold tests use [`Projector::new`],
//! which folds every commit's events inside that commit.
//!
//! Tables of a projection are named `p.<projection>.<table>.g<generation>`. A rebuild folds the
//! log into generation `g+1` in chunks, and in the transaction that catches it up with the
//! head it switches the projection's meta row to `g+1` and drops generation `g`: readers see the
//! old model or the new one, never a half-built one.
//!
//! # Digest
//! Every write of a projection (table, key, value or deletion) while folding event `seq` is
//! hashed; when an event changed anything, the running digest becomes
//! `blake3(previous digest ‖ seq ‖ hash of the writes)`. The running digest is recorded in the
//! projection's `digests` table at fixed seq boundaries, every [`DIGEST_EVERY`] events (the
//! digest after folding every event up to and including the boundary), the same live and in a
//! rebuild (spec section 10). Two folds of the same log give the same rows; comparing two
//! generations finds the first boundary where they differ, and the rebuild names the first
//! event of that range which changed the model. (Data directories written before the
//! boundaries kept a row at every changing event; the digest at a boundary is read as the last
//! row at or before it, which is the same value in both layouts.)

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use tidemark_log::StorageError;

use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle, WriteTransaction};
use serde::{Deserialize, Serialize};
use tidemark_log::{EventChunk, EventLog, EventRef};

/// A u64 stored big-endian (counters, checkpoints), or `None` when the bytes are not one.
/// A row of a `by_created` index (the newest-first lists of tasks and deliveries):
/// `key (8 bytes, big-endian) ‖ id`, so rows order by creation key, then id.
pub(crate) fn created_row(key: u64, id: &str) -> Vec<u8> {
    [&key.to_be_bytes()[..], id.as_bytes()].concat()
}

pub fn be_u64(b: &[u8]) -> Option<u64> {
    b.try_into().ok().map(u64::from_be_bytes)
}

/// The table of a projection's digests at seq boundaries (u64-keyed).
pub(crate) const DIGESTS: &str = "digests";

/// Per-projection bookkeeping, one row of the `projections` table.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("projections");

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub generation: u32,
    /// Last seq folded.
    pub checkpoint: u64,
    pub digest: [u8; 32],
    /// Number of events that changed this projection.
    pub changes: u64,
    /// [`Projection::version`] of the code that built these tables.
    pub version: u32,
}

/// A projection: a pure fold of events into its tables. `apply` must depend only on the
/// event and the projection's own state: no clock, randomness or configuration (I3).
pub trait Projection: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Names of its tables (besides `digests`).
    fn tables(&self) -> &'static [&'static str];
    /// Fold one event, borrowed from the log: copy only what the model keeps.
    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError>;
    /// Bump when the stored rows or the fold change: at the next start the projection is
    /// rebuilt from the log instead of folding new events onto rows of another shape.
    fn version(&self) -> u32 {
        1
    }
}

pub(crate) fn table_name(proj: &str, table: &str, generation: u32) -> String {
    format!("p.{proj}.{table}.g{generation}")
}

pub(crate) type Bytes = &'static [u8];

/// Write access to one projection's tables at one generation, recording the digest.
pub struct Store<'t> {
    tables: TxnTables<'t>,
    /// Writes not yet in the tables: a fold of many events touches the same rows again and
    /// again (a task gets ~8 events), so they are coalesced here and written once, sorted by
    /// key, by `flush`. The digest does not see this: it hashes every write as it is made.
    pending: FxHashMap<&'static str, FxHashMap<Vec<u8>, Option<Vec<u8>>>>,
    pending_len: usize,
    /// Rows kept decoded between events ([`Store::take_row`] / [`Store::put_row`]): a row a
    /// fold rewrites at every event (a task) is decoded once and encoded once per flush, not
    /// at each event. Encoded into `pending` by `flush` (or when read as bytes).
    rows: FxHashMap<&'static str, FxHashMap<Vec<u8>, Decoded>>,
    /// Reused buffer that the digest hashes an encoded row from.
    scratch: Vec<u8>,
    /// Digests at the boundaries passed, not yet written.
    boundaries: Vec<(u64, [u8; 32])>,
    /// Seqs of the events that changed the model, when the caller asked for them (a rebuild
    /// locating a divergence).
    changed_at: Option<Vec<u64>>,
    change: blake3::Hasher,
    changed: bool,
}

/// The running digest is recorded at every seq that is a multiple of this (spec section 10).
pub const DIGEST_EVERY: u64 = 1000;

/// A row kept decoded by [`Store::put_row`], with the function that encodes it.
struct Decoded {
    /// `None` while a fold has it taken out.
    row: Option<Box<dyn std::any::Any + Send>>,
    encode: fn(&(dyn std::any::Any + Send), &mut Vec<u8>) -> Result<(), StorageError>,
}

impl Decoded {
    fn row(&self, table: &str) -> Result<&(dyn std::any::Any + Send), StorageError> {
        self.row.as_deref().ok_or_else(|| taken(table))
    }
}

fn taken(table: &str) -> StorageError {
    StorageError::new(
        format!("a row of {table} was taken by a fold and not put back"),
        std::io::Error::other("row taken"),
    )
}

fn encode_as<T: Serialize + 'static>(
    row: &(dyn std::any::Any + Send),
    out: &mut Vec<u8>,
) -> Result<(), StorageError> {
    let row = row
        .downcast_ref::<T>()
        .expect("encode_as is stored with a row of its type");
    let buf = postcard::to_extend(row, std::mem::take(out)).map_err(StorageError::of)?;
    *out = buf;
    Ok(())
}

/// Coalesced writes are flushed after this many events even inside one transaction.
const FLUSH_EVERY: usize = 50_000;

impl<'t> Store<'t> {
    fn new(txn: &'t WriteTransaction, proj: &'static str, generation: u32) -> Self {
        Store {
            tables: TxnTables::at(txn, proj, generation),
            pending: FxHashMap::default(),
            pending_len: 0,
            rows: FxHashMap::default(),
            scratch: Vec::new(),
            boundaries: Vec::new(),
            changed_at: None,
            change: blake3::Hasher::new(),
            changed: false,
        }
    }

    pub fn get(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(d) = self.rows.get(table).and_then(|t| t.get(key)) {
            let mut out = Vec::new();
            (d.encode)(d.row(table)?, &mut out)?;
            return Ok(Some(out));
        }
        if let Some(v) = self.pending.get(table).and_then(|t| t.get(key)) {
            return Ok(v.clone());
        }
        self.tables.get(table, key)
    }

    /// Whether `key` has a row (a row kept decoded is not encoded to answer).
    pub fn contains(&mut self, table: &'static str, key: &[u8]) -> Result<bool, StorageError> {
        if let Some(d) = self.rows.get(table).and_then(|t| t.get(key)) {
            d.row(table)?;
            return Ok(true);
        }
        if let Some(v) = self.pending.get(table).and_then(|t| t.get(key)) {
            return Ok(v.is_some());
        }
        Ok(self
            .tables
            .table(table)?
            .get(key)
            .map_err(StorageError::of)?
            .is_some())
    }

    /// Take a row out to fold it, decoded: from the rows kept decoded when it is there
    /// (nothing is decoded or copied), else from the staged writes or the table. A row taken
    /// from the decoded ones must be put back with [`Store::put_row`] (or overwritten or
    /// deleted) before the next flush, which otherwise fails the transaction rather than lose
    /// the row's staged state.
    pub fn take_row<T>(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError>
    where
        T: Serialize + for<'de> Deserialize<'de> + Send + 'static,
    {
        if let Some(d) = self.rows.get_mut(table).and_then(|t| t.get_mut(key)) {
            let row = d.row.take().ok_or_else(|| taken(table))?;
            return match row.downcast::<T>() {
                Ok(row) => Ok(Some(*row)),
                Err(_) => Err(StorageError::new(
                    format!("a row of {table} taken as another type"),
                    std::io::Error::other("type mismatch"),
                )),
            };
        }
        if let Some(v) = self.pending.get(table).and_then(|t| t.get(key)) {
            return match v {
                Some(b) => postcard::from_bytes(b).map(Some).map_err(StorageError::of),
                None => Ok(None),
            };
        }
        self.tables.get_val(table, key)
    }

    /// Write a row taken with [`Store::take_row`] (or a new one): hashed into the digest as
    /// its encoding (in a reused buffer), kept decoded for the next event, encoded into the
    /// table at the flush.
    pub fn put_row<T>(
        &mut self,
        table: &'static str,
        key: &[u8],
        row: T,
    ) -> Result<(), StorageError>
    where
        T: Serialize + Send + 'static,
    {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        let buf = postcard::to_extend(&row, buf).map_err(StorageError::of)?;
        self.note(table, key, Some(&buf));
        self.scratch = buf;
        // The bytes staged earlier (if any) are superseded by the decoded row.
        if let Some(t) = self.pending.get_mut(table)
            && t.remove(key).is_some()
        {
            self.pending_len -= 1;
        }
        let t = self.rows.entry(table).or_default();
        let d = Decoded {
            row: Some(Box::new(row)),
            encode: encode_as::<T>,
        };
        match t.get_mut(key) {
            Some(slot) => *slot = d,
            None => {
                t.insert(key.to_vec(), d);
                self.pending_len += 1;
            }
        }
        Ok(())
    }

    pub fn put(
        &mut self,
        table: &'static str,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StorageError> {
        self.note(table, key, Some(value));
        if self.rows.get(table).is_none_or(|t| !t.contains_key(key))
            && let Some(Some(staged)) = self.pending.get_mut(table).and_then(|t| t.get_mut(key))
        {
            // Written again (a counter, an index row): reuse the staged buffer.
            staged.clear();
            staged.extend_from_slice(value);
            return Ok(());
        }
        self.stage(table, key, Some(value.to_vec()));
        Ok(())
    }

    pub fn delete(&mut self, table: &'static str, key: &[u8]) -> Result<(), StorageError> {
        self.note(table, key, None);
        self.stage(table, key, None);
        Ok(())
    }

    /// Write a row of a secondary index: a pure function of rows this projection writes
    /// through [`Store::put`], so it is left out of the digest (the rows it derives from are
    /// in it). Indexes added after the golden release are written this way, so that adding
    /// one rebuilds the projection at the next open without changing its digest.
    pub fn put_index(&mut self, table: &'static str, key: &[u8]) {
        self.stage(table, key, Some(Vec::new()));
    }

    /// Keys of `table` that start with `prefix`, as the table stands with every write of the
    /// fold so far (they are flushed first: call it while no row is taken out).
    pub fn prefix_keys(
        &mut self,
        table: &'static str,
        prefix: &[u8],
    ) -> Result<Vec<Vec<u8>>, StorageError> {
        self.flush()?;
        let mut out = Vec::new();
        for row in self
            .tables
            .table(table)?
            .range(prefix..)
            .map_err(StorageError::of)?
        {
            let (k, _) = row.map_err(StorageError::of)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push(k.value().to_vec());
        }
        Ok(out)
    }

    /// Delete a row of a secondary index (see [`Store::put_index`]).
    pub fn delete_index(&mut self, table: &'static str, key: &[u8]) {
        self.stage(table, key, None);
    }

    fn stage(&mut self, table: &'static str, key: &[u8], value: Option<Vec<u8>>) {
        if let Some(t) = self.rows.get_mut(table)
            && t.remove(key).is_some()
        {
            self.pending_len -= 1;
        }
        let t = self.pending.entry(table).or_default();
        match t.get_mut(key) {
            Some(slot) => *slot = value,
            None => {
                t.insert(key.to_vec(), value);
                self.pending_len += 1;
            }
        }
    }

    pub fn get_val<T: for<'de> Deserialize<'de>>(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        decode(self.get(table, key)?)
    }

    pub fn put_val<T: Serialize>(
        &mut self,
        table: &'static str,
        key: &[u8],
        v: &T,
    ) -> Result<(), StorageError> {
        let bytes = postcard::to_stdvec(v).map_err(StorageError::of)?;
        self.put(table, key, &bytes)
    }

    fn note(&mut self, table: &str, key: &[u8], value: Option<&[u8]>) {
        self.changed = true;
        let h = &mut self.change;
        h.update(&(table.len() as u32).to_le_bytes());
        h.update(table.as_bytes());
        h.update(&(key.len() as u32).to_le_bytes());
        h.update(key);
        match value {
            Some(v) => {
                h.update(&[1]);
                h.update(&(v.len() as u32).to_le_bytes());
                h.update(v);
            }
            None => {
                h.update(&[0]);
            }
        }
    }

    /// Fold one event, extending `meta`'s digest chain when it changed anything.
    fn fold(
        &mut self,
        p: &dyn Projection,
        ev: &EventRef<'_>,
        meta: &mut Meta,
    ) -> Result<(), StorageError> {
        // A boundary between the last event folded and this one (seqs are dense, so only when
        // the model was moved past events it did not fold) still records the digest there.
        let passed = (ev.seq - 1) / DIGEST_EVERY * DIGEST_EVERY;
        if passed > meta.checkpoint {
            self.boundaries.push((passed, meta.digest));
        }
        self.change.reset();
        self.changed = false;
        p.apply(self, ev)?;
        if self.changed {
            let mut h = blake3::Hasher::new();
            h.update(&meta.digest);
            h.update(&ev.seq.to_le_bytes());
            h.update(self.change.finalize().as_bytes());
            meta.digest = *h.finalize().as_bytes();
            meta.changes += 1;
            if let Some(c) = &mut self.changed_at {
                c.push(ev.seq);
            }
        }
        meta.checkpoint = ev.seq;
        if ev.seq.is_multiple_of(DIGEST_EVERY) {
            self.boundaries.push((ev.seq, meta.digest));
        }
        if self.pending_len >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(())
    }

    /// Write the coalesced changes into the tables. Must be called before the store is dropped.
    fn flush(&mut self) -> Result<(), StorageError> {
        for (table, rows) in std::mem::take(&mut self.rows) {
            let t = self.pending.entry(table).or_default();
            for (key, d) in rows {
                let mut out = Vec::new();
                (d.encode)(d.row(table)?, &mut out)?;
                t.insert(key, Some(out));
            }
        }
        let mut pending: Vec<_> = std::mem::take(&mut self.pending).into_iter().collect();
        pending.sort_unstable_by_key(|(t, _)| *t);
        self.pending_len = 0;
        for (table, rows) in pending {
            let t = self.tables.table_mut(table)?;
            let mut rows: Vec<_> = rows.into_iter().collect();
            rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            for (key, value) in rows {
                match value {
                    Some(v) => t.insert(key.as_slice(), v.as_slice()).map(drop),
                    None => t.remove(key.as_slice()).map(drop),
                }
                .map_err(StorageError::of)?;
            }
        }
        if !self.boundaries.is_empty() {
            let name = table_name(self.tables.proj, DIGESTS, self.tables.generation);
            let def: TableDefinition<u64, &[u8]> = TableDefinition::new(&name);
            let mut t = self.tables.txn.open_table(def).map_err(StorageError::of)?;
            for (seq, d) in self.boundaries.drain(..) {
                t.insert(seq, d.as_slice()).map_err(StorageError::of)?;
            }
        }
        Ok(())
    }
}

pub(crate) fn read_meta_opt(
    txn: &WriteTransaction,
    name: &str,
) -> Result<Option<Meta>, StorageError> {
    meta_in(txn, META, name)
}

/// The [`Meta`] stored under `name` in `table` (the live metas, or the snapshots').
fn meta_in(
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

/// Fold `events` into projection `p` at `generation`, advancing `meta`.
pub(crate) fn fold_all(
    txn: &WriteTransaction,
    p: &dyn Projection,
    generation: u32,
    events: &[EventRef<'_>],
    meta: &mut Meta,
) -> Result<(), StorageError> {
    fold_events(txn, p, generation, events, meta, false).map(drop)
}

/// [`fold_all`], answering (when `note_changes`) the seqs of the events that changed the model.
pub(crate) fn fold_events(
    txn: &WriteTransaction,
    p: &dyn Projection,
    generation: u32,
    events: &[EventRef<'_>],
    meta: &mut Meta,
    note_changes: bool,
) -> Result<Vec<u64>, StorageError> {
    let mut st = Store::new(txn, p.name(), generation);
    if note_changes {
        st.changed_at = Some(Vec::new());
    }
    for ev in events {
        st.fold(p, ev, meta)?;
    }
    st.flush()?;
    Ok(st.changed_at.take().unwrap_or_default())
}

/// Drop every table of projection `name` whose generation is not `keep`.
pub(crate) fn drop_other_generations(
    txn: &WriteTransaction,
    name: &str,
    keep: u32,
) -> Result<usize, StorageError> {
    let prefix = format!("p.{name}.");
    let keep_suffix = format!(".g{keep}");
    let stale: Vec<String> = txn
        .list_tables()
        .map_err(StorageError::of)?
        .map(|h| h.name().to_owned())
        .filter(|n| n.starts_with(&prefix) && !n.ends_with(&keep_suffix))
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

/// Fold every projection of `projections` forward from its checkpoint towards `upto` — at
/// most `max` events past the lowest checkpoint — in `txn` (a transaction of the models
/// store), with the fold code a rebuild uses; the events are read from `log` once for all of
/// them, into `chunk` (a buffer reused from one call to the next). The subjects' last seqs
/// ([`crate::subjects`]) follow too. Returns the lowest checkpoint after.
pub fn catch_up(
    txn: &WriteTransaction,
    projections: &[&'static dyn Projection],
    log: &impl EventLog,
    upto: u64,
    max: u64,
    chunk: &mut EventChunk,
) -> Result<u64, StorageError> {
    let mut metas = Vec::with_capacity(projections.len());
    {
        let t = txn.open_table(META).map_err(StorageError::of)?;
        for p in projections {
            metas.push(match t.get(p.name()).map_err(StorageError::of)? {
                Some(b) => postcard::from_bytes::<Meta>(b.value()).map_err(StorageError::of)?,
                None => Meta {
                    version: p.version(),
                    ..Meta::default()
                },
            });
        }
    }
    let subjects_at = crate::subjects::checkpoint(txn, log)?;
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
    chunk.read(log, from, end).map_err(StorageError::of)?;
    let events = chunk.events()?;
    let mut t = None;
    for (p, meta) in projections.iter().zip(metas.iter_mut()) {
        if meta.checkpoint >= end {
            continue;
        }
        let start = events.partition_point(|e| e.seq <= meta.checkpoint);
        fold_all(txn, *p, meta.generation, &events[start..], meta)?;
        meta.checkpoint = end;
        let t = match &mut t {
            Some(t) => t,
            None => t.insert(txn.open_table(META).map_err(StorageError::of)?),
        };
        let b = postcard::to_stdvec(&*meta).map_err(StorageError::of)?;
        t.insert(p.name(), b.as_slice()).map_err(StorageError::of)?;
    }
    if subjects_at < end {
        let start = events.partition_point(|e| e.seq <= subjects_at);
        crate::subjects::record(txn, &events[start..], end)?;
    }
    Ok(metas.iter().map(|m| m.checkpoint).min().unwrap_or(end))
}

/// The lowest checkpoint of `projections` in one read transaction: every read model reflects
/// the log at least up to it.
pub fn checkpoint(
    db: &redb::Database,
    projections: &[&'static dyn Projection],
) -> Result<u64, StorageError> {
    let r = Reader::new(db)?;
    let mut low = u64::MAX;
    for p in projections {
        low = low.min(r.meta(p.name())?.checkpoint);
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

/// Read access to projections for the API: one read transaction, so everything read through
/// one `Reader` is one consistent state of the log.
pub struct Reader {
    txn: redb::ReadTransaction,
}

impl Reader {
    pub fn new(db: &redb::Database) -> Result<Reader, StorageError> {
        Ok(Reader {
            txn: db.begin_read().map_err(StorageError::of)?,
        })
    }

    pub fn meta(&self, name: &str) -> Result<Meta, StorageError> {
        let t = match self.txn.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Meta::default()),
            Err(e) => return Err(StorageError::of(e)),
        };
        match t.get(name).map_err(StorageError::of)? {
            Some(b) => postcard::from_bytes(b.value()).map_err(StorageError::of),
            None => Ok(Meta::default()),
        }
    }

    /// A projection table at its current generation, or `None` while it has no rows.
    pub fn table(
        &self,
        proj: &str,
        table: &str,
    ) -> Result<Option<redb::ReadOnlyTable<Bytes, Bytes>>, StorageError> {
        let generation = self.meta(proj)?.generation;
        let name = table_name(proj, table, generation);
        let def: TableDefinition<Bytes, Bytes> = TableDefinition::new(&name);
        match self.txn.open_table(def) {
            Ok(t) => Ok(Some(t)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(StorageError::of(e)),
        }
    }

    pub fn get_val<T: for<'de> Deserialize<'de>>(
        &self,
        proj: &str,
        table: &str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        let Some(t) = self.table(proj, table)? else {
            return Ok(None);
        };
        match t.get(key).map_err(StorageError::of)? {
            Some(v) => postcard::from_bytes(v.value())
                .map(Some)
                .map_err(StorageError::of),
            None => Ok(None),
        }
    }
}

/// A projection's tables inside the writer's transaction, each opened once: the fold writes
/// through them (`Store`), and commands that decide from state (claim, complete, ...) read
/// them, seeing every event committed or staged before them.
pub(crate) struct TxnTables<'t> {
    txn: &'t WriteTransaction,
    proj: &'static str,
    generation: u32,
    tables: HashMap<&'static str, redb::Table<'t, Bytes, Bytes>>,
}

impl<'t> TxnTables<'t> {
    /// The projection's tables at its current generation.
    pub fn new(txn: &'t WriteTransaction, proj: &'static str) -> Result<Self, StorageError> {
        let generation = read_meta(txn, proj)?.generation;
        Ok(Self::at(txn, proj, generation))
    }

    fn at(txn: &'t WriteTransaction, proj: &'static str, generation: u32) -> Self {
        TxnTables {
            txn,
            proj,
            generation,
            tables: HashMap::new(),
        }
    }

    /// The table (created empty when the projection has not written it yet).
    pub fn table(
        &mut self,
        table: &'static str,
    ) -> Result<&redb::Table<'t, Bytes, Bytes>, StorageError> {
        self.table_mut(table).map(|t| &*t)
    }

    fn table_mut(
        &mut self,
        table: &'static str,
    ) -> Result<&mut redb::Table<'t, Bytes, Bytes>, StorageError> {
        if !self.tables.contains_key(table) {
            let name = table_name(self.proj, table, self.generation);
            let def: TableDefinition<Bytes, Bytes> = TableDefinition::new(&name);
            let t = self.txn.open_table(def).map_err(StorageError::of)?;
            self.tables.insert(table, t);
        }
        Ok(self.tables.get_mut(table).expect("inserted above"))
    }

    pub fn get(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self
            .table(table)?
            .get(key)
            .map_err(StorageError::of)?
            .map(|v| v.value().to_vec()))
    }

    pub fn get_val<T: for<'de> Deserialize<'de>>(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        decode(self.get(table, key)?)
    }

    /// The keys of `table` that start with `prefix ‖ 0`, each the rest after it (an index's
    /// ids under one value: `prefix ‖ 0 ‖ id`).
    pub(crate) fn suffixes(
        &mut self,
        table: &'static str,
        prefix: &str,
    ) -> Result<Vec<String>, StorageError> {
        let lo = [prefix.as_bytes(), &[0u8]].concat();
        let hi = [prefix.as_bytes(), &[1u8]].concat();
        let mut out = Vec::new();
        for row in self
            .table(table)?
            .range(lo.as_slice()..hi.as_slice())
            .map_err(StorageError::of)?
        {
            let (k, _) = row.map_err(StorageError::of)?;
            out.push(String::from_utf8_lossy(&k.value()[lo.len()..]).into_owned());
        }
        Ok(out)
    }

    /// Every row of `table`, decoded, in key order.
    pub(crate) fn values<T: for<'de> Deserialize<'de>>(
        &mut self,
        table: &'static str,
    ) -> Result<Vec<T>, StorageError> {
        let mut out = Vec::new();
        for row in self.table(table)?.iter().map_err(StorageError::of)? {
            let (_, v) = row.map_err(StorageError::of)?;
            out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        }
        Ok(out)
    }
}

/// A stored row decoded with postcard.
fn decode<T: for<'de> Deserialize<'de>>(bytes: Option<Vec<u8>>) -> Result<Option<T>, StorageError> {
    match bytes {
        Some(b) => postcard::from_bytes(&b).map(Some).map_err(StorageError::of),
        None => Ok(None),
    }
}

/// Projection snapshots (spec section 13): before the log drops a prefix, every projection's
/// tables (and its digest chain) are copied as they stand at the head, so a rebuild can start
/// from there instead of from the first event. One snapshot per projection, replaced each time.
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("projection_snapshots");

fn snap_table(proj: &str, table: &str) -> String {
    format!("s.{proj}.{table}")
}

/// Replace table `to` with a copy of `from` (both `K → &[u8]`); a missing `from` leaves `to`
/// empty.
fn copy_table<K: redb::Key + 'static>(
    txn: &WriteTransaction,
    from: &str,
    to: &str,
) -> Result<(), StorageError>
where
    for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
{
    let to_def: TableDefinition<K, &[u8]> = TableDefinition::new(to);
    match txn.delete_table(to_def) {
        Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(StorageError::of(e)),
    }
    let exists = txn
        .list_tables()
        .map_err(StorageError::of)?
        .any(|h| h.name() == from);
    let mut dst = txn.open_table(to_def).map_err(StorageError::of)?;
    if !exists {
        return Ok(());
    }
    let from_def: TableDefinition<K, &[u8]> = TableDefinition::new(from);
    let src = txn.open_table(from_def).map_err(StorageError::of)?;
    for row in src.iter().map_err(StorageError::of)? {
        let (k, v) = row.map_err(StorageError::of)?;
        dst.insert(k.value(), v.value()).map_err(StorageError::of)?;
    }
    Ok(())
}

/// Copy `p`'s live tables and digest chain as its snapshot; answers the snapshot's meta.
pub(crate) fn snapshot(txn: &WriteTransaction, p: &dyn Projection) -> Result<Meta, StorageError> {
    let name = p.name();
    let live = read_meta(txn, name)?;
    for t in p.tables() {
        copy_table::<Bytes>(
            txn,
            &table_name(name, t, live.generation),
            &snap_table(name, t),
        )?;
    }
    copy_table::<u64>(
        txn,
        &table_name(name, DIGESTS, live.generation),
        &snap_table(name, DIGESTS),
    )?;
    let mut m = txn.open_table(SNAPSHOTS).map_err(StorageError::of)?;
    let b = postcard::to_stdvec(&live).map_err(StorageError::of)?;
    m.insert(name, b.as_slice()).map_err(StorageError::of)?;
    Ok(live)
}

/// The meta of `name`'s snapshot, if it has one.
pub fn snapshot_meta(txn: &WriteTransaction, name: &str) -> Result<Option<Meta>, StorageError> {
    meta_in(txn, SNAPSHOTS, name)
}

/// Start generation `generation` of `p` as a copy of its snapshot; answers the meta to go on
/// from (its checkpoint is the snapshot's seq), or `None` when it has no snapshot.
pub(crate) fn restore_snapshot(
    txn: &WriteTransaction,
    p: &dyn Projection,
    generation: u32,
) -> Result<Option<Meta>, StorageError> {
    let name = p.name();
    let Some(snap) = snapshot_meta(txn, name)? else {
        return Ok(None);
    };
    for t in p.tables() {
        copy_table::<Bytes>(txn, &snap_table(name, t), &table_name(name, t, generation))?;
    }
    copy_table::<u64>(
        txn,
        &snap_table(name, DIGESTS),
        &table_name(name, DIGESTS, generation),
    )?;
    Ok(Some(Meta { generation, ..snap }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_store(f: impl FnOnce(&mut Store<'_>)) {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("t.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        let mut st = Store::new(&txn, "x", 0);
        f(&mut st);
    }

    /// A decoded row reads back the same as its bytes would, through every path, and is
    /// hashed as its encoding (the same digest as `put_val`).
    #[test]
    fn decoded_rows_read_and_hash_like_bytes() {
        let row = (String::from("a"), 7u64, vec![1u32, 2]);
        let mut by_val = blake3::Hash::from([0; 32]);
        with_store(|st| {
            st.put_val("rows", b"k", &row).unwrap();
            by_val = st.change.finalize();
        });
        with_store(|st| {
            st.put_row("rows", b"k", row.clone()).unwrap();
            assert_eq!(st.change.finalize(), by_val);
            assert_eq!(
                st.get_val::<(String, u64, Vec<u32>)>("rows", b"k").unwrap(),
                Some(row.clone())
            );
            let mut r: (String, u64, Vec<u32>) = st.take_row("rows", b"k").unwrap().unwrap();
            r.1 += 1;
            st.put_row("rows", b"k", r).unwrap();
            st.flush().unwrap();
            let back: Option<(String, u64, Vec<u32>)> = st.take_row("rows", b"k").unwrap();
            assert_eq!(back.map(|b| b.1), Some(8));
        });
    }

    /// A row a fold took and never put back fails the flush instead of losing its staged state.
    #[test]
    fn a_row_taken_and_not_put_back_fails_the_flush() {
        with_store(|st| {
            st.put_row("rows", b"k", 1u64).unwrap();
            let _: Option<u64> = st.take_row("rows", b"k").unwrap();
            assert!(st.take_row::<u64>("rows", b"k").is_err(), "taken twice");
            assert!(st.flush().is_err());
        });
        with_store(|st| {
            st.put_row("rows", b"k", 1u64).unwrap();
            let _: Option<u64> = st.take_row("rows", b"k").unwrap();
            st.delete("rows", b"k").unwrap();
            st.flush().unwrap();
            assert_eq!(st.get("rows", b"k").unwrap(), None);
        });
    }
}
