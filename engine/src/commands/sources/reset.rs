//! `Reset`: an operator moves the watermark back (or anywhere), with a reason.

use super::*;

/// The operator's way back (or anywhere): needs a reason. Answers the source after it.
#[derive(Debug, Clone)]
pub struct Reset {
    pub name: String,
    pub to: Option<String>,
    pub reason: String,
    pub by: Option<String>,
}

impl Command for Reset {
    type Answer = SourceRow;

    fn decide(&self, txn: &ModelsTxn, _: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let Reset {
            name,
            to,
            reason,
            by,
        } = self;
        if reason.trim().is_empty() {
            return Err(CommandError::rejected(
                Rejection::ReasonRequired,
                "a reset needs a reason",
            ));
        }
        let mut row = model_row(txn, name)?;
        let ev = source_event(
            name,
            EventType::SourceReset,
            None,
            &json!({"from": row.watermark, "to": to, "reason": reason, "by": by}),
        )?;
        row.watermark = to.clone();
        Ok(Decided::new(row, vec![ev]))
    }
}
