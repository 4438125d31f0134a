//! A fold's write access to one projection's tables: writes coalesced until a flush, rows kept
//! decoded between events, every write hashed into the running digest.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use tidemark_log::{EventRef, StorageError};

use redb::TableDefinition;

use super::access::{Src, TxMut};
use super::cached::{Cached, CachedRow, Row};
use super::overlay::Overlay;
use super::tables::TableRef;
use super::tables::decode;
use super::{DIGESTS, Meta, Projection, Tables, table_name, tenant_table_name};

/// A table of one tenant: the index of the tenant in [`Store::tenants`], and the table.
type Slot = (u16, &'static str);

/// Write access to one projection's tables at one generation, recording the digest. Each
/// event is folded into its tenant's tables (spec section 20): the fold names a table, the
/// store picks the event's tenant's.
pub struct Store<'t> {
    tables: Dst<'t>,
    proj: &'static str,
    generation: u32,
    /// The tenants folded so far; index 0 is the default tenant.
    tenants: Vec<Option<Arc<str>>>,
    /// The tenant of the event being folded (its index in `tenants`).
    cur: u16,
    /// Writes not yet in the tables: a fold of many events touches the same rows again and
    /// again (a task gets ~8 events), so they are coalesced here and written once, sorted by
    /// key, by `flush`. The digest does not see this: it hashes every write as it is made.
    pending: FxHashMap<Slot, FxHashMap<Vec<u8>, Option<Vec<u8>>>>,
    pending_len: usize,
    /// Rows kept decoded between events ([`Store::take_row`] / [`Store::put_row`]): a row a
    /// fold rewrites at every event (a task) is decoded once and encoded once per flush, not
    /// at each event. Encoded into `pending` by `flush` (or when read as bytes).
    rows: FxHashMap<Slot, FxHashMap<Vec<u8>, Decoded>>,
    /// Reused buffer that the digest hashes an encoded row from.
    scratch: Vec<u8>,
    /// Digests at the boundaries passed, not yet written.
    boundaries: Vec<(u64, [u8; 32])>,
    /// Seqs of the events that changed the model, when the caller asked for them (a rebuild
    /// locating a divergence).
    pub(super) changed_at: Option<Vec<u64>>,
    change: blake3::Hasher,
    changed: bool,
}

/// Where a [`Store`] writes: a redb transaction's tables (each tenant's opened at its first
/// event), or the decider's overlay.
enum Dst<'t> {
    Redb {
        txn: &'t redb::WriteTransaction,
        /// By tenant index.
        tables: Vec<Option<Box<Tables<'t>>>>,
    },
    Mem {
        mem: &'t mut Overlay,
        /// The tables' full names.
        names: FxHashMap<Slot, String>,
    },
}

impl<'t> Dst<'t> {
    /// `table` of `tenant` (index `slot.0`) as it stands with what was written to it.
    fn table(
        &mut self,
        slot: Slot,
        tenant: Option<&Arc<str>>,
        proj: &'static str,
        generation: u32,
    ) -> Result<TableRef<'_>, StorageError> {
        match self {
            Dst::Redb { .. } => self.redb(slot.0, tenant, proj, generation)?.table(slot.1),
            Dst::Mem { mem, names } => {
                let name = names.entry(slot).or_insert_with(|| {
                    tenant_table_name(tenant.map(|t| &**t), proj, slot.1, generation)
                });
                Ok(TableRef::Mem(mem, name.as_str()))
            }
        }
    }

    /// The redb tables of the tenant at `index`.
    fn redb(
        &mut self,
        index: u16,
        tenant: Option<&Arc<str>>,
        proj: &'static str,
        generation: u32,
    ) -> Result<&mut Tables<'t>, StorageError> {
        let Dst::Redb { txn, tables } = self else {
            return Err(StorageError::msg("the overlay has no redb tables"));
        };
        let i = usize::from(index);
        if tables.len() <= i {
            tables.resize_with(i + 1, || None);
        }
        let txn: &'t redb::WriteTransaction = txn;
        Ok(tables[i].get_or_insert_with(|| {
            Box::new(Tables::at(
                Src::Redb(txn),
                tenant.cloned(),
                proj,
                generation,
            ))
        }))
    }
}

/// The running digest is recorded at every seq that is a multiple of this (spec section 10).
pub const DIGEST_EVERY: u64 = 1000;

/// A row kept decoded by [`Store::put_row`].
struct Decoded {
    /// `None` while a fold has it taken out.
    row: Option<CachedRow>,
}

