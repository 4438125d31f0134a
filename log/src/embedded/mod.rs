//! The embedded backend of the log: a journal and one redb file in the data directory.
//!
//! Every fact is an [`Event`] appended under a global, dense `seq` (I1), idempotent by
//! `event_id` (I2). Appends are group-committed by the appenders themselves (`commit`): the
//! one that finds the log idle leads the group on its own thread — one journal record, one
//! `fdatasync`, then it answers the group — and no caller is answered before its group is
//! durable. redb (events by seq, the id and posting indexes) is written after the reply by the
//! indexer thread (`indexer`).
//!
//! - `codec`: the stored byte format, versioned.
//! - `commit`: the group commit and its leader; `condition`: conditions of conditional
//!   appends, judged by the leader.
//! - `journal`: the group's durable point (two segments), replayed at open.
//! - `indexer`: redb, after the reply: events, index merges, checkpoints, compaction;
//!   `reopen`: its reopen after a full disk.
//! - `tail`: in-memory index of the newest events, merged into redb in large batches.
//! - `recent`: the newest committed groups as stored, read by the followers at the head, and
//!   every group redb does not hold yet.
//! - `ids`: the `event_id` index.
//! - `store`: table definitions, open/recovery, bounded reads.
//! - [`compact`]: log compaction; [`storage`]: the byte stores under the log; [`fault`]: the
//!   fault-injecting store tests run it on.
//!
//! # Durability and visibility
//! Durable first, visible second, indexed third. An append's reply means its group's record
//! in the journal was synced: it survives `kill -9` and power loss. Only then is the group put
//! into the in-memory tail and `recent` and its head published, so nothing is visible before
//! it is durable. redb is written later without a sync; a checkpoint (a durable redb commit)
//! covers what was indexed, and the journal reuses a segment only once a checkpoint covers it.
//! At open, the journal's events past redb's durable head are put back. A read at the head is
//! served the same stored bytes from memory until redb holds them.

mod chunk;
mod codec;
mod commit;
pub mod compact;
mod condition;
mod config;
pub mod fault;
mod ids;
mod indexer;
mod journal;
mod postings;
mod recent;
mod reopen;
mod space;
pub mod storage;

pub(crate) mod store;
mod tail;

pub use config::LogConfig;
pub(crate) use space::Space;
pub use space::{SpaceLevel, SpaceState};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use redb::Database;
use tokio::sync::{oneshot, watch};

use crate::envelope::scoped;
use crate::{
    AppendError, AppendReceipt, Condition, Event, NewEvent, OpenError, ReadError, ReadPage,
    ReadQuery, StorageError,
};
use crate::{Compacted, EventChunk, EventLog, Lookups};

