//! The `event_id → seq` index as sorted runs with filters, so an append's cost does not grow
//! with the log (I2 stays exact).
//!
//! Inserting random ids into one B-tree rewrites leaf pages all over a tree that keeps growing:
//! the merge of 100,000 ids took longer at every million events. Instead, each merge of the
//! in-memory tail writes its ids, sorted, into a new table of its own (`event_ids.r<n>`): an
//! empty tree filled in key order, whose cost depends on the run's size only. A lookup asks the
//! runs newest first, and only those whose Bloom filter may hold the id (12 bits per id, about
//! 0.3% false positives); a new id — the common case — usually reads no table at all. When
//! [`FANOUT`] runs of one level exist they are merged (a k-way merge of sorted tables, written in
//! order) into one run of the next level, so a log of N ids has O(log N) runs and each id is
//! rewritten O(log N) times, sequentially. The filters live in `event_ids.filters` (run →
//! bytes) and in memory (about 1.5 bytes per event).
//!
//! The single `event_ids` table of earlier releases is kept as the oldest run, without a filter
//! (it no longer grows).

use redb::{ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};

use crate::error::{StorageError, storage};

/// The index of earlier releases (and of logs opened before any run was written).
pub(crate) const LEGACY: TableDefinition<&str, u64> = TableDefinition::new("event_ids");
/// Run number → its filter (level, key count, bits).
pub(crate) const FILTERS: TableDefinition<u64, &[u8]> = TableDefinition::new("event_ids.filters");

/// Runs of one level merged into one of the next.
pub(crate) const FANOUT: usize = 8;
const BITS_PER_KEY: u64 = 12;
const HASHES: u64 = 8;

pub(crate) fn table_name(run: u64) -> String {
    format!("event_ids.r{run:010}")
}

/// Two 64-bit hashes of an id (double hashing gives the filter's probes).
fn hashes(id: &str) -> (u64, u64) {
    let h = blake3::hash(id.as_bytes());
    let b = h.as_bytes();
    (
        u64::from_le_bytes(b[..8].try_into().expect("8")),
        u64::from_le_bytes(b[8..16].try_into().expect("8")) | 1,
    )
}

/// A Bloom filter over the ids of one run.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    bits: Vec<u64>,
}

impl Filter {
    fn with_keys(n: u64) -> Filter {
        let words = (n.max(1) * BITS_PER_KEY).div_ceil(64) as usize;
        Filter {
            bits: vec![0; words],
        }
    }

    fn nbits(&self) -> u64 {
        self.bits.len() as u64 * 64
    }

    fn insert(&mut self, h: (u64, u64)) {
        let m = self.nbits();
        for i in 0..HASHES {
            let bit = h.0.wrapping_add(i.wrapping_mul(h.1)) % m;
            self.bits[(bit / 64) as usize] |= 1 << (bit % 64);
        }
    }

    fn may_contain(&self, h: (u64, u64)) -> bool {
        let m = self.nbits();
        (0..HASHES).all(|i| {
            let bit = h.0.wrapping_add(i.wrapping_mul(h.1)) % m;
            self.bits[(bit / 64) as usize] & (1 << (bit % 64)) != 0
        })
    }
}

/// One run: its number (table), level and filter.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub n: u64,
    pub level: u8,
    pub filter: Filter,
}

fn encode(level: u8, filter: &Filter) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + filter.bits.len() * 8);
    out.push(level);
    for w in &filter.bits {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

fn decode(n: u64, bytes: &[u8]) -> Result<Run, StorageError> {
    let (level, words) = bytes
        .split_first()
        .ok_or_else(|| StorageError::msg(format!("the filter of id run {n} is empty")))?;
    if words.len() % 8 != 0 || words.is_empty() {
        return Err(StorageError::msg(format!(
            "the filter of id run {n} is damaged"
        )));
    }
    Ok(Run {
        n,
        level: *level,
        filter: Filter {
            bits: words
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
                .collect(),
        },
    })
}

/// The runs of the index, oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct Runs {
    runs: Vec<Run>,
    /// The legacy table holds ids (a log written by an earlier release).
    legacy: bool,
}

