//! `[notifications]` as one set of types (spec section 4): the configuration file's section and
//! the payload of `settings.updated` are both read by serde into [`NotificationsConfig`], with
//! unknown keys refused at every depth, and the settings event's JSON is written from the same
//! types ([`NotificationsConfig::event_payload`]). [`NotificationsConfig::settings`] checks the
//! values and gives the [`RoutingSettings`] the router and the dispatcher decide with; every
//! error names its key as the file spells it and says what a valid value looks like.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::names::Sink;

use super::{
    CircuitPolicy, DigestPolicy, RetrySettings, RoutePolicy, RoutingSettings, Strategy, Templates,
    malformed, parse_clock, parse_duration_ms,
};

/// `[notifications]`. Absent keys keep the defaults of section 4 ([`RoutingSettings::default`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotificationsConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard: Option<DashboardConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desktop: Option<DesktopConfig>,
    /// priority → route names, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<BTreeMap<String, Vec<String>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbox: Option<OutboxConfig>,
    /// Every endpoint's circuit (section 17): the email and webhook routes' (each route's
    /// `circuit` over it) and the bridge webhook subscriptions'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<CircuitConfig>,
    /// The pace of every email and webhook route that sets none (section 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateConfig>,
    /// Where operators are told what they must know (section 17).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operational: Option<OperationalConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<BTreeMap<String, RouteConfig>>,
    /// locale → digest titles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub templates: Option<BTreeMap<String, LocaleTemplates>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DashboardConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesktopConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priorities: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sound_priorities: Option<Vec<String>>,
}

/// `retry` (global, or a route's over the global).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_delay: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stuck_after: Option<String>,
}

/// `[notifications.routes.<name>]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<Sink>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub types: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<String>,
    /// A webhook route's endpoint: this node's configuration, read by the dispatcher, never
    /// written into the settings event.
    #[serde(default, skip_serializing)]
    pub url: Option<String>,
    /// A webhook route's signing secret (`env:NAME`, or the secret): never written into an
    /// event, served or logged.
    #[serde(default, skip_serializing)]
    pub secret: Option<String>,
    /// What a webhook route's receiver is sent (section 4): `"tidemark"` (the default),
    /// `"slack"`, `"teams"`, `"discord"`, or `{ template = "…", content_type = "…" }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<super::body::BodyConfig>,
    /// Headers a webhook route's POSTs carry (values may be `env:NAME`): like `secret`, never
    /// written into an event of the settings, served or logged (they may be credentials).
    #[serde(default, skip_serializing)]
    pub headers: Option<BTreeMap<String, String>>,
    /// How long the previous secret keeps signing beside a new one after a webhook route's
    /// secret changes through the API (default `"24h"`; section 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_overlap: Option<String>,
    /// `["min", "max"]`: a random delay in this window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<Vec<String>>,
    /// `["HH:MM", "HH:MM"]`, recipient-local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_hours: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_hours_bypass: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<DigestConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub templates: Option<RouteTemplates>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redact: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generic_title: Option<String>,
    /// The endpoint's circuit (section 17): a webhook or email route opens it after
    /// `failures` consecutive failed attempts and probes after `cool_down`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<CircuitConfig>,
    /// At most one delivery per key in flight (section 4): `{ key = "endpoint" | "task" |
    /// "recipient", on_park = "hold" | "skip" }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<OrderingConfig>,
    /// At most this many attempts per period: `"<n>/<s|m|h>"` (section 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
}

/// `[notifications.operational]`: `route` (required: the route operational notifications
/// take, any sink) and `every` (default `"5m"`, 1 s to 24 h: more of one cause and endpoint
/// within it is told as one summary).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationalConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
}

/// `[notifications.rate]`: `default = "<n>/<s|m|h>"`, the pace of every email and webhook
/// route that sets no `rate` of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// `"<n>/<s|m|h>"` read as a [`super::Rate`], or the error naming `key`.
fn rate(v: &str, key: &str) -> Result<super::Rate, String> {
    super::Rate::parse(v).ok_or_else(|| {
        format!("{key} must be \"<n>/<s|m|h>\" with n from 1 to 100000 (\"10/s\", \"600/m\")")
    })
}

/// `ordering` of a route: `key` (required: `endpoint`, `task` or `recipient`) and `on_park`
/// (`hold`, the default: a parked delivery holds its key until an operator retries or
/// discards it; `skip`: the next goes on).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderingConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_park: Option<String>,
}

