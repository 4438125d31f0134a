//! The `event_id → seq` index as sorted runs with filters on disk, so an append's cost does not
//! grow with the log and memory stays flat (I2 stays exact, I9).
//!
//! Inserting random ids into one B-tree rewrites leaf pages all over a tree that keeps growing:
//! the merge of 100,000 ids took longer at every million events. Instead, each merge of the
//! in-memory tail writes its ids into a new table of its own (`event_ids.h<n>`), keyed by
//! `(hash, id)` and filled in key order: an empty tree written sequentially, whose cost depends
//! on the run's size only. When [`FANOUT`] runs of one level exist they are merged (a k-way
//! merge of sorted tables, streamed and written in order) into one run of the next level, so a
//! log of N ids has O(log N) runs and each id is rewritten O(log N) times, sequentially.
//!
//! A lookup asks the runs newest first, and only those whose Bloom filter may hold the id; a
//! new id — the common case — usually reads no run at all. Each run's filter is blocked (all
//! of a key's probes fall in one 64-byte block, chosen by the key's hash) and kept on disk in
//! `event_ids.bloom` as 4 KiB pages. Because runs are ordered by the same hash that picks the
//! block, a run's filter is written page after page while the run is written: building it
//! holds one page. Lookups read pages through a cache of bounded size (`[log]
//! id_filter_cache`), so memory does not grow with the log; a log whose filters outgrow the
//! cache reads the missing pages from redb's own (bounded) page cache or the file.
//!
//! The single `event_ids` table of earlier releases is kept as the oldest run, without a
//! filter (it no longer grows).

use std::sync::Arc;

use redb::{ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};

use crate::error::{StorageError, storage};

/// The index of earlier releases (and of logs opened before any run was written).
pub(crate) const LEGACY: TableDefinition<&str, u64> = TableDefinition::new("event_ids");
/// Run number → (level, keys, filter blocks).
pub(crate) const RUNS: TableDefinition<u64, (u8, u64, u64)> =
    TableDefinition::new("event_ids.runs");
/// (run, page) → a page of the run's filter; a missing page has no bit set.
pub(crate) const BLOOM: TableDefinition<(u64, u32), &[u8]> =
    TableDefinition::new("event_ids.bloom");
/// Development builds kept id-ordered runs (`event_ids.r<n>`) with whole filters here; open
/// moves their ids into [`LEGACY`].
const DEV_FILTERS: TableDefinition<u64, &[u8]> = TableDefinition::new("event_ids.filters");

/// The next row of one merged run: (hash, id, seq, which run).
type Head = (u64, String, u64, usize);

/// Runs of one level merged into one of the next.
pub(crate) const FANOUT: usize = 8;
const BITS_PER_KEY: u64 = 12;
const HASHES: u64 = 8;
const BLOCK_BYTES: usize = 64;
const PAGE_BLOCKS: u64 = 64;
const PAGE_BYTES: usize = BLOCK_BYTES * PAGE_BLOCKS as usize;
/// The filter page cache when none is configured.
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;

pub(crate) fn table_name(run: u64) -> String {
    format!("event_ids.h{run:010}")
}

fn run_table(name: &str) -> TableDefinition<'_, (u64, &'static str), u64> {
    TableDefinition::new(name)
}

/// Three 64-bit hashes of an id: the run order and filter block, and two for the probes
/// inside the block (double hashing).
#[derive(Debug, Clone, Copy)]
struct Hash(u64, u64, u64);

fn hashes(id: &str) -> Hash {
    let h = blake3::hash(id.as_bytes());
    let b = h.as_bytes();
    let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8"));
    Hash(word(0), word(1), word(2) | 1)
}

/// The block of a key in a filter of `blocks` blocks: monotonic in the hash, so keys in hash
/// order fill the filter front to back.
fn block_of(h: Hash, blocks: u64) -> u64 {
    ((u128::from(h.0) * u128::from(blocks)) >> 64) as u64
}

fn probes(h: Hash) -> impl Iterator<Item = usize> {
    (0..HASHES).map(move |i| (h.1.wrapping_add(i.wrapping_mul(h.2)) % 512) as usize)
}

