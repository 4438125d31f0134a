//! Each delivering route's circuit (spec section 17), decided by the commands that report and
//! take its attempts: a failure that makes the route's `circuit.failures` in a row opens it
//! (`endpoint.circuit_opened`, the probe after `circuit.cool_down`); while it is open its
//! deliveries wait out of the claim's indexes, and a claim takes one of them as the probe once
//! the cool-down has passed (`endpoint.circuit_probed`, no other before the probe's lease
//! ends); the probe's failure opens it again, any success closes it
//! (`endpoint.circuit_closed`). Each event is appended on the condition that the route's
//! endpoint has no newer event, so two deciders never open or probe it twice.

use std::collections::HashSet;

use tidemark_log::NewEvent;
use tidemark_projections::ModelsTxn;
use tidemark_projections::bridges;
use tidemark_projections::deliveries::{self as d, Change, Delivery};
use tidemark_projections::endpoints::{Endpoint, EndpointChange, delivering};
use tidemark_projections::names::{EventType, Sink, Stream, ids};
use tidemark_projections::routing::{CircuitPolicy, RoutingSettings};

use crate::commands::sealed::Sealed;
use crate::commands::{Command, Decided, Round};
use crate::error::{CommandError, Rejection};
use tidemark_log::StorageError;

/// The `endpoint.*` event of type `ty` on endpoint `route` (a route's name, or a bridge
/// webhook subscription's `bridge:<id>`).
pub(crate) fn endpoint_event(
    ty: EventType,
    route: &str,
    c: &EndpointChange,
) -> Result<NewEvent, CommandError> {
    let v = serde_json::to_value(c).map_err(|e| CommandError::Models(StorageError::of(e)))?;
    NewEvent::new(None, Stream::Endpoints, route, ty.as_str(), &v)
        .map_err(CommandError::invalid_event)
}

/// After `row`'s failed attempt `c`: its circuit opens when this failure makes the route's
/// `circuit.failures` in a row, or opens again when `row` was the probe.
pub(crate) fn after_failure(
    st: &mut d::View<'_>,
    row: &Delivery,
    c: &Change,
    settings: &RoutingSettings,
    events: &mut Vec<NewEvent>,
) -> Result<(), CommandError> {
    let code = c.error_code.as_deref().unwrap_or("failed");
    after_attempt(st, row, c.at_us, Some(code), settings, events)
}

/// After `row` was sent at `at_us`: an open circuit of its route closes (once per command:
/// `closed` holds the routes it closed).
pub(crate) fn after_success(
    st: &mut d::View<'_>,
    row: &Delivery,
    at_us: i64,
    closed: &mut HashSet<String>,
    events: &mut Vec<NewEvent>,
) -> Result<(), CommandError> {
    if !delivering(row.sink) || closed.contains(&row.route) {
        return Ok(());
    }
    let before = events.len();
    // A success closes whatever the policy: the default serves.
    after_attempt(st, row, at_us, None, &RoutingSettings::default(), events)?;
    if events.len() > before {
        closed.insert(row.route.clone());
    }
    Ok(())
}

/// The circuit's event after `row`'s attempt (`failure`: its code), decided on its route's
/// endpoint with this attempt counted ([`Endpoint::after_attempt`]).
fn after_attempt(
    st: &mut d::View<'_>,
    row: &Delivery,
    at_us: i64,
    failure: Option<&str>,
    settings: &RoutingSettings,
    events: &mut Vec<NewEvent>,
) -> Result<(), CommandError> {
    let Some(sink) = row.sink.filter(|s| delivering(Some(*s))) else {
        return Ok(());
    };
    let mut e = st
        .endpoint(&row.route)?
        .unwrap_or_else(|| Endpoint::new(&row.route, Some(sink)));
    let was_probe = e
        .open
        .as_ref()
        .is_some_and(|o| o.probe.as_deref() == Some(row.id.as_str()));
    e.attempted(sink, at_us, failure);
    push(&e, row, failure, was_probe, settings, at_us, events)
}

