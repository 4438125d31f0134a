//! The decider: the one thread that writes the models store (spec section 3). It follows the
//! log — folds the committed events it has not folded, read through the log's interface, in
//! transactions of the models store that commit without a sync — and decides commands against
//! the models caught up to the head, in rounds:
//!
//! 1. fold to the head (commands decide at the head, never on a lagging model);
//! 2. decide every queued command, in order, in one transaction of the models store that is
//!    only read and then dropped: each command's events, and the condition that the subjects
//!    it decided on (those of the followed streams it appends to, `tidemark_projections::subjects`, and those it
//!    names as read) still have the last seq the models have;
//! 3. send every decision to the log as a conditional append, all at once so the log's writer
//!    takes them into one group commit, and answer each caller with the log's answer.
//!
//! Within a round a command that touches a subject an earlier command of the round appends to
//! is left to the next round (a claim simply skips such deliveries), so the decisions of one
//! round never depend on each other. A decision whose condition fails — something else
//! appended to its subject meanwhile: another decider over the same log — is decided again in
//! the next round against the newer models, at most [`MAX_ATTEMPTS`] times, then refused as
//! `contended`. The log refuses a stale decision; luck does not (I7).
//!
//! The commands of a round wait for one fsync between them; the models store's transaction
//! stays open across rounds and is committed after the replies, batched ([`COMMIT_EVERY`], or
//! at once for a reader waiting for it: see `run`), and synced every [`PERSIST_EVERY`] and at
//! close, never on an acknowledgement path. A failure of the models
//! store never touches the log: the decider answers the waiting commands with it, reopens the
//! store and folds again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidemark_log::{AppendError, AppendReceipt, EventChunk, EventLog, Poison, StorageError};
use tidemark_projections::Models;
use tokio::sync::{mpsc, oneshot};

use crate::Clock;
use crate::commands::Command;
use crate::error::CommandError;
use crate::pages::Pages;
use crate::privacy::Privacy;

use round::{Queued, Typed};
use run::State;

/// Events one fold transaction takes at most (a rebuild's chunk waits for it, and it for a
/// rebuild's chunk).
pub const FOLLOW_BATCH: u64 = 4_096;

/// Commands one round decides at most.
const ROUND_MAX: usize = 4_096;

/// Decisions of one command refused by the log's condition before it is answered `contended`.
pub const MAX_ATTEMPTS: u32 = 16;

/// How long the decider lets commits gather before it folds them when no command and no
/// reader waits (a reader or a command is served at once).
pub const COALESCE: Duration = Duration::from_millis(5);

/// How long what the decider folded may wait for a commit of the models store while rounds
/// go on (a reader that waits for it has it committed at once).
pub const COMMIT_EVERY: Duration = Duration::from_millis(20);

/// How long the models store may go without a synced commit while it changes.
pub const PERSIST_EVERY: Duration = Duration::from_secs(1);

/// Commands waiting for the decider beyond this are refused with `Overloaded` (I8).
const QUEUE: usize = 65_536;

mod progress;
mod round;
mod run;
mod writer;

pub use progress::Progress;

enum Msg {
    Job(Queued),
    Stop(oneshot::Sender<()>),
}

