//! `GET /v1/outbox/endpoints` and `POST /v1/outbox/endpoints/{route}/disable|enable` (spec
//! section 17): the health and circuit of each delivering route, as every node folds them
//! from the log, and the operator's switch.

use crate::state::Api;
use axum::Json;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use tidemark_engine::commands::outbox::SwitchEndpoint;
use tidemark_log::time::format_micros;
use tidemark_projections::endpoints::Endpoint;
use tidemark_projections::routing::CircuitPolicy;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::Params;
use crate::request::{Reason, Text, Validate, ValidatedJson};
use crate::routes::{ReadAt, caller, read_model};

/// An operator's disable or enable.
#[derive(Debug, Serialize, ToSchema)]
pub struct SwitchOut {
    pub at: String,
    pub reason: String,
    /// The token that did it (`null` in open mode).
    pub by: Option<String>,
}

/// An open circuit.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenOut {
    pub opened_at: String,
    /// When the next probe may go out (the cool-down's end, or the probe in flight's lease
    /// end).
    pub probe_at: String,
    /// The delivery out as the probe, if one is.
    pub probe_delivery_id: Option<String>,
}

/// One delivering route's endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointOut {
    /// The route's name, or `bridge:<subscription_id>` for a bridge webhook subscription.
    pub route: String,
    /// `route` (an email or webhook route) or `bridge` (a bridge webhook subscription).
    #[schema(pattern = "^(route|bridge)$")]
    pub kind: String,
    /// `email` or `webhook`.
    pub sink: Option<String>,
    /// `ok`, `failing` (the last attempt failed), `open` (its deliveries wait; one probe
    /// after the cool-down), `disabled` (an operator's; its deliveries wait) or `unresolved`
    /// (a node lacks an `env:` variable of its url or secret; its deliveries wait until a
    /// node that has it starts or the route is set again).
    #[schema(pattern = "^(ok|failing|open|disabled|unresolved)$")]
    pub state: String,
    /// Attempts that came to an outcome, on every node.
    pub attempts: u64,
    pub successes: u64,
    pub consecutive_failures: u64,
    pub last_success_at: Option<String>,
    pub last_failure_at: Option<String>,
    /// The adapter's code of the last failure (`http_503`, `smtp_451`, …).
    pub last_failure_code: Option<String>,
    /// The failures in a row that open the circuit (`circuit.failures`).
    pub circuit_failures: u32,
    /// How long an open circuit waits before its probe (`circuit.cool_down`, ms).
    pub circuit_cool_down_ms: u64,
    pub open: Option<OpenOut>,
    pub disabled: Option<SwitchOut>,
    /// The last operator's enable.
    pub enabled: Option<SwitchOut>,
    /// While unresolved: when, which variables (`reason`), and the node (`by`) that lacks
    /// them.
    pub unresolved: Option<SwitchOut>,
    /// Its pace (section 4): `"<n>/<s|m|h>"`, the route's `rate` or `[notifications.rate]`.
    pub rate: Option<String>,
    /// While this node's decider holds its due deliveries at the pace: when the next may go.
    pub paced_until: Option<String>,
}

