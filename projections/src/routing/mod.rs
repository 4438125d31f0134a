//! Notification routing rules (spec section 4) and delivery backoff (section 5), as pure
//! functions of the settings recorded in the log: the delivery reactor decides with these, and
//! writes its decisions (and any random draw) into the events it appends. The settings' types
//! and their defaults are here; reading them from the configuration or an event is
//! [`config`]'s, resolving a notification's routes and a retry's delay [`resolve`]'s.

mod api_route;
pub mod body;
mod config;
mod resolve;

pub use crate::endpoints::CircuitPolicy;
pub use api_route::ApiRoute;
pub use config::{
    CircuitConfig, DashboardConfig, DesktopConfig, DigestConfig, LocaleTemplates,
    NotificationsConfig, OperationalConfig, OrderingConfig, OutboxConfig, RateConfig, RetryConfig,
    RouteConfig, RouteTemplates, Sink, SourceTitles,
};
pub use resolve::{RouteOutcome, backoff_ms, resolve_routes};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A duration like `"1s"`, `"5m"`, `"250ms"`, `"1h"`, in milliseconds.
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Why the setting at `key` (`notifications.…`) was refused: the form it must have, named by its
/// last part, so that a bad duration says what a duration is.
fn malformed(key: &str) -> String {
    let last = key.rsplit('.').next().unwrap_or(key);
    let parent = key.rsplit('.').nth(1).unwrap_or("");
    let want = match last {
        "enabled" | "redact" => "true or false".to_owned(),
        "stuck_after" | "base_delay" | "max_delay" | "lease_ttl" | "window"
        | "rotation_overlap" => {
            "a duration: a whole number and a unit, ms, s, m, h or d (e.g. \"30s\", \"5m\", \"1h\")"
                .to_owned()
        }
        "delay" => "two durations [\"min\", \"max\"] with min ≤ max, each a whole number and a \
                    unit, ms, s, m, h or d (e.g. [\"0s\", \"30s\"])"
            .to_owned(),
        "quiet_hours" => {
            "two clock times [\"HH:MM\", \"HH:MM\"] (e.g. [\"22:00\", \"07:00\"])".to_owned()
        }
        "limit" => "a whole number from 1 to 500".to_owned(),
        "failures" => "a whole number from 1 to 10000".to_owned(),
        "cool_down" => "a duration from 1s to 24h (e.g. \"1m\")".to_owned(),
        "max_attempts" | "batch_size" => "a whole number from 1 to 1000".to_owned(),
        "max_items" | "summary_after" => "a whole number, at least 1".to_owned(),
        "max_pending" => "a whole number".to_owned(),
        "jitter" => "a number from 0 to 1 (e.g. 0.2)".to_owned(),
        "strategy" => "one of \"exponential\", \"linear\", \"fixed\"".to_owned(),
        "priorities" | "sound_priorities" | "types" | "quiet_hours_bypass" => {
            "a list of strings (e.g. [\"urgent\", \"high\"])".to_owned()
        }
        "routing" => "a table of priority = [route names] (e.g. urgent = [\"email\"])".to_owned(),
        _ if parent == "routing" => "a list of route names (e.g. [\"email\", \"app\"])".to_owned(),
        "generic_title" => "a text of 1 to 256 bytes".to_owned(),
        "list" => "a list name of 1 to 128 bytes".to_owned(),
        "sink" => format!("one of {}", Sink::joined()),
        "body" => "one of \"tidemark\", \"slack\", \"teams\", \"discord\", or a table \
                   { template = \"…\", content_type = \"application/json\" }"
            .to_owned(),
        "headers" => {
            "a table of header names to values (e.g. { Authorization = \"env:HOOK_TOKEN\" })"
                .to_owned()
        }
        "title_one" | "title_many" | "many" | "summary" => "a text of 1 to 512 bytes".to_owned(),
        _ => "a table".to_owned(),
    };
    format!("{key} must be {want}")
}

/// `"HH:MM"` in minutes after midnight.
pub fn parse_clock(s: &str) -> Option<u32> {
    let (h, m) = s.split_once(':')?;
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60 && h * 60 + m < 1440).then_some(h * 60 + m)
}

/// How the delay grows with the attempts (section 5; sources use it too, section 12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// `base · 2^(attempt−1)`.
    #[default]
    Exponential,
    /// `base · attempt`.
    Linear,
    /// `base`.
    Fixed,
}

