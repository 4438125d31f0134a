//! The notification router: every lifecycle event that deserves a notification (spec section
//! 2) gets exactly one `notification.created`, with id `ntf:<source_seq>`.
//!
//! It resumes from the highest source seq the notifications projection has seen, reads
//! `task_events` past it, and appends the derived events in batches. A commit wakes it, but
//! the wake-up is only a nudge: it always reads the log. Re-deriving after a crash appends
//! duplicates, which the log answers with the original seq and does not store.

use std::time::Duration;

use tidemark_engine::Engine;
use tidemark_log::{AppendError, Event, EventLog, NewEvent, ReadQuery};
use tidemark_projections::notifications::{lifecycle_priority, routed_id, routed_payload};
use tokio_util::sync::CancellationToken;

const PAGE: usize = 500;

/// Start the router; it stops when `shutdown` is cancelled.
pub fn spawn(engine: Engine, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    // Fault injection for the crash test: wait between reading a source event and appending
    // its notification, so a test can kill the process inside that window.
    let delay = std::env::var("TIDEMARK_FAULT_ROUTER_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    tokio::spawn(async move {
        // A read failure is not the end of routing: wait, then resume from the checkpoint
        // (the log answers what was already derived as duplicates).
        let mut backoff = Duration::from_millis(200);
        while let Err(e) = run(&engine, &shutdown, delay).await {
            tracing::error!(error = %e, "notification router failed; restarting");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {},
                _ = shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    })
}

fn derive(engine: &Engine, ev: &Event) -> Result<Option<NewEvent>, String> {
    if lifecycle_priority(&ev.event_type).is_none() {
        return Ok(None);
    }
    let project = engine.read().task(&ev.subject)?.and_then(|t| t.project_id);
    let Some(payload) = routed_payload(ev, project.as_deref()) else {
        return Ok(None);
    };
    let id = routed_id(ev.seq);
    NewEvent::new(
        Some(id.clone()),
        "notifications",
        id,
        "notification.created",
        &payload,
    )
    .map(Some)
    .map_err(|e| e.to_string())
}

async fn run(
    engine: &Engine,
    shutdown: &CancellationToken,
    delay: Option<Duration>,
) -> Result<(), String> {
    let e = engine.clone();
    let after = tokio::task::spawn_blocking(move || e.read().router_checkpoint())
        .await
        .map_err(|e| e.to_string())??;
    tracing::info!(after, "notification router started");
    let query = ReadQuery {
        limit: PAGE,
        stream: Some("task_events".into()),
        ..ReadQuery::default()
    };
    let derive_all = |e: &Engine, events: Vec<Event>| {
        let mut derived = Vec::new();
        for ev in &events {
            if let Some(n) = derive(e, ev)? {
                derived.push(n);
            }
        }
        Ok(derived)
    };
    crate::follow::follow(
        engine,
        after,
        query,
        shutdown,
        derive_all,
        |derived| async move {
            if derived.is_empty() {
                return true;
            }
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            append_all(engine, derived, shutdown).await
        },
    )
    .await
}

/// Append derived events until they are in the log; `false` when shutting down first.
async fn append_all(engine: &Engine, events: Vec<NewEvent>, shutdown: &CancellationToken) -> bool {
    let n = events.len() as u64;
    let mut backoff = Duration::from_millis(50);
    loop {
        match engine.log().append(events.clone()).await {
            Ok(_) => {
                metrics::counter!("tidemark_router_notifications_total").increment(n);
                return true;
            }
            Err(AppendError::Conflict { .. }) => {
                // A notification with one of these ids exists with other content (the task's
                // project changed since it was derived): it is routed already. Append the
                // rest one by one.
                for ev in events {
                    loop {
                        match engine.log().append(vec![ev.clone()]).await {
                            Ok(_) | Err(AppendError::Conflict { .. }) => break,
                            Err(AppendError::Closed) => return false,
                            Err(e) => {
                                tracing::warn!(error = %e, "router append failed; retrying");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                }
                return true;
            }
            Err(AppendError::Closed) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "router append failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {},
                    _ = shutdown.cancelled() => return false,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
