//! The notification router: every lifecycle event that deserves a notification (spec section
//! 2) gets exactly one `notification.created`, with id `ntf:<source_seq>`.
//!
//! It resumes from the highest source seq the notifications projection has seen, takes the
//! `task_events` of each page the follower hands it past that, and appends the derived events
//! in batches. Re-deriving after a crash appends duplicates, which the log answers with the
//! original seq and does not store.

use std::time::Duration;
use tidemark_projections::ids::TaskId;

use tidemark_engine::Engine;
use tidemark_log::{AppendError, Event, EventLog, EventRef, NewEvent, StorageError, limits};
use tidemark_projections::names::{EventType, Stream, ids};
use tidemark_projections::notifications::{lifecycle_priority, routed_payload};
use tokio_util::sync::CancellationToken;

use crate::follow::Feed;

/// The router's fault injection for the crash test: wait between reading a source event and
/// appending its notification, so a test can kill the process inside that window.
fn fault_delay() -> Option<Duration> {
    std::env::var("TIDEMARK_FAULT_ROUTER_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis)
}

/// Where the router resumes: the highest source seq the notifications model has seen
/// (blocking).
pub(crate) fn checkpoint(engine: &Engine) -> Result<u64, StorageError> {
    Ok(engine.least_checkpoint(|q| q.router_checkpoint())?)
}

/// Whether `ev` is a lifecycle event the router may derive a notification from.
pub(crate) fn derives_from(ev: &EventRef<'_>) -> bool {
    Stream::parse(ev.stream) == Some(Stream::TaskEvents)
        && lifecycle_priority(ev.event_type).is_some()
}

/// The notification of lifecycle event `ev` ([`derives_from`]), if its payload routes one.
fn derive(engine: &Engine, ev: &Event) -> Result<Option<NewEvent>, StorageError> {
    // `engine` acts for the event's tenant: its task, and a notification of that tenant.
    let task_id = TaskId::new(ev.subject.as_str());
    let task = engine.read().task(&task_id)?;
    // A completion of a run that had not started (no `task.run_started` before it) is a
    // mismatch (section 6, `run_not_started`), not news: no "Run … completed". The read waits
    // for the models to reach the head, so a start before `ev` is in the task.
    if EventType::parse(&ev.event_type) == Some(EventType::TaskRunCompleted)
        && let Some(run) = ev.payload_value().get("run_id").and_then(|r| r.as_str())
        && task
            .as_ref()
            .and_then(|t| t.run_started_seq(run))
            .is_none_or(|s| s >= ev.seq)
    {
        return Ok(None);
    }
    let project = task.and_then(|t| t.project_id);
    let Some(payload) = routed_payload(ev, project.as_deref()) else {
        return Ok(None);
    };
    let id = ids::routed_notification(ev.seq);
    NewEvent::new(
        Some(id.clone()),
        Stream::Notifications,
        id,
        EventType::NotificationCreated,
        &payload,
    )
    .and_then(|n| n.in_tenant(ev.tenant()))
    .map(Some)
    .map_err(StorageError::of)
}

/// Derive the notifications of every page after `after` until the feed ends or `shutdown`.
/// A failed derivation (a read of the tasks model) is retried; a page is never skipped.
pub(crate) async fn run(
    engine: Engine,
    mut after: u64,
    mut feed: Feed,
    shutdown: CancellationToken,
) {
    let delay = fault_delay();
    tracing::info!(after, "notification router started");
    while let Some(page) = tokio::select! {
        p = feed.recv() => p,
        _ = shutdown.cancelled() => None,
    } {
        let mut backoff = Duration::from_millis(200);
        loop {
            let (e, p) = (engine.clone(), page.clone());
            let derived = tokio::task::spawn_blocking(move || {
                let mut derived = Vec::new();
                // Each run of one tenant's events through that tenant's handle.
                for run in p.events.chunk_by(|a, b| a.tenant == b.tenant) {
                    let tenant = e.in_tenant(run[0].tenant());
                    for ev in run
                        .iter()
                        .filter(|ev| ev.seq > after && derives_from(&ev.as_ref()))
                    {
                        if let Some(n) = derive(&tenant, ev)? {
                            derived.push(n);
                        }
                    }
                }
                Ok::<_, StorageError>(derived)
            })
            .await
            .map_err(StorageError::of)
            .and_then(|r| r);
            match derived {
                Ok(derived) => {
                    if !derived.is_empty() {
                        if let Some(d) = delay {
                            tokio::time::sleep(d).await;
                        }
                        // A batch is one tenant's: the runs of one tenant, in order.
                        for chunk in derived
                            .chunk_by(|a, b| a.tenant == b.tenant)
                            .flat_map(|run| run.chunks(limits::BATCH_MAX_EVENTS))
                        {
                            if !append_all(&engine, chunk.to_vec(), &shutdown).await {
                                return;
                            }
                        }
                    }
                    break;
                }
                Err(e) => {
                    tracing::error!(error = %e, "notification router failed; retrying the page");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {},
                        _ = shutdown.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        after = after.max(page.upto);
    }
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
                            // Fenced: the tenant is being moved; the shard it goes to
                            // derives it again from its copy.
                            Ok(_)
                            | Err(AppendError::Conflict { .. } | AppendError::Fenced { .. }) => {
                                break;
                            }
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
            // The tenant is fenced out of this shard by a move (spec section 20): the shard it
            // goes to derives these again from its copy, under the same ids.
            Err(AppendError::Fenced { .. }) => return true,
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
