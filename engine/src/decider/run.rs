//! The decider thread's loop: fold to the head, decide the queued commands in rounds, send
//! their decisions to the log at once, hand what it folded to the models' writer, reopen the
//! store after a failure, and compact.
//!
//! The models store follows the reply (spec section 3). The decider folds the commits into
//! its overlay (`tidemark_projections::framework::Overlay`: layers of rows in memory over a
//! read transaction of the file) and decides the next round on it; it freezes the layer and
//! hands it to the writer thread (`writer`), which writes it into the file after the replies,
//! batched: when a reader waits for the models ([`Progress::wait`] wakes the decider for it),
//! when the decider has nothing left to do for [`COMMIT_EVERY`], after [`COMMIT_EVERY`] of
//! rounds, or after [`FOLLOW_BATCH`] events. Readers see the store as of the writer's last
//! commit (`Progress`); a command is decided on everything folded. No B-tree of the file is
//! written on the thread every claim waits on.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_log::{
    AppendError, AppendReceipt, Condition, EventChunk, EventLog, NewEvent, StorageError,
};
use tidemark_projections::framework::FoldError;
use tidemark_projections::{Models, ModelsTxn, subjects};
use tokio::sync::{mpsc, oneshot};

use super::round::{Job, Queued};
use super::writer::{Ack, Writer};
use super::{
    COALESCE, COMMIT_EVERY, FOLD_DELAY_KNOB, FOLLOW_BATCH, Knobs, MAX_ATTEMPTS, Msg, PANIC_KNOB,
    Progress, ROUND_MAX, knob,
};
use crate::commands::{Decided, Round, key};
use crate::error::{CommandError, Rejection};
use crate::pages::Pages;

pub(super) struct State<L> {
    pub(super) log: L,
    pub(super) models: Models,
    pub(super) progress: Arc<Progress>,
    pub(super) knobs: Arc<std::sync::RwLock<Knobs>>,
    pub(super) redecided: Arc<std::sync::atomic::AtomicU64>,
    pub(super) chunk: EventChunk,
    /// Commands to decide (again) before those still in the channel.
    pub(super) queue: VecDeque<Queued>,
    /// The models store's last failure with its cause (redb answers "previous I/O error"
    /// after one until the store is reopened: commands are told the cause, a full disk say).
    pub(super) failure: Option<StorageError>,
    /// Where what the decider reads is handed on to the reactors' follower.
    pub(super) pages: Arc<Pages>,
    /// The overlay the decider folds into and decides on (begun over the file when first
    /// needed, and again after a failure or a compaction).
    pub(super) txn: Option<ModelsTxn>,
    /// Since when the overlay's active layer holds what the file does not.
    pub(super) since: Option<Instant>,
    /// What the models have folded, in the file or in the overlay (readers see [`Progress`],
    /// what the writer committed).
    pub(super) folded: u64,
    pub(super) writer: Writer,
    /// The models' file failed and has not been written since: commands are refused with the
    /// failure until a write of it succeeds (decided from memory they could be, but the store
    /// they rest on is a fault domain that is down, I10).
    pub(super) unhealthy: bool,
    /// The writer's epoch: bumped each time the overlay is dropped and folded again.
    pub(super) epoch: u64,
}

/// Layers the writer may hold before the decider waits for it.
const MAX_FROZEN: usize = 2;

/// A decision on its way to the log: the command, its events, the condition they rest on, and
/// the leases the pace admitted for it (given back unless it is appended).
type Send = (Queued, Vec<NewEvent>, Condition, Vec<(String, i64)>);

