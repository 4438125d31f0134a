//! What the engine's tests share: a runtime, an engine on a simulated clock, and the log read
//! back through the narrow interface.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tidemark_engine::Engine;
use tidemark_log::{Event, EventLog, LogConfig, ReadQuery};

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

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
