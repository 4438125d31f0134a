//! The bridge family (spec section 6): subscribe and unsubscribe a task's bridge, and confirm
//! deliveries — inside the writer each confirmation re-reads its event and task, requires the
//! decision to still be deliver and the cursor to be where the caller saw it (or already there
//! with this delivery id), and advances the subscription's cursor.
//!
//! One command per file; what several share (a confirmation, the events, the row) is here.

mod confirm;
mod confirm_one;
mod subscribe;
mod unsubscribe;

pub use confirm::Confirm;
pub use confirm_one::ConfirmOne;
pub use subscribe::Subscribe;
pub use unsubscribe::Unsubscribe;

use crate::error::{CommandError, Rejection};
use std::collections::HashMap;

use tidemark_log::{NewEvent, StorageError};
use tidemark_projections::bridges::{self, BridgeEvent, Decision, Subscription, Target};
use tidemark_projections::cursors::Cursor;
use tidemark_projections::names::{Stream, ids};
use tidemark_projections::tasks;
use tidemark_projections::tasks::Task;

use super::{Command, DecideResult, Decided, Round};
use crate::commands::cursors::{Advance, get_in};
use crate::commands::outbox::bridge_confirmed;
use tidemark_projections::ModelsTxn;
pub use tidemark_projections::ids::{SubscriptionId, TaskId};

/// What [`Subscribe`] answers.
#[derive(Debug, Clone)]
pub struct Subscribed {
    pub row: Subscription,
    /// It is new (an active subscription with the same target is answered as it is).
    pub created: bool,
}

/// One item of a confirmation: its refusal is its answer, and what it records joins
/// `events`.
fn confirm_item(
    txn: &ModelsTxn,
    round: &Round<'_>,
    c: &Confirmation,
    moved: &mut HashMap<String, Cursor>,
    events: &mut Vec<NewEvent>,
) -> Result<Result<Cursor, CommandError>, CommandError> {
    match confirm_in(txn, round, c, moved) {
        Ok((cur, evs)) => {
            events.extend(evs);
            Ok(Ok(cur))
        }
        Err(e @ CommandError::Rejected { .. }) => Ok(Err(e)),
        Err(e) => Err(e),
    }
}

fn bridge_event(kind: &str, id: &str, b: &BridgeEvent) -> Result<NewEvent, CommandError> {
    let v = serde_json::to_value(b).map_err(|e| CommandError::Models(StorageError::of(e)))?;
    NewEvent::new(None, Stream::Bridges, id, format!("bridge.{kind}"), &v)
        .map_err(CommandError::invalid_event)
}

fn row_in(txn: &ModelsTxn, id: &str) -> Result<Option<Subscription>, CommandError> {
    Ok(bridges::View::new(txn)?.row(id)?)
}

/// One confirmation: the subscription (id, task), the delivery's seq, and the cursor the
/// caller saw (compare-and-swap), if any.
#[derive(Debug, Clone)]
pub struct Confirmation {
    pub subscription_id: SubscriptionId,
    pub task_id: TaskId,
    pub seq: u64,
    pub expected: Option<u64>,
}

/// Check and record one confirmation inside the writer. `cursors` holds the cursors moved
/// earlier in the same command (they are not in the tables until the command's events fold).
fn confirm_in(
    txn: &ModelsTxn,
    round: &Round<'_>,
    c: &Confirmation,
    moved: &mut HashMap<String, Cursor>,
) -> Result<(Cursor, Vec<NewEvent>), CommandError> {
    let consumer = ids::bridge_consumer(c.subscription_id.as_str());
    let delivery_id = ids::bridge_delivery(c.subscription_id.as_str(), c.seq);
    let task_id = c.task_id.as_str();
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
        .filter(|e| Stream::parse(&e.stream) == Some(Stream::TaskEvents) && e.subject == *task_id)
        .ok_or_else(|| {
            CommandError::rejected(
                Rejection::DeliveryNotFound,
                format!("{delivery_id} names no event of task {task_id:?}"),
            )
        })?;
    let task: Option<Task> = tasks::View::new(txn)?.row(task_id)?;
    let (decision, reason) = bridges::decide(task.as_ref(), &ev);
    if decision != Decision::Deliver {
        return Err(CommandError::rejected(
            Rejection::NotDeliverable,
            format!("{delivery_id} is no longer deliverable: {reason}"),
        ));
    }
    if c.seq <= cur.last_sequence {
        return Err(CommandError::rejected(
            Rejection::NonMonotonicCursor,
            format!("{delivery_id} is behind the cursor ({})", cur.last_sequence),
        ));
    }
    let (next, events) = Advance {
        consumer_id: consumer.clone(),
        stream_name: Stream::TaskEvents.into(),
        subject_id: task_id.to_owned(),
        last_sequence: c.seq,
        delivery_id,
        expected_sequence: c.expected,
    }
    .decide_on(&cur, now_us)?;
    // A confirmed webhook POST closes its endpoint's open circuit (once per subscription in a
    // command: a later item of the same one finds it moved already).
    let mut events = events;
    if moved.insert(consumer, next.clone()).is_none()
        && let Some(ev) = bridge_confirmed(txn, c.subscription_id.as_str(), now_us)?
    {
        events.push(ev);
    }
    Ok((next, events))
}
