//! `Subscribe`: a task bridge subscription is created or changed.

use super::*;

/// Create (or re-create) subscription `id`; answers the row and whether it is new.
#[derive(Debug, Clone)]
pub struct Subscribe {
    pub id: SubscriptionId,
    pub target: Target,
}

impl Command for Subscribe {
    type Answer = Subscribed;

    /// Create (or re-create) a subscription. Answers the row and whether it is new: an active
    /// subscription with the same target is answered as it is (`false`); another target is a
    /// conflict.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
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
