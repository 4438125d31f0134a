//! `Operator`: an operator retries, discards or resends one delivery.

use super::*;

/// An operator retries or discards a parked delivery, or resends a sent one; answers the row
/// after it.
#[derive(Debug, Clone)]
pub struct Operator {
    pub id: DeliveryId,
    pub action: OperatorAction,
    /// The token's name; `None` in open mode.
    pub by: Option<String>,
    pub reason: Option<String>,
}

impl Command for Operator {
    type Answer = Delivery;

    /// Operator action on a parked delivery: `retried` (back to queued with attempts 0) or
    /// `discarded`.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let (now_us, action, by, reason) = (
            round.now_us,
            self.action,
            self.by.as_deref(),
            self.reason.clone(),
        );
        let id = self.id.as_str();
        let st = d::View::new(txn)?;
        let mut row = st.row(id)?.ok_or_else(|| not_found(id))?;
        let kind = action.transition();
        if !row.allows(kind) {
            let verb = match action {
                OperatorAction::Retry => "retry",
                OperatorAction::Discard => "discard",
                OperatorAction::Resend => "resend",
            };
            return Err(illegal(&row, verb));
        }
        let c = Change {
            at_us: now_us,
            by: Some(by.map(str::to_owned)),
            reason,
            ..Change::default()
        };
        transition(&mut row, kind, &c, 0);
        Ok(Decided::new(row, vec![event(kind, id, &c)?]))
    }
}

/// What an operator does to a delivery: retry or discard a parked one, resend a sent one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    Retry,
    Discard,
    Resend,
}

impl OperatorAction {
    /// The transition it records (`delivery.retried` / `delivery.discarded`).
    pub fn transition(self) -> DeliveryTransition {
        match self {
            OperatorAction::Retry => DeliveryTransition::Retried,
            OperatorAction::Discard => DeliveryTransition::Discarded,
            OperatorAction::Resend => DeliveryTransition::Resent,
        }
    }

    /// The name of its transition (`retried` / `discarded`), for metrics.
    pub fn kind(self) -> &'static str {
        self.transition().as_str()
    }
}