impl OrderingConfig {
    fn policy(&self, key: &str) -> Result<super::Ordering, String> {
        let by = match self.key.as_deref() {
            Some("endpoint") => super::OrderKey::Endpoint,
            Some("task") => super::OrderKey::Task,
            Some("recipient") => super::OrderKey::Recipient,
            _ => {
                return Err(format!(
                    "{key}.key must be one of \"endpoint\", \"task\", \"recipient\""
                ));
            }
        };
        let hold_on_park = match self.on_park.as_deref() {
            None | Some("hold") => true,
            Some("skip") => false,
            Some(_) => return Err(format!("{key}.on_park must be \"hold\" or \"skip\"")),
        };
        Ok(super::Ordering { by, hold_on_park })
    }
}

/// `circuit` (global, or a route's over the global): `failures` (default 20, 1 to 10,000) and
/// `cool_down` (default `"1m"`, 1 s to 24 h).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CircuitConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cool_down: Option<String>,
}

impl CircuitConfig {
    /// These keys over `base`; `key` names the table in errors.
    fn over(&self, base: CircuitPolicy, key: &str) -> Result<CircuitPolicy, String> {
        let mut p = base;
        if let Some(n) = self.failures {
            p.failures = u32::try_from(n)
                .ok()
                .filter(|n| (1..=10_000).contains(n))
                .ok_or_else(|| malformed(&format!("{key}.failures")))?;
        }
        if let Some(d) = &self.cool_down {
            p.cool_down_ms = parse_duration_ms(d)
                .filter(|ms| (1_000..=86_400_000).contains(ms))
                .ok_or_else(|| malformed(&format!("{key}.cool_down")))?;
        }
        Ok(p)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DigestConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_items: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_after: Option<u64>,
}

/// A route's digest titles.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTemplates {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub many: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// `[notifications.templates.<locale>]`: digest titles, and sources' notification titles.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocaleTemplates {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub many: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<BTreeMap<String, SourceTitles>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceTitles {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title_one: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title_many: Option<String>,
}

impl NotificationsConfig {
    /// Read `[notifications]` (as JSON: the file's table converted, or a `settings.updated`
    /// payload). A key it does not know is refused, naming it and the keys its table takes; a
    /// value of the wrong shape names its key and what it must be.
    pub fn from_json(v: &Value) -> Result<NotificationsConfig, String> {
        serde_path_to_error::deserialize(v).map_err(|e| {
            let mut key = String::from("notifications");
            for seg in e.path() {
                if let serde_path_to_error::Segment::Map { key: k } = seg {
                    key.push('.');
                    key.push_str(k);
                }
            }
            let why = e.inner().to_string();
            match unknown_field(&why) {
                // The path ends at the unknown key itself.
                Some(known) => format!("{key} is not a known key (known: {known})"),
                None => malformed(&key),
            }
        })
    }

    /// The payload of the `settings.updated` event that records these settings: the same
    /// keys, without a webhook route's `url` and `secret` (this node's configuration, read by
    /// the dispatcher).
    pub fn event_payload(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Default::default()))
    }

    /// The effective settings: the defaults of section 4 under what is set, each value
    /// checked.
    pub fn settings(&self) -> Result<RoutingSettings, String> {
        let mut s = RoutingSettings::default();
        let bad = |k: &str| malformed(&format!("notifications.{k}"));
        let dur = |v: &str, k: &str| parse_duration_ms(v).ok_or_else(|| bad(k));
        if let Some(x) = self.enabled {
            s.enabled = x;
        }
        if let Some(d) = &self.dashboard {
            if let Some(x) = d.enabled {
                s.dashboard_enabled = x;
            }
            if let Some(x) = d.limit {
                s.dashboard_limit = u32::try_from(x)
                    .ok()
                    .filter(|n| (1..=500).contains(n))
                    .ok_or_else(|| bad("dashboard.limit"))?;
            }
        }
        if let Some(d) = &self.desktop {
            if let Some(x) = d.enabled {
                s.desktop_enabled = x;
            }
            if let Some(x) = &d.priorities {
                s.desktop_priorities.clone_from(x);
            }
            if let Some(x) = &d.sound_priorities {
                s.sound_priorities.clone_from(x);
            }
        }
        if let Some(m) = &self.routing {
            s.routing
                .extend(m.iter().map(|(p, r)| (p.clone(), r.clone())));
        }
        if let Some(r) = &self.retry {
            s.retry = r.over(&s.retry, "retry")?;
        }
        if let Some(o) = &self.outbox {
            if let Some(x) = o.max_pending {
                s.max_pending = x;
            }
            if let Some(x) = &o.stuck_after {
                s.stuck_after_ms = dur(x, "outbox.stuck_after")?;
            }
        }
        if let Some(o) = &self.operational {
            let route = o
                .route
                .clone()
                .filter(|r| !r.is_empty() && r.len() <= 128)
                .ok_or_else(|| {
                    "notifications.operational.route is required: the name of the route \
                     operators are told through"
                        .to_owned()
                })?;
            let every_ms = match &o.every {
                None => 300_000,
                Some(v) => parse_duration_ms(v)
                    .filter(|ms| (1_000..=86_400_000).contains(ms))
                    .ok_or_else(|| bad("operational.every"))?,
            };
            s.operational = Some(super::Operational { route, every_ms });
        }
        if let Some(r) = self.rate.as_ref().and_then(|r| r.default.as_deref()) {
            s.rate = Some(rate(r, "notifications.rate.default")?);
        }
        if let Some(c) = &self.circuit {
            s.circuit = c.over(s.circuit, "notifications.circuit")?;
        }
        for (name, r) in self.routes.iter().flatten() {
            s.routes
                .insert(name.clone(), r.policy(name, &s.retry, s.circuit)?);
        }
        for (locale, t) in self.templates.iter().flatten() {
            let at = format!("templates.{locale}");
            let mut out = Templates {
                many: title(t.many.as_deref(), &format!("{at}.many"))?,
                summary: title(t.summary.as_deref(), &format!("{at}.summary"))?,
                sources: BTreeMap::new(),
            };
            for (name, p) in t.sources.iter().flatten() {
                let at = format!("{at}.sources.{name}");
                out.sources.insert(
                    name.clone(),
                    (
                        title(p.title_one.as_deref(), &format!("{at}.title_one"))?,
                        title(p.title_many.as_deref(), &format!("{at}.title_many"))?,
                    ),
                );
            }
            s.templates.insert(locale.to_ascii_lowercase(), out);
        }
        Ok(s)
    }
}

