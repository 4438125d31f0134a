//! Monotonic consumer cursors (spec section 6, I4): one row per
//! `(consumer_id, stream_name, subject_id)`, moved only by `cursor.advanced` (forward, or the
//! same seq with the same delivery id) and `cursor.reset` (the only way down, with a reason).
//! The commands that check those rules are the engine's (`tidemark_engine::commands::cursors`).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use tidemark_log::EventRef;
use tidemark_log::StorageError;

use crate::framework::{Fold, Store};
use crate::names::{EventType, Stream};

pub const NAME: &str = "cursors";
pub const ROWS: &str = "rows";
/// Longest `last_error` kept.
pub const MAX_ERROR: usize = 512;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub consumer_id: String,
    pub stream_name: String,
    pub subject_id: String,
    /// 0 = nothing delivered.
    pub last_sequence: u64,
    pub last_delivery_id: Option<String>,
    pub last_delivered_at_us: Option<i64>,
    pub last_error: Option<String>,
    pub updated_at_us: Option<i64>,
    /// Seq of the last event that changed it.
    pub changed_seq: u64,
    /// What later releases added, at its default for a row that does not use it (so such a
    /// row keeps the bytes, and the digest, it had before: [`crate::trailing`]).
    #[serde(default, with = "crate::trailing")]
    pub ext: CursorExt,
}

crate::framework::postcard_row!(Cursor);

/// The fields a cursor row gained after the golden release (see [`Cursor::ext`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorExt {
    /// When an operator last reset it, until it advances again.
    pub reset_at_us: Option<i64>,
}

impl Cursor {
    /// When it last made progress: its last advance, or the reset since (`None`: never).
    /// Failures and mismatches are not progress.
    pub fn progress_at_us(&self) -> Option<i64> {
        self.last_delivered_at_us.or(self.ext.reset_at_us)
    }
}

impl Cursor {
    /// The zero state of a cursor that does not exist.
    pub fn zero(consumer_id: &str, stream_name: &str, subject_id: &str) -> Cursor {
        Cursor {
            consumer_id: consumer_id.to_owned(),
            stream_name: stream_name.to_owned(),
            subject_id: subject_id.to_owned(),
            ..Cursor::default()
        }
    }
}

pub fn key(consumer_id: &str, stream_name: &str, subject_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(consumer_id.len() + stream_name.len() + subject_id.len() + 2);
    k.extend_from_slice(consumer_id.as_bytes());
    k.push(0);
    k.extend_from_slice(stream_name.as_bytes());
    k.push(0);
    k.extend_from_slice(subject_id.as_bytes());
    k
}

/// Cut a text to [`MAX_ERROR`] characters.
pub fn bound_error(e: &str) -> String {
    e.chars().take(MAX_ERROR).collect()
}

crate::framework::txn_view! {
    /// The cursors model inside a models transaction (commands decide on it at the head).
    NAME
}

impl View<'_> {
    /// The cursor of `(consumer_id, stream_name, subject_id)`, or its zero state.
    pub fn get(
        &self,
        consumer_id: &str,
        stream_name: &str,
        subject_id: &str,
    ) -> Result<Cursor, StorageError> {
        Ok(self
            .t
            .get_val(ROWS, &key(consumer_id, stream_name, subject_id))?
            .unwrap_or_else(|| Cursor::zero(consumer_id, stream_name, subject_id)))
    }

    /// Every cursor.
    pub fn all(&self) -> Result<Vec<Cursor>, StorageError> {
        self.t.values(ROWS)
    }

    /// The cursors of `consumer_id` (every cursor when `None`), in key order, at most
    /// `limit`.
    pub fn page(
        &self,
        consumer_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Cursor>, StorageError> {
        let t = self.t.table(ROWS)?;
        let range = match consumer_id {
            Some(c) => {
                let (from, to) = crate::framework::under(c);
                t.range(from.as_slice()..to.as_slice())?
            }
            None => t.iter()?,
        };
        let mut out = Vec::new();
        for row in range.take(limit) {
            let (_, v) = row.map_err(StorageError::of)?;
            out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        }
        Ok(out)
    }
}

