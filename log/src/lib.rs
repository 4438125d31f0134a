//! The durable event log of tidemark.
//!
//! Every fact is an [`Event`] appended to the log under a global, dense `seq` (I1), idempotent
//! by `event_id` (I2). The crate is the backend-neutral interface, [`EventLog`], at the top
//! level, and the embedded backend tidemark runs on, [`Log`] (a journal and one redb file,
//! group-committed by the appenders themselves and indexed into redb after the reply), in its
//! own folder, `embedded/`.
//!
//! # Layout
//! The interface, at the top level of `src/`:
//! - `lib.rs`: [`EventLog`], [`ReadQuery`] / [`ReadPage`], [`EventChunk`], [`AppendReceipt`] /
//!   [`Appended`].
//! - [`envelope`]: [`NewEvent`] (validated input, canonical payload) and [`Event`] (served).
//! - [`condition`]: conditions of conditional appends.
//! - [`error`]: the errors.
//! - [`time`]: event time formatting.
//!
//! The redb backend, in `src/embedded/` (module `embedded`, re-exported here):
//! - `embedded/mod.rs`: [`Log`], [`LogConfig`], [`OpenReport`].
//! - `codec`: the stored byte format, versioned.
//! - `commit`: the group commit, led by the appender that finds the log idle; `condition`: the
//!   conditions of conditional appends judged by the leader.
//! - `indexer`: the thread that writes redb after the reply (events, merges, checkpoints,
//!   compaction); `reopen`: its reopen after a full disk.
//! - `journal`: the group's durable point (two segments), replayed at open.
//! - `tail`: in-memory index of the newest events, merged into redb in large batches.
//! - `recent`: the newest committed groups as stored, read by the followers at the head.
//! - `ids`: the `event_id` index, as sorted runs with filters.
//! - `store`: table definitions, open/recovery, bounded reads.
//! - [`compact`]: log compaction (section 13).
//! - [`storage`]: the byte stores under the log; [`fault`]: the fault-injecting store.
//!
//! # Public surface
//! - The narrow interface every backend implements: [`EventLog`] (append, conditional append
//!   on a [`Condition`], read by [`ReadQuery`] into a [`ReadPage`], get, get by id, head,
//!   subscribe), with [`NewEvent`] / [`Event`] / [`limits`], [`AppendReceipt`] / [`Appended`]
//!   and the errors ([`AppendError`], [`ReadError`], [`OpenError`], [`StorageError`]).
//! - The redb backend: [`Log`] ([`LogConfig`], [`OpenReport`]), with the retention operations
//!   of section 13 ([`Log::compact`], [`Log::last_before`], [`Log::next_of`]) and
//!   [`EventChunk`], a run of events read in one buffer for folds.
//! - [`time`]: event time formatting.
//! - [`storage`]: the byte stores under the log ([`storage::Store`]); [`fault`]: the
//!   fault-injecting store tests run it on.

#![forbid(unsafe_code)]

mod any;
pub mod canonical;
pub mod condition;
mod embedded;
pub mod envelope;
pub mod error;
pub mod jetstream;
pub mod lease;
pub mod poison;
pub mod time;
pub mod transfer;

use serde::Serialize;
use tokio::sync::watch;

pub use any::AnyLog;
pub use condition::{Condition, ConditionOn, SubjectSeq};
pub use embedded::compact::COMPACT_MAX;
pub use embedded::{Log, LogConfig, OpenReport, SpaceLevel, SpaceState, compact, fault, storage};
pub use envelope::{
    DEFAULT_TENANT, Event, EventRef, FieldError, InvalidKind, MOVE_FENCE_STREAM, MOVE_FENCE_TYPE,
    MOVE_FILLER_TYPE, NewEvent, check_tenant, fence_subject, fenced_tenant, limits, scoped,
    tenant_of,
};
pub use error::{AppendError, Error, OpenError, ReadError, StorageError};
pub use jetstream::{JetStreamConfig, JetStreamLog};
pub use lease::{Leases, Share};
pub use poison::Poison;

/// A read of the log: up to `limit` events with `seq > after` that match every filter given.
/// Each filter is served by its index (combined filters by a join of them), so a page holds
/// `limit` matches whenever that many exist, and a shorter page is the end.
#[derive(Debug, Clone, Default)]
pub struct ReadQuery {
    /// Only this tenant's events, by name ([`envelope::DEFAULT_TENANT`] included); `None`:
    /// every tenant's (the folds, an operator's export), with a filter naming the default
    /// tenant's keys.
    pub tenant: Option<String>,
    pub after: u64,
    pub limit: usize,
    pub stream: Option<String>,
    pub subject: Option<String>,
    pub event_type: Option<String>,
}

