//! What a bridge's acks mean before they are confirmed: the planner that matches delivery ids
//! to each subscription's pending deliveries (I5: nothing deliverable is skipped), and a pull
//! bridge's pending envelopes computed from the log.

use std::collections::HashMap;
use tidemark_engine::{CommandError, Rejection};
use tidemark_projections::ids::{BridgeId, SubscriptionId};

use serde_json::Value;
use tidemark_engine::Engine;
use tidemark_engine::commands::Confirmation;
use tidemark_log::StorageError;
use tidemark_projections::bridges::{self, BridgeSink, Decision};
use tidemark_projections::names::ids;

use super::scan;

/// A subscription's pending deliveries as a batch of acks consumes them.
struct Plan {
    cursor: u64,
    /// Seqs the subscription delivers next, in order, up to its first mismatch.
    deliverable: Vec<u64>,
    /// How many of them this batch has confirmed so far.
    taken: usize,
}

impl Plan {
    /// Judge an ack of `seq`, the batch's acks of this subscription taken in order: `None`
    /// when it is not the next pending delivery (refused); else the confirmation's
    /// compare-and-swap, `Some(Some(cursor))` on the position it moves the cursor from, or
    /// `Some(None)` for a replay of the ack that put the cursor where it is (confirmed again,
    /// which moves nothing).
    fn take(&mut self, seq: u64) -> Option<Option<u64>> {
        if seq > 0 && seq == self.cursor && self.taken == 0 {
            return Some(None);
        }
        if self.deliverable.get(self.taken) != Some(&seq) {
            return None;
        }
        let from = match self.taken {
            0 => self.cursor,
            n => self.deliverable[n - 1],
        };
        self.taken += 1;
        Some(Some(from))
    }
}

fn refused(code: Rejection, detail: String) -> CommandError {
    CommandError::rejected(code, detail)
}

/// Judge each delivery id acked to `bridge_id` against its subscription's pending deliveries
/// (blocking): the confirmation to make, or why it is refused (`delivery_not_found`,
/// `foreign_delivery`, `not_pending`). Per subscription the ids must follow its deliverable
/// seqs in order; an id already confirmed is a replay (confirmed again without a
/// compare-and-swap, which answers the cursor as it is).
pub fn plan_acks(
    engine: &Engine,
    bridge_id: &BridgeId,
    ids: &[String],
) -> Result<Vec<Result<Confirmation, CommandError>>, StorageError> {
    let not_found = |id: &str| refused(Rejection::DeliveryNotFound, format!("no delivery {id:?}"));
    let mut plans: HashMap<SubscriptionId, Plan> = HashMap::new();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let Some((sub_id, seq)) = ids::parse_bridge_delivery(id) else {
            out.push(Err(not_found(id)));
            continue;
        };
        let sub_id = SubscriptionId::new(sub_id);
        let Some(sub) = engine.read().subscription(&sub_id)?.filter(|s| s.active) else {
            out.push(Err(not_found(id)));
            continue;
        };
        if sub.target.bridge_id != *bridge_id {
            let why = format!("{id:?} belongs to another bridge");
            out.push(Err(refused(Rejection::ForeignDelivery, why)));
            continue;
        }
        if !plans.contains_key(&sub_id) {
            // Past the first deliverable only when the batch holds more ids of it.
            let prefix = ids::bridge_delivery_prefix(sub_id.as_str());
            let more = ids.iter().filter(|i| i.starts_with(&prefix)).count() > 1;
            let scan = scan(engine, &sub, more)?;
            let deliverable = scan
                .candidates
                .iter()
                .take_while(|c| c.decision != Decision::Mismatch)
                .filter(|c| c.decision == Decision::Deliver)
                .map(|c| c.seq)
                .collect();
            let plan = Plan {
                cursor: scan.cursor.last_sequence,
                deliverable,
                taken: 0,
            };
            plans.insert(sub_id.clone(), plan);
        }
        let plan = plans.get_mut(&sub_id).expect("inserted above");
        let Some(expected) = plan.take(seq) else {
            let why = format!(
                "{id:?} is not the subscription's next pending delivery (cursor at {})",
                plan.cursor
            );
            out.push(Err(refused(Rejection::NotPending, why)));
            continue;
        };
        out.push(Ok(Confirmation {
            subscription_id: sub_id,
            task_id: sub.target.task_id.clone(),
            seq,
            expected,
        }));
    }
    Ok(out)
}

/// The envelopes `bridge_id`'s pull subscriptions have pending, computed from the log
/// (blocking; the notifier's cache answers once it has looked at everything).
pub fn pending_for_bridge(
    engine: &Engine,
    bridge_id: &BridgeId,
) -> Result<Vec<Value>, StorageError> {
    let mut out = Vec::new();
    for s in engine.read().bridge_subscriptions(bridge_id)? {
        if s.target.sink != BridgeSink::Pull {
            continue;
        }
        let scan = scan(engine, &s, false)?;
        if let Some(ev) = &scan.deliver {
            out.push(bridges::envelope(&s, ev));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::Plan;

    fn plan(cursor: u64, deliverable: &[u64]) -> Plan {
        Plan {
            cursor,
            deliverable: deliverable.to_vec(),
            taken: 0,
        }
    }

    #[test]
    fn acks_are_taken_in_the_subscriptions_order_and_a_replay_moves_nothing() {
        // In order: each moves the cursor from where the one before left it.
        let mut p = plan(5, &[7, 9, 12]);
        assert_eq!(p.take(7), Some(Some(5)));
        assert_eq!(p.take(9), Some(Some(7)));
        assert_eq!(p.take(12), Some(Some(9)));
        // Past the deliverable ones, or the same twice: not pending.
        assert_eq!(p.take(13), None);
        assert_eq!(p.take(12), None);

        // Out of order, or skipping one: refused, and it takes nothing.
        let mut p = plan(5, &[7, 9]);
        assert_eq!(p.take(9), None);
        assert_eq!(p.take(6), None);
        assert_eq!(p.take(7), Some(Some(5)));

        // The ack that put the cursor where it is, first in the batch: a replay.
        let mut p = plan(5, &[7]);
        assert_eq!(p.take(5), Some(None));
        assert_eq!(p.take(5), Some(None));
        assert_eq!(p.take(7), Some(Some(5)));
        // Once the batch has moved on, the old position is no replay.
        assert_eq!(p.take(5), None);

        // A cursor at zero has nothing to replay; nothing deliverable, nothing pending.
        let mut p = plan(0, &[]);
        assert_eq!(p.take(0), None);
        assert_eq!(p.take(1), None);
    }
}
