//! `Complete`: a batch of completions by one owner.

use super::*;

/// The lease owner reports these deliveries (id, external id) sent; answers each on its own,
/// in order.
#[derive(Debug, Clone)]
pub struct Complete {
    pub owner: String,
    pub items: Vec<(DeliveryId, Option<String>)>,
    /// Whom each item reached, by its index (tidemark's dispatcher, which completes a batch of
    /// attempts in one command); empty for an app's completions.
    pub resolved_targets: Vec<Vec<String>>,
}

impl Command for Complete {
    type Answer = Vec<Completed>;

    /// Complete many deliveries leased by `owner` in one command (one transaction, one fold of
    /// the read models): each item is checked on its own, and refused items change
    /// nothing while the others are recorded.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let mut st = d::View::new(txn)?;
        let mut out = Vec::with_capacity(self.items.len());
        let mut events = Vec::new();
        let mut earlier = Earlier::default();
        for (i, (id, external_id)) in self.items.iter().enumerate() {
            out.push(complete_item(
                &mut st,
                round.now_us,
                &self.owner,
                id.as_str(),
                SentWith {
                    external_id: external_id.as_deref(),
                    resolved_targets: self.resolved_targets.get(i).map_or(&[], Vec::as_slice),
                },
                &mut earlier,
                &mut events,
            )?);
        }
        Ok(Decided::new(out, events))
    }
}