fn blocks_for(keys: u64) -> u64 {
    (keys.max(1) * BITS_PER_KEY).div_ceil(8 * BLOCK_BYTES as u64)
}

/// Writes a run's filter page by page, for keys arriving in hash order.
struct FilterWriter {
    run: u64,
    blocks: u64,
    page: u32,
    buf: Vec<u8>,
    dirty: bool,
}

impl FilterWriter {
    fn new(run: u64, keys: u64) -> FilterWriter {
        FilterWriter {
            run,
            blocks: blocks_for(keys),
            page: 0,
            buf: vec![0; PAGE_BYTES],
            dirty: false,
        }
    }

    fn add(
        &mut self,
        bloom: &mut redb::Table<'_, (u64, u32), &'static [u8]>,
        h: Hash,
    ) -> Result<(), StorageError> {
        let block = block_of(h, self.blocks);
        let page = self.page_of(h);
        debug_assert!(page >= self.page, "keys arrive in hash order");
        if page != self.page {
            self.flush(bloom)?;
            self.page = page;
        }
        let at = (block % PAGE_BLOCKS) as usize * BLOCK_BYTES;
        for bit in probes(h) {
            self.buf[at + bit / 8] |= 1 << (bit % 8);
        }
        self.dirty = true;
        Ok(())
    }

    /// The page a key's block falls in.
    fn page_of(&self, h: Hash) -> u32 {
        (block_of(h, self.blocks) / PAGE_BLOCKS) as u32
    }

    fn flush(
        &mut self,
        bloom: &mut redb::Table<'_, (u64, u32), &'static [u8]>,
    ) -> Result<(), StorageError> {
        if self.dirty {
            bloom
                .insert((self.run, self.page), self.buf.as_slice())
                .map_err(storage)?;
            self.buf.fill(0);
            self.dirty = false;
        }
        Ok(())
    }
}

/// One run: its number (table), level, key count and filter size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub n: u64,
    pub level: u8,
    pub keys: u64,
    pub blocks: u64,
}

/// Filter pages read so far, bounded (shared by every clone of one log's [`Runs`]).
type PageCache = quick_cache::sync::Cache<(u64, u32), Arc<[u8]>>;

/// The runs of the index, oldest first.
#[derive(Clone)]
pub(crate) struct Runs {
    runs: Vec<Run>,
    /// The number the next run (a level-0 run or a compaction's output) takes.
    next: u64,
    /// The legacy table holds ids (a log written by an earlier release).
    legacy: bool,
    cache: Arc<PageCache>,
}

impl std::fmt::Debug for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runs")
            .field("runs", &self.runs)
            .field("legacy", &self.legacy)
            .field("next", &self.next)
            .finish()
    }
}

fn page_cache(bytes: usize) -> Arc<PageCache> {
    Arc::new(PageCache::new((bytes / PAGE_BYTES).max(16)))
}

impl Default for Runs {
    fn default() -> Runs {
        Runs {
            runs: Vec::new(),
            next: 1,
            legacy: false,
            cache: page_cache(DEFAULT_CACHE_BYTES),
        }
    }
}

