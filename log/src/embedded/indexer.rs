//! The indexer: the one thread that writes redb, always after the reply.
//!
//! A group is acknowledged once its journal record is synced (`commit`); its events reach
//! redb later, here: the indexer takes the groups published since it last ran from memory
//! (`recent`, which keeps every group redb does not have yet) and inserts them into the events
//! table in one non-durable commit, however many groups that is (batched by the time it was
//! busy, or [`BATCH_DELAY`] after a quiet start). Beside that it:
//! - merges the in-memory index tail into redb's index tables when it holds
//!   `merge_threshold` events, on a frozen part while a new part takes appends (`tail`), in
//!   one durable commit (a checkpoint too);
//! - makes checkpoints — a durable commit that covers everything indexed — when the journal
//!   asks for one before it reuses a segment, or [`CHECKPOINT_INTERVAL`] after the last one if
//!   anything is new;
//! - compacts the log (retention, section 13) in durable commits of its own;
//! - after a full disk failed a redb write, looks for space and reopens the log in process
//!   (`reopen`).
//!
//! It sleeps while there is nothing to do (no timer at rest), and an appender wakes it only
//! when it sleeps and a commit gave it work. Nothing here ever holds up an append: appenders
//! wait for it only if memory would otherwise hold more than [`super::MAX_LAG_BYTES`] of
//! groups redb does not have (I9), or [`super::MERGE_LAG_BYTES`] while it merges the tail (so
//! that a merge does not make them wait).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redb::{Database, WriteTransaction};
use tokio::sync::oneshot;

use super::Shared;
use super::store::{EVENTS, META, META_INDEXED_THROUGH};
use crate::error::{AppendError, StorageError, storage};

/// After a quiet spell, wait this long for more groups before writing them.
const BATCH_DELAY: Duration = Duration::from_millis(5);
/// A checkpoint at most this long after the last one, when anything is new.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(30);
/// How often an indexer that a full disk stopped looks for space to reopen the log.
const REOPEN_POLL: Duration = Duration::from_millis(250);
/// The ids a step of the id index's compaction merges at least (then to the end of a filter
/// page): some tens of milliseconds, after which the events published meanwhile reach redb.
const COMPACTION_STEP: usize = 16_384;

/// Work for the indexer besides indexing.
pub(crate) enum Job {
    /// Drop the events up to a seq (retention, spec section 13), in a durable commit.
    Compact {
        through: u64,
        reply: oneshot::Sender<Result<crate::Compacted, AppendError>>,
    },
    /// Wait until redb holds every event published so far (tests; `Log::flush_index`).
    Flush(oneshot::Sender<Result<(), AppendError>>),
    /// Index everything, checkpoint and stop.
    Close(oneshot::Sender<()>),
}

/// The indexer's mailbox, under the lock its condition variable waits on.
#[derive(Default)]
pub(crate) struct Inbox {
    pub jobs: VecDeque<Job>,
    /// Every handle of the log was dropped: index, checkpoint and stop.
    pub dropped: bool,
    /// The indexer has stopped: a job is answered at once (`Closed`).
    pub stopped: bool,
}

/// The indexer has ended (stopped, or panicked): answer the jobs left, and have later ones
/// answered by whoever sends them.
pub(crate) fn stopped(shared: &Shared) {
    shared.indexer_stopped.store(true, Ordering::SeqCst);
    let mut inbox = shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
    inbox.stopped = true;
    let gone = shared.gone();
    for job in inbox.jobs.drain(..) {
        match job {
            Job::Compact { reply, .. } => drop(reply.send(Err(gone.clone()))),
            Job::Flush(reply) => drop(reply.send(Err(gone.clone()))),
            Job::Close(reply) => drop(reply.send(())),
        }
    }
    drop(inbox);
    shared.indexer_caught_up();
}

pub(crate) struct Indexer {
    pub shared: Arc<Shared>,
    pub db: Arc<Database>,
    pub merge_threshold: usize,
    pub quick_repair: bool,
    /// How the log was opened and on what, for an in-process reopen after a full disk.
    pub cfg: super::LogConfig,
    pub stores: super::storage::Opened,
    pub last_checkpoint: Instant,
    /// The id index may hold a compaction in progress (checked once at start).
    pub compacting: bool,
}

/// What woke the indexer.
enum Wake {
    Jobs(Vec<Job>),
    Work,
    Stop,
}

