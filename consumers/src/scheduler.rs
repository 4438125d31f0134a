//! The delivery scheduler: routes each notification to its deliveries (spec section 4), cancels
//! the undelivered deliveries of canceled tasks, and releases expired leases (section 5).
//!
//! Routing reads the log past the routing checkpoint and hands each page of notifications and
//! task cancellations to [`outbox::route`], a command that runs inside the writer's
//! transaction: it skips what the checkpoint already covers and advances it with the events it
//! appends, so a notification is routed exactly once whatever crashes. A commit wakes the
//! loop, but the wake-up is only a nudge: it always reads the log.

use std::time::Duration;

use tidemark_log::{CommandError, Event, Log, ReadQuery};
use tidemark_projections::{outbox, read};
use tokio_util::sync::CancellationToken;

const PAGE: usize = 1_000;
/// How often expired leases are looked for.
pub const TICK: Duration = Duration::from_secs(1);
/// Leases released per expiry command.
const EXPIRE_BATCH: usize = 1_000;

/// Start the routing loop and the lease-expiry tick; both stop when `shutdown` is cancelled.
pub fn spawn(log: Log, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    let tick = tokio::spawn(expiry_loop(log.clone(), shutdown.clone()));
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(200);
        while let Err(e) = route_loop(&log, &shutdown).await {
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

async fn route_loop(log: &Log, shutdown: &CancellationToken) -> Result<(), String> {
    let l = log.clone();
    let after = tokio::task::spawn_blocking(move || read::routing_checkpoint(l.db()))
        .await
        .map_err(|e| e.to_string())??;
    tracing::info!(after, "delivery routing started");
    let query = ReadQuery {
        limit: PAGE,
        ..ReadQuery::default()
    };
    let pick = |_: &Log, events: Vec<Event>| Ok(events.into_iter().filter(relevant).collect());
    crate::follow::follow(log, after, query, shutdown, pick, |source: Vec<Event>| async move {
        source.is_empty() || run_route(log, source, shutdown).await
    })
    .await
}

/// Run the routing command until it commits; `false` when shutting down first.
async fn run_route(log: &Log, source: Vec<Event>, shutdown: &CancellationToken) -> bool {
    let mut backoff = Duration::from_millis(50);
    loop {
        let src = source.clone();
        let r = log
            .command(true, move |txn, _| {
                let events = outbox::route(txn, &src)?;
                Ok((events.len(), events))
            })
            .await;
        match r {
            Ok((n, _)) => {
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
pub async fn expire_now(log: &Log) -> Result<usize, CommandError> {
    let mut total = 0;
    loop {
        let now = tidemark_log::time::now_micros();
        let (n, _) = log
            .command(true, move |txn, _| {
                outbox::expire_leases(txn, now, EXPIRE_BATCH)
            })
            .await?;
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

async fn expiry_loop(log: Log, shutdown: CancellationToken) {
    // Once at start-up (leases held when the server stopped), then periodically.
    loop {
        match expire_now(&log).await {
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
