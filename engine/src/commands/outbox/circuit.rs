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
use tidemark_projections::deliveries::endpoints::delivering;
use tidemark_projections::deliveries::{self as d, Change, Delivery, Endpoint, EndpointChange};
use tidemark_projections::names::{EventType, Sink, Stream};
use tidemark_projections::routing::RoutingSettings;

use crate::commands::sealed::Sealed;
use crate::commands::{Command, Decided, Round};
use crate::error::{CommandError, Rejection};
use tidemark_log::StorageError;

/// The `endpoint.*` event of type `ty` on route `route`.
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
    if !delivering(row.sink) {
        return Ok(());
    }
    let e = st.endpoint(&row.route)?.unwrap_or_default();
    if e.disabled.is_some() {
        return Ok(());
    }
    let policy = settings
        .routes
        .get(&row.route)
        .map(|p| p.circuit)
        .unwrap_or_default();
    let failures = e.consecutive_failures + 1;
    let opens = match &e.open {
        Some(o) => o.probe.as_deref() == Some(row.id.as_str()),
        None => failures >= u64::from(policy.failures),
    };
    if opens {
        let change = EndpointChange {
            sink: row.sink,
            at_us: c.at_us,
            failures: Some(failures),
            error_code: c.error_code.clone(),
            probe_at_us: Some(c.at_us.saturating_add(policy.cool_down_ms as i64 * 1_000)),
            ..EndpointChange::default()
        };
        events.push(endpoint_event(
            EventType::EndpointCircuitOpened,
            &row.route,
            &change,
        )?);
    }
    Ok(())
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
    if st.endpoint(&row.route)?.is_some_and(|e| e.open.is_some()) {
        let change = EndpointChange {
            sink: row.sink,
            at_us,
            delivery_id: Some(row.id.to_string()),
            ..EndpointChange::default()
        };
        events.push(endpoint_event(
            EventType::EndpointCircuitClosed,
            &row.route,
            &change,
        )?);
        closed.insert(row.route.clone());
    }
    Ok(())
}

/// The open circuits of `sink` whose probe may go out by `now_us`: for each, the id of its
/// delivery due first (the probe to take), if one is due.
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
        if let Some(id) = st.first_due_of_route(&e.route, now_us)? {
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

/// An operator disables (`enable: false`) or enables a delivering route's endpoint
/// (`endpoint.disabled` / `endpoint.enabled`, with the reason and who): a disabled endpoint's
/// deliveries wait; enabling it lets them go and closes its circuit (the operator says it
/// works). Switching it to the state it is in records nothing. Answers the endpoint after.
#[derive(Debug, Clone)]
pub struct SwitchEndpoint {
    pub route: String,
    pub enable: bool,
    pub reason: String,
    pub by: Option<String>,
}

impl Sealed for SwitchEndpoint {}
impl Command for SwitchEndpoint {
    type Answer = Endpoint;

    fn name(&self) -> &'static str {
        "outbox.switch_endpoint"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Endpoint>, CommandError> {
        let mut st = d::View::new(txn)?;
        let route = self.route.as_str();
        let sink = st
            .settings_at(u64::MAX)?
            .routes
            .get(route)
            .and_then(|p| p.sink)
            .filter(|s| delivering(Some(*s)));
        let mut e = match (st.endpoint(route)?, sink) {
            (Some(e), _) => e,
            (None, Some(sink)) => Endpoint::new(route, Some(sink)),
            (None, None) => {
                return Err(CommandError::rejected(
                    Rejection::EndpointNotFound,
                    format!(
                        "no delivering route {route:?}: endpoints are the routes of the email \
                         and webhook sinks"
                    ),
                ));
            }
        };
        let (ty, changes) = if self.enable {
            (EventType::EndpointEnabled, e.held())
        } else {
            (EventType::EndpointDisabled, e.disabled.is_none())
        };
        if !changes {
            return Ok(Decided::new(e, Vec::new()));
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
        Ok(Decided::new(e, vec![ev]))
    }
}
