//! The API's JSON, as the client reads and writes it. Fields the client does not name are
//! kept in `extra`, so a newer server's additions reach the caller.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An event to append. `event_id` is given one (a UUIDv7) by [`crate::Client::append`] when
/// it is `None`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NewEvent {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    pub stream: String,
    pub subject: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub payload: Value,
}

impl NewEvent {
    /// An event without an id (the client gives it one).
    pub fn new(
        stream: impl Into<String>,
        subject: impl Into<String>,
        event_type: impl Into<String>,
        payload: Value,
    ) -> NewEvent {
        NewEvent {
            event_id: None,
            stream: stream.into(),
            subject: subject.into(),
            event_type: event_type.into(),
            payload,
        }
    }

    /// The same event with this id.
    #[must_use]
    pub fn with_id(mut self, id: impl Into<String>) -> NewEvent {
        self.event_id = Some(id.into());
        self
    }
}

/// One appended event of a receipt.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Appended {
    pub event_id: String,
    pub seq: u64,
    /// The id was already in the log with the same content: `seq` is the original's.
    pub duplicate: bool,
}

/// The answer of an append: one entry per event sent, in order.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct AppendReceipt {
    pub events: Vec<Appended>,
    pub last_seq: u64,
}

/// A committed event.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Event {
    pub seq: u64,
    /// The event's tenant (spec section 20); `None` for the default tenant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub event_id: String,
    pub stream: String,
    pub subject: String,
    #[serde(rename = "type")]
    pub event_type: String,
    /// Commit time, RFC 3339 UTC.
    pub time: String,
    pub payload: Value,
}

/// A page of the log.
#[derive(Debug, Clone, Deserialize)]
pub struct EventsPage {
    pub events: Vec<Event>,
    /// Pass as `after_sequence` to continue.
    pub next_after_sequence: u64,
    pub latest_event_seq: u64,
}

/// A consumer's cursor over one stream (and subject).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Cursor {
    pub consumer_id: String,
    pub stream_name: String,
    pub subject_id: String,
    /// 0: nothing delivered yet.
    pub last_sequence: u64,
    pub last_delivery_id: Option<String>,
}

/// A delivery row, as claimed or read.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Delivery {
    /// `dlv:<notification_id>:<route>`.
    pub id: String,
    pub notification_id: String,
    pub route: String,
    pub sink: String,
    pub status: String,
    #[serde(default)]
    pub attempts: u32,
    /// The notification's type, when it has one.
    #[serde(rename = "type", default)]
    pub notification_type: Option<String>,
    /// Everything else the server sent (`items`, `type_data`, `source`, `recipient`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One result of a batch completion.
#[derive(Debug, Clone, Deserialize)]
pub struct CompleteResult {
    pub id: String,
    /// 200 (sent), 404 or 409.
    pub status: u16,
    pub delivery: Option<Delivery>,
    /// The problem code when refused (`not_lease_owner`, …).
    pub code: Option<String>,
    pub detail: Option<String>,
}
