//! The outbox family (spec sections 4 and 5): routing notifications into deliveries, leases,
//! completions, failures and operator actions. Each command reads the deliveries model at the
//! head, checks the transition, and returns the events that record it, appended on the
//! condition that the deliveries it names have no newer event: two claims never lease one row
//! (two claims of one decider's round skip each other's rows; a second decider's is refused
//! by the log and decided again).
//!
//! The clock and random draws are read here, never in the fold: `now_us` is passed in and the
//! chosen times are written into the events; a draw is a hash of the delivery id, so a replayed
//! decision is the same decision.
//!
//! - `route`: notifications and task cancellations → `delivery.created` / `joined` /
//!   `cancelled`, quiet hours, digests.
//! - `lease`: claim, expiry, complete, fail, extend, operator retry / discard.

mod lease;
mod route;

use crate::error::CommandError;
use serde_json::Value;
use tidemark_log::{Event, NewEvent, StorageError};
use tidemark_projections::deliveries::{self as d, Delivery, Recipient};
use tidemark_projections::framework::{TxnTables, be_u64};
use tidemark_projections::names::{DeliveryTransition, EventType, Stream};
use tidemark_projections::routing::RoutingSettings;

use super::sealed::Sealed;
use super::{Command, Decided, Round};
use crate::privacy::Privacy;
use crate::store::{ReadableTable, WriteTransaction};

pub use lease::{Completed, Failure};
pub use route::quiet_hours_end;
pub use tidemark_projections::ids::DeliveryId;

/// Lease up to `limit` due deliveries of `sink` to `owner` for `lease_ms`; answers the rows
/// now leased.
#[derive(Debug, Clone)]
pub struct Claim {
    pub sink: String,
    pub owner: String,
    pub limit: usize,
    pub lease_ms: u64,
    /// This node's share of the due deliveries, taken first ([`tidemark_log::Share::ALL`] on a
    /// single node).
    pub share: tidemark_log::Share,
}

/// The lease owner reports these deliveries (id, external id) sent; answers each on its own,
/// in order.
#[derive(Debug, Clone)]
pub struct Complete {
    pub owner: String,
    pub items: Vec<(DeliveryId, Option<String>)>,
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

/// The lease owner reports a failed attempt; answers the row after it.
#[derive(Debug, Clone)]
pub struct Fail {
    pub id: DeliveryId,
    pub owner: String,
    pub failure: Failure,
}

/// The lease owner extends its lease to `lease_ms` from now; answers the row after it.
#[derive(Debug, Clone)]
pub struct Extend {
    pub id: DeliveryId,
    pub owner: String,
    pub lease_ms: u64,
}

/// An operator retries or discards a parked delivery; answers the row after it.
#[derive(Debug, Clone)]
pub struct Operator {
    pub id: DeliveryId,
    pub action: OperatorAction,
    /// The token's name; `None` in open mode.
    pub by: Option<String>,
    pub reason: Option<String>,
}

/// Route the notifications and task cancellations among `source` past the routing
/// checkpoint (the scheduler's command); answers how many events it appended.
#[derive(Debug, Clone)]
pub struct Route {
    pub source: Vec<Event>,
}

/// Release at most `max` leases expired by now; answers how many.
#[derive(Debug, Clone)]
pub struct ExpireLeases {
    pub max: usize,
}

/// What an operator does to a parked delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    Retry,
    Discard,
}

impl OperatorAction {
    /// The transition it records (`delivery.retried` / `delivery.discarded`).
    pub fn transition(self) -> DeliveryTransition {
        match self {
            OperatorAction::Retry => DeliveryTransition::Retried,
            OperatorAction::Discard => DeliveryTransition::Discarded,
        }
    }

    /// The name of its transition (`retried` / `discarded`), for metrics.
    pub fn kind(self) -> &'static str {
        self.transition().as_str()
    }
}

impl Sealed for Claim {}
impl Command for Claim {
    type Answer = Vec<Delivery>;

    fn name(&self) -> &'static str {
        "outbox.claim"
    }

    fn decide(
        &self,
        txn: &WriteTransaction,
        round: &mut Round<'_>,
    ) -> Result<Decided<Vec<Delivery>>, CommandError> {
        let (rows, ev) = lease::claim(
            txn,
            round,
            &self.sink,
            &self.owner,
            self.limit,
            self.lease_ms,
            self.share,
        )?;
        Ok(Decided::new(rows, ev))
    }
}

