//! Retention (spec section 13): what has been done with for `window` leaves the read models.
//! The command decides at the head, where every model is current: notifications (dashboard-only
//! ones too) whose deliveries are all terminal and unchanged for the window, with those
//! deliveries; terminal tasks unchanged for the window that no bridge subscription and no
//! live cursor on `task_events` still follows. It writes the ids into `retention.purged`
//! events, which every projection folds, so a rebuild removes exactly the same rows. Nothing
//! pending is ever named; cursors, subscriptions, sources and settings are never purged.
//!
//! One command per file; the reports and error mappings both share are here.

mod compact;
mod purge;

pub use compact::Compact;
pub use purge::Purge;

use crate::error::CommandError;
use std::collections::BTreeSet;

use tidemark_log::{NewEvent, StorageError};
use tidemark_projections::ModelsTxn;
use tidemark_projections::cursors::{self, Cursor};
use tidemark_projections::deliveries::{self, Delivery};
use tidemark_projections::names::{EventType, Stream, TaskStatus};
use tidemark_projections::retention::{IDS_PER_EVENT, Purged};
use tidemark_projections::{bridges, notifications, tasks};

use super::{Command, DecideResult, Decided, Round};

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
/// Every tenant's cursors pin its shard's log (spec section 20), a removed tenant's too: the
/// home shard's tenants as its directory lists them, another shard's as `placed` names them.
fn pinned_cut(
    txn: &ModelsTxn,
    placed: Option<&[String]>,
    log: &dyn tidemark_log::Lookups,
    before: i64,
    mut cut: u64,
) -> Result<u64, CommandError> {
    let tenants: Vec<Option<String>> = match placed {
        Some(names) => names.iter().map(|n| Some(n.clone())).collect(),
        None => std::iter::once(None)
            .chain(
                tidemark_projections::tenants::View::new(txn)?
                    .all()?
                    .into_iter()
                    .map(|t| Some(t.name)),
            )
            .collect(),
    };
    for tenant in &tenants {
        cut = pinned_cut_of(txn, tenant.as_deref(), log, before, cut)?;
    }
    Ok(cut)
}

/// [`pinned_cut`] by `tenant`'s cursors.
fn pinned_cut_of(
    txn: &ModelsTxn,
    tenant: Option<&str>,
    log: &dyn tidemark_log::Lookups,
    before: i64,
    mut cut: u64,
) -> Result<u64, CommandError> {
    let bt = bridges::View::of_tenant(txn, tenant)?;
    let mut live: Vec<Cursor> = Vec::new();
    for c in cursors::View::of_tenant(txn, tenant)?.all()? {
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
            .next_of(tenant, &c.stream_name, &c.subject_id, c.last_sequence)
            .map_err(log_st)?
        {
            cut = cut.min(next - 1);
        }
    }
    Ok(cut)
}
