//! Monotonic consumer cursors (spec section 6, I4): one row per
//! `(consumer_id, stream_name, subject_id)`, moved only by `cursor.advanced` (forward, or the
//! same seq with the same delivery id) and `cursor.reset` (the only way down, with a reason).
//! The commands that check those rules run inside the writer's transaction.

use serde::{Deserialize, Serialize};
use tidemark_log::redb::WriteTransaction;
use tidemark_log::{CommandError, Event, NewEvent, RejectKind};

use crate::framework::{Projection, Store, TxnTables};

pub const NAME: &str = "cursors";
pub(crate) const ROWS: &str = "rows";
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

/// Payload of `cursor.advanced`, `cursor.reset` and `cursor.failed`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CursorEvent {
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
    pub at_us: i64,
}

pub struct Cursors;

impl Projection for Cursors {
    fn name(&self) -> &'static str {
        NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        &[ROWS]
    }

    fn apply(&self, st: &mut Store<'_>, ev: &Event) -> Result<(), String> {
        let (consumer, c) = match (ev.stream.as_str(), ev.event_type.as_str()) {
            ("cursors", "cursor.advanced" | "cursor.reset" | "cursor.failed") => {
                let c: CursorEvent = serde_json::from_str(ev.payload.get())
                    .map_err(|e| format!("{} at seq {}: {e}", ev.event_type, ev.seq))?;
                (ev.subject.clone(), c)
            }
            ("task_events", "notification.terminal_state_mismatch") => {
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
                    stream_name: "task_events".into(),
                    subject_id: ev.subject.clone(),
                    error: Some(bound_error(detail)),
                    at_us: ev.time_us,
                    ..CursorEvent::default()
                };
                (crate::bridges::consumer_id(sub), c)
            }
            _ => return Ok(()),
        };
        let k = key(&consumer, &c.stream_name, &c.subject_id);
        let mut row: Cursor = st
            .get_val(ROWS, &k)?
            .unwrap_or_else(|| Cursor::zero(&consumer, &c.stream_name, &c.subject_id));
        match ev.event_type.as_str() {
            "cursor.advanced" => {
                row.last_sequence = c.last_sequence.unwrap_or(row.last_sequence);
                row.last_delivery_id = c.delivery_id.clone();
                row.last_delivered_at_us = Some(c.at_us);
                row.last_error = None;
            }
            "cursor.reset" => {
                row.last_sequence = c.to.unwrap_or(0);
                row.last_error = None;
            }
            _ => row.last_error = c.error.clone(),
        }
        row.updated_at_us = Some(c.at_us);
        row.changed_seq = ev.seq;
        st.put_val(ROWS, &k, &row)
    }
}

/// The cursor as stored, or its zero state.
pub fn get_in(
    txn: &WriteTransaction,
    consumer_id: &str,
    stream_name: &str,
    subject_id: &str,
) -> Result<Cursor, CommandError> {
    let mut t = TxnTables::new(txn, NAME).map_err(CommandError::Storage)?;
    Ok(t.get_val(ROWS, &key(consumer_id, stream_name, subject_id))
        .map_err(CommandError::Storage)?
        .unwrap_or_else(|| Cursor::zero(consumer_id, stream_name, subject_id)))
}

fn event(kind: &str, consumer_id: &str, c: &CursorEvent) -> Result<NewEvent, CommandError> {
    let v = serde_json::to_value(c).map_err(|e| CommandError::Storage(e.to_string()))?;
    NewEvent::new(None, "cursors", consumer_id, format!("cursor.{kind}"), &v)
        .map_err(|e| CommandError::Storage(e.to_string()))
}

/// What an advance asks for.
#[derive(Debug, Clone)]
pub struct Advance {
    pub consumer_id: String,
    pub stream_name: String,
    pub subject_id: String,
    pub last_sequence: u64,
    pub delivery_id: String,
    pub expected_sequence: Option<u64>,
}

/// Advance a cursor: forward, or an idempotent replay of the same (seq, delivery_id) which
/// appends nothing. Answers the cursor after it.
pub fn advance(
    txn: &WriteTransaction,
    now_us: i64,
    a: &Advance,
) -> Result<(Cursor, Vec<NewEvent>), CommandError> {
    let cur = get_in(txn, &a.consumer_id, &a.stream_name, &a.subject_id)?;
    advance_from(&cur, now_us, a)
}

/// [`advance`] given the current row (for callers that already read it).
pub fn advance_from(
    cur: &Cursor,
    now_us: i64,
    a: &Advance,
) -> Result<(Cursor, Vec<NewEvent>), CommandError> {
    if let Some(exp) = a.expected_sequence
        && exp != cur.last_sequence
    {
        return Err(CommandError::rejected(
            RejectKind::Conflict,
            "cursor_conflict",
            format!(
                "expected_sequence {exp} but the cursor is at {}",
                cur.last_sequence
            ),
        ));
    }
    if a.last_sequence == cur.last_sequence
        && cur.last_delivery_id.as_deref() == Some(a.delivery_id.as_str())
    {
        return Ok((cur.clone(), Vec::new()));
    }
    if a.last_sequence <= cur.last_sequence {
        return Err(CommandError::rejected(
            RejectKind::Conflict,
            "non_monotonic_cursor",
            format!(
                "last_sequence {} is not past the cursor's {} (a cursor only moves down by reset)",
                a.last_sequence, cur.last_sequence
            ),
        ));
    }
    let c = CursorEvent {
        stream_name: a.stream_name.clone(),
        subject_id: a.subject_id.clone(),
        last_sequence: Some(a.last_sequence),
        delivery_id: Some(a.delivery_id.clone()),
        at_us: now_us,
        ..CursorEvent::default()
    };
    let mut next = cur.clone();
    next.last_sequence = a.last_sequence;
    next.last_delivery_id = Some(a.delivery_id.clone());
    next.last_delivered_at_us = Some(now_us);
    next.last_error = None;
    next.updated_at_us = Some(now_us);
    Ok((next, vec![event("advanced", &a.consumer_id, &c)?]))
}

/// Set a cursor to `to` (up or down), recorded with its reason.
pub fn reset(
    txn: &WriteTransaction,
    now_us: i64,
    consumer_id: &str,
    stream_name: &str,
    subject_id: &str,
    to: u64,
    reason: &str,
) -> Result<(Cursor, Vec<NewEvent>), CommandError> {
    if reason.trim().is_empty() {
        return Err(CommandError::rejected(
            RejectKind::Invalid,
            "reason_required",
            "a cursor reset needs a non-empty reason",
        ));
    }
    let cur = get_in(txn, consumer_id, stream_name, subject_id)?;
    let c = CursorEvent {
        stream_name: stream_name.to_owned(),
        subject_id: subject_id.to_owned(),
        from: Some(cur.last_sequence),
        to: Some(to),
        reason: Some(reason.to_owned()),
        at_us: now_us,
        ..CursorEvent::default()
    };
    let mut next = cur;
    next.last_sequence = to;
    next.last_error = None;
    next.updated_at_us = Some(now_us);
    Ok((next, vec![event("reset", consumer_id, &c)?]))
}

/// Record a delivery failure as the cursor's `last_error` (bounded).
pub fn failed_event(
    consumer_id: &str,
    stream_name: &str,
    subject_id: &str,
    error: &str,
    now_us: i64,
) -> Result<NewEvent, CommandError> {
    let c = CursorEvent {
        stream_name: stream_name.to_owned(),
        subject_id: subject_id.to_owned(),
        error: Some(bound_error(error)),
        at_us: now_us,
        ..CursorEvent::default()
    };
    event("failed", consumer_id, &c)
}