/// A template of 1 to 512 bytes at `key` (under `notifications.`).
fn title(t: Option<&str>, key: &str) -> Result<Option<String>, String> {
    t.map(|t| {
        (!t.is_empty() && t.len() <= 512)
            .then(|| t.to_owned())
            .ok_or_else(|| malformed(&format!("notifications.{key}")))
    })
    .transpose()
}

/// The keys a table takes, from serde's "unknown field `x`, expected one of `a`, `b`, `c`"
/// (two: "expected `a` or `b`"; one: "expected `a`"), as `a, b, c`.
fn unknown_field(why: &str) -> Option<String> {
    let rest = why.strip_prefix("unknown field `")?;
    let (_, expected) = rest.split_once("`, ")?;
    let list = expected
        .strip_prefix("expected one of ")
        .or_else(|| expected.strip_prefix("expected "))
        .unwrap_or(expected);
    Some(list.replace("` or `", "`, `").replace('`', ""))
}

impl RetryConfig {
    /// These retry settings over `base`; `key` names the table in errors.
    fn over(&self, base: &RetrySettings, key: &str) -> Result<RetrySettings, String> {
        let bad = |k: &str| malformed(&format!("notifications.{key}.{k}"));
        let dur = |v: &str, k: &str| parse_duration_ms(v).ok_or_else(|| bad(k));
        let count = |n: u64, k: &str| {
            u32::try_from(n)
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| bad(k))
        };
        let mut out = base.clone();
        if let Some(x) = self.strategy {
            out.strategy = x;
        }
        if let Some(x) = self.max_attempts {
            out.max_attempts = count(x, "max_attempts")?;
        }
        if let Some(x) = &self.base_delay {
            out.base_delay_ms = dur(x, "base_delay")?;
        }
        if let Some(x) = &self.max_delay {
            out.max_delay_ms = dur(x, "max_delay")?;
        }
        if let Some(x) = self.jitter {
            out.jitter = Some(x)
                .filter(|j| (0.0..=1.0).contains(j))
                .ok_or_else(|| bad("jitter"))?;
        }
        if let Some(x) = &self.lease_ttl {
            out.lease_ttl_ms = dur(x, "lease_ttl")?;
        }
        if let Some(x) = self.batch_size {
            out.batch_size = count(x, "batch_size")?;
        }
        if out.base_delay_ms > out.max_delay_ms {
            return Err(format!(
                "notifications.{key}.base_delay is larger than max_delay"
            ));
        }
        Ok(out)
    }
}

