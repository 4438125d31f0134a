//! Events as clients send them ([`NewEvent`]) and as the log serves them ([`Event`]).

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

use crate::error::AppendError;
use crate::time::format_micros;

/// Bounds of section 2 of the spec.
pub mod limits {
    pub const EVENT_ID_MAX: usize = 128;
    pub const STREAM_MAX: usize = 64;
    pub const SUBJECT_MAX: usize = 128;
    pub const TYPE_MAX: usize = 64;
    pub const PAYLOAD_MAX_BYTES: usize = 64 * 1024;
    pub const BATCH_MAX_EVENTS: usize = 1000;
    pub const TENANT_MAX: usize = 32;
}

/// The tenant of a deployment with none configured, and of every event stored without one
/// (spec section 20): its events are stored and served exactly as before tenants existed.
pub const DEFAULT_TENANT: &str = "default";

/// The type of the default tenant's events that stand, in a shard a tenant was moved to, for
/// the source's events of other tenants (spec section 20): a shard other than 0 holds no other
/// event of the default tenant.
pub const MOVE_FILLER_TYPE: &str = "tenant.gap";

/// The type of the default tenant's event that fences a tenant out of a shard on a cluster
/// (spec section 20): a move appends it to the tenant's source shard (stream `tenants`, subject
/// [`fence_subject`]), and the tenant's events the stream orders after it are void there —
/// every node refuses an append of the tenant that lands after it, and acts on none of them.
pub const MOVE_FENCE_TYPE: &str = "tenant.fenced";

/// The stream of a tenant's fence ([`MOVE_FENCE_TYPE`]).
pub const MOVE_FENCE_STREAM: &str = "tenants";

/// The subject of `tenant`'s fence: no tenant's name holds a `/`, so it is never a directory
/// row's subject.
pub fn fence_subject(tenant: &str) -> String {
    format!("{FENCE_PREFIX}{tenant}")
}

/// The tenant a [`fence_subject`] names.
pub fn fenced_tenant(subject: &str) -> Option<&str> {
    subject.strip_prefix(FENCE_PREFIX)
}

const FENCE_PREFIX: &str = "fence/";

/// The separator of a [`scoped`] key: a control character, which no tenant, stream, subject,
/// type or `event_id` may hold, so two scoped keys are equal only when both parts are.
const SCOPE_SEP: char = '\u{1f}';

/// The key under which the log indexes `key` (a stream, subject, type or `event_id`) of an
/// event of `tenant` (`None`: the default tenant): the key itself for the default tenant, so
/// the indexes of a log written before tenants read as they are, else `tenant ␟ key`. Each
/// tenant's streams, subjects, conditions and exact idempotency are its own (spec section 20).
pub fn scoped<'a>(tenant: Option<&str>, key: &'a str) -> std::borrow::Cow<'a, str> {
    match tenant {
        None => std::borrow::Cow::Borrowed(key),
        Some(t) => std::borrow::Cow::Owned(format!("{t}{SCOPE_SEP}{key}")),
    }
}

/// `tenant` as events carry it: `None` for the default tenant.
pub fn tenant_of(name: &str) -> Option<&str> {
    (name != DEFAULT_TENANT).then_some(name)
}

/// An event to append. `payload` has been canonicalised: compact JSON of an object with its keys
/// sorted, so two payloads that are equal as JSON values have equal bytes (I2 compares them so).
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// `None`: the default tenant ([`NewEvent::in_tenant`]).
    pub tenant: Option<String>,
    pub event_id: Option<String>,
    pub stream: String,
    pub subject: String,
    pub event_type: String,
    payload: Box<RawValue>,
}

impl NewEvent {
    /// Build and validate an event. `payload` must be a JSON object of at most 64 KiB.
    pub fn new(
        event_id: Option<String>,
        stream: impl Into<String>,
        subject: impl Into<String>,
        event_type: impl Into<String>,
        payload: &serde_json::Value,
    ) -> Result<NewEvent, FieldError> {
        let ev = NewEvent::checked(event_id, stream, subject, event_type)?;
        if !payload.is_object() {
            return Err(FieldError::new("payload", "must be a JSON object"));
        }
        // serde_json's Map is a BTreeMap (no `preserve_order`), so this output has sorted keys.
        let text = serde_json::to_string(payload)
            .map_err(|e| FieldError::new("payload", format!("cannot be encoded: {e}")))?;
        ev.with_payload(text)
    }