/// Memory holds at most about this many bytes of groups redb does not have yet; an appender
/// waits for the indexer beyond it (I9).
pub(crate) const MAX_LAG_BYTES: usize = 4 << 20;
/// The same bound while the indexer merges the tail (one durable commit of the frozen part's
/// ids and postings, about 0.1-0.3 s per 100,000 events on this project's test machine): the
/// groups that arrive meanwhile wait in memory, not the appenders (issue 39: merges never
/// block appends). Still a bound: at 100,000 events/s of 600 bytes a 0.3 s merge holds 18 MB.
pub(crate) const MERGE_LAG_BYTES: usize = 64 << 20;
/// The longest an appender waits for the indexer.
const LAG_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) struct Shared {
    pub tail: RwLock<tail::Tail>,
    /// The runs of the `event_id` index (replaced after a merge commits, before the tail
    /// forgets what it merged).
    pub ids: RwLock<ids::Runs>,
    /// Published head: every event with seq <= head is durable, in the tail and in `recent`
    /// or redb.
    pub head: watch::Sender<u64>,
    pub poisoned: crate::Poison,
    /// The open redb database. Replaced when the indexer reopens it in process: a full disk
    /// failed a redb write, and redb refuses every call after an I/O error (I10).
    pub db: RwLock<Arc<Database>>,
    /// A full disk failed a redb write (or the journal's preallocation at start); appends are
    /// refused until the indexer has reopened the log, which it does once space returns.
    pub full: AtomicBool,
    /// The newest committed groups as stored, read by the followers at the head, and every
    /// group redb does not hold yet.
    pub recent: RwLock<recent::Recent>,
    pub space: Space,
    /// What the last failed call on the redb file met.
    pub cause: Arc<storage::Cause>,
    /// Appenders waiting for a group, and whether one leads.
    pub queue: Mutex<commit::Queue>,
    /// What the leader of a group works on.
    pub core: Mutex<commit::Core>,
    pub queue_capacity: usize,
    pub max_group_events: usize,
    /// The head as the indexer sees it (the published head).
    pub published: AtomicU64,
    /// redb's events table holds every event up to here.
    pub indexed: AtomicU64,
    /// A durable redb commit covers every event up to here.
    pub checkpointed: AtomicU64,
    /// The journal asks for a checkpoint through this seq before it reuses a segment.
    pub wanted: AtomicU64,
    /// The indexer sleeps with nothing to do: the next commit wakes it.
    pub indexer_idle: AtomicBool,
    /// The indexer leaves new groups to memory (a test knob: [`Log::pause_indexer`]).
    pub paused: AtomicBool,
    /// The indexer thread has ended (stopped, or panicked).
    pub indexer_stopped: AtomicBool,
    /// The indexer is merging the tail, or writing what arrived meanwhile (appenders may run
    /// up to [`MERGE_LAG_BYTES`] ahead of it).
    pub merging: AtomicBool,
    pub inbox: Mutex<indexer::Inbox>,
    pub inbox_cv: Condvar,
    /// Appenders waiting for the indexer (memory over [`MAX_LAG_BYTES`]).
    pub lag: (Mutex<usize>, Condvar),
}

impl Shared {
    pub(crate) fn poison(&self, why: StorageError) {
        self.poisoned.set(why);
        // Nobody waits for the indexer on a poisoned log.
        self.indexer_caught_up();
    }

    pub(crate) fn poisoned(&self) -> Option<StorageError> {
        self.poisoned.get().cloned()
    }

    /// A failed redb or journal call stops appends: one that met a full disk (ENOSPC) only
    /// until space returns and the indexer reopens the log in process (redb itself refuses
    /// every call after an I/O error, and goes back to its last durable commit when reopened,
    /// the journal holding every group since); any other until a restart.
    pub(crate) fn stop(&self, why: StorageError) {
        // A `PreviousIo` after an earlier call met a full disk counts as full too.
        if why.is_storage_full() || self.cause.full() {
            if !self.full.swap(true, Ordering::SeqCst) {
                tracing::error!(error = %why, "the disk is full; appends are refused until space returns");
            }
            self.space.record(
                SpaceLevel::Reserve,
                self.space.storage.available(&self.space.path).unwrap_or(0),
            );
            self.wake_indexer();
        } else {
            tracing::error!(error = %why, "log poisoned; appends are refused until restart");
            self.poison(why);
        }
    }

    /// The error for a request the log will never answer: `Poisoned` after a failure or a
    /// panic, else `Closed`.
    fn gone(&self) -> AppendError {
        match self.poisoned() {
            Some(why) => AppendError::Poisoned(why),
            None => AppendError::Closed,
        }
    }

