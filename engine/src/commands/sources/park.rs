//! `Park`: the poller parks a source after a permanent error.

use super::*;

/// Park a source after a permanent error; answers the source after it.
#[derive(Debug, Clone)]
pub struct Park {
    pub name: String,
    pub error: String,
}

impl Command for Park {
    type Answer = SourceRow;

    fn decide(&self, txn: &ModelsTxn, _: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let Park { name, error } = self;
        let mut row = model_row(txn, name)?;
        let ev = source_event(
            name,
            EventType::SourceParked,
            None,
            &json!({"error": error}),
        )?;
        row.parked = true;
        row.last_error = Some(error.clone());
        Ok(Decided::new(row, vec![ev]))
    }
}
