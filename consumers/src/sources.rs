//! Source pollers (spec section 12): each configured source polls its upstream on its own
//! schedule, in a task of its own (polls of one source never overlap, and a slow upstream
//! delays only its own source), and turns pages into events through the engine's commands:
//! the page (new items, and the notification about them, in one atomic batch decided at the
//! head), then the upstream ack, then the watermark's compare-and-swap. A crash anywhere
//! replays the same page harmlessly: items already in the log are left out, the notification's
//! id is derived from the first new item, the ack repeats with the same idempotency key, and
//! the watermark moves only from where it was.
//!
//! Header values are secrets: they are resolved once at start (`env:NAME`) and never logged,
//! served or put into an error.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, FixedOffset, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_engine::Engine;
use tidemark_engine::commands::{NotifyPlan, SourceCommand, SourceItem};
use tidemark_log::{CommandError, RejectKind};
use tidemark_projections::routing::{RetrySettings, Strategy, backoff_ms, parse_duration_ms};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Largest response body read from an upstream.
pub const MAX_RESPONSE_BYTES: usize = 10 << 20;
/// Most items one page may hold.
pub const MAX_ITEMS: usize = 1000;
/// Largest item (its JSON text).
pub const MAX_ITEM_BYTES: usize = 64 << 10;

/// `[[sources]]`, as configured (section 12).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    pub name: String,
    pub url: String,
    #[serde(default = "default_method")]
    pub method: String,
    /// Values may be `env:NAME`. Never logged or served (masked by `Debug` and `config show`).
    #[serde(default, serialize_with = "masked")]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: Option<Value>,
    pub every: Option<String>,
    pub cron: Option<String>,
    pub tz: Option<String>,
    #[serde(default = "default_timeout")]
    pub timeout: String,
    #[serde(default = "default_pages")]
    pub max_pages_per_poll: u32,
    #[serde(default = "default_page_size")]
    pub page_size: u32,
    pub watermark: WatermarkConfig,
    pub items: ItemsConfig,
    pub notify: Option<NotifyPlan>,
    pub ack: Option<AckConfig>,
    #[serde(default)]
    pub retry: SourceRetryConfig,
}

fn masked<S: serde::Serializer>(h: &BTreeMap<String, String>, s: S) -> Result<S::Ok, S::Error> {
    let m: BTreeMap<&str, &str> = h.keys().map(|k| (k.as_str(), "<masked>")).collect();
    m.serialize(s)
}

