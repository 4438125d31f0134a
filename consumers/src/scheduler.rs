//! The delivery scheduler: routes each notification to its deliveries (spec section 4), cancels
//! the undelivered deliveries of canceled tasks, and releases expired leases (section 5).
//!
//! Routing takes each page the follower hands it past the routing checkpoint and gives its
//! notifications and task cancellations to the routing command (`outbox::Route`),
//! which runs inside the writer's transaction: it skips what the checkpoint already covers and
//! advances it with the events it appends, so a notification is routed exactly once whatever
//! crashes.

use std::time::Duration;
use tidemark_engine::CommandError;

use tidemark_engine::Engine;
use tidemark_engine::commands::outbox::{ExpireLeases, Route};
use tidemark_log::{Event, EventRef, StorageError};
use tidemark_projections::names::{EventType, Stream};
use tokio_util::sync::CancellationToken;

use crate::follow::Feed;

/// How soon the leases are looked at again after an expiry command (the models fold its
/// releases meanwhile).
const RECHECK: Duration = Duration::from_secs(1);
/// The shortest sleep until a lease's expiry.
const RECHECK_MIN: Duration = Duration::from_millis(1);
/// Leases released per expiry command.
const EXPIRE_BATCH: usize = 1_000;

/// Where routing resumes: the last notification or cancellation it handled (blocking).
pub(crate) fn checkpoint(engine: &Engine) -> Result<u64, StorageError> {
    Ok(engine.least_checkpoint(|q| q.routing_checkpoint())?)
}

/// What routing takes from a page: notifications to route and task cancellations.
pub(crate) fn relevant(ev: &EventRef<'_>) -> bool {
    use EventType as T;
    match EventType::parse(ev.event_type) {
        Some(
            t @ (T::NotificationRequested
            | T::NotificationCreated
            | T::NotificationCanceled
            | T::TaskCanceled),
        ) => Stream::parse(ev.stream) == Some(t.stream()),
        _ => false,
    }
}

/// Route the notifications and cancellations of every page after `after` until the feed ends
/// or `shutdown`.
pub(crate) async fn run(engine: Engine, after: u64, mut feed: Feed, shutdown: CancellationToken) {
    tracing::info!(after, "delivery routing started");
    while let Some(page) = tokio::select! {
        p = feed.recv() => p,
        _ = shutdown.cancelled() => None,
    } {
        // The command skips what the routing checkpoint already covers.
        let source: Vec<Event> = page
            .events
            .iter()
            .filter(|e| e.seq > after && relevant(&e.as_ref()))
            .cloned()
            .collect();
        // Each tenant's sources routed by its own routes, into its own deliveries.
        for run in source.chunk_by(|a, b| a.tenant == b.tenant) {
            let tenant = engine.in_tenant(run[0].tenant());
            if !run_route(&tenant, run.to_vec(), &shutdown).await {
                return;
            }
        }
    }
}

