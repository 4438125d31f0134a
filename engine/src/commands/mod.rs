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

pub mod admission;
pub mod bridges;
pub mod cursors;
pub mod outbox;
pub mod retention;
pub mod sources;

use crate::error::CommandError;
use tidemark_log::NewEvent;
use tidemark_projections::bridges::Subscription;
use tidemark_projections::cursors::Cursor;
use tidemark_projections::deliveries::Delivery;

pub use bridges::{BridgeCommand, Confirmation};
pub use cursors::{Advance, CursorCommand};
pub use outbox::{Completed, Failure, OperatorAction, OutboxCommand};
pub use retention::{CompactCommand, CompactReport, RetentionCommand, RetentionReport};
pub use sources::{NotifyPlan, PageOutcome, SourceCommand, SourceItem};

use crate::decider::Round;
use crate::store::WriteTransaction;
pub use admission::Admission;

/// Every command the engine executes ([`crate::Engine::execute`]).
#[derive(Debug, Clone)]
pub enum Command {
    Outbox(OutboxCommand),
    Cursor(CursorCommand),
    Bridge(BridgeCommand),
    Source(SourceCommand),
    Retention(RetentionCommand),
    Compact(CompactCommand),
    /// The checks on a client's batch that requests notifications.
    Admit(admission::AdmitCommand),
}

impl From<CompactCommand> for Command {
    fn from(c: CompactCommand) -> Self {
        Command::Compact(c)
    }
}

impl From<RetentionCommand> for Command {
    fn from(c: RetentionCommand) -> Self {
        Command::Retention(c)
    }
}

impl From<SourceCommand> for Command {
    fn from(c: SourceCommand) -> Self {
        Command::Source(c)
    }
}

impl From<OutboxCommand> for Command {
    fn from(c: OutboxCommand) -> Self {
        Command::Outbox(c)
    }
}

impl From<CursorCommand> for Command {
    fn from(c: CursorCommand) -> Self {
        Command::Cursor(c)
    }
}

impl From<BridgeCommand> for Command {
    fn from(c: BridgeCommand) -> Self {
        Command::Bridge(c)
    }
}

impl Command {
    /// A short name for spans and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Outbox(c) => match c {
                OutboxCommand::Claim { .. } => "outbox.claim",
                OutboxCommand::Complete { .. } => "outbox.complete",
                OutboxCommand::Fail { .. } => "outbox.fail",
                OutboxCommand::Extend { .. } => "outbox.extend",
                OutboxCommand::Operator { .. } => "outbox.operator",
                OutboxCommand::Route { .. } => "outbox.route",
                OutboxCommand::ExpireLeases { .. } => "outbox.expire_leases",
            },
            Command::Cursor(CursorCommand::Advance(_)) => "cursor.advance",
            Command::Cursor(CursorCommand::Reset { .. }) => "cursor.reset",
            Command::Bridge(c) => match c {
                BridgeCommand::Subscribe { .. } => "bridge.subscribe",
                BridgeCommand::Unsubscribe { .. } => "bridge.unsubscribe",
                BridgeCommand::Confirm(_) => "bridge.confirm",
            },
            Command::Source(c) => c.name(),
            Command::Retention(_) => "retention.run",
            Command::Compact(_) => "retention.compact",
            Command::Admit(_) => "append.admit",
        }
    }
}

/// What a command answers, besides the events it appended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Claim: the rows now leased.
    Deliveries(Vec<Delivery>),
    /// Fail, extend, operator: the row after it.
    Delivery(Box<Delivery>),
    /// Complete: one result per item, in order.
    Completed(Vec<Completed>),
    /// Route: events appended; expire: leases released.
    Count(usize),
    /// Advance, reset: the cursor after it.
    Cursor(Cursor),
    /// Subscribe (`created`: it is new), unsubscribe.
    Subscription { row: Subscription, created: bool },
    /// Confirm: the cursor after each item, or why it was refused.
    Confirmed(Vec<Result<Cursor, CommandError>>),
    /// A source page: what was appended.
    SourcePage(PageOutcome),
    /// Any other source command: the source after it.
    Source(tidemark_projections::sources::SourceRow),
    /// A retention run: what it purged.
    Retention(RetentionReport),
    /// A compaction: what it dropped.
    Compacted(CompactReport),
    /// A client's batch: accepted (and appended), or why not.
    Admission(Admission),
}

