//! The server log's account of what happens to deliveries and endpoints (spec sections 17 and
//! 18), read from the log's own events as the follower hands them on, so that what an operator
//! reads in the log is what the log records: an ERROR when a delivery parks (its code and
//! cause), INFO when an endpoint's circuit opens, sends its probe or closes, and when an
//! operator disables or enables one, an ERROR when a source parks. Each node logs the events it
//! follows from its start on (what it folded before is not logged again after a restart).
//!
//! The failed attempts themselves are logged by whoever made them (the dispatcher with the
//! endpoint it reached, rate-limited per endpoint; the bridge notifier), where the endpoint is
//! known. No line names a webhook URL's path, a secret, or a redacted delivery's content (its
//! id names the intent key, never the notification).

use serde::Deserialize;
use tidemark_log::Event;
use tidemark_projections::endpoints::EndpointChange;
use tidemark_projections::names::EventType;

use crate::follow::Page;

/// A cause as logged: at most this many characters of the text a sink or a claimer reported.
const CAUSE_CHARS: usize = 300;

/// The fields of a delivery transition this log (and the operational notifications) read.
#[derive(Deserialize, Default)]
pub(crate) struct Transition {
    #[serde(default)]
    pub(crate) parked: Option<bool>,
    #[serde(default)]
    pub(crate) error_code: Option<String>,
    #[serde(default)]
    pub(crate) error: Option<String>,
    #[serde(default)]
    pub(crate) reason: Option<String>,
    #[serde(default)]
    pub(crate) attempt: Option<u32>,
}

/// `s` cut to [`CAUSE_CHARS`] characters, as logged and told.
pub(crate) fn cause(s: Option<&str>) -> String {
    let s = s.unwrap_or("");
    match s.char_indices().nth(CAUSE_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Log what the events of `page` after `after` say an operator must know.
pub fn observe(page: &Page, after: u64, news: impl Fn(&Event) -> bool) {
    for ev in page.events.iter().filter(|e| e.seq > after && news(e)) {
        log_event(ev);
    }
}

fn log_event(ev: &Event) {
    let Some(ty) = EventType::parse(&ev.event_type) else {
        return;
    };
    let seq = ev.seq;
    match ty {
        EventType::DeliveryAttemptFailed | EventType::DeliveryLeaseExpired => {
            let t: Transition = serde_json::from_str(ev.payload.get()).unwrap_or_default();
            if t.parked != Some(true) {
                return;
            }
            let code =
                t.error_code
                    .as_deref()
                    .unwrap_or(if ty == EventType::DeliveryLeaseExpired {
                        "lease_expired"
                    } else {
                        "failed"
                    });
            tracing::error!(
                target: "tidemark::deliveries",
                delivery = %ev.subject,
                code,
                reason = t.reason.as_deref().unwrap_or(""),
                attempt = t.attempt.unwrap_or(0),
                cause = %cause(t.error.as_deref()),
                seq,
                "delivery parked: it waits for an operator's retry or discard"
            );
        }
        EventType::EndpointCircuitOpened
        | EventType::EndpointCircuitProbed
        | EventType::EndpointCircuitClosed
        | EventType::EndpointDisabled
        | EventType::EndpointEnabled
        | EventType::EndpointUnresolved
        | EventType::EndpointResolved => {
            let c: EndpointChange = serde_json::from_str(ev.payload.get()).unwrap_or_default();
            let endpoint = ev.subject.as_str();
            let delivery = c.delivery_id.as_deref().unwrap_or("");
            let until = c
                .probe_at_us
                .map(|us| tidemark_log::time::Micros(us).to_string())
                .unwrap_or_default();
            match ty {
                EventType::EndpointCircuitOpened => tracing::info!(
                    target: "tidemark::endpoints",
                    endpoint,
                    failures = c.failures.unwrap_or(0),
                    code = c.error_code.as_deref().unwrap_or(""),
                    probe_at = %until,
                    seq,
                    "endpoint circuit opened: its deliveries wait for a probe"
                ),
                EventType::EndpointCircuitProbed => tracing::info!(
                    target: "tidemark::endpoints",
                    endpoint, delivery, lease_until = %until, seq,
                    "endpoint circuit probing"
                ),
                EventType::EndpointCircuitClosed => tracing::info!(
                    target: "tidemark::endpoints",
                    endpoint, delivery, seq,
                    "endpoint circuit closed: its deliveries flow again"
                ),
                EventType::EndpointUnresolved => tracing::warn!(
                    target: "tidemark::endpoints",
                    endpoint,
                    node = c.by.as_deref().unwrap_or(""),
                    unset = %cause(c.reason.as_deref()),
                    seq,
                    "endpoint unresolved: a node lacks its env: variables; its deliveries wait"
                ),
                EventType::EndpointResolved => tracing::info!(
                    target: "tidemark::endpoints",
                    endpoint,
                    node = c.by.as_deref().unwrap_or(""),
                    seq,
                    "endpoint resolved: its deliveries flow again"
                ),
                _ => {
                    let what = if ty == EventType::EndpointDisabled {
                        "endpoint disabled by an operator: its deliveries wait"
                    } else {
                        "endpoint enabled by an operator"
                    };
                    tracing::info!(
                        target: "tidemark::endpoints",
                        endpoint,
                        by = c.by.as_deref().unwrap_or(""),
                        reason = %cause(c.reason.as_deref()),
                        seq,
                        "{what}"
                    );
                }
            }
        }
        EventType::SourceParked => {
            let error = ev.payload_value()["error"].as_str().map(str::to_owned);
            tracing::error!(
                target: "tidemark::sources",
                source = %ev.subject,
                cause = %cause(error.as_deref()),
                seq,
                "source parked: it polls no more until it is resumed"
            );
        }
        _ => {}
    }
}

/// Whether any event of a page is one [`observe`] logs (read by type only).
pub fn concerns(ev: &tidemark_log::EventRef<'_>) -> bool {
    matches!(
        EventType::parse(ev.event_type),
        Some(
            EventType::DeliveryAttemptFailed
                | EventType::DeliveryLeaseExpired
                | EventType::EndpointCircuitOpened
                | EventType::EndpointCircuitProbed
                | EventType::EndpointCircuitClosed
                | EventType::EndpointDisabled
                | EventType::EndpointEnabled
                | EventType::EndpointUnresolved
                | EventType::EndpointResolved
                | EventType::SourceParked
        )
    )
}
