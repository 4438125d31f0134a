//! Retention (spec section 13): what has been done with for `window` leaves the read models.
//! The command decides at the head, where every model is current: notifications (dashboard-only
//! ones too) whose deliveries are all terminal and unchanged for the window, with those
//! deliveries; terminal tasks unchanged for the window that no bridge subscription and no
//! live cursor on `task_events` still follows. It writes the ids into `retention.purged`
//! events, which every projection folds, so a rebuild removes exactly the same rows. Nothing
//! pending is ever named; cursors, subscriptions, sources and settings are never purged.

use crate::error::CommandError;
use std::collections::BTreeSet;

use tidemark_log::{NewEvent, StorageError};
use tidemark_projections::ModelsTxn;
use tidemark_projections::cursors::{self, Cursor};
use tidemark_projections::deliveries::{self, Delivery};
use tidemark_projections::names::{EventType, Stream, TaskStatus};
use tidemark_projections::retention::{IDS_PER_EVENT, Purged};
use tidemark_projections::{bridges, notifications, tasks};

use super::sealed::Sealed;
use super::{Command, Decided, Round};

/// Purge what left the window by now (at most `max` ids in one command: run it again while
/// it reports `more`); answers what it purged.
#[derive(Debug, Clone)]
pub struct Purge {
    pub window_ms: u64,
    pub max: usize,
    /// Run by hand: `Some(token name)`, `Some(None)` in open mode; `None` for the periodic
    /// run (section 8).
    pub by: Option<Option<String>>,
}

impl Sealed for Purge {}
impl Command for Purge {
    type Answer = RetentionReport;

    fn name(&self) -> &'static str {
        "retention.run"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<RetentionReport>, CommandError> {
        let (now_us, head, privacy) = (round.now_us, round.head, round.privacy);
        let before = now_us.saturating_sub((self.window_ms as i64).saturating_mul(1_000));
        let mut rep = RetentionReport {
            before_us: before,
            through_seq: head,
            ..RetentionReport::default()
        };
        let mut dl: BTreeSet<String> = BTreeSet::new();
        let mut nl: Vec<String> = Vec::new();
        let mut tl: Vec<String> = Vec::new();
        let done = |d: &Delivery| !d.is_pending() && d.updated_at_us < before && d.last_seq <= head;

        // Notifications, oldest first: event times never go back along seq.
        let mut dt = deliveries::View::new(txn)?;
        for note in notifications::View::new(txn)?.older_than(head, before, self.max)? {
            if dl.len() + nl.len() >= self.max {
                rep.more = true;
                break;
            }
            let mut ids = dt.of_notification(&note.notification_id)?;
            if let Some(p) = privacy {
                ids.extend(dt.of_notification(&p.intent_key(&note.notification_id))?);
            }
            let mut all_done = true;
            for id in &ids {
                match dt.row(id)? {
                    Some(row) if !done(&row) => {
                        all_done = false;
                        break;
                    }
                    _ => {}
                }
            }
            if all_done {
                nl.push(note.notification_id.clone());
                dl.extend(ids);
            }
        }

        // Terminal tasks nobody follows.
        // A cursor with no progress for the window pins nothing (section 13).
        let followers: Vec<Cursor> = cursors::View::new(txn)?
            .all()?
            .into_iter()
            .filter(|c| {
                c.stream_name == Stream::TaskEvents.as_str()
                    && c.updated_at_us.is_some_and(|u| u >= before)
            })
            .collect();
        let mut tt = tasks::View::new(txn)?;
        let mut bt = bridges::View::new(txn)?;
        'status: for status in [
            TaskStatus::Completed,
            TaskStatus::Failed,
            TaskStatus::Canceled,
        ] {
            for id in tt.with_status(status)? {
                if dl.len() + nl.len() + tl.len() >= self.max {
                    rep.more = true;
                    break 'status;
                }
                let Some(task) = tt.row(&id)? else {
                    continue;
                };
                if task.updated_at_us >= before || task.latest_event_seq > head {
                    continue;
                }
                if bt.follows_task(&id)? {
                    continue;
                }
                let pinned = followers.iter().any(|c| {
                    (c.subject_id.is_empty() || c.subject_id == id)
                        && c.last_sequence < task.latest_event_seq
                });
                if !pinned {
                    tl.push(id);
                }
            }
        }

