//! The posting index tables, in blocks of seqs.
//!
//! For each subject, event type and stream, the seqs of its events up to `indexed_through`
//! (newer ones are in the tail). A merge writes each key's list from the frozen tail part as
//! blocks of at most [`BLOCK`] seqs, one redb row each, keyed by `(key, last seq of the
//! block)`: a merge of 100,000 events over 10,000 subjects writes about 10,400 rows instead of
//! 300,000 (one per event per index), and a seek is one range lookup (the first block whose
//! last seq is at or past the target) and a search inside it.
//!
//! A block's bytes: the number of stream names it refers to, each name (length, bytes); the
//! number of entries; then per entry the seq's distance from the one before (the first from
//! 0), and, when the block names streams (the subject index: a subject's events span
//! streams), the index of its stream's name. All numbers are LEB128.

use std::collections::HashMap;
use std::sync::Arc;

use redb::{ReadableTable, TableDefinition, WriteTransaction};

use super::tail::Postings;
use crate::error::{StorageError, storage};

/// `(subject, last seq of the block)` → block of (seq, stream).
pub(crate) const SUBJECT_BLOCKS: TableDefinition<(&str, u64), &[u8]> =
    TableDefinition::new("subject_blocks");
/// `(event type, last seq of the block)` → block of seqs.
pub(crate) const TYPE_BLOCKS: TableDefinition<(&str, u64), &[u8]> =
    TableDefinition::new("type_blocks");
/// `(stream, last seq of the block)` → block of seqs.
pub(crate) const STREAM_BLOCKS: TableDefinition<(&str, u64), &[u8]> =
    TableDefinition::new("stream_blocks");

/// Seqs per block, at most.
pub(crate) const BLOCK: usize = 256;

/// A decoded block: seqs ascending, and for the subject index each one's stream.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Block {
    pub seqs: Vec<u64>,
    /// Index into `names` per seq (empty when the block names no streams).
    pub stream_of: Vec<u32>,
    pub names: Vec<String>,
}

impl Block {
    /// The stream of the `i`-th seq (`None` in a block that names no streams).
    pub fn stream(&self, i: usize) -> Option<&str> {
        let n = *self.stream_of.get(i)? as usize;
        self.names.get(n).map(String::as_str)
    }

    /// The first seq `>= from`, with its index.
    pub fn seek(&self, from: u64) -> Option<(usize, u64)> {
        let i = self.seqs.partition_point(|s| *s < from);
        self.seqs.get(i).map(|s| (i, *s))
    }
}

fn put(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn get(bytes: &[u8], at: &mut usize) -> Result<u64, StorageError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&b) = bytes.get(*at) else {
            return Err(StorageError::msg("a posting block ends early"));
        };
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(StorageError::msg("a posting block has an overlong number"))
}

/// The bytes of one block of `entries` (seq ascending); with `streams`, each entry's stream is
/// kept.
pub(crate) fn encode(entries: &[(u64, Arc<str>)], streams: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + entries.len() * 3);
    let mut names: Vec<&str> = Vec::new();
    let mut index = Vec::with_capacity(if streams { entries.len() } else { 0 });
    if streams {
        for (_, s) in entries {
            let i = match names.iter().position(|n| *n == &**s) {
                Some(i) => i,
                None => {
                    names.push(s);
                    names.len() - 1
                }
            };
            index.push(i as u64);
        }
    }
    put(&mut out, names.len() as u64);
    for n in &names {
        put(&mut out, n.len() as u64);
        out.extend_from_slice(n.as_bytes());
    }
    put(&mut out, entries.len() as u64);
    let mut prev = 0;
    for (k, (seq, _)) in entries.iter().enumerate() {
        put(&mut out, seq - prev);
        prev = *seq;
        if streams {
            put(&mut out, index[k]);
        }
    }
    out
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Block, StorageError> {
    let mut at = 0;
    let n_names = get(bytes, &mut at)? as usize;
    let mut names = Vec::with_capacity(n_names.min(64));
    for _ in 0..n_names {
        let len = get(bytes, &mut at)? as usize;
        let Some(name) = bytes.get(at..at + len) else {
            return Err(StorageError::msg("a posting block ends early"));
        };
        at += len;
        names.push(
            std::str::from_utf8(name)
                .map_err(|e| StorageError::msg(format!("a posting block's stream: {e}")))?
                .to_owned(),
        );
    }
    let n = get(bytes, &mut at)? as usize;
    let mut seqs = Vec::with_capacity(n.min(BLOCK * 4));
    let mut stream_of = Vec::with_capacity(if n_names > 0 { n.min(BLOCK * 4) } else { 0 });
    let mut prev = 0u64;
    for _ in 0..n {
        prev = prev
            .checked_add(get(bytes, &mut at)?)
            .ok_or_else(|| StorageError::msg("a posting block's seq overflows"))?;
        seqs.push(prev);
        if n_names > 0 {
            let i = get(bytes, &mut at)?;
            if i as usize >= n_names {
                return Err(StorageError::msg("a posting block names no such stream"));
            }
            stream_of.push(i as u32);
        }
    }
    Ok(Block {
        seqs,
        stream_of,
        names,
    })
}

