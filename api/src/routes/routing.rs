//! Routes managed at runtime (spec section 4): `GET /v1/routes`, `GET /v1/routes/{name}`
//! (read), and `PUT` / `DELETE /v1/routes/{name}` (admin), recorded as `route.updated` /
//! `route.deleted` with the reason and who did it. Every node's router and dispatcher use a
//! changed route from the next event on. A secret is never served: a set one reads `"***"`.

use crate::state::Api;
use axum::Json;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_engine::commands::routes::{BUILT_IN, NodeCheck, SetRoute};
use tidemark_log::time::Micros;
use tidemark_projections::routes::RouteRow;
use tidemark_projections::routing::{ApiRoute, NotificationsConfig, RouteConfig};
use tidemark_projections::secrets;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::Params;
use crate::request::{Reason, Text, Validate, ValidatedJson};
use crate::routes::{ReadAt, caller, read_model};

/// Where a route comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// `[notifications.routes.<name>]` of the configuration file: changed there.
    Config,
    /// `PUT /v1/routes/{name}`.
    Api,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RouteOut {
    pub name: String,
    pub origin: Origin,
    /// The route's keys (those of `[notifications.routes.<name>]`) and `priorities`. A webhook's
    /// `url` is shown by scheme, host and port (or as its `env:` reference); a set `secret`
    /// reads `"***"`. A route from the file shows neither (they are each node's).
    #[schema(value_type = Object)]
    pub route: Value,
    /// Why it last changed, and who changed it (routes managed through the API).
    pub reason: Option<String>,
    pub by: Option<String>,
    #[schema(value_type = Option<String>)]
    pub updated_at: Option<Micros>,
    pub updated_seq: Option<u64>,
    /// Until when the route's previous secret signs beside the new one (after a change of
    /// `secret`, for its `rotation_overlap`); absent when it no longer does.
    #[schema(value_type = Option<String>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_secret_until: Option<Micros>,
    /// `dashboard` (the notification row itself) and `desktop` (the `app` sink's deliveries):
    /// tidemark's own routes, configured in `[notifications.dashboard]`,
    /// `[notifications.desktop]` and `[notifications.routing]`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub built_in: bool,
    /// The route of `[notifications.operational]`, or else the first route set with
    /// `"operational": true`: operators are told through it (sections 17 and 20).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub operational: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RoutesPage {
    pub routes: Vec<RouteOut>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RouteAnswer {
    #[serde(flatten)]
    pub route: RouteOut,
    /// On `PUT`: what the change warns of (a route that no longer signs its requests).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub as_of_seq: u64,
}

/// A route's name in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RouteName {
    /// The route's name: 1 to 128 printable characters.
    #[param(min_length = 1, max_length = 128)]
    pub name: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteBody {
    /// The keys of `[notifications.routes.<name>]` (`sink` required; `url` for a webhook;
    /// `secret` and `url` may be `env:NAME`, set on the answering node) and `priorities`, the
    /// priorities whose routing includes the route. Replaces the keys it names and keeps those
    /// it omits (a change without `secret` keeps the secret and its rotation); a key given as
    /// `null` is removed (`"secret": null` stops signing, answered with a warning).
    #[schema(value_type = Object)]
    pub route: Value,
    /// Why; required, recorded in the event.
    #[schema(inline)]
    pub reason: Reason,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteDeleteBody {
    /// Why; required, recorded in the event.
    #[schema(inline)]
    pub reason: Reason,
}

/// A route's name read from the path and checked before any body: `422 invalid_route`.
pub struct RoutePath(String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for RoutePath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let Path(RouteName { name }) = Path::<RouteName>::from_request_parts(parts, state)
            .await
            .map_err(|_| check_name("").unwrap_err())?;
        check_name(&name)?;
        Ok(RoutePath(name))
    }
}

fn invalid_route(detail: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_route", detail)
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if !Text::<128>::fits(name) {
        return Err(invalid_route(
            "a route name is 1 to 128 printable characters",
        ));
    }
    Ok(())
}

impl Validate for RouteBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.reason.check("a route change")
    }
}