/// Payload of `cursor.advanced`, `cursor.reset` and `cursor.failed`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CursorEvent {
    /// The consumer, when its id is too long to be the event's subject (see
    /// `names::ids::cursor_subject`); else the subject is the consumer id.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub consumer_id: Option<String>,
    pub stream_name: String,
    pub subject_id: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last_sequence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub delivery_id: Option<String>,
    /// Reset: from and to.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub from: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub to: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// Failed: the error, bounded.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// Failed: a webhook POST's code (`http_503`, `http_connect`, …), when the notifier wrote
    /// it (the subscription's endpoint health, section 17).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error_code: Option<String>,
    /// Reset: the token that asked for it (`null` in open mode: the reset command writes it;
    /// resets of older releases have none).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub by: Option<String>,
    pub at_us: i64,
}

/// Apply cursor event `ty` (advanced, reset, failed; a mismatch is a failure) to `row`: the
/// one function the fold and the commands share, so the row a command answers with is the row
/// the fold stores.
pub fn apply(row: &mut Cursor, ty: EventType, c: CursorEvent) {
    match ty {
        EventType::CursorAdvanced => {
            row.last_sequence = c.last_sequence.unwrap_or(row.last_sequence);
            row.last_delivery_id = c.delivery_id;
            row.last_delivered_at_us = Some(c.at_us);
            row.last_error = None;
            row.ext.reset_at_us = None;
        }
        EventType::CursorReset => {
            // The delivery at the old position is not the one at the new: a reset cursor has
            // delivered nothing since (section 6's fields describe the position).
            row.last_sequence = c.to.unwrap_or(0);
            row.last_delivery_id = None;
            row.last_delivered_at_us = None;
            row.last_error = None;
            row.ext.reset_at_us = Some(c.at_us);
        }
        _ => row.last_error = c.error,
    }
    row.updated_at_us = Some(c.at_us);
}

pub struct Cursors;

impl Fold for Cursors {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[ROWS];
    /// 2: a reset clears `last_delivery_id` and `last_delivered_at` and records
    /// [`CursorExt::reset_at_us`]; an older model is rebuilt from the log at the next open.
    const VERSION: u32 = 2;

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        let Some(ty) = EventType::of(ev) else {
            return Ok(());
        };
        use EventType as T;
        let (consumer, c) = match ty {
            T::CursorAdvanced | T::CursorReset | T::CursorFailed => {
                let c: CursorEvent = serde_json::from_str(ev.payload).map_err(|e| {
                    StorageError::new(format!("{} at seq {}", ev.event_type, ev.seq), e)
                })?;
                let consumer = match &c.consumer_id {
                    Some(id) => Cow::Owned(id.clone()),
                    None => Cow::Borrowed(ev.subject),
                };
                (consumer, c)
            }
            T::NotificationTerminalStateMismatch => {
                // The mismatch is the subscription cursor's last error.
                let p = ev.payload_value();
                let Some(sub) = p.get("subscription_id").and_then(|v| v.as_str()) else {
                    return Ok(());
                };
                let detail = p
                    .get("detail")
                    .and_then(|v| v.as_str())
                    .unwrap_or("mismatch");
                let c = CursorEvent {
                    stream_name: Stream::TaskEvents.into(),
                    subject_id: ev.subject.to_owned(),
                    error: Some(bound_error(detail)),
                    at_us: ev.time_us,
                    ..CursorEvent::default()
                };
                (Cow::Owned(crate::names::ids::bridge_consumer(sub)), c)
            }
            _ => return Ok(()),
        };
        let k = key(&consumer, &c.stream_name, &c.subject_id);
        let mut row: Cursor = st
            .take_row(ROWS, &k)?
            .unwrap_or_else(|| Cursor::zero(&consumer, &c.stream_name, &c.subject_id));
        apply(&mut row, ty, c);
        row.changed_seq = ev.seq;
        st.put_row(ROWS, &k, row)
    }
}
