//! The bridge family (spec section 6): subscribe and unsubscribe a task's bridge, and confirm
//! deliveries — inside the writer each confirmation re-reads its event and task, requires the
//! decision to still be deliver and the cursor to be where the caller saw it (or already there
//! with this delivery id), and advances the subscription's cursor.

use crate::error::{CommandError, Rejection};
use std::collections::HashMap;

use tidemark_log::{NewEvent, StorageError};
use tidemark_projections::bridges::{self, BridgeEvent, Decision, Subscription, Target};
use tidemark_projections::cursors::Cursor;
use tidemark_projections::names::{Stream, ids};
use tidemark_projections::tasks;
use tidemark_projections::tasks::Task;

use super::sealed::Sealed;
use super::{Command, Decided, Round};
use crate::commands::cursors::{Advance, get_in};
use crate::commands::outbox::bridge_confirmed;
use tidemark_projections::ModelsTxn;
pub use tidemark_projections::ids::{SubscriptionId, TaskId};

/// Create (or re-create) subscription `id`; answers the row and whether it is new.
#[derive(Debug, Clone)]
pub struct Subscribe {
    pub id: SubscriptionId,
    pub target: Target,
}

/// What [`Subscribe`] answers.
#[derive(Debug, Clone)]
pub struct Subscribed {
    pub row: Subscription,
    /// It is new (an active subscription with the same target is answered as it is).
    pub created: bool,
}

/// Delete the active subscription `id` of `task_id` (its cursor stays); answers the row
/// after it.
#[derive(Debug, Clone)]
pub struct Unsubscribe {
    pub task_id: TaskId,
    pub id: SubscriptionId,
}

/// Confirm deliveries; answers each on its own, in order: the cursor after it, or why it was
/// refused.
#[derive(Debug, Clone)]
pub struct Confirm(pub Vec<Confirmation>);

/// Confirm one delivery ([`Confirm`] of one); answers the cursor after it, or why it was
/// refused.
#[derive(Debug, Clone)]
pub struct ConfirmOne(pub Confirmation);

impl Sealed for Subscribe {}
impl Command for Subscribe {
    type Answer = Subscribed;

    fn name(&self) -> &'static str {
        "bridge.subscribe"
    }

    /// Create (or re-create) a subscription. Answers the row and whether it is new: an active
    /// subscription with the same target is answered as it is (`false`); another target is a
    /// conflict.
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Subscribed>, CommandError> {
        let (now_us, id, target) = (round.now_us, self.id.as_str(), &self.target);
        if let Some(cur) = row_in(txn, id)?
            && cur.active
        {
            if cur.target == *target {
                return Ok(Decided::new(
                    Subscribed {
                        row: cur,
                        created: false,
                    },
                    Vec::new(),
                ));
            }
            return Err(CommandError::rejected(
                Rejection::SubscriptionConflict,
                format!("subscription {id:?} exists with another target"),
            ));
        }
        let created = row_in(txn, id)?.map(|o| o.created_at_us).unwrap_or(now_us);
        let b = BridgeEvent {
            target: Some(target.clone()),
            at_us: now_us,
        };
        let row = Subscription {
            subscription_id: SubscriptionId::new(id),
            target: target.clone(),
            active: true,
            created_at_us: created,
            updated_at_us: now_us,
        };
        Ok(Decided::new(
            Subscribed { row, created: true },
            vec![bridge_event("subscribed", id, &b)?],
        ))
    }
}

impl Sealed for Unsubscribe {}
impl Command for Unsubscribe {
    type Answer = Subscription;

    fn name(&self) -> &'static str {
        "bridge.unsubscribe"
    }

    /// Delete an active subscription of `task_id` (its cursor stays).
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Subscription>, CommandError> {
        let (now_us, task_id, id) = (round.now_us, self.task_id.as_str(), self.id.as_str());
        let mut row = row_in(txn, id)?
            .filter(|r| r.active && r.target.task_id == task_id)
            .ok_or_else(|| {
                CommandError::rejected(
                    Rejection::SubscriptionNotFound,
                    format!("no subscription {id:?} on task {task_id:?}"),
                )
            })?;
        row.active = false;
        row.updated_at_us = now_us;
        let b = BridgeEvent {
            target: None,
            at_us: now_us,
        };
        Ok(Decided::new(
            row,
            vec![bridge_event("unsubscribed", id, &b)?],
        ))
    }
}

impl Sealed for Confirm {}
impl Command for Confirm {
    type Answer = Vec<Result<Cursor, CommandError>>;

    fn name(&self) -> &'static str {
        "bridge.confirm"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Self::Answer>, CommandError> {
        let mut moved = HashMap::new();
        let mut events = Vec::new();
        let mut out = Vec::with_capacity(self.0.len());
        for c in &self.0 {
            out.push(confirm_item(txn, round, c, &mut moved, &mut events)?);
        }
        Ok(Decided::new(out, events))
    }
}

impl Sealed for ConfirmOne {}
impl Command for ConfirmOne {
    type Answer = Result<Cursor, CommandError>;

    fn name(&self) -> &'static str {
        "bridge.confirm"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Self::Answer>, CommandError> {
        let mut events = Vec::new();
        let out = confirm_item(txn, round, &self.0, &mut HashMap::new(), &mut events)?;
        Ok(Decided::new(out, events))
    }
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
        .filter(|e| e.stream == Stream::TaskEvents && e.subject == *task_id)
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