    /// [`NewEvent::new`] with the payload as the JSON text a client sent: kept as it is when
    /// it is already canonical ([`crate::canonical`]), the common case, else parsed and
    /// re-encoded. The same checks, errors and stored bytes as [`NewEvent::new`] of the value
    /// the text parses to.
    pub fn from_json_text(
        event_id: Option<String>,
        stream: impl Into<String>,
        subject: impl Into<String>,
        event_type: impl Into<String>,
        payload: &RawValue,
    ) -> Result<NewEvent, FieldError> {
        let text = payload.get();
        if !crate::canonical::is_canonical_object(text) {
            let value: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| FieldError::new("payload", format!("cannot be read: {e}")))?;
            return NewEvent::new(event_id, stream, subject, event_type, &value);
        }
        NewEvent::checked(event_id, stream, subject, event_type)?.with_payload(text.to_owned())
    }

    /// The event with its fields checked, its payload still to come ([`NewEvent::with_payload`]).
    fn checked(
        event_id: Option<String>,
        stream: impl Into<String>,
        subject: impl Into<String>,
        event_type: impl Into<String>,
    ) -> Result<NewEvent, FieldError> {
        let ev = NewEvent {
            tenant: None,
            event_id,
            stream: stream.into(),
            subject: subject.into(),
            event_type: event_type.into(),
            payload: RawValue::NULL.to_owned(),
        };
        if let Some(id) = &ev.event_id {
            check_event_id(id)?;
        }
        check_stream(&ev.stream)?;
        check_subject(&ev.subject)?;
        check_type(&ev.event_type)?;
        Ok(ev)
    }

    /// The event with its canonical payload text, once the text is within the size limit.
    fn with_payload(self, text: String) -> Result<NewEvent, FieldError> {
        if text.len() > limits::PAYLOAD_MAX_BYTES {
            return Err(FieldError {
                kind: InvalidKind::TooLarge,
                ..FieldError::new(
                    "payload",
                    format!(
                        "is {} bytes, more than the {} allowed",
                        text.len(),
                        limits::PAYLOAD_MAX_BYTES
                    ),
                )
            });
        }
        Ok(NewEvent {
            // Canonical JSON text (checked or written by serde_json): this never fails.
            payload: RawValue::from_string(text)
                .map_err(|e| FieldError::new("payload", format!("cannot be encoded: {e}")))?,
            ..self
        })
    }

    /// The event in `tenant` (the default tenant's name: in none).
    pub fn in_tenant(mut self, tenant: &str) -> Result<NewEvent, FieldError> {
        check_tenant(tenant)?;
        self.tenant = tenant_of(tenant).map(str::to_owned);
        Ok(self)
    }

    /// The `event_id` as the log's id index keys it: scoped to the tenant ([`scoped`]).
    pub(crate) fn scoped_id(&self) -> std::borrow::Cow<'_, str> {
        scoped(
            self.tenant.as_deref(),
            self.event_id.as_deref().unwrap_or_default(),
        )
    }

    /// The canonical payload bytes.
    pub fn payload_bytes(&self) -> &[u8] {
        self.payload.get().as_bytes()
    }

    /// The canonical payload.
    pub fn payload_raw(&self) -> &RawValue {
        &self.payload
    }

    pub(crate) fn same_as(&self, other: &NewEvent) -> bool {
        self.tenant == other.tenant
            && self.stream == other.stream
            && self.subject == other.subject
            && self.event_type == other.event_type
            && self.payload.get() == other.payload.get()
    }

    pub(crate) fn same_content(&self, other: &Event) -> bool {
        self.tenant == other.tenant
            && self.stream == other.stream
            && self.subject == other.subject
            && self.event_type == other.event_type
            && self.payload.get() == other.payload.get()
    }
}

/// A field that breaks the rules of section 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct FieldError {
    pub field: &'static str,
    pub reason: String,
    /// Why, as a type (the reason is for people).
    pub kind: InvalidKind,
}

/// What kind of invalid input an append refused, so callers choose a status without reading
/// the reason's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidKind {
    /// A field breaks its pattern, length or type.
    Field,
    /// A field (the payload) is over its size limit.
    TooLarge,
    /// The batch holds no event.
    EmptyBatch,
    /// The batch holds more events than allowed.
    BatchTooLarge,
}

impl FieldError {
    fn new(field: &'static str, reason: impl Into<String>) -> Self {
        FieldError {
            field,
            reason: reason.into(),
            kind: InvalidKind::Field,
        }
    }

