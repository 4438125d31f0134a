//! A queued command with its type erased: it decides against a [`Round`] and answers its
//! caller.

use tidemark_log::{AppendReceipt, StorageError};
use tidemark_projections::ModelsTxn;
use tokio::sync::oneshot;

use crate::commands::{Command, CompactReport, Decided, Round};
use crate::error::CommandError;

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
    /// The tenant it acts for (`None`: the default tenant): it decides on that tenant's
    /// models and appends to its events (spec section 20).
    pub(super) tenant: Option<std::sync::Arc<str>>,
}

impl Queued {
    pub(super) fn answer(self, r: Result<AppendReceipt, CommandError>) {
        self.job.answer(r);
    }
}