impl<L: EventLog + Clone> State<L> {
    pub(super) fn run(mut self, rx: &mut mpsc::Receiver<Msg>) {
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
        let readers = self.progress.readers();
        let broke = self.writer.broke.clone();
        loop {
            // Fold to the head, and commit it when a reader waits for it or it has been open
            // long enough.
            match self.fold_to_head().and_then(|()| {
                self.commit_if_due(Instant::now())
                    .map_err(FoldFailed::Models)
            }) {
                Ok(()) => {
                    self.pages.set_keeping_up(true);
                    backoff = Duration::from_millis(10);
                    // Recovered (the file written again since its failure): a later "previous
                    // I/O error" has a cause of its own.
                    if !self.unhealthy {
                        self.failure = None;
                    }
                }
                Err(FoldFailed::Log(e)) => {
                    // The log's read failed, not the models: they are left as they are, and
                    // the commands are refused with the log's failure until it reads again.
                    let e = CommandError::Storage(e);
                    tracing::warn!(error = %e, "reading the log's new commits failed; commands are refused until it reads again (the models are not affected)");
                    self.refuse_queued(&e);
                    while let Ok(m) = rx.try_recv() {
                        match m {
                            Msg::Job(j) => j.answer(Err(e.clone())),
                            Msg::Stop(tx) => {
                                stop = Some(tx);
                                break;
                            }
                        }
                    }
                    if stop.is_some() {
                        break;
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
                Err(FoldFailed::Models(e)) => {
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
                // What is folded goes to the writer once the decider has had nothing to do
                // for `COMMIT_EVERY` (a command coming meanwhile is decided on it first), or
                // at once when a reader comes to wait for it.
                let unwritten = self.since.is_some();
                let commit_in = unwritten.then_some(COMMIT_EVERY);
                // Wait for a head beyond what was folded, not beyond the head read now: a
                // commit landing between the fold and this read would otherwise be waited
                // past (and its readers left waiting until the next commit).
                let head = self.folded;
                let woke = rt.block_on(async {
                    tokio::select! {
                        m = rx.recv() => Some(m),
                        _ = heads.wait_for(|h| *h > head) => None,
                        _ = readers.notified(), if unwritten => None,
                        // A layer the writer could not write: folded again at the top.
                        _ = broke.notified() => None,
                        _ = async {
                            match commit_in {
                                Some(d) => tokio::time::sleep(d).await,
                                None => std::future::pending().await,
                            }
                        } => None,
                    }
                });
                if woke.is_none() && self.log.head() <= head && self.since.is_some() {
                    // Idle, or a reader waits: what is folded is committed.
                    if let Err(e) = self.commit() {
                        self.models_failed(e, &mut backoff);
                    }
                }
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
                continue;
            }
            if !self.queue.is_empty() {
                // A command is decided at the head as of its arrival: one taken above may have
                // been sent after a commit the fold at the top of the loop had not seen (an
                // append its caller saw acknowledged, then this command).
                match self.fold_to_head() {
                    Ok(()) => {}
                    Err(FoldFailed::Log(e)) => {
                        self.refuse_queued(&CommandError::Storage(e));
                        continue;
                    }
                    Err(FoldFailed::Models(e)) => {
                        self.models_failed(e, &mut backoff);
                        continue;
                    }
                }
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
        if let Err(e) = self.drain() {
            tracing::warn!(error = %e, "the models' last fold could not be committed");
        }
        self.writer.stop();
        tracing::info!("decider stopped");
        if let Some(tx) = stop {
            let _ = tx.send(());
        }
    }

    /// Hand what the overlay folded to the writer (readers see it once the writer has
    /// committed it), waiting for the writer first when it holds [`MAX_FROZEN`] layers.
    fn commit(&mut self) -> Result<(), StorageError> {
        self.reap(false)?;
        while self.writer.outstanding >= MAX_FROZEN {
            self.reap(true)?;
        }
        let Some(layer) = self
            .txn
            .as_mut()
            .and_then(ModelsTxn::overlay)
            .and_then(|o| o.freeze())
        else {
            return Ok(());
        };
        self.since = None;
        self.writer.send(layer, self.epoch);
        Ok(())
    }

    /// Commit, and wait until the writer has written everything: the file has all that is
    /// folded (before a compaction, and at the stop).
    fn drain(&mut self) -> Result<(), StorageError> {
        self.commit()?;
        while self.writer.outstanding > 0 {
            self.reap(true)?;
        }
        Ok(())
    }

    /// Take in the writer's answers (`wait`: at least one, waiting for it): the layers it
    /// wrote are read from the file from now on; a failed or stale one is the caller's to
    /// meet (the overlay is folded again from the file).
    fn reap(&mut self, wait: bool) -> Result<(), StorageError> {
        if let Some(why) = self.writer.panicked() {
            // What the writer held is lost and nothing more would be written: the decider is
            // poisoned with it (caught and reported where it runs).
            std::panic::panic_any(why.to_string());
        }
        let mut written = 0;
        let mut stale = false;
        let mut failed = self
            .writer
            .sync_failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let mut first = wait;
        while let Some(a) = self.writer.ack(first) {
            first = false;
            match a {
                Ack::Written => {
                    written += 1;
                    self.unhealthy = false;
                }
                Ack::Skipped => {}
                Ack::Stale => stale = true,
                Ack::Failed(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if stale {
            return self.refold();
        }
        if written > 0
            && let Some(txn) = self.txn.as_mut()
        {
            self.models.written(txn, written)?;
        }
        Ok(())
    }

    /// The file changed under the overlay (a rebuild folded the live models, or swapped a
    /// generation, in a transaction of its own): the overlay is dropped, once the writer holds
    /// none of it, and the models fold again from the file, in the next epoch. Commands go on
    /// (they are decided on the models at the head, folded again before the next round).
    fn refold(&mut self) -> Result<(), StorageError> {
        self.txn = None;
        self.since = None;
        while self.writer.outstanding > 0 {
            let _ = self.writer.ack(true);
        }
        self.epoch += 1;
        let at = self.models.checkpoint()?;
        self.progress.reset(at);
        self.folded = at;
        Ok(())
    }

    /// Commit when a reader waits for what is folded, or the overlay has held it for
    /// [`COMMIT_EVERY`] or holds [`FOLLOW_BATCH`] events (without waiting for a busy writer
    /// unless it holds more than that).
    fn commit_if_due(&mut self, now: Instant) -> Result<(), StorageError> {
        self.reap(false)?;
        let Some(since) = self.since else {
            return Ok(());
        };
        let events = self
            .txn
            .as_mut()
            .and_then(ModelsTxn::overlay)
            .map_or(0, |o| o.events());
        let due = self.progress.waiting() > 0
            || now.duration_since(since) >= COMMIT_EVERY
            || events >= FOLLOW_BATCH;
        if due && (self.writer.outstanding < MAX_FROZEN || events >= 4 * FOLLOW_BATCH) {
            self.commit()
        } else {
            Ok(())
        }
    }

    /// The overlay, begun over the file if none is.
    fn txn(&mut self) -> Result<&mut ModelsTxn, StorageError> {
        if self.txn.is_none() {
            self.txn = Some(self.models.overlay()?);
        }
        Ok(self.txn.as_mut().expect("set above"))
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
        // What the overlay folded is dropped with it, once the writer holds none of it: it is
        // folded again from the file, in the next epoch.
        self.txn = None;
        self.since = None;
        while self.writer.outstanding > 0 {
            let _ = self.writer.ack(true);
        }
        self.epoch += 1;
        self.unhealthy = true;
        let e = self.failure(e);
        self.pages.set_keeping_up(false);
        tracing::warn!(error = %e, "the models store failed; reopening it (the log is not affected)");
        self.refuse_queued(&CommandError::Models(e.clone()));
        std::thread::sleep(*backoff);
        *backoff = (*backoff * 2).min(Duration::from_secs(1));
        // Reopened, the store is at its last synced commit: the models' progress goes back
        // to it (readers wait for the refold rather than read older state as current).
        let reopened = {
            let _file = self.writer.file.lock().unwrap_or_else(|p| p.into_inner());
            self.models.reopen()
        };
        match reopened.and_then(|()| self.models.checkpoint()) {
            Ok(at) => {
                self.progress.reset(at);
                self.folded = at;
            }
            Err(e) => tracing::warn!(error = %e, "the models store cannot be reopened yet"),
        }
        e
    }

    /// Read the commits past what the chunk holds (at most [`FOLLOW_BATCH`] past the models'
    /// checkpoint) and hand them on to the reactors' follower: each commit is read once, as it
    /// lands, whenever the models fold it. The end of what the chunk holds.
    fn stage(&mut self) -> Result<u64, FoldFailed> {
        let at = self.folded;
        let (after, upto) = self.chunk.range();
        let from = if after == at && upto >= at { upto } else { at };
        let end = self.log.head().min(at.saturating_add(FOLLOW_BATCH));
        if end <= from {
            return Ok(from);
        }
        let mut next = EventChunk::default();
        next.read(&self.log, from, end)
            .map_err(|e| FoldFailed::Log(StorageError::of(e)))?;
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

    /// Fold the committed events up to the head into the open transaction, committed every
    /// [`FOLLOW_BATCH`] events.
    fn fold_to_head(&mut self) -> Result<(), FoldFailed> {
        loop {
            let head = self.log.head();
            if self.folded >= head {
                return Ok(());
            }
            let upto = self.stage()?;
            if let Some(ms) = knob("TIDEMARK_FAULT_FOLD_DELAY_MS", &FOLD_DELAY_KNOB) {
                // A test knob (the alert rules' test): the models fold late, and lag.
                std::thread::sleep(Duration::from_millis(ms));
            }
            let from = self.folded;
            self.txn()?;
            let txn = self.txn.as_mut().expect("begun above");
            let at = Models::fold(txn, &self.log, upto, FOLLOW_BATCH, &mut self.chunk)?;
            let events = txn.overlay().map_or(0, |o| o.events());
            if at > from {
                self.since.get_or_insert_with(Instant::now);
            }
            self.folded = at;
            metrics::gauge!("tidemark_projection_follower_lag_events")
                .set(self.log.head().saturating_sub(at) as f64);
            if events >= FOLLOW_BATCH {
                self.commit()?;
            }
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
        if super::panic_when() {
            panic!("an injected panic (TIDEMARK_FAULT_DECIDER_PANIC_WHEN)");
        }
        if self.unhealthy {
            // Has the file come back? One synced write says (only while it is down).
            let probe = {
                let _file = self.writer.file.lock().unwrap_or_else(|p| p.into_inner());
                self.models.persist()
            };
            match probe {
                Ok(()) => self.unhealthy = false,
                Err(e) => {
                    let e = CommandError::Models(self.failure(e));
                    self.refuse_queued(&e);
                    return;
                }
            }
        }
        let knobs = self.knobs.read().unwrap_or_else(|p| p.into_inner()).clone();
        let now_us = (knobs.clock)();
        let head = self.folded;
        let first_seq = match self.log.first_seq() {
            Ok(f) => f,
            Err(e) => {
                self.refuse_queued(&CommandError::Storage(e));
                return;
            }
        };
        // Decided on the open transaction (what is folded, committed or not); it only reads it.
        if let Err(e) = self.txn() {
            let e = CommandError::Models(self.failure(e));
            self.refuse_queued(&e);
            return;
        }
        let Some(mut owned) = self.txn.take() else {
            return;
        };
        let mut round = Round::new(now_us, head, &self.log, &knobs);
        let mut later: VecDeque<Queued> = VecDeque::new();
        let mut sends: Vec<Send> = Vec::new();
        let pacer = knobs.pacer.clone();

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
            // The command's tenant's models, subjects and events.
            owned.enter(q.tenant.as_deref());
            round.tenant.clone_from(&q.tenant);
            let txn = &owned;
            let decided = q.job.decide(txn, &mut round);
            // The leases the pace admitted for this decision: given back unless appended.
            let paced = pacer.admitted();
            let Decided {
                mut events, reads, ..
            } = match decided {
                Ok(d) => d,
                Err(e) => {
                    pacer.release(&paced);
                    q.answer(Err(e));
                    continue;
                }
            };
            if events.is_empty() {
                pacer.release(&paced);
                q.answer(Ok(AppendReceipt {
                    events: Vec::new(),
                    last_seq: head,
                }));
                continue;
            }
            for e in &mut events {
                e.tenant = q.tenant.as_deref().map(str::to_owned);
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
                pacer.release(&paced);
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
                round
                    .touched
                    .insert(key(q.tenant.as_deref(), stream, subject));
            }
            if let Some(e) = failed {
                pacer.release(&paced);
                q.answer(Err(CommandError::Models(e)));
                continue;
            }
            sends.push((q, events, condition, paced));
        }
        drop(round);
        owned.enter(None);
        self.txn = Some(owned);
        if let Some(q) = compact {
            // A compaction commits snapshots of its own: what is folded goes first.
            match self.drain() {
                Ok(()) => self.compact(q).await,
                Err(e) => q.answer(Err(CommandError::Models(e))),
            }
        }
        // Every decision to the log at once: one group commit.
        let answers = self
            .log
            .append_all(
                sends
                    .iter_mut()
                    .map(|(_, events, cond, _)| (std::mem::take(events), cond.clone()))
                    .collect(),
            )
            .await;
        // Answered as soon as the log has: the models fold what the round appended on their own
        // cadence (the main loop folds to the head before the next round), never on a
        // command's acknowledgement path. Clients read their writes all the same: a read
        // waits for the models to reach the head as of the request (section 3).
        for ((mut q, _, _, paced), answer) in sends.into_iter().zip(answers) {
            if answer.is_err() {
                pacer.release(&paced);
            }
            match answer {
                Ok(receipt) => q.answer(Ok(receipt)),
                Err(AppendError::ExpectationFailed { .. }) => {
                    q.attempts += 1;
                    self.redecided
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    metrics::counter!("tidemark_commands_redecided_total").increment(1);
                    if q.attempts >= MAX_ATTEMPTS {
                        q.answer(Err(CommandError::rejected(
                            Rejection::Contended,
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
        self.drain().map_err(CommandError::Models)?;
        // The overlay is begun again over the file the compaction writes.
        self.txn = None;
        let txn = self.models.begin().map_err(CommandError::Models)?;
        let mut round = Round::new((knobs.clock)(), self.folded, &self.log, &knobs);
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

/// Where a fold's failure came from: the log's read of the new commits, or the models store
/// (two fault domains, spec I10: a failing log read is not the models' failure, and does not
/// reopen their store).
pub(crate) enum FoldFailed {
    Log(StorageError),
    Models(StorageError),
}

impl From<StorageError> for FoldFailed {
    fn from(e: StorageError) -> Self {
        FoldFailed::Models(e)
    }
}

impl From<FoldError> for FoldFailed {
    fn from(e: FoldError) -> Self {
        match e {
            FoldError::Log(e) => FoldFailed::Log(e),
            FoldError::Models(e) => FoldFailed::Models(e),
        }
    }
}
