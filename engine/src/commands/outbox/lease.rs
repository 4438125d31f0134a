//! Leases and their ends: claim, expiry, complete, fail, extend, operator retry / discard.

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
use crate::commands::sealed::Sealed;
use crate::commands::{Command, Decided, Round};
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
    if row.ext.cancel_pending && row.allows(T::Cancelled) {
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
    let Some(end) = quiet_end(policy, &row.priority, &recipient, due.max(now_us)) else {
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

/// Lease due delivery `id` to `owner`, or record why it is not leased (its expired lease
/// parked it, a hold moved it, its recipient is suppressed now); `None` when it is not.
#[expect(
    clippy::too_many_arguments,
    reason = "one lease's decision: the claim's inputs, passed on from its loop"
)]
fn take(
    st: &mut d::View<'_>,
    round: &crate::commands::Round<'_>,
    id: &str,
    now_us: i64,
    settings: &RoutingSettings,
    privacy: Option<&Privacy>,
    owner: &str,
    lease_ms: u64,
    share: tidemark_log::Share,
    events: &mut Vec<NewEvent>,
) -> Result<Option<Delivery>, CommandError> {
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
        owner: Some(owner.to_owned()),
        attempt: Some(row.attempts + 1),
        lease_expires_at_us: Some(now_us.saturating_add(lease_ms as i64 * 1_000)),
        ..Change::default()
    };
    transition(&mut row, T::Leased, &c, 0);
    events.push(event(T::Leased, id, &c)?);
    Ok(Some(row))
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
            Ok(row) if row.ext.cancel_pending => Err(CommandError::rejected(
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

/// Lease up to `limit` due deliveries of `sink` to `owner` for `lease_ms`; answers the rows
/// now leased.
#[derive(Debug, Clone)]
pub struct Claim {
    pub sink: Sink,
    pub owner: String,
    pub limit: usize,
    pub lease_ms: u64,
    /// This node's share of the due deliveries, taken first ([`tidemark_log::Share::ALL`] on a
    /// single node).
    pub share: tidemark_log::Share,
}

impl Sealed for Claim {}
impl Command for Claim {
    type Answer = Vec<Delivery>;

    fn name(&self) -> &'static str {
        "outbox.claim"
    }

    /// Claim due deliveries of `sink`, the most pressing priority first (urgent, action, warning,
    /// info), oldest due first within one: queued, retry_wait past its next attempt, leased past
    /// its lease (released first). Suppression is re-checked: a delivery to a recipient
    /// suppressed now is skipped instead. Answers the leased rows.
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Vec<Delivery>>, CommandError> {
        let (sink, owner, limit, lease_ms, share) = (
            self.sink,
            self.owner.as_str(),
            self.limit,
            self.lease_ms,
            self.share,
        );
        let now_us = round.now_us;
        let privacy = round.privacy;
        let mut st = d::View::new(txn)?;
        let settings = st.settings_at(u64::MAX)?;
        let mut leased = Vec::new();
        let mut events = Vec::new();
        // An open circuit's probe first: one delivery of the route, once its cool-down (or
        // the previous probe's lease) has passed; the route's others keep waiting.
        for (route, id) in circuit::probes(&mut st, sink, now_us)? {
            if leased.len() >= limit || round.touches(Stream::Endpoints.as_str(), &route) {
                continue;
            }
            if let Some(row) = take(
                &mut st,
                round,
                &id,
                now_us,
                &settings,
                privacy,
                owner,
                lease_ms,
                share,
                &mut events,
            )? {
                events.push(circuit::probed(
                    &row,
                    now_us,
                    row.lease_expires_at_us.unwrap_or(now_us),
                )?);
                leased.push(row);
            }
        }
        for rank in 0..d::PRIORITY_RANKS {
            let mut after = None;
            while leased.len() < limit {
                // Among the next due deliveries, this node's share first (spec section 16):
                // claimers on several nodes of a cluster take different deliveries in a storm
                // instead of racing for the same ones; another share's are taken when this
                // one's run short.
                let (ids, end) = st.due(
                    sink,
                    rank,
                    now_us,
                    after.as_ref(),
                    (limit - leased.len()) * share.of.max(1),
                )?;
                if ids.is_empty() {
                    break;
                }
                let (own, others): (Vec<&String>, Vec<&String>) =
                    ids.iter().partition(|id| share.owns(id));
                for id in own.into_iter().chain(others) {
                    if leased.len() >= limit {
                        break;
                    }
                    if let Some(row) = take(
                        &mut st,
                        round,
                        id,
                        now_us,
                        &settings,
                        privacy,
                        owner,
                        lease_ms,
                        share,
                        &mut events,
                    )? {
                        leased.push(row);
                    }
                }
                after = end;
            }
        }
        // A delivering sink's lease rests on its route's endpoint not holding it: appended on
        // the condition that no endpoint event of those routes came in since (a circuit that
        // opened on another decider refuses this claim, which is decided again).
        let mut d = Decided::new(leased, events);
        if delivering(Some(sink)) {
            let mut routes: Vec<&str> = d.answer.iter().map(|r| r.route.as_str()).collect();
            routes.sort_unstable();
            routes.dedup();
            d.reads = routes
                .into_iter()
                .map(|r| (Stream::Endpoints.as_str().to_owned(), r.to_owned()))
                .collect();
        }
        Ok(d)
    }
}

/// Release at most `max` leases expired by now; answers how many.
#[derive(Debug, Clone)]
pub struct ExpireLeases {
    pub max: usize,
}

impl Sealed for ExpireLeases {}
impl Command for ExpireLeases {
    type Answer = usize;

    fn name(&self) -> &'static str {
        "outbox.expire_leases"
    }

    /// Release leases that expired by `now_us` (at most `max`): the periodic tick and the one at
    /// start-up. Answers how many.
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<usize>, CommandError> {
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

impl Sealed for Complete {}
impl Command for Complete {
    type Answer = Vec<Completed>;

    fn name(&self) -> &'static str {
        "outbox.complete"
    }

    /// Complete many deliveries leased by `owner` in one command (one transaction, one fold of
    /// the read models): each item is checked on its own, and refused items change
    /// nothing while the others are recorded.
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Vec<Completed>>, CommandError> {
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

/// The lease owner reports one delivery sent ([`Complete`] of one item); answers it.
#[derive(Debug, Clone)]
pub struct CompleteOne {
    pub id: DeliveryId,
    pub owner: String,
    pub external_id: Option<String>,
    /// Whom it reached (tidemark's dispatcher; empty for an app's completion).
    pub resolved_targets: Vec<String>,
}

impl Sealed for CompleteOne {}
impl Command for CompleteOne {
    type Answer = Completed;

    fn name(&self) -> &'static str {
        "outbox.complete"
    }

    /// Complete one delivery leased by `owner` ([`Complete`] of one item).
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Completed>, CommandError> {
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

/// The lease owner reports a failed attempt; answers the row after it.
#[derive(Debug, Clone)]
pub struct Fail {
    pub id: DeliveryId,
    pub owner: String,
    pub failure: Failure,
}

impl Sealed for Fail {}
impl Command for Fail {
    type Answer = Delivery;

    fn name(&self) -> &'static str {
        "outbox.fail"
    }

    /// The lease owner reports a failed attempt: retry_wait with backoff, or parked when it is
    /// permanent or the last attempt.
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Delivery>, CommandError> {
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

/// The lease owner extends its lease to `lease_ms` from now; answers the row after it.
#[derive(Debug, Clone)]
pub struct Extend {
    pub id: DeliveryId,
    pub owner: String,
    pub lease_ms: u64,
}

impl Sealed for Extend {}
impl Command for Extend {
    type Answer = Delivery;

    fn name(&self) -> &'static str {
        "outbox.extend"
    }

    /// The lease owner extends its lease (heartbeat); an expired lease cannot be extended.
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Delivery>, CommandError> {
        let (now_us, owner, lease_ms) = (round.now_us, self.owner.as_str(), self.lease_ms);
        let id = self.id.as_str();
        let mut st = d::View::new(txn)?;
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

/// An operator retries or discards a parked delivery, or resends a sent one; answers the row
/// after it.
#[derive(Debug, Clone)]
pub struct Operator {
    pub id: DeliveryId,
    pub action: OperatorAction,
    /// The token's name; `None` in open mode.
    pub by: Option<String>,
    pub reason: Option<String>,
}

impl Sealed for Operator {}
impl Command for Operator {
    type Answer = Delivery;

    fn name(&self) -> &'static str {
        "outbox.operator"
    }

    /// Operator action on a parked delivery: `retried` (back to queued with attempts 0) or
    /// `discarded`.
    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<Delivery>, CommandError> {
        let (now_us, action, by, reason) = (
            round.now_us,
            self.action,
            self.by.as_deref(),
            self.reason.clone(),
        );
        let id = self.id.as_str();
        let mut st = d::View::new(txn)?;
        let mut row = st.row(id)?.ok_or_else(|| not_found(id))?;
        let kind = action.transition();
        if !row.allows(kind) {
            let verb = match action {
                OperatorAction::Retry => "retry",
                OperatorAction::Discard => "discard",
                OperatorAction::Resend => "resend",
            };
            return Err(illegal(&row, verb));
        }
        let c = Change {
            at_us: now_us,
            by: Some(by.map(str::to_owned)),
            reason,
            ..Change::default()
        };
        transition(&mut row, kind, &c, 0);
        Ok(Decided::new(row, vec![event(kind, id, &c)?]))
    }
}

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

impl Sealed for Recover {}
impl Command for Recover {
    type Answer = usize;

    fn name(&self) -> &'static str {
        "outbox.recover"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<usize>, CommandError> {
        let mut st = d::View::new(txn)?;
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

/// What an operator does to a delivery: retry or discard a parked one, resend a sent one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    Retry,
    Discard,
    Resend,
}

impl OperatorAction {
    /// The transition it records (`delivery.retried` / `delivery.discarded`).
    pub fn transition(self) -> DeliveryTransition {
        match self {
            OperatorAction::Retry => DeliveryTransition::Retried,
            OperatorAction::Discard => DeliveryTransition::Discarded,
            OperatorAction::Resend => DeliveryTransition::Resent,
        }
    }

    /// The name of its transition (`retried` / `discarded`), for metrics.
    pub fn kind(self) -> &'static str {
        self.transition().as_str()
    }
}