impl Runs {
    /// The runs recorded in the file; filter pages are cached up to `cache_bytes`.
    pub(crate) fn load(txn: &impl ReadTables, cache_bytes: usize) -> Result<Runs, StorageError> {
        let runs = txn.runs()?;
        let merging = txn.merging()?.map(|(n, _, _)| n).unwrap_or(0);
        let last = runs.iter().map(|r| r.n).max().unwrap_or(0);
        Ok(Runs {
            runs,
            next: last.max(merging) + 1,
            legacy: txn.legacy_len()? > 0,
            cache: page_cache(cache_bytes),
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.runs.len()
    }

    /// The seq of `id`, asking the runs that may hold it (newest first), then the legacy table.
    ///
    /// The indexer merges runs (and deletes the merged ones) in a commit made before it
    /// installs the new list in memory: a transaction begun in between sees tables this list
    /// does not name. So a miss read through a transaction is checked against the runs that
    /// transaction holds, and asked again of those when they differ (a miss decided by cached
    /// filter pages alone touched no table and needs no check).
    pub(crate) fn lookup(
        &self,
        txn: &impl ReadTables,
        id: &str,
    ) -> Result<Option<u64>, StorageError> {
        if let Some(seq) = self.lookup_in(txn, id)? {
            return Ok(Some(seq));
        }
        if txn.began() {
            let current = txn.runs()?;
            if current != self.runs {
                let fresh = Runs {
                    runs: current,
                    next: self.next,
                    legacy: self.legacy,
                    cache: self.cache.clone(),
                };
                return fresh.lookup_in(txn, id);
            }
        }
        Ok(None)
    }

    fn lookup_in(&self, txn: &impl ReadTables, id: &str) -> Result<Option<u64>, StorageError> {
        let h = hashes(id);
        for run in self.runs.iter().rev() {
            if self.may_contain(txn, run, h)?
                && let Some(seq) = txn.get(&table_name(run.n), h.0, id)?
            {
                return Ok(Some(seq));
            }
        }
        if self.legacy {
            return txn.get_legacy(id);
        }
        Ok(None)
    }

    fn may_contain(&self, txn: &impl ReadTables, run: &Run, h: Hash) -> Result<bool, StorageError> {
        let block = block_of(h, run.blocks);
        let key = (run.n, (block / PAGE_BLOCKS) as u32);
        let page = match self.cache.get(&key) {
            Some(p) => p,
            None => {
                let p: Arc<[u8]> = txn.page(key.0, key.1)?.unwrap_or_default().into();
                self.cache.insert(key, p.clone());
                p
            }
        };
        let at = (block % PAGE_BLOCKS) as usize * BLOCK_BYTES;
        let Some(b) = page.get(at..at + BLOCK_BYTES) else {
            return Ok(false);
        };
        Ok(probes(h).all(|bit| b[bit / 8] & (1 << (bit % 8)) != 0))
    }

    /// Write `ids` as a new run of level 0, in `txn`. The caller installs the returned runs
    /// once `txn` committed; merging full levels is a [`Compaction`]'s work, in steps.
    pub(crate) fn add(
        &self,
        txn: &WriteTransaction,
        ids: &[(&str, u64)],
    ) -> Result<Runs, StorageError> {
        let mut next = self.clone();
        let n = next.next;
        next.next += 1;
        let mut keyed: Vec<(u64, &str, u64)> = ids
            .iter()
            .map(|(id, seq)| (hashes(id).0, *id, *seq))
            .collect();
        keyed.sort_unstable();
        let keys = keyed.len() as u64;
        let mut filter = FilterWriter::new(n, keys);
        {
            let name = table_name(n);
            let mut t = txn.open_table(run_table(&name)).map_err(storage)?;
            let mut bloom = txn.open_table(BLOOM).map_err(storage)?;
            for (h0, id, seq) in keyed {
                t.insert((h0, id), seq).map_err(storage)?;
                filter.add(&mut bloom, hashes(id))?;
            }
            filter.flush(&mut bloom)?;
        }
        let run = Run {
            n,
            level: 0,
            keys,
            blocks: filter.blocks,
        };
        txn.open_table(RUNS)
            .map_err(storage)?
            .insert(n, (0, keys, run.blocks))
            .map_err(storage)?;
        next.runs.push(run);
        Ok(next)
    }

    /// The lowest level holding [`FANOUT`] runs or more.
    pub(crate) fn full_level(&self) -> Option<u8> {
        let mut counts = std::collections::BTreeMap::<u8, usize>::new();
        for r in &self.runs {
            *counts.entry(r.level).or_default() += 1;
        }
        counts
            .into_iter()
            .find(|(_, c)| *c >= FANOUT)
            .map(|(l, _)| l)
    }

    /// The compaction to carry on: the one `txn` holds in progress, else a new one of the
    /// lowest full level (its output takes the next run number, so install `self` afterwards
    /// whether or not the first step commits). `None` when no level is full.
    pub(crate) fn compaction(
        &mut self,
        txn: &WriteTransaction,
    ) -> Result<Option<Compaction>, StorageError> {
        if let Some((n, level, after)) = ReadTables::merging(txn)? {
            return Ok(Some(Compaction::of(self, n, level, after)));
        }
        let Some(level) = self.full_level() else {
            return Ok(None);
        };
        let n = self.next;
        self.next += 1;
        Ok(Some(Compaction::of(self, n, level, None)))
    }
}

/// (output run, level of its inputs, the last key written).
type StoredProgress = (u64, u8, Option<(u64, &'static str)>);

/// Runs a finished compaction replaced, whose tables and filter pages are still to be dropped:
/// one per step ([`drop_retired`]), since dropping eight tables of up to 800,000 ids each in one
/// commit took the indexer 0.3-0.4 s, for which appends waited (issue 39).
const RETIRED: TableDefinition<u64, ()> = TableDefinition::new("event_ids.retired");

/// What one step of the index's upkeep ([`Runs::upkeep`]) did in its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upkeep {
    /// Nothing was owed.
    Idle,
    /// A replaced run's table was dropped.
    Dropped,
    /// A step of a compaction: install the runs `upkeep` changed once the transaction
    /// commits (a new compaction took a run number, or a finished one replaced its inputs).
    Stepped,
}

impl Runs {
    /// One step of the index's upkeep in `txn`: drop one run a finished compaction replaced,
    /// or else merge at least `rows` ids of the compaction in progress or owed.
    pub(crate) fn upkeep(
        &mut self,
        txn: &WriteTransaction,
        rows: usize,
    ) -> Result<Upkeep, StorageError> {
        if drop_retired(txn)? {
            return Ok(Upkeep::Dropped);
        }
        let Some(mut c) = self.compaction(txn)? else {
            return Ok(Upkeep::Idle);
        };
        if c.step(txn, rows)? {
            tracing::debug!(run = ?c.output(), "compacted the id index");
            *self = c.finish(txn, self)?;
        }
        Ok(Upkeep::Stepped)
    }
}

/// Drop the table and filter pages of one run a compaction replaced, if any is left: whether
/// one was.
fn drop_retired(txn: &WriteTransaction) -> Result<bool, StorageError> {
    let mut retired = txn.open_table(RETIRED).map_err(storage)?;
    let Some(n) = retired.first().map_err(storage)?.map(|(k, _)| k.value()) else {
        return Ok(false);
    };
    txn.delete_table(run_table(&table_name(n)))
        .map_err(storage)?;
    txn.open_table(BLOOM)
        .map_err(storage)?
        .retain_in((n, 0)..=(n, u32::MAX), |_, _| false)
        .map_err(storage)?;
    retired.remove(n).map_err(storage)?;
    Ok(true)
}

/// A compaction in progress: (output run, level of its inputs, the last key written).
pub(crate) const MERGING: TableDefinition<(), StoredProgress> =
    TableDefinition::new("event_ids.merging");

/// The merge of every run of one level (numbered below the output) into one run of the next:
/// a k-way merge of sorted tables, streamed and written in key order with its filter (an id is
/// in one run only).
///
/// It is made in steps, each in a write transaction of the indexer's that also indexes the
/// events published meanwhile, so merging millions of ids never holds up indexing (and, through
/// the memory bound, appends). A step ends on a filter page boundary, so each page is written
/// whole by one step. Its progress is stored with its rows ([`MERGING`]); until [`finish`]
/// lists the output, lookups read the inputs, and a restart carries on where the last commit
/// left off.
///
/// [`finish`]: Compaction::finish
#[derive(Debug)]
pub(crate) struct Compaction {
    out: Run,
    inputs: Vec<Run>,
    after: Option<(u64, String)>,
}

impl Compaction {
    fn of(runs: &Runs, n: u64, level: u8, after: Option<(u64, String)>) -> Compaction {
        let inputs: Vec<Run> = runs
            .runs
            .iter()
            .filter(|r| r.level == level && r.n < n)
            .copied()
            .collect();
        let keys = inputs.iter().map(|r| r.keys).sum();
        Compaction {
            out: Run {
                n,
                level: level + 1,
                keys,
                blocks: blocks_for(keys),
            },
            inputs,
            after,
        }
    }

    /// The run it writes.
    pub(crate) fn output(&self) -> Run {
        self.out
    }

    /// Merge the next `rows` keys or more (to the end of the filter page the last one falls
    /// in) into the output, in `txn`; `true` once every key is written. Call [`finish`] in
    /// the same transaction then.
    ///
    /// [`finish`]: Compaction::finish
    pub(crate) fn step(
        &mut self,
        txn: &WriteTransaction,
        rows: usize,
    ) -> Result<bool, StorageError> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        use std::ops::Bound;
        let names: Vec<String> = self.inputs.iter().map(|r| table_name(r.n)).collect();
        let out_name = table_name(self.out.n);
        let mut filter = FilterWriter::new(self.out.n, self.out.keys);
        let mut written = 0usize;
        let mut done = true;
        {
            let tables = names
                .iter()
                .map(|name| txn.open_table(run_table(name)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(storage)?;
            let from = match &self.after {
                Some((h0, id)) => Bound::Excluded((*h0, id.as_str())),
                None => Bound::Unbounded,
            };
            let mut iters = tables
                .iter()
                .map(|t| t.range::<(u64, &str)>((from, Bound::Unbounded)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(storage)?;
            let mut heap = BinaryHeap::new();
            let next_of = |i: usize,
                           iters: &mut Vec<redb::Range<'_, (u64, &'static str), u64>>|
             -> Result<Option<Reverse<Head>>, StorageError> {
                Ok(match iters[i].next() {
                    Some(row) => {
                        let (k, v) = row.map_err(storage)?;
                        let (h0, id) = k.value();
                        Some(Reverse((h0, id.to_owned(), v.value(), i)))
                    }
                    None => None,
                })
            };
            for i in 0..iters.len() {
                heap.extend(next_of(i, &mut iters)?);
            }
            let mut out = txn.open_table(run_table(&out_name)).map_err(storage)?;
            let mut bloom = txn.open_table(BLOOM).map_err(storage)?;
            let mut last: Option<(u64, String)> = None;
            while let Some(Reverse((h0, id, seq, i))) = heap.pop() {
                let h = hashes(&id);
                if written >= rows && filter.page_of(h) != filter.page {
                    done = false;
                    break;
                }
                out.insert((h0, id.as_str()), seq).map_err(storage)?;
                filter.add(&mut bloom, h)?;
                written += 1;
                last = Some((h0, id));
                heap.extend(next_of(i, &mut iters)?);
            }
            filter.flush(&mut bloom)?;
            if last.is_some() {
                self.after = last;
            }
        }
        let after = self.after.as_ref().map(|(h0, id)| (*h0, id.as_str()));
        let mut merging = txn.open_table(MERGING).map_err(storage)?;
        if done {
            merging.remove(()).map_err(storage)?;
        } else {
            let level = self.out.level - 1;
            merging
                .insert((), (self.out.n, level, after))
                .map_err(storage)?;
        }
        Ok(done)
    }

    /// List the output and retire the inputs (their tables are dropped later, one per step:
    /// [`drop_retired`]), in the transaction of the last [`step`]; the runs to install
    /// (`current` with the inputs replaced) once it commits.
    ///
    /// [`step`]: Compaction::step
    pub(crate) fn finish(
        self,
        txn: &WriteTransaction,
        current: &Runs,
    ) -> Result<Runs, StorageError> {
        let mut runs_t = txn.open_table(RUNS).map_err(storage)?;
        let mut retired = txn.open_table(RETIRED).map_err(storage)?;
        for r in &self.inputs {
            runs_t.remove(r.n).map_err(storage)?;
            retired.insert(r.n, ()).map_err(storage)?;
        }
        runs_t
            .insert(self.out.n, (self.out.level, self.out.keys, self.out.blocks))
            .map_err(storage)?;
        let mut next = current.clone();
        next.runs.retain(|r| !self.inputs.contains(r));
        next.runs.push(self.out);
        next.runs.sort_by_key(|r| r.n);
        next.next = next.next.max(self.out.n + 1);
        Ok(next)
    }
}

/// Move the ids of a development build's runs (`event_ids.r<n>`, id-ordered, listed in
/// `event_ids.filters`) into the legacy table, once, at open.
pub(crate) fn migrate_dev_runs(txn: &WriteTransaction) -> Result<u64, StorageError> {
    let runs: Vec<u64> = {
        let t = txn.open_table(DEV_FILTERS).map_err(storage)?;
        t.iter()
            .map_err(storage)?
            .map(|row| row.map(|(k, _)| k.value()).map_err(storage))
            .collect::<Result<_, _>>()?
    };
    let mut moved = 0;
    for n in &runs {
        let name = format!("event_ids.r{n:010}");
        let def = TableDefinition::<&str, u64>::new(&name);
        {
            let old = txn.open_table(def).map_err(storage)?;
            let mut legacy = txn.open_table(LEGACY).map_err(storage)?;
            for row in old.iter().map_err(storage)? {
                let (k, v) = row.map_err(storage)?;
                legacy.insert(k.value(), v.value()).map_err(storage)?;
                moved += 1;
            }
        }
        txn.delete_table(def).map_err(storage)?;
    }
    txn.delete_table(DEV_FILTERS).map_err(storage)?;
    Ok(moved)
}

/// What a lookup needs from a transaction (read or write).
pub(crate) trait ReadTables {
    /// Whether a transaction was begun (a lazy one may not have been).
    fn began(&self) -> bool {
        true
    }
    fn get(&self, table: &str, h0: u64, id: &str) -> Result<Option<u64>, StorageError>;
    fn get_legacy(&self, id: &str) -> Result<Option<u64>, StorageError>;
    fn legacy_len(&self) -> Result<u64, StorageError>;
    fn runs(&self) -> Result<Vec<Run>, StorageError>;
    fn page(&self, run: u64, page: u32) -> Result<Option<Vec<u8>>, StorageError>;
    /// The compaction in progress: its output run, input level and last key written.
    fn merging(&self) -> Result<Option<Progress>, StorageError>;
}

/// A compaction's progress as [`MERGING`] holds it.
pub(crate) type Progress = (u64, u8, Option<(u64, String)>);

fn progress_of(
    t: &impl ReadableTable<(), StoredProgress>,
) -> Result<Option<Progress>, StorageError> {
    Ok(t.get(()).map_err(storage)?.map(|g| {
        let (n, level, after) = g.value();
        (n, level, after.map(|(h0, id)| (h0, id.to_owned())))
    }))
}

fn runs_of(t: &impl ReadableTable<u64, (u8, u64, u64)>) -> Result<Vec<Run>, StorageError> {
    let mut out = Vec::new();
    for row in t.iter().map_err(storage)? {
        let (k, v) = row.map_err(storage)?;
        let (level, keys, blocks) = v.value();
        out.push(Run {
            n: k.value(),
            level,
            keys,
            blocks,
        });
    }
    Ok(out)
}

impl ReadTables for WriteTransaction {
    fn get(&self, table: &str, h0: u64, id: &str) -> Result<Option<u64>, StorageError> {
        let t = self.open_table(run_table(table)).map_err(storage)?;
        Ok(t.get((h0, id)).map_err(storage)?.map(|g| g.value()))
    }
    fn get_legacy(&self, id: &str) -> Result<Option<u64>, StorageError> {
        let t = self.open_table(LEGACY).map_err(storage)?;
        Ok(t.get(id).map_err(storage)?.map(|g| g.value()))
    }
    fn legacy_len(&self) -> Result<u64, StorageError> {
        self.open_table(LEGACY)
            .map_err(storage)?
            .len()
            .map_err(storage)
    }
    fn runs(&self) -> Result<Vec<Run>, StorageError> {
        runs_of(&self.open_table(RUNS).map_err(storage)?)
    }
    fn page(&self, run: u64, page: u32) -> Result<Option<Vec<u8>>, StorageError> {
        let t = self.open_table(BLOOM).map_err(storage)?;
        Ok(t.get((run, page))
            .map_err(storage)?
            .map(|g| g.value().to_vec()))
    }
    fn merging(&self) -> Result<Option<Progress>, StorageError> {
        progress_of(&self.open_table(MERGING).map_err(storage)?)
    }
}

/// A table a read transaction may not have yet (an empty log): `None`.
fn open_ro<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    def: TableDefinition<'_, K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StorageError> {
    match txn.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(storage(e)),
    }
}

impl ReadTables for redb::ReadTransaction {
    fn get(&self, table: &str, h0: u64, id: &str) -> Result<Option<u64>, StorageError> {
        match open_ro(self, run_table(table))? {
            Some(t) => Ok(t.get((h0, id)).map_err(storage)?.map(|g| g.value())),
            None => Ok(None),
        }
    }
    fn get_legacy(&self, id: &str) -> Result<Option<u64>, StorageError> {
        match open_ro(self, LEGACY)? {
            Some(t) => Ok(t.get(id).map_err(storage)?.map(|g| g.value())),
            None => Ok(None),
        }
    }
    fn legacy_len(&self) -> Result<u64, StorageError> {
        match open_ro(self, LEGACY)? {
            Some(t) => t.len().map_err(storage),
            None => Ok(0),
        }
    }
    fn runs(&self) -> Result<Vec<Run>, StorageError> {
        match open_ro(self, RUNS)? {
            Some(t) => runs_of(&t),
            None => Ok(Vec::new()),
        }
    }
    fn page(&self, run: u64, page: u32) -> Result<Option<Vec<u8>>, StorageError> {
        match open_ro(self, BLOOM)? {
            Some(t) => Ok(t
                .get((run, page))
                .map_err(storage)?
                .map(|g| g.value().to_vec())),
            None => Ok(None),
        }
    }
    fn merging(&self) -> Result<Option<Progress>, StorageError> {
        match open_ro(self, MERGING)? {
            Some(t) => progress_of(&t),
            None => Ok(None),
        }
    }
}

/// A read transaction begun only when a lookup needs redb (most new ids are answered by the
/// filters' cached pages alone): what the leader of a group reads the log through.
pub(crate) struct LazyRead<'a> {
    db: &'a redb::Database,
    txn: std::cell::OnceCell<redb::ReadTransaction>,
}

impl<'a> LazyRead<'a> {
    pub(crate) fn new(db: &'a redb::Database) -> LazyRead<'a> {
        LazyRead {
            db,
            txn: std::cell::OnceCell::new(),
        }
    }

    /// The transaction, begun at its first use.
    pub(crate) fn txn(&self) -> Result<&redb::ReadTransaction, StorageError> {
        if let Some(t) = self.txn.get() {
            return Ok(t);
        }
        use redb::ReadableDatabase;
        let t = self.db.begin_read().map_err(storage)?;
        Ok(self.txn.get_or_init(|| t))
    }
}

impl ReadTables for LazyRead<'_> {
    fn began(&self) -> bool {
        self.txn.get().is_some()
    }
    fn get(&self, table: &str, h0: u64, id: &str) -> Result<Option<u64>, StorageError> {
        self.txn()?.get(table, h0, id)
    }
    fn get_legacy(&self, id: &str) -> Result<Option<u64>, StorageError> {
        self.txn()?.get_legacy(id)
    }
    fn legacy_len(&self) -> Result<u64, StorageError> {
        self.txn()?.legacy_len()
    }
    fn runs(&self) -> Result<Vec<Run>, StorageError> {
        self.txn()?.runs()
    }
    fn page(&self, run: u64, page: u32) -> Result<Option<Vec<u8>>, StorageError> {
        self.txn()?.page(run, page)
    }
    fn merging(&self) -> Result<Option<Progress>, StorageError> {
        self.txn()?.merging()
    }
}

#[cfg(test)]
mod tests;