impl Strategy {
    pub fn parse(s: &str) -> Option<Strategy> {
        match s {
            "exponential" => Some(Strategy::Exponential),
            "linear" => Some(Strategy::Linear),
            "fixed" => Some(Strategy::Fixed),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RetrySettings {
    pub strategy: Strategy,
    pub max_attempts: u32,
    pub base_delay_ms: u64,
    pub max_delay_ms: u64,
    /// Fraction, e.g. 0.2 for ±20 %.
    pub jitter: f64,
    pub lease_ttl_ms: u64,
    pub batch_size: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DigestPolicy {
    pub window_ms: u64,
    /// Items listed in the delivery; the rest are counted in `more`.
    pub max_items: u32,
    /// Up to this many items the title is `templates.many`, past it `templates.summary`.
    pub summary_after: u32,
}

/// The titles of a digest delivery (section 4); absent keys fall back (locale → route →
/// [`Templates::DEFAULT_MANY`] / [`Templates::DEFAULT_SUMMARY`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Templates {
    pub many: Option<String>,
    pub summary: Option<String>,
    /// `[notifications.templates.<locale>.sources.<name>]`: a source's notification titles in
    /// this locale (section 12), `(title_one, title_many)`.
    pub sources: BTreeMap<String, (Option<String>, Option<String>)>,
}

impl Templates {
    pub const DEFAULT_MANY: &'static str = "{count} new updates";
    pub const DEFAULT_SUMMARY: &'static str = "You have {count} new updates";
}

/// `{count}`, `{title}` (the newest item's) and `{first_title}` (the opening item's) filled in.
pub fn render_title(template: &str, count: usize, title: &str, first_title: &str) -> String {
    template
        .replace("{count}", &count.to_string())
        .replace("{first_title}", first_title)
        .replace("{title}", title)
}

/// Per-route scheduling policy, `[notifications.routes.<route>]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoutePolicy {
    /// A random delay in this window, decided once and written into the delivery.
    pub delay_ms: Option<(u64, u64)>,
    /// Recipient-local quiet window, minutes after midnight (may wrap past midnight).
    pub quiet_hours: Option<(u32, u32)>,
    pub quiet_hours_bypass: Vec<String>,
    pub digest: Option<DigestPolicy>,
    pub templates: Templates,
    /// Only notifications of these types take the route (`None`: every notification).
    pub types: Option<Vec<String>>,
    /// Zero-PII deliveries (section 14).
    pub redact: bool,
    /// The title of a redacted delivery.
    pub generic_title: Option<String>,
    /// Overrides `[notifications.retry]` for this route.
    pub retry: Option<RetrySettings>,
    /// The sink a route other than `desktop` delivers to (section 17): `app` (claimed by an
    /// app), `email` or `webhook` (tidemark's dispatcher). `None`: `unknown_route`.
    pub sink: Option<Sink>,
    /// The list a notification that names no recipient or list is delivered to.
    pub list: Option<String>,
    /// When the endpoint's circuit opens and probes (section 17).
    pub circuit: CircuitPolicy,
    /// At most one delivery per key in flight (section 4).
    pub ordering: Option<Ordering>,
    /// At most this many attempts per period (section 4); over `[notifications.rate]`.
    pub rate: Option<Rate>,
}

/// The `type` of the notifications tidemark makes for operators (section 17): only the route
/// of `[notifications.operational]` takes them.
pub const OPERATIONAL_TYPE: &str = "tidemark.operational";

/// `[notifications.operational]` (section 17): the route operators are told through, and the
/// window within which more of one cause and endpoint is summed up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operational {
    pub route: String,
    pub every_ms: u64,
}

/// A pace (section 4): at most `n` attempts in any `per_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub n: u32,
    pub per_ms: u64,
}

impl Rate {
    /// `"<n>/<s|m|h>"`, `n` 1 to 100,000.
    pub fn parse(v: &str) -> Option<Rate> {
        let (n, unit) = v.split_once('/')?;
        let n: u32 = n
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=100_000).contains(n))?;
        let per_ms = match unit.trim() {
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return None,
        };
        Some(Rate { n, per_ms })
    }

    /// As it is written: `"10/s"`.
    pub fn text(&self) -> String {
        let unit = match self.per_ms {
            1_000 => "s",
            60_000 => "m",
            _ => "h",
        };
        format!("{}/{unit}", self.n)
    }
}

/// A route's order (section 4): its deliveries of one key go one at a time, in the order of
/// their notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ordering {
    pub by: OrderKey,
    /// A parked delivery holds its key (until an operator retries or discards it).
    pub hold_on_park: bool,
}

