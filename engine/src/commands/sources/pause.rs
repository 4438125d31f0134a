//! `Pause`: an operator pauses polling.

use super::*;

/// Pause polling; answers the source after it.
#[derive(Debug, Clone)]
pub struct Pause {
    pub name: String,
    pub by: Option<String>,
    pub reason: Option<String>,
}

impl Sealed for Pause {}
impl Command for Pause {
    type Answer = SourceRow;

    fn name(&self) -> &'static str {
        "source.pause"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        _: &mut Round<'_>,
    ) -> Result<Decided<SourceRow>, CommandError> {
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
