//! The decider: the one thread that writes the models store (spec section 3). It follows the
//! log — folds the committed events it has not folded, read through the log's interface, in
//! transactions of the models store that commit without a sync — and decides commands against
//! the models caught up to the head, in rounds:
//!
//! 1. fold to the head (commands decide at the head, never on a lagging model);
//! 2. decide every queued command, in order, in one transaction of the models store that is
//!    only read and then dropped: each command's events, and the condition that the subjects
//!    it decided on (those of the followed streams it appends to, [`subjects`], and those it
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
//! The commands of a round wait for one fsync between them; the models store is synced every
//! [`PERSIST_EVERY`] and at close, never on an acknowledgement path. A failure of the models
//! store never touches the log: the decider answers the waiting commands with it, reopens the
//! store and folds again.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tidemark_log::{
    AppendError, AppendReceipt, Condition, EventChunk, EventLog, NewEvent, Poison, StorageError,
};
use tidemark_projections::Models;
use tidemark_projections::subjects;
use tokio::sync::{mpsc, oneshot};

use crate::Clock;
use crate::commands::{Command, CompactReport, Decided};
use crate::error::{CommandError, RejectKind};
use crate::pages::Pages;
use crate::privacy::Privacy;
use tidemark_projections::ModelsTxn;

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

/// How long the models store may go without a synced commit while it changes.
pub const PERSIST_EVERY: Duration = Duration::from_secs(1);

/// Commands waiting for the decider beyond this are refused with `Overloaded` (I8).
const QUEUE: usize = 65_536;

/// The lowest seq every read model has folded (committed), with a wake-up for readers.
#[derive(Default)]
pub struct Progress {
    seq: Mutex<u64>,
    cv: Condvar,
    /// Readers waiting in [`Progress::wait`].
    waiting: std::sync::atomic::AtomicUsize,
}

impl Progress {
    pub fn get(&self) -> u64 {
        *self.seq.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record that every model has folded through `seq` (never goes back).
    pub fn advance(&self, seq: u64) {
        let mut g = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        if seq > *g {
            *g = seq;
            self.cv.notify_all();
        }
    }

    /// The models went back to `seq` (their store was reopened at its last synced commit).
    pub fn reset(&self, seq: u64) {
        *self.seq.lock().unwrap_or_else(|p| p.into_inner()) = seq;
    }

    /// Wait until the models reach `want` or `until` passes, checking at least every
    /// `recheck` (the caller then reads the models' checkpoints itself); the seq reached.
    /// Readers waiting for the models now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn wait(&self, want: u64, until: Instant, recheck: Duration) -> u64 {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _done = Waiting(&self.waiting);
        let mut g = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        let start = Instant::now();
        while *g < want {
            let now = Instant::now();
            if now >= until || now.duration_since(start) >= recheck {
                break;
            }
            let left = (until - now).min(recheck);
            g = self
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *g
    }
}

/// Counts a reader out of [`Progress::wait`] however it leaves.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

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
    touched: HashSet<Vec<u8>>,
    /// Deliveries the round's earlier accepted batches will add (the outbox bound).
    pub(crate) pending_added: u64,
    /// Other nodes admit to the same outbox (spec section 16): an admission that adds
    /// deliveries also writes `outbox.admitted` on the one subject every node's admissions
    /// write, so it is appended only if no other admission came in since the models it was
    /// judged on (`max_pending` is never exceeded across nodes).
    pub(crate) shared_outbox: bool,
}