    pub(crate) fn db(&self) -> Arc<Database> {
        self.db.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The newest groups after `after`, if memory still holds every event past it.
    pub(crate) fn recent_since(&self, after: u64) -> Option<recent::Since> {
        self.recent
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .since(after)
    }

    /// A durable group's records, kept for readers and the indexer, then its head published.
    pub(crate) fn publish(&self, records: Vec<(u64, Vec<u8>)>, head: u64) {
        self.recent
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(records, self.indexed.load(Ordering::SeqCst));
        self.published.store(head, Ordering::SeqCst);
        self.head.send_replace(head);
        if self.indexer_idle.swap(false, Ordering::SeqCst) {
            self.wake_indexer();
        }
    }

    fn wake_indexer(&self) {
        let _inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        self.inbox_cv.notify_one();
    }

    /// Ask the indexer for a durable checkpoint through `seq`.
    pub(crate) fn want_checkpoint(&self, seq: u64) {
        if self.wanted.fetch_max(seq, Ordering::SeqCst) < seq {
            self.indexer_idle.store(false, Ordering::SeqCst);
            self.wake_indexer();
        }
    }

    /// Wait while memory holds more than [`MAX_LAG_BYTES`] of groups redb does not have
    /// ([`MERGE_LAG_BYTES`] during a merge; bounded: at most [`LAG_WAIT`], and never for an
    /// indexer that is paused, stopped, or has nothing left to write).
    pub(crate) fn wait_for_indexer(&self) {
        let over = || {
            let bound = if self.merging.load(Ordering::SeqCst) {
                MERGE_LAG_BYTES
            } else {
                MAX_LAG_BYTES
            };
            self.published.load(Ordering::SeqCst) > self.indexed.load(Ordering::SeqCst)
                && self.recent_bytes() > bound
                && self.poisoned().is_none()
                && !self.full.load(Ordering::SeqCst)
                && !self.paused.load(Ordering::SeqCst)
                && !self.indexer_stopped.load(Ordering::SeqCst)
        };
        if !over() {
            return;
        }
        let started = std::time::Instant::now();
        let (lock, cv) = &self.lag;
        let mut waiting = lock.lock().unwrap_or_else(|p| p.into_inner());
        *waiting += 1;
        while over() && started.elapsed() < LAG_WAIT {
            waiting = cv
                .wait_timeout(waiting, std::time::Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *waiting -= 1;
        metrics::histogram!("tidemark_log_lag_wait_seconds")
            .record(started.elapsed().as_secs_f64());
    }

    /// Bytes of the groups memory holds (every group redb does not have yet, and the newest
    /// few it has, kept for readers at the head: at most `recent::MAX_BYTES` of those).
    pub(crate) fn recent_bytes(&self) -> usize {
        self.recent
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .bytes()
    }

    /// The indexer moved on: wake appenders waiting for it, if any.
    pub(crate) fn indexer_caught_up(&self) {
        let (lock, cv) = &self.lag;
        if *lock.lock().unwrap_or_else(|p| p.into_inner()) > 0 {
            cv.notify_all();
        }
    }

    /// Whether the stored event `seq` has `ev`'s content (its bytes from memory or redb).
    pub(crate) fn same_as_stored(&self, seq: u64, ev: &NewEvent) -> Result<bool, StorageError> {
        use redb::ReadableDatabase;
        if let Some(recent) = self.recent_since(seq.saturating_sub(1))
            && let Some(orig) = recent.get(seq).map_err(StorageError::of)?
        {
            return Ok(ev.same_content(&orig));
        }
        // Not in memory: redb holds it (a group leaves memory only once redb has it).
        let db = self.db();
        let txn = db.begin_read().map_err(crate::error::storage)?;
        let events = txn
            .open_table(store::EVENTS)
            .map_err(crate::error::storage)?;
        match events.get(seq).map_err(crate::error::storage)? {
            Some(v) => {
                let orig = store::decode_event(seq, v.value()).map_err(StorageError::of)?;
                Ok(ev.same_content(&orig))
            }
            // Compacted (spec section 13): the id is still known, its content is not; a resend
            // is answered as the duplicate it most likely is.
            None if seq < compact::first_seq_of(&txn)? => Ok(true),
            None => Err(format!("indexed event {seq} is missing").into()),
        }
    }
}

/// The storage error that a panic of `who` poisons the log with (logged once here).
fn panicked(who: &str, p: &(dyn std::any::Any + Send)) -> StorageError {
    let why = crate::Poison::panicked(who, p);
    tracing::error!(error = %why, "log poisoned; appends are refused until restart");
    why
}

/// Stops the indexer once every handle of the log is gone.
struct Handles(Arc<Shared>);

impl Drop for Handles {
    fn drop(&mut self) {
        self.0
            .inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .dropped = true;
        self.0.inbox_cv.notify_one();
    }
}

/// Handle to an open log. Cheap to clone; all clones share one log.
#[derive(Clone)]
pub struct Log {
    shared: Arc<Shared>,
    indexer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
    _handles: Arc<Handles>,
}

/// What `open` did, for the operator.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenReport {
    pub head: u64,
    /// Events put back from the journal (groups acknowledged after the last checkpoint).
    pub replayed: u64,
    pub repaired: bool,
    pub tail_events: usize,
}

impl Log {
    /// Open (or create) the log and start its indexer thread.
    pub fn open(cfg: &LogConfig) -> Result<(Log, OpenReport), OpenError> {
        let stores = cfg.storage.open(&cfg.path)?;
        let opened = store::open(cfg, &stores)?;
        let report = OpenReport {
            replayed: opened.replayed,
            head: opened.head,
            repaired: opened.repaired,
            tail_events: opened.tail.total(),
        };
        let db = Arc::new(opened.db);
        // A disk too full for the journal at start: the log opens read-only (appends refused
        // with `InsufficientStorage`) and the indexer reopens it once space returns (I10).
        let short_of_space = opened.journal.short_of_space();
        let (head_tx, _) = watch::channel(opened.head);
        let space = Space::new(cfg.storage.clone(), cfg.path.clone(), cfg.min_free);
        if short_of_space {
            space.record(SpaceLevel::Reserve, 0);
        }
        let shared = Arc::new(Shared {
            tail: RwLock::new(opened.tail),
            ids: RwLock::new(opened.runs),
            head: head_tx,
            poisoned: crate::Poison::default(),
            db: RwLock::new(db.clone()),
            full: AtomicBool::new(short_of_space),
            recent: RwLock::default(),
            space,
            cause: stores.cause.clone(),
            queue: Mutex::default(),
            core: Mutex::new(commit::Core {
                head: opened.head,
                last_time_us: opened.last_time_us,
                journal: opened.journal,
            }),
            queue_capacity: cfg.queue_capacity.max(1),
            max_group_events: cfg.max_group_events.max(1),
            published: AtomicU64::new(opened.head),
            indexed: AtomicU64::new(opened.head),
            checkpointed: AtomicU64::new(opened.head),
            wanted: AtomicU64::new(0),
            indexer_idle: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            indexer_stopped: AtomicBool::new(false),
            merging: AtomicBool::new(false),
            inbox: Mutex::default(),
            inbox_cv: Condvar::new(),
            lag: (Mutex::new(0), Condvar::new()),
        });
        let ix = indexer::Indexer {
            shared: shared.clone(),
            db,
            merge_threshold: cfg.merge_threshold.max(1),
            quick_repair: cfg.quick_repair,
            cfg: cfg.clone(),
            stores,
            last_checkpoint: std::time::Instant::now(),
            compacting: true,
        };
        let watched = shared.clone();
        let handle = std::thread::Builder::new()
            .name("tidemark-log-indexer".into())
            .spawn(move || {
                // A panic in the indexer (or under it) poisons the log: every later append is
                // refused as `Poisoned`, never answered `Closed` as if the log had been shut
                // down on purpose (I10).
                let run = std::panic::AssertUnwindSafe(move || ix.run());
                if let Err(p) = std::panic::catch_unwind(run) {
                    watched.poison(panicked("the log indexer", &*p));
                    // Nobody is left to answer the jobs: answer them, and the later ones too.
                    indexer::stopped(&watched);
                }
            })
            .map_err(|e| {
                OpenError::Storage(StorageError::new("cannot start the indexer thread", e))
            })?;
        tracing::info!(
            head = report.head,
            repaired = report.repaired,
            tail = report.tail_events,
            path = %cfg.path.display(),
            "log opened"
        );
        Ok((
            Log {
                _handles: Arc::new(Handles(shared.clone())),
                shared,
                indexer: Arc::new(Mutex::new(Some(handle))),
            },
            report,
        ))
    }

    /// Keep this log as a replica of another one (the JetStream backend's local copy of its
    /// stream): append `events` (each with its `event_id`) at exactly `first_seq..`, recorded
    /// at `at_us`, the source's time. Anything else — a gap, an id already here — is an error:
    /// the replica no longer matches its source.
    pub async fn replicate(
        &self,
        events: Vec<NewEvent>,
        first_seq: u64,
        at_us: i64,
    ) -> Result<AppendReceipt, AppendError> {
        let n = events.len() as u64;
        if n == 0 || events.iter().any(|e| e.event_id.is_none()) {
            return Err(AppendError::Storage(
                "a replicated batch needs events, each with its event_id".into(),
            ));
        }
        let r = self
            .send(events, Condition::head(first_seq - 1), Some(at_us))
            .await?;
        crate::envelope::check_exact(r, first_seq, n, "the replica")
    }

    async fn send(
        &self,
        events: Vec<NewEvent>,
        condition: Condition,
        at_us: Option<i64>,
    ) -> Result<AppendReceipt, AppendError> {
        commit::submit(
            &self.shared,
            commit::Request {
                events,
                condition,
                at_us,
                reply: None,
            },
        )
        .await
    }

    fn db(&self) -> Arc<Database> {
        self.shared.db()
    }

    /// Hand a job to the indexer and wait for its answer (`Closed` once it has stopped).
    async fn job<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, AppendError>>) -> indexer::Job,
    ) -> Result<T, AppendError> {
        let (reply, rx) = oneshot::channel();
        {
            let mut inbox = self.shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
            if inbox.stopped {
                return Err(self.shared.gone());
            }
            inbox.jobs.push_back(job(reply));
        }
        self.shared.inbox_cv.notify_one();
        rx.await.map_err(|_| self.shared.gone())?
    }

