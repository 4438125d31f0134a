//! The dispatcher (spec section 17): tidemark delivers the deliveries of its own sinks —
//! `email` (SMTP) and `webhook` (any HTTP endpoint) — itself. For each configured sink a loop
//! claims due deliveries through the ordinary claim command (owner `dispatcher:<node>`), runs
//! each attempt on the sink's own bounded pool (`concurrency` in flight; a hanging SMTP server
//! holds only its sink), and reports the outcome through the ordinary complete and fail
//! commands: success → `delivery.sent` with `resolved_targets` (whom it reached); a transient
//! failure → `retry_wait` with the route's backoff (a receiver's `Retry-After` honoured); a
//! permanent one → `parked` with the adapter's code. A dispatcher that dies leaves leases
//! that expire, and the deliveries are tried again.
//!
//! Secrets (SMTP credentials, webhook URLs and signing secrets) are resolved at start and never
//! logged, answered or recorded.

pub mod email;
mod report;
mod turns;
pub mod webhook;

use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark_projections::ids::DeliveryId;

use report::{Attempt, report};
use tidemark_engine::Engine;
use tidemark_engine::commands::outbox::Claim;
use tidemark_projections::deliveries::Delivery;
use tidemark_projections::names::Sink;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use turns::{Tenants, earliest_due};

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Delivered; whom it reached (addresses, or an endpoint's scheme, host and port).
    Sent(Vec<String>),
    /// Try again later (SMTP 4xx, a connection error, a timeout, HTTP 5xx/408/429).
    Transient {
        code: String,
        error: String,
        retry_after_ms: Option<u64>,
    },
    /// Park it (SMTP 5xx, HTTP 4xx other than 408/429, an address that cannot be used).
    Permanent { code: String, error: String },
}

/// One person a delivery goes to: an address, and whether it came from a list (its message
/// then carries an id of its own per member).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub address: String,
    pub from_list: bool,
}

/// Whom `d` goes to, resolved now (section 17: a list when the delivery is attempted, so a
/// change since routing counts): its list's members, else its recipient. An unknown list, an
/// empty one, or no recipient at all is a permanent outcome.
pub async fn targets(engine: &Engine, d: &Delivery) -> Result<Vec<Target>, Outcome> {
    let Some(name) = d.list.clone() else {
        return match &d.recipient {
            Some(r) => Ok(vec![Target {
                address: r.clone(),
                from_list: false,
            }]),
            None => Err(Outcome::Permanent {
                code: "no_recipient".into(),
                error: "the notification names no recipient and no list".into(),
            }),
        };
    };
    let e = engine.clone();
    let n = name.clone();
    let Ok(Ok(row)) = tokio::task::spawn_blocking(move || e.read().list(&n)).await else {
        return Err(Outcome::Transient {
            code: "list_unreadable".into(),
            error: "the lists model could not be read".into(),
            retry_after_ms: None,
        });
    };
    match row {
        None => Err(Outcome::Permanent {
            code: "unknown_list".into(),
            error: format!("there is no list {name:?}"),
        }),
        Some(l) if l.members.is_empty() => Err(Outcome::Permanent {
            code: "empty_list".into(),
            error: format!("the list {name:?} has no members"),
        }),
        Some(l) => Ok(l
            .members
            .into_iter()
            .map(|address| Target {
                address,
                from_list: true,
            })
            .collect()),
    }
}

/// A sink tidemark delivers itself.
pub trait Adapter: Send + Sync + 'static {
    /// The sink's name on routes (`email`, `webhook`).
    fn sink(&self) -> Sink;
    /// Deliveries in flight at most.
    fn concurrency(&self) -> usize;
    /// Whether it sends to the delivery's recipient or list members (email), rather than to
    /// an endpoint of its route (webhook).
    fn to_people(&self) -> bool;
    /// Called once when the dispatcher starts, with the engine it dispatches for (an adapter
    /// that reads the models at each attempt keeps it).
    fn start(&self, _engine: &Engine) {}
    /// Where a delivery of `route` goes, by scheme, host and port (the server log's name for
    /// an endpoint; never a URL's path, which can be a credential).
    fn endpoint<'a>(
        &'a self,
        route: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + 'a>>;
    /// One attempt of one delivery of `tenant` (the engine acting for the delivery's tenant:
    /// its routes, its lists) to `targets` (the list's members or the recipient, when
    /// [`Adapter::to_people`]; empty otherwise).
    fn deliver(
        &self,
        tenant: Engine,
        d: Delivery,
        targets: Vec<Target>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send + '_>>;
}

