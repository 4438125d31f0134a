//! `Resume`: an operator resumes a paused or parked source.

use super::*;

/// Resume a paused or parked source; answers the source after it.
#[derive(Debug, Clone)]
pub struct Resume {
    pub name: String,
    pub by: Option<String>,
}

impl Command for Resume {
    type Answer = SourceRow;

    fn decide(&self, txn: &ModelsTxn, _: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let Resume { name, by } = self;
        let mut row = model_row(txn, name)?;
        if !row.paused && !row.parked {
            return Ok(Decided::new(row, Vec::new()));
        }
        let ev = source_event(name, EventType::SourceResumed, None, &json!({"by": by}))?;
        row.paused = false;
        row.parked = false;
        row.last_error = None;
        Ok(Decided::new(row, vec![ev]))
    }
}