    /// Wait until redb holds every event acknowledged so far, durably (tests, and a caller
    /// about to read redb directly).
    #[doc(hidden)]
    pub async fn flush_index(&self) -> Result<(), AppendError> {
        self.job(indexer::Job::Flush).await
    }

    /// Hold the indexer (a test tool): while paused it writes nothing into redb, so redb lags
    /// the journal by every group committed meanwhile (memory holds them), as it would if the
    /// indexer were slow. Jobs (flush, compact, close) still run.
    #[doc(hidden)]
    pub fn pause_indexer(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::SeqCst);
        if !paused {
            self.shared.wake_indexer();
        }
    }

    /// How far redb's events table reaches (a test tool: how far it lags the head).
    #[doc(hidden)]
    pub fn indexed(&self) -> u64 {
        self.shared.indexed.load(Ordering::SeqCst)
    }

    /// The seq of the last event of `stream` with `subject` at or before `upto` (0: none): the
    /// in-memory tail first, then the merged subject index. Bounded by a head read before, the
    /// answer is that of one point of the log even while a commit lands between the reads.
    pub fn last_of(
        &self,
        tenant: Option<&str>,
        stream: &str,
        subject: &str,
        upto: u64,
    ) -> Result<u64, StorageError> {
        let tail = self.shared.tail.read().unwrap_or_else(|p| p.into_inner());
        let db = self.db();
        let (stream, subject) = (scoped(tenant, stream), scoped(tenant, subject));
        condition::last_of_subject(&ids::LazyRead::new(&db), &tail, &stream, &subject, upto)
    }
}

