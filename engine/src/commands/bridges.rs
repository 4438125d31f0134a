//! The bridge family (spec section 6): subscribe and unsubscribe a task's bridge, and confirm
//! deliveries — inside the writer each confirmation re-reads its event and task, requires the
//! decision to still be deliver and the cursor to be where the caller saw it (or already there
//! with this delivery id), and advances the subscription's cursor.

use crate::error::{CommandError, RejectKind};
use std::collections::HashMap;

use tidemark_log::{NewEvent, StorageError};
use tidemark_projections::bridges::{
    self, BridgeEvent, Decision, NAME, ROWS, Subscription, Target,
};
use tidemark_projections::cursors::Cursor;
use tidemark_projections::framework::TxnTables;
use tidemark_projections::names::{Stream, ids};
use tidemark_projections::tasks::{self, Task};

use crate::commands::Outcome;
use crate::commands::cursors::{Advance, advance_from, get_in};
use crate::store::WriteTransaction;

/// A command of the bridge family.
#[derive(Debug, Clone)]
pub enum BridgeCommand {
    /// Create (or re-create) subscription `id`.
    Subscribe { id: String, target: Target },
    /// Delete the active subscription `id` of `task_id` (its cursor stays).
    Unsubscribe { task_id: String, id: String },
    /// Confirm deliveries; each is answered on its own.
    Confirm(Vec<Confirmation>),
}

pub(crate) fn run(
    txn: &WriteTransaction,
    round: &crate::decider::Round<'_>,
    cmd: BridgeCommand,
) -> Result<(Outcome, Vec<NewEvent>), CommandError> {
    let now_us = round.now_us;
    Ok(match cmd {
        BridgeCommand::Subscribe { id, target } => {
            let ((row, created), ev) = subscribe(txn, now_us, &id, target)?;
            (Outcome::Subscription { row, created }, ev)
        }
        BridgeCommand::Unsubscribe { task_id, id } => {
            let (row, ev) = unsubscribe(txn, now_us, &task_id, &id)?;
            (
                Outcome::Subscription {
                    row,
                    created: false,
                },
                ev,
            )
        }
        BridgeCommand::Confirm(items) => {
            let mut moved = HashMap::new();
            let mut events = Vec::new();
            let mut out = Vec::with_capacity(items.len());
            for c in &items {
                match confirm_in(txn, round, c, &mut moved) {
                    Ok((cur, evs)) => {
                        events.extend(evs);
                        out.push(Ok(cur));
                    }
                    Err(e @ CommandError::Rejected { .. }) => out.push(Err(e)),
                    Err(e) => return Err(e),
                }
            }
            (Outcome::Confirmed(out), events)
        }
    })
}

fn bridge_event(kind: &str, id: &str, b: &BridgeEvent) -> Result<NewEvent, CommandError> {
    let v = serde_json::to_value(b).map_err(|e| CommandError::Storage(StorageError::of(e)))?;
    NewEvent::new(None, Stream::Bridges, id, format!("bridge.{kind}"), &v)
        .map_err(CommandError::invalid_event)
}

fn row_in(txn: &WriteTransaction, id: &str) -> Result<Option<Subscription>, CommandError> {
    let mut t = TxnTables::new(txn, NAME).map_err(CommandError::Storage)?;
    t.get_val(ROWS, id.as_bytes())
        .map_err(CommandError::Storage)
}

/// Create (or re-create) a subscription. Answers the row and whether it is new: an active
/// subscription with the same target is answered as it is (`false`); another target is a
/// conflict.
fn subscribe(
    txn: &WriteTransaction,
    now_us: i64,
    id: &str,
    target: Target,
) -> Result<((Subscription, bool), Vec<NewEvent>), CommandError> {
    if let Some(cur) = row_in(txn, id)?
        && cur.active
    {
        if cur.target == target {
            return Ok(((cur, false), Vec::new()));
        }
        return Err(CommandError::rejected(
            RejectKind::Conflict,
            "subscription_conflict",
            format!("subscription {id:?} exists with another target"),
        ));
    }
    let created = row_in(txn, id)?.map(|o| o.created_at_us).unwrap_or(now_us);
    let b = BridgeEvent {
        target: Some(target.clone()),
        at_us: now_us,
    };
    let row = Subscription {
        subscription_id: id.to_owned(),
        target,
        active: true,
        created_at_us: created,
        updated_at_us: now_us,
    };
    Ok(((row, true), vec![bridge_event("subscribed", id, &b)?]))
}