fn key(stream: &str, subject: &str) -> Vec<u8> {
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
trait Job: Send {
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
struct Typed<C: Command> {
    cmd: C,
    /// The answer of its last decision.
    answer: Option<C::Answer>,
    /// Taken when answered; a command dropped unanswered while the decider unwinds from a
    /// panic is answered from [`Drop`].
    reply: Option<Reply<C>>,
}

/// Where command `C`'s answer goes.
type Reply<C> = oneshot::Sender<Result<(<C as Command>::Answer, AppendReceipt), CommandError>>;

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
struct Queued {
    job: Box<dyn Job>,
    attempts: u32,
}

impl Queued {
    fn answer(self, r: Result<AppendReceipt, CommandError>) {
        self.job.answer(r);
    }
}

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
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the decider reads from the engine's configuration at each round: the clock and the
/// key of the redacting routes (set before use; tests drive the clock).
#[derive(Clone)]
pub(crate) struct Knobs {
    pub clock: Clock,
    pub privacy: Option<Arc<Privacy>>,
    /// Several nodes share the outbox bound (a cluster): see [`Round::shared_outbox`].
    pub shared_outbox: bool,
}

struct State<L> {
    log: L,
    models: Models,
    progress: Arc<Progress>,
    knobs: Arc<std::sync::RwLock<Knobs>>,
    redecided: Arc<std::sync::atomic::AtomicU64>,
    chunk: EventChunk,
    /// Commands to decide (again) before those still in the channel.
    queue: VecDeque<Queued>,
    /// Folded since the last synced commit.
    dirty: Option<Instant>,
    /// The models store's last failure with its cause (redb answers "previous I/O error"
    /// after one until the store is reopened: commands are told the cause, a full disk say).
    failure: Option<StorageError>,
    /// Where what the decider reads is handed on to the reactors' follower.
    pages: Arc<Pages>,
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
        let st = State {
            log,
            models,
            progress,
            knobs,
            redecided: redecided.clone(),
            chunk: EventChunk::default(),
            queue: VecDeque::new(),
            dirty: None,
            failure: None,
            pages,
        };
        let poisoned = Arc::new(Poison::default());
        let poison = poisoned.clone();
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
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Why the decider panicked, if it has.
    pub fn poisoned(&self) -> Option<&StorageError> {
        self.poisoned.get()
    }

    /// Decide `cmd` and append what it decided; the answer and the log's receipt.
    pub async fn execute<C: Command>(
        &self,
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
static FOLD_DELAY_KNOB: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();

fn poisoned_error(why: &Poison) -> CommandError {
    CommandError::Poisoned(format!(
        "{}; nothing of this command was appended; commands are refused until tidemark is \
         restarted",
        why.get()
            .map_or_else(|| "the decider panicked".to_owned(), ToString::to_string)
    ))
}

impl<L: EventLog + Clone> State<L> {
    fn run(mut self, rx: &mut mpsc::Receiver<Msg>) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "the decider cannot start");
                return;
            }
        };
        let mut heads = self.log.subscribe();
        let mut backoff = Duration::from_millis(10);
        let mut stop: Option<oneshot::Sender<()>> = None;
        loop {
            // Fold to the head.
            match self.fold_to_head() {
                Ok(()) => {
                    self.pages.set_keeping_up(true);
                    backoff = Duration::from_millis(10);
                    // Recovered: a later "previous I/O error" has a cause of its own.
                    self.failure = None;
                }
                Err(e) => {
                    let e = self.models_failed(e, &mut backoff);
                    // The commands that came meanwhile are answered with the failure too (not
                    // left waiting for the store to come back).
                    while let Ok(m) = rx.try_recv() {
                        match m {
                            Msg::Job(j) => j.answer(Err(CommandError::Models(e.clone()))),
                            Msg::Stop(tx) => {
                                stop = Some(tx);
                                break;
                            }
                        }
                    }
                    if stop.is_some() {
                        break;
                    }
                    continue;
                }
            }
            if stop.is_some() {
                break;
            }
            // Take what is queued; with nothing to do, wait for a command, a commit, or the
            // time to sync what was folded.
            while self.queue.len() < ROUND_MAX {
                match rx.try_recv() {
                    Ok(Msg::Job(j)) => self.queue.push_back(j),
                    Ok(Msg::Stop(tx)) => {
                        stop = Some(tx);
                        break;
                    }
                    Err(_) => break,
                }
            }
            if self.queue.is_empty() && stop.is_none() {
                let persist_in = self
                    .dirty
                    .map(|since| PERSIST_EVERY.saturating_sub(since.elapsed()));
                // Wait for a head beyond what was folded, not beyond the head read now: a
                // commit landing between the fold and this read would otherwise be waited
                // past (and its readers left waiting until the next commit).
                let head = self.progress.get();
                let woke = rt.block_on(async {
                    tokio::select! {
                        m = rx.recv() => Some(m),
                        _ = heads.wait_for(|h| *h > head) => None,
                        _ = async {
                            match persist_in {
                                Some(d) => tokio::time::sleep(d).await,
                                None => std::future::pending().await,
                            }
                        } => None,
                    }
                });
                if woke.is_none() && self.log.head() > head {
                    // The commit read now and handed on to the reactors, folded below or
                    // after a few more have gathered. A failed read is the fold's to meet.
                    let _ = self.stage();
                }
                if woke.is_none() && self.log.head() > head && self.progress.waiting() == 0 {
                    // Only commits, and no reader waits for them: let a few more gather
                    // before folding (one models transaction per window, not per commit),
                    // unless a command comes first.
                    let more = rt.block_on(async {
                        tokio::select! {
                            m = rx.recv() => Some(m),
                            _ = tokio::time::sleep(COALESCE) => None,
                        }
                    });
                    match more {
                        Some(Some(Msg::Job(j))) => self.queue.push_back(j),
                        Some(Some(Msg::Stop(tx))) => stop = Some(tx),
                        Some(None) => break,
                        None => {}
                    }
                }
                match woke {
                    Some(Some(Msg::Job(j))) => self.queue.push_back(j),
                    Some(Some(Msg::Stop(tx))) => stop = Some(tx),
                    Some(None) => break,
                    None => {}
                }
                if self.dirty.is_some_and(|d| d.elapsed() >= PERSIST_EVERY) {
                    self.persist();
                }
                continue;
            }
            if !self.queue.is_empty() {
                rt.block_on(self.round());
            }
        }
        // Answer what is left, and sync the models.
        self.refuse_queued(&CommandError::Append(AppendError::Closed));
        rx.close();
        while let Ok(m) = rx.try_recv() {
            match m {
                Msg::Job(j) => j.answer(Err(CommandError::Append(AppendError::Closed))),
                Msg::Stop(tx) => drop(tx.send(())),
            }
        }
        if self.dirty.is_some() {
            self.persist();
        }
        tracing::info!("decider stopped");
        if let Some(tx) = stop {
            let _ = tx.send(());
        }
    }

    fn persist(&mut self) {
        match self.models.persist() {
            Ok(()) => self.dirty = None,
            Err(e) => {
                self.models_failed(e, &mut Duration::from_millis(100));
            }
        }
    }

    /// `e` as the models store's failure: its cause when redb only says a previous I/O error
    /// occurred.
    fn failure(&mut self, e: StorageError) -> StorageError {
        let previous = e.is_previous_io();
        match (&self.failure, previous) {
            (Some(cause), true) => cause.clone(),
            _ => {
                self.failure = Some(e.clone());
                e
            }
        }
    }

    /// Answer every queued command with `e`.
    fn refuse_queued(&mut self, e: &CommandError) {
        for j in self.queue.drain(..) {
            j.answer(Err(e.clone()));
        }
    }

    /// A failure of the models store: the waiting commands are answered with it (the log is
    /// untouched), and the store is reopened after a pause; answers the failure's cause.
    fn models_failed(&mut self, e: StorageError, backoff: &mut Duration) -> StorageError {
        let e = self.failure(e);
        self.pages.set_keeping_up(false);
        tracing::warn!(error = %e, "the models store failed; reopening it (the log is not affected)");
        self.refuse_queued(&CommandError::Models(e.clone()));
        std::thread::sleep(*backoff);
        *backoff = (*backoff * 2).min(Duration::from_secs(1));
        // Reopened, the store is at its last synced commit: the models' progress goes back
        // to it (readers wait for the refold rather than read older state as current).
        match self.models.reopen().and_then(|()| self.models.checkpoint()) {
            Ok(at) => {
                self.progress.reset(at);
                self.dirty = None;
            }
            Err(e) => tracing::warn!(error = %e, "the models store cannot be reopened yet"),
        }
        e
    }

    /// Read the commits past what the chunk holds (at most [`FOLLOW_BATCH`] past the models'
    /// checkpoint) and hand them on to the reactors' follower: each commit is read once, as it
    /// lands, whenever the models fold it. The end of what the chunk holds.
    fn stage(&mut self) -> Result<u64, StorageError> {
        let at = self.progress.get();
        let (after, upto) = self.chunk.range();
        let from = if after == at && upto >= at { upto } else { at };
        let end = self.log.head().min(at.saturating_add(FOLLOW_BATCH));
        if end <= from {
            return Ok(from);
        }
        let mut next = EventChunk::default();
        next.read(&self.log, from, end).map_err(StorageError::of)?;
        if from == at {
            // A new fold: the chunk starts here (its buffers kept).
            self.chunk.reset(at);
        }
        self.chunk.extend(&next);
        if self.pages.wanted() {
            self.pages.publish(Arc::new(next));
        }
        Ok(self.chunk.range().1)
    }

    /// Fold the committed events up to the head, in transactions of [`FOLLOW_BATCH`].
    fn fold_to_head(&mut self) -> Result<(), StorageError> {
        loop {
            let head = self.log.head();
            if self.progress.get() >= head {
                return Ok(());
            }
            let upto = self.stage()?;
            if let Some(ms) = knob("TIDEMARK_FAULT_FOLD_DELAY_MS", &FOLD_DELAY_KNOB) {
                // A test knob (the alert rules' test): the models fold late, and lag.
                std::thread::sleep(Duration::from_millis(ms));
            }
            let started = Instant::now();
            let txn = self.models.begin()?;
            let at = Models::fold(&txn, &self.log, upto, FOLLOW_BATCH, &mut self.chunk)?;
            txn.commit()?;
            self.dirty.get_or_insert_with(Instant::now);
            self.progress.advance(at);
            metrics::histogram!("tidemark_projection_batch_seconds")
                .record(started.elapsed().as_secs_f64());
            metrics::gauge!("tidemark_projection_follower_lag_events")
                .set(self.log.head().saturating_sub(at) as f64);
            if at >= head {
                return Ok(());
            }
        }
    }

    /// Decide the queued commands and append their decisions.
    async fn round(&mut self) {
        if knob("TIDEMARK_FAULT_DECIDER_PANIC", &PANIC_KNOB).is_some() {
            // A test knob (the alert rules' test): the decider panics at its first command.
            panic!("an injected panic (TIDEMARK_FAULT_DECIDER_PANIC)");
        }
        let knobs = self.knobs.read().unwrap_or_else(|p| p.into_inner()).clone();
        let now_us = (knobs.clock)();
        let head = self.progress.get();
        let first_seq = match self.log.first_seq() {
            Ok(f) => f,
            Err(e) => {
                self.refuse_queued(&CommandError::Storage(e));
                return;
            }
        };
        let mut round = Round {
            now_us,
            head,
            privacy: knobs.privacy.as_deref(),
            log: &self.log,
            touched: HashSet::new(),
            pending_added: 0,
            shared_outbox: knobs.shared_outbox,
        };
        let mut later: VecDeque<Queued> = VecDeque::new();
        let mut sends: Vec<(Queued, Vec<NewEvent>, Condition)> = Vec::new();
        let txn = match self.models.begin() {
            Ok(t) => t,
            Err(e) => {
                let e = CommandError::Models(self.failure(e));
                self.refuse_queued(&e);
                return;
            }
        };
        let mut compact = None;
        while let Some(mut q) = self.queue.pop_front() {
            if q.job.is_compaction() {
                // A compaction writes snapshots and drops events: alone, after the round.
                if compact.is_none() && sends.is_empty() {
                    compact = Some(q);
                } else {
                    later.push_back(q);
                }
                continue;
            }
            let Decided { events, reads, .. } = match q.job.decide(&txn, &mut round) {
                Ok(d) => d,
                Err(e) => {
                    q.answer(Err(e));
                    continue;
                }
            };
            if events.is_empty() {
                q.answer(Ok(AppendReceipt {
                    events: Vec::new(),
                    last_seq: head,
                }));
                continue;
            }
            // The subjects the decision rests on: those of the followed streams it appends
            // to, and those it read.
            let mut on: Vec<(String, String)> = events
                .iter()
                .filter(|e| subjects::followed(&e.stream))
                .map(|e| (e.stream.clone(), e.subject.clone()))
                .chain(reads)
                .collect();
            on.sort_unstable();
            on.dedup();
            if on.iter().any(|(s, j)| round.touches(s, j)) {
                later.push_back(q);
                continue;
            }
            let mut condition = Condition::none();
            let mut failed = None;
            for (stream, subject) in &on {
                match txn.last_of(stream, subject, first_seq) {
                    Ok(last) => condition = condition.and_subject(stream, subject, last),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
                round.touched.insert(key(stream, subject));
            }
            if let Some(e) = failed {
                q.answer(Err(CommandError::Models(e)));
                continue;
            }
            sends.push((q, events, condition));
        }
        if let Some(q) = compact {
            drop(txn);
            self.compact(q).await;
        } else {
            drop(txn);
        }
        // Every decision to the log at once: one group commit.
        let log = &self.log;
        let answers = futures::future::join_all(
            sends
                .iter_mut()
                .map(|(_, events, cond)| log.append_if(std::mem::take(events), cond.clone())),
        )
        .await;
        // Answered as soon as the log has: the models fold what the round appended on their own
        // cadence (the main loop folds to the head before the next round), never on a
        // command's acknowledgement path. Clients read their writes all the same: a read
        // waits for the models to reach the head as of the request (section 3).
        for ((mut q, _, _), answer) in sends.into_iter().zip(answers) {
            match answer {
                Ok(receipt) => q.answer(Ok(receipt)),
                Err(AppendError::ExpectationFailed { .. }) => {
                    q.attempts += 1;
                    self.redecided
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    metrics::counter!("tidemark_commands_redecided_total").increment(1);
                    if q.attempts >= MAX_ATTEMPTS {
                        q.answer(Err(CommandError::rejected(
                            RejectKind::Conflict,
                            "contended",
                            format!(
                                "what this command acts on kept changing while it was decided \
                                 ({MAX_ATTEMPTS} attempts); try again"
                            ),
                        )));
                    } else {
                        later.push_front(q);
                    }
                }
                Err(e) => q.answer(Err(CommandError::Append(e))),
            }
        }
        self.queue = later;
    }

    /// A compaction: snapshots at the head committed (and synced) in the models store first,
    /// then the log drops the events up to the cut, and the report is completed from the
    /// log's answer.
    async fn compact(&mut self, mut q: Queued) {
        let r = self.compaction(q.job.as_mut()).await;
        q.answer(r);
    }

    async fn compaction(&mut self, job: &mut dyn Job) -> Result<AppendReceipt, CommandError> {
        let knobs = self.knobs.read().unwrap_or_else(|p| p.into_inner()).clone();
        let txn = self.models.begin().map_err(CommandError::Models)?;
        let mut round = Round {
            now_us: (knobs.clock)(),
            head: self.progress.get(),
            privacy: knobs.privacy.as_deref(),
            log: &self.log,
            touched: HashSet::new(),
            pending_added: 0,
            shared_outbox: knobs.shared_outbox,
        };
        job.decide(&txn, &mut round)?;
        txn.commit().map_err(CommandError::Models)?;
        self.models.persist().map_err(CommandError::Models)?;
        let Some(rep) = job.compaction_report() else {
            return Err(CommandError::Models(StorageError::msg(
                "a compaction answered no report",
            )));
        };
        if rep.cut >= rep.first_seq {
            let c = self.log.compact(rep.cut).await?;
            rep.removed = c.removed;
            rep.first_seq = c.first_seq;
            rep.more = c.more;
        }
        Ok(AppendReceipt {
            events: Vec::new(),
            last_seq: self.log.head(),
        })
    }
}