fn unexpected(what: &str) -> CommandError {
    CommandError::Storage(format!("the command answered something other than {what}").into())
}

impl Outcome {
    pub fn into_deliveries(self) -> Result<Vec<Delivery>, CommandError> {
        match self {
            Outcome::Deliveries(d) => Ok(d),
            _ => Err(unexpected("deliveries")),
        }
    }
    pub fn into_delivery(self) -> Result<Delivery, CommandError> {
        match self {
            Outcome::Delivery(d) => Ok(*d),
            _ => Err(unexpected("a delivery")),
        }
    }
    pub fn into_completed(self) -> Result<Vec<Completed>, CommandError> {
        match self {
            Outcome::Completed(c) => Ok(c),
            _ => Err(unexpected("completions")),
        }
    }
    pub fn into_retention(self) -> Result<RetentionReport, CommandError> {
        match self {
            Outcome::Retention(r) => Ok(r),
            _ => Err(unexpected("a retention report")),
        }
    }
    pub fn into_compacted(self) -> Result<CompactReport, CommandError> {
        match self {
            Outcome::Compacted(r) => Ok(r),
            _ => Err(unexpected("a compaction report")),
        }
    }
    pub fn into_count(self) -> Result<usize, CommandError> {
        match self {
            Outcome::Count(n) => Ok(n),
            _ => Err(unexpected("a count")),
        }
    }
    pub fn into_cursor(self) -> Result<Cursor, CommandError> {
        match self {
            Outcome::Cursor(c) => Ok(c),
            _ => Err(unexpected("a cursor")),
        }
    }
    pub fn into_subscription(self) -> Result<(Subscription, bool), CommandError> {
        match self {
            Outcome::Subscription { row, created } => Ok((row, created)),
            _ => Err(unexpected("a subscription")),
        }
    }
    pub fn into_source_page(self) -> Result<PageOutcome, CommandError> {
        match self {
            Outcome::SourcePage(p) => Ok(p),
            _ => Err(unexpected("a source page")),
        }
    }
    pub fn into_source(self) -> Result<tidemark_projections::sources::SourceRow, CommandError> {
        match self {
            Outcome::Source(s) => Ok(s),
            _ => Err(unexpected("a source")),
        }
    }
    pub fn into_admission(self) -> Result<Admission, CommandError> {
        match self {
            Outcome::Admission(a) => Ok(a),
            _ => Err(unexpected("an admission")),
        }
    }
    pub fn into_confirmed(self) -> Result<Vec<Result<Cursor, CommandError>>, CommandError> {
        match self {
            Outcome::Confirmed(c) => Ok(c),
            _ => Err(unexpected("confirmations")),
        }
    }
}

/// What a command decided: its answer, the events that record it, and the subjects it read
/// besides those it appends to (each with the seq of its last event as the models have it),
/// which the append's condition names too.
pub(crate) struct Decided {
    pub outcome: Outcome,
    pub events: Vec<NewEvent>,
    pub reads: Vec<(String, String)>,
}

/// Decide `cmd` in `txn` (the models at the head) at `round.now_us`.
pub(crate) fn run(
    txn: &WriteTransaction,
    round: &mut Round<'_>,
    cmd: Command,
) -> Result<Decided, CommandError> {
    let now_us = round.now_us;
    let privacy = round.privacy;
    let plain = |(outcome, events): (Outcome, Vec<NewEvent>)| Decided {
        outcome,
        events,
        reads: Vec::new(),
    };
    match cmd {
        Command::Retention(c) => retention::run(txn, now_us, round.head, c, privacy).map(plain),
        Command::Compact(c) => retention::compact(txn, round, c).map(plain),
        Command::Outbox(c) => outbox::run(txn, round, c).map(plain),
        Command::Cursor(c) => cursors::run(txn, now_us, c).map(plain),
        Command::Bridge(c) => bridges::run(txn, round, c).map(plain),
        Command::Source(c) => sources::run(txn, round, c).map(plain),
        Command::Admit(c) => admission::run(txn, round, c),
    }
}
