//! `CompleteOne`: one completion.

use super::*;

/// The lease owner reports one delivery sent ([`Complete`] of one item); answers it.
#[derive(Debug, Clone)]
pub struct CompleteOne {
    pub id: DeliveryId,
    pub owner: String,
    pub external_id: Option<String>,
    /// Whom it reached (tidemark's dispatcher; empty for an app's completion).
    pub resolved_targets: Vec<String>,
}

impl Command for CompleteOne {
    type Answer = Completed;

    /// Complete one delivery leased by `owner` ([`Complete`] of one item).
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let mut st = d::View::new(txn)?;
        let mut events = Vec::new();
        let done = complete_item(
            &mut st,
            round.now_us,
            &self.owner,
            self.id.as_str(),
            SentWith {
                external_id: self.external_id.as_deref(),
                resolved_targets: &self.resolved_targets,
            },
            &mut Earlier::default(),
            &mut events,
        )?;
        Ok(Decided::new(done, events))
    }
}