/// What a route's deliveries are ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderKey {
    /// All of the route's deliveries: its endpoint takes one at a time.
    Endpoint,
    /// The notification's task (one without a task is not ordered).
    Task,
    /// The recipient (a notification to a list only is not ordered).
    Recipient,
}

impl Ordering {
    /// The key a delivery with this task and recipient waits in (`None`: not ordered).
    pub fn key_of(&self, task: Option<&str>, recipient: Option<&str>) -> Option<String> {
        match self.by {
            OrderKey::Endpoint => Some("endpoint".to_owned()),
            OrderKey::Task => task.map(|t| format!("task:{t}")),
            OrderKey::Recipient => recipient.map(|r| format!("recipient:{r}")),
        }
    }
}

impl RoutePolicy {
    pub const DEFAULT_GENERIC_TITLE: &'static str = "New message";

    pub fn generic_title(&self) -> &str {
        self.generic_title
            .as_deref()
            .unwrap_or(Self::DEFAULT_GENERIC_TITLE)
    }
}

/// The effective notification settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingSettings {
    pub enabled: bool,
    pub dashboard_enabled: bool,
    /// Default page size of `GET /v1/notifications` (1–500).
    pub dashboard_limit: u32,
    pub desktop_enabled: bool,
    pub desktop_priorities: Vec<String>,
    pub sound_priorities: Vec<String>,
    /// priority → route names, in order. A priority absent here has no routes.
    pub routing: BTreeMap<String, Vec<String>>,
    pub retry: RetrySettings,
    pub max_pending: u64,
    pub stuck_after_ms: u64,
    /// `[notifications.circuit]`: every endpoint's circuit, a route's `circuit` over it.
    pub circuit: CircuitPolicy,
    /// `[notifications.rate] default`: the pace of every email and webhook route that sets
    /// none of its own.
    pub rate: Option<Rate>,
    /// `[notifications.operational]`: the route operational notifications take.
    pub operational: Option<Operational>,
    pub routes: BTreeMap<String, RoutePolicy>,
    /// `[notifications.templates.<locale>]`: digest titles per recipient locale.
    pub templates: BTreeMap<String, Templates>,
}

impl Default for RoutingSettings {
    /// The defaults of spec section 4.
    fn default() -> Self {
        let r = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        RoutingSettings {
            enabled: true,
            dashboard_enabled: true,
            dashboard_limit: 50,
            desktop_enabled: true,
            desktop_priorities: r(&["urgent", "action"]),
            sound_priorities: r(&["urgent"]),
            routing: BTreeMap::from([
                ("urgent".to_owned(), r(&["dashboard", "desktop"])),
                ("action".to_owned(), r(&["dashboard", "desktop"])),
                ("warning".to_owned(), r(&["dashboard"])),
                ("info".to_owned(), r(&["dashboard"])),
            ]),
            retry: RetrySettings {
                strategy: Strategy::Exponential,
                max_attempts: 5,
                base_delay_ms: 1_000,
                max_delay_ms: 300_000,
                jitter: 0.2,
                lease_ttl_ms: 30_000,
                batch_size: 50,
            },
            max_pending: 100_000,
            stuck_after_ms: 600_000,
            circuit: CircuitPolicy::default(),
            rate: None,
            operational: None,
            routes: BTreeMap::new(),
            templates: BTreeMap::new(),
        }
    }
}

impl RoutingSettings {
    /// The pace of route `route` (section 4): its own `rate`, else the default for a route
    /// tidemark delivers (email, webhook).
    pub fn rate_of(&self, route: &str) -> Option<Rate> {
        let p = self.routes.get(route)?;
        p.rate
            .or_else(|| self.rate.filter(|_| crate::endpoints::delivering(p.sink)))
    }

    /// Read the payload of a `settings.updated` event (or the configuration's section as
    /// JSON); keys it lacks keep their defaults. Errors name the first key that is unknown or
    /// malformed ([`NotificationsConfig`]).
    pub fn from_json(v: &Value) -> Result<RoutingSettings, String> {
        NotificationsConfig::from_json(v)?.settings()
    }
}

