//! The single writer: group commit of concurrent appends.
//!
//! Appenders send requests over a bounded channel. The writer thread takes every request that is
//! waiting (up to `max_group_events`), checks each one (its events' ids, and its condition: see
//! `condition`) against the log and the rest of the group, writes all accepted events in one
//! redb write transaction, commits it durably (fsync), and only then publishes the new head and
//! answers the callers. A request is atomic: one conflicting event or a failed condition rejects
//! that request alone, before anything of it is written.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redb::{Database, ReadableTable, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use super::Shared;
use super::codec::{self, StoredV1};
use super::condition::{self, GroupLast};
use super::store::{EVENTS, META, META_INDEXED_THROUGH, STREAMS, SUBJECTS, TYPES};
use super::tail::Tail;
use crate::condition::Condition;
use crate::envelope::NewEvent;
use crate::error::{AppendError, StorageError, storage};
use crate::time::now_micros;
use crate::{AppendReceipt, Appended};

type Reply = oneshot::Sender<Result<AppendReceipt, AppendError>>;

pub(crate) enum Msg {
    Append {
        events: Vec<NewEvent>,
        condition: Condition,
        /// The time to record instead of the group's (a replica records its source's).
        at_us: Option<i64>,
        reply: Reply,
    },
    /// Drop the events up to a seq (retention, spec section 13), in a commit of its own.
    Compact {
        through: u64,
        reply: oneshot::Sender<Result<crate::Compacted, AppendError>>,
    },
    Close(oneshot::Sender<()>),
}

enum Item {
    Append(Vec<NewEvent>, Condition, Option<i64>, Reply),
}

struct AnyReply(Reply);

impl AnyReply {
    fn ok(self, r: AppendReceipt) {
        drop(self.0.send(Ok(r)))
    }

    fn err(self, e: AppendError) {
        drop(self.0.send(Err(e)))
    }
}

pub(crate) struct Writer {
    pub shared: Arc<Shared>,
    pub db: Arc<Database>,
    pub rx: mpsc::Receiver<Msg>,
    pub head: u64,
    pub last_time_us: i64,
    pub max_group_events: usize,
    pub merge_threshold: usize,
    pub quick_repair: bool,
    pub space: super::Space,
    /// The lean commit's durable point (see `journal`).
    pub journal: super::journal::Journal,
    /// How the log was opened and on what, for an in-process reopen after a full disk.
    pub cfg: super::LogConfig,
    pub stores: super::storage::Opened,
}

/// `TIDEMARK_FAULT_LOG_POISON_AFTER_SEQ=N`, a test knob: the first group after seq N fails as a
/// storage failure would, poisoning the log (the alert rules' test drives a poisoned log so).
fn fault_poison_after() -> Option<u64> {
    static AFTER: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| {
        std::env::var("TIDEMARK_FAULT_LOG_POISON_AFTER_SEQ")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// How often a writer that a full disk stopped looks for space to reopen the log.
const REOPEN_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// The stored form of an accepted event, stamped with its group's time.
fn stored(ev: &NewEvent, time_us: i64) -> StoredV1<'_> {
    StoredV1 {
        event_id: ev.event_id.as_deref().unwrap_or_default(),
        stream: &ev.stream,
        subject: &ev.subject,
        event_type: &ev.event_type,
        time_us,
        payload: ev.payload_bytes(),
    }
}

struct LogTables<'t> {
    events: redb::Table<'t, u64, &'static [u8]>,
}

struct Pending {
    reply: AnyReply,
    results: Vec<Appended>,
}

/// Where an event_id was found while checking a request.
enum Found {
    /// Staged earlier in this group: index into `staged`.
    Group(usize),
    Log(u64),
}