/// The configured sinks, and how each is doing on this node.
#[derive(Clone, Default)]
pub struct Sinks {
    pub adapters: Vec<Arc<dyn Adapter>>,
    pub health: Health,
    /// What the log's follower nudges when a page may make a delivery due.
    pub wake: Wake,
    /// Each adapter's `concurrency`, as permits every shard's loop of the sink shares (spec
    /// section 20: a sink's bound is the node's, not each shard's); made by [`spawn`] when
    /// empty.
    pub limits: Vec<Arc<tokio::sync::Semaphore>>,
}

/// The shared permits of `adapters`' concurrency (one semaphore each, in order).
pub fn limits(adapters: &[Arc<dyn Adapter>]) -> Vec<Arc<tokio::sync::Semaphore>> {
    adapters
        .iter()
        .map(|a| Arc::new(tokio::sync::Semaphore::new(a.concurrency())))
        .collect()
}

/// The sinks' loops sleep until their first delivery is due; a page of the log that may make
/// one due sooner (a delivery created, failed for a retry, released, retried, deferred or
/// joined) nudges each of them. A nudge while a loop is busy is kept for its next wait.
#[derive(Clone, Default)]
pub struct Wake(Arc<std::sync::Mutex<Vec<Arc<tokio::sync::Notify>>>>);

impl Wake {
    /// Nudge every sink's loop.
    pub fn nudge(&self) {
        for n in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            n.notify_one();
        }
    }

    fn register(&self) -> Arc<tokio::sync::Notify> {
        let n = Arc::new(tokio::sync::Notify::new());
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(n.clone());
        n
    }
}

/// Whether `ev` may make a delivery due sooner than the models showed (read by type only).
pub fn makes_due(ev: &tidemark_log::EventRef<'_>) -> bool {
    use tidemark_projections::names::EventType as T;
    matches!(
        T::parse(ev.event_type),
        Some(
            T::DeliveryCreated
                | T::DeliveryAttemptFailed
                | T::DeliveryLeaseExpired
                | T::DeliveryRetried
                | T::DeliveryResent
                | T::DeliveryDeferred
                | T::DeliveryJoined
                // A delivery that leaves its key in a route's order lets the next go.
                | T::DeliveryDiscarded
                | T::DeliveryCancelled
                | T::DeliverySkipped
                // A circuit that opens, probes, closes or is switched moves when its route's
                // deliveries are due.
                | T::EndpointCircuitOpened
                | T::EndpointCircuitProbed
                | T::EndpointCircuitClosed
                | T::EndpointDisabled
                | T::EndpointEnabled
                | T::EndpointUnresolved
                | T::EndpointResolved
        )
    )
}

/// A loop that found a delivery due but could not take it (the models behind its own claim)
/// looks again after this, doubling up to [`RECHECK_MAX`].
const RECHECK_MIN: Duration = Duration::from_millis(50);
const RECHECK_MAX: Duration = Duration::from_millis(500);
/// The longest a loop sleeps towards a due time (the wall clock may be stepped meanwhile).
const LONGEST_SLEEP: Duration = Duration::from_secs(60);

/// How this node's sinks are doing (the console's sink health, section 17): counted in memory
/// by the dispatcher since the start, one entry per configured sink.
#[derive(Clone, Default)]
pub struct Health(Arc<std::sync::Mutex<Vec<SinkHealth>>>);

/// One sink's attempts since the start on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkHealth {
    pub sink: Sink,
    pub concurrency: usize,
    pub in_flight: usize,
    pub sent: u64,
    pub transient: u64,
    pub permanent: u64,
    /// Failed attempts since the last success.
    pub consecutive_failures: u64,
    pub last_attempt_at_us: Option<i64>,
    pub last_success_at_us: Option<i64>,
    pub last_failure_at_us: Option<i64>,
    /// The adapter's code of the last failure (`smtp_451`, `http_503`, `smtp_timeout`, …).
    pub last_error_code: Option<String>,
}