impl RoutingSettings {
    /// The routes the routing table names that are not configured (neither `dashboard`,
    /// `desktop`, nor a `[notifications.routes.<name>]` with a sink), as (priority, route):
    /// each of their notifications gets a `skipped` delivery (`unknown_route`, section 4),
    /// which the server warns about at start.
    pub fn unknown_routes(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (priority, routes) in &self.routing {
            for route in routes {
                let known = matches!(route.as_str(), "dashboard" | "desktop")
                    || self.routes.get(route).is_some_and(|p| p.sink.is_some());
                if !known && !out.iter().any(|(p, r)| p == priority && r == route) {
                    out.push((priority.clone(), route.clone()));
                }
            }
        }
        out
    }

    /// The policy of `route` (the default when it has none).
    pub fn policy(&self, route: &str) -> RoutePolicy {
        self.routes.get(route).cloned().unwrap_or_default()
    }

    /// The retry settings of `route`: its own `retry` table, else `[notifications.retry]`.
    pub fn retry_for(&self, route: &str) -> &RetrySettings {
        self.routes
            .get(route)
            .and_then(|p| p.retry.as_ref())
            .unwrap_or(&self.retry)
    }

    /// The title of a digest of `count` items on `route` (section 4): one item keeps its own
    /// title; up to `summary_after` items `templates.many`, more `templates.summary`, each
    /// from the recipient's locale (`de-AT`, then `de`), then the route, then the default.
    pub fn digest_title(
        &self,
        route: &str,
        locale: Option<&str>,
        count: usize,
        title: &str,
        first_title: &str,
    ) -> String {
        if count <= 1 {
            return title.to_owned();
        }
        let policy = self.routes.get(route);
        let summary_after = policy
            .and_then(|p| p.digest.as_ref())
            .map_or(u32::MAX, |d| d.summary_after);
        let summary = count > summary_after as usize;
        let pick = |t: &Templates| {
            if summary {
                t.summary.clone()
            } else {
                t.many.clone()
            }
        };
        let from_locale = self.in_locale(locale, pick);
        let template = from_locale
            .or_else(|| policy.and_then(|p| pick(&p.templates)))
            .unwrap_or_else(|| {
                if summary {
                    Templates::DEFAULT_SUMMARY
                } else {
                    Templates::DEFAULT_MANY
                }
                .to_owned()
            });
        render_title(&template, count, title, first_title)
    }
}

impl RoutingSettings {
    /// The first of `pick` over the templates of `locale`, then of its language (`de-AT`,
    /// then `de`); case does not matter.
    pub fn in_locale<T>(
        &self,
        locale: Option<&str>,
        pick: impl Fn(&Templates) -> Option<T>,
    ) -> Option<T> {
        let l = locale?.to_ascii_lowercase();
        let lang = l.split(['-', '_']).next().unwrap_or(&l).to_owned();
        [l, lang]
            .iter()
            .find_map(|k| self.templates.get(k.as_str()).and_then(&pick))
    }