/// Run the routing command until it commits; `false` when shutting down first.
async fn run_route(engine: &Engine, source: Vec<Event>, shutdown: &CancellationToken) -> bool {
    let mut backoff = Duration::from_millis(50);
    loop {
        let r = engine
            .execute(Route {
                source: source.clone(),
            })
            .await
            .map(|(n, _)| n);
        match r {
            Ok(n) => {
                metrics::counter!("tidemark_delivery_routing_events_total").increment(n as u64);
                return true;
            }
            Err(CommandError::Append(tidemark_log::AppendError::Closed)) => return false,
            // The tenant is being moved: once the move ends, routed here if it stayed, else
            // where it went (its routing there derives from the copy).
            // On a cluster, fenced out of this shard for good: the shard it goes to routes it
            // from its copy (waiting here would hold every other tenant's routing).
            Err(CommandError::Append(tidemark_log::AppendError::Fenced { .. })) => return true,
            Err(CommandError::Rejected {
                code: tidemark_engine::Rejection::MoveInProgress,
                ..
            }) => {
                let placement = engine.placement().clone();
                let settled = tokio::select! {
                    here = placement.settled(engine.tenant(), engine.shard()) => here,
                    _ = shutdown.cancelled() => return false,
                };
                if !settled {
                    return true;
                }
            }
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
    let e = engine.clone();
    let tenants = tokio::task::spawn_blocking(move || e.every_tenant())
        .await
        .map_err(|e| CommandError::Storage(StorageError::of(e)))?
        .map_err(|e| CommandError::Storage(StorageError::of(e)))?;
    let mut total = 0;
    for (tenant, _) in tenants {
        total += expire_in(&tenant).await?;
    }
    Ok(total)
}

/// The earliest expiry of a lease held in any tenant.
fn earliest_lease_expiry(engine: &Engine) -> Result<Option<i64>, tidemark_engine::QueryError> {
    let mut earliest = None;
    for (tenant, _) in engine.every_tenant()? {
        if let Some(at) = tenant.read().earliest_lease_expiry()? {
            earliest = Some(earliest.map_or(at, |e: i64| e.min(at)));
        }
    }
    Ok(earliest)
}

/// Release one tenant's expired leases.
async fn expire_in(engine: &Engine) -> Result<usize, CommandError> {
    let mut total = 0;
    loop {
        let (n, _) = engine.execute(ExpireLeases { max: EXPIRE_BATCH }).await?;
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

/// Release expired leases at start-up (leases held when the server stopped), then, until
/// `shutdown`, when the first held lease expires: the loop sleeps until the earliest expiry the
/// models hold (or that a page of the follower just brought, before the models fold it), and
/// not at all while no lease is held. A server at rest is not woken (spec section 3).
pub(crate) async fn expiry_loop(
    engine: Engine,
    mut feed: Feed,
    wakes_at: LeaseClock,
    shutdown: CancellationToken,
) {
    let mut first = true;
    // The earliest expiry of the leases the follower's pages showed (the models may not hold
    // them yet).
    let mut seen: Option<i64> = None;
    loop {
        let held = if first {
            Some(i64::MIN)
        } else {
            match earliest_lease_expiry(&engine) {
                Ok(at) => at,
                // Let the command meet (and report) whatever the models have.
                Err(_) => Some(i64::MIN),
            }
        };
        first = false;
        let next = match (held, seen) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let now = engine.now_us();
        let wait = match next {
            Some(at) if at <= now => {
                // Due: the command releases what is expired at the head, the seen ones too.
                seen = None;
                match expire_now(&engine).await {
                    Ok(_) => {}
                    Err(CommandError::Append(tidemark_log::AppendError::Closed)) => return,
                    Err(e) => tracing::warn!(error = %e, "lease expiry failed; will retry"),
                }
                // The models fold the releases meanwhile (and a failure is retried then).
                Some(RECHECK)
            }
            Some(at) => Some(Duration::from_micros((at - now) as u64).max(RECHECK_MIN)),
            None => None,
        };
        // The follower hands this loop a page only when a lease of it expires before then.
        wakes_at.set(wait.map_or(i64::MAX, |d| {
            now.saturating_add(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        }));
        tokio::select! {
            _ = async {
                match wait {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            } => {},
            page = feed.recv() => match page {
                Some(p) => {
                    for at in p.events.iter().filter_map(|e| lease_taken(&e.as_ref())) {
                        seen = Some(seen.map_or(at, |s| s.min(at)));
                    }
                }
                None => return,
            },
            _ = shutdown.cancelled() => return,
        }
    }
}

/// When the lease-expiry loop will look at the leases next (µs; `i64::MAX`: not before a
/// lease is taken): a page whose leases all expire later has nothing for it, and does not
/// wake it (a claim under load would otherwise wake it at every commit).
#[derive(Clone)]
pub(crate) struct LeaseClock(std::sync::Arc<std::sync::atomic::AtomicI64>);

impl Default for LeaseClock {
    fn default() -> Self {
        // Until the loop has looked once: every lease is news.
        LeaseClock(std::sync::Arc::new(std::sync::atomic::AtomicI64::new(
            i64::MIN,
        )))
    }
}

/// The clock of a node where the loop does not run (another node serves the shard).
const ELSEWHERE: i64 = i64::MIN + 1;

impl LeaseClock {
    fn set(&self, at: i64) {
        self.0.store(at, std::sync::atomic::Ordering::SeqCst);
    }

    /// The loop runs elsewhere (a cluster's other node serves the shard): no lease is news
    /// here, so a claim's commit does not wake this node's follower.
    pub(crate) fn elsewhere(&self) {
        self.set(ELSEWHERE);
    }

    /// The loop starts here: every lease is news until it has looked once.
    pub(crate) fn here(&self) {
        self.set(i64::MIN);
    }

    /// Whether `ev` takes a lease that expires before the loop looks next.
    pub(crate) fn wants(&self, ev: &EventRef<'_>) -> bool {
        let at = self.0.load(std::sync::atomic::Ordering::SeqCst);
        at != ELSEWHERE && lease_taken(ev).is_some_and(|expires| at == i64::MIN || expires < at)
    }
}

/// Whether `ev` takes or extends a lease (the page is for lease expiry; read by type only).
fn takes_lease(ev: &EventRef<'_>) -> bool {
    matches!(
        EventType::parse(ev.event_type),
        Some(EventType::DeliveryLeased | EventType::DeliveryLeaseExtended)
    )
}

/// When a lease that `ev` takes or extends expires.
fn lease_taken(ev: &EventRef<'_>) -> Option<i64> {
    takes_lease(ev)
        .then(|| ev.payload_value().get("lease_expires_at_us")?.as_i64())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::LeaseClock;
    use tidemark_log::EventRef;
    use tidemark_projections::names::EventType;

    /// A node that does not run the expiry loop (another serves the shard) is woken by no
    /// lease; one that runs it, by every lease until it has looked, then by those expiring
    /// before its next look.
    #[test]
    fn the_lease_clock_wants_leases_only_where_the_loop_runs() {
        let leased = EventRef {
            seq: 1,
            tenant: None,
            event_id: "e",
            stream: "deliveries",
            subject: "d-1",
            event_type: EventType::DeliveryLeased.as_str(),
            time_us: 0,
            payload: r#"{"lease_expires_at_us": 5000}"#,
        };
        let clock = LeaseClock::default();
        assert!(clock.wants(&leased), "before the loop looked: news");
        clock.elsewhere();
        assert!(!clock.wants(&leased), "served elsewhere: no wake-up");
        clock.here();
        assert!(clock.wants(&leased));
        clock.set(4000);
        assert!(!clock.wants(&leased), "expires after the next look");
        clock.set(6000);
        assert!(clock.wants(&leased), "expires before the next look");
    }
}
