//! Leases and their ends, one command per file: [`claim`], [`expire`] (lease expiry),
//! [`complete`] and [`complete_one`], [`fail`], [`extend`], [`operator`] (retry, discard,
//! resend) and [`recover`]. What more than one of them does is here: the holds before a claim
//! and after a lease ends, the checks of a lease, a completion's item.

mod claim;
mod complete;
mod complete_one;
mod expire;
mod extend;
mod fail;
mod operator;
mod recover;

pub use claim::Claim;
pub use complete::Complete;
pub use complete_one::CompleteOne;
pub use expire::ExpireLeases;
pub use extend::Extend;
pub use fail::Fail;
pub use operator::{Operator, OperatorAction};
pub use recover::{RECOVER_MAX, Recover};

use crate::error::{CommandError, Rejection};
use std::collections::HashMap;
use tidemark_log::NewEvent;
use tidemark_projections::deliveries::{self as d, Change, Delivery, transition};
use tidemark_projections::ids::DeliveryId;
use tidemark_projections::names::{
    DeliveryStatus as S, DeliveryTransition, DeliveryTransition as T, Sink, Stream,
};
use tidemark_projections::routing::backoff_ms;

use tidemark_projections::routing::RoutingSettings;

use super::route::quiet_end;
use super::{circuit, draw, event, recipient_of};
use crate::commands::{Command, DecideResult, Decided, Round};
use crate::privacy::Privacy;
use std::collections::HashSet;
use tidemark_projections::ModelsTxn;
use tidemark_projections::endpoints::delivering;

/// What follows a lease's end (expiry, failure) or precedes a claim, recorded as events so a
/// replay is exact (section 4): a delivery whose notification was canceled while leased is
/// cancelled; a due time inside the recipient's quiet window (the time zone in force now)
/// moves to the window's end (`delivery.deferred`, reason `quiet_hours`). True when the row
/// is no longer claimable now.
fn hold(
    st: &mut d::View<'_>,
    row: &mut Delivery,
    now_us: i64,
    settings: &RoutingSettings,
    privacy: Option<&Privacy>,
    events: &mut Vec<NewEvent>,
) -> Result<bool, CommandError> {
    if row.cancel_pending && row.allows(T::Cancelled) {
        let c = Change {
            at_us: now_us,
            reason: Some("notification_canceled".into()),
            ..Change::default()
        };
        transition(row, T::Cancelled, &c, 0);
        events.push(event(T::Cancelled, row.id.as_str(), &c)?);
        return Ok(true);
    }
    let Some(due) = row.next_attempt_at_us.filter(|_| row.allows(T::Deferred)) else {
        return Ok(false);
    };
    // Most routes have no quiet hours: no copy of the policy, no recipient read.
    let Some(policy) = settings
        .routes
        .get(&row.route)
        .filter(|p| p.quiet_hours.is_some())
    else {
        return Ok(false);
    };
    let recipient = recipient_of(st, row, privacy)?;
    let Some(end) = quiet_end(policy, row.priority.as_str(), &recipient, due.max(now_us)) else {
        return Ok(false);
    };
    let c = Change {
        at_us: now_us,
        next_attempt_at_us: Some(end),
        reason: Some("quiet_hours".into()),
        quiet_hours_until_us: Some(end),
        ..Change::default()
    };
    transition(row, T::Deferred, &c, 0);
    events.push(event(T::Deferred, row.id.as_str(), &c)?);
    Ok(true)
}

fn not_found(id: &str) -> CommandError {
    CommandError::rejected(Rejection::DeliveryNotFound, format!("no delivery {id:?}"))
}

fn illegal(row: &Delivery, action: &str) -> CommandError {
    CommandError::rejected(
        Rejection::IllegalTransition,
        format!(
            "delivery {:?} is {}: {action} is not allowed from that state",
            row.id, row.status
        ),
    )
}

/// The row, leased by `owner` and not expired at `now_us`: once a lease has passed its
/// `lease_expires_at` the delivery is due again (spec section 5), whether or not the expiry
/// tick has recorded it yet, so the old owner's complete, fail or extend is refused the same
/// way every time.
fn owned_lease(
    row: Option<Delivery>,
    now_us: i64,
    id: &str,
    owner: &str,
    action: &str,
) -> Result<Delivery, CommandError> {
    let row = row.ok_or_else(|| not_found(id))?;
    if row.status != S::Leased {
        return Err(illegal(&row, action));
    }
    if row.lease_owner.as_deref() != Some(owner) {
        return Err(CommandError::rejected(
            Rejection::NotLeaseOwner,
            format!("delivery {id:?} is leased by another owner"),
        ));
    }
    if row.lease_expires_at_us.is_some_and(|e| e <= now_us) {
        return Err(CommandError::rejected(
            Rejection::LeaseExpired,
            format!("the lease on {id:?} has expired; claim it again"),
        ));
    }
    Ok(row)
}

/// One claim's inputs, and what it has leased and recorded so far.
struct Lease<'a> {
    now_us: i64,
    settings: RoutingSettings,
    privacy: Option<&'a Privacy>,
    owner: &'a str,
    lease_ms: u64,
    share: tidemark_log::Share,
    leased: Vec<Delivery>,
    events: Vec<NewEvent>,
}

