//! `Confirm`: a batch of delivery confirmations, each advancing its subscription cursor.

use super::*;

/// Confirm deliveries; answers each on its own, in order: the cursor after it, or why it was
/// refused.
#[derive(Debug, Clone)]
pub struct Confirm(pub Vec<Confirmation>);

impl Command for Confirm {
    type Answer = Vec<Result<Cursor, CommandError>>;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let mut moved = HashMap::new();
        let mut events = Vec::new();
        let mut out = Vec::with_capacity(self.0.len());
        for c in &self.0 {
            out.push(confirm_item(txn, round, c, &mut moved, &mut events)?);
        }
        Ok(Decided::new(out, events))
    }
}
