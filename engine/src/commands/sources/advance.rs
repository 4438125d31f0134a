//! `Advance`: the watermark's compare-and-swap.

use super::*;

/// Move the watermark from `from` (compare-and-swap) to `to`; answers the source after it.
#[derive(Debug, Clone)]
pub struct Advance {
    pub name: String,
    pub from: Option<String>,
    pub to: String,
}

impl Command for Advance {
    type Answer = SourceRow;

    fn decide(&self, txn: &ModelsTxn, _: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let Advance { name, from, to } = self;
        let row = model_row(txn, name)?;
        if row.watermark != *from {
            return Err(CommandError::rejected(
                Rejection::WatermarkConflict,
                format!(
                    "the watermark of {name:?} is {:?}, not {from:?}",
                    row.watermark
                ),
            ));
        }
        if from.as_deref() == Some(to.as_str()) {
            return Ok(Decided::new(row, Vec::new()));
        }
        if let Some(f) = from
            && to.as_str() < f.as_str()
        {
            return Err(CommandError::rejected(
                Rejection::WatermarkBackwards,
                format!("next {to:?} is before the watermark {f:?}"),
            ));
        }
        let ev = source_event(
            name,
            EventType::SourceWatermarkAdvanced,
            None,
            &json!({"from": from, "to": to}),
        )?;
        let mut after = row;
        after.watermark = Some(to.clone());
        Ok(Decided::new(after, vec![ev]))
    }
}
