//! The engine of tidemark: the one boundary between the HTTP API and reactors above and the
//! log and read models below. Data flows one way: commands → log → followers → queries.
//!
//! - [`Engine::execute`] runs a typed [`Command`] (one module per family in [`commands`])
//!   inside the log writer's transaction and answers its [`Outcome`].
//! - [`Engine::log`] is the log behind its narrow interface ([`EventLog`]: append, conditional
//!   append, read, get, head, commit notification); nothing of storage crosses it.
//! - [`Engine::read`] is the one reader of the read models ([`Queries`]).
//! - The clock enters here ([`Clock`]): commands take `now` from it inside the writer, so a
//!   test can drive due times and lease expiry.
//!
//! # Public surface
//! `Engine` (open, execute, log, read, rebuild, now_us, queued, is_poisoned, close), `Command`
//! and its families, `Outcome`, `Queries`, `Clock`.

#![forbid(unsafe_code)]

pub mod commands;
mod follow;
mod queries;

use std::sync::Arc;

use tidemark_log::{
    AppendReceipt, CommandError, EventLog, Log, LogConfig, NewEvent, OpenError, OpenReport,
    RejectKind, StorageError,
};
use tidemark_projections::names::EventType;
use tidemark_projections::rebuild::RebuildReport;

pub use commands::{Command, Outcome};

/// How long a command refused for pending work (`RejectKind::Overloaded`, e.g. `outbox_full`)
/// asks its caller to wait before trying again: pending work drains over seconds. The HTTP
/// answer's `Retry-After` and a source poll's backoff both use it.
pub const OVERLOADED_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);
pub use follow::FOLLOW_BATCH;
pub use queries::{LAG_CAP, Lag, Queries, QueryError, READ_WAIT};

/// The redb items the commands use inside the writer's transaction; nothing of it is public.
mod store {
    pub(crate) use redb::{ReadableTable, WriteTransaction};
}

/// Where commands read the time (microseconds since the epoch).
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The wall clock.
pub fn wall_clock() -> Clock {
    Arc::new(tidemark_log::time::now_micros)
}

/// Handle to an open engine. Cheap to clone; all clones share one log writer and one
/// projection follower (stopped when the last clone is dropped, or by [`Engine::close`]).
#[derive(Clone)]
pub struct Engine {
    log: Log,
    clock: Clock,
    queries: Queries,
    follower: Arc<follow::Follower>,
}

/// Catch every read model up to `head` inside the writer's transaction: what a command does
/// before it decides (spec section 3: against state current at the head, never a lagging
/// follower).
fn at_head(txn: &redb::WriteTransaction, head: u64) -> Result<(), CommandError> {
    tidemark_projections::framework::catch_up(txn, &tidemark_projections::all(), head, u64::MAX)
        .map(drop)
        .map_err(CommandError::Storage)
}

impl Engine {
    /// Open (or create) the log; the projections are caught up with it, then follow it in a
    /// thread of their own (blocking: call from a blocking context in async code).
    pub fn open(cfg: &LogConfig) -> Result<(Engine, OpenReport), OpenError> {
        let (log, report) = Log::open_with(cfg, vec![tidemark_projections::following_projector()])?;
        let progress = Arc::new(follow::Progress::default());
        progress.advance(
            tidemark_projections::framework::checkpoint(&log.db(), &tidemark_projections::all())
                .map_err(OpenError::Storage)?,
        );
        let follower = follow::Follower::spawn(log.clone(), progress.clone()).map_err(|e| {
            OpenError::Storage(StorageError::new("cannot start the projection follower", e))
        })?;
        Ok((
            Engine {
                queries: Queries::new(log.clone(), progress),
                log,
                clock: wall_clock(),
                follower: Arc::new(follower),
            },
            report,
        ))
    }

    /// The same engine reading time from `clock` (tests drive due times with it).
    pub fn with_clock(mut self, clock: Clock) -> Engine {
        self.clock = clock;
        self
    }

