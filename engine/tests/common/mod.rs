//! What the engine's tests share: a runtime, an engine on a simulated clock, and the log read
//! back through the narrow interface.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tidemark_engine::Engine;
use tidemark_engine::commands::outbox::Claim;
use tidemark_log::{Event, EventLog, LogConfig, NewEvent, ReadQuery, Share};

/// The log's test helpers: the engine's tests drive it from the same runtime.
#[path = "../../../log/tests/common/mod.rs"]
mod log_common;

pub use log_common::rt;

/// An engine on a fresh log in `dir` whose commands read the time from the returned clock.
#[allow(dead_code, reason = "not every test binary uses it")]
pub fn engine_with_clock(dir: &std::path::Path, start_us: i64) -> (Engine, Arc<AtomicI64>) {
    let mut cfg = LogConfig::in_dir(dir);
    cfg.cache_bytes = 4 << 20;
    let (engine, _) = Engine::open(&cfg).unwrap();
    let clock = Arc::new(AtomicI64::new(start_us));
    let c = clock.clone();
    (
        engine.with_clock(Arc::new(move || c.load(Ordering::SeqCst))),
        clock,
    )
}

/// An engine as [`engine_with_clock`] makes, its clock a day past the wall clock: events are
/// stamped by the log with the wall clock, so every new delivery is due at once on the
/// simulated clock.
#[allow(dead_code, reason = "not every test binary uses it")]
pub fn engine_a_day_ahead(dir: &std::path::Path) -> (Engine, Arc<AtomicI64>) {
    engine_with_clock(dir, tidemark_log::time::now_micros() + 86_400 * 1_000_000)
}

/// A `notification.requested` of `id` (its event id and subject) with `payload`.
#[allow(dead_code, reason = "not every test binary uses it")]
pub fn requested(id: &str, payload: &serde_json::Value) -> NewEvent {
    NewEvent::new(
        Some(id.to_owned()),
        "notifications",
        id,
        "notification.requested",
        payload,
    )
    .unwrap()
}

/// A claim of up to `limit` due `app` deliveries of `share` by `owner`, leased for `lease_ms`.
#[allow(dead_code, reason = "not every test binary uses it")]
pub fn app_claim(owner: &str, limit: usize, lease_ms: u64, share: Share) -> Claim {
    Claim {
        sink: tidemark_projections::names::Sink::App,
        owner: owner.into(),
        limit,
        lease_ms,
        share,
    }
}

/// I3 for the deliveries model: a verify, then a rebuild with the swap, are identical to the
/// live model; else what diverged.
#[allow(dead_code, reason = "not every test binary uses it")]
pub fn deliveries_rebuild_identically(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
) -> Result<(), String> {
    for swap in [false, true] {
        let r = rt
            .block_on(engine.rebuild("deliveries", swap, |_, _| {}))
            .unwrap()
            .unwrap();
        if !r.identical {
            let what = if swap { "rebuild" } else { "verify" };
            return Err(format!(
                "deliveries {what} diverged at {:?}",
                r.first_divergent_seq
            ));
        }
    }
    Ok(())
}

/// Every committed event after `after`, in order.
#[allow(dead_code, reason = "not every test binary uses it")]
pub fn events_after(engine: &Engine, after: u64) -> Vec<Event> {
    events_after_on(engine.log(), after)
}

/// Every committed event of `log` after `after`, in order.
pub fn events_after_on(log: &impl EventLog, mut after: u64) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        let page = log
            .read(&ReadQuery {
                after,
                limit: 1000,
                ..ReadQuery::default()
            })
            .unwrap();
        if page.events.is_empty() {
            return out;
        }
        after = page.next_after;
        out.extend(page.events);
    }
}
