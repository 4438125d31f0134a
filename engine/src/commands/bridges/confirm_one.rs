//! `ConfirmOne`: one delivery confirmation.

use super::*;

/// Confirm one delivery ([`Confirm`] of one); answers the cursor after it, or why it was
/// refused.
#[derive(Debug, Clone)]
pub struct ConfirmOne(pub Confirmation);

impl Command for ConfirmOne {
    type Answer = Result<Cursor, CommandError>;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let mut events = Vec::new();
        let out = confirm_item(txn, round, &self.0, &mut HashMap::new(), &mut events)?;
        Ok(Decided::new(out, events))
    }
}
