//! Source pollers (spec section 12): each configured source polls its upstream on its own
//! schedule, in a task of its own (polls of one source never overlap, and a slow upstream
//! delays only its own source), and turns pages into events through the engine's commands:
//! each page's new items in one atomic batch decided at the head, the cycle's one
//! notification with its last page, then the upstream ack of the cycle's items, then the
//! watermark's compare-and-swap. A crash anywhere replays the cycle harmlessly: items already
//! in the log are left out, the notification covers every item of the cycle no notification
//! covers yet (its id derived from the first), the ack repeats with the same idempotency key,
//! and the watermark moves only from where it was.
//!
//! Header values are secrets: they are resolved once at start (`env:NAME`) and never logged,
//! served or put into an error.

mod config;
mod oauth;
mod upstream;

pub use config::{
    AckConfig, ItemsConfig, Source, SourceConfig, SourceRetryConfig, WatermarkConfig, from_config,
};
pub use upstream::{MAX_ITEM_BYTES, MAX_ITEMS, MAX_RESPONSE_BYTES};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidemark_engine::{CommandError, RejectKind, Rejection};

use chrono::Utc;
use serde::Serialize;
use tidemark_engine::Engine;
use tidemark_engine::commands::sources::{Advance, Page, Park, SourceItem};

use tidemark_projections::names::SourceState;
use tidemark_projections::routing::backoff_ms;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use upstream::{parse_page, request, send_ack};

/// What the poller keeps in memory about a source (section 12: not in the log).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Runtime {
    /// idle, polling, backing_off; standby while another node of a cluster holds the
    /// source's poller lease (paused and parked come from the log).
    pub state: SourceState,
    pub last_poll_at_us: Option<i64>,
    pub last_success_at_us: Option<i64>,
    pub next_poll_at_us: Option<i64>,
    pub consecutive_failures: u32,
    /// The last transient failure (a parking error is in the log).
    pub last_error: Option<String>,
    /// Not succeeded for three intervals (counted from the process start at the earliest).
    pub stale: bool,
    /// Seconds since the last success (since the process start before the first).
    #[serde(skip)]
    pub seconds_since_success: f64,
    /// Its tenant is not live (not created yet, or removed): nothing to poll for, so never
    /// stale.
    #[serde(skip)]
    pub tenant_absent: bool,
}

struct Slot {
    source: Source,
    runtime: Mutex<Runtime>,
    wake: Notify,
    /// What the last wake-up asks for: a poll now (an operator's poll, a resume with `now`),
    /// or only a look at the state (a resume: the source goes back to its schedule).
    poll_now: std::sync::atomic::AtomicBool,
    started_us: i64,
}

impl Slot {
    /// Whether the wake-up just received asks for a poll now.
    fn take_poll_now(&self) -> bool {
        self.poll_now
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }
}

/// The configured sources and their pollers' state; cheap to clone.
#[derive(Clone, Default)]
pub struct Sources {
    slots: Arc<Vec<Arc<Slot>>>,
}

fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}

impl Sources {
    pub fn new(sources: Vec<Source>) -> Sources {
        let started_us = now_us();
        Sources {
            slots: Arc::new(
                sources
                    .into_iter()
                    .map(|source| {
                        Arc::new(Slot {
                            source,
                            runtime: Mutex::new(Runtime {
                                state: SourceState::Idle,
                                ..Runtime::default()
                            }),
                            wake: Notify::new(),
                            poll_now: Default::default(),
                            started_us,
                        })
                    })
                    .collect(),
            ),
        }
    }

    /// The names of `tenant`'s sources (spec section 20: another tenant's are not seen).
    pub fn names(&self, tenant: &str) -> Vec<String> {
        self.slots
            .iter()
            .filter(|s| s.source.tenant() == tenant)
            .map(|s| s.source.cfg.name.clone())
            .collect()
    }

