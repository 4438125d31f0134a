//! The endpoints (spec section 17): one health record per route whose sink tidemark delivers
//! itself (`email`, `webhook`), kept by the deliveries model beside the rows it counts, and
//! one per bridge webhook subscription (`bridge:<id>`), kept by the bridges model. The counts are folded from the deliveries' own `delivery.sent` and
//! `delivery.attempt_failed`; the circuit and the operator's switch from the `endpoints`
//! stream (`endpoint.circuit_opened` / `circuit_probed` / `circuit_closed`, decided by the
//! outbox commands; `endpoint.disabled` / `enabled`, an operator's). While a route is held
//! (its circuit open, or disabled) its due deliveries leave the claim's indexes (they wait,
//! spending no attempt) and stay in [`crate::deliveries::ROUTE_DUE`], where a probe is taken from and
//! from where they return when it closes.

use serde::{Deserialize, Serialize};

use crate::names::{EventType, Sink};

/// One delivering route's health and circuit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub route: String,
    /// The sink its deliveries go to (`None` until an attempt or an endpoint event names it).
    pub sink: Option<Sink>,
    /// Attempts that came to an outcome (sent or failed).
    pub attempts: u64,
    pub successes: u64,
    /// Failed attempts since the last success.
    pub consecutive_failures: u64,
    pub last_success_at_us: Option<i64>,
    pub last_failure_at_us: Option<i64>,
    /// The adapter's code of the last failure (`http_503`, `smtp_451`, …).
    pub last_failure_code: Option<String>,
    /// `Some` while the circuit is open.
    pub open: Option<Open>,
    /// `Some` while an operator has it disabled.
    pub disabled: Option<Switched>,
    /// The last operator's enable (kept for the record).
    pub enabled: Option<Switched>,
    /// `Some` while a node reported that it cannot resolve the route's `env:` url or secret
    /// (`reason` names the variables, `by` the node): its deliveries wait, spending no
    /// attempt, until a node that can resolve them says so (at its start, or a `PUT` of the
    /// route through it).
    pub unresolved: Option<Switched>,
}

/// An open circuit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    pub opened_at_us: i64,
    /// No probe is taken before this: the cool-down's end, or the lease's end of the probe in
    /// flight.
    pub probe_at_us: i64,
    /// The delivery out as the probe, if one is.
    pub probe: Option<String>,
}

/// An operator's disable or enable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Switched {
    pub at_us: i64,
    pub reason: String,
    pub by: Option<String>,
}

/// The payload of every `endpoint.*` event (each uses the fields it needs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointChange {
    pub sink: Option<Sink>,
    pub at_us: i64,
    /// `circuit_opened`: the consecutive failures that opened it; `circuit_probed` /
    /// `circuit_closed`: the probe's (or closing) delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
    /// `circuit_opened`: the cool-down's end; `circuit_probed`: the probe's lease end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_at_us: Option<i64>,
    /// `disabled` / `enabled`; `unresolved`: the `env:` references the node lacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `disabled` / `enabled`: the operator's token (`null` in open mode); `unresolved` /
    /// `resolved`: the node that found it so; `null` on the circuit's events, which tidemark
    /// decides.
    #[serde(default)]
    pub by: Option<String>,
}

impl Endpoint {
    /// A route with no attempt yet.
    pub fn new(route: &str, sink: Option<Sink>) -> Self {
        Endpoint {
            route: route.to_owned(),
            sink,
            ..Endpoint::default()
        }
    }

    /// `disabled` (an operator's), `unresolved` (an `env:` a node lacks), `open` (its
    /// circuit), `failing` (the last attempt failed, and every one since the last success),
    /// else `ok`.
    pub fn state(&self) -> &'static str {
        if self.disabled.is_some() {
            "disabled"
        } else if self.unresolved.is_some() {
            "unresolved"
        } else if self.open.is_some() {
            "open"
        } else if self.consecutive_failures > 0 {
            "failing"
        } else {
            "ok"
        }
    }

    /// Its deliveries wait: the circuit is open, an operator disabled it, or its `env:` is
    /// unresolved.
    pub fn held(&self) -> bool {
        self.disabled.is_some() || self.open.is_some() || self.unresolved.is_some()
    }

    /// Why its deliveries wait, as the API says it (`held_by`): `endpoint_disabled` (an
    /// operator's switch wins), `endpoint_unresolved` or `circuit_open`; `None` when they do
    /// not.
    pub fn held_by(&self) -> Option<&'static str> {
        if self.disabled.is_some() {
            Some("endpoint_disabled")
        } else if self.unresolved.is_some() {
            Some("endpoint_unresolved")
        } else {
            self.open.as_ref().map(|_| "circuit_open")
        }
    }

    /// When its next probe may go out: an open circuit's, never while it is disabled or
    /// unresolved.
    pub fn probe_at(&self) -> Option<i64> {
        match (&self.disabled, &self.unresolved, &self.open) {
            (None, None, Some(o)) => Some(o.probe_at_us),
            _ => None,
        }
    }

    /// An attempt's outcome, folded from its delivery's event.
    pub fn attempted(&mut self, sink: Sink, at_us: i64, failure: Option<&str>) {
        self.sink = Some(sink);
        self.attempts += 1;
        match failure {
            None => {
                self.successes += 1;
                self.consecutive_failures = 0;
                self.last_success_at_us = Some(at_us);
            }
            Some(code) => {
                self.consecutive_failures += 1;
                self.last_failure_at_us = Some(at_us);
                self.last_failure_code = Some(code.to_owned());
            }
        }
    }

    /// Fold an `endpoint.*` event; false for a type that is not one.
    pub fn apply(&mut self, ty: EventType, c: &EndpointChange) -> bool {
        if c.sink.is_some() {
            self.sink = c.sink;
        }
        match ty {
            EventType::EndpointCircuitOpened => {
                let opened_at_us = self.open.as_ref().map_or(c.at_us, |o| o.opened_at_us);
                self.open = Some(Open {
                    opened_at_us,
                    probe_at_us: c.probe_at_us.unwrap_or(c.at_us),
                    probe: None,
                });
            }
            EventType::EndpointCircuitProbed => {
                if let Some(o) = &mut self.open {
                    o.probe_at_us = c.probe_at_us.unwrap_or(c.at_us);
                    o.probe.clone_from(&c.delivery_id);
                }
            }
            EventType::EndpointCircuitClosed => self.open = None,
            EventType::EndpointDisabled => {
                self.disabled = Some(Switched {
                    at_us: c.at_us,
                    reason: c.reason.clone().unwrap_or_default(),
                    by: c.by.clone(),
                });
            }
            // An operator's enable says the endpoint works again: it closes the circuit too.
            EventType::EndpointEnabled => {
                self.disabled = None;
                self.open = None;
                self.enabled = Some(Switched {
                    at_us: c.at_us,
                    reason: c.reason.clone().unwrap_or_default(),
                    by: c.by.clone(),
                });
            }
            EventType::EndpointUnresolved => {
                self.unresolved = Some(Switched {
                    at_us: c.at_us,
                    reason: c.reason.clone().unwrap_or_default(),
                    by: c.by.clone(),
                });
            }
            EventType::EndpointResolved => self.unresolved = None,
            _ => return false,
        }
        true
    }
}

