//! Commands: every write that depends on state. A command is decided by the engine's decider
//! ([`crate::decider`]) against the read models caught up to the head, in a transaction of the
//! models store it only reads; it returns the events that record its decision, which are
//! appended on the condition that the subjects it decided on have not changed since (spec
//! section 3). One module per family:
//! - [`outbox`]: routing, leases, completions, failures, operator actions (sections 4–5);
//! - [`cursors`]: advance and reset (section 6, I4);
//! - [`bridges`]: subscriptions and delivery confirmations (section 6);
//! - [`admission`]: the crisis block and the outbox bound on a client's append (section 14);
//! - [`sources`]: a polled page, the watermark's compare-and-swap, pause/resume/park/reset
//!   (section 12);
//! - [`retention`]: what leaves the read models after the window (section 13).
//!
//! Each command is a type of its family implementing [`Command`], with its own answer type:
//! the caller gets that answer back, never a variant to unpack.

pub mod admission;
pub mod bridges;
pub mod cursors;
pub mod lists;
pub mod outbox;
pub mod retention;
mod round;
pub mod routes;
pub mod sources;
pub mod tenants;

use crate::error::CommandError;
use tidemark_log::NewEvent;

pub use admission::Admission;
pub use bridges::{Confirmation, Subscribed};
pub use outbox::{Completed, Failure, OperatorAction};
pub use retention::{CompactReport, RetentionReport};
pub use sources::{NotifyPlan, PageOutcome, SourceItem};

pub use round::Round;
pub(crate) use round::key;
use tidemark_projections::ModelsTxn;

/// A command the engine executes ([`crate::Engine::execute`]): one type per command, each
/// with its own answer. Implemented by the command types of the families above only.
pub trait Command: sealed::Sealed + Send + 'static {
    /// What the command answers its caller (with the log's receipt).
    type Answer: Send + 'static;

    /// Set by a compaction alone ([`retention::Compact`]): it is decided on its own after the
    /// round, its decision (every projection's snapshot, in the models store) is committed
    /// and synced, then the log drops its events up to the cut the report names and the
    /// report is completed from the log's answer. `None` for every other command.
    #[doc(hidden)]
    const COMPACTION: Option<fn(&mut Self::Answer) -> &mut CompactReport> = None;

    /// Decide against the models caught up to the head (`txn`, which it only reads) at
    /// `round.now_us`. When the log refuses the decision because what it rests on changed,
    /// the command is decided again from scratch against the newer models: a decision
    /// depends on the command and the models only.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer>;
}

/// Only the command types of the families implement [`Command`]: these, each with its name.
mod sealed {
    pub trait Sealed {
        /// A short name for spans and metrics (`tidemark_commands_total{command}`).
        const NAME: &'static str;
    }

    macro_rules! sealed {
        ($($family:ident::{$($command:ident = $name:literal),+ $(,)?}),+ $(,)?) => {
            $($(impl Sealed for super::$family::$command {
                const NAME: &'static str = $name;
            })+)+
        };
    }

    sealed! {
        admission::{Admit = "append.admit"},
        bridges::{Subscribe = "bridge.subscribe", Unsubscribe = "bridge.unsubscribe"},
        bridges::{Confirm = "bridge.confirm", ConfirmOne = "bridge.confirm"},
        cursors::{Advance = "cursor.advance", Reset = "cursor.reset"},
        lists::{SetList = "list.set"},
        outbox::{Route = "outbox.route", Claim = "outbox.claim", Extend = "outbox.extend"},
        outbox::{Complete = "outbox.complete", CompleteOne = "outbox.complete"},
        outbox::{Fail = "outbox.fail", Operator = "outbox.operator", Recover = "outbox.recover"},
        outbox::{ExpireLeases = "outbox.expire_leases", BridgeFailed = "bridges.failed"},
        outbox::{SwitchEndpoint = "outbox.switch_endpoint"},
        outbox::{ResolveEndpoints = "outbox.resolve_endpoints"},
        retention::{Purge = "retention.run", Compact = "retention.compact"},
        routes::{SetRoute = "route.set"},
        sources::{Page = "source.page", Advance = "source.advance", Reset = "source.reset"},
        sources::{Pause = "source.pause", Resume = "source.resume", Park = "source.park"},
        tenants::{SetTenant = "tenant.set", MoveTenant = "tenant.move"},
    }
}

/// What [`Command::decide`] answers.
pub type DecideResult<A> = Result<Decided<A>, CommandError>;

/// What a command decided: its answer, the events that record it, and the subjects it read
/// besides those it appends to (each with the seq of its last event as the models have it),
/// which the append's condition names too.
#[derive(Debug)]
pub struct Decided<A> {
    pub answer: A,
    pub events: Vec<NewEvent>,
    pub reads: Vec<(String, String)>,
}

impl<A> Decided<A> {
    /// `answer`, recorded by `events`, resting on the subjects they append to only.
    pub fn new(answer: A, events: Vec<NewEvent>) -> Self {
        Decided {
            answer,
            events,
            reads: Vec::new(),
        }
    }
}