impl Sealed for Complete {}
impl Command for Complete {
    type Answer = Vec<Completed>;

    fn name(&self) -> &'static str {
        "outbox.complete"
    }

    fn decide(
        &self,
        txn: &WriteTransaction,
        round: &mut Round<'_>,
    ) -> Result<Decided<Vec<Completed>>, CommandError> {
        let (done, ev) = lease::complete_many(txn, round.now_us, &self.owner, &self.items)?;
        Ok(Decided::new(done, ev))
    }
}

impl Sealed for CompleteOne {}
impl Command for CompleteOne {
    type Answer = Completed;

    fn name(&self) -> &'static str {
        "outbox.complete"
    }

    fn decide(
        &self,
        txn: &WriteTransaction,
        round: &mut Round<'_>,
    ) -> Result<Decided<Completed>, CommandError> {
        let (done, ev) = lease::complete_one(
            txn,
            round.now_us,
            &self.owner,
            &self.id,
            self.external_id.as_deref(),
            &self.resolved_targets,
        )?;
        Ok(Decided::new(done, ev))
    }
}

impl Sealed for Fail {}
impl Command for Fail {
    type Answer = Delivery;

    fn name(&self) -> &'static str {
        "outbox.fail"
    }

    fn decide(
        &self,
        txn: &WriteTransaction,
        round: &mut Round<'_>,
    ) -> Result<Decided<Delivery>, CommandError> {
        let (row, ev) = lease::fail(
            txn,
            round.now_us,
            &self.id,
            &self.owner,
            self.failure.clone(),
            round.privacy,
        )?;
        Ok(Decided::new(row, ev))
    }
}

impl Sealed for Extend {}
impl Command for Extend {
    type Answer = Delivery;

    fn name(&self) -> &'static str {
        "outbox.extend"
    }

    fn decide(
        &self,
        txn: &WriteTransaction,
        round: &mut Round<'_>,
    ) -> Result<Decided<Delivery>, CommandError> {
        let (row, ev) = lease::extend(txn, round.now_us, &self.id, &self.owner, self.lease_ms)?;
        Ok(Decided::new(row, ev))
    }
}

impl Sealed for Operator {}
impl Command for Operator {
    type Answer = Delivery;

    fn name(&self) -> &'static str {
        "outbox.operator"
    }

    fn decide(
        &self,
        txn: &WriteTransaction,
        round: &mut Round<'_>,
    ) -> Result<Decided<Delivery>, CommandError> {
        let (row, ev) = lease::operator(
            txn,
            round.now_us,
            &self.id,
            self.action,
            self.by.as_deref(),
            self.reason.clone(),
        )?;
        Ok(Decided::new(row, ev))
    }
}

impl Sealed for Route {}
impl Command for Route {
    type Answer = usize;

    fn name(&self) -> &'static str {
        "outbox.route"
    }

    fn decide(
        &self,
        txn: &WriteTransaction,
        round: &mut Round<'_>,
    ) -> Result<Decided<usize>, CommandError> {
        let ev = route::route(txn, &self.source, round.privacy)?;
        Ok(Decided::new(ev.len(), ev))
    }
}

impl Sealed for ExpireLeases {}
impl Command for ExpireLeases {
    type Answer = usize;

    fn name(&self) -> &'static str {
        "outbox.expire_leases"
    }

    fn decide(
        &self,
        txn: &WriteTransaction,
        round: &mut Round<'_>,
    ) -> Result<Decided<usize>, CommandError> {
        let (n, ev) = lease::expire_leases(txn, round.now_us, self.max, round.privacy)?;
        Ok(Decided::new(n, ev))
    }
}

fn storage(e: StorageError) -> CommandError {
    CommandError::Models(e)
}

/// The deliveries model seen from inside the writer's transaction.
pub struct State<'t> {
    t: TxnTables<'t>,
}

impl<'t> State<'t> {
    pub fn new(txn: &'t WriteTransaction) -> Result<Self, CommandError> {
        Ok(State {
            t: TxnTables::new(txn, d::NAME).map_err(storage)?,
        })
    }

    pub fn row(&mut self, id: &str) -> Result<Option<Delivery>, CommandError> {
        self.t.get_val(d::ROWS, id.as_bytes()).map_err(storage)
    }