impl EndpointOut {
    fn new(e: Endpoint, policy: CircuitPolicy) -> Self {
        let at = |t: Option<i64>| t.map(format_micros);
        let switch = |s: tidemark_projections::endpoints::Switched| SwitchOut {
            at: format_micros(s.at_us),
            reason: s.reason,
            by: s.by,
        };
        let bridge = tidemark_projections::names::ids::subscription_of_endpoint(&e.route).is_some();
        EndpointOut {
            kind: if bridge { "bridge" } else { "route" }.to_owned(),
            state: e.state().to_owned(),
            sink: e.sink.map(|s| s.as_str().to_owned()),
            attempts: e.attempts,
            successes: e.successes,
            consecutive_failures: e.consecutive_failures,
            last_success_at: at(e.last_success_at_us),
            last_failure_at: at(e.last_failure_at_us),
            last_failure_code: e.last_failure_code,
            circuit_failures: policy.failures,
            circuit_cool_down_ms: policy.cool_down_ms,
            open: e.open.map(|o| OpenOut {
                opened_at: format_micros(o.opened_at_us),
                probe_at: format_micros(o.probe_at_us),
                probe_delivery_id: o.probe,
            }),
            disabled: e.disabled.map(switch),
            enabled: e.enabled.map(switch),
            unresolved: e.unresolved.map(switch),
            rate: None,
            paced_until: None,
            route: e.route,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointsPage {
    pub endpoints: Vec<EndpointOut>,
    pub as_of_seq: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointAnswer {
    pub endpoint: EndpointOut,
}

/// Every endpoint: the email and webhook routes in force (and any route no longer configured
/// that has a record), then each active bridge webhook subscription (`bridge:<id>`).
#[utoipa::path(
    get, path = "/v1/outbox/endpoints", operation_id = "listEndpoints", tag = "deliveries",
    params(ReadAt),
    responses(
        (status = 200, body = EndpointsPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn endpoints(
    st: Api,
    Params(q): Params<ReadAt>,
) -> Result<Json<EndpointsPage>, ApiError> {
    let ((rows, settings), as_of_seq) = read_model(st.engine(), q.seq()?, |q| {
        Ok((q.endpoints()?, q.settings_in_force()?))
    })
    .await?;
    let (pacer, now) = (st.engine().pacer(), st.engine().now_us());
    Ok(Json(EndpointsPage {
        endpoints: rows
            .into_iter()
            .map(|(e, p)| {
                let mut out = EndpointOut::new(e, p);
                out.rate = settings.rate_of(&out.route).map(|r| r.text());
                if out.rate.is_some() {
                    out.paced_until = pacer.paced_until(&out.route, now).map(format_micros);
                }
                out
            })
            .collect(),
        as_of_seq,
    }))
}

/// `{route}` of the endpoint paths.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EndpointRoute {
    /// The route's name (1 to 128 printable characters), or `bridge:<subscription_id>`.
    pub route: String,
}

/// An endpoint's name read from the path and checked before any body: a route's name, or
/// `bridge:` and a subscription id, each 1 to 128 printable characters (`422 invalid_route`).
pub struct EndpointPath(String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for EndpointPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let bad = || {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_route",
                "an endpoint is a route's name or bridge:<subscription_id>, each 1 to 128 \
                 printable characters",
            )
        };
        let Path(EndpointRoute { route }) = Path::<EndpointRoute>::from_request_parts(parts, state)
            .await
            .map_err(|_| bad())?;
        let name =
            tidemark_projections::names::ids::subscription_of_endpoint(&route).unwrap_or(&route);
        if !Text::<128>::fits(name) {
            return Err(bad());
        }
        Ok(EndpointPath(route))
    }
}

/// `POST /v1/outbox/endpoints/{route}/disable|enable`: why (required).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SwitchBody {
    /// Why; required, recorded in the event.
    #[schema(inline)]
    pub reason: Reason,
}

impl Validate for SwitchBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.reason.check("a switch of an endpoint")
    }
}

async fn switch(
    st: Api,
    route: String,
    headers: HeaderMap,
    body: SwitchBody,
    enable: bool,
) -> Result<Json<EndpointAnswer>, ApiError> {
    let ((e, policy), _) = st
        .engine()
        .execute(SwitchEndpoint {
            route: route.clone(),
            enable,
            reason: body.reason.into_string(),
            by: caller(&st, &headers),
        })
        .await?;
    let action = if enable { "enabled" } else { "disabled" };
    metrics::counter!("tidemark_endpoint_switches_total", "action" => action).increment(1);
    tracing::info!(route = %route, action, "endpoint switched by an operator");
    Ok(Json(EndpointAnswer {
        endpoint: EndpointOut::new(e, policy),
    }))
}

/// `POST /v1/outbox/endpoints/{route}/disable` and `…/enable`: a route, a body with the reason.
macro_rules! switch_handler {
    ($(#[doc = $doc:literal])* $name:ident, $path:literal, $operation:literal, enable: $enable:literal) => {
        $(#[doc = $doc])*
        #[utoipa::path(
            post, path = $path, operation_id = $operation, tag = "deliveries",
            params(EndpointRoute),
            request_body(content = SwitchBody, content_type = "application/json"),
            responses(
                (status = 200, body = EndpointAnswer),
                (status = 404, description = "endpoint_not_found", body = Problem, content_type = "application/problem+json"),
                (status = 422, description = "reason_required or invalid_route", body = Problem, content_type = "application/problem+json"),
            ),
            security(("bearer" = ["operator"]))
        )]
        #[tracing::instrument(skip_all)]
        pub async fn $name(
            st: Api,
            EndpointPath(route): EndpointPath,
            headers: HeaderMap,
            ValidatedJson(b): ValidatedJson<SwitchBody>,
        ) -> Result<Json<EndpointAnswer>, ApiError> {
            switch(st, route, headers, b, $enable).await
        }
    };
}

switch_handler!(
    /// Operator: disable an endpoint (a route's, or `bridge:<subscription_id>`; recorded as
    /// `endpoint.disabled` with the reason and `by`): its deliveries wait, spending no attempt,
    /// until it is enabled.
    disable_endpoint, "/v1/outbox/endpoints/{route}/disable", "disableEndpoint", enable: false
);
switch_handler!(
    /// Operator: enable a delivering route's endpoint (`endpoint.enabled`, with the reason and
    /// `by`): its deliveries go again, and an open circuit closes.
    enable_endpoint, "/v1/outbox/endpoints/{route}/enable", "enableEndpoint", enable: true
);
