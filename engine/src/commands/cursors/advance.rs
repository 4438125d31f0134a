//! `Advance`: a cursor moves forward (or stays, with the same delivery id).

use super::*;

/// Advance a cursor: forward, or the same seq with the same delivery id (which appends
/// nothing), optionally compare-and-swap on `expected_sequence`. Answers the cursor after it.
#[derive(Debug, Clone)]
pub struct Advance {
    pub consumer_id: String,
    pub stream_name: String,
    pub subject_id: String,
    pub last_sequence: u64,
    pub delivery_id: String,
    pub expected_sequence: Option<u64>,
}

impl Command for Advance {
    type Answer = Cursor;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let cur = get_in(txn, &self.consumer_id, &self.stream_name, &self.subject_id)?;
        let (cursor, events) = self.decide_on(&cur, round.now_us)?;
        Ok(Decided::new(cursor, events))
    }
}
