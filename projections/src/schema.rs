//! Reserved event types (spec section 2).
//!
//! Types under a reserved prefix are checked here: server-only types cannot be sent by clients,
//! client types must sit on their stream, have a subject, and carry a payload of the right
//! shape. Other types are free-form.

use serde_json::{Map, Value};

use crate::names::{EventType, Priority, RESERVED_PREFIXES};

/// The largest `count` a notification may stand for.
pub const MAX_COUNT: u64 = 1_000_000;

/// Why a client may not append an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("type {0:?} is written by tidemark only")]
    ServerOnly(String),
    #[error("{0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> SchemaError {
    SchemaError::Invalid(msg.into())
}

/// Whether [`check_client_event`] reads the payload of this type (a type of tidemark's
/// reserved prefixes); for every other type any payload passes.
pub fn reads_payload(event_type: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| event_type.starts_with(p))
}

/// Check an event a client wants to append. Free-form types always pass.
pub fn check_client_event(
    stream: &str,
    subject: &str,
    event_type: &str,
    payload: &Value,
) -> Result<(), SchemaError> {
    let ty = EventType::parse(event_type);
    if ty.is_some_and(EventType::server_only) {
        return Err(SchemaError::ServerOnly(event_type.to_owned()));
    }
    // The directory's and the moves' stream (spec section 20): tidemark's alone, whatever the
    // type (a free-form event there could stand where a move's fence goes).
    if stream == crate::names::Stream::Tenants.as_str() {
        return Err(invalid(format!(
            "stream {stream:?} is tidemark's (the tenants' directory): clients do not append to it"
        )));
    }
    if !reads_payload(event_type) {
        return Ok(());
    }
    let Some(ty) = ty else {
        return Err(invalid(format!(
            "type {event_type:?} uses a reserved prefix but is not a type tidemark defines"
        )));
    };
    let want_stream = ty.stream().as_str();
    if stream != want_stream {
        return Err(invalid(format!(
            "type {event_type:?} belongs on stream {want_stream:?}, not {stream:?}"
        )));
    }
    if subject.is_empty() {
        return Err(invalid(format!(
            "type {event_type:?} needs a subject (the {} id)",
            want_stream.trim_end_matches('s').trim_end_matches("_event")
        )));
    }
    let p = payload
        .as_object()
        .ok_or_else(|| invalid("payload must be an object"))?;
    let f = Fields(p);
    use EventType as T;
    match ty {
        T::TaskCreated => {
            f.string("project_id", true, 128)?;
            f.string("title", false, 512)?;
            f.boolean("review_required")?;
        }
        T::TaskRunStarted
        | T::TaskRunCompleted
        | T::TaskRunCanceled
        | T::TaskRunReviewRequested => {
            f.string("run_id", true, 128)?;
        }
        T::TaskRunFailed => {
            f.string("run_id", true, 128)?;
            f.string("error", false, 4096)?;
        }
        T::TaskRunReviewApproved => {
            f.string("run_id", true, 128)?;
            f.string("reviewer", false, 128)?;
        }
        T::TaskRunReviewRejected => {
            f.string("run_id", true, 128)?;
            f.string("reviewer", false, 128)?;
            f.string("reason", false, 4096)?;
            f.boolean("continuation")?;
        }
        T::TaskCanceled => {
            f.string("reason", false, 4096)?;
        }
        T::NotificationRequested => {
            let prio = f.string("priority", true, 16)?.unwrap_or_default();
            if Priority::parse(prio).is_none() {
                return Err(invalid(format!(
                    "payload.priority {prio:?} is not one of {}",
                    Priority::joined()
                )));
            }
            f.string("title", true, 256)?;
            f.string("body", false, 8192)?;
            f.string("recipient", false, 128)?;
            f.string("list", false, 128)?;
            // The changes it stands for (a digest counts them, section 12).
            if let Some(c) = p.get("count")
                && !c.as_u64().is_some_and(|c| (1..=MAX_COUNT).contains(&c))
            {
                return Err(invalid(format!(
                    "payload.count must be an integer from 1 to {MAX_COUNT}"
                )));
            }
            f.string("group_key", false, 128)?;
            f.time("deliver_after")?;
            f.string("task_id", false, 128)?;
            f.string("project_id", false, 128)?;
            // Provenance (section 2): a free type name, its data as given, and where a
            // forwarded notification comes from.
            if let Some(t) = f.string("type", false, 64)?
                && (t.is_empty()
                    || !t
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
            {
                return Err(invalid("payload.type must be 1-64 of A-Za-z0-9._-"));
            }
            f.object("type_data")?;
            // Seed 000's delivery fields: the session, a destination key and the request the
            // sink is to send, served on the notification and each of its deliveries.
            f.string("session_id", false, 128)?;
            f.string("destination_key", false, 256)?;
            f.object("request_json")?;
            if let Some(src) = f.object("source")? {
                let g = Fields(src);
                for k in ["site_id", "node", "instance_id", "script"] {
                    g.string(k, false, 128).map_err(|_| {
                        invalid(format!(
                            "payload.source.{k} must be a string of at most 128 characters"
                        ))
                    })?;
                }
                g.time("enqueued_at")
                    .map_err(|_| invalid("payload.source.enqueued_at must be an RFC 3339 time"))?;
                if let Some(k) = src.keys().find(|k| {
                    !["site_id", "node", "instance_id", "script", "enqueued_at"]
                        .contains(&k.as_str())
                }) {
                    return Err(invalid(format!(
                        "payload.source.{k} is not a provenance field"
                    )));
                }
            }
        }
        T::NotificationCanceled => {
            f.string("reason", false, 4096)?;
        }
        T::RecipientUpdated => {
            if let Some(l) = f.string("locale", false, 35)?
                && (l.is_empty()
                    || !l.split('-').all(|part| {
                        (1..=8).contains(&part.len())
                            && part.bytes().all(|b| b.is_ascii_alphanumeric())
                    }))
            {
                return Err(invalid(
                    "payload.locale must be a BCP 47 tag such as de or de-AT",
                ));
            }
            if let Some(t) = f.string("tz", false, 64)?
                && t.parse::<chrono_tz::Tz>().is_err()
            {
                return Err(invalid(
                    "payload.tz must be an IANA time-zone name such as Europe/Berlin or UTC",
                ));
            }
            if let Some(v) = p.get("tz_offset_minutes") {
                match v.as_i64() {
                    Some(m) if (-840..=840).contains(&m) => {}
                    _ => {
                        return Err(invalid(
                            "payload.tz_offset_minutes must be an integer from -840 to 840",
                        ));
                    }
                }
            }
        }
        T::RecipientSuppressed | T::RecipientUnsuppressed => {
            f.string("reason", false, 4096)?;
            f.time("until")?;
        }
        _ => {}
    }
    Ok(())
}

struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn string(
        &self,
        name: &str,
        required: bool,
        max: usize,
    ) -> Result<Option<&'a str>, SchemaError> {
        match self.0.get(name) {
            None | Some(Value::Null) if required => {
                Err(invalid(format!("payload.{name} is required")))
            }
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => {
                if required && s.is_empty() {
                    return Err(invalid(format!("payload.{name} must not be empty")));
                }
                if s.chars().count() > max {
                    return Err(invalid(format!(
                        "payload.{name} is longer than {max} characters"
                    )));
                }
                Ok(Some(s))
            }
            Some(_) => Err(invalid(format!("payload.{name} must be a string"))),
        }
    }

    fn object(&self, name: &str) -> Result<Option<&'a Map<String, Value>>, SchemaError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(invalid(format!("payload.{name} must be an object"))),
        }
    }

    fn boolean(&self, name: &str) -> Result<(), SchemaError> {
        match self.0.get(name) {
            None | Some(Value::Null) | Some(Value::Bool(_)) => Ok(()),
            Some(_) => Err(invalid(format!("payload.{name} must be true or false"))),
        }
    }

    fn time(&self, name: &str) -> Result<(), SchemaError> {
        match self.string(name, false, 64)? {
            Some(s) if tidemark_log::time::parse_rfc3339_micros(s).is_none() => Err(invalid(
                format!("payload.{name} must be an RFC 3339 time, got {s:?}"),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(stream: &str, ty: &str, p: Value) -> Result<(), SchemaError> {
        check_client_event(stream, "s-1", ty, &p)
    }

    #[test]
    fn free_form_types_pass() {
        assert!(check("anything", "my.type", json!({"x": 1})).is_ok());
    }

    /// No client event stands where the directory's or a move's fence goes.
    #[test]
    fn the_tenants_stream_is_tidemarks() {
        assert!(matches!(
            check("tenants", "my.type", json!({})),
            Err(SchemaError::Invalid(_))
        ));
    }

    #[test]
    fn server_only_types_are_refused() {
        for t in EventType::ALL.iter().filter(|t| t.server_only()) {
            assert!(matches!(
                check("deliveries", t.as_str(), json!({})),
                Err(SchemaError::ServerOnly(_))
            ));
        }
    }

    #[test]
    fn lifecycle_schemas() {
        assert!(check("task_events", "task.run_started", json!({"run_id": "r1"})).is_ok());
        assert!(check("task_events", "task.run_started", json!({})).is_err());
        assert!(check("task_events", "task.run_started", json!({"run_id": 5})).is_err());
        assert!(check("other", "task.run_started", json!({"run_id": "r1"})).is_err());
        assert!(check_client_event("task_events", "", "task.canceled", &json!({})).is_err());
        assert!(check("task_events", "task.unknown", json!({})).is_err());
        assert!(
            check(
                "task_events",
                "task.created",
                json!({"project_id": "p", "review_required": "yes"})
            )
            .is_err()
        );
        assert!(
            check(
                "task_events",
                "task.created",
                json!({"project_id": "p", "title": "x".repeat(513)})
            )
            .is_err()
        );
    }

    #[test]
    fn notification_schema() {
        let ok =
            json!({"priority": "urgent", "title": "t", "deliver_after": "2026-11-21T10:00:00Z"});
        assert!(check("notifications", "notification.requested", ok).is_ok());
        // `count`: an integer from 1 to MAX_COUNT.
        for (count, fine) in [
            (json!(1), true),
            (json!(MAX_COUNT), true),
            (json!(0), false),
            (json!(-1), false),
            (json!("3"), false),
            (json!(MAX_COUNT + 1), false),
            (json!(u64::MAX), false),
        ] {
            let p = json!({"priority": "info", "title": "t", "count": count});
            assert_eq!(
                check("notifications", "notification.requested", p).is_ok(),
                fine,
                "{count}"
            );
        }
        assert!(
            check(
                "notifications",
                "notification.requested",
                json!({"priority": "loud", "title": "t"})
            )
            .is_err()
        );
        assert!(
            check(
                "notifications",
                "notification.requested",
                json!({"priority": "info"})
            )
            .is_err()
        );
        assert!(
            check(
                "notifications",
                "notification.requested",
                json!({"priority": "info", "title": "t", "deliver_after": "soon"})
            )
            .is_err()
        );
        assert!(
            check(
                "recipients",
                "recipient.updated",
                json!({"tz_offset_minutes": 841})
            )
            .is_err()
        );
        assert!(
            check(
                "recipients",
                "recipient.updated",
                json!({"tz_offset_minutes": -840})
            )
            .is_ok()
        );
    }
}
