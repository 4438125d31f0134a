//! The seq of the last event of every subject of the streams commands put conditions on
//! (spec section 3): the deliveries, cursors, bridge subscriptions, sources, recipients and
//! the outbox's admissions on a cluster, and the endpoints' circuits. A
//! command that decided on a subject appends on the condition that this is still its last
//! event, so a decision on stale state is refused by the log, whoever appended in between.
//!
//! Kept in the models store beside the read models and followed with them (not part of any
//! model's digest: it is bookkeeping of the follower, rebuilt from the log with the store).
//! A subject whose every event was compacted away has no last event in the log any more; its
//! row, older than the log's first seq, reads as 0 ([`last`]).

use crate::framework::overlay::{MODELS_META_TABLE, SUBJECT_LAST_TABLE};
use redb::TableDefinition;
use tidemark_log::{EventLog, EventRef, StorageError};

use crate::framework::{Src, TxMut};
use crate::names::Stream;

/// The streams whose subjects are followed.
pub const STREAMS: [Stream; 8] = [
    Stream::Deliveries,
    Stream::Cursors,
    Stream::Bridges,
    Stream::Sources,
    Stream::Recipients,
    Stream::Outbox,
    Stream::Endpoints,
    Stream::Tenants,
];

/// `stream ‖ 0 ‖ subject` → seq of its last event, the stream scoped to its tenant
/// (`tidemark_log::scoped`: as it was for the default tenant).
const LAST: TableDefinition<&[u8], u64> = TableDefinition::new(SUBJECT_LAST_TABLE);
/// Bookkeeping of the models store: `subjects` → the seq the table reflects.
const META: TableDefinition<&str, u64> = TableDefinition::new(MODELS_META_TABLE);
const CHECKPOINT: &str = "subjects";

fn key(tenant: Option<&str>, stream: &str, subject: &str) -> Vec<u8> {
    let stream = tidemark_log::scoped(tenant, stream);
    let mut k = Vec::with_capacity(stream.len() + 1 + subject.len());
    k.extend_from_slice(stream.as_bytes());
    k.push(0);
    k.extend_from_slice(subject.as_bytes());
    k
}

/// Whether `stream`'s subjects are followed.
pub fn followed(stream: &str) -> bool {
    STREAMS.iter().any(|s| s.as_str() == stream)
}

/// The seq the table reflects. A new table on a compacted log cannot be read from the start:
/// it goes on from the first seq the log holds (what was dropped is not a last event any more).
pub fn checkpoint(src: Src<'_>, log: &impl EventLog) -> Result<u64, super::FoldError> {
    let at = src.get_str_u64(META, CHECKPOINT)?.unwrap_or(0);
    // Only a store that never followed (new, or migrated) can be behind a compaction: a
    // compaction syncs the models at the head before the log drops anything. The log is asked
    // then only, not at every fold.
    if at > 0 {
        return Ok(at);
    }
    Ok(log
        .first_seq()
        .map_err(super::FoldError::Log)?
        .saturating_sub(1))
}

/// Record the last seq of the followed subjects among `events` (in seq order), and that the
/// table reflects the log through `upto`.
pub fn record(mut tx: TxMut<'_>, events: &[EventRef<'_>], upto: u64) -> Result<(), StorageError> {
    match &mut tx {
        // One table opened for every event (a rebuild's or the start's long folds).
        TxMut::Redb(txn) => {
            let mut t = txn.open_table(LAST).map_err(StorageError::of)?;
            for e in events.iter().filter(|e| followed(e.stream)) {
                t.insert(key(e.tenant, e.stream, e.subject).as_slice(), e.seq)
                    .map_err(StorageError::of)?;
            }
        }
        TxMut::Mem(_) => {
            for e in events.iter().filter(|e| followed(e.stream)) {
                tx.put_u64(LAST, &key(e.tenant, e.stream, e.subject), e.seq)?;
            }
        }
    }
    tx.put_str_u64(META, CHECKPOINT, upto)
}

/// The seq of the last event of `tenant`'s `(stream, subject)` as the models store has it (0: none, or
/// every one of them is before `first_seq`, compacted).
pub(crate) fn last(
    src: Src<'_>,
    tenant: Option<&str>,
    stream: &str,
    subject: &str,
    first_seq: u64,
) -> Result<u64, StorageError> {
    let seq = src
        .get_u64(LAST, &key(tenant, stream, subject))?
        .unwrap_or(0);
    Ok(if seq < first_seq { 0 } else { seq })
}
