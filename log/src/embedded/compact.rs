//! Log compaction (spec section 13, `[retention] compact_log`): the events up to a cut leave
//! the log, with their seqs in the subject, type and stream indexes. The cut never passes what
//! the index tables cover (`indexed_through`: events newer than that are indexed in memory
//! only) nor the head's predecessor, and a read or stream position before the first retained
//! event is refused (`ReadError::Compacted`, `410 compacted` over HTTP). The `event_id` index
//! keeps the ids of compacted events: resending one is still answered `duplicate: true` with
//! its original seq.

use std::collections::BTreeSet;

use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

use super::postings::{self, STREAM_BLOCKS, SUBJECT_BLOCKS, TYPE_BLOCKS};
use super::store::{EVENTS, META, META_INDEXED_THROUGH, decode_event_ref};
use crate::Compacted;
use crate::error::StorageError;

/// `log_meta` key: the first seq the log holds (absent: 1).
pub(crate) const META_FIRST_SEQ: &str = "first_seq";

/// Events removed by one call at most: a long prefix is compacted in several bounded
/// transactions.
pub const COMPACT_MAX: u64 = 50_000;

fn st(e: impl Into<redb::Error>) -> StorageError {
    StorageError::of(e.into())
}

/// The first seq the log holds, as `txn` sees it (1 when nothing was compacted).
pub(crate) fn first_seq_in(txn: &WriteTransaction) -> Result<u64, StorageError> {
    let meta = txn.open_table(META).map_err(st)?;
    Ok(meta
        .get(META_FIRST_SEQ)
        .map_err(st)?
        .map(|v| v.value())
        .unwrap_or(1))
}

/// The first seq the log holds, from a read transaction.
pub(crate) fn first_seq(db: &redb::Database) -> Result<u64, StorageError> {
    first_seq_of(&db.begin_read().map_err(st)?)
}

/// The first seq the log holds, as read transaction `txn` sees it.
pub(crate) fn first_seq_of(txn: &redb::ReadTransaction) -> Result<u64, StorageError> {
    let meta = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(1),
        Err(e) => return Err(st(e)),
    };
    Ok(meta
        .get(META_FIRST_SEQ)
        .map_err(st)?
        .map(|v| v.value())
        .unwrap_or(1))
}

/// Remove the events with seq `<= through` (at most [`COMPACT_MAX`] of them, none past
/// `indexed_through`, never the head) and their index rows, in `txn`.
pub(crate) fn compact_in(txn: &WriteTransaction, through: u64) -> Result<Compacted, StorageError> {
    let first = first_seq_in(txn)?;
    let indexed = {
        let meta = txn.open_table(META).map_err(st)?;
        meta.get(META_INDEXED_THROUGH)
            .map_err(st)?
            .map(|v| v.value())
            .unwrap_or(0)
    };
    let head = {
        let events = txn.open_table(EVENTS).map_err(st)?;
        let last = events.last().map_err(st)?;
        last.map(|(k, _)| k.value()).unwrap_or(0)
    };
    let want = through.min(indexed).min(head.saturating_sub(1));
    let upto = want.min(first.saturating_add(COMPACT_MAX - 1));
    if upto < first {
        return Ok(Compacted {
            removed: 0,
            first_seq: first,
            more: false,
        });
    }
    // The keys the cut touches in each index (subject, type, stream): their blocks up to the
    // cut go, with the events.
    let mut keys: [BTreeSet<String>; 3] = Default::default();
    let mut removed = 0;
    {
        let events = txn.open_table(EVENTS).map_err(st)?;
        for row in events.range(first..=upto).map_err(st)? {
            let (k, v) = row.map_err(st)?;
            let e = decode_event_ref(k.value(), v.value()).map_err(StorageError::of)?;
            for (set, key) in keys.iter_mut().zip([e.subject, e.event_type, e.stream]) {
                let key = crate::envelope::scoped(e.tenant, key);
                if !set.contains(&*key) {
                    set.insert(key.into_owned());
                }
            }
            removed += 1;
        }
    }
    {
        txn.open_table(EVENTS)
            .map_err(st)?
            .retain_in(first..=upto, |_, _| false)
            .map_err(st)?;
        for (def, set) in [SUBJECT_BLOCKS, TYPE_BLOCKS, STREAM_BLOCKS]
            .into_iter()
            .zip(&keys)
        {
            let mut t = txn.open_table(def).map_err(st)?;
            for key in set {
                postings::remove_through(&mut t, key, upto)?;
            }
        }
        let mut meta = txn.open_table(META).map_err(st)?;
        meta.insert(META_FIRST_SEQ, upto + 1).map_err(st)?;
    }
    Ok(Compacted {
        removed,
        first_seq: upto + 1,
        more: upto < want,
    })
}

/// The first seq after `after` of `stream` (and of `subject` when it is not empty), among the
/// events the index tables cover, as `txn` sees them: what a cursor still needs.
pub(crate) fn next_in_index(
    txn: &redb::ReadTransaction,
    stream: &str,
    subject: &str,
    after: u64,
) -> Result<Option<u64>, StorageError> {
    let after = after.saturating_add(1);
    if subject.is_empty() {
        let t = txn.open_table(STREAM_BLOCKS).map_err(st)?;
        return postings::first_from(&t, stream, None, after, u64::MAX);
    }
    let t = txn.open_table(SUBJECT_BLOCKS).map_err(st)?;
    postings::first_from(&t, subject, Some(stream), after, u64::MAX)
}

/// The last seq whose event time is before `before_us` (0 when none), as `txn` sees the log:
/// event times never go back along seq, so a binary search finds it.
pub(crate) fn last_before_in(
    txn: &redb::ReadTransaction,
    before_us: i64,
) -> Result<u64, StorageError> {
    let events = txn.open_table(EVENTS).map_err(st)?;
    let time_of = |seq: u64| -> Result<Option<i64>, StorageError> {
        match events.get(seq).map_err(st)? {
            Some(v) => Ok(Some(
                decode_event_ref(seq, v.value())
                    .map_err(StorageError::of)?
                    .time_us,
            )),
            None => Ok(None),
        }
    };
    let Some(last) = events.last().map_err(st)?.map(|(k, _)| k.value()) else {
        return Ok(0);
    };
    let Some(first) = events.first().map_err(st)?.map(|(k, _)| k.value()) else {
        return Ok(0);
    };
    // Invariant: time(lo) < before (or lo = first - 1), time(hi) >= before (or hi = last + 1).
    let (mut lo, mut hi) = (first - 1, last + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match time_of(mid)? {
            Some(t) if t < before_us => lo = mid,
            Some(_) => hi = mid,
            // Seqs are dense between first and last.
            None => return Err(StorageError::msg(format!("event {mid} is missing"))),
        }
    }
    Ok(lo)
}