/// The answer to a [`ReadQuery`]: every matching event with `after < seq <= next_after` is in
/// `events`, in order.
#[derive(Debug, Clone)]
pub struct ReadPage {
    pub events: Vec<Event>,
    pub next_after: u64,
    pub head: u64,
}

/// A log's lookups: an event by seq, and the retention operations of section 13. Every
/// [`EventLog`] has them; unlike it, this trait is an object, so a command reads the log
/// through `&dyn Lookups` whichever backend the engine runs on.
pub trait Lookups: Send + Sync {
    fn get(&self, seq: u64) -> Result<Option<Event>, ReadError>;
    /// The first seq the log holds: 1, or the first after a compacted prefix.
    fn first_seq(&self) -> Result<u64, StorageError>;
    /// The last seq whose event time is before `before_us` (0 when none).
    fn last_before(&self, before_us: i64) -> Result<u64, StorageError>;
    /// The first seq after `after` of `tenant`'s `stream` (and of `subject` when not empty):
    /// what a cursor at `after` still needs.
    fn next_of(
        &self,
        tenant: Option<&str>,
        stream: &str,
        subject: &str,
        after: u64,
    ) -> Result<Option<u64>, StorageError>;
}

/// [`Lookups`] for a log whose lookups are another's: `lookups_through!(Wrapper, |w| &w.inner)`
/// (a replica's, a wrapper's, one backend's of several).
#[macro_export]
macro_rules! lookups_through {
    ($ty:ty, |$s:ident| $to:expr) => {
        impl $crate::Lookups for $ty {
            fn get(&self, seq: u64) -> Result<Option<$crate::Event>, $crate::ReadError> {
                let $s = self;
                $crate::Lookups::get($to, seq)
            }
            fn first_seq(&self) -> Result<u64, $crate::StorageError> {
                let $s = self;
                $crate::Lookups::first_seq($to)
            }
            fn last_before(&self, before_us: i64) -> Result<u64, $crate::StorageError> {
                let $s = self;
                $crate::Lookups::last_before($to, before_us)
            }
            fn next_of(
                &self,
                tenant: Option<&str>,
                stream: &str,
                subject: &str,
                after: u64,
            ) -> Result<Option<u64>, $crate::StorageError> {
                let $s = self;
                $crate::Lookups::next_of($to, tenant, stream, subject, after)
            }
        }
    };
}