impl Runs {
    /// The runs recorded in the file.
    pub(crate) fn load(txn: &impl ReadTables) -> Result<Runs, StorageError> {
        Ok(Runs {
            runs: txn.filters()?,
            legacy: txn.legacy_len()? > 0,
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.runs.len()
    }

    /// The seq of `id`, asking the runs that may hold it (newest first), then the legacy table.
    pub(crate) fn lookup(
        &self,
        txn: &impl ReadTables,
        id: &str,
    ) -> Result<Option<u64>, StorageError> {
        let h = hashes(id);
        for run in self.runs.iter().rev() {
            if run.filter.may_contain(h)
                && let Some(seq) = txn.get(&table_name(run.n), id)?
            {
                return Ok(Some(seq));
            }
        }
        if self.legacy {
            return txn.get_legacy(id);
        }
        Ok(None)
    }

    /// Write `ids` (sorted by id) as a new run, then merge levels that are full; in `txn`. The
    /// caller installs the returned runs once `txn` committed.
    pub(crate) fn add(
        &self,
        txn: &WriteTransaction,
        ids: &[(&str, u64)],
    ) -> Result<Runs, StorageError> {
        let mut next = self.clone();
        let n = next.runs.last().map(|r| r.n + 1).unwrap_or(1);
        let name = table_name(n);
        let mut filter = Filter::with_keys(ids.len() as u64);
        {
            let mut t = txn
                .open_table(TableDefinition::<&str, u64>::new(&name))
                .map_err(storage)?;
            for (id, seq) in ids {
                t.insert(*id, *seq).map_err(storage)?;
                filter.insert(hashes(id));
            }
        }
        let run = Run {
            n,
            level: 0,
            filter,
        };
        txn.open_table(FILTERS)
            .map_err(storage)?
            .insert(n, encode(0, &run.filter).as_slice())
            .map_err(storage)?;
        next.runs.push(run);
        while let Some(level) = next.full_level() {
            next.compact(txn, level)?;
        }
        Ok(next)
    }

    fn full_level(&self) -> Option<u8> {
        let mut counts = std::collections::BTreeMap::<u8, usize>::new();
        for r in &self.runs {
            *counts.entry(r.level).or_default() += 1;
        }
        counts
            .into_iter()
            .find(|(_, c)| *c >= FANOUT)
            .map(|(l, _)| l)
    }

    /// Merge every run of `level` into one run of `level + 1`: a k-way merge of the sorted
    /// tables, streamed and written in key order (an id is in one run only).
    fn compact(&mut self, txn: &WriteTransaction, level: u8) -> Result<(), StorageError> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let n = self.runs.iter().map(|r| r.n).max().unwrap_or(0) + 1;
        let (merge, keep): (Vec<Run>, Vec<Run>) =
            self.runs.drain(..).partition(|r| r.level == level);
        let names: Vec<String> = merge.iter().map(|r| table_name(r.n)).collect();
        let new_name = table_name(n);
        let mut filter;
        {
            let tables = names
                .iter()
                .map(|name| txn.open_table(TableDefinition::<&str, u64>::new(name)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(storage)?;
            let mut total = 0;
            for t in &tables {
                total += t.len().map_err(storage)?;
            }
            filter = Filter::with_keys(total);
            let mut iters = tables
                .iter()
                .map(|t| t.iter())
                .collect::<Result<Vec<_>, _>>()
                .map_err(storage)?;
            let mut heap = BinaryHeap::new();
            for (i, it) in iters.iter_mut().enumerate() {
                if let Some(row) = it.next() {
                    let (k, v) = row.map_err(storage)?;
                    heap.push(Reverse((k.value().to_owned(), v.value(), i)));
                }
            }
            let mut out = txn
                .open_table(TableDefinition::<&str, u64>::new(&new_name))
                .map_err(storage)?;
            while let Some(Reverse((id, seq, i))) = heap.pop() {
                out.insert(id.as_str(), seq).map_err(storage)?;
                filter.insert(hashes(&id));
                if let Some(row) = iters[i].next() {
                    let (k, v) = row.map_err(storage)?;
                    heap.push(Reverse((k.value().to_owned(), v.value(), i)));
                }
            }
        }
        let mut filters = txn.open_table(FILTERS).map_err(storage)?;
        for (name, r) in names.iter().zip(&merge) {
            txn.delete_table(TableDefinition::<&str, u64>::new(name))
                .map_err(storage)?;
            filters.remove(r.n).map_err(storage)?;
        }
        filters
            .insert(n, encode(level + 1, &filter).as_slice())
            .map_err(storage)?;
        let mut runs = keep;
        runs.push(Run {
            n,
            level: level + 1,
            filter,
        });
        runs.sort_by_key(|r| r.n);
        self.runs = runs;
        Ok(())
    }
}

/// What a lookup needs from a transaction (read or write).
pub(crate) trait ReadTables {
    fn get(&self, table: &str, id: &str) -> Result<Option<u64>, StorageError>;
    fn get_legacy(&self, id: &str) -> Result<Option<u64>, StorageError>;
    fn legacy_len(&self) -> Result<u64, StorageError>;
    fn filters(&self) -> Result<Vec<Run>, StorageError>;
}

impl ReadTables for WriteTransaction {
    fn get(&self, table: &str, id: &str) -> Result<Option<u64>, StorageError> {
        let t = self
            .open_table(TableDefinition::<&str, u64>::new(table))
            .map_err(storage)?;
        Ok(t.get(id).map_err(storage)?.map(|g| g.value()))
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
    fn filters(&self) -> Result<Vec<Run>, StorageError> {
        let t = self.open_table(FILTERS).map_err(storage)?;
        let mut out = Vec::new();
        for row in t.iter().map_err(storage)? {
            let (k, v) = row.map_err(storage)?;
            out.push(decode(k.value(), v.value())?);
        }
        Ok(out)
    }
}

impl ReadTables for redb::ReadTransaction {
    fn get(&self, table: &str, id: &str) -> Result<Option<u64>, StorageError> {
        match self.open_table(TableDefinition::<&str, u64>::new(table)) {
            Ok(t) => Ok(t.get(id).map_err(storage)?.map(|g| g.value())),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(storage(e)),
        }
    }
    fn get_legacy(&self, id: &str) -> Result<Option<u64>, StorageError> {
        match self.open_table(LEGACY) {
            Ok(t) => Ok(t.get(id).map_err(storage)?.map(|g| g.value())),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(storage(e)),
        }
    }
    fn legacy_len(&self) -> Result<u64, StorageError> {
        match self.open_table(LEGACY) {
            Ok(t) => t.len().map_err(storage),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(storage(e)),
        }
    }
    fn filters(&self) -> Result<Vec<Run>, StorageError> {
        let t = match self.open_table(FILTERS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(storage(e)),
        };
        let mut out = Vec::new();
        for row in t.iter().map_err(storage)? {
            let (k, v) = row.map_err(storage)?;
            out.push(decode(k.value(), v.value())?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use redb::ReadableDatabase;

    use super::*;

    /// Against a map: every id ever added is found with its seq, through many runs and
    /// compactions, and ids never added are not.
    #[test]
    fn runs_answer_like_a_map() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("ids.redb")).unwrap();
        let mut runs = Runs::default();
        let mut model = HashMap::new();
        let mut seq = 0u64;
        for batch in 0..(FANOUT * FANOUT + 3) {
            let mut ids: Vec<(String, u64)> = (0..50)
                .map(|i| {
                    seq += 1;
                    (
                        format!("id-{}", (batch * 7919 + i * 104_729) % 1_000_003),
                        seq,
                    )
                })
                .filter(|(id, _)| !model.contains_key(id))
                .collect();
            ids.sort();
            ids.dedup_by(|a, b| a.0 == b.0);
            let txn = db.begin_write().unwrap();
            let refs: Vec<(&str, u64)> = ids.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            runs = runs.add(&txn, &refs).unwrap();
            txn.commit().unwrap();
            for (k, v) in ids {
                model.insert(k, v);
            }
            assert!(
                runs.len() < 2 * FANOUT,
                "{} runs after {batch} merges",
                runs.len()
            );
        }
        let txn = db.begin_read().unwrap();
        let loaded = Runs::load(&txn).unwrap();
        assert_eq!(loaded.len(), runs.len());
        for (id, seq) in &model {
            assert_eq!(loaded.lookup(&txn, id).unwrap(), Some(*seq), "{id}");
        }
        let mut false_hits = 0;
        for i in 0..2000 {
            let id = format!("absent-{i}");
            assert_eq!(loaded.lookup(&txn, &id).unwrap(), None);
            let h = hashes(&id);
            false_hits += loaded
                .runs
                .iter()
                .filter(|r| r.filter.may_contain(h))
                .count();
        }
        assert!(
            false_hits < 200,
            "{false_hits} filter hits for 2000 absent ids"
        );
    }
}