        rep.deliveries = dl.len();
        rep.notifications = nl.len();
        rep.tasks = tl.len();
        let before_text = tidemark_log::time::format_micros(before);
        let mut events = Vec::new();
        let mut dl = dl.into_iter();
        let (mut nl, mut tl) = (nl.into_iter(), tl.into_iter());
        loop {
            let mut p = Purged {
                before: before_text.clone(),
                through_seq: head,
                by: self.by.clone(),
                ..Purged::default()
            };
            let mut room = IDS_PER_EVENT;
            for (list, src) in [
                (
                    &mut p.deliveries,
                    &mut dl as &mut dyn Iterator<Item = String>,
                ),
                (&mut p.notifications, &mut nl),
                (&mut p.tasks, &mut tl),
            ] {
                while room > 0 {
                    let Some(id) = src.next() else { break };
                    list.push(id);
                    room -= 1;
                }
            }
            if room == IDS_PER_EVENT {
                break;
            }
            let v = serde_json::to_value(&p).map_err(se)?;
            events.push(
                NewEvent::new(None, Stream::Retention, "", EventType::RetentionPurged, &v)
                    .map_err(se)?,
            );
        }
        rep.events = events.len();
        Ok(Decided::new(rep, events))
    }
}

/// What one run purged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub before_us: i64,
    pub through_seq: u64,
    pub deliveries: usize,
    pub notifications: usize,
    pub tasks: usize,
    /// `retention.purged` events appended.
    pub events: usize,
    /// The limit was reached: there may be more to purge.
    pub more: bool,
}

/// A read of the log (not the models) failed.
fn log_st(e: StorageError) -> CommandError {
    CommandError::Storage(e)
}

fn se(e: impl std::error::Error + Send + Sync + 'static) -> CommandError {
    CommandError::Models(StorageError::of(e))
}

/// Drop the log's events older than the window (spec section 13, `compact_log`): every
/// projection first stores a snapshot at the head, and no event a live cursor still needs
/// goes. At most [`tidemark_log::COMPACT_MAX`] events per command: run it again while
/// it reports `more`. Answers what it dropped.
#[derive(Debug, Clone)]
pub struct Compact {
    pub window_ms: u64,
}

impl Sealed for Compact {}
impl Command for Compact {
    type Answer = CompactReport;

    const COMPACTION: Option<fn(&mut CompactReport) -> &mut CompactReport> = Some(the_report);

    fn name(&self) -> &'static str {
        "retention.compact"
    }

    /// Decide a compaction: the cut, and — when there is something to drop — every projection's
    /// snapshot at the head, written in `txn` (the decider commits it, durably, before it asks
    /// the log to drop the events: [`crate::decider`]). The report's `removed`, `first_seq` and
    /// `more` are filled in from the log's answer.
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<CompactReport>, CommandError> {
        let before = round
            .now_us
            .saturating_sub((self.window_ms as i64).saturating_mul(1_000));
        let window_cut = round.log.last_before(before).map_err(log_st)?;
        let cut = pinned_cut(txn, round.log, before, window_cut)?;
        let first = round.log.first_seq().map_err(log_st)?;
        let rep = CompactReport {
            window_cut,
            cut,
            first_seq: first,
            ..CompactReport::default()
        };
        if cut < first {
            return Ok(Decided::new(rep, Vec::new()));
        }
        // Every projection is at the head here: their snapshots are at or above any cut.
        txn.snapshot_all()?;
        Ok(Decided::new(rep, Vec::new()))
    }
}

/// A compaction's answer is the report the log's answer completes.
fn the_report(r: &mut CompactReport) -> &mut CompactReport {
    r
}

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// The seq the window alone would cut at (the last event older than the window).
    pub window_cut: u64,
    /// The seq the cut stopped at: the window's, or lower where a cursor pins events.
    pub cut: u64,
    pub removed: u64,
    /// The first seq the log now holds.
    pub first_seq: u64,
    pub more: bool,
}

/// A cursor pins the events it follows (its stream, and its subject when not empty) after its
/// position, unless it made no progress for the window or belongs to a deleted subscription.
fn pinned_cut(
    txn: &ModelsTxn,
    log: &dyn super::LogReads,
    before: i64,
    mut cut: u64,
) -> Result<u64, CommandError> {
    let mut bt = bridges::View::new(txn)?;
    let mut live: Vec<Cursor> = Vec::new();
    for c in cursors::View::new(txn)?.all()? {
        if c.updated_at_us.is_none_or(|u| u < before) {
            continue;
        }
        if let Some(sub) =
            tidemark_projections::names::ids::subscription_of_consumer(&c.consumer_id)
        {
            let active = bt.row(sub)?.is_some_and(|s| s.active);
            if !active {
                continue;
            }
        }
        live.push(c);
    }
    for c in live {
        if c.last_sequence >= cut {
            continue;
        }
        if let Some(next) = log
            .next_of(&c.stream_name, &c.subject_id, c.last_sequence)
            .map_err(log_st)?
        {
            cut = cut.min(next - 1);
        }
    }
    Ok(cut)
}
