//! Each delivering route's circuit (spec section 17), decided by the commands that report and
//! take its attempts: a failure that makes the route's `circuit.failures` in a row opens it
//! (`endpoint.circuit_opened`, the probe after `circuit.cool_down`); while it is open its
//! deliveries wait out of the claim's indexes, and a claim takes one of them as the probe once
//! the cool-down has passed (`endpoint.circuit_probed`, no other before the probe's lease
//! ends); the probe's failure opens it again, any success closes it
//! (`endpoint.circuit_closed`). Each event is appended on the condition that the route's
//! endpoint has no newer event, so two deciders never open or probe it twice.
//!
//! One command per file; the circuit decisions the outbox commands share are here.

mod bridge_failed;
mod resolve_endpoints;
mod switch_endpoint;

pub use bridge_failed::BridgeFailed;
pub use resolve_endpoints::ResolveEndpoints;
pub use switch_endpoint::SwitchEndpoint;

use std::collections::HashSet;

use tidemark_log::NewEvent;
use tidemark_projections::ModelsTxn;
use tidemark_projections::bridges;
use tidemark_projections::deliveries::{self as d, Change, Delivery};
use tidemark_projections::endpoints::{Endpoint, EndpointChange, delivering};
use tidemark_projections::names::{EventType, Sink, Stream, ids};
use tidemark_projections::routing::{CircuitPolicy, RoutingSettings};

use crate::commands::{Command, DecideResult, Decided, Round};
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