impl std::fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceConfig")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn default_method() -> String {
    "GET".into()
}
fn default_timeout() -> String {
    "30s".into()
}
fn default_pages() -> u32 {
    10
}
fn default_page_size() -> u32 {
    100
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatermarkConfig {
    pub request_field: String,
    pub next: String,
    pub has_more: String,
    #[serde(default = "default_limit_field")]
    pub limit_field: String,
    #[serde(default = "default_bootstrap")]
    pub bootstrap: String,
}
fn default_limit_field() -> String {
    "limit".into()
}
fn default_bootstrap() -> String {
    "all".into()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsConfig {
    pub path: String,
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckConfig {
    pub url: String,
    pub field: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceRetryConfig {
    #[serde(default = "default_strategy")]
    pub strategy: String,
    #[serde(default = "default_base")]
    pub base_delay: String,
    #[serde(default = "default_max")]
    pub max_delay: String,
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    #[serde(default = "default_retry_after_max")]
    pub retry_after_max: String,
}
fn default_strategy() -> String {
    "exponential".into()
}
fn default_base() -> String {
    "1s".into()
}
fn default_max() -> String {
    "5m".into()
}
fn default_jitter() -> f64 {
    0.25
}
fn default_retry_after_max() -> String {
    "1h".into()
}
impl Default for SourceRetryConfig {
    fn default() -> Self {
        SourceRetryConfig {
            strategy: default_strategy(),
            base_delay: default_base(),
            max_delay: default_max(),
            jitter: default_jitter(),
            retry_after_max: default_retry_after_max(),
        }
    }
}

/// When a source polls.
#[derive(Debug, Clone)]
enum Schedule {
    Every(Duration),
    Cron {
        cron: Box<croner::Cron>,
        tz: FixedOffset,
    },
}

impl Schedule {
    /// The next poll after `now` (wall clock, UTC).
    fn next_after(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Schedule::Every(d) => now + chrono::Duration::from_std(*d).unwrap_or_default(),
            Schedule::Cron { cron, tz } => cron
                .find_next_occurrence(&now.with_timezone(tz), false)
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or(now + chrono::Duration::hours(24)),
        }
    }

    /// The length of one interval (for `stale`): `every`, or the gap between the next two
    /// scheduled times.
    fn interval(&self, now: DateTime<Utc>) -> Duration {
        match self {
            Schedule::Every(d) => *d,
            Schedule::Cron { .. } => {
                let a = self.next_after(now);
                let b = self.next_after(a);
                (b - a).to_std().unwrap_or(Duration::from_secs(86_400))
            }
        }
    }
}

/// A source's configuration checked and resolved (header secrets read from the environment).
#[derive(Clone)]
pub struct Source {
    pub cfg: SourceConfig,
    schedule: Schedule,
    timeout: Duration,
    headers: reqwest::header::HeaderMap,
    retry: RetrySettings,
    retry_after_max: Duration,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The resolved header values are secrets: only the configuration's (masked) view.
        self.cfg.fmt(f)
    }
}

fn key_err(name: &str, key: &str, why: impl std::fmt::Display) -> String {
    format!("sources.{name}.{key}: {why}")
}

fn check_pointer(name: &str, key: &str, p: &str, allow_empty: bool) -> Result<(), String> {
    if (p.is_empty() && allow_empty) || p.starts_with('/') {
        Ok(())
    } else {
        Err(key_err(name, key, "must be a JSON pointer (\"/a/b\")"))
    }
}

fn tz_offset(s: &str) -> Option<FixedOffset> {
    if s == "UTC" || s == "Z" {
        return FixedOffset::east_opt(0);
    }
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1, &s[1..]),
        b'-' => (-1, &s[1..]),
        _ => return None,
    };
    let (h, m) = rest.split_once(':')?;
    let (h, m): (i32, i32) = (h.parse().ok()?, m.parse().ok()?);
    if h > 14 || m > 59 || rest.len() != 5 {
        return None;
    }
    FixedOffset::east_opt(sign * (h * 3600 + m * 60))
}

