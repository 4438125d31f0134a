//! `Recover`: an operator retries every parked delivery of a route since a time.

use super::*;

/// At most this many parked deliveries are retried by one [`Recover`] (section 17).
pub const RECOVER_MAX: usize = 10_000;

/// An operator retries every parked delivery of `route` made since `since_us` (at most
/// [`RECOVER_MAX`]), each a `delivery.retried` with the reason and `by`; answers how many.
#[derive(Debug, Clone)]
pub struct Recover {
    pub route: String,
    pub since_us: i64,
    pub reason: String,
    pub by: Option<String>,
}

impl Command for Recover {
    type Answer = usize;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let st = d::View::new(txn)?;
        let rows = st.parked_of_route(&self.route, self.since_us, RECOVER_MAX)?;
        let c = Change {
            at_us: round.now_us,
            by: Some(self.by.clone()),
            reason: Some(self.reason.clone()),
            ..Change::default()
        };
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            events.push(event(T::Retried, row.id.as_str(), &c)?);
        }
        Ok(Decided::new(rows.len(), events))
    }
}
