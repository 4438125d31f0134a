//! `ResolveEndpoints`: a node records which endpoints it cannot resolve (an `env:` unset) and which it now does.

use super::*;

/// What a node finds of the webhook routes managed through the API (spec section 17, "an
/// `env:` unset"): for each route, the `env:` references of its url and secret that this node
/// cannot read (empty: it resolves them all). A route a node cannot resolve is recorded
/// `endpoint.unresolved` (its deliveries wait, spending no attempt, listed `unresolved` in the
/// endpoints); one it resolves again, `endpoint.resolved`. A route already in the state found
/// records nothing. Answers the routes it changed, each with its new state.
#[derive(Debug, Clone)]
pub struct ResolveEndpoints {
    /// `(route, unset)`: `unset` names the variables this node lacks (`route.url = env:X`).
    pub found: Vec<(String, Vec<String>)>,
    /// The node that looked (its lease name), recorded as `by`.
    pub node: String,
}

impl Command for ResolveEndpoints {
    type Answer = Vec<(String, EventType)>;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let st = d::View::new(txn)?;
        let mut changed = Vec::new();
        let mut events = Vec::new();
        for (route, unset) in &self.found {
            let e = st.endpoint(route)?;
            let now_unresolved = e.as_ref().is_some_and(|e| e.unresolved.is_some());
            let ty = match (unset.is_empty(), now_unresolved) {
                (false, false) => EventType::EndpointUnresolved,
                (true, true) => EventType::EndpointResolved,
                _ => continue,
            };
            let change = EndpointChange {
                sink: Some(Sink::Webhook),
                at_us: round.now_us,
                reason: (!unset.is_empty()).then(|| unset.join(", ")),
                by: Some(self.node.clone()),
                ..EndpointChange::default()
            };
            events.push(endpoint_event(ty, route, &change)?);
            changed.push((route.clone(), ty));
        }
        Ok(Decided::new(changed, events))
    }
}
