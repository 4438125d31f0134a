//! Reactors of tidemark: they read the log and the read models and append derived events with
//! deterministic `event_id`s, so a crash and a replay cannot duplicate them (the log's
//! idempotent append turns a repeated derivation into a duplicate).
//!
//! # Layout
//! - [`bridge`]: the bridge terminal notifier (deliver / defer / mismatch per subscription),
//!   its webhook sink and the confirmation that advances a subscription's cursor.
//! - [`router`]: lifecycle events → `notification.created` (`ntf:<source_seq>`).
//! - [`scheduler`]: notifications → deliveries (exactly once, through a command that advances
//!   the routing checkpoint in the same transaction), task cancellations, lease expiry.

#![forbid(unsafe_code)]

pub mod bridge;
mod follow;
pub mod router;
pub mod scheduler;