    pub fn at(self, index: usize) -> AppendError {
        AppendError::Invalid {
            index,
            field: self.field,
            reason: format!("{} {}", self.field, self.reason),
            kind: self.kind,
        }
    }
}

fn check_pattern(
    field: &'static str,
    value: &str,
    min: usize,
    max: usize,
    allowed: impl Fn(char) -> bool,
) -> Result<(), FieldError> {
    let n = value.chars().count();
    if n < min || n > max {
        return Err(FieldError::new(
            field,
            format!("must be {min} to {max} characters long, got {n}"),
        ));
    }
    if let Some(c) = value.chars().find(|c| !allowed(*c)) {
        return Err(FieldError::new(
            field,
            format!("contains the character {c:?}, which is not allowed"),
        ));
    }
    Ok(())
}

/// `event_id`: 1–128 of `A-Za-z0-9._:-`.
pub fn check_event_id(id: &str) -> Result<(), FieldError> {
    check_pattern("event_id", id, 1, limits::EVENT_ID_MAX, |c| {
        c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')
    })
}

/// A tenant's name: 1–32 of `a-z0-9_-`, starting with a letter.
pub fn check_tenant(tenant: &str) -> Result<(), FieldError> {
    check_pattern("tenant", tenant, 1, limits::TENANT_MAX, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-')
    })?;
    if !tenant.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(FieldError::new("tenant", "must start with a letter a-z"));
    }
    Ok(())
}

/// `stream`: 1–64 of `a-z0-9_.-`.
pub fn check_stream(stream: &str) -> Result<(), FieldError> {
    check_pattern("stream", stream, 1, limits::STREAM_MAX, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-')
    })
}

/// `type`: 1–64 of `a-z0-9_.`.
pub fn check_type(event_type: &str) -> Result<(), FieldError> {
    check_pattern("type", event_type, 1, limits::TYPE_MAX, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.')
    })
}

/// `subject`: 0–128 printable characters.
pub fn check_subject(subject: &str) -> Result<(), FieldError> {
    check_pattern("subject", subject, 0, limits::SUBJECT_MAX, |c| {
        !c.is_control()
    })
}

/// An event as stored and served. Serialises to the JSON envelope of section 2.
#[derive(Debug, Clone)]
pub struct Event {
    pub seq: u64,
    /// `None`: the default tenant.
    pub tenant: Option<String>,
    pub event_id: String,
    pub stream: String,
    pub subject: String,
    pub event_type: String,
    /// Commit time in microseconds since the Unix epoch (UTC).
    pub time_us: i64,
    pub payload: Box<RawValue>,
}

impl Event {
    /// The event borrowed: what a fold reads (the projections fold [`EventRef`]s).
    pub fn as_ref(&self) -> EventRef<'_> {
        EventRef {
            seq: self.seq,
            tenant: self.tenant.as_deref(),
            event_id: &self.event_id,
            stream: &self.stream,
            subject: &self.subject,
            event_type: &self.event_type,
            time_us: self.time_us,
            payload: self.payload.get(),
        }
    }

    /// The event's tenant by name.
    pub fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or(DEFAULT_TENANT)
    }

    /// The payload parsed as a JSON value.
    pub fn payload_value(&self) -> serde_json::Value {
        serde_json::from_str(self.payload.get()).unwrap_or(serde_json::Value::Null)
    }

    /// The commit time, RFC 3339 with microseconds.
    pub fn time_rfc3339(&self) -> String {
        format_micros(self.time_us)
    }
}

/// An event borrowed from its stored bytes (or from an [`Event`]): what projections fold, so a
/// fold copies only what it keeps. `payload` is the canonical JSON text of an object, as
/// stored (checked when it was appended, not again when read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRef<'a> {
    pub seq: u64,
    /// `None`: the default tenant.
    pub tenant: Option<&'a str>,
    pub event_id: &'a str,
    pub stream: &'a str,
    pub subject: &'a str,
    pub event_type: &'a str,
    /// Commit time in microseconds since the Unix epoch (UTC).
    pub time_us: i64,
    pub payload: &'a str,
}

impl EventRef<'_> {
    /// The event's tenant by name.
    pub fn tenant(&self) -> &str {
        self.tenant.unwrap_or(DEFAULT_TENANT)
    }

    /// The payload parsed as a JSON value (allocates a tree: folds read typed fields instead).
    pub fn payload_value(&self) -> serde_json::Value {
        serde_json::from_str(self.payload).unwrap_or(serde_json::Value::Null)
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(7 + usize::from(self.tenant.is_some())))?;
        m.serialize_entry("seq", &self.seq)?;
        if let Some(t) = &self.tenant {
            m.serialize_entry("tenant", t)?;
        }
        m.serialize_entry("event_id", &self.event_id)?;
        m.serialize_entry("stream", &self.stream)?;
        m.serialize_entry("subject", &self.subject)?;
        m.serialize_entry("type", &self.event_type)?;
        m.serialize_entry("time", &crate::time::Micros(self.time_us))?;
        m.serialize_entry("payload", &self.payload)?;
        m.end()
    }
}

