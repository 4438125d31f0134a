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
    DigestPolicy, RetrySettings, RoutePolicy, RoutingSettings, Strategy, Templates, malformed,
    parse_clock, parse_duration_ms,
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
        for (name, r) in self.routes.iter().flatten() {
            s.routes.insert(name.clone(), r.policy(name, &s.retry)?);
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
    fn policy(&self, name: &str, retry: &RetrySettings) -> Result<RoutePolicy, String> {
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
        p.sink = self.sink;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A misspelt key anywhere is refused with its full key and the keys its table takes;
    /// a value of the wrong shape names its key and what it must be.
    #[test]
    fn errors_name_the_key_as_the_file_spells_it() {
        let err = |v: Value| NotificationsConfig::from_json(&v).unwrap_err();
        let e = err(json!({"routes": {"hook": {"sinc": "webhook"}}}));
        assert!(
            e.starts_with("notifications.routes.hook.sinc is not a known key (known: sink, "),
            "{e}"
        );
        let e = err(json!({"retry": {"strategy": "sometimes"}}));
        assert_eq!(
            e,
            "notifications.retry.strategy must be one of \"exponential\", \"linear\", \"fixed\""
        );
        let e = err(json!({"routes": {"hook": {"sink": "pager"}}}));
        assert_eq!(
            e,
            "notifications.routes.hook.sink must be one of app, email, webhook"
        );
        let e = err(json!({"dashboard": {"limt": 5}}));
        assert_eq!(
            e,
            "notifications.dashboard.limt is not a known key (known: enabled, limit)"
        );
        let e = err(json!({"enabled": "yes"}));
        assert_eq!(e, "notifications.enabled must be true or false");
        let e = err(json!({"templates": {"de": {"sources": {"s": {"title": "x"}}}}}));
        assert!(
            e.starts_with(
                "notifications.templates.de.sources.s.title is not a known key (known: title_one"
            ),
            "{e}"
        );
        let e = NotificationsConfig::from_json(&json!({"outbox": {"stuck_after": "5 minutes"}}))
            .unwrap()
            .settings()
            .unwrap_err();
        assert!(
            e.starts_with("notifications.outbox.stuck_after must be a duration"),
            "{e}"
        );
    }

    /// The settings event is written from the same types: what is set, without a webhook's
    /// url and secret, and it reads back to the same settings.
    #[test]
    fn the_event_payload_reads_back_and_keeps_no_secret() {
        let v = json!({
            "enabled": true,
            "routing": {"urgent": ["hook", "desktop"]},
            "routes": {"hook": {"sink": "webhook", "url": "https://x", "secret": "env:S",
                                "retry": {"max_attempts": 3, "jitter": 0.5}}},
        });
        let c = NotificationsConfig::from_json(&v).unwrap();
        assert_eq!(
            c.routes.as_ref().unwrap()["hook"].url.as_deref(),
            Some("https://x")
        );
        let payload = c.event_payload();
        assert_eq!(
            payload,
            json!({
                "enabled": true,
                "routing": {"urgent": ["hook", "desktop"]},
                "routes": {"hook": {"sink": "webhook", "retry": {"max_attempts": 3, "jitter": 0.5}}},
            })
        );
        let again = NotificationsConfig::from_json(&payload).unwrap();
        assert_eq!(again.settings().unwrap(), c.settings().unwrap());
        assert_eq!(
            again.settings().unwrap().routes["hook"].sink,
            Some(Sink::Webhook)
        );
    }
}