impl Source {
    /// Validate `cfg` (errors name the key) and resolve its header values.
    pub fn new(cfg: SourceConfig) -> Result<Source, String> {
        let n = cfg.name.clone();
        if n.is_empty()
            || n.len() > 64
            || !n
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(format!("sources: name {n:?} must match [a-z0-9_-]{{1,64}}"));
        }
        let url = reqwest::Url::parse(&cfg.url).map_err(|e| key_err(&n, "url", e))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(key_err(&n, "url", "must be http:// or https://"));
        }
        if !matches!(cfg.method.as_str(), "GET" | "POST") {
            return Err(key_err(&n, "method", "must be GET or POST"));
        }
        if let Some(b) = &cfg.body
            && !b.is_object()
        {
            return Err(key_err(&n, "body", "must be a table (a JSON object)"));
        }
        let schedule = match (&cfg.every, &cfg.cron) {
            (Some(e), None) => Schedule::Every(Duration::from_millis(
                parse_duration_ms(e)
                    .filter(|ms| *ms >= 1)
                    .ok_or_else(|| key_err(&n, "every", "is not a duration (\"15m\", \"30s\")"))?,
            )),
            (None, Some(c)) => {
                if c.split_whitespace().count() != 5 {
                    return Err(key_err(&n, "cron", "must have 5 fields"));
                }
                use std::str::FromStr as _;
                let cron = croner::Cron::from_str(c).map_err(|e| key_err(&n, "cron", e))?;
                let tz = match &cfg.tz {
                    None => FixedOffset::east_opt(0).expect("zero offset"),
                    Some(t) => tz_offset(t)
                        .ok_or_else(|| key_err(&n, "tz", "must be \"UTC\" or \"+HH:MM\""))?,
                };
                Schedule::Cron {
                    cron: Box::new(cron),
                    tz,
                }
            }
            (Some(_), Some(_)) => return Err(key_err(&n, "every", "give every or cron, not both")),
            (None, None) => return Err(key_err(&n, "every", "give every or cron")),
        };
        if cfg.tz.is_some() && cfg.cron.is_none() {
            return Err(key_err(&n, "tz", "only goes with cron"));
        }
        let timeout = parse_duration_ms(&cfg.timeout)
            .filter(|ms| *ms >= 1)
            .ok_or_else(|| key_err(&n, "timeout", "is not a duration"))?;
        if !(1..=1000).contains(&cfg.max_pages_per_poll) {
            return Err(key_err(&n, "max_pages_per_poll", "must be 1..=1000"));
        }
        if !(1..=1000).contains(&cfg.page_size) {
            return Err(key_err(&n, "page_size", "must be 1..=1000"));
        }
        let w = &cfg.watermark;
        if w.request_field.is_empty() || w.limit_field.is_empty() {
            return Err(key_err(&n, "watermark.request_field", "must not be empty"));
        }
        check_pointer(&n, "watermark.next", &w.next, false)?;
        check_pointer(&n, "watermark.has_more", &w.has_more, false)?;
        if !matches!(w.bootstrap.as_str(), "latest" | "all") {
            return Err(key_err(&n, "watermark.bootstrap", "must be latest or all"));
        }
        check_pointer(&n, "items.path", &cfg.items.path, true)?;
        check_pointer(&n, "items.id", &cfg.items.id, true)?;
        if let Some(no) = &cfg.notify
            && tidemark_projections::names::Priority::parse(&no.priority).is_none()
        {
            return Err(key_err(
                &n,
                "notify.priority",
                "must be urgent, action, warning or info",
            ));
        }
        if let Some(a) = &cfg.ack {
            reqwest::Url::parse(&a.url).map_err(|e| key_err(&n, "ack.url", e))?;
            if a.field.is_empty() {
                return Err(key_err(&n, "ack.field", "must not be empty"));
            }
        }
        let r = &cfg.retry;
        let retry = RetrySettings {
            strategy: Strategy::parse(&r.strategy).ok_or_else(|| {
                key_err(&n, "retry.strategy", "must be exponential, linear or fixed")
            })?,
            max_attempts: u32::MAX,
            base_delay_ms: parse_duration_ms(&r.base_delay)
                .ok_or_else(|| key_err(&n, "retry.base_delay", "is not a duration"))?,
            max_delay_ms: parse_duration_ms(&r.max_delay)
                .ok_or_else(|| key_err(&n, "retry.max_delay", "is not a duration"))?,
            jitter: Some(r.jitter)
                .filter(|j| (0.0..=1.0).contains(j))
                .ok_or_else(|| key_err(&n, "retry.jitter", "must be between 0 and 1"))?,
            lease_ttl_ms: 0,
            batch_size: 1,
        };
        let retry_after_max = Duration::from_millis(
            parse_duration_ms(&r.retry_after_max)
                .ok_or_else(|| key_err(&n, "retry.retry_after_max", "is not a duration"))?,
        );
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &cfg.headers {
            let value = match v.strip_prefix("env:") {
                Some(var) => std::env::var(var).map_err(|_| {
                    key_err(
                        &n,
                        &format!("headers.{k}"),
                        format!("environment variable {var} is not set"),
                    )
                })?,
                None => v.clone(),
            };
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| key_err(&n, &format!("headers.{k}"), "is not a header name"))?;
            let mut value = reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
                // The value itself is a secret: not in the error.
                key_err(&n, &format!("headers.{k}"), "is not a valid header value")
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        Ok(Source {
            cfg,
            schedule,
            timeout: Duration::from_millis(timeout),
            headers,
            retry,
            retry_after_max,
        })
    }
}

/// What the poller keeps in memory about a source (section 12: not in the log).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Runtime {
    /// idle, polling, backing_off (paused and parked come from the log).
    pub state: String,
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
}

