//! The cursor family (spec section 6, I4): advance (forward, or the same seq with the same
//! delivery id, optionally compare-and-swap on the position the caller saw) and reset (the only
//! way down, with a reason), checked inside the writer against the `cursors` model.
//!
//! One command per file; the cursor reads and events both share are here.

mod advance;
mod reset;

pub use advance::Advance;
pub use reset::Reset;

use crate::error::{CommandError, Rejection};
use tidemark_log::{NewEvent, StorageError};
use tidemark_projections::cursors;
use tidemark_projections::cursors::{Cursor, CursorEvent, bound_error};
use tidemark_projections::names::{EventType, Stream};

use super::{Command, DecideResult, Decided, Round};
use tidemark_projections::ModelsTxn;

impl Advance {
    /// The decision given the cursor's current row (a bridge's confirmation has read it):
    /// forward, or an idempotent replay of the same (seq, delivery_id), which appends nothing.
    pub(crate) fn decide_on(
        &self,
        cur: &Cursor,
        now_us: i64,
    ) -> Result<(Cursor, Vec<NewEvent>), CommandError> {
        if let Some(exp) = self.expected_sequence
            && exp != cur.last_sequence
        {
            return Err(CommandError::rejected(
                Rejection::CursorConflict,
                format!(
                    "expected_sequence {exp} but the cursor is at {}",
                    cur.last_sequence
                ),
            ));
        }
        if self.last_sequence == cur.last_sequence
            && cur.last_delivery_id.as_deref() == Some(self.delivery_id.as_str())
        {
            return Ok((cur.clone(), Vec::new()));
        }
        if self.last_sequence <= cur.last_sequence {
            return Err(CommandError::rejected(
                Rejection::NonMonotonicCursor,
                format!(
                    "last_sequence {} is not past the cursor's {} (a cursor only moves down by reset)",
                    self.last_sequence, cur.last_sequence
                ),
            ));
        }
        let c = CursorEvent {
            stream_name: self.stream_name.clone(),
            subject_id: self.subject_id.clone(),
            last_sequence: Some(self.last_sequence),
            delivery_id: Some(self.delivery_id.clone()),
            at_us: now_us,
            ..CursorEvent::default()
        };
        let ev = event("advanced", &self.consumer_id, &c)?;
        let mut next = cur.clone();
        tidemark_projections::cursors::apply(&mut next, EventType::CursorAdvanced, c);
        Ok((next, vec![ev]))
    }
}

/// The cursor as stored, or its zero state.
pub(crate) fn get_in(
    txn: &ModelsTxn,
    consumer_id: &str,
    stream_name: &str,
    subject_id: &str,
) -> Result<Cursor, CommandError> {
    Ok(cursors::View::new(txn)?.get(consumer_id, stream_name, subject_id)?)
}

fn event(kind: &str, consumer_id: &str, c: &CursorEvent) -> Result<NewEvent, CommandError> {
    let long = tidemark_projections::names::ids::cursor_subject(consumer_id);
    let c = CursorEvent {
        consumer_id: long.as_ref().map(|_| consumer_id.to_owned()),
        ..c.clone()
    };
    let mut v = serde_json::to_value(&c).map_err(|e| CommandError::Models(StorageError::of(e)))?;
    // A reset is an operator action: it says who did it, `"by": null` in open mode (spec
    // section 8), as every other operator event does. It once left `by` out in open mode.
    if kind == "reset" && c.by.is_none() {
        v["by"] = serde_json::Value::Null;
    }
    NewEvent::new(
        None,
        Stream::Cursors,
        long.as_deref().unwrap_or(consumer_id),
        format!("cursor.{kind}"),
        &v,
    )
    .map_err(CommandError::invalid_event)
}

/// Record a delivery failure as the cursor's `last_error` (bounded).
pub fn failed_event(
    consumer_id: &str,
    stream_name: &str,
    subject_id: &str,
    error: &str,
    error_code: Option<&str>,
    now_us: i64,
) -> Result<NewEvent, CommandError> {
    let c = CursorEvent {
        stream_name: stream_name.to_owned(),
        subject_id: subject_id.to_owned(),
        error: Some(bound_error(error)),
        error_code: error_code.map(str::to_owned),
        at_us: now_us,
        ..CursorEvent::default()
    };
    event("failed", consumer_id, &c)
}