impl Indexer {
    pub(crate) fn run(mut self) {
        loop {
            let jobs = match self.wait() {
                Wake::Stop => break,
                Wake::Work => Vec::new(),
                Wake::Jobs(jobs) => jobs,
            };
            if self.shared.full.load(Ordering::SeqCst) {
                let _ = self.try_reopen();
            }
            let mut closing = Vec::new();
            for job in jobs {
                match job {
                    Job::Compact { through, reply } => {
                        let _ = reply.send(self.compact(through));
                    }
                    Job::Flush(reply) => {
                        let r = if self.healthy() {
                            self.work(true, usize::MAX).map_err(|e| self.refusal(e))
                        } else {
                            Err(self.unhealthy())
                        };
                        let _ = reply.send(r);
                    }
                    Job::Close(reply) => closing.push(reply),
                }
            }
            if !closing.is_empty() {
                self.finish();
                for reply in closing {
                    let _ = reply.send(());
                }
                return;
            }
            if self.healthy()
                && !self.shared.paused.load(Ordering::SeqCst)
                && let Err(e) = self.work(false, self.cfg.index_commit_bytes)
            {
                self.shared.stop(e);
            }
        }
        self.finish();
    }

    fn healthy(&self) -> bool {
        !self.shared.full.load(Ordering::SeqCst) && self.shared.poisoned().is_none()
    }

    /// The answer to a job while the log is poisoned or full.
    fn unhealthy(&self) -> AppendError {
        match self.shared.poisoned() {
            Some(why) => AppendError::Poisoned(why),
            None => self.shared.space.refusal(),
        }
    }

    fn refusal(&self, e: StorageError) -> AppendError {
        self.shared.stop(e.clone());
        match self.shared.poisoned() {
            Some(why) => AppendError::Poisoned(why),
            None => self.shared.space.refusal(),
        }
    }

    /// A clean stop leaves redb holding everything, durably: nothing to replay at open.
    fn finish(&mut self) {
        if self.healthy()
            && let Err(e) = self.apply(true, false, usize::MAX)
        {
            tracing::error!(error = %e, "the closing checkpoint failed; the journal will be replayed at open");
        }
        stopped(&self.shared);
        tracing::info!(
            indexed = self.shared.indexed.load(Ordering::SeqCst),
            "log indexer stopped"
        );
    }

