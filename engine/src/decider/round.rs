//! A round of decisions: what a command decides against ([`Round`], [`LogReads`]), and a
//! queued command with its type erased.

use std::collections::HashSet;

use tidemark_log::{AppendReceipt, EventLog, StorageError};
use tidemark_projections::ModelsTxn;
use tokio::sync::oneshot;

use crate::commands::{Command, CompactReport, Decided};
use crate::error::CommandError;
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
/// commands did that the models do not show yet. Only the decider makes one.
pub struct Round<'a> {
    pub(crate) now_us: i64,
    /// The head the models were folded to.
    pub(crate) head: u64,
    pub(crate) privacy: Option<&'a Privacy>,
    pub(crate) log: &'a dyn LogReads,
    /// `stream ‖ 0 ‖ subject` of every subject an earlier command of the round appends to or
    /// read.
    pub(super) touched: HashSet<Vec<u8>>,
    /// Deliveries the round's earlier accepted batches will add (the outbox bound).
    pub(crate) pending_added: u64,
    /// Other nodes admit to the same outbox (spec section 16): an admission that adds
    /// deliveries also writes `outbox.admitted` on the one subject every node's admissions
    /// write, so it is appended only if no other admission came in since the models it was
    /// judged on (`max_pending` is never exceeded across nodes).
    pub(crate) shared_outbox: bool,
}

pub(super) fn key(stream: &str, subject: &str) -> Vec<u8> {
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

/// A command in the decider's queue, its type erased: it decides (keeping its typed answer)
/// and answers its caller.
pub(super) trait Job: Send {
    /// Decide (again, from scratch): the events and the subjects read besides those they
    /// append to; the answer is kept for [`Job::answer`].
    fn decide(
        &mut self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<()>, CommandError>;

    /// Answer the caller: the answer of the last decision with the log's receipt, or the
    /// error.
    fn answer(self: Box<Self>, r: Result<AppendReceipt, CommandError>);

    /// A compaction ([`Command::COMPACTION`]): decided alone, after the round.
    fn is_compaction(&self) -> bool;

    /// A compaction's report, once decided, for the log's answer to complete.
    fn compaction_report(&mut self) -> Option<&mut CompactReport>;
}

/// Command `C` waiting for its answer.
pub(super) struct Typed<C: Command> {
    pub(super) cmd: C,
    /// The answer of its last decision.
    pub(super) answer: Option<C::Answer>,
    /// Taken when answered; a command dropped unanswered while the decider unwinds from a
    /// panic is answered from [`Drop`].
    pub(super) reply: Option<Reply<C>>,
}

/// Where command `C`'s answer goes.
pub(super) type Reply<C> =
    oneshot::Sender<Result<(<C as Command>::Answer, AppendReceipt), CommandError>>;

impl<C: Command> Drop for Typed<C> {
    fn drop(&mut self) {
        if let Some(reply) = self.reply.take()
            && std::thread::panicking()
        {
            let _ = reply.send(Err(CommandError::Poisoned(
                "the decider panicked while this command was in its hands: whether what it \
                 decided was appended is not known (read before retrying); commands are refused \
                 until tidemark is restarted"
                    .to_owned(),
            )));
        }
    }
}

impl<C: Command> Job for Typed<C> {
    fn decide(
        &mut self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<()>, CommandError> {
        self.answer = None;
        let Decided {
            answer,
            events,
            reads,
        } = self.cmd.decide(txn, round)?;
        self.answer = Some(answer);
        Ok(Decided {
            answer: (),
            events,
            reads,
        })
    }

    fn answer(mut self: Box<Self>, r: Result<AppendReceipt, CommandError>) {
        let Some(reply) = self.reply.take() else {
            return;
        };
        let r = r.and_then(|receipt| match self.answer.take() {
            Some(a) => Ok((a, receipt)),
            None => Err(CommandError::Storage(StorageError::msg(
                "the decider answered a command it had not decided",
            ))),
        });
        let _ = reply.send(r);
    }

    fn is_compaction(&self) -> bool {
        C::COMPACTION.is_some()
    }

    fn compaction_report(&mut self) -> Option<&mut CompactReport> {
        Some(C::COMPACTION?(self.answer.as_mut()?))
    }
}

/// A queued command and the decisions of it the log refused so far.
pub(super) struct Queued {
    pub(super) job: Box<dyn Job>,
    pub(super) attempts: u32,
}

impl Queued {
    pub(super) fn answer(self, r: Result<AppendReceipt, CommandError>) {
        self.job.answer(r);
    }
}
