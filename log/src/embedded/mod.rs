//! The embedded backend of the log: one redb file in the data directory, written by one
//! thread.
//!
//! Every fact is an [`Event`] appended to one redb file under a global, dense
//! `seq` (I1), idempotent by `event_id` (I2). Appends are group-committed by a single writer
//! thread (`writer`): one durable (fsynced) redb commit per group, and no caller is answered
//! before its group is durable.
//!
//! - `codec`: the stored byte format, versioned.
//! - `writer`: the group-commit writer thread; `condition`: conditions of conditional appends,
//!   judged by the writer; `reopen`: the writer's reopen after a full disk.
//! - `journal`: the group's durable point, replayed at open.
//! - `tail`: in-memory index of the newest events, merged into redb in large batches.
//! - `recent`: the newest committed groups as stored, read by the followers at the head.
//! - `ids`: the `event_id` index.
//! - `store`: table definitions, open/recovery, bounded reads.
//! - [`compact`]: log compaction; [`storage`]: the byte stores under the log; [`fault`]: the
//!   fault-injecting store tests run it on.
//!
//! # Durability
//! An append's reply means its group's record in the journal was synced (`journal`): one
//! `fdatasync` per group commit; it survives `kill -9` and power loss. The redb commit that
//! makes the group visible is not synced; a periodic checkpoint (one `Immediate` commit) makes
//! redb durable and lets the journal start over, and at open the journal's events past redb's
//! durable head are put back. Index tables lag the events table by at most `merge_threshold`
//! events; the lag is rebuilt from the events table on open.

mod codec;
pub mod compact;
mod condition;
pub mod fault;
mod ids;
mod journal;
mod recent;
mod reopen;
pub mod storage;
pub(crate) mod store;
mod tail;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};

use redb::Database;
use tokio::sync::{mpsc, oneshot, watch};

use crate::Compacted;
use crate::{
    AppendError, AppendReceipt, Condition, Event, EventChunk, EventLog, NewEvent, OpenError,
    ReadError, ReadPage, ReadQuery, StorageError,
};

/// How to open a log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// The redb file.
    pub path: PathBuf,
    /// redb page cache size.
    pub cache_bytes: usize,
    /// Largest number of events one group commit takes.
    pub max_group_events: usize,
    /// Appends waiting for the writer beyond this are refused with `Overloaded` (I8).
    pub queue_capacity: usize,
    /// Events kept in the in-memory index tail before it is merged into redb.
    pub merge_threshold: usize,
    /// Record the allocator state in every commit, for fast reopen after a crash.
    pub quick_repair: bool,
    /// Where the bytes go: the file at `path`, or another store (tests).
    pub storage: storage::Storage,
    /// Appends and commands are refused (`InsufficientStorage`) while less than this is free
    /// where the log is kept (I10), so the disk never fills inside a commit.
    pub min_free: u64,
    /// Group commits between checkpoints (one durable redb commit that lets the journal start
    /// over; also at 8 MiB of journal and at every index merge). Bounds the replay at open.
    pub checkpoint_groups: u64,
    /// The journal file is written full of zeros to this size once, so group commits only
    /// overwrite it (a cheaper sync than growing a file).
    pub journal_prealloc: u64,
    /// Memory for the `event_id` index's filter pages (the filters themselves are on disk).
    pub id_filter_cache: usize,
    /// Sync each group's journal record before answering (true). Off only for a log that is a
    /// disposable copy of another — the JetStream backend's replica, whose source is the
    /// stream: after a crash it is back at its last checkpoint and follows the stream again.
    pub sync: bool,
}

impl LogConfig {
    /// The log of the data directory `dir` (its file is the backend's business).
    pub fn in_dir(dir: &std::path::Path) -> Self {
        LogConfig::new(dir.join("log.redb"))
    }

