//! `BridgeFailed`: a bridge webhook subscription attempt failed; its circuit counts it.

use super::*;

/// A bridge webhook subscription's POST failed, and the models have folded its
/// `cursor.failed`: the circuit's event, if it calls for one ([`Endpoint::after_attempt`] under
/// `[notifications.circuit]` as the log has it), appended on the condition that the endpoint
/// has no newer event (an operator's switch meanwhile wins). `was_probe`: the POST was the open
/// circuit's probe. Answers the event's type, if one was recorded. (A confirmed POST closes an
/// open circuit in its own confirmation: [`bridge_confirmed`].)
#[derive(Debug, Clone)]
pub struct BridgeFailed {
    pub subscription_id: String,
    pub was_probe: bool,
}

impl Command for BridgeFailed {
    type Answer = Option<EventType>;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let Some(e) = bridges::View::new(txn)?.endpoint(&self.subscription_id)? else {
            return Ok(Decided::new(None, Vec::new()));
        };
        let policy = d::View::new(txn)?.settings_at(u64::MAX)?.circuit;
        let Some((ty, change)) = e.after_attempt(false, self.was_probe, policy, round.now_us)
        else {
            return Ok(Decided::new(None, Vec::new()));
        };
        let name = ids::bridge_endpoint(&self.subscription_id);
        let ev = endpoint_event(ty, &name, &change)?;
        Ok(Decided::new(Some(ty), vec![ev]))
    }
}