/// The narrow interface of the log (spec section 3): it speaks only of events. Append a batch
/// (atomic, idempotent by `event_id`), read by range and filters, get by seq or `event_id`, the
/// head and a commit notifier. No storage type crosses it, so another backend (spec section
/// 16, NATS JetStream) can implement it and pass the same contract suite
/// (`log/tests/contract.rs`).
pub trait EventLog: Lookups + 'static {
    /// Append a batch atomically: every event, or none. An `event_id` already in the log with
    /// the same content is answered with its original seq and `duplicate: true`; with other
    /// content the whole batch is refused with `Conflict`.
    fn append(
        &self,
        events: Vec<NewEvent>,
    ) -> impl std::future::Future<Output = Result<AppendReceipt, AppendError>> + Send;
    /// `append` on a condition: the head, and for each of several (stream, subject) pairs the
    /// seq of its last event (0: none yet), judged on the log as it stands just before the
    /// batch (the batches committed before it in the same group included). When any part
    /// does not hold, nothing of the batch is appended and the answer is `ExpectationFailed`
    /// naming that part. A batch none of whose events is new (all already in the log with the
    /// same content: the resend of an append that succeeded) is answered as duplicates with
    /// the original seqs whatever the condition, as an unconditional append is.
    fn append_if(
        &self,
        events: Vec<NewEvent>,
        condition: Condition,
    ) -> impl std::future::Future<Output = Result<AppendReceipt, AppendError>> + Send;
    /// Several batches, each appended atomically on its own condition as by
    /// [`EventLog::append_if`], in order, and answered each on its own: a decider's round.
    /// A backend commits them together where it can (the embedded log: one group, one sync);
    /// the default sends them all at once.
    fn append_all(
        &self,
        batches: Vec<(Vec<NewEvent>, Condition)>,
    ) -> impl std::future::Future<Output = Vec<Result<AppendReceipt, AppendError>>> + Send {
        futures::future::join_all(
            batches
                .into_iter()
                .map(|(events, condition)| self.append_if(events, condition)),
        )
    }
    /// A bounded page of committed events with `seq > q.after`, in order.
    fn read(&self, q: &ReadQuery) -> Result<ReadPage, ReadError>;
    /// `tenant`'s event (`None`: the default tenant's) of `event_id`.
    fn get_by_id(&self, tenant: Option<&str>, event_id: &str) -> Result<Option<Event>, ReadError>;
    /// The highest acknowledged seq (0 for an empty log).
    fn head(&self) -> u64;
    /// Changes on every commit; the value is the new head (a nudge: read the log for the
    /// events).
    fn subscribe(&self) -> watch::Receiver<u64>;
    /// The committed events `after < seq <= upto` (cut at the head) into `out`, for the folds.
    /// The default reads pages with [`EventLog::read`]; a backend may copy its stored records
    /// in one buffer instead (redb).
    fn read_chunk(&self, after: u64, upto: u64, out: &mut EventChunk) -> Result<(), ReadError> {
        let upto = upto.min(self.head());
        let mut events = Vec::new();
        let mut at = after;
        while at < upto {
            let page = self.read(&ReadQuery {
                after: at,
                limit: (upto - at).min(1000) as usize,
                ..ReadQuery::default()
            })?;
            let Some(last) = page.events.last().map(|e| e.seq) else {
                break;
            };
            events.extend(page.events.into_iter().filter(|e| e.seq <= upto));
            at = last;
        }
        out.fill(events);
        Ok(())
    }
    /// Requests waiting for the backend (0 when it does not say).
    fn queued(&self) -> usize {
        0
    }
    /// `Err(InsufficientStorage)` while the backend is short of space to append.
    fn check_space(&self) -> Result<(), AppendError> {
        Ok(())
    }
    /// Bytes free where this node keeps the log (or its replica); `None` when not known.
    fn free_bytes(&self) -> Option<u64> {
        None
    }
    /// How near this node's log (or replica) is to its free-space reserve, changed only when
    /// the level changes (as appends meet it); `None` when the backend does not keep one.
    fn space(&self) -> Option<tokio::sync::watch::Receiver<SpaceState>> {
        None
    }
    /// Whether a failure has stopped appends until a restart.
    fn is_poisoned(&self) -> bool {
        false
    }
    /// Stop after the requests already taken, and wait for it.
    fn close(&self) -> impl std::future::Future<Output = ()> + Send;
    /// Drop the events with seq `<= through` (bounded per call; never the head).
    fn compact(
        &self,
        through: u64,
    ) -> impl std::future::Future<Output = Result<Compacted, AppendError>> + Send;
}

/// A run of stored events copied out of the log in one buffer ([`EventChunk::read`]), decoded
/// as borrowed [`EventRef`]s: reading a chunk allocates nothing per event (the buffers are
/// reused from one chunk to the next), which is what projections fold in batches.
#[derive(Debug, Default)]
pub struct EventChunk {
    bytes: Vec<u8>,
    /// `(seq, end offset in bytes)` of each stored record, in seq order.
    ends: Vec<(u64, usize)>,
    /// Events a backend without the stored byte format handed over whole
    /// ([`EventChunk::fill`]); used instead of `bytes` when not empty.
    owned: Vec<Event>,
    /// The range read: the chunk holds the committed events `after < seq <= upto`.
    after: u64,
    upto: u64,
}

impl EventChunk {
    /// Replace the chunk's content with the committed events `after < seq <= upto` of `log`,
    /// through the log's interface ([`EventLog::read_chunk`]).
    /// A chunk that already holds exactly that range (read ahead: the models' follower reads
    /// each commit as it lands, hands it on, and folds later) is not read again.
    pub fn read(&mut self, log: &impl EventLog, after: u64, upto: u64) -> Result<(), ReadError> {
        let upto = upto.min(log.head());
        if (self.after, self.upto) == (after, upto) && after < upto {
            return Ok(());
        }
        // Not known until the read succeeds.
        (self.after, self.upto) = (0, 0);
        log.read_chunk(after, upto, self)?;
        (self.after, self.upto) = (after, upto.max(after));
        Ok(())
    }