impl RouteConfig {
    /// The scheduling policy of route `name`, its retry over `retry` (the global one).
    fn policy(
        &self,
        name: &str,
        retry: &RetrySettings,
        circuit: CircuitPolicy,
    ) -> Result<RoutePolicy, String> {
        let key = |f: &str| format!("notifications.routes.{name}.{f}");
        let bad = |f: &str| malformed(&key(f));
        let pair = |w: &Option<Vec<String>>, f: &str| -> Result<Option<(String, String)>, String> {
            match w.as_deref() {
                None => Ok(None),
                Some([a, b]) => Ok(Some((a.clone(), b.clone()))),
                Some(_) => Err(bad(f)),
            }
        };
        let mut p = RoutePolicy::default();
        if let Some(b) = &self.body {
            b.check(&key("body"))?;
        }
        if let Some(h) = &self.headers {
            check_headers(h, &key("headers"))?;
        }
        if let Some(o) = &self.rotation_overlap {
            parse_duration_ms(o).ok_or_else(|| bad("rotation_overlap"))?;
        }
        if let Some((lo, hi)) = pair(&self.delay, "delay")? {
            let lo = parse_duration_ms(&lo).ok_or_else(|| bad("delay"))?;
            let hi = parse_duration_ms(&hi).ok_or_else(|| bad("delay"))?;
            if lo > hi {
                return Err(bad("delay"));
            }
            p.delay_ms = Some((lo, hi));
        }
        if let Some((from, to)) = pair(&self.quiet_hours, "quiet_hours")? {
            let from = parse_clock(&from).ok_or_else(|| bad("quiet_hours"))?;
            let to = parse_clock(&to).ok_or_else(|| bad("quiet_hours"))?;
            p.quiet_hours = Some((from, to));
        }
        if let Some(b) = &self.quiet_hours_bypass {
            p.quiet_hours_bypass.clone_from(b);
        }
        if let Some(d) = &self.digest {
            let window_ms = d
                .window
                .as_deref()
                .and_then(parse_duration_ms)
                .ok_or_else(|| bad("digest.window"))?;
            let max_items = d
                .max_items
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n >= 1)
                .ok_or_else(|| bad("digest.max_items"))?;
            let summary_after = match d.summary_after {
                None => max_items,
                Some(n) => u32::try_from(n)
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("digest.summary_after"))?,
            };
            p.digest = Some(DigestPolicy {
                window_ms,
                max_items,
                summary_after,
            });
        }
        if let Some(t) = &self.templates {
            let at = format!("routes.{name}.templates");
            p.templates = Templates {
                many: title(t.many.as_deref(), &format!("{at}.many"))?,
                summary: title(t.summary.as_deref(), &format!("{at}.summary"))?,
                sources: BTreeMap::new(),
            };
        }
        p.types.clone_from(&self.types);
        p.redact = self.redact.unwrap_or(false);
        if let Some(t) = &self.generic_title {
            p.generic_title = Some(
                Some(t)
                    .filter(|t| !t.is_empty() && t.len() <= 256)
                    .ok_or_else(|| bad("generic_title"))?
                    .clone(),
            );
        }
        if let Some(r) = &self.retry {
            p.retry = Some(r.over(retry, &format!("routes.{name}.retry"))?);
        }
        if let Some(l) = &self.list {
            p.list = Some(
                Some(l)
                    .filter(|t| !t.is_empty() && t.len() <= 128)
                    .ok_or_else(|| bad("list"))?
                    .clone(),
            );
        }
        p.circuit = match &self.circuit {
            Some(c) => c.over(circuit, &key("circuit"))?,
            None => circuit,
        };
        if let Some(o) = &self.ordering {
            p.ordering = Some(o.policy(&key("ordering"))?);
        }
        if let Some(r) = &self.rate {
            p.rate = Some(rate(r, &key("rate"))?);
        }
        p.sink = self.sink;
        Ok(p)
    }
}

/// Headers a webhook route may set: at most 32, each a token name that is not one tidemark
/// sets itself, its value `env:NAME` or 1 to 4096 visible characters.
fn check_headers(h: &BTreeMap<String, String>, key: &str) -> Result<(), String> {
    const OWN: [&str; 5] = [
        "content-type",
        "content-length",
        "host",
        "user-agent",
        "transfer-encoding",
    ];
    if h.len() > 32 {
        return Err(format!("{key} may name at most 32 headers"));
    }
    for (name, value) in h {
        let lower = name.to_ascii_lowercase();
        let token = !name.is_empty()
            && name.len() <= 128
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(format!("{key}: {name:?} is not a header name"));
        }
        if OWN.contains(&lower.as_str())
            || lower.starts_with("webhook-")
            || lower.starts_with("tidemark-")
        {
            return Err(format!(
                "{key}.{name} is set by tidemark itself (content-type comes from body, \
                 webhook-* and tidemark-* are the signature's)"
            ));
        }
        let ok = value.starts_with("env:") && value.len() > 4
            || (!value.is_empty()
                && value.len() <= 4096
                && value
                    .chars()
                    .all(|c| c == ' ' || c == '\t' || !c.is_control()));
        if !ok {
            return Err(format!(
                "{key}.{name} must be env:NAME or 1 to 4096 visible characters"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
