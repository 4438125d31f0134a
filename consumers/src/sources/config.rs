//! `[[sources]]` (spec section 12): the configuration as written, checked once at start
//! (every error names its key, never a header value), and resolved into a [`Source`]: its
//! schedule, timeout, backoff and header values (`env:NAME` read from the environment).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, FixedOffset, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_engine::commands::NotifyPlan;
use tidemark_projections::routing::{RetrySettings, Strategy, parse_duration_ms};

/// `[[sources]]`, as configured (section 12).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    pub name: String,
    /// The tenant whose events its items become (spec section 20); absent: `default`. Its
    /// poller waits while the tenant is not in the directory.
    #[serde(default)]
    pub tenant: Option<String>,
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
    /// Poll once at start, before the schedule's first time. Default: `true` for `every` (the
    /// interval counts from a poll), `false` for `cron` (it polls only at its times; an
    /// upstream that must not be called outside them is not).
    #[serde(default)]
    pub poll_at_start: Option<bool>,
    #[serde(default = "default_timeout")]
    pub timeout: String,
    #[serde(default = "default_pages")]
    pub max_pages_per_poll: u32,
    #[serde(default = "default_page_size")]
    pub page_size: u32,
    /// A header to send an idempotency key in with every poll request (e.g.
    /// `Idempotency-Key`): `poll:<name>:<watermark>:<series>`, the series the same for the
    /// retries of a failed poll and new after a success.
    #[serde(default)]
    pub idempotency_header: Option<String>,
    /// Wait while the poll's notification would take pending deliveries past this share of
    /// `outbox.max_pending` (0 < it ≤ 1; default 0.8).
    #[serde(default = "default_backpressure")]
    pub backpressure_threshold: f64,
    pub watermark: WatermarkConfig,
    pub items: ItemsConfig,
    pub notify: Option<NotifyPlan>,
    pub ack: Option<AckConfig>,
    #[serde(default)]
    pub retry: SourceRetryConfig,
    /// An upstream token obtained and refreshed by OAuth 2 client credentials (seed 004):
    /// sent as `Authorization: Bearer <token>` on every list and ack request.
    #[serde(default)]
    pub auth: Option<AuthConfig>,
}

/// `[sources.auth]`: the OAuth 2 client-credentials grant (RFC 6749 section 4.4). The token is
/// asked for at the first request, refreshed `refresh_before` its expiry, and once more when
/// the upstream answers `401` (a token revoked early); it is a secret, never logged or served.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `oauth2_client_credentials`, the one kind.
    #[serde(default = "default_auth_kind")]
    pub kind: String,
    /// The token endpoint (`http://` or `https://`).
    pub token_url: String,
    /// `env:NAME` or the text.
    pub client_id: String,
    /// `env:NAME` (or the text, shown masked).
    #[serde(serialize_with = "masked_secret")]
    pub client_secret: String,
    /// Sent as `scope` when set.
    #[serde(default)]
    pub scope: Option<String>,
    /// Sent as `audience` when set (some providers want it).
    #[serde(default)]
    pub audience: Option<String>,
    /// How long before its expiry a token is renewed.
    #[serde(default = "default_refresh_before")]
    pub refresh_before: String,
}

fn default_auth_kind() -> String {
    "oauth2_client_credentials".into()
}

fn default_refresh_before() -> String {
    "60s".into()
}