/// Write one index's posting lists (key → (seq, stream) ascending) as blocks, keys in order;
/// with `streams`, each seq's stream is kept (the subject index).
pub(crate) fn write(
    txn: &WriteTransaction,
    def: TableDefinition<(&str, u64), &[u8]>,
    postings: &HashMap<String, Postings>,
    streams: bool,
) -> Result<(), StorageError> {
    let mut keys: Vec<(&str, &Postings)> = postings.iter().map(|(k, v)| (k.as_str(), v)).collect();
    keys.sort_unstable_by_key(|(k, _)| *k);
    let mut t = txn.open_table(def).map_err(storage)?;
    for (key, list) in keys {
        for block in list.chunks(BLOCK) {
            let Some((last, _)) = block.last() else {
                continue;
            };
            t.insert((key, *last), encode(block, streams).as_slice())
                .map_err(storage)?;
        }
    }
    Ok(())
}

/// The first block of `key` whose last seq is `>= from`: its last seq and the block.
pub(crate) fn block_from<T>(
    t: &T,
    key: &str,
    from: u64,
) -> Result<Option<(u64, Block)>, StorageError>
where
    T: ReadableTable<(&'static str, u64), &'static [u8]>,
{
    let mut r = t.range((key, from)..=(key, u64::MAX)).map_err(storage)?;
    match r.next() {
        Some(row) => {
            let (k, v) = row.map_err(storage)?;
            Ok(Some((k.value().1, decode(v.value())?)))
        }
        None => Ok(None),
    }
}

/// The first seq of `key` in `[from, upto]` whose stream is `stream` (any stream: `None`).
pub(crate) fn first_from<T>(
    t: &T,
    key: &str,
    stream: Option<&str>,
    from: u64,
    upto: u64,
) -> Result<Option<u64>, StorageError>
where
    T: ReadableTable<(&'static str, u64), &'static [u8]>,
{
    let mut from = from;
    while from <= upto {
        let Some((last, block)) = block_from(t, key, from)? else {
            return Ok(None);
        };
        if let Some((i, _)) = block.seek(from) {
            for (j, &s) in block.seqs.iter().enumerate().skip(i) {
                if s > upto {
                    return Ok(None);
                }
                if stream.is_none_or(|st| block.stream(j) == Some(st)) {
                    return Ok(Some(s));
                }
            }
        }
        from = match last.checked_add(1) {
            Some(f) => f,
            None => return Ok(None),
        };
    }
    Ok(None)
}

/// The last seq of `key` at or before `upto` whose stream is `stream` (0: none).
pub(crate) fn last_upto<T>(t: &T, key: &str, stream: &str, upto: u64) -> Result<u64, StorageError>
where
    T: ReadableTable<(&'static str, u64), &'static [u8]>,
{
    let pick = |block: &Block| {
        block
            .seqs
            .iter()
            .enumerate()
            .rev()
            .find(|&(j, &s)| s <= upto && block.stream(j) == Some(stream))
            .map(|(_, &s)| s)
    };
    // The block that may straddle `upto`, then whole blocks before it, newest first.
    if let Some(next) = upto.checked_add(1)
        && let Some((_, block)) = block_from(t, key, next)?
        && let Some(s) = pick(&block)
    {
        return Ok(s);
    }
    for row in t.range((key, 0)..=(key, upto)).map_err(storage)?.rev() {
        let (_, v) = row.map_err(storage)?;
        if let Some(s) = pick(&decode(v.value())?) {
            return Ok(s);
        }
    }
    Ok(0)
}

/// Drop the seqs `<= upto` of `key`: its blocks that end there go, the one that straddles it
/// keeps its rest (under the same key: its last seq does not change).
pub(crate) fn remove_through(
    t: &mut redb::Table<'_, (&'static str, u64), &'static [u8]>,
    key: &str,
    upto: u64,
) -> Result<(), StorageError> {
    t.retain_in((key, 0)..=(key, upto), |_, _| false)
        .map_err(storage)?;
    let Some(next) = upto.checked_add(1) else {
        return Ok(());
    };
    let Some((last, block)) = block_from(t, key, next)? else {
        return Ok(());
    };
    let keep = block.seqs.partition_point(|s| *s <= upto);
    if keep == 0 {
        return Ok(());
    }
    let rest: Vec<(u64, Arc<str>)> = (keep..block.seqs.len())
        .map(|j| (block.seqs[j], Arc::from(block.stream(j).unwrap_or(""))))
        .collect();
    t.insert(
        (key, last),
        encode(&rest, !block.names.is_empty()).as_slice(),
    )
    .map_err(storage)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use redb::ReadableDatabase;

    fn entries(seqs: &[u64], streams: &[&str]) -> Vec<(u64, Arc<str>)> {
        seqs.iter()
            .enumerate()
            .map(|(i, s)| (*s, Arc::from(streams[i % streams.len()])))
            .collect()
    }

    proptest! {
        /// A block decodes to what was encoded: seqs, and each one's stream when kept.
        #[test]
        fn a_block_round_trips(
            mut seqs in proptest::collection::vec(1u64..u64::MAX / 2, 1..600),
            with_streams in any::<bool>(),
        ) {
            seqs.sort_unstable();
            seqs.dedup();
            let e = entries(&seqs, &["task_events", "bridges", "x"]);
            let b = decode(&encode(&e, with_streams)).unwrap();
            prop_assert_eq!(&b.seqs, &seqs);
            for (i, (_, s)) in e.iter().enumerate() {
                prop_assert_eq!(b.stream(i), with_streams.then_some(&**s));
            }
        }
    }

    #[test]
    fn a_truncated_block_is_an_error_not_a_panic() {
        let bytes = encode(&entries(&[5, 9, 300], &["s"]), true);
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "{n}");
        }
    }

    /// Seeks, last-of and removal across several blocks agree with a plain list.
    #[test]
    fn lookups_and_removal_agree_with_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("p.redb")).unwrap();
        let seqs: Vec<u64> = (1..=1000).map(|i| i * 3).collect();
        let list = entries(&seqs, &["a", "b"]);
        let mut map = HashMap::new();
        map.insert("k".to_owned(), list.clone());
        map.insert("other".to_owned(), entries(&[1, 2], &["a"]));
        let txn = db.begin_write().unwrap();
        write(&txn, SUBJECT_BLOCKS, &map, true).unwrap();
        txn.commit().unwrap();
        let check = |db: &redb::Database, first: u64| {
            let r = db.begin_read().unwrap();
            let t = r.open_table(SUBJECT_BLOCKS).unwrap();
            for from in [0, 1, 3, 4, 767, 768, 769, 1500, 2999, 3000, 3001] {
                let want = seqs.iter().copied().find(|s| *s >= from.max(first));
                assert_eq!(
                    first_from(&t, "k", None, from.max(first), u64::MAX).unwrap(),
                    want,
                    "{from}"
                );
                let want_b = list
                    .iter()
                    .find(|(s, st)| *s >= from.max(first) && &**st == "b")
                    .map(|(s, _)| *s);
                assert_eq!(
                    first_from(&t, "k", Some("b"), from.max(first), u64::MAX).unwrap(),
                    want_b
                );
                let want_last = list
                    .iter()
                    .rev()
                    .find(|(s, st)| *s <= from && *s >= first && &**st == "a")
                    .map_or(0, |(s, _)| *s);
                assert_eq!(last_upto(&t, "k", "a", from).unwrap(), want_last, "{from}");
            }
            assert_eq!(first_from(&t, "k", None, 10, 11).unwrap(), None);
            assert_eq!(first_from(&t, "none", None, 0, u64::MAX).unwrap(), None);
        };
        check(&db, 0);
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(SUBJECT_BLOCKS).unwrap();
            remove_through(&mut t, "k", 1000).unwrap();
            remove_through(&mut t, "other", 1000).unwrap();
        }
        txn.commit().unwrap();
        check(&db, 1001);
        let r = db.begin_read().unwrap();
        let t = r.open_table(SUBJECT_BLOCKS).unwrap();
        assert_eq!(first_from(&t, "other", None, 0, u64::MAX).unwrap(), None);
    }
}