    /// Source `name`'s notification titles in `locale`, `(title_one, title_many)`, each when
    /// the locale has it.
    pub fn source_titles(
        &self,
        name: &str,
        locale: Option<&str>,
    ) -> (Option<String>, Option<String>) {
        (
            self.in_locale(locale, |t| t.sources.get(name).and_then(|p| p.0.clone())),
            self.in_locale(locale, |t| t.sources.get(name).and_then(|p| p.1.clone())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn routes(s: &RoutingSettings, p: &str) -> Vec<RouteOutcome> {
        resolve_routes(s, p, None)
    }

    #[test]
    fn types_restrict_a_route() {
        let s = RoutingSettings::from_json(&json!({"routes": {"desktop": {"types": ["app"]}}}))
            .unwrap();
        assert!(resolve_routes(&s, "urgent", None).is_empty(), "no type");
        assert!(resolve_routes(&s, "urgent", Some("email")).is_empty());
        assert_eq!(resolve_routes(&s, "urgent", Some("app")), vec![desktop()]);
        let open = RoutingSettings::default();
        assert_eq!(
            resolve_routes(&open, "urgent", Some("email")),
            vec![desktop()]
        );
    }

    #[test]
    fn digest_titles_by_count_locale_and_route() {
        let s = RoutingSettings::from_json(&json!({
            "routes": {"desktop": {"digest": {"window": "5m", "max_items": 5, "summary_after": 3},
                                   "templates": {"many": "{count} about {first_title}"}},
                       "other": {"digest": {"window": "5m", "max_items": 5}}},
            "templates": {"de": {"many": "{count} neue: {title}", "summary": "Sie haben {count} neue Meldungen"}}
        }))
        .unwrap();
        let t = |route: &str, loc: Option<&str>, n: usize| {
            s.digest_title(route, loc, n, "new", "first")
        };
        assert_eq!(t("desktop", None, 1), "new");
        assert_eq!(t("desktop", None, 3), "3 about first");
        assert_eq!(t("desktop", None, 4), "You have 4 new updates");
        assert_eq!(t("desktop", Some("de-AT"), 2), "2 neue: new");
        assert_eq!(t("desktop", Some("DE"), 8), "Sie haben 8 neue Meldungen");
        assert_eq!(t("desktop", Some("fr"), 2), "2 about first");
        assert_eq!(t("other", None, 5), "5 new updates");
        assert_eq!(t("other", None, 6), "You have 6 new updates");
        assert!(RoutingSettings::from_json(&json!({"templates": {"de": {"bogus": "x"}}})).is_err());
    }

    #[test]
    fn a_route_overrides_the_retry_settings() {
        let s = RoutingSettings::from_json(&json!({
            "retry": {"base_delay": "2s"},
            "routes": {"desktop": {"retry": {"strategy": "linear", "max_attempts": 9}}}
        }))
        .unwrap();
        let r = s.retry_for("desktop");
        assert_eq!(
            (r.strategy, r.max_attempts, r.base_delay_ms),
            (Strategy::Linear, 9, 2_000)
        );
        assert_eq!(s.retry_for("other").strategy, Strategy::Exponential);
        assert!(
            RoutingSettings::from_json(
                &json!({"routes": {"desktop": {"retry": {"base_delay": "1h"}}}})
            )
            .is_err()
        );
    }

    fn desktop() -> RouteOutcome {
        RouteOutcome::Deliver {
            route: "desktop".into(),
            sink: Sink::App,
        }
    }

    #[test]
    fn default_routing_table() {
        let s = RoutingSettings::default();
        assert_eq!(routes(&s, "urgent"), vec![desktop()]);
        assert_eq!(routes(&s, "action"), vec![desktop()]);
        assert!(
            routes(&s, "warning").is_empty(),
            "dashboard only: no delivery row"
        );
        assert!(routes(&s, "info").is_empty());
        assert!(routes(&s, "unknown").is_empty());
    }

    #[test]
    fn settings_change_the_table() {
        let disabled = RoutingSettings::from_json(&json!({"enabled": false})).unwrap();
        assert!(
            routes(&disabled, "urgent").is_empty(),
            "globally disabled: no deliveries"
        );
        let no_desktop =
            RoutingSettings::from_json(&json!({"desktop": {"enabled": false}})).unwrap();
        assert!(routes(&no_desktop, "urgent").is_empty());
        let warn_desktop = RoutingSettings::from_json(
            &json!({"routing": {"warning": ["dashboard", "desktop"]}, "desktop": {"priorities": ["warning"]}}),
        )
        .unwrap();
        assert_eq!(routes(&warn_desktop, "warning"), vec![desktop()]);
        assert!(
            routes(&warn_desktop, "urgent").is_empty(),
            "urgent is no longer desktop-eligible"
        );
        let empty = RoutingSettings::from_json(&json!({"routing": {"urgent": []}})).unwrap();
        assert!(
            routes(&empty, "urgent").is_empty(),
            "an empty list suppresses the route"
        );
        let unknown = RoutingSettings::from_json(
            &json!({"routing": {"info": ["dashboard", "pager", "pager"]}}),
        )
        .unwrap();
        assert_eq!(
            routes(&unknown, "info"),
            vec![RouteOutcome::Skipped {
                route: "pager".into(),
                reason: "unknown_route"
            }],
            "an explicitly configured unknown route: one skipped row"
        );
        assert_eq!(
            unknown.unknown_routes(),
            vec![("info".to_owned(), "pager".to_owned())],
            "named once, for the start's warning"
        );
        assert!(warn_desktop.unknown_routes().is_empty());
    }

    #[test]
    fn parses_the_configured_defaults_and_policies() {
        let v = json!({
            "enabled": true,
            "retry": {"max_attempts": 3, "base_delay": "2s", "max_delay": "1m", "jitter": 0.1, "lease_ttl": "45s", "batch_size": 10},
            "outbox": {"max_pending": 7, "stuck_after": "1h"},
            "routes": {"desktop": {"delay": ["5m", "15m"], "quiet_hours": ["22:00", "09:00"],
                                   "quiet_hours_bypass": ["urgent"], "digest": {"window": "5m", "max_items": 5}}}
        });
        let s = RoutingSettings::from_json(&v).unwrap();
        assert_eq!(s.retry.max_attempts, 3);
        assert_eq!(
            (
                s.retry.base_delay_ms,
                s.retry.max_delay_ms,
                s.retry.lease_ttl_ms
            ),
            (2_000, 60_000, 45_000)
        );
        assert_eq!((s.max_pending, s.stuck_after_ms), (7, 3_600_000));
        let p = &s.routes["desktop"];
        assert_eq!(p.delay_ms, Some((300_000, 900_000)));
        assert_eq!(p.quiet_hours, Some((22 * 60, 9 * 60)));
        assert_eq!(p.quiet_hours_bypass, vec!["urgent".to_owned()]);
        assert_eq!(
            p.digest,
            Some(DigestPolicy {
                window_ms: 300_000,
                max_items: 5,
                summary_after: 5,
            })
        );
        for bad in [
            json!({"retry": {"base_delay": "soon"}}),
            json!({"retry": {"jitter": 2.0}}),
            json!({"routes": {"desktop": {"delay": ["15m", "5m"]}}}),
            json!({"routes": {"desktop": {"quiet_hours": ["25:00", "09:00"]}}}),
            json!({"retry": {"base_delay": "10m", "max_delay": "1m"}}),
        ] {
            assert!(RoutingSettings::from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_and_clocks() {
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        assert_eq!(parse_duration_ms("5m"), Some(300_000));
        assert_eq!(parse_duration_ms("1h"), Some(3_600_000));
        assert_eq!(parse_duration_ms("m5"), None);
        assert_eq!(parse_duration_ms("5 weeks"), None);
        assert_eq!(parse_clock("09:00"), Some(540));
        assert_eq!(parse_clock("24:00"), None);
    }

    #[test]
    fn backoff_grows_caps_and_stays_within_jitter() {
        let r = RoutingSettings::default().retry;
        // Without jitter (u = 0.5): 1s, 2s, 4s, ... capped at 5m.
        let mid: Vec<u64> = (1..=12).map(|a| backoff_ms(&r, a, 0.5, None)).collect();
        assert_eq!(&mid[..5], &[1_000, 2_000, 4_000, 8_000, 16_000]);
        assert!(mid.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*mid.last().unwrap(), 300_000);
        // Every jittered delay stays inside its bounds, over many draws.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for attempt in 1..=20 {
            let raw = (r.base_delay_ms << (attempt - 1).min(40)).min(r.max_delay_ms) as f64;
            for _ in 0..2_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                let d = backoff_ms(&r, attempt, u, None) as f64;
                assert!(
                    d >= (raw * (1.0 - r.jitter)).floor(),
                    "attempt {attempt}: {d} below {raw}·0.8"
                );
                assert!(
                    d <= (raw * (1.0 + r.jitter)).ceil().min(r.max_delay_ms as f64),
                    "attempt {attempt}: {d} above bound"
                );
            }
        }
        assert_eq!(
            backoff_ms(&r, 3, 0.9, Some(1_234)),
            1_234,
            "retry_after_ms is honoured"
        );
        assert_eq!(
            backoff_ms(&r, 3, 0.9, Some(10 * 3_600_000)),
            3_600_000,
            "capped at 1 h"
        );
    }

    /// The one backoff, three strategies (deliveries and sources share it).
    #[test]
    fn backoff_strategies() {
        let mut r = RoutingSettings::default().retry;
        r.base_delay_ms = 100;
        r.max_delay_ms = 1_000;
        r.jitter = 0.0;
        let delays = |r: &RetrySettings| {
            (1..=5)
                .map(|a| backoff_ms(r, a, 0.5, None))
                .collect::<Vec<_>>()
        };
        assert_eq!(delays(&r), [100, 200, 400, 800, 1_000]);
        r.strategy = Strategy::Linear;
        assert_eq!(delays(&r), [100, 200, 300, 400, 500]);
        r.strategy = Strategy::Fixed;
        assert_eq!(delays(&r), [100, 100, 100, 100, 100]);
        assert_eq!(backoff_ms(&r, 1, 0.5, Some(7_000)), 7_000);
        let s = RoutingSettings::from_json(&serde_json::json!({"retry": {"strategy": "fixed"}}))
            .unwrap();
        assert_eq!(s.retry.strategy, Strategy::Fixed);
        assert!(
            RoutingSettings::from_json(&serde_json::json!({"retry": {"strategy": "random"}}))
                .is_err()
        );
    }
}