impl SinkHealth {
    /// A sink with no attempt yet.
    pub fn new(sink: Sink, concurrency: usize) -> SinkHealth {
        SinkHealth {
            sink,
            concurrency,
            in_flight: 0,
            sent: 0,
            transient: 0,
            permanent: 0,
            consecutive_failures: 0,
            last_attempt_at_us: None,
            last_success_at_us: None,
            last_failure_at_us: None,
            last_error_code: None,
        }
    }

    /// `idle` (no attempt yet, none in flight), `sending` (the first attempts are in flight,
    /// none has finished: a hanging server is not idle), `ok` (the last attempt succeeded),
    /// `failing` (it failed, and every one since the last success).
    pub fn state(&self) -> &'static str {
        match (self.last_attempt_at_us, self.consecutive_failures) {
            (None, _) if self.in_flight > 0 => "sending",
            (None, _) => "idle",
            (Some(_), 0) => "ok",
            _ => "failing",
        }
    }
}

impl Health {
    /// Every sink's entry, in the order they were configured.
    pub fn snapshot(&self) -> Vec<SinkHealth> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update(&self, sink: Sink, f: impl FnOnce(&mut SinkHealth)) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = all.iter_mut().find(|h| h.sink == sink) {
            f(h);
        }
    }

    fn outcome(&self, sink: Sink, o: &Outcome) {
        let now = tidemark_log::time::now_micros();
        self.update(sink, |h| {
            h.in_flight = h.in_flight.saturating_sub(1);
            h.last_attempt_at_us = Some(now);
            match o {
                Outcome::Sent(_) => {
                    h.sent += 1;
                    h.consecutive_failures = 0;
                    h.last_success_at_us = Some(now);
                }
                Outcome::Transient { code, .. } | Outcome::Permanent { code, .. } => {
                    if matches!(o, Outcome::Transient { .. }) {
                        h.transient += 1;
                    } else {
                        h.permanent += 1;
                    }
                    h.consecutive_failures += 1;
                    h.last_failure_at_us = Some(now);
                    h.last_error_code = Some(code.clone());
                }
            }
        });
    }
}

/// Start one dispatcher loop per sink; the handle ends when all have stopped on `shutdown`.
pub fn spawn(
    engine: Engine,
    sinks: Sinks,
    lease_ms: u64,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let owner = format!("dispatcher:{}", engine.leases().node());
    for a in &sinks.adapters {
        a.start(&engine);
    }
    {
        // The node's health: set by the first shard's dispatcher, counted by every one's.
        let mut health = sinks.health.0.lock().unwrap_or_else(|p| p.into_inner());
        if health.is_empty() {
            *health = sinks
                .adapters
                .iter()
                .map(|a| SinkHealth::new(a.sink(), a.concurrency()))
                .collect();
        }
    }
    let limits = if sinks.limits.len() == sinks.adapters.len() {
        sinks.limits.clone()
    } else {
        limits(&sinks.adapters)
    };
    let tasks: Vec<_> = sinks
        .adapters
        .iter()
        .zip(limits)
        .map(|(a, limit)| {
            tokio::spawn(run(
                engine.clone(),
                (a.clone(), limit),
                sinks.health.clone(),
                sinks.wake.register(),
                owner.clone(),
                lease_ms,
                shutdown.clone(),
            ))
        })
        .collect();
    tokio::spawn(async move {
        for t in tasks {
            let _ = t.await;
        }
    })
}