    pub fn new(path: impl Into<PathBuf>) -> Self {
        LogConfig {
            path: path.into(),
            cache_bytes: 256 * 1024 * 1024,
            max_group_events: 20_000,
            queue_capacity: 65_536,
            merge_threshold: 100_000,
            quick_repair: true,
            storage: storage::Storage::File,
            min_free: 64 << 20,
            checkpoint_groups: 512,
            journal_prealloc: 16 << 20,
            id_filter_cache: ids::DEFAULT_CACHE_BYTES,
            sync: true,
        }
    }
}

impl EventLog for Log {
    async fn append(&self, events: Vec<NewEvent>) -> Result<AppendReceipt, AppendError> {
        Log::append(self, events).await
    }
    async fn append_if(
        &self,
        events: Vec<NewEvent>,
        condition: Condition,
    ) -> Result<AppendReceipt, AppendError> {
        Log::append_if(self, events, condition).await
    }
    fn read(&self, q: &ReadQuery) -> Result<ReadPage, ReadError> {
        Log::read(self, q)
    }
    fn get(&self, seq: u64) -> Result<Option<Event>, ReadError> {
        Log::get(self, seq)
    }
    fn get_by_id(&self, event_id: &str) -> Result<Option<Event>, ReadError> {
        Log::get_by_id(self, event_id)
    }
    fn head(&self) -> u64 {
        Log::head(self)
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        Log::subscribe(self)
    }
    fn read_chunk(&self, after: u64, upto: u64, out: &mut EventChunk) -> Result<(), ReadError> {
        out.read_stored(self, after, upto)
    }
    fn first_seq(&self) -> Result<u64, StorageError> {
        Log::first_seq(self)
    }
    fn last_before(&self, before_us: i64) -> Result<u64, StorageError> {
        Log::last_before(self, before_us)
    }
    fn next_of(
        &self,
        stream: &str,
        subject: &str,
        after: u64,
    ) -> Result<Option<u64>, StorageError> {
        Log::next_of(self, stream, subject, after)
    }
    async fn compact(&self, through: u64) -> Result<Compacted, AppendError> {
        Log::compact(self, through).await
    }
    fn queued(&self) -> usize {
        Log::queued(self)
    }
    fn check_space(&self) -> Result<(), AppendError> {
        Log::check_space(self)
    }
    fn free_bytes(&self) -> Option<u64> {
        self.space.storage.available(&self.space.path)
    }
    fn is_poisoned(&self) -> bool {
        Log::is_poisoned(self)
    }
    async fn close(&self) {
        Log::close(self).await
    }
}

impl EventChunk {
    /// The redb backend's chunk read: the stored records copied in one buffer.
    fn read_stored(&mut self, log: &Log, after: u64, upto: u64) -> Result<(), ReadError> {
        use redb::ReadableDatabase;
        self.bytes.clear();
        self.ends.clear();
        self.owned.clear();
        let upto = upto.min(log.head());
        if after >= upto {
            return Ok(());
        }
        if let Some(recent) = log.shared.recent_since(after) {
            for (seq, record) in recent.records(upto) {
                self.bytes.extend_from_slice(record);
                self.ends.push((seq, self.bytes.len()));
            }
            return Ok(());
        }
        let db = log.shared.db();
        let txn = db
            .begin_read()
            .map_err(|e| ReadError::Storage(StorageError::of(e)))?;
        let first = compact::first_seq_of(&txn).map_err(ReadError::Storage)?;
        if after + 1 < first {
            return Err(ReadError::Compacted { first });
        }
        let t = txn
            .open_table(store::EVENTS)
            .map_err(|e| ReadError::Storage(StorageError::of(e)))?;
        for row in t
            .range(after + 1..=upto)
            .map_err(|e| ReadError::Storage(StorageError::of(e)))?
        {
            let (k, v) = row.map_err(|e| ReadError::Storage(StorageError::of(e)))?;
            self.bytes.extend_from_slice(v.value());
            self.ends.push((k.value(), self.bytes.len()));
        }
        Ok(())
    }
}