struct Slot {
    source: Source,
    runtime: Mutex<Runtime>,
    wake: Notify,
    started_us: i64,
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
                                state: "idle".into(),
                                ..Runtime::default()
                            }),
                            wake: Notify::new(),
                            started_us,
                        })
                    })
                    .collect(),
            ),
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.slots
            .iter()
            .map(|s| s.source.cfg.name.clone())
            .collect()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.slot(name).is_some()
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
        r.stale = now_us() - since > interval.saturating_mul(3);
        r.seconds_since_success = (now_us() - since).max(0) as f64 / 1e6;
        Some(r)
    }

    /// Poll `name` now (or as soon as its current poll ends); also wakes a paused or parked
    /// source's task after a resume.
    pub fn wake(&self, name: &str) -> bool {
        match self.slot(name) {
            Some(s) => {
                s.wake.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Start one poller per source; the handle ends when every poller has stopped on `shutdown`.
pub fn spawn(
    engine: Engine,
    sources: Sources,
    max_pending: u64,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default();
    let tasks: Vec<_> = sources
        .slots
        .iter()
        .map(|slot| {
            tokio::spawn(run(
                engine.clone(),
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
enum PollError {
    /// Wait this long (429/503 with Retry-After, a full outbox), capped by the caller.
    RetryAfter(Duration, String),
    /// Retry with backoff (5xx, timeout, connection error, a storage refusal).
    Transient(String),
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

async fn run(
    engine: Engine,
    client: reqwest::Client,
    slot: Arc<Slot>,
    max_pending: u64,
    shutdown: CancellationToken,
) {
    let name = slot.source.cfg.name.clone();
    let mut next = slot.source.schedule.next_after(Utc::now());
    // A source polls once at start (a schedule's first time may be far away).
    let mut due_now = true;
    let mut unauthorized_once = false;
    loop {
        if !due_now {
            set(&slot, |r| r.next_poll_at_us = Some(next.timestamp_micros()));
            let wait = (next - Utc::now()).to_std().unwrap_or_default();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = slot.wake.notified() => {}
            }
        }
        due_now = false;
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
                r.state = if row.parked { "parked" } else { "paused" }.into();
                r.next_poll_at_us = None;
            });
            // Until a resume (or a poll request, answered 409 by the API) wakes it.
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = slot.wake.notified() => {}
            }
            due_now = true;
            continue;
        }
        set(&slot, |r| {
            r.state = "polling".into();
            r.last_poll_at_us = Some(now_us());
        });
        let started = Instant::now();
        let result = tokio::select! {
            _ = shutdown.cancelled() => Err(PollError::Stopped),
            r = poll(&engine, &client, &slot.source, row.watermark.clone(), row.items_total == 0 && row.watermark.is_none(), max_pending) => r,
        };
        metrics::histogram!("tidemark_source_poll_duration_seconds", "source" => name.clone())
            .record(started.elapsed().as_secs_f64());
        let outcome = match &result {
            Ok(_) => "ok",
            Err(PollError::RetryAfter(..)) => "retry_after",
            Err(PollError::Transient(_)) => "error",
            Err(PollError::Unauthorized(_)) => "unauthorized",
            Err(PollError::Park(_)) => "parked",
            Err(PollError::NotActive) => "not_active",
            Err(PollError::Stopped) => "stopped",
        };
        metrics::counter!("tidemark_source_polls_total", "source" => name.clone(), "outcome" => outcome)
            .increment(1);
        let failures = slot
            .runtime
            .lock()
            .map(|r| r.consecutive_failures)
            .unwrap_or(0);
        match result {
            Ok(items) => {
                unauthorized_once = false;
                metrics::counter!("tidemark_source_items_total", "source" => name.clone())
                    .increment(items as u64);
                metrics::gauge!("tidemark_source_last_success_timestamp_seconds", "source" => name.clone())
                    .set(now_us() as f64 / 1e6);
                set(&slot, |r| {
                    r.state = "idle".into();
                    r.last_success_at_us = Some(now_us());
                    r.consecutive_failures = 0;
                    r.last_error = None;
                });
                next = slot.source.schedule.next_after(Utc::now());
            }
            Err(PollError::Stopped) => return,
            Err(PollError::NotActive) => {}
            Err(PollError::Park(error)) => {
                tracing::warn!(source = %name, %error, "source parked");
                park(&engine, &name, error).await;
            }
            Err(PollError::Unauthorized(error)) if unauthorized_once => {
                tracing::warn!(source = %name, %error, "source parked after a second 401");
                park(&engine, &name, error).await;
                unauthorized_once = false;
            }
            Err(PollError::Unauthorized(error)) => {
                // Retried once, at once (a token may just have been rotated upstream).
                unauthorized_once = true;
                set(&slot, |r| {
                    r.consecutive_failures += 1;
                    r.last_error = Some(error);
                });
                due_now = true;
            }
            Err(PollError::RetryAfter(wait, error)) => {
                let wait = wait.min(slot.source.retry_after_max);
                tracing::info!(source = %name, wait_ms = wait.as_millis() as u64, "source backing off (Retry-After)");
                set(&slot, |r| {
                    r.state = "backing_off".into();
                    r.consecutive_failures += 1;
                    r.last_error = Some(error);
                });
                next = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
            }
            Err(PollError::Transient(error)) => {
                let attempt = failures + 1;
                let delay = backoff_ms(&slot.source.retry, attempt, rand::random::<f64>(), None);
                tracing::info!(source = %name, attempt, delay_ms = delay, %error, "source poll failed; backing off");
                set(&slot, |r| {
                    r.state = "backing_off".into();
                    r.consecutive_failures = attempt;
                    r.last_error = Some(error);
                });
                next = Utc::now() + chrono::Duration::milliseconds(delay as i64);
            }
        }
    }
}

async fn park(engine: &Engine, name: &str, error: String) {
    let r = engine
        .execute(SourceCommand::Park {
            name: name.to_owned(),
            error,
        })
        .await;
    if let Err(e) = r {
        tracing::warn!(source = %name, error = %e, "could not record the parking");
    }
}

/// One poll: pages after the watermark, up to `max_pages_per_poll`. Answers the number of
/// items appended.
async fn poll(
    engine: &Engine,
    client: &reqwest::Client,
    src: &Source,
    mut watermark: Option<String>,
    fresh: bool,
    max_pending: u64,
) -> Result<usize, PollError> {
    let cfg = &src.cfg;
    let name = &cfg.name;
    if fresh && cfg.watermark.bootstrap == "latest" {
        // The newest item's id becomes the watermark; nothing is appended.
        let body = request(client, src, None, 1).await?;
        let page = parse_page(cfg, &body)?;
        if let Some(first) = page.items.first() {
            advance(engine, name, None, first.id.clone()).await?;
        }
        return Ok(0);
    }
    let mut appended = 0;
    for _ in 0..cfg.max_pages_per_poll {
        let body = request(client, src, watermark.as_deref(), cfg.page_size).await?;
        let page = parse_page(cfg, &body)?;
        if !page.items.is_empty() {
            let ids: Vec<String> = page.items.iter().map(|i| i.id.clone()).collect();
            let cmd = SourceCommand::Page {
                name: name.clone(),
                items: page.items,
                notify: cfg.notify.clone(),
                max_pending,
            };
            let out = engine
                .execute(cmd)
                .await
                .map_err(command_error)?
                .0
                .into_source_page()
                .map_err(command_error)?;
            appended += out.appended;
            if out.notify_blocked {
                // The recipient is suppressed (crisis block): the items went in without it.
                metrics::counter!("tidemark_source_notifications_blocked_total", "source" => name.clone())
                    .increment(1);
                tracing::info!(source = %name, "a page's notification was left out: its recipient is suppressed");
            }
            if let Some(ack) = &cfg.ack {
                send_ack(
                    client,
                    src,
                    ack,
                    &ids,
                    watermark.as_deref().unwrap_or(""),
                    page.next.as_deref().unwrap_or(""),
                )
                .await?;
            }
        }
        match page.next {
            Some(to) if Some(&to) != watermark.as_ref() => {
                advance(engine, name, watermark.clone(), to.clone()).await?;
                watermark = Some(to);
            }
            _ => {}
        }
        if !page.has_more {
            break;
        }
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
        .execute(SourceCommand::Advance {
            name: name.to_owned(),
            from,
            to,
        })
        .await
        .map(drop)
        .map_err(command_error)
}

fn command_error(e: CommandError) -> PollError {
    match &e {
        CommandError::Rejected { code, .. } if *code == "source_not_active" => PollError::NotActive,
        CommandError::Rejected {
            kind: RejectKind::Overloaded,
            ..
        } => PollError::RetryAfter(Duration::from_secs(5), format!("outbox full: {e}")),
        // Someone else moved the watermark (a reset): the next poll starts from it.
        CommandError::Rejected { code, .. } if *code == "watermark_conflict" => {
            PollError::Transient(e.to_string())
        }
        CommandError::Rejected {
            kind: RejectKind::Invalid,
            code,
            ..
        } if *code == "watermark_backwards" => PollError::Park(format!("pointer {}: {e}", "next")),
        CommandError::Rejected {
            kind: RejectKind::Invalid,
            ..
        } => PollError::Park(e.to_string()),
        _ => PollError::Transient(e.to_string()),
    }
}

/// The upstream's answer, checked: status and a bounded body.
async fn request(
    client: &reqwest::Client,
    src: &Source,
    watermark: Option<&str>,
    limit: u32,
) -> Result<Vec<u8>, PollError> {
    let cfg = &src.cfg;
    let w = &cfg.watermark;
    let mut req = match cfg.method.as_str() {
        "POST" => {
            let mut body = cfg
                .body
                .clone()
                .unwrap_or_else(|| Value::Object(Default::default()));
            if let Some(obj) = body.as_object_mut() {
                obj.insert(w.limit_field.clone(), Value::from(limit));
                match watermark {
                    Some(v) => {
                        obj.insert(w.request_field.clone(), Value::from(v));
                    }
                    None => {
                        obj.remove(&w.request_field);
                    }
                }
            }
            client.post(&cfg.url).json(&body)
        }
        _ => {
            let mut q: Vec<(&str, String)> = vec![(w.limit_field.as_str(), limit.to_string())];
            if let Some(v) = watermark {
                q.push((w.request_field.as_str(), v.to_owned()));
            }
            client.get(&cfg.url).query(&q)
        }
    };
    req = req.headers(src.headers.clone()).timeout(src.timeout);
    let resp = req.send().await.map_err(|e| transport(&e))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(status_error(status, resp.headers()));
    }
    read_bounded(resp).await
}

/// An error of the HTTP client, without anything of the request (headers, URL query).
fn transport(e: &reqwest::Error) -> PollError {
    let what = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "reading the body failed"
    } else {
        "request failed"
    };
    PollError::Transient(what.into())
}

fn status_error(status: reqwest::StatusCode, headers: &reqwest::header::HeaderMap) -> PollError {
    let code = status.as_u16();
    let retry_after = headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    match (code, retry_after) {
        (429 | 503, Some(d)) => PollError::RetryAfter(d, format!("status {code}")),
        (401, _) => PollError::Unauthorized(format!("status {code}")),
        (500..=599, _) | (429, _) | (408, _) => PollError::Transient(format!("status {code}")),
        _ => PollError::Park(format!("status {code}")),
    }
}

async fn read_bounded(mut resp: reqwest::Response) -> Result<Vec<u8>, PollError> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_RESPONSE_BYTES as u64)
    {
        return Err(PollError::Park(format!(
            "response over {MAX_RESPONSE_BYTES} bytes"
        )));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(&e))? {
        if out.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(PollError::Park(format!(
                "response over {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A validated page.
#[derive(Debug)]
struct Page {
    items: Vec<SourceItem>,
    next: Option<String>,
    has_more: bool,
}

fn invalid(pointer: &str, why: &str) -> PollError {
    PollError::Park(format!("invalid response at {pointer}: {why}"))
}

fn parse_page(cfg: &SourceConfig, body: &[u8]) -> Result<Page, PollError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| invalid("", "not JSON"))?;
    let path = &cfg.items.path;
    let list = if path.is_empty() {
        Some(&v)
    } else {
        v.pointer(path)
    };
    let list = list
        .and_then(Value::as_array)
        .ok_or_else(|| invalid(path, "not an array"))?;
    if list.len() > MAX_ITEMS {
        return Err(invalid(path, &format!("more than {MAX_ITEMS} items")));
    }
    let mut items = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let at = format!("{path}/{i}");
        if !item.is_object() {
            return Err(invalid(&at, "not an object"));
        }
        if serde_json::to_string(item)
            .map(|s| s.len())
            .unwrap_or(usize::MAX)
            > MAX_ITEM_BYTES
        {
            return Err(invalid(&at, "item over 64 KiB"));
        }
        let id_at = format!("{at}{}", cfg.items.id);
        let id = item
            .pointer(&cfg.items.id)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid(&id_at, "not a non-empty string"))?;
        let event_id = tidemark_projections::names::ids::source_item(&cfg.name, id);
        if event_id.chars().count() > 128 || id.chars().any(char::is_control) {
            return Err(invalid(&id_at, "does not make a valid event_id"));
        }
        items.push(SourceItem {
            id: id.to_owned(),
            item: item.clone(),
        });
    }
    let next = match v.pointer(&cfg.watermark.next) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid(&cfg.watermark.next, "not a string or null")),
    };
    let has_more = match v.pointer(&cfg.watermark.has_more) {
        Some(Value::Bool(b)) => *b,
        _ => return Err(invalid(&cfg.watermark.has_more, "not a boolean")),
    };
    if !items.is_empty() && next.is_none() {
        return Err(invalid(&cfg.watermark.next, "null on a page with items"));
    }
    Ok(Page {
        items,
        next,
        has_more,
    })
}