    /// The recipient a delivery row names: in clear, or (a redacted row) by its keyed hash,
    /// found among the recipients that have state (one without state has the defaults). The
    /// scan costs one HMAC per recipient with state; only redacted rows take it.
    pub(crate) fn recipient_of(
        &mut self,
        row: &Delivery,
        privacy: Option<&Privacy>,
    ) -> Result<Recipient, CommandError> {
        if !row.ext.redacted {
            return self.recipient(row.recipient.as_deref());
        }
        let (Some(hash), Some(p)) = (&row.recipient, privacy) else {
            return Ok(Recipient::default());
        };
        let t = self.t.table(d::RECIPIENTS).map_err(storage)?;
        for entry in t.iter().map_err(|e| storage(StorageError::of(e)))? {
            let (k, v) = entry.map_err(|e| storage(StorageError::of(e)))?;
            if p.recipient_hash(&String::from_utf8_lossy(k.value())) == *hash {
                return postcard::from_bytes(v.value()).map_err(|e| storage(StorageError::of(e)));
            }
        }
        Ok(Recipient::default())
    }

    /// A `notification.canceled` for `id` has been folded.
    pub fn notification_canceled(&mut self, id: &str) -> Result<bool, CommandError> {
        Ok(self
            .t
            .get(d::NOTIFICATIONS_CANCELED, id.as_bytes())
            .map_err(storage)?
            .is_some())
    }

    pub(crate) fn recipient(&mut self, r: Option<&str>) -> Result<Recipient, CommandError> {
        let Some(r) = r else {
            return Ok(Recipient::default());
        };
        Ok(self
            .t
            .get_val(d::RECIPIENTS, r.as_bytes())
            .map_err(storage)?
            .unwrap_or_default())
    }

    pub(super) fn u64_at(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<u64>, CommandError> {
        Ok(self
            .t
            .get(table, key)
            .map_err(storage)?
            .and_then(|b| be_u64(&b)))
    }

    /// Seq of the last notification or cancellation routing has handled.
    pub fn routed(&mut self) -> Result<u64, CommandError> {
        Ok(self.u64_at(d::STATE, d::ROUTED_KEY)?.unwrap_or(0))
    }

    /// The settings in force at `seq` (the last `settings.updated` at or before it).
    pub fn settings_at(&mut self, seq: u64) -> Result<RoutingSettings, CommandError> {
        let t = self.t.table(d::SETTINGS).map_err(storage)?;
        let mut range = t
            .range(..=seq.to_be_bytes().as_slice())
            .map_err(|e| storage(StorageError::of(e)))?;
        let Some(row) = range.next_back() else {
            return Ok(RoutingSettings::default());
        };
        let (_, v) = row.map_err(|e| storage(StorageError::of(e)))?;
        let json: Value =
            serde_json::from_slice(v.value()).map_err(|e| storage(StorageError::of(e)))?;
        // The server validated the settings before recording them.
        Ok(RoutingSettings::from_json(&json).unwrap_or_default())
    }

    /// Keys of `table` in `[from, to)`, at most `max`.
    pub(super) fn keys(
        &mut self,
        table: &'static str,
        from: &[u8],
        to: &[u8],
        max: usize,
    ) -> Result<Vec<Vec<u8>>, CommandError> {
        let t = self.t.table(table).map_err(storage)?;
        let mut out = Vec::new();
        for row in t
            .range(from..to)
            .map_err(|e| storage(StorageError::of(e)))?
        {
            let (k, _) = row.map_err(|e| storage(StorageError::of(e)))?;
            out.push(k.value().to_vec());
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }
}

/// The `delivery.*` event of type `ty` (a [`DeliveryTransition`] or `created` / `joined`) on
/// delivery `id`.
fn event(
    ty: impl Into<EventType>,
    id: &str,
    payload: &impl serde::Serialize,
) -> Result<NewEvent, CommandError> {
    let v = serde_json::to_value(payload).map_err(|e| storage(StorageError::of(e)))?;
    NewEvent::new(None, Stream::Deliveries, id, ty.into().as_str(), &v)
        .map_err(CommandError::invalid_event)
}

/// A number in [0, 1) drawn from `seed`: the draws of routing are a function of the delivery
/// id, so a replayed routing decision is the same decision.
fn draw(seed: &[&[u8]]) -> f64 {
    let mut h = blake3::Hasher::new();
    for s in seed {
        h.update(&(s.len() as u32).to_le_bytes());
        h.update(s);
    }
    let b = h.finalize();
    let x = u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes"));
    (x >> 11) as f64 / (1u64 << 53) as f64
}
