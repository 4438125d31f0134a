//! The checks on a client's batch that requests notifications (spec section 14, in this order
//! after the request's shape, size, schema and scope): an `event_id` already in the log with
//! other content is the log's `409 conflict`; a notification for a recipient suppressed at the
//! head is `409 recipient_blocked` (the crisis hard-block: nothing of the request is appended);
//! then the outbox bound is `429 outbox_full` (section 5): only a request that would create a
//! new delivery is refused, when the deliveries pending — those in the model and those the
//! router will make for notifications it has not routed yet — plus the request's own would be
//! above `max_pending`, so the bound is never exceeded; a dashboard-only notification is
//! accepted. An exact duplicate of an event already in the log is answered `duplicate: true`
//! by the log and never blocked or counted.
//!
//! Suppression is judged at the head, applying the batch's own earlier recipient events in
//! order, at the command's time (a suppression whose `until` has passed does not block); the
//! batch is appended on the condition that the recipients it names have no newer event.

use crate::error::CommandError;
use std::collections::HashMap;

use tidemark_log::NewEvent;
use tidemark_projections::deliveries;
use tidemark_projections::deliveries::Recipient;
use tidemark_projections::names::{EventType, Stream};
use tidemark_projections::notifications;
use tidemark_projections::routing::{RouteOutcome, RoutingSettings, resolve_routes};

use super::{Command, DecideResult, Decided, Round};
use tidemark_projections::ModelsTxn;

/// What the checks decided about a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Append it.
    Accept,
    /// These events (0-based indexes) request notifications for suppressed recipients.
    Blocked(Vec<usize>),
    /// The request's deliveries would take the outbox above `max_pending`.
    Full {
        /// Deliveries pending or about to be routed.
        pending: u64,
        /// Deliveries the request would add.
        adding: u64,
        /// Seconds until the outbox has drained enough at the rate it completed deliveries
        /// over the last minute: at least 1, at most 3600.
        retry_after_s: u64,
    },
}

/// A client's batch that requests notifications, to be judged at the head and appended if
/// accepted. `known[i]` says that event `i` is already in the log with the same content.
/// Answers whether it was accepted (and appended), or why not.
#[derive(Debug, Clone)]
pub struct Admit {
    pub events: Vec<NewEvent>,
    pub known: Vec<bool>,
    pub max_pending: u64,
}

impl Command for Admit {
    type Answer = Admission;

    /// Judge the batch; accepted, its events are the decision, on the condition that the
    /// recipients it was judged against have not changed since (a suppression appended
    /// meanwhile is not missed).
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let before = round.pending_added;
        let admission = admit(txn, &self.events, &self.known, round, self.max_pending)?;
        let marker = match (&admission, self.events.first()) {
            (Admission::Accept, Some(first)) => admitted_marker(
                round,
                first.event_id.as_deref().unwrap_or_default(),
                round.pending_added - before,
            )?,
            _ => None,
        };
        let mut reads = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            if self.known.get(i).copied().unwrap_or(false) {
                continue;
            }
            if EventType::parse(&e.event_type) == Some(EventType::NotificationRequested)
                && Stream::parse(&e.stream) == Some(Stream::Notifications)
                && let Some(who) = payload(e).get("recipient").and_then(|v| v.as_str())
            {
                reads.push((Stream::Recipients.as_str().to_owned(), who.to_owned()));
            }
        }
        let events = match admission {
            Admission::Accept => self.events.iter().cloned().chain(marker).collect(),
            _ => Vec::new(),
        };
        Ok(Decided {
            answer: admission,
            events,
            reads,
        })
    }
}

/// The window the drain rate of a refusal's `Retry-After` is measured over.
const DRAIN_WINDOW_S: u64 = 60;

/// Judge `events` at the head (`txn` has the read models caught up). `known[i]` says that event
/// `i` is already in the log with the same content (the log will answer it as a duplicate).
pub(crate) fn admit(
    txn: &ModelsTxn,
    events: &[NewEvent],
    known: &[bool],
    round: &mut Round<'_>,
    max_pending: u64,
) -> Result<Admission, CommandError> {
    let now_us = round.now_us;
    let mut state = deliveries::View::new(txn)?;
    let mut recipients: HashMap<&str, Recipient> = HashMap::new();
    let mut blocked = Vec::new();
    let mut notices: Vec<(String, Option<String>)> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if known.get(i).copied().unwrap_or(false) {
            continue;
        }
        let Some(ty) = EventType::parse(&e.event_type) else {
            continue;
        };
        match ty {
            EventType::RecipientUpdated
            | EventType::RecipientSuppressed
            | EventType::RecipientUnsuppressed
                if Stream::parse(&e.stream) == Some(Stream::Recipients) =>
            {
                let r = match recipients.entry(e.subject.as_str()) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(state.recipient(Some(&e.subject))?)
                    }
                };
                r.apply(ty, &payload(e));
            }
            EventType::NotificationRequested
                if Stream::parse(&e.stream) == Some(Stream::Notifications) =>
            {
                let p = payload(e);
                let s = |k: &str| p.get(k).and_then(|v| v.as_str()).map(str::to_owned);
                notices.push((s("priority").unwrap_or_else(|| "info".into()), s("type")));
                let Some(who) = p.get("recipient").and_then(|v| v.as_str()) else {
                    continue;
                };
                let suppressed = match recipients.get(who) {
                    Some(r) => r.suppressed_at(now_us),
                    None => state.recipient(Some(who))?.suppressed_at(now_us),
                };
                if suppressed {
                    blocked.push(i);
                }
            }
            _ => {}
        }
    }
    if !blocked.is_empty() {
        metrics::counter!("tidemark_notifications_blocked_total").increment(blocked.len() as u64);
        return Ok(Admission::Blocked(blocked));
    }
    let notices: Vec<(&str, Option<&str>)> = notices
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_deref()))
        .collect();
    over_bound(txn, &mut state, &notices, round, max_pending)
}