impl Endpoint {
    /// The circuit's event after an attempt this record already counts (`ok` or not;
    /// `was_probe`: it was the open circuit's probe), at `now_us`: a success of an open
    /// circuit closes it; a failure that makes `policy.failures` in a row opens a closed one,
    /// and the probe's failure opens it again for another cool-down. Nothing while an operator
    /// has it disabled.
    pub fn after_attempt(
        &self,
        ok: bool,
        was_probe: bool,
        policy: CircuitPolicy,
        now_us: i64,
    ) -> Option<(EventType, EndpointChange)> {
        if self.disabled.is_some() || self.unresolved.is_some() {
            return None;
        }
        let change = EndpointChange {
            sink: self.sink,
            at_us: now_us,
            ..EndpointChange::default()
        };
        let opens = match (&self.open, ok) {
            (Some(_), true) => return Some((EventType::EndpointCircuitClosed, change)),
            (None, true) => return None,
            (Some(_), false) => was_probe,
            (None, false) => self.consecutive_failures >= u64::from(policy.failures),
        };
        opens.then(|| {
            (
                EventType::EndpointCircuitOpened,
                EndpointChange {
                    failures: Some(self.consecutive_failures),
                    error_code: self.last_failure_code.clone(),
                    probe_at_us: Some(now_us.saturating_add(policy.cool_down_ms as i64 * 1_000)),
                    ..change
                },
            )
        })
    }
}

/// Whether tidemark delivers `sink` itself (its routes have endpoints).
pub fn delivering(sink: Option<Sink>) -> bool {
    sink.is_some_and(Sink::delivered_by_tidemark)
}

/// A delivering route's circuit (section 17): it opens after `failures` consecutive failed
/// attempts; its deliveries then wait, and one probe goes out after `cool_down_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitPolicy {
    pub failures: u32,
    pub cool_down_ms: u64,
}

impl Default for CircuitPolicy {
    fn default() -> Self {
        CircuitPolicy {
            failures: 20,
            cool_down_ms: 60_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoints_state_follows_its_attempts_and_switches() {
        let mut e = Endpoint::new("hook", Some(Sink::Webhook));
        assert_eq!((e.state(), e.held()), ("ok", false));
        e.attempted(Sink::Webhook, 10, Some("http_503"));
        assert_eq!(e.state(), "failing");
        assert_eq!(e.consecutive_failures, 1);
        let opened = EndpointChange {
            at_us: 20,
            probe_at_us: Some(80),
            failures: Some(1),
            ..EndpointChange::default()
        };
        e.apply(EventType::EndpointCircuitOpened, &opened);
        assert_eq!(
            (e.state(), e.held(), e.probe_at()),
            ("open", true, Some(80))
        );
        let probed = EndpointChange {
            at_us: 80,
            probe_at_us: Some(110),
            delivery_id: Some("d1".into()),
            ..EndpointChange::default()
        };
        e.apply(EventType::EndpointCircuitProbed, &probed);
        assert_eq!(e.probe_at(), Some(110));
        // A failed probe opens it again: the first opening's time is kept.
        e.apply(
            EventType::EndpointCircuitOpened,
            &EndpointChange {
                at_us: 90,
                probe_at_us: Some(150),
                ..EndpointChange::default()
            },
        );
        let o = e.open.clone().unwrap();
        assert_eq!((o.opened_at_us, o.probe_at_us, o.probe), (20, 150, None));
        let switch = EndpointChange {
            at_us: 100,
            reason: Some("receiver down".into()),
            by: Some("ops".into()),
            ..EndpointChange::default()
        };
        e.apply(EventType::EndpointDisabled, &switch);
        assert_eq!((e.state(), e.probe_at()), ("disabled", None));
        e.apply(EventType::EndpointEnabled, &switch);
        assert_eq!(
            (e.state(), e.held()),
            ("failing", false),
            "enabling closes it"
        );
        e.attempted(Sink::Webhook, 200, None);
        assert_eq!((e.state(), e.attempts, e.successes), ("ok", 2, 1));
        assert!(!e.apply(EventType::DeliverySent, &switch));
    }
}