impl EventLog for Log {
    /// Append a batch atomically. Events without an `event_id` get a fresh one.
    async fn append(&self, events: Vec<NewEvent>) -> Result<AppendReceipt, AppendError> {
        self.append_if(events, Condition::none()).await
    }

    /// Append a batch atomically if `condition` holds when its group is staged; otherwise
    /// `ExpectationFailed` and nothing is appended. A batch whose events are all already in
    /// the log is answered as duplicates whatever the condition (a retried conditional append
    /// that had succeeded is told so, not refused). See [`crate::EventLog::append_if`].
    async fn append_if(
        &self,
        mut events: Vec<NewEvent>,
        condition: Condition,
    ) -> Result<AppendReceipt, AppendError> {
        crate::envelope::prepare_batch(&mut events)?;
        self.send(events, condition, None).await
    }

    /// Several batches, each atomic on its own condition ([`EventLog::append_if`]), committed
    /// together as one group when the log is idle (one sync): the decider's round. Answered
    /// each on its own, in order.
    async fn append_all(
        &self,
        batches: Vec<(Vec<NewEvent>, Condition)>,
    ) -> Vec<Result<AppendReceipt, AppendError>> {
        let n = batches.len();
        let mut out: Vec<Option<Result<AppendReceipt, AppendError>>> = Vec::with_capacity(n);
        let mut reqs = Vec::with_capacity(n);
        for (mut events, condition) in batches {
            match crate::envelope::prepare_batch(&mut events) {
                Ok(()) => {
                    out.push(None);
                    reqs.push(commit::Request {
                        events,
                        condition,
                        at_us: None,
                        reply: None,
                    });
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let mut sent = commit::submit_all(&self.shared, reqs).await.into_iter();
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| sent.next().unwrap_or_else(|| Err(self.shared.gone()))))
            .collect()
    }

    /// Bounded read of committed events (blocking; call from a blocking context in async
    /// code): from memory at the head, else from redb — and, where redb does not hold the
    /// newest events yet, on from memory.
    fn read(&self, q: &ReadQuery) -> Result<ReadPage, ReadError> {
        if let Some(recent) = self.shared.recent_since(q.after) {
            return recent.page(q);
        }
        let limit = q.limit.max(1);
        // Everything up to this head is durable and readable, from redb or memory.
        let head = self.head();
        let mut page = store::read(&self.shared.db(), &self.shared.tail, q)?;
        // A page redb ended short of the published head goes on from memory (or from redb
        // again, if the indexer moved on and memory let the groups go meanwhile).
        for _ in 0..4 {
            if page.events.len() >= limit || page.next_after >= head {
                break;
            }
            let rest = ReadQuery {
                after: page.next_after,
                limit: limit - page.events.len(),
                ..q.clone()
            };
            let more = match self.shared.recent_since(rest.after) {
                Some(recent) => recent.page(&rest)?,
                None => store::read(&self.shared.db(), &self.shared.tail, &rest)?,
            };
            page.events.extend(more.events);
            page.next_after = more.next_after;
            page.head = more.head;
        }
        // The view is the head read before: redb's own may lag it.
        page.head = page.head.max(head);
        Ok(page)
    }

    /// One event by its `event_id` (exact idempotency keeps `event_id → seq` for as long as the
    /// event is kept).
    fn get_by_id(&self, tenant: Option<&str>, event_id: &str) -> Result<Option<Event>, ReadError> {
        let event_id = &*scoped(tenant, event_id);
        // The tail first: an id leaves it only after the merged index holding it committed, so
        // a miss there is found by a read transaction begun afterwards.
        let in_tail = self
            .shared
            .tail
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .id(event_id);
        let seq = match in_tail {
            Some(seq) => Some(seq),
            None => {
                let runs = self
                    .shared
                    .ids
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                store::seq_of_id(&self.shared.db(), &runs, event_id)?
            }
        };
        match seq {
            // A group is in the tail just before it is published: past the head it is not
            // acknowledged yet.
            Some(seq) if seq <= self.head() => self.get(seq),
            _ => Ok(None),
        }
    }

    /// The highest committed seq (0 for an empty log).
    fn head(&self) -> u64 {
        *self.shared.head.borrow()
    }

    /// A receiver that changes on every commit; its value is the new head. A change is only a
    /// nudge: readers read the log for the truth.
    fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.head.subscribe()
    }

