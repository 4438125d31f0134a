//! What a command decides against: the round it is decided in ([`Round`]) and what it may
//! read of the log besides the models ([`LogReads`]).

use std::collections::HashSet;

use tidemark_log::{EventLog, StorageError};

use crate::privacy::Privacy;

/// What a command may read of the log besides the models: an event by seq (a confirmation's),
/// and the retention operations a compaction decides with. Every [`EventLog`] is one; a
/// command sees it as this object, so the commands are the same whichever backend the engine
/// runs on.
pub trait LogReads: Send + Sync {
    fn get(&self, seq: u64) -> Result<Option<tidemark_log::Event>, tidemark_log::ReadError>;
    fn first_seq(&self) -> Result<u64, StorageError>;
    fn last_before(&self, before_us: i64) -> Result<u64, StorageError>;
    fn next_of(&self, stream: &str, subject: &str, after: u64)
    -> Result<Option<u64>, StorageError>;
}

impl<L: EventLog> LogReads for L {
    fn get(&self, seq: u64) -> Result<Option<tidemark_log::Event>, tidemark_log::ReadError> {
        EventLog::get(self, seq)
    }
    fn first_seq(&self) -> Result<u64, StorageError> {
        EventLog::first_seq(self)
    }
    fn last_before(&self, before_us: i64) -> Result<u64, StorageError> {
        EventLog::last_before(self, before_us)
    }
    fn next_of(
        &self,
        stream: &str,
        subject: &str,
        after: u64,
    ) -> Result<Option<u64>, StorageError> {
        EventLog::next_of(self, stream, subject, after)
    }
}

/// What one command decides against: the round's time and head, and what the round's earlier
/// commands did that the models do not show yet. Only the decider ([`crate::decider`]) makes
/// one.
pub struct Round<'a> {
    pub(crate) now_us: i64,
    /// The head the models were folded to.
    pub(crate) head: u64,
    pub(crate) privacy: Option<&'a Privacy>,
    pub(crate) log: &'a dyn LogReads,
    /// `stream ‖ 0 ‖ subject` of every subject an earlier command of the round appends to or
    /// read.
    pub(crate) touched: HashSet<Vec<u8>>,
    /// Deliveries the round's earlier accepted batches will add (the outbox bound).
    pub(crate) pending_added: u64,
    /// Other nodes admit to the same outbox (spec section 16): an admission that adds
    /// deliveries also writes `outbox.admitted` on the one subject every node's admissions
    /// write, so it is appended only if no other admission came in since the models it was
    /// judged on (`max_pending` is never exceeded across nodes).
    pub(crate) shared_outbox: bool,
    /// The routes' paces (section 4).
    pub(crate) pacer: &'a crate::commands::outbox::Pacer,
}

pub(crate) fn key(stream: &str, subject: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(stream.len() + 1 + subject.len());
    k.extend_from_slice(stream.as_bytes());
    k.push(0);
    k.extend_from_slice(subject.as_bytes());
    k
}

impl Round<'_> {
    /// Whether an earlier command of the round appends to (or read) this subject.
    pub(crate) fn touches(&self, stream: &str, subject: &str) -> bool {
        self.touched.contains(&key(stream, subject))
    }
}
