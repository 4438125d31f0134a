//! Group commit, run to completion by the appenders themselves.
//!
//! There is no writer thread. An appender that finds the log idle *leads*: on its own thread it
//! takes every request waiting (up to `max_group_events` events), checks each one (its
//! events' ids against the log and the group, and its condition: see `condition`), writes the
//! accepted events as one journal record, syncs it, indexes them in memory (`tail`), keeps them
//! for readers at the head (`recent`), publishes the new head and answers every member of the
//! group. The journal's sync is the acknowledgement; redb follows after the reply (`indexer`).
//! Appenders that arrive while a group is being committed wait in the queue; when the leader is
//! done it hands the lead to the first of them, whose request then leads the next group (the
//! way RocksDB's write-group leader or PostgreSQL's WAL flush leader does it): one wake-up for
//! the next leader, no hop to a writer thread and back.
//!
//! The commit itself is synchronous code, with no `.await` in it: a dropped request cannot
//! abandon a group half-written. A lead handed to an appender whose future was dropped before
//! it took it is carried out by whoever drops it ([`Lead`]'s `Drop`). A panic inside a commit
//! poisons the log (I10) and every member of the group is answered.
//!
//! A request is atomic: one conflicting event or a failed condition rejects that request
//! alone, before anything of it is written.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::Shared;
use super::codec::{self, Stored};
use super::condition::{self, GroupLast};
use super::ids::LazyRead;
use super::tail::Tail;
use crate::condition::Condition;
use crate::envelope::NewEvent;
use crate::error::{AppendError, StorageError};
use crate::time::now_micros;
use crate::{AppendReceipt, Appended};

type Outcome = Result<AppendReceipt, AppendError>;

/// What a waiting appender is told: its answer, or to lead the next group.
pub(crate) enum Answer {
    Done(Outcome),
    Lead(Lead),
}

/// One append request: a batch, its condition and the time to record instead of the group's
/// (a replica records its source's).
pub(crate) struct Request {
    pub events: Vec<NewEvent>,
    pub condition: Condition,
    pub at_us: Option<i64>,
    /// Where a waiting appender is answered (none for the leader's own request).
    pub reply: Option<oneshot::Sender<Answer>>,
}

/// The appenders waiting for a group, and whether one is leading.
#[derive(Default)]
pub(crate) struct Queue {
    pub waiting: VecDeque<Request>,
    pub leading: bool,
    /// No new request is taken ([`super::Log::close`]).
    pub closed: bool,
}

/// The state only the leader of a group touches (behind a lock that is held by one leader at
/// a time, or by the indexer while it reopens the log after a full disk).
pub(crate) struct Core {
    pub head: u64,
    pub last_time_us: i64,
    /// The groups' durable point (see `journal`).
    pub journal: super::journal::Journal,
}

/// The duty to lead the next group, with the request of the appender it was handed to (which
/// is first in that group). Dropped unused — its appender's future was dropped before it took
/// it — it leads right where it is dropped, so a group is never left without a leader.
pub(crate) struct Lead {
    shared: Option<Arc<Shared>>,
    own: Option<Request>,
}

impl Lead {
    /// Lead the next group now; the answer to the appender's own request.
    pub(crate) fn run(mut self) -> Outcome {
        let shared = self.shared.take().expect("a lead runs once");
        let own = self.own.take();
        lead(&shared, own).unwrap_or_else(|| Err(shared.gone()))
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let _ = lead(&shared, self.own.take());
        }
    }
}

/// Queue `req` for the next group, or lead it at once when the log is idle: the answer.
pub(crate) async fn submit(shared: &Arc<Shared>, mut req: Request) -> Outcome {
    let rx = {
        let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.closed {
            return Err(shared.gone());
        }
        if !q.leading {
            q.leading = true;
            drop(q);
            return lead(shared, Some(req)).unwrap_or_else(|| Err(shared.gone()));
        }
        if q.waiting.len() >= shared.queue_capacity {
            return Err(AppendError::Overloaded {
                queued: shared.queue_capacity,
            });
        }
        let (tx, rx) = oneshot::channel();
        req.reply = Some(tx);
        q.waiting.push_back(req);
        rx
    };
    match rx.await {
        Ok(Answer::Done(r)) => r,
        Ok(Answer::Lead(lead)) => lead.run(),
        // Never, as every member of a group is answered; a stopped log at worst.
        Err(_) => Err(shared.gone()),
    }
}

