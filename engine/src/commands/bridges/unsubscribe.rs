//! `Unsubscribe`: a task bridge subscription ends.

use super::*;

/// Delete the active subscription `id` of `task_id` (its cursor stays); answers the row
/// after it.
#[derive(Debug, Clone)]
pub struct Unsubscribe {
    pub task_id: TaskId,
    pub id: SubscriptionId,
}

impl Command for Unsubscribe {
    type Answer = Subscription;

    /// Delete an active subscription of `task_id` (its cursor stays).
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
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