    /// Drop the events with seq `<= through` (at most [`COMPACT_MAX`](compact::COMPACT_MAX) per
    /// call, never past what the index tables cover nor the head; spec section 13) in a durable
    /// commit of its own, made by the indexer beside the appends. The `event_id` index keeps
    /// the ids of the dropped events.
    async fn compact(&self, through: u64) -> Result<Compacted, AppendError> {
        self.job(|reply| indexer::Job::Compact { through, reply })
            .await
    }

    /// Requests waiting for a group.
    fn queued(&self) -> usize {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .waiting
            .len()
    }

    /// `Err(InsufficientStorage)` while less than `min_free` is free where the log is kept
    /// (checked now, so it clears as soon as space returns), or while a full disk that failed
    /// a redb write has not been recovered from yet (the indexer reopens the log once space
    /// returns).
    fn check_space(&self) -> Result<(), AppendError> {
        if self.shared.full.load(Ordering::SeqCst) {
            let refusal = self.shared.space.refusal();
            if let AppendError::InsufficientStorage { available, .. } = refusal {
                self.shared.space.record(SpaceLevel::Reserve, available);
            }
            return Err(refusal);
        }
        self.shared.space.check().map_err(|(available, min_free)| {
            AppendError::InsufficientStorage {
                available,
                min_free,
            }
        })
    }

