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

mod circuit;
mod lease;
mod pace;
mod route;

use crate::error::CommandError;
use tidemark_log::{NewEvent, StorageError};
use tidemark_projections::deliveries::{self as d, Delivery, Recipient};
use tidemark_projections::names::{EventType, Stream};

use crate::privacy::Privacy;

pub(crate) use circuit::bridge_confirmed;
pub(crate) use circuit::endpoint_event;
pub use circuit::{BridgeFailed, ResolveEndpoints, SwitchEndpoint};
pub use lease::{
    Claim, Complete, CompleteOne, Completed, ExpireLeases, Extend, Fail, Failure, Operator,
    OperatorAction, RECOVER_MAX, Recover,
};
pub use pace::Pacer;
pub use route::{Route, quiet_hours_end};
pub use tidemark_projections::ids::DeliveryId;

/// The recipient a delivery row names: in clear, or (a redacted row) by its keyed hash,
/// found among the recipients that have state (one without state has the defaults). The scan
/// costs one HMAC per recipient with state; only redacted rows take it.
pub(crate) fn recipient_of(
    view: &mut d::View<'_>,
    row: &Delivery,
    privacy: Option<&Privacy>,
) -> Result<Recipient, CommandError> {
    if !row.redacted {
        return Ok(view.recipient(row.recipient.as_deref())?);
    }
    let (Some(hash), Some(p)) = (&row.recipient, privacy) else {
        return Ok(Recipient::default());
    };
    Ok(view
        .find_recipient(|name| p.recipient_hash(name) == *hash)?
        .unwrap_or_default())
}

/// The `delivery.*` event of type `ty` (a [`tidemark_projections::names::DeliveryTransition`] or `created` / `joined`) on
/// delivery `id`.
fn event(
    ty: impl Into<EventType>,
    id: &str,
    payload: &impl serde::Serialize,
) -> Result<NewEvent, CommandError> {
    let v = serde_json::to_value(payload).map_err(|e| CommandError::Models(StorageError::of(e)))?;
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