/// Where the log checks its free space.
#[derive(Debug, Clone)]
pub(crate) struct Space {
    pub storage: storage::Storage,
    pub path: PathBuf,
    pub min_free: u64,
}

impl Space {
    /// `Err((available, min_free))` when less than `min_free` is free.
    pub fn check(&self) -> Result<(), (u64, u64)> {
        match self.storage.available(&self.path) {
            Some(a) if a < self.min_free => Err((a, self.min_free)),
            _ => Ok(()),
        }
    }
}

pub(crate) struct Shared {
    pub tail: RwLock<tail::Tail>,
    /// The runs of the `event_id` index (replaced after a merge commits, before the tail
    /// forgets what it merged).
    pub ids: RwLock<ids::Runs>,
    /// Published head: every event with seq <= head is committed and indexed.
    pub head: watch::Sender<u64>,
    pub poisoned: Mutex<Option<StorageError>>,
    pub poisoned_flag: AtomicBool,
    /// The open redb database. Replaced when the writer reopens it in process: a full disk
    /// failed a redb write, and redb refuses every call after an I/O error (I10).
    pub db: RwLock<Arc<Database>>,
    /// A full disk failed a redb write; appends are refused until the writer has reopened
    /// the log, which it does once space returns.
    pub full: AtomicBool,
    /// The newest committed groups as stored, read by the followers at the head.
    pub recent: RwLock<recent::Recent>,
}