fn push(
    e: &Endpoint,
    row: &Delivery,
    failure: Option<&str>,
    was_probe: bool,
    settings: &RoutingSettings,
    at_us: i64,
    events: &mut Vec<NewEvent>,
) -> Result<(), CommandError> {
    let policy = settings
        .routes
        .get(&row.route)
        .map_or(settings.circuit, |p| p.circuit);
    if let Some((ty, mut change)) = e.after_attempt(failure.is_none(), was_probe, policy, at_us) {
        if ty == EventType::EndpointCircuitClosed {
            change.delivery_id = Some(row.id.to_string());
        }
        events.push(endpoint_event(ty, &row.route, &change)?);
    }
    Ok(())
}

/// The open circuits of `sink` whose probe may go out by `now_us`: for each, the id of its
/// delivery of `sink` due first (the probe to take), if one is due. A circuit whose last probe
/// is still leased (its lease extended past the probe time) has no other probe.
pub(crate) fn probes(
    st: &mut d::View<'_>,
    sink: Sink,
    now_us: i64,
) -> Result<Vec<(String, String)>, CommandError> {
    if !delivering(Some(sink)) {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for e in st.probes_due(sink, now_us)? {
        let out_now = match e.open.as_ref().and_then(|o| o.probe.as_deref()) {
            Some(probe) => st.row(probe)?.is_some_and(|r| {
                r.status == tidemark_projections::names::DeliveryStatus::Leased
                    && r.lease_expires_at_us.is_some_and(|x| x > now_us)
            }),
            None => false,
        };
        if out_now {
            continue;
        }
        if let Some(id) = st.first_due_of_route(&e.route, sink, now_us)? {
            out.push((e.route, id));
        }
    }
    Ok(out)
}

/// The event recording that `row` went out as its route's probe, leased until
/// `lease_until_us` (no other probe before).
pub(crate) fn probed(
    row: &Delivery,
    now_us: i64,
    lease_until_us: i64,
) -> Result<NewEvent, CommandError> {
    endpoint_event(
        EventType::EndpointCircuitProbed,
        &row.route,
        &EndpointChange {
            sink: row.sink,
            at_us: now_us,
            delivery_id: Some(row.id.to_string()),
            probe_at_us: Some(lease_until_us),
            ..EndpointChange::default()
        },
    )
}

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

impl Sealed for BridgeFailed {}
impl Command for BridgeFailed {
    type Answer = Option<EventType>;

    fn name(&self) -> &'static str {
        "bridges.failed"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Option<EventType>>, CommandError> {
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

/// A bridge webhook subscription's POST confirmed (its cursor advanced in the same command): the
/// event that closes its endpoint's open circuit, if open (the rule the outbox's completions
/// use, which needs no policy). Decided in the confirmation itself, so a confirmed POST costs
/// no second command.
pub(crate) fn bridge_confirmed(
    txn: &ModelsTxn,
    subscription_id: &str,
    now_us: i64,
) -> Result<Option<NewEvent>, CommandError> {
    let Some(e) = bridges::View::new(txn)?.endpoint(subscription_id)? else {
        return Ok(None);
    };
    e.after_attempt(true, false, CircuitPolicy::default(), now_us)
        .map(|(ty, change)| endpoint_event(ty, &ids::bridge_endpoint(subscription_id), &change))
        .transpose()
}

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

impl Sealed for SwitchEndpoint {}
impl Command for SwitchEndpoint {
    type Answer = (Endpoint, CircuitPolicy);

    fn name(&self) -> &'static str {
        "outbox.switch_endpoint"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<(Endpoint, CircuitPolicy)>, CommandError> {
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
        let mut st = d::View::new(txn)?;
        let settings = st.settings_at(u64::MAX)?;
        let policy = settings
            .routes
            .get(route)
            .map_or(settings.circuit, |p| p.circuit);
        let (sink, held) = match ids::subscription_of_endpoint(route) {
            // A bridge webhook subscription's endpoint (an active one).
            Some(id) => {
                let mut b = bridges::View::new(txn)?;
                match b.row(id)? {
                    Some(s) if s.active && s.target.sink.kind == "webhook" => {
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

impl Sealed for ResolveEndpoints {}
impl Command for ResolveEndpoints {
    type Answer = Vec<(String, EventType)>;

    fn name(&self) -> &'static str {
        "outbox.resolve_endpoints"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Vec<(String, EventType)>>, CommandError> {
        let mut st = d::View::new(txn)?;
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