fn masked_secret<S: serde::Serializer>(v: &str, s: S) -> Result<S::Ok, S::Error> {
    if v.starts_with("env:") {
        s.serialize_str(v)
    } else {
        s.serialize_str("<masked>")
    }
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("token_url", &self.token_url)
            .finish_non_exhaustive()
    }
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
fn default_backpressure() -> f64 {
    0.8
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
    /// A JSON Schema (draft 2020-12 unless it says `$schema`) each item must satisfy (seed
    /// 004's response schema): an item that does not is skipped with the reason, recorded as
    /// `source.item_skipped` and counted, never turned into an event or a notification.
    #[serde(default)]
    pub schema: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckConfig {
    pub url: String,
    pub field: String,
    /// More fields of the acknowledgement's body, as given (seed 004's `clientVersion`).
    #[serde(default)]
    pub extra: BTreeMap<String, Value>,
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
    /// Park after this many consecutive failures of a class: `server_error` (5xx, 408),
    /// `timeout`, `network` (a connection refused or cut; `connection` is the same),
    /// `rate_limited` (429, or 503 with `Retry-After`), `auth` (401, and a token endpoint
    /// that fails). A class not named retries without end, with its backoff; `auth` is
    /// retried once unless it is named.
    #[serde(default)]
    pub limits: BTreeMap<String, u32>,
    /// A backoff of its own per class (seed 004's retry matrix): each key falls back to the
    /// source's (`strategy`, `base_delay`, `max_delay`, `jitter`).
    #[serde(default)]
    pub classes: BTreeMap<String, ClassRetryConfig>,
}

/// `[sources.retry.classes.<class>]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassRetryConfig {
    pub strategy: Option<String>,
    pub base_delay: Option<String>,
    pub max_delay: Option<String>,
    pub jitter: Option<f64>,
}

/// The classes of upstream failure `[sources.retry] limits` and `classes` name.
pub const FAILURE_CLASSES: &[&str] =
    &["server_error", "timeout", "network", "rate_limited", "auth"];

/// A class by its configured name (`connection` is `network`, its earlier name).
fn failure_class(name: &str) -> Option<&'static str> {
    let name = if name == "connection" {
        "network"
    } else {
        name
    };
    FAILURE_CLASSES.iter().copied().find(|c| *c == name)
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
            limits: BTreeMap::new(),
            classes: BTreeMap::new(),
        }
    }
}

/// What a `cron` value must be, said with every refusal of one.
const CRON_FORM: &str = "must be 5 fields, \"minute hour day-of-month month day-of-week\" \
    (e.g. \"0 9,17 * * *\": at 09:00 and 17:00; \"*/15 * * * *\": every 15 minutes), with \
    tz = \"UTC\", \"+02:00\" or an IANA name";

/// When a source polls.
#[derive(Debug, Clone)]
pub(super) enum Schedule {
    Every(Duration),
    Cron { cron: Box<croner::Cron>, tz: Zone },
}

/// A cron schedule's time zone: a fixed offset (`UTC`, `+02:00`) or an IANA name
/// (`Europe/Berlin`, whose daylight-saving changes the schedule follows).
#[derive(Debug, Clone, Copy)]
pub(super) enum Zone {
    Fixed(FixedOffset),
    Named(chrono_tz::Tz),
}

impl Zone {
    fn parse(s: &str) -> Option<Zone> {
        tz_offset(s)
            .map(Zone::Fixed)
            .or_else(|| s.parse().ok().map(Zone::Named))
    }
}

impl Schedule {
    /// The next poll after `now` (wall clock, UTC).
    pub(super) fn next_after(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Schedule::Every(d) => now + chrono::Duration::from_std(*d).unwrap_or_default(),
            Schedule::Cron { cron, tz } => match tz {
                Zone::Fixed(z) => cron
                    .find_next_occurrence(&now.with_timezone(z), false)
                    .map(|t| t.with_timezone(&Utc)),
                Zone::Named(z) => cron
                    .find_next_occurrence(&now.with_timezone(z), false)
                    .map(|t| t.with_timezone(&Utc)),
            }
            .unwrap_or(now + chrono::Duration::hours(24)),
        }
    }

    /// The length of one interval (for `stale`): `every`, or the gap between the next two
    /// scheduled times.
    pub(super) fn interval(&self, now: DateTime<Utc>) -> Duration {
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
    pub(super) schedule: Schedule,
    pub(super) timeout: Duration,
    pub(super) headers: reqwest::header::HeaderMap,
    pub(super) retry: RetrySettings,
    pub(super) retry_after_max: Duration,
    /// `[sources.retry] limits`, checked.
    pub(super) limits: HashMap<&'static str, u32>,
    /// `[sources.retry.classes]`: each class's backoff (the source's for a class not named).
    pub(super) class_retry: HashMap<&'static str, RetrySettings>,
    /// `[sources.items] schema`, compiled.
    pub(super) schema: Option<std::sync::Arc<jsonschema::Validator>>,
    /// `[sources.auth]`, resolved, with its token.
    pub(super) auth: Option<std::sync::Arc<super::oauth::ClientCredentials>>,
}

