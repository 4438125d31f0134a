//! `SwitchEndpoint`: an operator disables or enables an endpoint.

use super::*;

/// An operator disables (`enable: false`) or enables a delivering route's endpoint
/// (`endpoint.disabled` / `endpoint.enabled`, with the reason and who): a disabled endpoint's
/// deliveries wait; enabling it lets them go and closes its circuit (the operator says it
/// works). Switching it to the state it is in records nothing. Answers the endpoint after, with
/// its circuit's policy.
#[derive(Debug, Clone)]
pub struct SwitchEndpoint {
    pub route: String,
    pub enable: bool,
    pub reason: String,
    pub by: Option<String>,
}

impl Command for SwitchEndpoint {
    type Answer = (Endpoint, CircuitPolicy);

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let route = self.route.as_str();
        let not_found = || {
            CommandError::rejected(
                Rejection::EndpointNotFound,
                format!(
                    "no endpoint {route:?}: endpoints are the routes of the email and webhook \
                     sinks, and bridge:<subscription_id> for a webhook subscription"
                ),
            )
        };
        let st = d::View::new(txn)?;
        let settings = st.settings_at(u64::MAX)?;
        let policy = settings
            .routes
            .get(route)
            .map_or(settings.circuit, |p| p.circuit);
        let (sink, held) = match ids::subscription_of_endpoint(route) {
            // A bridge webhook subscription's endpoint (an active one).
            Some(id) => {
                let b = bridges::View::new(txn)?;
                match b.row(id)? {
                    Some(s) if s.active && s.target.sink.is_webhook() => {
                        (Some(Sink::Webhook), b.endpoint(id)?)
                    }
                    _ => return Err(not_found()),
                }
            }
            None => {
                let sink = settings
                    .routes
                    .get(route)
                    .and_then(|p| p.sink)
                    .filter(|s| delivering(Some(*s)));
                (sink, st.endpoint(route)?)
            }
        };
        let mut e = match (held, sink) {
            (Some(e), _) => e,
            (None, Some(sink)) => Endpoint::new(route, Some(sink)),
            (None, None) => return Err(not_found()),
        };
        let (ty, changes) = if self.enable {
            // An enable switches what an operator or the circuit holds, not an `env:` that a
            // node lacks (only a node that resolves it says so).
            (
                EventType::EndpointEnabled,
                e.disabled.is_some() || e.open.is_some(),
            )
        } else {
            (EventType::EndpointDisabled, e.disabled.is_none())
        };
        if !changes {
            return Ok(Decided::new((e, policy), Vec::new()));
        }
        let change = EndpointChange {
            sink: sink.or(e.sink),
            at_us: round.now_us,
            reason: Some(self.reason.clone()),
            by: self.by.clone(),
            ..EndpointChange::default()
        };
        e.apply(ty, &change);
        let ev = endpoint_event(ty, route, &change)?;
        Ok(Decided::new((e, policy), vec![ev]))
    }
}