    /// Whether a storage failure has stopped appends.
    fn is_poisoned(&self) -> bool {
        self.shared.poisoned.is_set()
    }

    /// Stop taking appends, let the group being committed (and those queued) finish, have the
    /// indexer write and checkpoint everything, and wait for it. Appends made after this
    /// return `Closed`. The file is closed cleanly when the last handle is dropped.
    async fn close(&self) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed = true;
        for _ in 0..10_000 {
            let leading = self
                .shared
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .leading;
            if !leading {
                break;
            }
            // A leader finishes its group in a moment (no timer needed from the runtime).
            tokio::task::yield_now().await;
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        let stopping = {
            let mut inbox = self.shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
            (!inbox.stopped).then(|| {
                let (tx, rx) = oneshot::channel();
                inbox.jobs.push_back(indexer::Job::Close(tx));
                rx
            })
        };
        if let Some(rx) = stopping {
            self.shared.inbox_cv.notify_one();
            let _ = rx.await;
        }
        let handle = self.indexer.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
    }
    fn read_chunk(&self, after: u64, upto: u64, out: &mut EventChunk) -> Result<(), ReadError> {
        out.read_stored(self, after, upto)
    }
    fn free_bytes(&self) -> Option<u64> {
        self.shared.space.storage.available(&self.shared.space.path)
    }
    fn space(&self) -> Option<tokio::sync::watch::Receiver<crate::SpaceState>> {
        Some(self.shared.space.watch())
    }
}

impl Lookups for Log {
    /// One event by seq.
    fn get(&self, seq: u64) -> Result<Option<Event>, ReadError> {
        if seq == 0 || seq > self.head() {
            return Ok(None);
        }
        if let Some(recent) = self.shared.recent_since(seq - 1)
            && let Some(e) = recent.get(seq)?
        {
            return Ok(Some(e));
        }
        store::get(&self.shared.db(), seq)
    }

    /// The first seq the log holds: 1, or the first after a compacted prefix (blocking).
    fn first_seq(&self) -> Result<u64, StorageError> {
        compact::first_seq(&self.db())
    }

    /// The last seq whose event time is before `before_us` (0 when none; blocking).
    fn last_before(&self, before_us: i64) -> Result<u64, StorageError> {
        use redb::ReadableDatabase;
        let txn = self.db().begin_read().map_err(StorageError::of)?;
        compact::last_before_in(&txn, before_us)
    }

    /// The first seq after `after` of `stream` (and of `subject` when it is not empty) among
    /// the events the index tables cover (blocking): what a cursor at `after` still needs.
    fn next_of(
        &self,
        tenant: Option<&str>,
        stream: &str,
        subject: &str,
        after: u64,
    ) -> Result<Option<u64>, StorageError> {
        use redb::ReadableDatabase;
        let txn = self.db().begin_read().map_err(StorageError::of)?;
        // An empty subject is "any subject" (not one of the tenant's subjects).
        let subject = match subject {
            "" => std::borrow::Cow::Borrowed(""),
            s => scoped(tenant, s),
        };
        compact::next_in_index(&txn, &scoped(tenant, stream), &subject, after)
    }
}
