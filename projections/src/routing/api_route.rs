//! A route managed at runtime (spec section 4): read from `PUT /v1/routes/{name}` or
//! `route.updated` as the file's routes are read, and merged into the file's settings.

use std::collections::BTreeMap;

use serde_json::Value;

use super::config::{NotificationsConfig, RouteConfig, Sink};
use super::parse_duration_ms;
use crate::names::Priority;

/// A route managed at runtime (spec section 4, `PUT /v1/routes/{name}`): the keys of
/// `[notifications.routes.<name>]`, read as the file's are, and `priorities`, the priorities
/// whose routing includes it (after the routes the file gives that priority).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiRoute {
    pub config: RouteConfig,
    pub priorities: Vec<Priority>,
    /// `"operational": true`: its tenant's operators are told through it (section 17), when
    /// the settings name no other (`[notifications.operational]`, the default tenant's). How
    /// a tenant other than the default one names its operational route (section 20).
    pub operational: bool,
}

impl ApiRoute {
    /// Read a route object (the body of `PUT /v1/routes/{name}`, or one recorded in
    /// `route.updated`). A key it does not know is refused, naming it (`route.sinc is not a
    /// known key (known: …)`); a value of the wrong shape names its key and what it must be.
    pub fn from_json(v: &Value) -> Result<ApiRoute, String> {
        let mut obj = v
            .as_object()
            .cloned()
            .ok_or_else(|| "route must be an object of the keys of [notifications.routes.<name>] and priorities".to_owned())?;
        let priorities = match obj.remove("priorities") {
            None | Some(Value::Null) => Vec::new(),
            Some(p) => {
                let bad = || {
                    format!(
                        "route.priorities must be a list of priorities ({})",
                        Priority::joined()
                    )
                };
                let names: Vec<String> = serde_json::from_value(p).map_err(|_| bad())?;
                let mut out = Vec::new();
                for n in &names {
                    let p = Priority::parse(n).ok_or_else(bad)?;
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
                out
            }
        };
        let operational = match obj.remove("operational") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(_) => return Err("route.operational must be true or false".to_owned()),
        };
        // Read as the file's table is: the same keys, the same errors, under `route.`.
        let wrapped = serde_json::json!({ "routes": { "_": Value::Object(obj) } });
        let mut cfg = NotificationsConfig::from_json(&wrapped).map_err(|e| {
            e.replacen("notifications.routes._", "route", 1).replacen(
                "(known: ",
                "(known: priorities, ",
                1,
            )
        })?;
        let config = cfg
            .routes
            .as_mut()
            .and_then(|r| r.remove("_"))
            .unwrap_or_default();
        Ok(ApiRoute {
            config,
            priorities,
            operational,
        })
    }

    /// Check its values as the file's are checked, and what a route needs to deliver: a sink;
    /// a webhook's `url` (`http://`, `https://` or `env:NAME`); `url` and `secret` on a webhook
    /// only; no email sink on a redacting route. Errors name the key under `route.`.
    pub fn check(&self, name: &str) -> Result<(), String> {
        let wrapped = NotificationsConfig {
            routes: Some(BTreeMap::from([(name.to_owned(), self.config.clone())])),
            ..NotificationsConfig::default()
        };
        wrapped
            .settings()
            .map_err(|e| e.replacen(&format!("notifications.routes.{name}"), "route", 1))?;
        if crate::names::ids::subscription_of_endpoint(name).is_some() {
            return Err(format!(
                "a route name may not start with {:?}: it names a bridge webhook's endpoint",
                crate::names::ids::BRIDGE_ENDPOINT
            ));
        }
        let c = &self.config;
        if c.circuit.is_some() && !c.sink.is_some_and(Sink::delivered_by_tidemark) {
            return Err(
                "route.circuit is for the email and webhook sinks, which tidemark delivers itself"
                    .to_owned(),
            );
        }
        match c.sink {
            None => return Err(format!("route.sink is required: one of {}", Sink::joined())),
            Some(Sink::Webhook) => {
                let url = c
                    .url
                    .as_deref()
                    .ok_or_else(|| "route.url is required for sink = \"webhook\"".to_owned())?;
                let ok = url.starts_with("env:") && url.len() > 4
                    || (url.starts_with("http://") || url.starts_with("https://"))
                        && url.len() <= 2048
                        && !url.chars().any(|c| c.is_control() || c.is_whitespace());
                if !ok {
                    return Err(
                        "route.url must be an http:// or https:// URL, or env:NAME".to_owned()
                    );
                }
                if let Some(s) = &c.secret
                    && (s.is_empty() || s.len() > 1024)
                {
                    return Err("route.secret must be 1 to 1024 bytes, or env:NAME".to_owned());
                }
            }
            Some(sink) => {
                if c.url.is_some() || c.secret.is_some() {
                    return Err(format!(
                        "route.url and route.secret are for sink = \"webhook\", not \"{sink}\""
                    ));
                }
                if c.body.is_some() || c.headers.is_some() {
                    return Err(format!(
                        "route.body and route.headers are for sink = \"webhook\", not \"{sink}\""
                    ));
                }
                if sink == Sink::Email && c.redact == Some(true) {
                    return Err(
                        "route.redact: a redacting route cannot use the email sink (it \
                                needs the recipient's address)"
                            .to_owned(),
                    );
                }
            }
        }
        Ok(())
    }