impl Lease<'_> {
    /// Lease due delivery `id` to the owner, or record why it is not leased (its expired
    /// lease parked it, a hold moved it, its recipient is suppressed now); `None` when it is
    /// not.
    fn take(
        &mut self,
        st: &mut d::View<'_>,
        round: &crate::commands::Round<'_>,
        id: &str,
    ) -> Result<Option<Delivery>, CommandError> {
        let (now_us, privacy, share) = (self.now_us, self.privacy, self.share);
        let (settings, events) = (&self.settings, &mut self.events);
        // A claim earlier in the same round took it (or another command of the round records
        // something of it): left to the next round.
        if round.touches(Stream::Deliveries.as_str(), id) {
            return Ok(None);
        }
        let Some(mut row) = st.row(id)? else {
            return Ok(None);
        };
        // Not the first of its key in its route's order (section 4): it waits (the claim's
        // indexes leave it out; a probe's does not).
        if st.order_waits(&row)?.is_some() {
            return Ok(None);
        }
        if row.status == S::Leased {
            let c = expiry(&row, now_us);
            transition(&mut row, T::LeaseExpired, &c, 0);
            events.push(event(T::LeaseExpired, id, &c)?);
            if row.status == S::Parked {
                hold(st, &mut row, now_us, settings, privacy, events)?;
                return Ok(None);
            }
        }
        if hold(st, &mut row, now_us, settings, privacy, events)? {
            return Ok(None);
        }
        if recipient_of(st, &row, privacy)?.suppressed_at(now_us) {
            let c = Change {
                at_us: now_us,
                reason: Some("suppressed".into()),
                ..Change::default()
            };
            events.push(event(T::Skipped, id, &c)?);
            return Ok(None);
        }
        // Its route's pace (section 4): beyond it, it stays due and spends no attempt.
        if let Some(rate) = settings.rate_of(&row.route)
            && !round.pacer.admit(&row.route, row.sink, rate, share, now_us)
        {
            return Ok(None);
        }
        let c = Change {
            at_us: now_us,
            owner: Some(self.owner.to_owned()),
            attempt: Some(row.attempts + 1),
            lease_expires_at_us: Some(now_us.saturating_add(self.lease_ms as i64 * 1_000)),
            ..Change::default()
        };
        transition(&mut row, T::Leased, &c, 0);
        events.push(event(T::Leased, id, &c)?);
        Ok(Some(row))
    }
}

/// A lease's expiry: back to queued, or parked when it used the last attempt.
fn expiry(row: &Delivery, now_us: i64) -> Change {
    let parked = row.attempts >= row.max_attempts;
    Change {
        at_us: now_us,
        owner: row.lease_owner.clone(),
        attempt: Some(row.attempts),
        next_attempt_at_us: (!parked).then_some(now_us),
        parked: Some(parked),
        reason: parked.then(|| "max_attempts".into()),
        ..Change::default()
    }
}

/// One item of a batch completion: the row it left, or why it was refused.
#[derive(Debug, Clone)]
pub enum Completed {
    Sent(Box<Delivery>),
    Refused { code: Rejection, detail: String },
}

impl Completed {
    /// The row, or the refusal as the error a single completion answers.
    pub fn into_result(self) -> Result<Delivery, CommandError> {
        match self {
            Completed::Sent(row) => Ok(*row),
            Completed::Refused { code, detail } => Err(CommandError::rejected(code, detail)),
        }
    }
}

/// What a completion records besides the transition: the owner's external id, and whom
/// tidemark's dispatcher reached.
#[derive(Clone, Copy)]
struct SentWith<'b> {
    external_id: Option<&'b str>,
    resolved_targets: &'b [String],
}

/// What the items of one completion command did before the next (the models do not show it
/// yet): the rows they completed, and the routes whose circuit they closed.
#[derive(Default)]
struct Earlier<'a> {
    done: HashMap<&'a str, Delivery>,
    closed: HashSet<String>,
}

/// One item of a completion, after the command's `earlier` items; its events join `events`.
fn complete_item<'a>(
    st: &mut d::View<'_>,
    now_us: i64,
    owner: &str,
    id: &'a str,
    sent: SentWith<'_>,
    earlier: &mut Earlier<'a>,
    events: &mut Vec<NewEvent>,
) -> Result<Completed, CommandError> {
    let current = match earlier.done.get(id) {
        Some(r) => Some(r.clone()),
        None => st.row(id)?,
    };
    let result = match current {
        None => Err(not_found(id)),
        Some(row) if row.status == S::Sent && row.lease_owner.as_deref() == Some(owner) => {
            return Ok(Completed::Sent(Box::new(row)));
        }
        row => match owned_lease(row, now_us, id, owner, "complete") {
            Err(e) => Err(e),
            Ok(row) if row.cancel_pending => Err(CommandError::rejected(
                Rejection::IllegalTransition,
                format!(
                    "the notification of delivery {id:?} was canceled: it is cancelled \
                     when this lease ends, and cannot be completed"
                ),
            )),
            Ok(mut row) => {
                let c = Change {
                    at_us: now_us,
                    owner: Some(owner.to_owned()),
                    attempt: Some(row.attempts),
                    external_id: sent.external_id.map(str::to_owned),
                    resolved_targets: (!sent.resolved_targets.is_empty())
                        .then(|| sent.resolved_targets.to_vec()),
                    ..Change::default()
                };
                transition(&mut row, T::Sent, &c, 0);
                events.push(event(T::Sent, id, &c)?);
                circuit::after_success(st, &row, now_us, &mut earlier.closed, events)?;
                earlier.done.insert(id, row.clone());
                Ok(row)
            }
        },
    };
    match result {
        Ok(row) => Ok(Completed::Sent(Box::new(row))),
        Err(CommandError::Rejected { code, detail }) => Ok(Completed::Refused { code, detail }),
        Err(e) => Err(e),
    }
}

/// What a failure report says.
#[derive(Debug, Clone)]
pub struct Failure {
    pub error_code: String,
    pub error: String,
    pub retryable: bool,
    pub retry_after_ms: Option<u64>,
}
