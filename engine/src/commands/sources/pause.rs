//! `Pause`: an operator pauses polling.

use super::*;

/// Pause polling; answers the source after it.
#[derive(Debug, Clone)]
pub struct Pause {
    pub name: String,
    pub by: Option<String>,
    pub reason: Option<String>,
}

impl Command for Pause {
    type Answer = SourceRow;

    fn decide(&self, txn: &ModelsTxn, _: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let Pause { name, by, reason } = self;
        let mut row = model_row(txn, name)?;
        if row.paused {
            return Ok(Decided::new(row, Vec::new()));
        }
        let ev = source_event(
            name,
            EventType::SourcePaused,
            None,
            &json!({"by": by, "reason": reason}),
        )?;
        row.paused = true;
        Ok(Decided::new(row, vec![ev]))
    }
}