/// Queue several requests for one group, in order, leading it at once when the log is idle
/// (the group then takes the others: one sync for all, where submitting them one by one led
/// each alone); the answers in order. Each request stays atomic and is judged on its own
/// condition.
pub(crate) async fn submit_all(shared: &Arc<Shared>, reqs: Vec<Request>) -> Vec<Outcome> {
    let n = reqs.len();
    if n == 0 {
        return Vec::new();
    }
    let mut own = None;
    let mut waits: Vec<Result<oneshot::Receiver<Answer>, AppendError>> = Vec::with_capacity(n);
    {
        let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.closed {
            return (0..n).map(|_| Err(shared.gone())).collect();
        }
        let mut reqs = reqs.into_iter();
        if !q.leading {
            q.leading = true;
            own = reqs.next();
        }
        for mut req in reqs {
            if q.waiting.len() >= shared.queue_capacity {
                waits.push(Err(AppendError::Overloaded {
                    queued: shared.queue_capacity,
                }));
                continue;
            }
            let (tx, rx) = oneshot::channel();
            req.reply = Some(tx);
            q.waiting.push_back(req);
            waits.push(Ok(rx));
        }
    }
    let mut out = Vec::with_capacity(n);
    if let Some(req) = own {
        out.push(lead(shared, Some(req)).unwrap_or_else(|| Err(shared.gone())));
    }
    // In order: a lead is handed to the first request still waiting, so the one awaited here
    // is answered (or handed the lead) before any later one.
    for w in waits {
        out.push(match w {
            Err(e) => Err(e),
            Ok(rx) => match rx.await {
                Ok(Answer::Done(r)) => r,
                Ok(Answer::Lead(lead)) => lead.run(),
                Err(_) => Err(shared.gone()),
            },
        });
    }
    out
}

/// One member of a group being committed.
struct Member {
    req: Request,
    outcome: Option<Outcome>,
}

/// Lead groups until the queue is empty or the lead is handed on (the caller set
/// `queue.leading`). `own`, if any, is the first member of the first group; its outcome is
/// returned.
fn lead(shared: &Arc<Shared>, mut own: Option<Request>) -> Option<Outcome> {
    let mut first = true;
    let mut mine = None;
    loop {
        let mut group: Vec<Member> = Vec::new();
        let mut n = 0;
        if let Some(r) = own.take() {
            n += r.events.len();
            group.push(Member {
                req: r,
                outcome: None,
            });
        }
        {
            let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            while n < shared.max_group_events
                && let Some(r) = q.waiting.pop_front()
            {
                n += r.events.len();
                group.push(Member {
                    req: r,
                    outcome: None,
                });
            }
        }
        commit_group(shared, &mut group);
        for m in &mut group {
            let outcome = m.outcome.take().unwrap_or_else(|| Err(shared.gone()));
            match m.req.reply.take() {
                Some(reply) => drop(reply.send(Answer::Done(outcome))),
                None if first => mine = Some(outcome),
                // The request of an appender that left before it could lead.
                None => {}
            }
        }
        first = false;
        // Hand the lead to the first appender still waiting; lead on with the request of one
        // that left.
        let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mut next) = q.waiting.pop_front() else {
            q.leading = false;
            return mine;
        };
        drop(q);
        let reply = next.reply.take().expect("a waiting request has a reply");
        let handed = Lead {
            shared: Some(shared.clone()),
            own: Some(next),
        };
        match reply.send(Answer::Lead(handed)) {
            Ok(()) => return mine,
            Err(Answer::Lead(mut back)) => {
                back.shared = None;
                own = back.own.take();
            }
            Err(Answer::Done(_)) => unreachable!("a lead was sent"),
        }
    }
}

/// Commit one group: every member gets its outcome. A panic poisons the log and the members
/// not answered yet are told so.
fn commit_group(shared: &Arc<Shared>, group: &mut [Member]) {
    let started = std::time::Instant::now();
    let items = group.len();
    let run = std::panic::AssertUnwindSafe(|| {
        let mut core = shared.core.lock().unwrap_or_else(|p| p.into_inner());
        Committer {
            shared,
            core: &mut core,
        }
        .commit(group);
    });
    if let Err(p) = std::panic::catch_unwind(run) {
        let why = super::panicked("a group commit", &*p);
        shared.poison(why.clone());
        for m in group.iter_mut() {
            if m.outcome.is_none() {
                m.outcome = Some(Err(AppendError::Poisoned(why.clone())));
            }
        }
    }
    metrics::histogram!("tidemark_log_commit_duration_seconds")
        .record(started.elapsed().as_secs_f64());
    metrics::histogram!("tidemark_log_commit_items").record(items as f64);
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

/// The stored form of an accepted event, stamped with its group's time.
fn stored(ev: &NewEvent, time_us: i64) -> Stored<'_> {
    Stored {
        tenant: ev.tenant.as_deref(),
        event_id: ev.event_id.as_deref().unwrap_or_default(),
        stream: &ev.stream,
        subject: &ev.subject,
        event_type: &ev.event_type,
        time_us,
        payload: ev.payload_bytes(),
    }
}

