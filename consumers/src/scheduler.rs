//! The delivery scheduler: routes each notification to its deliveries (spec section 4), cancels
//! the undelivered deliveries of canceled tasks, and releases expired leases (section 5).
//!
//! Routing reads the log past the routing checkpoint and hands each page of notifications and
//! task cancellations to the routing command (`OutboxCommand::Route`), which that runs inside the writer's
//! transaction: it skips what the checkpoint already covers and advances it with the events it
//! appends, so a notification is routed exactly once whatever crashes. A commit wakes the
//! loop, but the wake-up is only a nudge: it always reads the log.

use std::time::Duration;

use tidemark_engine::Engine;
use tidemark_engine::commands::OutboxCommand;
use tidemark_log::{CommandError, Event, ReadQuery};
use tokio_util::sync::CancellationToken;

const PAGE: usize = 1_000;
/// How often expired leases are looked for.
pub const TICK: Duration = Duration::from_secs(1);
/// Leases released per expiry command.
const EXPIRE_BATCH: usize = 1_000;

/// Start the routing loop and the lease-expiry tick; both stop when `shutdown` is cancelled.
pub fn spawn(engine: Engine, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    let tick = tokio::spawn(expiry_loop(engine.clone(), shutdown.clone()));
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(200);
        while let Err(e) = route_loop(&engine, &shutdown).await {
            tracing::error!(error = %e, "delivery routing failed; restarting");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {},
                _ = shutdown.cancelled() => break,
            }
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
        let _ = tick.await;
    })
}

fn relevant(ev: &Event) -> bool {
    matches!(
        (ev.stream.as_str(), ev.event_type.as_str()),
        (
            "notifications",
            "notification.requested" | "notification.created"
        ) | ("task_events", "task.canceled")
    )
}

async fn route_loop(engine: &Engine, shutdown: &CancellationToken) -> Result<(), String> {
    let e = engine.clone();
    let after = tokio::task::spawn_blocking(move || e.read().routing_checkpoint())
        .await
        .map_err(|e| e.to_string())??;
    tracing::info!(after, "delivery routing started");
    let query = ReadQuery {
        limit: PAGE,
        ..ReadQuery::default()
    };
    let pick = |_: &Engine, events: Vec<Event>| Ok(events.into_iter().filter(relevant).collect());
    crate::follow::follow(
        engine,
        after,
        query,
        shutdown,
        pick,
        |source: Vec<Event>| async move {
            source.is_empty() || run_route(engine, source, shutdown).await
        },
    )
    .await
}

/// Run the routing command until it commits; `false` when shutting down first.
async fn run_route(engine: &Engine, source: Vec<Event>, shutdown: &CancellationToken) -> bool {
    let mut backoff = Duration::from_millis(50);
    loop {
        let r = engine
            .execute(OutboxCommand::Route {
                source: source.clone(),
            })
            .await
            .and_then(|(o, _)| o.into_count());
        match r {
            Ok(n) => {
                metrics::counter!("tidemark_delivery_routing_events_total").increment(n as u64);
                return true;
            }
            Err(CommandError::Append(tidemark_log::AppendError::Closed)) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "delivery routing command failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {},
                    _ = shutdown.cancelled() => return false,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Release expired leases now; answers how many were released.
pub async fn expire_now(engine: &Engine) -> Result<usize, CommandError> {
    let mut total = 0;
    loop {
        let n = engine
            .execute(OutboxCommand::ExpireLeases { max: EXPIRE_BATCH })
            .await?
            .0
            .into_count()?;
        total += n;
        if n < EXPIRE_BATCH {
            if total > 0 {
                metrics::counter!("tidemark_delivery_leases_expired_total").increment(total as u64);
                tracing::info!(released = total, "expired delivery leases released");
            }
            return Ok(total);
        }
    }
}

async fn expiry_loop(engine: Engine, shutdown: CancellationToken) {
    // Once at start-up (leases held when the server stopped), then periodically.
    loop {
        match expire_now(&engine).await {
            Ok(_) => {}
            Err(CommandError::Append(tidemark_log::AppendError::Closed)) => return,
            Err(e) => tracing::warn!(error = %e, "lease expiry failed; will retry"),
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {},
            _ = shutdown.cancelled() => return,
        }
    }
}