impl Shared {
    pub(crate) fn poison(&self, why: StorageError) {
        self.poisoned_flag
            .store(true, std::sync::atomic::Ordering::SeqCst);
        *self.poisoned.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// The error for a request the writer will never answer: `Poisoned` after a failure or a
    /// panic of the writer, else `Closed`.
    fn gone(&self) -> AppendError {
        match self
            .poisoned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
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
}

/// Handle to an open log. Cheap to clone; all clones share one writer.
#[derive(Clone)]
pub struct Log {
    shared: Arc<Shared>,
    space: Space,
    tx: mpsc::Sender<writer::Msg>,
    writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
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
    /// Open (or create) the log and start its writer thread.
    pub fn open(cfg: &LogConfig) -> Result<(Log, OpenReport), OpenError> {
        let stores = cfg.storage.open(&cfg.path)?;
        let opened = store::open(cfg, &stores)?;
        let report = OpenReport {
            replayed: opened.replayed,
            head: opened.head,
            repaired: opened.repaired,
            tail_events: opened.tail.len(),
        };
        let db = Arc::new(opened.db);
        // A disk too full for the journal at start: the log opens read-only (appends refused
        // with `InsufficientStorage`) and the writer reopens it once space returns (I10).
        let short_of_space = opened.journal.short_of_space();
        let (head_tx, _) = watch::channel(opened.head);
        let shared = Arc::new(Shared {
            tail: RwLock::new(opened.tail),
            ids: RwLock::new(opened.runs),
            head: head_tx,
            poisoned: Mutex::new(None),
            poisoned_flag: AtomicBool::new(false),
            db: RwLock::new(db.clone()),
            full: AtomicBool::new(short_of_space),
            recent: RwLock::default(),
        });
        let (tx, rx) = mpsc::channel(cfg.queue_capacity.max(1));
        let space = Space {
            storage: cfg.storage.clone(),
            path: cfg.path.clone(),
            min_free: cfg.min_free,
        };
        let w = writer::Writer {
            shared: shared.clone(),
            db: db.clone(),
            rx,
            head: opened.head,
            last_time_us: opened.last_time_us,
            max_group_events: cfg.max_group_events.max(1),
            merge_threshold: cfg.merge_threshold.max(1),
            quick_repair: cfg.quick_repair,
            space: space.clone(),
            journal: opened.journal,
            cfg: cfg.clone(),
            stores,
        };
        let watched = shared.clone();
        let handle = std::thread::Builder::new()
            .name("tidemark-log-writer".into())
            .spawn(move || {
                // A panic in the writer (or under it) poisons the log: every later append is
                // refused as `Poisoned`, never answered `Closed` as if the log had been shut
                // down on purpose (I10).
                let run = std::panic::AssertUnwindSafe(move || w.run());
                if let Err(p) = std::panic::catch_unwind(run) {
                    let what = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    let why = StorageError::msg(format!("the log writer panicked: {what}"));
                    tracing::error!(error = %why, "log poisoned; appends are refused until restart");
                    watched.poison(why);
                }
            })
            .map_err(|e| {
                OpenError::Storage(StorageError::new("cannot start the writer thread", e))
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
                shared,
                space,
                tx,
                writer: Arc::new(Mutex::new(Some(handle))),
            },
            report,
        ))
    }

    /// Append a batch atomically. Events without an `event_id` get a fresh one.
    pub async fn append(&self, events: Vec<NewEvent>) -> Result<AppendReceipt, AppendError> {
        self.append_if(events, Condition::none()).await
    }

    /// Append a batch atomically if `condition` holds when the writer stages it; otherwise
    /// `ExpectationFailed` and nothing is appended. A batch whose events are all already in
    /// the log is answered as duplicates whatever the condition (a retried conditional append
    /// that had succeeded is told so, not refused). See [`EventLog::append_if`].
    pub async fn append_if(
        &self,
        mut events: Vec<NewEvent>,
        condition: Condition,
    ) -> Result<AppendReceipt, AppendError> {
        crate::envelope::prepare_batch(&mut events)?;
        self.send(events, condition, None).await
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
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(writer::Msg::Append {
            events,
            condition,
            at_us,
            reply,
        }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(AppendError::Overloaded {
                    queued: self.tx.max_capacity(),
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(self.shared.gone()),
        }
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(self.unanswered().await),
        }
    }

    fn db(&self) -> Arc<Database> {
        self.shared.db()
    }

    /// Drop the events with seq `<= through` (at most [`COMPACT_MAX`](compact::COMPACT_MAX) per
    /// call, never past what the index tables cover nor the head; spec section 13) in a durable
    /// commit of its own. The `event_id` index keeps the ids of the dropped events.
    pub async fn compact(&self, through: u64) -> Result<Compacted, AppendError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(writer::Msg::Compact { through, reply })
            .await
            .map_err(|_| AppendError::Closed)?;
        rx.await.map_err(|_| AppendError::Closed)?
    }

    /// The last seq whose event time is before `before_us` (0 when none; blocking).
    pub fn last_before(&self, before_us: i64) -> Result<u64, StorageError> {
        use redb::ReadableDatabase;
        let txn = self.db().begin_read().map_err(StorageError::of)?;
        compact::last_before_in(&txn, before_us)
    }

    /// The first seq after `after` of `stream` (and of `subject` when it is not empty) among
    /// the events the index tables cover (blocking): what a cursor at `after` still needs.
    pub fn next_of(
        &self,
        stream: &str,
        subject: &str,
        after: u64,
    ) -> Result<Option<u64>, StorageError> {
        use redb::ReadableDatabase;
        let txn = self.db().begin_read().map_err(StorageError::of)?;
        compact::next_in_index(&txn, stream, subject, after)
    }

    /// The seq of the last event of `stream` with `subject` at or before `upto` (0: none): the
    /// in-memory tail first, then the merged subject index. Bounded by a head read before, the
    /// answer is that of one point of the log even while a commit lands between the reads.
    pub fn last_of(&self, stream: &str, subject: &str, upto: u64) -> Result<u64, StorageError> {
        use redb::ReadableDatabase;
        let tail = self.shared.tail.read().unwrap_or_else(|p| p.into_inner());
        if let Some(list) = tail.subjects.get(subject)
            && let Some((seq, _)) = list
                .iter()
                .rev()
                .find(|(seq, s)| *seq <= upto && &**s == stream)
        {
            return Ok(*seq);
        }
        let txn = self.db().begin_read().map_err(StorageError::of)?;
        let t = txn.open_table(store::SUBJECTS).map_err(StorageError::of)?;
        for row in t
            .range((subject, 0)..=(subject, upto))
            .map_err(StorageError::of)?
            .rev()
        {
            let (k, v) = row.map_err(StorageError::of)?;
            if v.value() == stream {
                return Ok(k.value().1);
            }
        }
        Ok(0)
    }

    /// Why the writer dropped a request unanswered: it panicked (the request's reply went
    /// while it unwound, just before it poisoned the log: wait for that) or it stopped.
    async fn unanswered(&self) -> AppendError {
        for _ in 0..1000 {
            let finished = self
                .writer
                .lock()
                .map(|h| h.as_ref().is_none_or(|h| h.is_finished()))
                .unwrap_or(true);
            if finished || self.is_poisoned() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        self.shared.gone()
    }

    /// Requests waiting for the writer.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// The highest committed seq (0 for an empty log).
    pub fn head(&self) -> u64 {
        *self.shared.head.borrow()
    }

    /// The first seq the log holds: 1, or the first after a compacted prefix (blocking).
    pub fn first_seq(&self) -> Result<u64, StorageError> {
        compact::first_seq(&self.db())
    }

    /// A receiver that changes on every commit; its value is the new head. A change is only a
    /// nudge: readers read the log for the truth.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.head.subscribe()
    }

    /// `Err(InsufficientStorage)` while less than `min_free` is free where the log is kept
    /// (checked now, so it clears as soon as space returns), or while a full disk that failed
    /// a redb write has not been recovered from yet (the writer reopens the log once space
    /// returns).
    pub fn check_space(&self) -> Result<(), AppendError> {
        if self.shared.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(AppendError::InsufficientStorage {
                available: self.space.storage.available(&self.space.path).unwrap_or(0),
                min_free: self.space.min_free,
            });
        }
        self.space
            .check()
            .map_err(|(available, min_free)| AppendError::InsufficientStorage {
                available,
                min_free,
            })
    }