async fn send_ack(
    client: &reqwest::Client,
    src: &Source,
    ack: &AckConfig,
    ids: &[String],
    from: &str,
    to: &str,
) -> Result<(), PollError> {
    let mut body = serde_json::Map::new();
    body.insert(ack.field.clone(), Value::from(ids.to_vec()));
    let resp = client
        .post(&ack.url)
        .headers(src.headers.clone())
        .header(
            "X-Idempotency-Key",
            format!("ack:{}:{from}:{to}", src.cfg.name),
        )
        .timeout(src.timeout)
        .json(&Value::Object(body))
        .send()
        .await
        .map_err(|e| transport(&e))?;
    if !resp.status().is_success() {
        return Err(status_error(resp.status(), resp.headers()));
    }
    Ok(())
}

/// The sources of a configuration, validated; the first error names its key.
pub fn from_config(list: &[SourceConfig]) -> Result<Vec<Source>, String> {
    let mut seen = HashMap::new();
    let mut out = Vec::new();
    for c in list {
        if seen.insert(c.name.clone(), ()).is_some() {
            return Err(format!("sources: name {:?} is used twice", c.name));
        }
        out.push(Source::new(c.clone())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SourceConfig {
        serde_json::from_value(serde_json::json!({
            "name": "s1", "url": "http://127.0.0.1:1/x", "every": "1s",
            "watermark": {"request_field": "afterId", "next": "/pagination/nextAfterId", "has_more": "/pagination/hasMore"},
            "items": {"path": "/data", "id": "/id"},
            "headers": {"authorization": "Bearer very-secret"},
        }))
        .unwrap()
    }

    #[test]
    fn validation_names_the_key_and_hides_header_values() {
        Source::new(cfg()).unwrap();
        let mut c = cfg();
        c.every = None;
        c.cron = Some("0 9,17 * * *".into());
        c.tz = Some("+02:00".into());
        Source::new(c.clone()).unwrap();
        c.tz = Some("Mars/Olympus".into());
        assert!(Source::new(c).unwrap_err().contains("sources.s1.tz"));
        let mut c = cfg();
        c.name = "Bad Name".into();
        assert!(Source::new(c).unwrap_err().contains("[a-z0-9_-]"));
        let mut c = cfg();
        c.watermark.next = "pagination".into();
        assert!(Source::new(c).unwrap_err().contains("watermark.next"));
        let mut c = cfg();
        c.headers
            .insert("x-key".into(), "env:TIDEMARK_TEST_UNSET_VAR".into());
        assert!(
            Source::new(c)
                .unwrap_err()
                .contains("TIDEMARK_TEST_UNSET_VAR")
        );
        let mut c = cfg();
        c.headers.insert("x-bad".into(), "secret\nvalue".into());
        let e = Source::new(c.clone()).unwrap_err();
        assert!(e.contains("headers.x-bad") && !e.contains("secret"), "{e}");
        let shown = format!("{c:?} {}", serde_json::to_string(&c).unwrap());
        assert!(!shown.contains("very-secret"), "{shown}");
    }

    #[test]
    fn pages_are_validated_with_the_failing_pointer() {
        let c = cfg();
        let ok =
            br#"{"data":[{"id":"a"},{"id":"b"}],"pagination":{"nextAfterId":"b","hasMore":false}}"#;
        let p = parse_page(&c, ok).unwrap();
        assert_eq!(p.items.len(), 2);
        assert_eq!(p.next.as_deref(), Some("b"));
        let cases: [(&[u8], &str); 5] = [
            (b"{", "not JSON"),
            (
                br#"{"data":{},"pagination":{"nextAfterId":null,"hasMore":false}}"#,
                "/data",
            ),
            (
                br#"{"data":[{"id":7}],"pagination":{"nextAfterId":"x","hasMore":false}}"#,
                "/data/0/id",
            ),
            (
                br#"{"data":[{"id":"a"}],"pagination":{"nextAfterId":null,"hasMore":false}}"#,
                "/pagination/nextAfterId",
            ),
            (
                br#"{"data":[],"pagination":{"nextAfterId":null,"hasMore":"no"}}"#,
                "/pagination/hasMore",
            ),
        ];
        let many: Vec<_> = (0..=MAX_ITEMS)
            .map(|i| serde_json::json!({"id": i.to_string()}))
            .collect();
        let too_many =
            serde_json::json!({"data": many, "pagination": {"nextAfterId": "x", "hasMore": true}})
                .to_string();
        let big = serde_json::json!({"data": [{"id": "a", "blob": "x".repeat(MAX_ITEM_BYTES)}], "pagination": {"nextAfterId": "a", "hasMore": false}}).to_string();
        let cases: Vec<(&[u8], &str)> = cases
            .into_iter()
            .chain([
                (too_many.as_bytes(), "more than 1000 items"),
                (big.as_bytes(), "/data/0: item over 64 KiB"),
            ])
            .collect();
        for (body, want) in cases {
            match parse_page(&c, body) {
                Err(PollError::Park(e)) => assert!(e.contains(want), "{e} should name {want}"),
                other => panic!("{want}: {other:?}"),
            }
        }
    }

    #[test]
    fn retry_after_and_statuses() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, "7".parse().unwrap());
        assert!(
            matches!(status_error(reqwest::StatusCode::TOO_MANY_REQUESTS, &h), PollError::RetryAfter(d, _) if d == Duration::from_secs(7))
        );
        let none = reqwest::header::HeaderMap::new();
        assert!(matches!(
            status_error(reqwest::StatusCode::UNAUTHORIZED, &none),
            PollError::Unauthorized(_)
        ));
        assert!(matches!(
            status_error(reqwest::StatusCode::BAD_GATEWAY, &none),
            PollError::Transient(_)
        ));
        assert!(
            matches!(status_error(reqwest::StatusCode::NOT_FOUND, &none), PollError::Park(e) if e == "status 404")
        );
    }

    #[test]
    fn cron_in_a_fixed_offset() {
        use std::str::FromStr as _;
        let s = Schedule::Cron {
            cron: Box::new(croner::Cron::from_str("0 9 * * *").unwrap()),
            tz: tz_offset("+02:00").unwrap(),
        };
        let now = DateTime::parse_from_rfc3339("2026-11-23T06:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(s.next_after(now).to_rfc3339(), "2026-11-23T07:00:00+00:00");
        assert_eq!(s.interval(now), Duration::from_secs(86_400));
    }
}
