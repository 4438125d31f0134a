//! Routes managed at runtime (spec section 4): `PUT /v1/routes/{name}` records `route.updated`
//! with the route object, `DELETE` records `route.deleted`; both need a reason and name who did
//! it. A route the configuration file configures stays the file's.

use tidemark_log::NewEvent;
use tidemark_projections::ModelsTxn;
use tidemark_projections::names::{EventType, Sink, Stream};
use tidemark_projections::routes::{self, RouteRow};
use tidemark_projections::routing::ApiRoute;
use tidemark_projections::secrets;
use tidemark_projections::settings;

use tidemark_projections::deliveries;
use tidemark_projections::endpoints::EndpointChange;

use super::outbox::endpoint_event;
use super::{Command, DecideResult, Decided, Round};
use crate::error::{CommandError, Rejection};

/// The routes tidemark itself defines (section 4): neither is managed through the API.
pub const BUILT_IN: [&str; 2] = ["dashboard", "desktop"];

/// What a `PUT /v1/routes/{name}` names (spec section 4: it replaces what it names and keeps
/// what it omits): each key given replaces the route's, a key given as `null` is removed, a
/// key left out keeps its value (a route changed without `secret` keeps its secret and its
/// rotation). For a route the API does not hold yet, the object is the route.
pub type RoutePatch = serde_json::Map<String, serde_json::Value>;

/// What the answering node can deliver: a route it could not is refused when it is set, not
/// when its deliveries come due.
#[derive(Debug, Clone, Copy)]
pub struct NodeCheck {
    /// `[sinks.email]` is configured here.
    pub email_sink: bool,
    /// Whether an environment variable is set here (`env:NAME` values).
    pub env_set: fn(&str) -> bool,
}

impl NodeCheck {
    /// Every variable is set, every sink configured (tests of the decision alone).
    pub const ANY: NodeCheck = NodeCheck {
        email_sink: true,
        env_set: |_| true,
    };

    /// This process: its configuration's email sink and its environment.
    pub fn here(email_sink: bool) -> NodeCheck {
        NodeCheck {
            email_sink,
            // As the sinks read it (`env_value`): set, and text.
            env_set: |var| std::env::var(var).is_ok(),
        }
    }
}

/// Set a route (`Some`: create it or change the keys the patch names) or delete it (`None`,
/// refused `route_not_found` for a route the API does not hold); answers the route after it
/// (deleted: as it was).
#[derive(Debug, Clone)]
pub struct SetRoute {
    pub name: String,
    pub route: Option<RoutePatch>,
    pub reason: String,
    pub by: Option<String>,
    pub node: NodeCheck,
}

/// A route as set, and what the change warns of (signing removed).
#[derive(Debug, Clone)]
pub struct RouteSet {
    pub row: RouteRow,
    pub warnings: Vec<String>,
}

/// `patch` over the route object `held` records: named keys replace, `null` removes. A
/// `secret` or `url` given as the route shows it (`"***"`, scheme, host and port), as a client
/// that reads the route, edits it and sends it back does, keeps the held one: a secret and a
/// URL's path are never served, so what was served cannot stand for them.
pub fn merged(held: Option<&RouteRow>, patch: &RoutePatch) -> serde_json::Value {
    let mut obj = held
        .and_then(|r| serde_json::from_str::<serde_json::Value>(&r.route).ok())
        .and_then(|v| match v {
            serde_json::Value::Object(o) => Some(o),
            _ => None,
        })
        .unwrap_or_default();
    for (k, v) in patch {
        let shown = match (k.as_str(), v.as_str(), obj.get(k).and_then(|h| h.as_str())) {
            ("secret", Some(s), Some(_)) => s == SHOWN_SECRET || s == secrets::REDACTED,
            ("url", Some(u), Some(h)) => u != h && u == secrets::shown_url(h),
            _ => false,
        };
        if shown {
            continue;
        }
        // Headers as served: a value shown as `"***"` keeps the held one.
        if let (Some(serde_json::Value::Object(given)), "headers") = (Some(v), k.as_str()) {
            let held = obj
                .get(k)
                .and_then(|h| h.as_object())
                .cloned()
                .unwrap_or_default();
            let mut out = serde_json::Map::new();
            for (name, value) in given {
                match (value.as_str(), held.get(name)) {
                    (Some(SHOWN_SECRET), Some(h)) => out.insert(name.clone(), h.clone()),
                    _ => out.insert(name.clone(), value.clone()),
                };
            }
            obj.insert(k.clone(), serde_json::Value::Object(out));
            continue;
        }
        if v.is_null() {
            obj.remove(k);
        } else {
            obj.insert(k.clone(), v.clone());
        }
    }
    serde_json::Value::Object(obj)
}

/// What `GET /v1/routes` shows in place of a set secret.
pub const SHOWN_SECRET: &str = "***";