    /// Whether a storage failure has stopped appends.
    pub fn is_poisoned(&self) -> bool {
        self.shared
            .poisoned_flag
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Bounded read of committed events (blocking; call from a blocking context in async code).
    pub fn read(&self, q: &ReadQuery) -> Result<ReadPage, ReadError> {
        if let Some(recent) = self.shared.recent_since(q.after) {
            return recent.page(q);
        }
        store::read(&self.shared.db(), &self.shared.tail, q)
    }

    /// One event by its `event_id` (exact idempotency keeps `event_id → seq` for as long as the
    /// event is kept).
    pub fn get_by_id(&self, event_id: &str) -> Result<Option<Event>, ReadError> {
        // The tail first: an id leaves it only after the merged index holding it committed, so
        // a miss there is found by a read transaction begun afterwards.
        let in_tail = self
            .shared
            .tail
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .get(event_id)
            .copied();
        let seq = match in_tail {
            Some(seq) => Some(seq),
            None => {
                let runs = self.shared.ids.read().unwrap_or_else(|p| p.into_inner());
                store::seq_of_id(&self.shared.db(), &runs, event_id)?
            }
        };
        match seq {
            // A group is indexed before its commit: past the head it is not acknowledged yet.
            Some(seq) if seq <= self.head() => store::get(&self.shared.db(), seq),
            _ => Ok(None),
        }
    }

    /// One event by seq.
    pub fn get(&self, seq: u64) -> Result<Option<Event>, ReadError> {
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

    /// Stop the writer after the requests already queued, and wait for it. Appends made after
    /// this return `Closed`. The file is closed cleanly when the last handle is dropped.
    pub async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(writer::Msg::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
        let handle = self.writer.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
    }
}