impl Decoded {
    fn row(&self, table: &str) -> Result<&CachedRow, StorageError> {
        self.row.as_ref().ok_or_else(|| taken(table))
    }
}

fn taken(table: &str) -> StorageError {
    StorageError::new(
        format!("a row of {table} was taken by a fold and not put back"),
        std::io::Error::other("row taken"),
    )
}

/// Coalesced writes are flushed after this many events even inside one transaction.
const FLUSH_EVERY: usize = 50_000;

impl<'t> Store<'t> {
    pub(super) fn new(tx: TxMut<'t>, proj: &'static str, generation: u32) -> Self {
        Store {
            tables: match tx {
                TxMut::Redb(txn) => Dst::Redb {
                    txn,
                    tables: Vec::new(),
                },
                TxMut::Mem(mem) => Dst::Mem {
                    mem,
                    names: FxHashMap::default(),
                },
            },
            proj,
            generation,
            tenants: vec![None],
            cur: 0,
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

    /// `table` of the tenant of the event being folded.
    fn slot(&self, table: &'static str) -> Slot {
        (self.cur, table)
    }

    /// `slot`'s table as it stands with what was written to it.
    fn table(&mut self, slot: Slot) -> Result<TableRef<'_>, StorageError> {
        let tenant = self.tenants[usize::from(slot.0)].as_ref();
        self.tables.table(slot, tenant, self.proj, self.generation)
    }

    /// Fold into `tenant`'s tables from now on.
    fn enter(&mut self, tenant: Option<&str>) -> Result<(), StorageError> {
        let at = self
            .tenants
            .iter()
            .position(|t| t.as_deref() == tenant)
            .unwrap_or(self.tenants.len());
        if at == self.tenants.len() {
            let index = u16::try_from(at)
                .map_err(|_| StorageError::msg("one fold met more than 65,535 tenants"))?;
            self.tenants.push(tenant.map(Arc::from));
            self.cur = index;
        } else {
            self.cur = at as u16;
        }
        Ok(())
    }

    pub fn get(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let table = self.slot(table);
        if let Some(d) = self.rows.get(&table).and_then(|t| t.get(key)) {
            let mut out = Vec::new();
            d.row(table.1)?.encode(&mut out)?;
            return Ok(Some(out));
        }
        if let Some(v) = self.pending.get(&table).and_then(|t| t.get(key)) {
            return Ok(v.clone());
        }
        Ok(self.table(table)?.get(key)?.map(|v| v.value().to_vec()))
    }

    /// Whether `key` has a row (a row kept decoded is not encoded to answer).
    pub fn contains(&mut self, table: &'static str, key: &[u8]) -> Result<bool, StorageError> {
        let table = self.slot(table);
        if let Some(d) = self.rows.get(&table).and_then(|t| t.get(key)) {
            d.row(table.1)?;
            return Ok(true);
        }
        if let Some(v) = self.pending.get(&table).and_then(|t| t.get(key)) {
            return Ok(v.is_some());
        }
        Ok(self.table(table)?.get(key)?.is_some())
    }

    /// Take a row out to fold it, decoded: from the rows kept decoded when it is there
    /// (nothing is decoded or copied), else from the staged writes or the table. A row taken
    /// from the decoded ones must be put back with [`Store::put_row`] (or overwritten or
    /// deleted) before the next flush, which otherwise fails the transaction rather than lose
    /// the row's staged state.
    pub fn take_row<T: Cached>(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        let slot = self.slot(table);
        if let Some(d) = self.rows.get_mut(&slot).and_then(|t| t.get_mut(key)) {
            let row = d.row.take().ok_or_else(|| taken(table))?;
            return match T::from_cached(row) {
                Ok(row) => Ok(Some(row)),
                Err(row) => {
                    d.row = Some(row);
                    Err(StorageError::new(
                        format!("a row of {table} taken as another type"),
                        std::io::Error::other("type mismatch"),
                    ))
                }
            };
        }
        if let Some(v) = self.pending.get(&slot).and_then(|t| t.get(key)) {
            return v.as_deref().map(T::decode).transpose();
        }
        self.table(slot)?
            .get(key)?
            .map(|v| T::decode(v.value()))
            .transpose()
    }

    /// Write a row taken with [`Store::take_row`] (or a new one): hashed into the digest as
    /// its encoding (in a reused buffer), kept decoded for the next event, encoded into the
    /// table at the flush.
    pub fn put_row<T: Cached>(
        &mut self,
        table: &'static str,
        key: &[u8],
        row: T,
    ) -> Result<(), StorageError> {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        let buf = row.encode(buf)?;
        self.note(table, key, Some(&buf));
        self.scratch = buf;
        // The bytes staged earlier (if any) are superseded by the decoded row.
        let slot = self.slot(table);
        if let Some(t) = self.pending.get_mut(&slot)
            && t.remove(key).is_some()
        {
            self.pending_len -= 1;
        }
        let t = self.rows.entry(slot).or_default();
        let d = Decoded {
            row: Some(row.into_cached()),
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
        let slot = self.slot(table);
        if self.rows.get(&slot).is_none_or(|t| !t.contains_key(key))
            && let Some(Some(staged)) = self.pending.get_mut(&slot).and_then(|t| t.get_mut(key))
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

    /// Write a value the fold keeps to compute rows from (the inputs of a row it writes again
    /// at each change), left out of the digest like an index: the rows it makes are in it, so
    /// a difference in it shows there.
    pub fn put_input(&mut self, table: &'static str, key: &[u8], value: &[u8]) {
        self.stage(table, key, Some(value.to_vec()));
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
        for row in self.table(self.slot(table))?.range(prefix..)? {
            let (k, _) = row.map_err(StorageError::of)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push(k.value().to_vec());
        }
        Ok(out)
    }

    /// The first key of `table` that starts with `prefix`, as the table stands with every
    /// write of the fold so far. Only this table's staged writes are written first (an index
    /// the fold asks this of at most events, such as [`crate::deliveries::ORDER`]; its rows
    /// are never kept decoded).
    pub fn first_key(
        &mut self,
        table: &'static str,
        prefix: &[u8],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let slot = self.slot(table);
        if let Some(rows) = self.pending.remove(&slot) {
            self.pending_len -= rows.len();
            self.write_staged(slot, rows)?;
        }
        let mut range = self.table(slot)?.range(prefix..)?;
        match range.next() {
            Some(row) => {
                let (k, _) = row.map_err(StorageError::of)?;
                Ok(k.value().starts_with(prefix).then(|| k.value().to_vec()))
            }
            None => Ok(None),
        }
    }

    /// Delete a row of a secondary index (see [`Store::put_index`]).
    pub fn delete_index(&mut self, table: &'static str, key: &[u8]) {
        self.stage(table, key, None);
    }

    fn stage(&mut self, table: &'static str, key: &[u8], value: Option<Vec<u8>>) {
        let slot = self.slot(table);
        if let Some(t) = self.rows.get_mut(&slot)
            && t.remove(key).is_some()
        {
            self.pending_len -= 1;
        }
        let t = self.pending.entry(slot).or_default();
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

    /// A row in its own encoding ([`Row`]), also one kept decoded (without taking it).
    pub fn get_row<T: Row>(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        self.get(table, key)?.map(|b| T::decode(&b)).transpose()
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
        // Another tenant's write hashes as `tenant ␟ table` (the default tenant's as the
        // table alone, as before tenants: its digests are unchanged).
        match &self.tenants[usize::from(self.cur)] {
            None => {
                h.update(&(table.len() as u32).to_le_bytes());
                h.update(table.as_bytes());
            }
            Some(t) => {
                h.update(&((t.len() + 1 + table.len()) as u32).to_le_bytes());
                h.update(t.as_bytes());
                h.update(&[0x1f]);
                h.update(table.as_bytes());
            }
        }
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
    pub(super) fn fold(
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
        self.enter(ev.tenant)?;
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

    /// Write `table`'s staged rows (a `None` removes), sorted by key.
    fn write_staged(
        &mut self,
        slot: Slot,
        rows: FxHashMap<Vec<u8>, Option<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let tenant = self.tenants[usize::from(slot.0)].as_ref();
        if let Dst::Redb { .. } = &self.tables {
            let t = self
                .tables
                .redb(slot.0, tenant, self.proj, self.generation)?
                .table_mut(slot.1)?;
            let mut rows: Vec<_> = rows.into_iter().collect();
            rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            for (key, value) in rows {
                match value {
                    Some(v) => t.insert(key.as_slice(), v.as_slice()).map(drop),
                    None => t.remove(key.as_slice()).map(drop),
                }
                .map_err(StorageError::of)?;
            }
            return Ok(());
        }
        if let Dst::Mem { mem, names } = &mut self.tables {
            let name = names.entry(slot).or_insert_with(|| {
                tenant_table_name(tenant.map(|t| &**t), self.proj, slot.1, self.generation)
            });
            mem.active().put_all(name, rows);
        }
        Ok(())
    }

    /// Write the coalesced changes into the tables. Must be called before the store is dropped.
    pub(super) fn flush(&mut self) -> Result<(), StorageError> {
        for (slot, rows) in std::mem::take(&mut self.rows) {
            let t = self.pending.entry(slot).or_default();
            for (key, d) in rows {
                let mut out = Vec::new();
                d.row(slot.1)?.encode(&mut out)?;
                t.insert(key, Some(out));
            }
        }
        let mut pending: Vec<_> = std::mem::take(&mut self.pending).into_iter().collect();
        pending.sort_unstable_by_key(|(t, _)| *t);
        self.pending_len = 0;
        for (table, rows) in pending {
            self.write_staged(table, rows)?;
        }
        if !self.boundaries.is_empty() {
            // One digest chain per projection, across its tenants.
            let name = table_name(self.proj, DIGESTS, self.generation);
            match &mut self.tables {
                Dst::Redb { txn, .. } => {
                    let def: TableDefinition<u64, &[u8]> = TableDefinition::new(&name);
                    let mut t = txn.open_table(def).map_err(StorageError::of)?;
                    for (seq, d) in self.boundaries.drain(..) {
                        t.insert(seq, d.as_slice()).map_err(StorageError::of)?;
                    }
                }
                Dst::Mem { mem, .. } => {
                    for (seq, d) in self.boundaries.drain(..) {
                        mem.active().put(&name, &seq.to_be_bytes(), Some(&d));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of a model (the cache knows none).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Counter {
        name: String,
        n: u64,
    }
    crate::framework::postcard_row!(Counter);

    /// A row of another type.
    #[derive(Debug, Serialize, Deserialize)]
    struct Other(u8);
    crate::framework::postcard_row!(Other);

    fn counter(name: &str) -> Counter {
        Counter {
            name: name.to_owned(),
            n: 0,
        }
    }

    fn with_store(f: impl FnOnce(&mut Store<'_>)) {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("t.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        let mut st = Store::new(TxMut::Redb(&txn), "x", 0);
        f(&mut st);
    }

    /// A decoded row reads back the same as its bytes would, through every path, and is
    /// hashed as its encoding (the same digest as `put_val`).
    #[test]
    fn decoded_rows_read_and_hash_like_bytes() {
        let mut row = counter("c");
        row.n = 7;
        let mut by_val = blake3::Hash::from([0; 32]);
        with_store(|st| {
            st.put_val("rows", b"k", &row).unwrap();
            by_val = st.change.finalize();
        });
        with_store(|st| {
            st.put_row("rows", b"k", row.clone()).unwrap();
            assert_eq!(st.change.finalize(), by_val);
            assert_eq!(
                st.get_val::<Counter>("rows", b"k").unwrap(),
                Some(row.clone())
            );
            let mut r: Counter = st.take_row("rows", b"k").unwrap().unwrap();
            r.n += 1;
            st.put_row("rows", b"k", r).unwrap();
            st.flush().unwrap();
            let back: Option<Counter> = st.take_row("rows", b"k").unwrap();
            assert_eq!(back.map(|b| b.n), Some(8));
        });
    }

    /// A row is taken back only as the type it was put as; the refusal leaves it in place.
    #[test]
    fn a_row_is_taken_back_as_its_own_type_only() {
        with_store(|st| {
            st.put_row("rows", b"k", counter("c")).unwrap();
            assert!(st.take_row::<Other>("rows", b"k").is_err());
            let back: Option<Counter> = st.take_row("rows", b"k").unwrap();
            assert_eq!(back.map(|c| c.name), Some("c".to_owned()));
        });
    }

    /// A row a fold took and never put back fails the flush instead of losing its staged state.
    #[test]
    fn a_row_taken_and_not_put_back_fails_the_flush() {
        let row = || counter("c");
        with_store(|st| {
            st.put_row("rows", b"k", row()).unwrap();
            let _: Option<Counter> = st.take_row("rows", b"k").unwrap();
            assert!(st.take_row::<Counter>("rows", b"k").is_err(), "taken twice");
            assert!(st.flush().is_err());
        });
        with_store(|st| {
            st.put_row("rows", b"k", row()).unwrap();
            let _: Option<Counter> = st.take_row("rows", b"k").unwrap();
            st.delete("rows", b"k").unwrap();
            st.flush().unwrap();
            assert_eq!(st.get("rows", b"k").unwrap(), None);
        });
    }
}