/// Delete an active subscription of `task_id` (its cursor stays).
fn unsubscribe(
    txn: &WriteTransaction,
    now_us: i64,
    task_id: &str,
    id: &str,
) -> Result<(Subscription, Vec<NewEvent>), CommandError> {
    let mut row = row_in(txn, id)?
        .filter(|r| r.active && r.target.task_id == task_id)
        .ok_or_else(|| {
            CommandError::rejected(
                RejectKind::NotFound,
                "subscription_not_found",
                format!("no subscription {id:?} on task {task_id:?}"),
            )
        })?;
    row.active = false;
    row.updated_at_us = now_us;
    let b = BridgeEvent {
        target: None,
        at_us: now_us,
    };
    Ok((row, vec![bridge_event("unsubscribed", id, &b)?]))
}

/// One confirmation: the subscription (id, task), the delivery's seq, and the cursor the
/// caller saw (compare-and-swap), if any.
#[derive(Debug, Clone)]
pub struct Confirmation {
    pub subscription_id: String,
    pub task_id: String,
    pub seq: u64,
    pub expected: Option<u64>,
}

/// Check and record one confirmation inside the writer. `cursors` holds the cursors moved
/// earlier in the same command (they are not in the tables until the command's events fold).
fn confirm_in(
    txn: &WriteTransaction,
    round: &crate::decider::Round<'_>,
    c: &Confirmation,
    moved: &mut HashMap<String, Cursor>,
) -> Result<(Cursor, Vec<NewEvent>), CommandError> {
    let consumer = ids::bridge_consumer(&c.subscription_id);
    let delivery_id = ids::bridge_delivery(&c.subscription_id, c.seq);
    let task_id = &c.task_id;
    let cur = match moved.get(&consumer) {
        Some(cur) => cur.clone(),
        None => get_in(txn, &consumer, Stream::TaskEvents.as_str(), task_id)?,
    };
    if cur.last_sequence == c.seq && cur.last_delivery_id.as_deref() == Some(&delivery_id) {
        return Ok((cur, Vec::new()));
    }
    let now_us = round.now_us;
    let ev = round
        .log
        .get(c.seq)
        .map_err(|e| CommandError::Storage(StorageError::of(e)))?
        .filter(|e| e.stream == Stream::TaskEvents && e.subject == *task_id)
        .ok_or_else(|| {
            CommandError::rejected(
                RejectKind::NotFound,
                "delivery_not_found",
                format!("{delivery_id} names no event of task {task_id:?}"),
            )
        })?;
    let mut t = TxnTables::new(txn, tasks::NAME).map_err(CommandError::Storage)?;
    let task: Option<Task> = t
        .get_val("rows", task_id.as_bytes())
        .map_err(CommandError::Storage)?;
    let (decision, reason) = bridges::decide(task.as_ref(), &ev);
    if decision != Decision::Deliver {
        return Err(CommandError::rejected(
            RejectKind::Conflict,
            "not_deliverable",
            format!("{delivery_id} is no longer deliverable: {reason}"),
        ));
    }
    if c.seq <= cur.last_sequence {
        return Err(CommandError::rejected(
            RejectKind::Conflict,
            "non_monotonic_cursor",
            format!("{delivery_id} is behind the cursor ({})", cur.last_sequence),
        ));
    }
    let (next, events) = advance_from(
        &cur,
        now_us,
        &Advance {
            consumer_id: consumer.clone(),
            stream_name: Stream::TaskEvents.into(),
            subject_id: task_id.clone(),
            last_sequence: c.seq,
            delivery_id,
            expected_sequence: c.expected,
        },
    )?;
    moved.insert(consumer, next.clone());
    Ok((next, events))
}