/// The outbox bound for new notifications of these (priority, type) (section 5): `Full` when the
/// deliveries they would make (under the settings at the head), added to those pending and
/// those the router will make for the notifications it has not routed yet, would be above
/// `max_pending`; `Accept` when they make none or fit. Shared by clients' appends and source
/// pages. What the round's earlier accepted batches add (not in the models yet) counts as
/// pending, and an accepted batch adds its own to it.
pub(crate) fn over_bound(
    txn: &ModelsTxn,
    state: &mut tidemark_projections::deliveries::View<'_>,
    notices: &[(&str, Option<&str>)],
    round: &mut Round<'_>,
    max_pending: u64,
) -> Result<Admission, CommandError> {
    let now_us = round.now_us;
    let settings = state.settings_at(u64::MAX)?;
    let per = |s: &RoutingSettings, priority: &str, ty: Option<&str>| {
        resolve_routes(s, priority, ty)
            .iter()
            .filter(|o| matches!(o, RouteOutcome::Deliver { .. }))
            .count() as u64
    };
    let adding: u64 = notices.iter().map(|(p, t)| per(&settings, p, *t)).sum();
    if adding == 0 {
        return Ok(Admission::Accept);
    }
    // Notifications not routed yet are weighed by priority alone: as if each took every route
    // its priority names, whatever the routes' `types` (an upper bound).
    let mut untyped = settings.clone();
    untyped.routes.values_mut().for_each(|p| p.types = None);
    let per = |priority: &str| per(&untyped, priority, None);
    let st = CommandError::Models;
    let routed = state.routed()?;
    let pending = state.pending()?
        + notifications::View::new(txn)?
            .weighted_after(routed, per)
            .map_err(st)?
        + round.pending_added;
    if pending + adding <= max_pending {
        round.pending_added += adding;
        return Ok(Admission::Accept);
    }
    metrics::counter!("tidemark_outbox_refused_total").increment(1);
    let over = pending + adding - max_pending;
    let since = now_us.saturating_sub(DRAIN_WINDOW_S as i64 * 1_000_000);
    let drained = state.sent_since(since)?;
    Ok(Admission::Full {
        pending,
        adding,
        retry_after_s: retry_after_s(over, drained),
    })
}

/// On a cluster ([`Round::shared_outbox`]), the `outbox.admitted` event of an accepted
/// admission that adds `adding` deliveries (none when it adds none, or on a single node): on
/// the one subject every node's admissions write, so the decider appends the admission on the
/// condition that no other admission came in since the models it was judged on. Its id is
/// derived from the admission's first event (`adm:` and a hash), so a retry of the same batch
/// cannot write it twice.
pub(crate) fn admitted_marker(
    round: &Round<'_>,
    first_id: &str,
    adding: u64,
) -> Result<Option<NewEvent>, CommandError> {
    if !round.shared_outbox || adding == 0 {
        return Ok(None);
    }
    let hash = blake3::hash(first_id.as_bytes());
    let id = format!("adm:{}", &hash.to_hex()[..40]);
    NewEvent::new(
        Some(id),
        Stream::Outbox.as_str(),
        ADMISSIONS,
        EventType::OutboxAdmitted.as_str(),
        &serde_json::json!({"adding": adding}),
    )
    .map(Some)
    .map_err(CommandError::invalid_event)
}

/// The one subject of the outbox's admissions.
pub const ADMISSIONS: &str = "admissions";

/// ceil(`over` ÷ (`drained` per [`DRAIN_WINDOW_S`])), at least 1 s and at most 3600 s (an
/// outbox that drained nothing: 3600).
pub(crate) fn retry_after_s(over: u64, drained: u64) -> u64 {
    if drained == 0 {
        return 3600;
    }
    (over.saturating_mul(DRAIN_WINDOW_S).div_ceil(drained)).clamp(1, 3600)
}

fn payload(e: &NewEvent) -> serde_json::Value {
    serde_json::from_slice(e.payload_bytes()).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::retry_after_s;

    #[test]
    fn retry_after_follows_the_drain_rate() {
        assert_eq!(retry_after_s(1, 60), 1, "one a second, one over: 1 s");
        assert_eq!(retry_after_s(1, 1), 60, "one a minute, one over: 60 s");
        assert_eq!(retry_after_s(10, 7), 86, "ceil(10 × 60 / 7)");
        assert_eq!(retry_after_s(1, 10_000), 1, "at least 1 s");
        assert_eq!(retry_after_s(1_000_000, 1), 3600, "at most an hour");
        assert_eq!(retry_after_s(5, 0), 3600, "nothing drained: an hour");
    }
}