    /// How long the previous secret keeps signing beside a new one, in milliseconds.
    pub fn rotation_overlap_ms(&self) -> u64 {
        self.config
            .rotation_overlap
            .as_deref()
            .and_then(parse_duration_ms)
            .unwrap_or(Self::DEFAULT_ROTATION_OVERLAP_MS)
    }

    /// `rotation_overlap` when the route does not say: a day.
    pub const DEFAULT_ROTATION_OVERLAP_MS: u64 = 24 * 3_600_000;

    /// The route object as `route.updated` records it: every key, the webhook's `url` and
    /// `secret` (or their `env:` references) included, and `priorities`.
    pub fn recorded(&self) -> Value {
        let mut v = self.public();
        if let Some(o) = v.as_object_mut() {
            if let Some(u) = &self.config.url {
                o.insert("url".into(), Value::String(u.clone()));
            }
            if let Some(s) = &self.config.secret {
                o.insert("secret".into(), Value::String(s.clone()));
            }
            if let Some(h) = &self.config.headers {
                o.insert(
                    "headers".into(),
                    serde_json::to_value(h).unwrap_or(Value::Null),
                );
            }
        }
        v
    }

    /// The route object without its `url` and `secret`: what the routing settings hold.
    pub fn public(&self) -> Value {
        let mut v = serde_json::to_value(&self.config)
            .unwrap_or_else(|_| Value::Object(Default::default()));
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "priorities".into(),
                Value::Array(
                    self.priorities
                        .iter()
                        .map(|p| Value::String(p.as_str().to_owned()))
                        .collect(),
                ),
            );
            // Only when set: the routes recorded before it read as they did.
            if self.operational {
                o.insert("operational".into(), Value::Bool(true));
            }
        }
        v
    }
}

impl NotificationsConfig {
    /// These settings with the routes managed at runtime: each under its name, and after the
    /// routes the file gives (or the defaults give) each of its priorities. A route the file
    /// configures stays the file's. The first of them marked `operational` is the operational
    /// route when the file names none.
    pub fn with_routes<'a>(
        &self,
        api: impl IntoIterator<Item = (&'a String, &'a ApiRoute)>,
    ) -> NotificationsConfig {
        let mut out = self.clone();
        let defaults = super::RoutingSettings::default().routing;
        for (name, r) in api {
            let routes = out.routes.get_or_insert_with(BTreeMap::new);
            if routes.contains_key(name) {
                continue;
            }
            routes.insert(name.clone(), r.config.clone());
            // The first route (by name) that says so, when nothing else names one.
            if r.operational && out.operational.is_none() {
                out.operational = Some(super::config::OperationalConfig {
                    route: Some(name.clone()),
                    every: None,
                });
            }
            let routing = out.routing.get_or_insert_with(BTreeMap::new);
            for p in &r.priorities {
                let list = routing
                    .entry(p.as_str().to_owned())
                    .or_insert_with(|| defaults.get(p.as_str()).cloned().unwrap_or_default());
                if !list.contains(name) {
                    list.push(name.clone());
                }
            }
        }
        out
    }
}
