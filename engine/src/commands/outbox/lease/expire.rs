//! `ExpireLeases`: release the leases expired by now.

use super::*;

/// Release at most `max` leases expired by now; answers how many.
#[derive(Debug, Clone)]
pub struct ExpireLeases {
    pub max: usize,
}

impl Command for ExpireLeases {
    type Answer = usize;

    /// Release leases that expired by `now_us` (at most `max`): the periodic tick and the one at
    /// start-up. Answers how many.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let (now_us, max, privacy) = (round.now_us, self.max, round.privacy);
        let mut st = d::View::new(txn)?;
        let mut settings = None;
        let mut released = 0;
        let mut events = Vec::new();
        for id in st.leases_expired(now_us, max)? {
            let Some(mut row) = st.row(&id)? else {
                continue;
            };
            if row.status != S::Leased {
                continue;
            }
            let c = expiry(&row, now_us);
            transition(&mut row, T::LeaseExpired, &c, 0);
            events.push(event(T::LeaseExpired, &id, &c)?);
            released += 1;
            let settings = match &settings {
                Some(s) => s,
                None => settings.insert(st.settings_at(u64::MAX)?),
            };
            hold(&mut st, &mut row, now_us, settings, privacy, &mut events)?;
        }
        Ok(Decided::new(released, events))
    }
}