/// The decider thread's handle.
pub(crate) struct Decider {
    tx: mpsc::Sender<Msg>,
    redecided: Arc<std::sync::atomic::AtomicU64>,
    /// Why the decider panicked, once it has (spec I10: a panicking writer poisons what it
    /// was writing, the models store; the log goes on).
    poisoned: Arc<Poison>,
    /// Woken once, when the decider is poisoned.
    poisoned_now: Arc<tokio::sync::Notify>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the decider reads from the engine's configuration at each round: the clock and the
/// key of the redacting routes (set before use; tests drive the clock).
#[derive(Clone)]
pub(crate) struct Knobs {
    pub clock: Clock,
    pub privacy: Option<Arc<Privacy>>,
    /// Several nodes share the outbox bound (a cluster): see [`crate::commands::Round`]`::shared_outbox`.
    pub shared_outbox: bool,
    /// The routes' paces (section 4), kept across rounds.
    pub pacer: Arc<crate::commands::outbox::Pacer>,
}

impl Decider {
    pub fn spawn<L: EventLog + Clone>(
        log: L,
        models: Models,
        progress: Arc<Progress>,
        knobs: Arc<std::sync::RwLock<Knobs>>,
        pages: Arc<Pages>,
    ) -> std::io::Result<Decider> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let redecided = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // The models' checkpoint: what is committed is what is folded at the start.
        let folded = progress.get();
        let st = State {
            log,
            models: models.clone(),
            progress: progress.clone(),
            knobs,
            redecided: redecided.clone(),
            chunk: EventChunk::default(),
            queue: VecDeque::new(),
            failure: None,
            pages,
            txn: None,
            since: None,
            folded,
            writer: writer::Writer::spawn(models.clone(), progress.clone())?,
            epoch: 0,
            unhealthy: false,
        };
        let poisoned = Arc::new(Poison::default());
        let poison = poisoned.clone();
        let poisoned_now = Arc::new(tokio::sync::Notify::new());
        let tell = poisoned_now.clone();
        let thread = std::thread::Builder::new()
            .name("tidemark-decider".into())
            .spawn(move || {
                let mut rx = rx;
                // However the decider ends (stopped, panicked), the reactors' follower waits
                // for the log's head itself from then on.
                struct Stopped(Arc<Pages>);
                impl Drop for Stopped {
                    fn drop(&mut self) {
                        self.0.set_keeping_up(false);
                    }
                }
                let _stopped = Stopped(st.pages.clone());
                let ran =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| st.run(&mut rx)));
                if let Err(panic) = ran {
                    let why = Poison::panicked("the decider", panic.as_ref());
                    tracing::error!(
                        error = %why,
                        "the decider panicked: commands are refused until tidemark is restarted \
                         (the log is not affected; the models rebuild from it if they must)"
                    );
                    let _ = poison.set(why);
                    // The follower reads the log itself from now on, not only once the
                    // thread ends (a poisoned node keeps serving; its reactors go on).
                    drop(_stopped);
                    tell.notify_waiters();
                    // The commands that were in its hands were dropped with it (their callers
                    // see the poison); those still coming are answered with it.
                    while let Some(m) = rx.blocking_recv() {
                        match m {
                            Msg::Job(j) => j.answer(Err(poisoned_error(&poison))),
                            Msg::Stop(tx) => {
                                let _ = tx.send(());
                                break;
                            }
                        }
                    }
                }
            })?;
        Ok(Decider {
            tx,
            redecided,
            poisoned,
            poisoned_now,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Why the decider panicked, if it has.
    pub fn poisoned(&self) -> Option<&StorageError> {
        self.poisoned.get()
    }

    /// Why the decider panicked, once it has (at once if it has already).
    pub async fn poisoned_wait(&self) -> StorageError {
        loop {
            // Created before the look, so a poisoning between the two still wakes it.
            let woken = self.poisoned_now.notified();
            if let Some(why) = self.poisoned.get() {
                return why.clone();
            }
            woken.await;
        }
    }

    /// Decide `cmd` for `tenant` (`None`: the default tenant) and append what it decided;
    /// the answer and the log's receipt.
    pub async fn execute<C: Command>(
        &self,
        tenant: Option<Arc<str>>,
        cmd: C,
    ) -> Result<(C::Answer, AppendReceipt), CommandError> {
        let (reply, rx) = oneshot::channel();
        let job = Queued {
            job: Box::new(Typed {
                cmd,
                answer: None,
                reply: Some(reply),
            }),
            attempts: 0,
            tenant,
        };
        match self.tx.try_send(Msg::Job(job)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(CommandError::Append(AppendError::Overloaded {
                    queued: QUEUE,
                }));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err(self.closed());
            }
        }
        // A stopping decider answers every command it holds (`Closed`); one dropped unanswered
        // was in its hands when it panicked.
        rx.await.map_err(|_| poisoned_error(&self.poisoned))?
    }

    /// Why the queue is closed to a command: the decider panicked, or it stopped.
    fn closed(&self) -> CommandError {
        if self.poisoned.is_set() {
            poisoned_error(&self.poisoned)
        } else {
            CommandError::Append(AppendError::Closed)
        }
    }

    /// Decisions the log refused for a failed condition (each decided again) so far.
    pub fn redecided(&self) -> u64 {
        self.redecided.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Commands waiting for the decider.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Stop after the round in hand (the models synced), and wait for the thread.
    pub async fn stop(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Stop(tx)).await.is_ok() {
            let _ = rx.await;
        }
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// A `TIDEMARK_FAULT_*` test knob, read once: the alert rules' test injects faults no test can
/// cause for real (a panicking decider, a late fold).
fn knob(name: &str, cell: &'static std::sync::OnceLock<Option<u64>>) -> Option<u64> {
    *cell.get_or_init(|| std::env::var(name).ok().and_then(|v| v.parse().ok()))
}
static PANIC_KNOB: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
/// `TIDEMARK_FAULT_DECIDER_PANIC_WHEN=<path>`: the decider panics at its first round after a
/// file is at `path` (the operational notifications' test poisons a node that has run).
static PANIC_WHEN_KNOB: std::sync::OnceLock<Option<std::path::PathBuf>> =
    std::sync::OnceLock::new();

/// Whether the file `TIDEMARK_FAULT_DECIDER_PANIC_WHEN` names is there (never when unset).
fn panic_when() -> bool {
    PANIC_WHEN_KNOB
        .get_or_init(|| std::env::var_os("TIDEMARK_FAULT_DECIDER_PANIC_WHEN").map(Into::into))
        .as_ref()
        .is_some_and(|p| p.exists())
}
static WRITER_PANIC_KNOB: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
static FOLD_DELAY_KNOB: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();

fn poisoned_error(why: &Poison) -> CommandError {
    CommandError::Poisoned(format!(
        "{}; nothing of this command was appended; commands are refused until tidemark is \
         restarted",
        why.get()
            .map_or_else(|| "the decider panicked".to_owned(), ToString::to_string)
    ))
}