    /// The log through its narrow interface.
    pub fn log(&self) -> &(impl EventLog + Clone + use<>) {
        &self.log
    }

    /// The highest committed seq (the log's head).
    pub fn head(&self) -> u64 {
        self.log.head()
    }

    /// The read models.
    pub fn read(&self) -> &Queries {
        &self.queries
    }

    /// The engine's clock now.
    pub fn now_us(&self) -> i64 {
        (self.clock)()
    }

    /// Execute `cmd`: inside the writer's transaction it catches the read models up to the
    /// head (every event before it, those of its own group included), decides, and its events
    /// are appended in the same durable commit. A refusal (`CommandError::Rejected`) appends
    /// nothing.
    pub async fn execute(
        &self,
        cmd: impl Into<Command>,
    ) -> Result<(Outcome, AppendReceipt), CommandError> {
        let cmd = cmd.into();
        let name = cmd.name();
        let clock = self.clock.clone();
        let r = self
            .log
            .command(true, move |txn, head| {
                at_head(txn, head)?;
                commands::run(txn, clock(), cmd)
            })
            .await;
        let result = match &r {
            Ok(_) => "ok",
            Err(CommandError::Rejected { .. }) => "refused",
            Err(_) => "error",
        };
        metrics::counter!("tidemark_commands_total", "command" => name, "result" => result)
            .increment(1);
        r
    }

    /// Append a client's batch (atomic, idempotent). Backpressure (spec section 4, I8): when
    /// the batch requests a notification and more than `max_pending` deliveries are pending,
    /// it is refused (`Rejected` / `Overloaded`, code `outbox_full`) and nothing is appended;
    /// lifecycle events are never refused for it. The check is a command: it counts the
    /// pending deliveries at the head, in the transaction that appends the batch.
    pub async fn append_from_client(
        &self,
        events: Vec<NewEvent>,
        max_pending: u64,
    ) -> Result<AppendReceipt, CommandError> {
        if !events
            .iter()
            .any(|e| e.event_type == EventType::NotificationRequested)
        {
            return Ok(self.log.append(events).await?);
        }
        let (_, receipt) = self
            .log
            .command(true, move |txn, head| {
                at_head(txn, head)?;
                let pending = tidemark_projections::deliveries::pending_in(txn)
                    .map_err(CommandError::Storage)?;
                if pending > max_pending {
                    metrics::counter!("tidemark_outbox_refused_total").increment(1);
                    return Err(CommandError::rejected(
                        RejectKind::Overloaded,
                        "outbox_full",
                        format!(
                            "{pending} deliveries are pending, above outbox.max_pending \
                             ({max_pending}); retry later"
                        ),
                    ));
                }
                Ok(((), events))
            })
            .await?;
        Ok(receipt)
    }

    /// Rebuild (`swap`) or verify projection `name` from the log; `None` when there is no such
    /// projection. `progress(done, head)` is called between chunks.
    pub async fn rebuild(
        &self,
        name: &str,
        swap: bool,
        progress: impl Fn(u64, u64),
    ) -> Option<Result<RebuildReport, CommandError>> {
        let p = tidemark_projections::by_name(name)?;
        Some(tidemark_projections::rebuild::rebuild(&self.log, p, swap, progress).await)
    }

    /// Requests waiting for the log writer.
    pub fn queued(&self) -> usize {
        self.log.queued()
    }

    /// `Err(InsufficientStorage)` while the log's disk is short of space (checked now).
    pub fn check_space(&self) -> Result<(), tidemark_log::AppendError> {
        self.log.check_space()
    }

    /// Whether a storage failure has stopped appends.
    pub fn is_poisoned(&self) -> bool {
        self.log.is_poisoned()
    }

    /// Stop the projection follower, then the writer after the requests already queued, and
    /// wait for both.
    pub async fn close(&self) {
        let follower = self.follower.clone();
        let _ = tokio::task::spawn_blocking(move || follower.stop()).await;
        self.log.close().await
    }
}
