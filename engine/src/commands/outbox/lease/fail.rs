//! `Fail`: an attempt failed; retried after its backoff, or parked.

use super::*;

/// The lease owner reports a failed attempt; answers the row after it.
#[derive(Debug, Clone)]
pub struct Fail {
    pub id: DeliveryId,
    pub owner: String,
    pub failure: Failure,
}

impl Command for Fail {
    type Answer = Delivery;

    /// The lease owner reports a failed attempt: retry_wait with backoff, or parked when it is
    /// permanent or the last attempt.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let (now_us, owner, f, privacy) = (
            round.now_us,
            self.owner.as_str(),
            self.failure.clone(),
            round.privacy,
        );
        let id = self.id.as_str();
        let mut st = d::View::new(txn)?;
        let mut row = owned_lease(st.row(id)?, now_us, id, owner, "fail")?;
        let settings = st.settings_at(u64::MAX)?;
        let parked = !f.retryable || row.attempts >= row.max_attempts;
        let next = if parked {
            None
        } else {
            let retry = settings.retry_for(&row.route);
            // The jitter is a draw from the delivery and its attempt: replaying the decision
            // draws the same.
            let u = draw(&[id.as_bytes(), &row.attempts.to_le_bytes(), b"retry"]);
            let ms = backoff_ms(retry, row.attempts.max(1), u, f.retry_after_ms);
            Some(now_us.saturating_add(ms as i64 * 1_000))
        };
        let c = Change {
            at_us: now_us,
            owner: Some(owner.to_owned()),
            attempt: Some(row.attempts),
            next_attempt_at_us: next,
            error_code: Some(f.error_code),
            error: Some(f.error),
            retryable: Some(f.retryable),
            retry_after_ms: f.retry_after_ms,
            parked: Some(parked),
            reason: parked.then(|| {
                if f.retryable {
                    "max_attempts"
                } else {
                    "permanent_failure"
                }
                .into()
            }),
            ..Change::default()
        };
        transition(&mut row, T::AttemptFailed, &c, 0);
        let mut events = vec![event(T::AttemptFailed, id, &c)?];
        circuit::after_failure(&mut st, &row, &c, &settings, &mut events)?;
        hold(&mut st, &mut row, now_us, &settings, privacy, &mut events)?;
        Ok(Decided::new(row, events))
    }
}