/// Where an event_id was found while checking a request.
enum Found {
    /// Staged earlier in this group: index into `staged`.
    Group(usize),
    Log(u64),
}

struct Committer<'a> {
    shared: &'a Arc<Shared>,
    core: &'a mut Core,
}

impl Committer<'_> {
    fn refuse_all(group: &mut [Member], e: &AppendError) {
        for m in group.iter_mut() {
            if m.outcome.is_none() {
                m.outcome = Some(Err(e.clone()));
            }
        }
    }

    fn commit(mut self, group: &mut [Member]) {
        let shared = self.shared;
        if let Some(why) = shared.poisoned() {
            return Self::refuse_all(group, &AppendError::Poisoned(why));
        }
        if fault_poison_after().is_some_and(|after| self.core.head >= after) {
            // A test knob (the alert rules' test): a storage failure, as a write would meet it.
            let e = StorageError::new(
                "an injected storage fault (TIDEMARK_FAULT_LOG_POISON_AFTER_SEQ)",
                std::io::Error::other("injected fault"),
            );
            shared.poison(e.clone());
            return Self::refuse_all(group, &AppendError::Storage(e));
        }
        // I10: refuse the group while the disk is short of space (or a full disk stopped the
        // indexer and it has not reopened the log yet), rather than meet ENOSPC inside a write.
        if shared.full.load(Ordering::SeqCst) || shared.space.check().is_err() {
            return Self::refuse_all(group, &shared.space.refusal());
        }
        // Memory holds every group redb does not have yet: wait (bounded) while the indexer is
        // that far behind (I9), rather than grow without bound.
        shared.wait_for_indexer();
        let time_us = now_micros().max(self.core.last_time_us);
        let mut staged: Vec<(u64, NewEvent)> = Vec::new();
        let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
        let accepted = {
            let tail = shared.tail.read().unwrap_or_else(|p| p.into_inner());
            self.stage(group, &tail, time_us, &mut staged, &mut records)
        };
        let accepted = match accepted {
            Ok(a) => a,
            Err(e) => {
                shared.stop(e.clone());
                return Self::refuse_all(group, &AppendError::Storage(e));
            }
        };
        if staged.is_empty() {
            // Nothing new (all duplicates or refused): nothing to write.
            for (i, results) in accepted {
                group[i].outcome = Some(Ok(AppendReceipt {
                    events: results,
                    last_seq: self.core.head,
                }));
            }
            return;
        }
        if let Err(failed) = self
            .core
            .journal
            .append(records.iter().map(|(s, b)| (*s, b.as_slice())))
        {
            // The group is not acknowledged. A write refused for a full disk left no complete
            // record: the group is refused and the log goes on once space returns (I10). Any
            // other failure — a failed sync may have left a complete record — poisons the log;
            // the group's outcome is then unknown until a restart (it is wholly in the log, or
            // not at all).
            let refusal = match failed {
                super::journal::AppendFailed::Write(why) if why.is_storage_full() => {
                    shared.space.refusal()
                }
                super::journal::AppendFailed::Write(why)
                | super::journal::AppendFailed::Sync(why) => {
                    shared.poison(why.clone());
                    AppendError::Storage(why)
                }
            };
            return Self::refuse_all(group, &refusal);
        }
        // Durable: index in memory, keep for the readers at the head, then publish.
        {
            let mut tail = shared.tail.write().unwrap_or_else(|p| p.into_inner());
            for (seq, ev) in &staged {
                let id = ev.event_id.as_deref().unwrap_or_default();
                let keys = [id, &ev.stream, &ev.subject, &ev.event_type];
                tail.insert(*seq, ev.tenant.as_deref(), keys);
            }
        }
        let new_head = staged.last().map(|(s, _)| *s).unwrap_or(self.core.head);
        self.core.head = new_head;
        self.core.last_time_us = time_us;
        shared.publish(records, new_head);
        for (i, results) in accepted {
            group[i].outcome = Some(Ok(AppendReceipt {
                events: results,
                last_seq: new_head,
            }));
        }
        self.turn_journal();
    }

    /// Move the journal to its other segment when the current one is full and a checkpoint
    /// covers the other; otherwise ask the indexer for that checkpoint (the current segment
    /// goes on meanwhile: nothing waits for it).
    fn turn_journal(&mut self) {
        let j = &mut self.core.journal;
        if !j.rotation_due() {
            return;
        }
        let shared = self.shared;
        if !j.rotate(shared.checkpointed.load(Ordering::SeqCst)) {
            shared.want_checkpoint(j.needs_checkpoint());
        } else if j.needs_checkpoint() > 0 {
            // Ask early, so the segment just left is covered before the current one fills.
            shared.want_checkpoint(j.needs_checkpoint());
        }
    }

    /// Check every member in order and stage the accepted ones. Refused members get their
    /// outcome at once; accepted ones are returned with their results, to be answered after
    /// the sync. An `Err` is a storage failure: the whole group fails.
    fn stage(
        &mut self,
        group: &mut [Member],
        tail: &Tail,
        time_us: i64,
        staged: &mut Vec<(u64, NewEvent)>,
        records: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<Vec<(usize, Vec<Appended>)>, StorageError> {
        let shared = self.shared;
        let mut staged_ids: HashMap<String, usize> = HashMap::new();
        let mut group_last = GroupLast::default();
        let mut accepted = Vec::new();
        let db = shared.db();
        let reader = LazyRead::new(&db);
        let runs = shared.ids.read().unwrap_or_else(|p| p.into_inner());
        for (i, m) in group.iter_mut().enumerate() {
            if m.outcome.is_some() {
                continue;
            }
            let base = staged.len();
            let events = std::mem::take(&mut m.req.events);
            // The condition is judged on the log as it stands before this request (the
            // group's earlier requests included), and only when the request adds events: a
            // request whose events are all in the log already is the resend of one that
            // succeeded (its condition held then) and is answered as duplicates with the
            // original seqs (a JetStream backend, which finds a batch's duplicates before it
            // publishes, spec section 16, answers the same).
            let outcome =
                match self.stage_request(&reader, &runs, tail, events, staged, &mut staged_ids)? {
                    Ok(results) if staged.len() > base && !m.req.condition.is_none() => {
                        match condition::failed(
                            staged[base].1.tenant.as_deref(),
                            &m.req.condition,
                            self.core.head,
                            &staged[..base],
                            &mut group_last,
                            &reader,
                            tail,
                        )? {
                            Some(failed) => Err(failed),
                            None => Ok(results),
                        }
                    }
                    other => other,
                };
            match outcome {
                Ok(results) => {
                    for (seq, ev) in &staged[base..] {
                        let mut b = Vec::with_capacity(64 + ev.payload_bytes().len());
                        codec::encode(&stored(ev, m.req.at_us.unwrap_or(time_us)), &mut b);
                        records.push((*seq, b));
                    }
                    accepted.push((i, results));
                }
                Err(refused) => {
                    for (_, undone) in staged.drain(base..) {
                        staged_ids.remove(&*undone.scoped_id());
                    }
                    m.outcome = Some(Err(refused));
                }
            }
        }
        Ok(accepted)
    }

    /// Dedup-check one atomic request against the log and the group, staging its new events.
    /// The inner `Err` is a conflict (the caller undoes what was staged).
    fn stage_request(
        &self,
        reader: &LazyRead<'_>,
        runs: &super::ids::Runs,
        tail: &Tail,
        events: Vec<NewEvent>,
        staged: &mut Vec<(u64, NewEvent)>,
        staged_ids: &mut HashMap<String, usize>,
    ) -> Result<Result<Vec<Appended>, AppendError>, StorageError> {
        let mut results = Vec::with_capacity(events.len());
        for ev in events {
            let id = ev.event_id.clone().unwrap_or_default();
            // The tenant's own ids: another tenant's event of the same id is another event.
            let key = ev.scoped_id();
            let found = match staged_ids.get(&*key) {
                Some(&i) => Some(Found::Group(i)),
                None => match tail.id(&key) {
                    Some(seq) => Some(Found::Log(seq)),
                    None => runs.lookup(reader, &key)?.map(Found::Log),
                },
            };
            let key = key.into_owned();
            let dup_of = match found {
                None => None,
                Some(Found::Group(i)) => {
                    let (seq, orig) = &staged[i];
                    Some((*seq, orig.same_as(&ev)))
                }
                Some(Found::Log(seq)) => Some((seq, self.shared.same_as_stored(seq, &ev)?)),
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
                    let seq = self.core.head + 1 + staged.len() as u64;
                    staged_ids.insert(key, staged.len());
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
}