    /// Sleep until there is something to do.
    fn wait(&mut self) -> Wake {
        let s = self.shared.clone();
        // Only this thread changes the runs: whether a compaction is owed holds while it waits.
        let compaction_owed = self.compaction_owed();
        let mut inbox = s.inbox.lock().unwrap_or_else(|p| p.into_inner());
        let mut quiet = false;
        loop {
            if !inbox.jobs.is_empty() {
                return Wake::Jobs(inbox.jobs.drain(..).collect());
            }
            if inbox.dropped {
                return Wake::Stop;
            }
            if s.full.load(Ordering::SeqCst) {
                // Look for space now and then, to reopen the log (I10).
                let (g, _) = s
                    .inbox_cv
                    .wait_timeout(inbox, REOPEN_POLL)
                    .unwrap_or_else(|p| p.into_inner());
                drop(g);
                return Wake::Work;
            }
            let healthy = s.poisoned().is_none() && !s.paused.load(Ordering::SeqCst);
            let behind = || s.published.load(Ordering::SeqCst) > s.indexed.load(Ordering::SeqCst);
            if healthy {
                if compaction_owed
                    || s.wanted.load(Ordering::SeqCst) > s.checkpointed.load(Ordering::SeqCst)
                {
                    return Wake::Work;
                }
                if behind() {
                    if !quiet {
                        return Wake::Work;
                    }
                    // Woken from a quiet spell: let the next groups join this batch.
                    quiet = false;
                    inbox = s
                        .inbox_cv
                        .wait_timeout(inbox, BATCH_DELAY)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    continue;
                }
            }
            // A checkpoint is owed to what was indexed since the last one: sleep until it is
            // due. Otherwise sleep until an appender or a job wakes us (no timer at rest).
            let owed =
                healthy && s.checkpointed.load(Ordering::SeqCst) < s.indexed.load(Ordering::SeqCst);
            let left = CHECKPOINT_INTERVAL.saturating_sub(self.last_checkpoint.elapsed());
            if owed && left.is_zero() {
                return Wake::Work;
            }
            s.indexer_idle.store(true, Ordering::SeqCst);
            if healthy && behind() {
                s.indexer_idle.store(false, Ordering::SeqCst);
                continue;
            }
            inbox = if owed {
                s.inbox_cv
                    .wait_timeout(inbox, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            } else {
                s.inbox_cv.wait(inbox).unwrap_or_else(|p| p.into_inner())
            };
            s.indexer_idle.store(false, Ordering::SeqCst);
            quiet = true;
        }
    }

    /// Index what was published, merge the tail when it is due, and checkpoint when the
    /// journal wants one, it is time, or `durable` asks for one; at most about `stage_bytes`
    /// of events unless the tail is merged (a merge takes everything published).
    fn work(&mut self, durable: bool, stage_bytes: usize) -> Result<(), StorageError> {
        if !self.healthy() {
            return Err(self
                .shared
                .poisoned()
                .unwrap_or_else(|| StorageError::msg("the disk is full")));
        }
        let tail_len = self.shared.tail.read().map(|t| t.len()).unwrap_or(0);
        if tail_len >= self.merge_threshold {
            return self.merge();
        }
        let s = &self.shared;
        let checkpoint = durable
            || s.wanted.load(Ordering::SeqCst) > s.checkpointed.load(Ordering::SeqCst)
            || (s.indexed.load(Ordering::SeqCst) > s.checkpointed.load(Ordering::SeqCst)
                && self.last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL);
        self.apply(checkpoint, true, stage_bytes)
    }

    fn compaction_owed(&self) -> bool {
        self.compacting
            || self
                .shared
                .ids
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .full_level()
                .is_some()
    }

    /// One step of the id index's upkeep in `txn` (a compaction's, or dropping a run one
    /// replaced), if one is owed: the runs to install once `txn` commits.
    fn compaction_step(
        &mut self,
        txn: &WriteTransaction,
    ) -> Result<Option<super::ids::Runs>, StorageError> {
        use super::ids::Upkeep;
        let mut runs = self
            .shared
            .ids
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let upkeep = runs.upkeep(txn, COMPACTION_STEP)?;
        self.compacting = upkeep != Upkeep::Idle;
        Ok((upkeep == Upkeep::Stepped).then_some(runs))
    }

    fn begin(&self, durable: bool) -> Result<WriteTransaction, StorageError> {
        let mut txn = self.db.begin_write().map_err(storage)?;
        if durable {
            txn.set_quick_repair(self.quick_repair);
        } else {
            txn.set_quick_repair(false);
            let _ = txn.set_durability(redb::Durability::None);
        }
        Ok(txn)
    }

    /// Insert the published groups redb does not have into `txn`, stopping once about
    /// `max_bytes` are in; the seq it then holds.
    fn stage_events(&self, txn: &WriteTransaction, max_bytes: usize) -> Result<u64, StorageError> {
        let s = &self.shared;
        let indexed = s.indexed.load(Ordering::SeqCst);
        let published = s.published.load(Ordering::SeqCst);
        if published <= indexed {
            return Ok(indexed);
        }
        let Some(since) = s.recent_since(indexed) else {
            return Err(StorageError::msg(format!(
                "the groups after seq {indexed} are neither in redb nor in memory"
            )));
        };
        let mut t = txn.open_table(EVENTS).map_err(storage)?;
        let mut last = indexed;
        let mut bytes = 0;
        for (seq, record) in since.records(published) {
            t.insert(seq, record).map_err(storage)?;
            last = seq;
            bytes += record.len();
            if bytes >= max_bytes {
                // The rest in the next commit, which follows at once.
                return Ok(last);
            }
        }
        if last != published {
            return Err(StorageError::msg(format!(
                "memory holds the groups up to seq {last}, not {published}"
            )));
        }
        Ok(published)
    }

    /// Back to the ordinary lag bound once what arrived during a merge has reached redb. The
    /// merge's bound holds until then: had it dropped at the merge's end, the appenders would
    /// find tens of MB waiting and stop until commits had written all of them (issue 39: the
    /// 0.1-0.25 s pauses after each merge).
    fn settle_bound(&self) {
        let s = &self.shared;
        if s.merging.load(Ordering::SeqCst) && s.recent_bytes() <= super::MAX_LAG_BYTES {
            s.merging.store(false, Ordering::SeqCst);
            s.indexer_caught_up();
        }
    }

    /// What a commit that made redb hold everything up to `through` (durably or not) lets go:
    /// the groups memory kept for it, and appenders waiting for it.
    fn indexed(&mut self, through: u64, durable: bool) {
        let s = &self.shared;
        s.indexed.store(through, Ordering::SeqCst);
        if durable {
            s.checkpointed.store(through, Ordering::SeqCst);
            self.last_checkpoint = Instant::now();
        }
        s.recent
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .trim(through);
        s.indexer_caught_up();
    }

    /// Index what was published in one commit (durable: a checkpoint), with a step of the id
    /// index's compaction when one is owed and `compact` allows it; at most about
    /// `stage_bytes` of events.
    fn apply(
        &mut self,
        durable: bool,
        compact: bool,
        stage_bytes: usize,
    ) -> Result<(), StorageError> {
        let compact = compact && self.compaction_owed();
        let s = self.shared.clone();
        if !durable
            && !compact
            && s.published.load(Ordering::SeqCst) <= s.indexed.load(Ordering::SeqCst)
        {
            return Ok(());
        }
        let started = Instant::now();
        let txn = self.begin(durable)?;
        let through = self.stage_events(&txn, stage_bytes)?;
        let runs = if compact {
            self.compaction_step(&txn)
                .inspect_err(|_| self.compacting = true)?
        } else {
            None
        };
        txn.commit().map_err(|e| {
            self.compacting = true;
            storage(e)
        })?;
        if let Some(runs) = runs {
            *s.ids.write().unwrap_or_else(|p| p.into_inner()) = runs;
        }
        self.indexed(through, durable);
        self.settle_bound();
        let kind = if durable { "checkpoint" } else { "events" };
        metrics::histogram!("tidemark_log_index_commit_seconds", "kind" => kind)
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Move the tail's active part into the redb index tables, frozen, while a new part
    /// takes appends; in one durable commit with the events published so far.
    fn merge(&mut self) -> Result<(), StorageError> {
        let s = self.shared.clone();
        s.merging.store(true, Ordering::SeqCst);
        let r = self.merge_tail();
        self.settle_bound();
        r
    }

    fn merge_tail(&mut self) -> Result<(), StorageError> {
        let started = Instant::now();
        let s = self.shared.clone();
        let Some(part) = s.tail.write().unwrap_or_else(|p| p.into_inner()).freeze() else {
            return Ok(());
        };
        // The leader indexes a group in the tail just before it publishes it.
        while s.published.load(Ordering::SeqCst) < part.last {
            if let Some(why) = s.poisoned() {
                return Err(why);
            }
            std::thread::yield_now();
        }
        let txn = self.begin(true)?;
        let through = self.stage_events(&txn, usize::MAX)?;
        let next_runs = {
            let mut ids: Vec<(&str, u64)> =
                part.ids.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            ids.sort_unstable();
            let current = s.ids.read().unwrap_or_else(|p| p.into_inner()).clone();
            current.add(&txn, &ids)?
        };
        super::store::write_part(&txn, &part)?;
        txn.open_table(META)
            .map_err(storage)?
            .insert(META_INDEXED_THROUGH, part.last)
            .map_err(storage)?;
        txn.commit().map_err(storage)?;
        {
            // The new runs before the tail forgets the frozen part: a reader that misses in
            // the tail finds the id in the runs.
            let mut tail = s.tail.write().unwrap_or_else(|p| p.into_inner());
            *s.ids.write().unwrap_or_else(|p| p.into_inner()) = next_runs;
            tail.merged();
        }
        self.indexed(through, true);
        metrics::histogram!("tidemark_log_index_commit_seconds", "kind" => "merge")
            .record(started.elapsed().as_secs_f64());
        tracing::debug!(
            events = part.len(),
            through = part.last,
            ms = started.elapsed().as_millis() as u64,
            "merged index tail"
        );
        Ok(())
    }

    /// Drop the events up to `through` (bounded, see `compact`) in a durable commit of its
    /// own, which is also a checkpoint.
    fn compact(&mut self, through: u64) -> Result<crate::Compacted, AppendError> {
        if let Some(why) = self.shared.poisoned() {
            return Err(AppendError::Poisoned(why));
        }
        if self.shared.full.load(Ordering::SeqCst) {
            return Err(self.shared.space.refusal());
        }
        if let Err((available, min_free)) = self.shared.space.check() {
            return Err(AppendError::InsufficientStorage {
                available,
                min_free,
            });
        }
        let run = |w: &mut Self| -> Result<crate::Compacted, StorageError> {
            let txn = w.begin(true)?;
            let indexed = w.stage_events(&txn, usize::MAX)?;
            let c = super::compact::compact_in(&txn, through)?;
            txn.commit().map_err(storage)?;
            // Readers below the cut go to redb, which answers `Compacted`.
            w.shared
                .recent
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .drop_through(c.first_seq.saturating_sub(1));
            w.indexed(indexed, true);
            Ok(c)
        };
        run(self).map_err(|e| self.refusal(e))
    }
}