impl Writer {
    /// The next request; while a full disk keeps the log closed, look for space every
    /// [`REOPEN_POLL`] and reopen, so the log recovers by itself without traffic (I10).
    fn next_msg(&mut self) -> Option<Msg> {
        while self.is_full() {
            match self.rx.try_recv() {
                Ok(msg) => return Some(msg),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    std::thread::sleep(REOPEN_POLL);
                    let _ = self.try_reopen();
                }
            }
        }
        self.rx.blocking_recv()
    }

    pub fn run(mut self) {
        let mut close_reply = None;
        while let Some(first) = self.next_msg() {
            let mut group = Vec::new();
            let mut n = 0usize;
            let mut next = Some(first);
            while let Some(msg) = next.take() {
                match msg {
                    Msg::Append {
                        events,
                        condition,
                        at_us,
                        reply,
                    } => {
                        n += events.len();
                        group.push(Item::Append(events, condition, at_us, reply));
                    }
                    Msg::Compact { through, reply } => {
                        // Alone, after the appends taken so far.
                        if !group.is_empty() {
                            self.process(std::mem::take(&mut group));
                        }
                        let _ = reply.send(self.compact(through));
                        break;
                    }
                    Msg::Close(reply) => {
                        close_reply = Some(reply);
                        break;
                    }
                }
                if n >= self.max_group_events {
                    break;
                }
                next = self.rx.try_recv().ok();
            }
            if !group.is_empty() {
                self.process(group);
            }
            if close_reply.is_some() {
                break;
            }
        }
        // A clean stop leaves nothing to replay.
        if self.poisoned().is_none()
            && !self.is_full()
            && let Err(e) = self.checkpoint()
        {
            tracing::error!(error = %e, "the closing checkpoint failed; the journal will be replayed at open");
        }
        self.rx.close();
        // Answer anything that raced with the close.
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                Msg::Append { reply, .. } => drop(reply.send(Err(AppendError::Closed))),
                Msg::Compact { reply, .. } => drop(reply.send(Err(AppendError::Closed))),
                Msg::Close(reply) => drop(reply.send(())),
            }
        }
        tracing::info!(head = self.head, "log writer stopped");
        if let Some(reply) = close_reply {
            let _ = reply.send(());
        }
    }

    fn poisoned(&self) -> Option<StorageError> {
        self.shared
            .poisoned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.shared.full.load(Ordering::SeqCst)
    }

    /// A failed redb call stops appends: one that met a full disk (ENOSPC) only until space
    /// returns and the log is reopened in process ([`Self::try_reopen`]; redb itself refuses
    /// every call after an I/O error, and goes back to its last durable commit when reopened,
    /// the journal holding every group since); any other until a restart.
    fn stop(&self, why: StorageError) {
        // A `PreviousIo` after an earlier call met a full disk counts as full too.
        if why.is_storage_full() || self.stores.cause.full() {
            tracing::error!(error = %why, "the disk is full; appends are refused until space returns");
            self.shared.full.store(true, Ordering::SeqCst);
        } else {
            self.poison(why);
        }
    }

    pub(crate) fn poison(&self, why: StorageError) {
        tracing::error!(error = %why, "log poisoned; appends are refused until restart");
        self.shared.poison(why);
    }

    fn begin(&self) -> Result<WriteTransaction, StorageError> {
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_quick_repair(self.quick_repair);
        Ok(txn)
    }

    /// Make every commit so far durable in redb (one `Immediate` commit) and start the journal
    /// over.
    fn checkpoint(&mut self) -> Result<(), StorageError> {
        self.begin()?.commit().map_err(storage)?;
        self.journal.reset();
        Ok(())
    }

    /// Commit one group, recording its duration (staging, journal write and fsync, redb
    /// commit, replies) and size.
    fn process(&mut self, group: Vec<Item>) {
        let started = std::time::Instant::now();
        let items = group.len();
        self.process_group(group);
        metrics::histogram!("tidemark_log_commit_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        metrics::histogram!("tidemark_log_commit_items").record(items as f64);
    }

    fn process_group(&mut self, group: Vec<Item>) {
        let fail_all = |group: Vec<Item>, e: AppendError| {
            for Item::Append(_, _, _, r) in group {
                AnyReply(r).err(e.clone());
            }
        };
        if let Some(why) = self.poisoned() {
            return fail_all(group, AppendError::Poisoned(why));
        }
        if fault_poison_after().is_some_and(|after| self.head >= after) {
            // A test knob (the alert rules' test): a storage failure, as a write would meet it.
            let e = StorageError::new(
                "an injected storage fault (TIDEMARK_FAULT_LOG_POISON_AFTER_SEQ)",
                std::io::Error::other("injected fault"),
            );
            self.poison(e.clone());
            return fail_all(group, AppendError::Storage(e));
        }
        if let Err(e) = self.try_reopen() {
            return fail_all(group, e);
        }
        // I10: refuse the group while the disk is short of space, rather than let redb meet
        // ENOSPC inside a commit (which would poison the log until a restart).
        if let Err((available, min_free)) = self.space.check() {
            return fail_all(
                group,
                AppendError::InsufficientStorage {
                    available,
                    min_free,
                },
            );
        }
        let mut txn = match self.begin() {
            Ok(t) => t,
            Err(e) => {
                self.stop(e.clone());
                return fail_all(group, AppendError::Storage(e));
            }
        };
        // The journal record is the group's durable point; redb's commit only makes it visible
        // (a checkpoint makes redb durable every `journal::CHECKPOINT_*`).
        txn.set_quick_repair(false);
        let _ = txn.set_durability(redb::Durability::None);
        let time_us = now_micros().max(self.last_time_us);
        let mut staged: Vec<(u64, NewEvent)> = Vec::new();
        let mut pending: Vec<Pending> = Vec::new();
        // The stored bytes of the staged events, encoded once: for the events table and for
        // the journal record.
        let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut items = group.into_iter();
        let result = self.stage_group(
            &txn,
            &mut items,
            time_us,
            &mut staged,
            &mut records,
            &mut pending,
        );
        if let Err(e) = result {
            drop(txn);
            self.stop(e.clone());
            // Every request of the group is answered: those staged and the one that failed
            // (in `pending`), and those not reached.
            for p in pending {
                p.reply.err(AppendError::Storage(e.clone()));
            }
            for Item::Append(_, _, _, r) in items {
                AnyReply(r).err(AppendError::Storage(e.clone()));
            }
            return;
        }
        if staged.is_empty() {
            // Nothing new (all duplicates or refused): nothing to commit.
            drop(txn);
            for p in pending {
                p.reply.ok(AppendReceipt {
                    events: p.results,
                    last_seq: self.head,
                });
            }
            return;
        }
        if !records.is_empty()
            && let Err(failed) = self
                .journal
                .append(records.iter().map(|(s, b)| (*s, b.as_slice())))
        {
            // The group is not acknowledged: abort it (redb rolls the transaction back). A write refused for a full disk left
            // no complete record: the group is refused and the log goes on once space
            // returns (I10). Any other failure — a failed sync may have left a complete
            // record — poisons the log; the group's outcome is then unknown until a
            // restart (it is wholly in the log, or not at all).
            drop(txn);
            let refusal = match failed {
                super::journal::AppendFailed::Write(why) if why.is_storage_full() => {
                    AppendError::InsufficientStorage {
                        available: self.space.storage.available(&self.space.path).unwrap_or(0),
                        min_free: self.space.min_free,
                    }
                }
                super::journal::AppendFailed::Write(why)
                | super::journal::AppendFailed::Sync(why) => {
                    self.poison(why.clone());
                    AppendError::Storage(why)
                }
            };
            for p in pending {
                p.reply.err(refusal.clone());
            }
            return;
        }
        // Index the group before it becomes visible, so any read transaction that sees these
        // events finds them in the tail (readers never look past their transaction's last
        // seq). If the commit fails the log is poisoned and no later group reuses the seqs.
        if !staged.is_empty() {
            let mut tail = self.shared.tail.write().unwrap_or_else(|p| p.into_inner());
            for (seq, ev) in &staged {
                let id = ev.event_id.as_deref().unwrap_or_default();
                tail.insert(*seq, id, &ev.stream, &ev.subject, &ev.event_type);
            }
        }
        if let Err(e) = txn.commit() {
            let why = storage(e);
            self.stop(why.clone());
            for p in pending {
                p.reply.err(AppendError::Storage(why.clone()));
            }
            return;
        }
        let new_head = staged.last().map(|(s, _)| *s).unwrap_or(self.head);
        self.head = new_head;
        self.last_time_us = time_us;
        // The group's records, as stored, for the followers reading at the head (`recent`):
        // kept before the head is published, so a reader that sees the head finds them.
        self.shared
            .recent
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(records);
        self.shared.head.send_replace(new_head);
        for p in pending {
            p.reply.ok(AppendReceipt {
                events: p.results,
                last_seq: new_head,
            });
        }
        let tail_len = self.shared.tail.read().map(|t| t.len()).unwrap_or(0);
        if tail_len >= self.merge_threshold {
            // The merge's commit is durable: a checkpoint.
            match self.merge_tail() {
                Ok(()) => self.journal.reset(),
                Err(e) => self.stop(e),
            }
        } else if self.journal.full()
            && let Err(e) = self.checkpoint()
        {
            self.stop(e);
        }
    }

    /// Check every item of the group in order and write the accepted ones into `txn`.
    /// Rejected items are answered at once; accepted ones wait in `pending` for the commit. An
    /// `Err` is a storage failure: the whole group fails.
    fn stage_group(
        &mut self,
        txn: &WriteTransaction,
        group: &mut std::vec::IntoIter<Item>,
        time_us: i64,
        staged: &mut Vec<(u64, NewEvent)>,
        records: &mut Vec<(u64, Vec<u8>)>,
        pending: &mut Vec<Pending>,
    ) -> Result<(), StorageError> {
        let mut staged_ids: HashMap<String, usize> = HashMap::new();
        let mut group_last = GroupLast::default();
        // The log's tables stay open across the group's appends.
        let mut tables: Option<LogTables<'_>> = None;
        let shared = self.shared.clone();
        let tail = shared.tail.read().unwrap_or_else(|p| p.into_inner());
        for item in group.by_ref() {
            let Item::Append(events, condition, at_us, reply) = item;
            let reply = AnyReply(reply);
            let base = staged.len();
            // Answered with the group's error if a storage call fails below.
            pending.push(Pending {
                reply,
                results: Vec::new(),
            });
            let answer = |pending: &mut Vec<Pending>, e: AppendError| {
                if let Some(p) = pending.pop() {
                    p.reply.err(e);
                }
            };
            if tables.is_none() {
                tables = Some(LogTables {
                    events: txn.open_table(EVENTS).map_err(storage)?,
                });
            }
            let t = tables.as_mut().expect("opened above");
            // The condition is judged on the log as it stands before this request (the group's
            // earlier requests included), and only when the request adds events: a request
            // whose events are all in the log already is the resend of one that succeeded
            // (its condition held then) and is answered as duplicates with the original seqs
            // (a JetStream backend, which finds a batch's duplicates before it publishes, spec
            // section 16, answers the same).
            let outcome =
                match self.stage_request(txn, t, &tail, events, staged, &mut staged_ids)? {
                    Ok(results) if staged.len() > base && !condition.is_none() => {
                        match condition::failed(
                            &condition,
                            self.head,
                            &staged[..base],
                            &mut group_last,
                            txn,
                            &tail,
                        )? {
                            Some(failed) => Err(failed),
                            None => Ok(results),
                        }
                    }
                    other => other,
                };
            let results = match outcome {
                Ok(results) => results,
                Err(refused) => {
                    for (_, undone) in staged.drain(base..) {
                        staged_ids.remove(undone.event_id.as_deref().unwrap_or_default());
                    }
                    answer(pending, refused);
                    continue;
                }
            };
            {
                for (seq, ev) in &staged[base..] {
                    let mut b = Vec::with_capacity(64 + ev.payload_bytes().len());
                    codec::encode(&stored(ev, at_us.unwrap_or(time_us)), &mut b);
                    t.events.insert(*seq, b.as_slice()).map_err(storage)?;
                    records.push((*seq, b));
                }
            }
            if let Some(p) = pending.last_mut() {
                p.results = results;
            }
        }
        Ok(())
    }

    /// Dedup-check one atomic request against the log and the group, staging its new events.
    /// The inner `Err` is a conflict (the caller undoes what was staged).
    fn stage_request(
        &self,
        txn: &WriteTransaction,
        t: &LogTables<'_>,
        tail: &Tail,
        events: Vec<NewEvent>,
        staged: &mut Vec<(u64, NewEvent)>,
        staged_ids: &mut HashMap<String, usize>,
    ) -> Result<Result<Vec<Appended>, AppendError>, StorageError> {
        let events_t = &t.events;
        let runs = self.shared.ids.read().unwrap_or_else(|p| p.into_inner());
        let mut results = Vec::with_capacity(events.len());
        for ev in events {
            let id = ev.event_id.clone().unwrap_or_default();
            let found = match staged_ids.get(&id) {
                Some(&i) => Some(Found::Group(i)),
                None => match tail.ids.get(&id) {
                    Some(&seq) => Some(Found::Log(seq)),
                    None => runs.lookup(txn, id.as_str())?.map(Found::Log),
                },
            };
            let dup_of = match found {
                None => None,
                Some(Found::Group(i)) => {
                    let (seq, orig) = &staged[i];
                    Some((*seq, orig.same_as(&ev)))
                }
                Some(Found::Log(seq)) => {
                    let same = match events_t.get(seq).map_err(storage)? {
                        Some(v) => match super::store::decode_event(seq, v.value()) {
                            Ok(orig) => ev.same_content(&orig),
                            Err(e) => return Err(StorageError::of(e)),
                        },
                        // Compacted (spec section 13): the id is still known, its content is
                        // not; a resend is answered as the duplicate it most likely is.
                        None if seq < super::compact::first_seq_in(txn)? => true,
                        None => return Err(format!("indexed event {seq} is missing").into()),
                    };
                    Some((seq, same))
                }
            };
            match dup_of {
                Some((seq, true)) => results.push(Appended {
                    event_id: id,
                    seq,
                    duplicate: true,
                }),
                Some((seq, false)) => {
                    return Ok(Err(AppendError::Conflict { event_id: id, seq }));
                }
                None => {
                    let seq = self.head + 1 + staged.len() as u64;
                    staged_ids.insert(id.clone(), staged.len());
                    staged.push((seq, ev));
                    results.push(Appended {
                        event_id: id,
                        seq,
                        duplicate: false,
                    });
                }
            }
        }
        Ok(Ok(results))
    }

    /// Drop the events up to `through` (bounded, see `compact`) in a durable commit of its
    /// own, which is also a checkpoint.
    fn compact(&mut self, through: u64) -> Result<crate::Compacted, AppendError> {
        if let Some(why) = self.poisoned() {
            return Err(AppendError::Poisoned(why));
        }
        self.try_reopen()?;
        if let Err((available, min_free)) = self.space.check() {
            return Err(AppendError::InsufficientStorage {
                available,
                min_free,
            });
        }
        let run = |w: &mut Self| -> Result<crate::Compacted, StorageError> {
            // Readers of the newest groups go to redb, which answers `Compacted` below the cut.
            w.shared
                .recent
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            let txn = w.begin()?;
            let c = super::compact::compact_in(&txn, through)?;
            txn.commit().map_err(storage)?;
            w.journal.reset();
            Ok(c)
        };
        run(self).map_err(|e| {
            self.stop(e.clone());
            AppendError::Storage(e)
        })
    }

    /// Move the in-memory tail into the redb index tables in one sorted write transaction.
    fn merge_tail(&mut self) -> Result<(), StorageError> {
        let started = std::time::Instant::now();
        let txn = self.begin()?;
        let n;
        let next_runs;
        {
            let tail = self.shared.tail.read().unwrap_or_else(|p| p.into_inner());
            n = tail.len();
            let mut ids: Vec<(&str, u64)> =
                tail.ids.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            ids.sort_unstable();
            let current = self.shared.ids.read().unwrap_or_else(|p| p.into_inner());
            next_runs = current.add(&txn, &ids)?;
            super::tail::write_postings(&txn, SUBJECTS, &tail.subjects).map_err(storage)?;
            super::tail::write_postings(&txn, TYPES, &tail.types).map_err(storage)?;
            super::tail::write_postings(&txn, STREAMS, &tail.by_stream).map_err(storage)?;
            let mut meta = txn.open_table(META).map_err(storage)?;
            meta.insert(META_INDEXED_THROUGH, self.head)
                .map_err(storage)?;
        }
        // Commit and forget the tail under the write lock, so a reader sees either the old
        // tables with the old tail or the new tables with the new tail.
        let mut tail = self.shared.tail.write().unwrap_or_else(|p| p.into_inner());
        txn.commit().map_err(storage)?;
        // The new runs before the tail forgets: a reader that misses in the tail finds the id
        // in the runs.
        *self.shared.ids.write().unwrap_or_else(|p| p.into_inner()) = next_runs;
        tail.merged(self.head);
        tracing::debug!(
            events = n,
            through = self.head,
            ms = started.elapsed().as_millis() as u64,
            "merged index tail"
        );
        Ok(())
    }
}