impl Source {
    /// The backoff of a failure of `class` (the source's when the class has none of its own).
    pub(super) fn retry_for(&self, class: Option<&str>) -> &RetrySettings {
        class
            .and_then(|c| self.class_retry.get(c))
            .unwrap_or(&self.retry)
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The resolved header values are secrets: only the configuration's (masked) view.
        self.cfg.fmt(f)
    }
}

pub(super) fn key_err(name: &str, key: &str, why: impl std::fmt::Display) -> String {
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
    /// Whether it polls once at start ([`SourceConfig::poll_at_start`]).
    pub(super) fn polls_at_start(&self) -> bool {
        self.cfg
            .poll_at_start
            .unwrap_or(matches!(self.schedule, Schedule::Every(_)))
    }

    /// Validate `cfg` (errors name the key) and resolve its header values.
    /// Its metrics' labels: `source`, and `tenant` (bounded, as every `tenant` label) for
    /// another tenant's than the default one (the default tenant's series as before tenants),
    /// then `extra`.
    pub fn labels(&self, extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, String)> {
        let mut l = vec![("source", self.cfg.name.clone())];
        if self.tenant() != tidemark_log::DEFAULT_TENANT {
            let label = tidemark_engine::labels::tenant_label(self.tenant());
            l.push(("tenant", label.to_owned()));
        }
        l.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        l
    }

    /// The tenant whose source it is, by name.
    pub fn tenant(&self) -> &str {
        self.cfg
            .tenant
            .as_deref()
            .unwrap_or(tidemark_log::DEFAULT_TENANT)
    }

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
        if let Some(t) = &cfg.tenant {
            tidemark_log::check_tenant(t).map_err(|e| key_err(&n, "tenant", e))?;
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
                    return Err(key_err(&n, "cron", CRON_FORM));
                }
                use std::str::FromStr as _;
                let cron = croner::Cron::from_str(c)
                    .map_err(|e| key_err(&n, "cron", format!("{e}: {CRON_FORM}")))?;
                let tz = match &cfg.tz {
                    None => Zone::Fixed(FixedOffset::east_opt(0).expect("zero offset")),
                    Some(t) => Zone::parse(t).ok_or_else(|| {
                        key_err(
                            &n,
                            "tz",
                            "must be \"UTC\", \"+HH:MM\" or an IANA name such as \"Europe/Berlin\"",
                        )
                    })?,
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
        if let Some(h) = &cfg.idempotency_header
            && reqwest::header::HeaderName::from_bytes(h.as_bytes()).is_err()
        {
            return Err(key_err(&n, "idempotency_header", "is not a header name"));
        }
        if !(cfg.backpressure_threshold > 0.0 && cfg.backpressure_threshold <= 1.0) {
            return Err(key_err(
                &n,
                "backpressure_threshold",
                "must be above 0 and at most 1 (a share of outbox.max_pending)",
            ));
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
            if let Some(k) = a
                .extra
                .keys()
                .find(|k| *k == &a.field || k.as_str() == "acknowledgedAt")
            {
                return Err(key_err(
                    &n,
                    &format!("ack.extra.{k}"),
                    "is a field tidemark writes (ack.field, acknowledgedAt)",
                ));
            }
        }
        let schema = match &cfg.items.schema {
            None => None,
            Some(v) => Some(std::sync::Arc::new(jsonschema::validator_for(v).map_err(
                |e| key_err(&n, "items.schema", format!("is not a JSON Schema: {e}")),
            )?)),
        };
        let r = &cfg.retry;
        let shape = |key: &str,
                     strategy: &str,
                     base: &str,
                     max: &str,
                     jitter: f64|
         -> Result<RetrySettings, String> {
            Ok(RetrySettings {
                strategy: Strategy::parse(strategy).ok_or_else(|| {
                    key_err(
                        &n,
                        &format!("{key}.strategy"),
                        "must be exponential, linear or fixed",
                    )
                })?,
                max_attempts: u32::MAX,
                base_delay_ms: parse_duration_ms(base).ok_or_else(|| {
                    key_err(&n, &format!("{key}.base_delay"), "is not a duration")
                })?,
                max_delay_ms: parse_duration_ms(max)
                    .ok_or_else(|| key_err(&n, &format!("{key}.max_delay"), "is not a duration"))?,
                jitter: Some(jitter)
                    .filter(|j| (0.0..=1.0).contains(j))
                    .ok_or_else(|| {
                        key_err(&n, &format!("{key}.jitter"), "must be between 0 and 1")
                    })?,
                lease_ttl_ms: 0,
                batch_size: 1,
            })
        };
        let retry = shape("retry", &r.strategy, &r.base_delay, &r.max_delay, r.jitter)?;
        let mut class_retry = HashMap::new();
        for (class, c) in &r.classes {
            let key = format!("retry.classes.{class}");
            let Some(known) = failure_class(class) else {
                return Err(key_err(
                    &n,
                    &key,
                    format!(
                        "is not a failure class (known: {})",
                        FAILURE_CLASSES.join(", ")
                    ),
                ));
            };
            class_retry.insert(
                known,
                shape(
                    &key,
                    c.strategy.as_deref().unwrap_or(&r.strategy),
                    c.base_delay.as_deref().unwrap_or(&r.base_delay),
                    c.max_delay.as_deref().unwrap_or(&r.max_delay),
                    c.jitter.unwrap_or(r.jitter),
                )?,
            );
        }
        let auth = match &cfg.auth {
            None => None,
            Some(a) => Some(std::sync::Arc::new(super::oauth::ClientCredentials::new(
                &n, a,
            )?)),
        };
        let retry_after_max = Duration::from_millis(
            parse_duration_ms(&r.retry_after_max)
                .ok_or_else(|| key_err(&n, "retry.retry_after_max", "is not a duration"))?,
        );
        let mut limits = HashMap::new();
        for (class, limit) in &r.limits {
            let Some(c) = failure_class(class) else {
                return Err(key_err(
                    &n,
                    &format!("retry.limits.{class}"),
                    format!(
                        "is not a failure class (known: {})",
                        FAILURE_CLASSES.join(", ")
                    ),
                ));
            };
            if *limit == 0 {
                return Err(key_err(
                    &n,
                    &format!("retry.limits.{class}"),
                    "must be at least 1",
                ));
            }
            limits.insert(c, *limit);
        }
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &cfg.headers {
            let value = crate::env_value(v).map_err(|e| key_err(&n, &format!("headers.{k}"), e))?;
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
            limits,
            class_retry,
            schema,
            auth,
        })
    }
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
pub(super) mod tests {
    use super::*;