    /// Every source by name, with its metrics' labels ([`Source::labels`]).
    pub fn labelled(&self) -> Vec<(String, Vec<(&'static str, String)>)> {
        self.slots
            .iter()
            .map(|s| (s.source.cfg.name.clone(), s.source.labels(&[])))
            .collect()
    }

    /// Whether `tenant` has a source `name`.
    pub fn contains(&self, tenant: &str, name: &str) -> bool {
        self.slot(name).is_some_and(|s| s.source.tenant() == tenant)
    }

    fn slot(&self, name: &str) -> Option<&Arc<Slot>> {
        self.slots.iter().find(|s| s.source.cfg.name == name)
    }

    /// The poller's state of `name`, with `stale` judged now.
    pub fn runtime(&self, name: &str) -> Option<Runtime> {
        let s = self.slot(name)?;
        let mut r = s.runtime.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let interval = s.source.schedule.interval(Utc::now()).as_micros() as i64;
        let since = r.last_success_at_us.unwrap_or(0).max(s.started_us);
        // A node on standby (another node polls) is not the one to say the source is stale.
        r.stale = r.state != SourceState::Standby
            && !r.tenant_absent
            && now_us() - since > interval.saturating_mul(3);
        r.seconds_since_success = (now_us() - since).max(0) as f64 / 1e6;
        Some(r)
    }

    /// Poll `name` now (or as soon as its current poll ends).
    pub fn wake(&self, name: &str) -> bool {
        self.notify(name, true)
    }

    /// Wake a paused or parked source's task after a resume: with `now` it polls at once,
    /// else at its schedule's next time (a `cron` source never polls outside its schedule; an
    /// `every` source, whose interval counts from a poll, polls at once as at start, unless
    /// its `poll_at_start` says otherwise).
    pub fn resumed(&self, name: &str, now: bool) -> bool {
        let now = now || self.slot(name).is_some_and(|s| s.source.polls_at_start());
        self.notify(name, now)
    }

    fn notify(&self, name: &str, poll_now: bool) -> bool {
        match self.slot(name) {
            Some(s) => {
                s.poll_now
                    .store(poll_now, std::sync::atomic::Ordering::SeqCst);
                s.wake.notify_one();
                true
            }
            None => false,
        }
    }
}

/// The lease of a source's poller.
pub fn lease_name(source: &str) -> String {
    format!("source.{source}")
}

/// Start one poller per source, each acting for its tenant in the tenant's shard (`shards`:
/// the deployment's engines, the home shard's first); the handle ends when every poller has
/// stopped on `shutdown`.
pub fn spawn(
    shards: Vec<Engine>,
    sources: Sources,
    max_pending: u64,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    // A source's own `User-Agent` header, if configured, takes the place of this one.
    let client = reqwest::Client::builder()
        .user_agent(crate::USER_AGENT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default();
    let shards = Arc::new(shards);
    let tasks: Vec<_> = sources
        .slots
        .iter()
        .map(|slot| {
            tokio::spawn(run(
                shards.clone(),
                client.clone(),
                slot.clone(),
                max_pending,
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

/// Why a poll did not succeed.
#[derive(Debug)]
pub(super) enum PollError {
    /// Wait this long (429/503 with Retry-After, a full outbox), capped by the caller. The
    /// class (`rate_limited`) of an upstream's answer; `None` for our own backpressure.
    RetryAfter(Duration, Option<&'static str>, String),
    /// Retry with backoff: an upstream's 5xx (`server_error`), `timeout` or `connection`
    /// error, or (class `None`) a storage refusal.
    Transient(Option<&'static str>, String),
    /// 401: retried once, then parked.
    Unauthorized(String),
    /// Park the source: 4xx or an invalid response.
    Park(String),
    /// Paused or parked by someone else while polling: stop and wait.
    NotActive,
    /// Shutting down.
    Stopped,
}

fn set(slot: &Slot, f: impl FnOnce(&mut Runtime)) {
    f(&mut slot.runtime.lock().unwrap_or_else(|p| p.into_inner()));
}

/// Where the directory (the home shard's models) places a source's tenant now.
enum Placed {
    /// A live tenant: the engine acting for it in its shard.
    Live(Box<Engine>),
    /// Not in the directory (not created yet).
    Missing,
    /// Removed: a name is never used again.
    Removed,
    /// The directory could not be read now (a transient failure of the models).
    Unknown,
}

async fn tenant_engine(shards: &Arc<Vec<Engine>>, tenant: &str) -> Placed {
    let Some(home) = shards.first().cloned() else {
        return Placed::Unknown;
    };
    if tenant == tidemark_log::DEFAULT_TENANT {
        return Placed::Live(Box::new(home));
    }
    let t = tenant.to_owned();
    let Ok(Ok(row)) = tokio::task::spawn_blocking(move || home.read().unwaited().tenant(&t)).await
    else {
        return Placed::Unknown;
    };
    match row {
        None => Placed::Missing,
        Some(r) if !r.is_live() => Placed::Removed,
        Some(r) => match shards.get(r.shard as usize) {
            Some(shard) => Placed::Live(Box::new(shard.in_tenant(tenant))),
            None => Placed::Unknown,
        },
    }
}

/// A removed tenant's source: it polls no more (until shutdown).
async fn stop_removed(slot: &Slot, tenant: &str, shutdown: &CancellationToken) {
    set(slot, |r| {
        r.state = SourceState::Idle;
        r.next_poll_at_us = None;
        r.last_error = Some(format!("the tenant {tenant:?} was removed"));
        r.tenant_absent = true;
    });
    shutdown.cancelled().await;
}

async fn run(
    shards: Arc<Vec<Engine>>,
    client: reqwest::Client,
    slot: Arc<Slot>,
    max_pending: u64,
    shutdown: CancellationToken,
) {
    let name = slot.source.cfg.name.clone();
    let tenant = slot.source.tenant().to_owned();
    // A tenant's source waits for its tenant (created at runtime, spec section 20).
    let mut engine = loop {
        let why = match tenant_engine(&shards, &tenant).await {
            Placed::Live(e) => {
                set(&slot, |r| {
                    r.last_error = None;
                    r.tenant_absent = false;
                });
                break *e;
            }
            Placed::Removed => return stop_removed(&slot, &tenant, &shutdown).await,
            Placed::Missing => "is not in the directory: the source waits for it",
            Placed::Unknown => "cannot be looked up now: the source waits",
        };
        set(&slot, |r| {
            r.last_error = Some(format!("the tenant {tenant:?} {why}"));
            r.next_poll_at_us = None;
            r.tenant_absent = true;
        });
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    let mut next = slot.source.schedule.next_after(Utc::now());
    // An `every` source polls once at start (its interval counts from a poll); a `cron` one
    // waits for its schedule's first time, unless `poll_at_start` says otherwise.
    let mut due_now = slot.source.polls_at_start();
    // The poll's idempotency series: the same for the retries of a poll that failed, a new one
    // after a success (so a later poll of the same watermark is a new request upstream).
    let mut series = uuid::Uuid::now_v7().to_string();
    // Consecutive failures by class, against `[sources.retry] limits`.
    let mut class_failures: std::collections::HashMap<&'static str, u32> = Default::default();
    // One poller per source across a cluster (spec section 16): this node polls while it
    // holds the source's lease; another node takes it when this one dies.
    let leases = engine.leases();
    let lease = lease_name(&name);
    leases.want(&lease);
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = leases.ready() => {}
    }
    let mut changes = leases.changes();
    loop {
        if !leases.holds(&lease) {
            set(&slot, |r| {
                r.state = SourceState::Standby;
                r.next_poll_at_us = None;
            });
            // Until this node takes the lease (then it polls at once: its holder is gone).
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = changes.changed() => {}
                _ = tokio::time::sleep(leases.ttl()) => {}
            }
            due_now = true;
            continue;
        }
        if !due_now {
            set(&slot, |r| r.next_poll_at_us = Some(next.timestamp_micros()));
            let wait = (next - Utc::now()).to_std().unwrap_or_default();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = slot.wake.notified() => {
                    // A resume that arrived before the poller saw the pause: back to waiting
                    // for the schedule.
                    if !slot.take_poll_now() {
                        continue;
                    }
                }
                // The lease handed over while waiting: go on standby now, not at the next
                // poll time (the node would show `idle` for a source another node polls).
                _ = changes.changed() => {
                    if !leases.holds(&lease) {
                        continue;
                    }
                    // Still ours: wait on for the poll time.
                    due_now = Utc::now() >= next;
                    continue;
                }
            }
        }
        due_now = false;
        // A tenant's poll holds its gate (spec section 20): a move's fence waits for it, and
        // it waits for the switch; then it acts for its tenant where the directory places it
        // now (a lookup that fails keeps the engine it had).
        let gate = match shards.first() {
            Some(home) if tidemark_log::tenant_of(&tenant).is_some() => {
                Some(home.placement().gate(&tenant).read_owned().await)
            }
            _ => None,
        };
        match tenant_engine(&shards, &tenant).await {
            Placed::Live(e) => engine = *e,
            Placed::Removed => {
                drop(gate);
                return stop_removed(&slot, &tenant, &shutdown).await;
            }
            Placed::Missing | Placed::Unknown => {}
        }
        let e = engine.clone();
        let n = name.clone();
        let row = match tokio::task::spawn_blocking(move || e.read().source(&n)).await {
            Ok(Ok(r)) => r.unwrap_or_default(),
            _ => {
                next = Utc::now() + chrono::Duration::seconds(1);
                continue;
            }
        };
        if row.paused || row.parked {
            set(&slot, |r| {
                r.state = if row.parked {
                    SourceState::Parked
                } else {
                    SourceState::Paused
                };
                r.next_poll_at_us = None;
            });
            // Until a resume (or a poll request, answered 409 by the API) wakes it; then at
            // once when the resume asks for it, else at the schedule's next time.
            drop(gate);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = slot.wake.notified() => {}
            }
            due_now = slot.take_poll_now();
            if !due_now {
                next = slot.source.schedule.next_after(Utc::now());
            }
            continue;
        }
        set(&slot, |r| {
            r.state = SourceState::Polling;
            r.last_poll_at_us = Some(now_us());
        });
        let started = Instant::now();
        let result = tokio::select! {
            _ = shutdown.cancelled() => Err(PollError::Stopped),
            r = poll(&engine, &client, &slot.source, row.watermark.clone(), row.items_total == 0 && row.watermark.is_none(), max_pending, &series) => r,
        };
        drop(gate);
        metrics::histogram!(
            "tidemark_source_poll_duration_seconds",
            &slot.source.labels(&[])
        )
        .record(started.elapsed().as_secs_f64());
        let outcome = match &result {
            Ok(_) => "ok",
            Err(PollError::RetryAfter(..)) => "retry_after",
            Err(PollError::Transient(..)) => "error",
            Err(PollError::Unauthorized(_)) => "unauthorized",
            Err(PollError::Park(_)) => "parked",
            Err(PollError::NotActive) => "not_active",
            Err(PollError::Stopped) => "stopped",
        };
        metrics::counter!(
            "tidemark_source_polls_total",
            &slot.source.labels(&[("outcome", outcome)])
        )
        .increment(1);
        let failures = slot
            .runtime
            .lock()
            .map(|r| r.consecutive_failures)
            .unwrap_or(0);
        match result {
            Ok(items) => {
                class_failures.clear();
                series = uuid::Uuid::now_v7().to_string();
                metrics::counter!("tidemark_source_items_total", &slot.source.labels(&[]))
                    .increment(items as u64);
                metrics::gauge!(
                    "tidemark_source_last_success_timestamp_seconds",
                    &slot.source.labels(&[])
                )
                .set(now_us() as f64 / 1e6);
                set(&slot, |r| {
                    r.state = SourceState::Idle;
                    r.last_success_at_us = Some(now_us());
                    r.consecutive_failures = 0;
                    r.last_error = None;
                });
                next = slot.source.schedule.next_after(Utc::now());
            }
            Err(PollError::Stopped) => return,
            Err(PollError::NotActive) => {}
            // The failure that parks a source is one of its consecutive failures: the count it
            // shows is the one its parking message names.
            Err(PollError::Park(error)) => {
                tracing::warn!(source = %name, %error, "source parked");
                count_failure(&slot, &error);
                park(&engine, &slot, &name, error).await;
            }
            Err(PollError::Unauthorized(error))
                if in_a_row(&mut class_failures, "auth")
                    >= slot.source.limits.get("auth").copied().unwrap_or(2) =>
            {
                tracing::warn!(source = %name, %error, "source parked after a 401 retried");
                count_failure(&slot, &error);
                park(&engine, &slot, &name, error).await;
                class_failures.clear();
            }
            Err(PollError::Unauthorized(error)) => {
                // Retried (once, unless `retry.limits.auth` says more) with a new token (a
                // token may have been revoked or rotated upstream): at once, or after the
                // `auth` class's backoff when it has one.
                if let Some(auth) = &slot.source.auth {
                    auth.forget().await;
                }
                set(&slot, |r| {
                    r.consecutive_failures += 1;
                    r.last_error = Some(error);
                });
                match slot.source.class_retry.get("auth") {
                    Some(shape) => {
                        let n = class_failures.get("auth").copied().unwrap_or(1);
                        let delay = backoff_ms(shape, n, rand::random::<f64>(), None);
                        set(&slot, |r| r.state = SourceState::BackingOff);
                        next = Utc::now() + chrono::Duration::milliseconds(delay as i64);
                    }
                    None => due_now = true,
                }
            }
            Err(
                PollError::RetryAfter(_, Some(class), ref error)
                | PollError::Transient(Some(class), ref error),
            ) if over_limit(&slot, &mut class_failures, class) => {
                let error = format!(
                    "{} consecutive {class} failures (retry.limits.{class}); the last: {error}",
                    class_failures.get(class).copied().unwrap_or(0)
                );
                tracing::warn!(source = %name, %error, "source parked");
                count_failure(&slot, &error);
                park(&engine, &slot, &name, error).await;
                class_failures.clear();
            }
            Err(PollError::RetryAfter(wait, class, error)) => {
                if class.is_none() {
                    // Our own wait (backpressure) breaks an upstream failure's run.
                    class_failures.clear();
                }
                let wait = wait.min(slot.source.retry_after_max);
                tracing::info!(source = %name, wait_ms = wait.as_millis() as u64, "source backing off (Retry-After)");
                set(&slot, |r| {
                    r.state = SourceState::BackingOff;
                    r.consecutive_failures += 1;
                    r.last_error = Some(error);
                });
                next = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
            }
            Err(PollError::Transient(class, error)) => {
                if class.is_none() {
                    class_failures.clear();
                }
                let attempt = failures + 1;
                // The class's own backoff (`[sources.retry.classes]`), counted by its
                // failures in a row; the source's, counted by every failure, otherwise.
                let (shape, n) = match class.filter(|c| slot.source.class_retry.contains_key(c)) {
                    Some(c) => (
                        slot.source.retry_for(Some(c)),
                        class_failures.get(c).copied().unwrap_or(1),
                    ),
                    None => (&slot.source.retry, attempt),
                };
                let delay = backoff_ms(shape, n, rand::random::<f64>(), None);
                tracing::info!(source = %name, attempt, delay_ms = delay, %error, "source poll failed; backing off");
                set(&slot, |r| {
                    r.state = SourceState::BackingOff;
                    r.consecutive_failures = attempt;
                    r.last_error = Some(error);
                });
                next = Utc::now() + chrono::Duration::milliseconds(delay as i64);
            }
        }
    }
}

/// One more consecutive failure, `error` the last.
fn count_failure(slot: &Slot, error: &str) {
    set(slot, |r| {
        r.consecutive_failures += 1;
        r.last_error = Some(error.to_owned());
    });
}

/// Count a failure of `class`; true once the source's `retry.limits` for it is reached.
fn over_limit(
    slot: &Slot,
    failures: &mut std::collections::HashMap<&'static str, u32>,
    class: &'static str,
) -> bool {
    let n = in_a_row(failures, class);
    slot.source
        .limits
        .get(class)
        .is_some_and(|limit| n >= *limit)
}

/// Count a failure of `class`: how many of that class in a row, now (a failure of another
/// class ends the run of this one).
fn in_a_row(
    failures: &mut std::collections::HashMap<&'static str, u32>,
    class: &'static str,
) -> u32 {
    failures.retain(|c, _| *c == class);
    let n = failures.entry(class).or_insert(0);
    *n += 1;
    *n
}

/// Park the source (recorded as `source.parked`); the poller shows it parked until a resume.
async fn park(engine: &Engine, slot: &Slot, name: &str, error: String) {
    let r = engine
        .execute(Park {
            name: name.to_owned(),
            error,
        })
        .await;
    match r {
        Ok(_) => set(slot, |r| {
            r.state = SourceState::Parked;
            r.next_poll_at_us = None;
        }),
        Err(e) => tracing::warn!(source = %name, error = %e, "could not record the parking"),
    }
}

/// One poll: pages after the watermark, up to `max_pages_per_poll`. Answers the number of
/// items appended.
async fn poll(
    engine: &Engine,
    client: &reqwest::Client,
    src: &Source,
    watermark: Option<String>,
    fresh: bool,
    max_pending: u64,
    series: &str,
) -> Result<usize, PollError> {
    let cfg = &src.cfg;
    let name = &cfg.name;
    if fresh && cfg.watermark.bootstrap == "latest" {
        // The newest item's id becomes the watermark; nothing is appended.
        let body = request(client, src, None, 1, series).await?;
        let page = parse_page(cfg, src.schema.as_deref(), &body)?;
        // The newest item's id, whether or not its schema takes it (nothing is appended).
        let newest = page
            .items
            .first()
            .map(|i| i.id.clone())
            .or_else(|| page.rejected.first().map(|(id, _)| id.clone()));
        if let Some(first) = newest {
            advance(engine, name, None, first).await?;
        }
        return Ok(0);
    }
    // One cycle: the pages after the watermark it starts from, each appended as it comes
    // (atomic, never skipped, never twice); the cycle's one notification with its last page;
    // then one upstream ack of every item of the cycle and one watermark move. A crash
    // before the move replays the cycle from the same watermark: the items already in the
    // log are left out and the notification still covers all of them, once.
    let start = watermark.clone();
    let mut cursor = watermark;
    let mut appended = 0;
    let mut ids: Vec<String> = Vec::new();
    let mut first_of_cycle: Option<SourceItem> = None;
    for n in 0..cfg.max_pages_per_poll {
        let body = request(client, src, cursor.as_deref(), cfg.page_size, series).await?;
        let page = parse_page(cfg, src.schema.as_deref(), &body)?;
        let last = !page.has_more || n + 1 == cfg.max_pages_per_poll;
        if !page.items.is_empty() || !page.rejected.is_empty() || last {
            // Acknowledged upstream: the items appended, and those the schema refused (received
            // and recorded as skipped; an upstream that resends what is not acknowledged would
            // send them for ever).
            ids.extend(page.ids.iter().cloned());
            // The page's items stay here too until the command says which one, if any, is
            // the first its cycle's notification covers (the title's placeholders read it).
            let items = if first_of_cycle.is_none() {
                Some(page.items.clone())
            } else {
                None
            };
            let cmd = Page {
                name: name.clone(),
                items: page.items,
                notify: cfg.notify.clone(),
                // The source's share of the outbox (section 12's backpressure).
                max_pending: (max_pending as f64 * cfg.backpressure_threshold).floor() as u64,
                last,
                first_of_cycle: first_of_cycle.clone(),
                rejected: page.rejected,
            };
            let (out, _) = engine.execute(cmd).await.map_err(command_error)?;
            if let (None, Some(id), Some(items)) = (&first_of_cycle, &out.first_covered, items) {
                first_of_cycle = items.into_iter().find(|i| i.id == *id);
            }
            if let Some((pending, retry_after_s)) = out.held_back {
                // Backpressure (section 12): the page and its notification wait for the
                // outbox to drain; the next poll replays the cycle from its watermark.
                metrics::gauge!("tidemark_source_backpressure", &src.labels(&[])).set(1.0);
                return Err(PollError::RetryAfter(
                    Duration::from_secs(retry_after_s),
                    None,
                    format!(
                        "backpressure: {pending} deliveries pending, at or past {:.0} % of \
                         outbox.max_pending",
                        cfg.backpressure_threshold * 100.0
                    ),
                ));
            }
            metrics::gauge!("tidemark_source_backpressure", &src.labels(&[])).set(0.0);
            appended += out.appended;
            if out.rejected > 0 {
                metrics::counter!("tidemark_source_items_skipped_total", &src.labels(&[]))
                    .increment(out.rejected as u64);
                tracing::warn!(target: "tidemark::sources", source = %name, skipped = out.rejected,
                    "items refused by the source's schema were skipped (source.item_skipped says why)");
            }
            if out.notified {
                metrics::counter!(
                    "tidemark_source_notifications_generated_total",
                    &src.labels(&[])
                )
                .increment(1);
            }
            if out.notify_blocked {
                // The recipient is suppressed (crisis block): the items went in without it.
                metrics::counter!(
                    "tidemark_source_notifications_blocked_total",
                    &src.labels(&[])
                )
                .increment(1);
                tracing::info!(source = %name, "a cycle's notification was left out: its recipient is suppressed");
            }
        }
        if let Some(to) = page.next {
            cursor = Some(to);
        }
        if last {
            break;
        }
    }
    if let (Some(ack), false) = (&cfg.ack, ids.is_empty()) {
        send_ack(
            client,
            src,
            ack,
            &ids,
            start.as_deref().unwrap_or(""),
            cursor.as_deref().unwrap_or(""),
        )
        .await?;
    }
    if let Some(to) = cursor.filter(|to| Some(to) != start.as_ref()) {
        advance(engine, name, start, to).await?;
    }
    Ok(appended)
}

async fn advance(
    engine: &Engine,
    name: &str,
    from: Option<String>,
    to: String,
) -> Result<(), PollError> {
    engine
        .execute(Advance {
            name: name.to_owned(),
            from,
            to,
        })
        .await
        .map(drop)
        .map_err(command_error)
}

fn command_error(e: CommandError) -> PollError {
    match e.rejection() {
        Some(Rejection::SourceNotActive) => PollError::NotActive,
        // Someone else moved the watermark (a reset): the next poll starts from it.
        Some(Rejection::WatermarkConflict) => PollError::Transient(None, e.to_string()),
        Some(Rejection::WatermarkBackwards) => PollError::Park(format!("pointer next: {e}")),
        Some(r) if r.kind() == RejectKind::Invalid => PollError::Park(e.to_string()),
        _ => PollError::Transient(None, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::in_a_row;

    #[test]
    fn failures_count_in_a_row_per_class() {
        let mut f = std::collections::HashMap::new();
        assert_eq!(in_a_row(&mut f, "http_5xx"), 1);
        assert_eq!(in_a_row(&mut f, "http_5xx"), 2);
        assert_eq!(in_a_row(&mut f, "http_5xx"), 3);
        // Another class ends the run: each starts over after the other.
        assert_eq!(in_a_row(&mut f, "timeout"), 1);
        assert_eq!(in_a_row(&mut f, "http_5xx"), 1);
        assert_eq!(in_a_row(&mut f, "http_5xx"), 2);
        assert_eq!(f.len(), 1, "only the current run is kept");
    }
}