/// Whether an append at exactly `first_seq..` of `n` events went in as such (a replica, an
/// import): no event was already there, and they took exactly those seqs.
pub(crate) fn check_exact(
    r: crate::AppendReceipt,
    first_seq: u64,
    n: u64,
    what: &str,
) -> Result<crate::AppendReceipt, AppendError> {
    if r.events.iter().any(|a| a.duplicate) || r.last_seq != first_seq + n - 1 {
        return Err(AppendError::Storage(
            format!("{what} diverged at seq {first_seq}: an event id appeared twice").into(),
        ));
    }
    Ok(r)
}

/// Ready a batch for any backend: refused when empty or over [`limits::BATCH_MAX_EVENTS`], and
/// every event without an `event_id` given a fresh one (so a backend, and every replica of it,
/// records the same id).
pub(crate) fn prepare_batch(events: &mut [NewEvent]) -> Result<(), AppendError> {
    if events.is_empty() {
        return Err(AppendError::Invalid {
            index: 0,
            field: "events",
            reason: "the batch is empty".into(),
            kind: InvalidKind::EmptyBatch,
        });
    }
    if events.len() > limits::BATCH_MAX_EVENTS {
        return Err(AppendError::Invalid {
            index: limits::BATCH_MAX_EVENTS,
            field: "events",
            reason: format!(
                "the batch has {} events, more than the {} allowed",
                events.len(),
                limits::BATCH_MAX_EVENTS
            ),
            kind: InvalidKind::BatchTooLarge,
        });
    }
    // A batch is one tenant's: its condition and its atomicity are judged within it.
    if let Some(i) = events.iter().position(|e| e.tenant != events[0].tenant) {
        return Err(AppendError::Invalid {
            index: i,
            field: "tenant",
            reason: "tenant differs from the batch's first event's: a batch is one tenant's".into(),
            kind: InvalidKind::Field,
        });
    }
    for ev in events {
        if ev.event_id.is_none() {
            ev.event_id = Some(fresh_event_id());
        }
    }
    Ok(())
}

/// A new, unique `event_id` (time-ordered).
pub(crate) fn fresh_event_id() -> String {
    format!("evt-{}", uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn validates_fields() {
        let ok = NewEvent::new(None, "task_events", "task-1", "task.created", &json!({}));
        assert!(ok.is_ok());
        let bad_stream = NewEvent::new(None, "Task", "t", "x", &json!({})).unwrap_err();
        assert_eq!(bad_stream.field, "stream");
        let empty_type = NewEvent::new(None, "s", "t", "", &json!({})).unwrap_err();
        assert_eq!(empty_type.field, "type");
        let bad_id = NewEvent::new(Some("a b".into()), "s", "t", "x", &json!({})).unwrap_err();
        assert_eq!(bad_id.field, "event_id");
        let long_id = NewEvent::new(Some("a".repeat(129)), "s", "t", "x", &json!({}));
        assert_eq!(long_id.unwrap_err().field, "event_id");
        let ctrl = NewEvent::new(None, "s", "a\u{7}", "x", &json!({})).unwrap_err();
        assert_eq!(ctrl.field, "subject");
        let arr = NewEvent::new(None, "s", "", "x", &json!([1])).unwrap_err();
        assert_eq!(arr.field, "payload");
        let big = json!({"a": "x".repeat(64 * 1024)});
        assert_eq!(
            NewEvent::new(None, "s", "", "x", &big).unwrap_err().field,
            "payload"
        );
    }

    #[test]
    fn payload_is_canonical() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{ "b": 1, "a": {"y":2, "x":1} }"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a":{"x":1,"y":2},"b":1}"#).unwrap();
        let ea = NewEvent::new(None, "s", "", "x", &a).unwrap();
        let eb = NewEvent::new(None, "s", "", "x", &b).unwrap();
        assert_eq!(ea.payload_bytes(), eb.payload_bytes());
        assert_eq!(ea.payload_bytes(), br#"{"a":{"x":1,"y":2},"b":1}"#);
    }
}
