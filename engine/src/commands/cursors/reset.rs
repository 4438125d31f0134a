//! `Reset`: a cursor moves anywhere, with a reason.

use super::*;

/// Set a cursor to `to` (up or down), recorded with its `reason`: the only way down. Answers
/// the cursor after it.
#[derive(Debug, Clone)]
pub struct Reset {
    pub consumer_id: String,
    pub stream_name: String,
    pub subject_id: String,
    pub to: u64,
    pub reason: String,
    /// The token that asked for it (`None` in open mode), recorded on `cursor.reset`.
    pub by: Option<String>,
}

impl Command for Reset {
    type Answer = Cursor;

    /// Set the cursor to `to` (up or down), recorded with its reason.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let (consumer_id, stream_name, subject_id) =
            (&self.consumer_id, &self.stream_name, &self.subject_id);
        if self.reason.trim().is_empty() {
            return Err(CommandError::rejected(
                Rejection::ReasonRequired,
                "a cursor reset needs a non-empty reason",
            ));
        }
        let cur = get_in(txn, consumer_id, stream_name, subject_id)?;
        let c = CursorEvent {
            stream_name: stream_name.clone(),
            subject_id: subject_id.clone(),
            from: Some(cur.last_sequence),
            to: Some(self.to),
            reason: Some(self.reason.clone()),
            by: self.by.clone(),
            at_us: round.now_us,
            ..CursorEvent::default()
        };
        let ev = event("reset", consumer_id, &c)?;
        let mut next = cur;
        tidemark_projections::cursors::apply(&mut next, EventType::CursorReset, c);
        Ok(Decided::new(next, vec![ev]))
    }
}