/// Every `env:NAME` reference of a route's `url`, `secret` and `headers` that `node` lacks
/// (`route.url = env:X`).
pub fn unset_env(r: &ApiRoute, node: NodeCheck) -> Vec<String> {
    let headers = r.config.headers.iter().flatten();
    [
        ("url".to_owned(), r.config.url.as_deref()),
        ("secret".to_owned(), r.config.secret.as_deref()),
    ]
    .into_iter()
    .chain(headers.map(|(n, v)| (format!("headers.{n}"), Some(v.as_str()))))
    .filter_map(|(key, v)| {
        let var = v?.strip_prefix("env:")?;
        (!(node.env_set)(var)).then(|| format!("route.{key} = env:{var}"))
    })
    .collect()
}

impl Command for SetRoute {
    type Answer = RouteSet;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let name = self.name.as_str();
        if BUILT_IN.contains(&name) {
            return Err(CommandError::rejected(
                Rejection::InvalidRoute,
                format!(
                    "{name} is a built-in route: configure it in [notifications.routes.{name}]"
                ),
            ));
        }
        if settings::View::new(txn)?
            .file_routes()?
            .contains(&self.name)
        {
            return Err(CommandError::rejected(
                Rejection::RouteFromConfig,
                format!(
                    "the route {name:?} is configured in the file ([notifications.routes.{name}]): \
                     change it there"
                ),
            ));
        }
        let held = routes::View::new(txn)?.row(name)?;
        let mut warnings = Vec::new();
        let (ty, payload, row) = match &self.route {
            Some(patch) => {
                let invalid = |e| CommandError::rejected(Rejection::InvalidRoute, e);
                let r = ApiRoute::from_json(&merged(held.as_ref(), patch)).map_err(invalid)?;
                if r.config
                    .secret
                    .as_deref()
                    .is_some_and(|s| s == SHOWN_SECRET || s == secrets::REDACTED)
                {
                    return Err(invalid(format!(
                        "route.secret {:?} is how a secret is shown, not a secret: send the \
                         secret (or env:NAME), or leave it out to keep the route's",
                        r.config.secret.as_deref().unwrap_or_default()
                    )));
                }
                r.check(name).map_err(invalid)?;
                if r.config.sink == Some(Sink::Email) && !self.node.email_sink {
                    return Err(invalid(
                        "route.sink = \"email\" needs [sinks.email] in this node's configuration"
                            .to_owned(),
                    ));
                }
                let unset = unset_env(&r, self.node);
                if !unset.is_empty() {
                    return Err(CommandError::rejected(
                        Rejection::EnvUnset,
                        format!(
                            "{} names an environment variable this node does not have: set it \
                             (on every node that delivers) before the route",
                            unset.join(" and ")
                        ),
                    ));
                }
                let held_secret = held
                    .as_ref()
                    .and_then(RouteRow::spec)
                    .and_then(|h| h.config.secret);
                if held_secret.is_some() && r.config.secret.is_none() {
                    warnings.push(format!(
                        "route {name:?} no longer signs its requests (\"secret\": null): a \
                         receiver that verifies signatures will refuse them"
                    ));
                }
                let row = RouteRow {
                    name: self.name.clone(),
                    route: r.recorded().to_string(),
                    reason: self.reason.clone(),
                    by: self.by.clone(),
                    updated_at_us: round.now_us,
                    updated_seq: 0,
                    previous_secret: None,
                    previous_until_us: None,
                };
                (
                    EventType::RouteUpdated,
                    routes::updated_payload(&r, &self.reason, self.by.as_deref()),
                    row,
                )
            }
            None => {
                let Some(row) = held else {
                    return Err(CommandError::rejected(
                        Rejection::RouteNotFound,
                        format!("no route {name:?} managed through the API"),
                    ));
                };
                (
                    EventType::RouteDeleted,
                    serde_json::json!({"reason": self.reason, "by": self.by}),
                    row,
                )
            }
        };
        let ev = NewEvent::new(None, Stream::Routes, name, ty.as_str(), &payload)
            .map_err(|e| CommandError::rejected(Rejection::InvalidRoute, e.to_string()))?;
        let mut events = vec![ev];
        // A route set through a node that resolves every `env:` of it (checked above) is not
        // unresolved any more: its deliveries that waited for it go; a deleted route has no
        // variables to lack.
        if deliveries::View::new(txn)?
            .endpoint(name)?
            .is_some_and(|e| e.unresolved.is_some())
        {
            let change = EndpointChange {
                sink: Some(Sink::Webhook),
                at_us: round.now_us,
                reason: Some(
                    if self.route.is_some() {
                        "set through a node that resolves it"
                    } else {
                        "the route was deleted"
                    }
                    .into(),
                ),
                ..EndpointChange::default()
            };
            events.push(endpoint_event(EventType::EndpointResolved, name, &change)?);
        }
        Ok(Decided::new(RouteSet { row, warnings }, events))
    }
}