    /// Empty the chunk (its buffers kept), as holding the empty range after `at`.
    pub fn reset(&mut self, at: u64) {
        self.bytes.clear();
        self.ends.clear();
        self.owned.clear();
        (self.after, self.upto) = (at, at);
    }

    /// The range the chunk holds: the committed events `after < seq <= upto`.
    pub fn range(&self) -> (u64, u64) {
        (self.after, self.upto)
    }

    /// Extend the chunk with `next`, which holds the range right after this one's.
    pub fn extend(&mut self, next: &EventChunk) {
        debug_assert_eq!(next.after, self.upto, "chunks extend only their own range");
        if !next.owned.is_empty() || !self.owned.is_empty() {
            // A backend without stored bytes (or a mix, which none makes): whole events.
            if self.owned.is_empty() && !self.ends.is_empty() {
                match self.to_events() {
                    Ok(evs) => self.owned = evs,
                    Err(_) => {
                        // Undecodable: forget what it holds, so the next read reads the log.
                        self.reset(0);
                        return;
                    }
                }
                self.bytes.clear();
                self.ends.clear();
            }
            match next.to_events() {
                Ok(mut evs) => self.owned.append(&mut evs),
                Err(_) => {
                    // Undecodable: forget what it holds, so the next read reads the log.
                    self.reset(0);
                    return;
                }
            }
        } else {
            let base = self.bytes.len();
            self.bytes.extend_from_slice(&next.bytes);
            self.ends
                .extend(next.ends.iter().map(|&(seq, end)| (seq, base + end)));
        }
        self.upto = next.upto;
    }

    /// Bytes the chunk holds (about: events handed over whole count their payloads).
    pub fn size(&self) -> usize {
        self.bytes.len()
            + self
                .owned
                .iter()
                .map(|e| e.payload.get().len() + e.event_id.len() + 64)
                .sum::<usize>()
    }

    /// The events after `seq`, at most `limit` of them, owned (what a follower hands the
    /// reactors).
    pub fn events_after(&self, seq: u64, limit: usize) -> Result<Vec<Event>, StorageError> {
        if !self.owned.is_empty() {
            return Ok(self
                .owned
                .iter()
                .filter(|e| e.seq > seq)
                .take(limit)
                .cloned()
                .collect());
        }
        let first = self.ends.partition_point(|&(s, _)| s <= seq);
        let mut start = if first == 0 {
            0
        } else {
            self.ends[first - 1].1
        };
        let last = self.ends.len().min(first.saturating_add(limit));
        let mut out = Vec::with_capacity(last - first);
        for &(s, end) in &self.ends[first..last] {
            out.push(
                embedded::store::decode_event(s, &self.bytes[start..end])
                    .map_err(StorageError::of)?,
            );
            start = end;
        }
        Ok(out)
    }

    fn to_events(&self) -> Result<Vec<Event>, StorageError> {
        self.events_after(0, usize::MAX)
    }

    /// Replace the chunk's content with `events` (a backend's `read_chunk` built on `read`).
    pub fn fill(&mut self, events: Vec<Event>) {
        self.bytes.clear();
        self.ends.clear();
        self.owned = events;
    }

    /// The number of events in the chunk.
    pub fn len(&self) -> usize {
        self.ends.len() + self.owned.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The events decoded, borrowing their strings and payloads from the chunk.
    pub fn events(&self) -> Result<Vec<EventRef<'_>>, StorageError> {
        if !self.owned.is_empty() {
            return Ok(self.owned.iter().map(Event::as_ref).collect());
        }
        let mut out = Vec::with_capacity(self.ends.len());
        let mut start = 0;
        for &(seq, end) in &self.ends {
            out.push(
                embedded::store::decode_event_ref(seq, &self.bytes[start..end])
                    .map_err(StorageError::of)?,
            );
            start = end;
        }
        Ok(out)
    }
}

/// What a compaction ([`EventLog::compact`]) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Events removed.
    pub removed: u64,
    /// The first seq the log now holds.
    pub first_seq: u64,
    /// The cut was limited (a backend bounds one compaction, the embedded one by
    /// [`COMPACT_MAX`]): call again to go on.
    pub more: bool,
}

/// One event of an append's reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Appended {
    pub event_id: String,
    pub seq: u64,
    /// The event_id was already in the log with the same content; `seq` is the original's.
    pub duplicate: bool,
}

/// The reply to an append: one entry per event sent, in order, and the head after the commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppendReceipt {
    pub events: Vec<Appended>,
    pub last_seq: u64,
}