impl Validate for RouteDeleteBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.reason.check("a route change")
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "route_not_found",
        format!("no route {name:?}"),
    )
}

/// Headers as served: an `env:` reference as given, a value as `"***"` (it may be a
/// credential; sent back as `"***"` in a `PUT` it keeps the value held).
fn shown_headers(h: &std::collections::BTreeMap<String, String>) -> Value {
    h.iter()
        .map(|(k, v)| {
            let shown = if v.starts_with("env:") {
                v.clone()
            } else {
                "***".to_owned()
            };
            (k.clone(), Value::String(shown))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A route managed through the API, as served.
fn api_out(row: RouteRow) -> RouteOut {
    let mut route = row
        .spec()
        .map(|r| {
            let mut v = r.public();
            if let Some(o) = v.as_object_mut() {
                if let Some(u) = &r.config.url {
                    o.insert("url".into(), Value::String(secrets::shown_url(u)));
                }
                if r.config.secret.is_some() {
                    o.insert("secret".into(), Value::String("***".into()));
                }
                if let Some(h) = &r.config.headers {
                    o.insert("headers".into(), shown_headers(h));
                }
            }
            v
        })
        .unwrap_or(Value::Null);
    if route.is_null() {
        route = Value::Object(Default::default());
    }
    let previous_secret_until = row
        .previous_secret_at(tidemark_log::time::now_micros())
        .and(row.previous_until_us)
        .map(Micros);
    RouteOut {
        name: row.name,
        origin: Origin::Api,
        route,
        reason: Some(row.reason),
        by: row.by,
        updated_at: Some(Micros(row.updated_at_us)),
        updated_seq: Some(row.updated_seq),
        previous_secret_until,
        built_in: false,
        operational: false,
    }
}

/// The file's routes as the log records them (the last `settings.updated`), with the
/// priorities whose routing includes each, and the built-in `dashboard` and `desktop` whether
/// or not the file gives them policies.
fn file_out(file: &NotificationsConfig) -> Vec<RouteOut> {
    let routing = file.settings().map(|s| s.routing).unwrap_or_default();
    let mut configs: Vec<(String, RouteConfig)> = file
        .routes
        .iter()
        .flatten()
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    for name in BUILT_IN {
        if !configs.iter().any(|(n, _)| n == name) {
            configs.push((name.to_owned(), RouteConfig::default()));
        }
    }
    configs
        .into_iter()
        .map(|(name, mut cfg)| {
            let built_in = BUILT_IN.contains(&name.as_str());
            if name == "desktop" && cfg.sink.is_none() {
                cfg.sink = Some(tidemark_projections::names::Sink::App);
            }
            let mut v = ApiRoute {
                config: cfg,
                priorities: Vec::new(),
                operational: false,
            }
            .public();
            let priorities: Vec<Value> = routing
                .iter()
                .filter(|(_, routes)| routes.contains(&name))
                .map(|(p, _)| Value::String(p.clone()))
                .collect();
            if let Some(o) = v.as_object_mut() {
                o.insert("priorities".into(), Value::Array(priorities));
            }
            RouteOut {
                name,
                origin: Origin::Config,
                route: v,
                reason: None,
                by: None,
                updated_at: None,
                updated_seq: None,
                previous_secret_until: None,
                built_in,
                operational: false,
            }
        })
        .collect()
}

/// Every route: the file's and those managed through the API, by name.
async fn all_routes(st: &Api, min_seq: u64) -> Result<(Vec<RouteOut>, u64), ApiError> {
    let ((file, rows, in_force), as_of_seq) = read_model(st.engine(), min_seq, |q| {
        Ok((q.current_settings()?, q.routes()?, q.settings_in_force()?))
    })
    .await?;
    let file = file
        .and_then(|v| NotificationsConfig::from_json(&v).ok())
        .unwrap_or_default();
    // The file's, or the first API route marked `operational` (a tenant's, section 20).
    let operational = in_force.operational.map(|o| o.route).unwrap_or_default();
    let mut out = file_out(&file);
    out.extend(rows.into_iter().map(api_out));
    for r in &mut out {
        r.operational = r.name == operational;
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((out, as_of_seq))
}

/// Every route: those of the configuration file and those managed through the API.
#[utoipa::path(get, path = "/v1/routes", tag = "routes", operation_id = "listRoutes",
    params(ReadAt),
    responses(
        (status = 200, body = RoutesPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"])))]
pub async fn list(st: Api, Params(q): Params<ReadAt>) -> Result<Json<RoutesPage>, ApiError> {
    let (routes, as_of_seq) = all_routes(&st, q.seq()?).await?;
    Ok(Json(RoutesPage { routes, as_of_seq }))
}

/// One route.
#[utoipa::path(get, path = "/v1/routes/{name}", tag = "routes", operation_id = "getRoute",
    params(RouteName, ReadAt),
    responses(
        (status = 200, body = RouteAnswer),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"])))]
pub async fn show(
    st: Api,
    RoutePath(name): RoutePath,
    Params(q): Params<ReadAt>,
) -> Result<Json<RouteAnswer>, ApiError> {
    one(&st, &name, q.seq()?).await.map(Json)
}

async fn one(st: &Api, name: &str, min_seq: u64) -> Result<RouteAnswer, ApiError> {
    let (routes, as_of_seq) = all_routes(st, min_seq).await?;
    let route = routes
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| not_found(name))?;
    Ok(RouteAnswer {
        route,
        warnings: Vec::new(),
        as_of_seq,
    })
}

/// Admin: create or replace a route, with a reason. Every node routes with it from the next
/// event on; deliveries already made keep the route they were made with.
#[utoipa::path(put, path = "/v1/routes/{name}", tag = "routes", operation_id = "putRoute",
    params(RouteName),
    request_body(content = RouteBody, content_type = "application/json"),
    responses(
        (status = 200, body = RouteAnswer),
        (status = 409, description = "route_from_config: the configuration file's route", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "reason_required, invalid_route, env_unset (an `env:` variable this node lacks) or a malformed body", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"])))]
#[tracing::instrument(skip_all, fields(route = %name))]
pub async fn put(
    st: Api,
    RoutePath(name): RoutePath,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<RouteBody>,
) -> Result<Json<RouteAnswer>, ApiError> {
    // Merged over the route held and checked by the command (`ApiRoute::check`, and what
    // this node can deliver), which refuses `invalid_route` or `env_unset`.
    let Value::Object(patch) = b.route else {
        return Err(invalid_route(
            "route must be an object of the keys of [notifications.routes.<name>] and priorities",
        ));
    };
    let (set, receipt) = st
        .engine()
        .execute(SetRoute {
            name: name.clone(),
            route: Some(patch),
            reason: b.reason.into_string(),
            by: caller(&st, &headers),
            node: NodeCheck::here(st.config.sinks.email.is_some()),
        })
        .await?;
    for w in &set.warnings {
        tracing::warn!(route = %name, "{w}");
    }
    let mut answer = one(&st, &name, receipt.last_seq).await?;
    answer.warnings = set.warnings;
    Ok(Json(answer))
}

/// Admin: delete a route managed through the API, with a reason. Its deliveries not yet sent
/// are skipped by a sink that no longer knows the route.
#[utoipa::path(delete, path = "/v1/routes/{name}", tag = "routes", operation_id = "deleteRoute",
    params(RouteName),
    request_body(content = RouteDeleteBody, content_type = "application/json"),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "route_from_config", body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"])))]
#[tracing::instrument(skip_all, fields(route = %name))]
pub async fn delete(
    st: Api,
    RoutePath(name): RoutePath,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<RouteDeleteBody>,
) -> Result<StatusCode, ApiError> {
    st.engine()
        .execute(SetRoute {
            name,
            route: None,
            reason: b.reason.into_string(),
            by: caller(&st, &headers),
            node: NodeCheck::here(st.config.sinks.email.is_some()),
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewBody {
    /// Render this delivery (its notification, task and items) instead of the sample.
    #[serde(default)]
    #[schema(
        pattern = "^dlv:[^:\\x00-\\x1F\\x7F-\\x9F]+:[^\\x00-\\x1F\\x7F-\\x9F]+$",
        max_length = 512
    )]
    pub delivery_id: Option<String>,
}

/// `dlv:<notification_id>:<route>`, at most 512 characters, none a control one: the schema's
/// pattern, checked the same way.
fn delivery_id_shape(id: &str) -> bool {
    let Some(rest) = id.strip_prefix("dlv:") else {
        return false;
    };
    let Some((n, route)) = rest.split_once(':') else {
        return false;
    };
    id.chars().count() <= 512
        && !n.is_empty()
        && !route.is_empty()
        && !id.chars().any(char::is_control)
}

impl Validate for PreviewBody {
    fn validate(&self) -> Result<(), ApiError> {
        match &self.delivery_id {
            Some(id) if !delivery_id_shape(id) => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_delivery_id",
                "delivery_id must be dlv:<notification_id>:<route>",
            )),
            _ => Ok(()),
        }
    }
}

/// What `POST /v1/routes/{name}/preview` answers: the request the route's receiver would get.
#[derive(Debug, Serialize, ToSchema)]
pub struct PreviewOut {
    pub route: String,
    /// The `content-type` of the body.
    pub content_type: String,
    /// The body as it would be sent (and signed), as text.
    pub body: String,
    /// The route's own headers, shown as `GET /v1/routes` shows them.
    #[schema(value_type = Object)]
    pub headers: Value,
    /// The delivery rendered (absent: the sample notification).
    pub delivery_id: Option<String>,
}

/// Admin: render what a webhook route would send (its `body`, preset or template, and its
/// `headers`) for a sample notification or a given delivery, without sending anything.
#[utoipa::path(post, path = "/v1/routes/{name}/preview", tag = "routes", operation_id = "previewRoute",
    params(RouteName),
    request_body(content = PreviewBody, content_type = "application/json"),
    responses(
        (status = 200, body = PreviewOut),
        (status = 404, description = "route_not_found or delivery_not_found", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "not_a_webhook_route: the route's sink has no body to preview", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "invalid_delivery_id or a malformed body", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"])))]
#[tracing::instrument(skip_all, fields(route = %name))]
pub async fn preview(
    st: Api,
    RoutePath(name): RoutePath,
    ValidatedJson(b): ValidatedJson<PreviewBody>,
) -> Result<Json<PreviewOut>, ApiError> {
    use tidemark_projections::routing::body;
    let key = name.clone();
    let wanted = b
        .delivery_id
        .clone()
        .map(tidemark_projections::ids::DeliveryId::new);
    let ((row, delivery), _) = read_model(st.engine(), 0, move |q| {
        let row = q.routes()?.into_iter().find(|r| r.name == key);
        let d = match &wanted {
            Some(id) => q.delivery(id)?.map(|(d, _)| d),
            None => None,
        };
        Ok((row, d))
    })
    .await?;
    let file = st
        .config
        .notifications_config()
        .ok()
        .and_then(|c| c.routes)
        .and_then(|mut r| r.remove(&name));
    let cfg = match (file, row.and_then(|r| r.spec())) {
        (Some(c), _) => c,
        (None, Some(spec)) => spec.config,
        (None, None) if BUILT_IN.contains(&name.as_str()) => RouteConfig::default(),
        (None, None) => return Err(not_found(&name)),
    };
    if cfg.sink != Some(tidemark_projections::names::Sink::Webhook) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_a_webhook_route",
            format!("route {name:?} is not a webhook route: only those have a body to preview"),
        ));
    }
    let console = st.config.public_url();
    let ctx = match (&b.delivery_id, delivery) {
        (Some(_), Some(d)) => d.template_context(Some(&console)),
        (Some(id), None) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "delivery_not_found",
                format!("no delivery {id:?}"),
            ));
        }
        (None, _) => body::sample(),
    };
    let rendered = body::render(cfg.body.as_ref(), &ctx)
        .map_err(|e| invalid_route(format!("route.body: {e}")))?;
    Ok(Json(PreviewOut {
        route: name,
        content_type: rendered.content_type,
        body: String::from_utf8_lossy(&rendered.bytes).into_owned(),
        headers: cfg
            .headers
            .as_ref()
            .map_or(Value::Object(Default::default()), shown_headers),
        delivery_id: b.delivery_id,
    }))
}