    /// A valid source (the upstream tests share it).
    pub(in crate::sources) fn cfg() -> SourceConfig {
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
    fn cron_in_a_fixed_offset() {
        use std::str::FromStr as _;
        let s = Schedule::Cron {
            cron: Box::new(croner::Cron::from_str("0 9 * * *").unwrap()),
            tz: Zone::parse("+02:00").unwrap(),
        };
        let now = DateTime::parse_from_rfc3339("2026-11-23T06:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(s.next_after(now).to_rfc3339(), "2026-11-23T07:00:00+00:00");
        assert_eq!(s.interval(now), Duration::from_secs(86_400));
    }

    /// `tz = "Europe/Berlin"`: 09:00 local is 08:00 UTC in winter and 07:00 UTC in summer.
    #[test]
    fn cron_in_an_iana_zone_follows_daylight_saving() {
        use std::str::FromStr as _;
        let s = Schedule::Cron {
            cron: Box::new(croner::Cron::from_str("0 9 * * *").unwrap()),
            tz: Zone::parse("Europe/Berlin").unwrap(),
        };
        let at = |t: &str| DateTime::parse_from_rfc3339(t).unwrap().with_timezone(&Utc);
        assert_eq!(
            s.next_after(at("2026-01-10T06:30:00Z")).to_rfc3339(),
            "2026-01-10T08:00:00+00:00"
        );
        assert_eq!(
            s.next_after(at("2026-07-10T06:30:00Z")).to_rfc3339(),
            "2026-07-10T07:00:00+00:00"
        );
        let mut c = cfg();
        c.every = None;
        c.cron = Some("0 9 * * *".into());
        c.tz = Some("America/New_York".into());
        Source::new(c).unwrap();
    }
}