/// A sink's loop: keep up to `concurrency` attempts in flight, claiming as slots free up and
/// when a delivery falls due (at its due time, or when the follower's `nudged` says a page may
/// have made one due); with nothing due it sleeps (no timer at rest).
async fn run(
    engine: Engine,
    (adapter, limit): (Arc<dyn Adapter>, Arc<tokio::sync::Semaphore>),
    health: Health,
    nudged: Arc<tokio::sync::Notify>,
    owner: String,
    lease_ms: u64,
    shutdown: CancellationToken,
) {
    let sink = adapter.sink();
    let mut inflight: JoinSet<Attempt> = JoinSet::new();
    // Claims are made for a quarter of the pool at least (one command leases many), unless
    // nothing is in flight: a trickle is still claimed one by one at once.
    let batch = (adapter.concurrency() / 4).max(1);
    let mut recheck = RECHECK_MIN;
    let mut failures = FailureLog::default();
    let mut tenants = Tenants::default();
    loop {
        // The sink's slots are the node's: shared with its loops of the other shards.
        let free = adapter
            .concurrency()
            .saturating_sub(inflight.len())
            .min(limit.available_permits());
        let claims = free > 0 && (inflight.is_empty() || free >= batch);
        // Each tenant's due deliveries are its own (spec section 20): claimed in turn, the
        // tenant that came first last time going last this time.
        tenants.refresh(&engine).await;
        let mut turn = if claims { tenants.turn() } else { Vec::new() };
        while let Some(tenant) = turn.pop() {
            let free = adapter
                .concurrency()
                .saturating_sub(inflight.len())
                .min(limit.available_permits());
            if free == 0 {
                break;
            }
            let claim = Claim {
                sink,
                owner: owner.clone(),
                limit: free,
                lease_ms,
                share: engine.leases().share(),
            };
            match tenant.execute(claim).await {
                Ok((rows, _)) => {
                    for d in rows {
                        let a = adapter.clone();
                        let e = tenant.clone();
                        let slot = limit.clone();
                        metrics::gauge!("tidemark_sink_in_flight", "sink" => sink.as_str())
                            .increment(1.0);
                        health.update(sink, |h| h.in_flight += 1);
                        inflight.spawn(async move {
                            // Another shard's loop may have taken the slot since the claim:
                            // the attempt waits for one (never more than `concurrency` at
                            // once on the node).
                            let _slot = slot.acquire_owned().await;
                            let id = d.id.clone();
                            let route = d.route.clone();
                            let started = Instant::now();
                            let to = if a.to_people() {
                                targets(&e, &d).await
                            } else {
                                Ok(Vec::new())
                            };
                            let outcome = match to {
                                Ok(to) => a.deliver(e.clone(), d, to).await,
                                Err(o) => o,
                            };
                            Attempt {
                                id,
                                route,
                                outcome,
                                took: started.elapsed(),
                                tenant: e,
                            }
                        });
                    }
                }
                Err(_) if shutdown.is_cancelled() => return,
                Err(e) => tracing::warn!(%sink, error = %e, "dispatcher: claim failed; retrying"),
            }
        }
        let full = !(inflight.is_empty() || adapter.concurrency() - inflight.len() >= batch);
        // With slots to claim for, nothing more is due now: sleep until the first delivery
        // is.
        let wait = if full {
            None
        } else {
            match earliest_due(&tenants.all, sink).await {
                Ok(None) => {
                    recheck = RECHECK_MIN;
                    None
                }
                Ok(Some(at)) => {
                    let now = engine.now_us();
                    if at > now {
                        recheck = RECHECK_MIN;
                        Some(Duration::from_micros((at - now) as u64).min(LONGEST_SLEEP))
                    } else if let Some(free) = engine
                        .pacer()
                        .sink_paced_until(sink, now)
                        .filter(|f| *f > now)
                    {
                        // Due, but its route is at its pace (section 4): until a lease leaves
                        // the route's window.
                        recheck = RECHECK_MIN;
                        Some(Duration::from_micros((free - now) as u64).min(LONGEST_SLEEP))
                    } else {
                        // Due, yet not taken (a hold moved it, or a claim of another node
                        // races for it): look again soon, then less often.
                        let r = recheck;
                        recheck = (recheck * 2).min(RECHECK_MAX);
                        Some(r)
                    }
                }
                Err(e) => {
                    tracing::warn!(%sink, error = %e, "dispatcher: reading due deliveries failed; retrying");
                    Some(RECHECK_MAX)
                }
            }
        };
        let wait = match (wait, tenants.stale_for()) {
            (Some(w), Some(s)) => Some(w.min(s)),
            (w, s) => w.or(s),
        };
        tokio::select! {
            Some(first) = inflight.join_next(), if !inflight.is_empty() => {
                // Every attempt that has ended by now is reported with it: the sent ones in
                // one completion command.
                let mut ended = vec![first];
                while let Some(more) = inflight.try_join_next() {
                    ended.push(more);
                }
                let mut done = Vec::with_capacity(ended.len());
                for r in ended {
                    metrics::gauge!("tidemark_sink_in_flight", "sink" => sink.as_str()).decrement(1.0);
                    match r {
                        Ok(a) => {
                            health.outcome(sink, &a.outcome);
                            failures.attempted(&*adapter, &a.route, &a.id, &a.outcome).await;
                            done.push(a);
                        }
                        // A panicked attempt: its lease expires and it is tried again.
                        Err(_) => health.update(sink, |h| h.in_flight = h.in_flight.saturating_sub(1)),
                    }
                }
                // A route changed through a node with another environment (of the attempt's
                // tenant): recorded, so its other deliveries wait instead of spending attempts.
                let unresolved: Vec<(Engine, String)> = done
                    .iter()
                    .filter(|a| matches!(&a.outcome,
                        Outcome::Transient { code, .. } if code == webhook::UNRESOLVED))
                    .map(|a| (a.tenant.clone(), a.route.clone()))
                    .collect();
                // Each tenant's attempts reported in its own commands.
                let mut by_tenant: Vec<(Engine, Vec<Attempt>)> = Vec::new();
                for a in done {
                    match by_tenant.iter_mut().find(|(t, _)| t.tenant() == a.tenant.tenant()) {
                        Some((_, run)) => run.push(a),
                        None => by_tenant.push((a.tenant.clone(), vec![a])),
                    }
                }
                for (tenant, run) in by_tenant {
                    report(&tenant, sink, &owner, run).await;
                }
                for (tenant, route) in unresolved {
                    webhook::check_api_routes(&tenant, Some(&route)).await;
                }
            }
            // The first delivery falls due (or a recheck).
            _ = async {
                match wait {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            }, if !full => {}
            _ = nudged.notified(), if !full => recheck = RECHECK_MIN,
            // A period of an endpoint's failures ends: its count is logged.
            _ = async {
                match failures.next_flush() {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => failures.flush(&*adapter).await,
            _ = shutdown.cancelled() => {
                // Attempts in flight are abandoned: their leases expire and they are tried
                // again (at least once, as a crash would).
                inflight.abort_all();
                health.update(sink, |h| h.in_flight = 0);
                return;
            }
        }
    }
}

/// How often the failures of one endpoint are logged one by one: the first of each period;
/// the others are counted and summed up when the period ends (or when the endpoint answers
/// again). A minute; `TIDEMARK_FAULT_FAILURE_LOG_PERIOD_MS=N`, a test knob read once, makes it
/// N ms so that a test sees a period end without waiting a minute.
fn failure_log_period() -> Duration {
    static PERIOD: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *PERIOD.get_or_init(|| {
        std::env::var("TIDEMARK_FAULT_FAILURE_LOG_PERIOD_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(60), Duration::from_millis)
    })
}

/// The server log's WARN lines for failed attempts (spec section 17): the first failure of an
/// endpoint (its route) in a period in full — route, endpoint, code and cause — and the others
/// of the period counted into one line, when it ends or when the endpoint answers again, so an
/// endpoint that fails thousands of times (or flaps) does not drown the log.
#[derive(Default)]
struct FailureLog(std::collections::HashMap<String, FailureWindow>);

struct FailureWindow {
    since: Instant,
    unlogged: u64,
    last_code: String,
}

impl FailureLog {
    async fn attempted(&mut self, a: &dyn Adapter, route: &str, id: &DeliveryId, o: &Outcome) {
        let (code, error, kind) = match o {
            Outcome::Sent(_) => {
                if let Some(w) = self.0.get_mut(route)
                    && w.unlogged > 0
                {
                    let (n, last) = (w.unlogged, w.last_code.clone());
                    w.unlogged = 0;
                    let endpoint = a.endpoint(route).await.unwrap_or_default();
                    tracing::warn!(
                        target: "tidemark::endpoints",
                        sink = %a.sink(), route = %route, endpoint = %endpoint, failures = n,
                        last_code = %last,
                        "{n} more failed attempts before this endpoint answered again"
                    );
                }
                return;
            }
            Outcome::Transient { code, error, .. } => (code, error, "transient"),
            Outcome::Permanent { code, error } => (code, error, "permanent"),
        };
        let now = Instant::now();
        if let Some(w) = self.0.get_mut(route)
            && now.duration_since(w.since) < failure_log_period()
        {
            w.unlogged += 1;
            w.last_code.clone_from(code);
            return;
        }
        self.close(a, route).await;
        let endpoint = a.endpoint(route).await.unwrap_or_default();
        tracing::warn!(
            target: "tidemark::endpoints",
            sink = %a.sink(), route = %route, endpoint = %endpoint, delivery = %id, code = %code, kind,
            cause = %error,
            "delivery attempt failed"
        );
        self.0.insert(
            route.to_owned(),
            FailureWindow {
                since: now,
                unlogged: 0,
                last_code: code.clone(),
            },
        );
    }

    /// When the first period with failures not yet logged ends.
    fn next_flush(&self) -> Option<Instant> {
        self.0
            .values()
            .filter(|w| w.unlogged > 0)
            .map(|w| w.since + failure_log_period())
            .min()
    }

    /// Sum up and forget the periods that ended.
    async fn flush(&mut self, a: &dyn Adapter) {
        let now = Instant::now();
        let ended: Vec<String> = self
            .0
            .iter()
            .filter(|(_, w)| now.duration_since(w.since) >= failure_log_period())
            .map(|(r, _)| r.clone())
            .collect();
        for route in ended {
            self.close(a, &route).await;
        }
    }

    /// End `route`'s period: its failures not logged, summed up in one line.
    async fn close(&mut self, a: &dyn Adapter, route: &str) {
        let Some(w) = self.0.remove(route) else {
            return;
        };
        if w.unlogged > 0 {
            let endpoint = a.endpoint(route).await.unwrap_or_default();
            tracing::warn!(
                target: "tidemark::endpoints",
                sink = %a.sink(), route = %route, endpoint = %endpoint, failures = w.unlogged,
                last_code = %w.last_code,
                "{} more failed attempts in the last {:?}",
                w.unlogged,
                failure_log_period()
            );
        }
    }
}

/// `key`'s value through [`crate::env_value`], an error naming the key.
pub(crate) fn resolve(v: &str, key: &str) -> Result<String, String> {
    crate::env_value(v).map_err(|e| format!("{key}: {e}"))
}

/// A sink's `timeout` (100 ms to 10 min) and `concurrency` (1 to 256), checked; errors name
/// `sinks.<sink>.<key>`.
pub(crate) fn pool(
    sink: &str,
    timeout: &str,
    concurrency: usize,
) -> Result<(Duration, usize), String> {
    let ms = tidemark_projections::routing::parse_duration_ms(timeout)
        .filter(|ms| (100..=600_000).contains(ms))
        .ok_or_else(|| format!("sinks.{sink}.timeout must be a duration from 100ms to 10m"))?;
    if !(1..=256).contains(&concurrency) {
        return Err(format!("sinks.{sink}.concurrency must be from 1 to 256"));
    }
    Ok((Duration::from_millis(ms), concurrency))
}

#[cfg(test)]
mod tests {
    use super::{Health, Outcome, Sink, SinkHealth};

    #[test]
    fn a_sinks_health_follows_its_attempts() {
        let h = Health::default();
        h.0.lock().unwrap().push(SinkHealth::new(Sink::Email, 2));
        let state = || h.snapshot()[0].state();
        assert_eq!(state(), "idle");
        h.update(Sink::Email, |s| s.in_flight += 1);
        assert_eq!(state(), "sending", "a hanging server is not idle");
        let transient = Outcome::Transient {
            code: "smtp_451".into(),
            error: "try later".into(),
            retry_after_ms: None,
        };
        h.outcome(Sink::Email, &transient);
        assert_eq!(state(), "failing");
        h.outcome(
            Sink::Email,
            &Outcome::Permanent {
                code: "smtp_550".into(),
                error: "no such user".into(),
            },
        );
        let s = &h.snapshot()[0];
        assert_eq!((s.transient, s.permanent, s.sent), (1, 1, 0));
        assert_eq!(s.consecutive_failures, 2);
        assert_eq!(s.last_error_code.as_deref(), Some("smtp_550"));
        assert_eq!(
            s.in_flight, 0,
            "an outcome ends its attempt, never below zero"
        );
        h.outcome(Sink::Email, &Outcome::Sent(vec!["a@example.org".into()]));
        let s = &h.snapshot()[0];
        assert_eq!(s.state(), "ok");
        assert_eq!((s.sent, s.consecutive_failures), (1, 0));
        assert!(s.last_success_at_us >= s.last_failure_at_us);
        // A sink not configured on this node is not counted.
        h.outcome(Sink::Webhook, &transient);
        assert_eq!(h.snapshot().len(), 1);
    }
}
