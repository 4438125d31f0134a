//! `Extend`: an owner extends its lease.

use super::*;

/// The lease owner extends its lease to `lease_ms` from now; answers the row after it.
#[derive(Debug, Clone)]
pub struct Extend {
    pub id: DeliveryId,
    pub owner: String,
    pub lease_ms: u64,
}

impl Command for Extend {
    type Answer = Delivery;

    /// The lease owner extends its lease (heartbeat); an expired lease cannot be extended.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let (now_us, owner, lease_ms) = (round.now_us, self.owner.as_str(), self.lease_ms);
        let id = self.id.as_str();
        let st = d::View::new(txn)?;
        if let Some(row) = st.row(id)?
            && row.status != S::Leased
            && row.last_error_code.as_deref() == Some("lease_expired")
        {
            // Released by the expiry tick before this heartbeat arrived.
            return Err(CommandError::rejected(
                Rejection::LeaseExpired,
                format!("the lease on {id:?} has expired; claim it again"),
            ));
        }
        let mut row = owned_lease(st.row(id)?, now_us, id, owner, "extend")?;
        let c = Change {
            at_us: now_us,
            owner: Some(owner.to_owned()),
            attempt: Some(row.attempts),
            lease_expires_at_us: Some(now_us.saturating_add(lease_ms as i64 * 1_000)),
            ..Change::default()
        };
        transition(&mut row, T::LeaseExtended, &c, 0);
        Ok(Decided::new(row, vec![event(T::LeaseExtended, id, &c)?]))
    }
}
