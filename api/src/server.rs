//! The router and the server's life: start, serve, shut down gracefully.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tidemark_engine::Engine;
use tidemark_log::EventLog;
use tidemark_projections::names::{EventType, Stream};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{self, Auth, Scope};
use crate::config::Config;
use crate::error::ApiError;
use crate::routes::{
    admin, bridges, cursors, deliveries, events, notifications, ops, sources, tasks,
};
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "tidemark", description = "Event-sourced notification and delivery engine"),
    modifiers(&BearerAuth),
    tags(
        (name = "events", description = "The durable event log"),
        (name = "tasks", description = "Task read model with review gates"),
        (name = "notifications", description = "The notification dashboard"),
        (name = "deliveries", description = "The delivery runtime: claim, leases, retries, parking, KPIs"),
        (name = "bridges", description = "Bridge subscriptions and terminal notifications"),
        (name = "cursors", description = "Monotonic consumer cursors and their lag"),
        (name = "sources", description = "Pollers that turn upstream HTTP APIs into events"),
        (name = "admin", description = "Projection rebuild and verify"),
        (name = "ops", description = "Operations"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// Why the server did not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    #[error(
        "refusing to listen on {0} with no auth tokens configured: add [[auth.tokens]] to the \
         config file, or listen on a loopback address"
    )]
    OpenOnNonLoopback(std::net::SocketAddr),
    #[error(transparent)]
    Open(#[from] tidemark_log::OpenError),
    #[error("server I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// What a group of routes needs: section 8's scope table is the list of `scoped` groups in
/// [`router`], and each operation's scope is also its `security` requirement in the OpenAPI
/// document, so clients (and the test that tries every route with every scope) read the same
/// table the server enforces. `admin` includes every scope.
fn scoped(
    mut router: OpenApiRouter<AppState>,
    auth: &Auth,
    scope: Scope,
) -> OpenApiRouter<AppState> {
    require_in_doc(router.get_openapi_mut(), &[scope.name()]);
    router.route_layer(middleware::from_fn_with_state(
        (auth.clone(), scope),
        auth::require,
    ))
}

/// Document on every operation the answers the shared layers give (the same for all, so they
/// are declared here once rather than on each handler): `400` for a malformed query or an
/// unknown parameter; with a body `413`, `415` and `422`; behind a token `401`, `403` and the
/// token's rate limit `429`; with path parameters `404`; and `503` while the server stops or
/// its storage fails. A handler's own description of a code is kept.
/// A string schema of `min..=max` printable characters (no control characters: what
/// `char::is_control` refuses), as the handlers check text.
pub(crate) fn printable_string(min: usize, max: usize) -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(min))
        .max_length(Some(max))
        .pattern(Some(if min == 0 {
            PRINTABLE_OR_EMPTY
        } else {
            PRINTABLE
        }))
        .build()
}

pub(crate) const PRINTABLE: &str = "^[^\\x00-\\x1F\\x7F-\\x9F]+$";
const PRINTABLE_OR_EMPTY: &str = "^[^\\x00-\\x1F\\x7F-\\x9F]*$";

/// Every path parameter is a resource id or name the handlers check as 1–128 printable
/// characters (`routes::check_path_id`; anything else is `400 invalid_path`).
fn document_path_parameters(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::ParameterIn;
    for item in doc.paths.paths.values_mut() {
        for op in [
            &mut item.get,
            &mut item.post,
            &mut item.delete,
            &mut item.put,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            for p in op.parameters.iter_mut().flatten() {
                if matches!(p.parameter_in, ParameterIn::Path) {
                    p.schema = Some(printable_string(1, 128).into());
                }
            }
        }
    }
}

/// `wait_ms` is bounded by `server.max_wait_ms` of this server's configuration.
fn document_wait_bound(doc: &mut utoipa::openapi::OpenApi, max_wait_ms: u64) {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    for item in doc.paths.paths.values_mut() {
        for p in item
            .get
            .iter_mut()
            .flat_map(|op| op.parameters.iter_mut().flatten())
        {
            if p.name == "wait_ms" {
                p.schema = Some(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0))
                        .maximum(Some(max_wait_ms as f64))
                        .into(),
                );
            }
        }
    }
}

/// The create→get/act chains of the API as OpenAPI `links`: what a client (or a stateful
/// fuzzer) does next with an answer. `(operation, status, link, target operation, parameters,
/// request body)`; parameters and bodies are runtime expressions over the answer and request.
/// One link: from an operation's answer to the next operation.
struct LinkSpec {
    from: &'static str,
    status: &'static str,
    name: &'static str,
    to: &'static str,
    params: &'static [(&'static str, &'static str)],
    body: Option<&'static str>,
}

const fn link(
    (from, status, name, to): (&'static str, &'static str, &'static str, &'static str),
    params: &'static [(&'static str, &'static str)],
    body: Option<&'static str>,
) -> LinkSpec {
    LinkSpec {
        from,
        status,
        name,
        to,
        params,
        body,
    }
}

const LINKS: &[LinkSpec] = &[
    link(
        (
            "createBridgeSubscription",
            "201",
            "GetSubscription",
            "getBridgeSubscription",
        ),
        &[
            ("id", "$request.path.id"),
            ("subscription_id", "$response.body#/subscription_id"),
        ],
        None,
    ),
    link(
        (
            "createBridgeSubscription",
            "201",
            "ExplainSubscription",
            "explainBridgeSubscription",
        ),
        &[
            ("id", "$request.path.id"),
            ("subscription_id", "$response.body#/subscription_id"),
        ],
        None,
    ),
    link(
        (
            "createBridgeSubscription",
            "201",
            "DeleteSubscription",
            "deleteBridgeSubscription",
        ),
        &[
            ("id", "$request.path.id"),
            ("subscription_id", "$response.body#/subscription_id"),
        ],
        None,
    ),
    link(
        (
            "createBridgeSubscription",
            "201",
            "PullDeliveries",
            "pullBridgeDeliveries",
        ),
        &[("bridge_id", "$response.body#/bridge_id")],
        None,
    ),
    link(
        (
            "createBridgeSubscription",
            "200",
            "GetSubscription",
            "getBridgeSubscription",
        ),
        &[
            ("id", "$request.path.id"),
            ("subscription_id", "$response.body#/subscription_id"),
        ],
        None,
    ),
    link(
        (
            "listBridgeSubscriptions",
            "200",
            "GetSubscription",
            "getBridgeSubscription",
        ),
        &[
            ("id", "$request.path.id"),
            (
                "subscription_id",
                "$response.body#/subscriptions/0/subscription_id",
            ),
        ],
        None,
    ),
    link(
        (
            "pullBridgeDeliveries",
            "200",
            "AckDelivery",
            "ackBridgeDelivery",
        ),
        &[
            ("bridge_id", "$request.path.bridge_id"),
            ("delivery_id", "$response.body#/deliveries/0/delivery_id"),
        ],
        None,
    ),
    link(
        (
            "pullBridgeDeliveries",
            "200",
            "NackDelivery",
            "nackBridgeDelivery",
        ),
        &[
            ("bridge_id", "$request.path.bridge_id"),
            ("delivery_id", "$response.body#/deliveries/0/delivery_id"),
        ],
        None,
    ),
    link(
        (
            "claimDeliveries",
            "200",
            "CompleteDelivery",
            "completeDelivery",
        ),
        &[("id", "$response.body#/deliveries/0/id")],
        Some(r#"{"owner": "$request.body#/owner"}"#),
    ),
    link(
        ("claimDeliveries", "200", "FailDelivery", "failDelivery"),
        &[("id", "$response.body#/deliveries/0/id")],
        Some(r#"{"owner": "$request.body#/owner", "error_code": "fuzz", "retryable": false}"#),
    ),
    link(
        (
            "claimDeliveries",
            "200",
            "ExtendDeliveryLease",
            "extendDeliveryLease",
        ),
        &[("id", "$response.body#/deliveries/0/id")],
        Some(r#"{"owner": "$request.body#/owner"}"#),
    ),
    link(
        ("claimDeliveries", "200", "GetDelivery", "getDelivery"),
        &[("id", "$response.body#/deliveries/0/id")],
        None,
    ),
    link(
        ("listDeliveries", "200", "GetDelivery", "getDelivery"),
        &[("id", "$response.body#/deliveries/0/id")],
        None,
    ),
    link(
        ("listDeliveries", "200", "RetryDelivery", "retryDelivery"),
        &[("id", "$response.body#/deliveries/0/id")],
        None,
    ),
    link(
        (
            "listDeliveries",
            "200",
            "DiscardDelivery",
            "discardDelivery",
        ),
        &[("id", "$response.body#/deliveries/0/id")],
        None,
    ),
    link(
        ("failDelivery", "200", "RetryDelivery", "retryDelivery"),
        &[("id", "$request.path.id")],
        None,
    ),
    link(
        ("listTasks", "200", "GetTask", "getTask"),
        &[("id", "$response.body#/tasks/0/task_id")],
        None,
    ),
    link(
        (
            "listTasks",
            "200",
            "ListSubscriptions",
            "listBridgeSubscriptions",
        ),
        &[("id", "$response.body#/tasks/0/task_id")],
        None,
    ),
    link(
        (
            "listNotifications",
            "200",
            "GetNotificationStatus",
            "getNotificationStatus",
        ),
        &[("id", "$response.body#/notifications/0/notification_id")],
        None,
    ),
    link(
        ("listSources", "200", "GetSource", "getSource"),
        &[("name", "$response.body#/sources/0/name")],
        None,
    ),
    link(
        ("listSources", "200", "PollSource", "pollSource"),
        &[("name", "$response.body#/sources/0/name")],
        None,
    ),
    link(
        (
            "listProjections",
            "200",
            "VerifyProjection",
            "verifyProjection",
        ),
        &[("name", "$response.body#/projections/0/name")],
        None,
    ),
    link(
        (
            "listProjections",
            "200",
            "RebuildProjection",
            "rebuildProjection",
        ),
        &[("name", "$response.body#/projections/0/name")],
        None,
    ),
];

/// utoipa 5.5 writes a link's `operationId` and `requestBody` as `operation_id` and
/// `request_body`, which OpenAPI readers do not know: rename them in the served document.
fn links_in_camel_case(json: String) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&json) else {
        return json;
    };
    let links = v["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|p| p.values_mut())
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut())
        .filter_map(|op| op.get_mut("responses").and_then(|r| r.as_object_mut()))
        .flat_map(|r| r.values_mut())
        .filter_map(|resp| resp.get_mut("links").and_then(|l| l.as_object_mut()))
        .flat_map(|l| l.values_mut())
        .filter_map(|link| link.as_object_mut());
    for link in links {
        for (from, to) in [
            ("operation_id", "operationId"),
            ("request_body", "requestBody"),
        ] {
            if let Some(x) = link.remove(from) {
                link.insert(to.to_owned(), x);
            }
        }
    }
    serde_json::to_string_pretty(&v).unwrap_or(json)
}

fn document_links(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::link::LinkBuilder;
    for LinkSpec {
        from,
        status,
        name,
        to,
        params,
        body,
    } in LINKS
    {
        let mut link = LinkBuilder::new().operation_id(*to);
        for (p, expr) in *params {
            link = link.parameter(*p, *expr);
        }
        if let Some(b) = body {
            let v: serde_json::Value = serde_json::from_str(b).expect("a link body is JSON");
            link = link.request_body(Some(v));
        }
        let op = doc
            .paths
            .paths
            .values_mut()
            .flat_map(|i| {
                [&mut i.get, &mut i.post, &mut i.delete]
                    .into_iter()
                    .flatten()
            })
            .find(|op| op.operation_id.as_deref() == Some(*from));
        let Some(op) = op else {
            panic!("link {name}: no operation {from}");
        };
        let Some(RefOr::T(resp)) = op.responses.responses.get_mut(*status) else {
            panic!("link {name}: {from} documents no {status}");
        };
        resp.links
            .insert((*name).to_owned(), RefOr::T(link.build()));
    }
}

/// Every request body type refuses fields it does not know (`deny_unknown_fields`, `400`), so
/// its schema says `additionalProperties: false`; so do the objects it holds.
fn document_closed_bodies(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{AdditionalProperties, ArrayItems, Schema};
    fn refs_in(s: &RefOr<Schema>, out: &mut Vec<String>) {
        match s {
            RefOr::Ref(r) => out.extend(
                r.ref_location
                    .strip_prefix("#/components/schemas/")
                    .map(str::to_owned),
            ),
            RefOr::T(Schema::Object(o)) => o.properties.values().for_each(|p| refs_in(p, out)),
            RefOr::T(Schema::Array(a)) => {
                if let ArrayItems::RefOrSchema(i) = &a.items {
                    refs_in(i, out)
                }
            }
            RefOr::T(Schema::OneOf(o)) => o.items.iter().for_each(|i| refs_in(i, out)),
            _ => {}
        }
    }
    let mut todo = Vec::new();
    for item in doc.paths.paths.values() {
        for op in [&item.post, &item.put, &item.patch].into_iter().flatten() {
            for c in op.request_body.iter().flat_map(|b| b.content.values()) {
                if let Some(s) = &c.schema {
                    refs_in(s, &mut todo);
                }
            }
        }
    }
    let Some(components) = doc.components.as_mut() else {
        return;
    };
    let mut done = std::collections::BTreeSet::new();
    while let Some(name) = todo.pop() {
        if !done.insert(name.clone()) {
            continue;
        }
        let Some(schema) = components.schemas.get_mut(&name) else {
            continue;
        };
        let closed = Some(Box::new(AdditionalProperties::FreeForm(false)));
        match schema {
            RefOr::T(Schema::Object(o)) if !o.properties.is_empty() => {
                o.additional_properties = closed;
            }
            // An untagged enum of bodies (`POST /v1/events`: a batch or one event).
            RefOr::T(Schema::OneOf(one)) => {
                for item in &mut one.items {
                    if let RefOr::T(Schema::Object(o)) = item {
                        o.additional_properties = closed.clone();
                    }
                }
            }
            _ => {}
        }
        refs_in(schema, &mut todo);
    }
}

fn document_common_answers(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let problem = |what: &str| {
        ResponseBuilder::new()
            .description(what)
            .content(
                "application/problem+json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build()
    };
    for (path, item) in doc.paths.paths.iter_mut() {
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            let mut codes: Vec<(&str, &str)> = vec![
                (
                    "400",
                    "Malformed request: a bad or unknown query parameter or header",
                ),
                ("503", "Shutting down, or the storage is unavailable"),
            ];
            if op.request_body.is_some() {
                codes.extend([
                    ("413", "The body is larger than server.max_body_bytes"),
                    ("415", "The body is not Content-Type: application/json"),
                    ("422", "A field of the body is invalid"),
                ]);
            }
            let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
            if secured {
                codes.extend([
                    (
                        "401",
                        "No token, or not a valid one (WWW-Authenticate: Bearer)",
                    ),
                    ("403", "The token lacks the scope this operation needs"),
                    ("429", "The token's rate limit is spent (Retry-After)"),
                ]);
            }
            if path.contains('{') {
                codes.push(("404", "No such resource"));
            }
            for (code, what) in codes {
                op.responses
                    .responses
                    .entry(code.to_owned())
                    .or_insert_with(|| problem(what).into());
            }
        }
    }
}

/// Set every operation's `security` to the bearer scheme with `scopes` (none: any token).
fn require_in_doc(doc: &mut utoipa::openapi::OpenApi, scopes: &[&str]) {
    for item in doc.paths.paths.values_mut() {
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            op.security = Some(vec![SecurityRequirement::new(
                "bearer",
                scopes.iter().copied(),
            )]);
        }
    }
}

/// Build the whole application router and its OpenAPI document.
pub fn router(state: AppState) -> Router {
    let auth = state.auth.clone();
    let append = scoped(
        OpenApiRouter::new().routes(routes!(events::append)),
        &auth,
        Scope::Append,
    );
    let read = scoped(
        OpenApiRouter::new()
            .routes(routes!(events::list))
            .routes(routes!(events::stream)),
        &auth,
        Scope::Read,
    );
    let read = read.merge(scoped(
        OpenApiRouter::new()
            .routes(routes!(tasks::list))
            .routes(routes!(tasks::get))
            .routes(routes!(tasks::stream))
            .routes(routes!(notifications::list))
            .routes(routes!(notifications::get))
            .routes(routes!(deliveries::list))
            .routes(routes!(deliveries::get))
            .routes(routes!(deliveries::kpis))
            .routes(routes!(cursors::get))
            .routes(routes!(cursors::lag))
            .routes(routes!(bridges::explain))
            .routes(routes!(sources::list))
            .routes(routes!(sources::get)),
        &auth,
        Scope::Read,
    ));
    let bridge = scoped(
        OpenApiRouter::new()
            .routes(routes!(deliveries::claim))
            .routes(routes!(deliveries::complete))
            .routes(routes!(deliveries::complete_many))
            .routes(routes!(deliveries::fail))
            .routes(routes!(deliveries::extend))
            .routes(routes!(cursors::advance))
            .routes(routes!(bridges::pull))
            .routes(routes!(bridges::ack))
            .routes(routes!(bridges::ack_many))
            .routes(routes!(bridges::nack)),
        &auth,
        Scope::Bridge,
    );
    // Create/delete need the bridge scope, list/show the read scope, on the same paths.
    let subs_write = scoped(
        OpenApiRouter::new()
            .routes(routes!(bridges::create))
            .routes(routes!(bridges::delete)),
        &auth,
        Scope::Bridge,
    );
    let subs_read = scoped(
        OpenApiRouter::new()
            .routes(routes!(bridges::list))
            .routes(routes!(bridges::show)),
        &auth,
        Scope::Read,
    );
    let operator = scoped(
        OpenApiRouter::new()
            .routes(routes!(admin::list))
            .routes(routes!(admin::rebuild_one))
            .routes(routes!(admin::verify_one))
            .routes(routes!(deliveries::retry))
            .routes(routes!(deliveries::discard))
            .routes(routes!(sources::poll))
            .routes(routes!(sources::pause))
            .routes(routes!(sources::resume)),
        &auth,
        Scope::Operator,
    );
    // Only admin moves a cursor back (spec section 8).
    let admin = scoped(
        OpenApiRouter::new()
            .routes(routes!(cursors::reset))
            .routes(routes!(sources::reset))
            .routes(routes!(admin::run_retention)),
        &auth,
        Scope::Admin,
    );
    // Any valid token (the handler identifies the caller itself).
    let mut any_token = OpenApiRouter::new().routes(routes!(ops::whoami));
    require_in_doc(any_token.get_openapi_mut(), &[]);
    let open = OpenApiRouter::new()
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi))
        .routes(routes!(ops::index))
        .routes(routes!(ops::console_script))
        .routes(routes!(ops::console_style));
    let (router, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(append)
        .merge(read)
        .merge(bridge)
        .merge(subs_write)
        .merge(subs_read)
        .merge(operator)
        .merge(admin)
        .merge(any_token)
        .merge(open)
        .split_for_parts();
    let mut doc = doc;
    document_common_answers(&mut doc);
    document_path_parameters(&mut doc);
    document_wait_bound(&mut doc, state.config.server.max_wait_ms);
    document_links(&mut doc);
    document_closed_bodies(&mut doc);
    let allowed = Arc::new(crate::params::Allowed::from_doc(&doc));
    let doc = Arc::new(links_in_camel_case(
        doc.to_pretty_json().unwrap_or_else(|_| "{}".into()),
    ));
    router
        .layer(middleware::from_fn_with_state(
            allowed,
            crate::params::refuse_unknown,
        ))
        .fallback(|| async { ApiError::not_found("no such resource") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this resource does not support that method",
            )
        })
        .layer(axum::Extension(doc))
        .layer(DefaultBodyLimit::max(state.config.server.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            refuse_when_stopping,
        ))
        .layer(middleware::from_fn(record_request))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::internal("handler panicked", "panic").into_response()
        }))
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .with_state(state)
}

/// How long a client may take to send a request's line and headers. axum::serve sets no bound,
/// so a connection that never finished its request was held forever (found by
/// `e2e_limits::idle_slow_and_half_open_clients_…`): one file descriptor and task each.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Accept and serve connections until `stop` is cancelled; answers the connections still
/// open, to be finished gracefully (in-flight requests complete, idle connections close).
async fn accept_loop(
    listener: TcpListener,
    app: Router,
    stop: &CancellationToken,
) -> hyper_util::server::graceful::GracefulShutdown {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::Service;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let mut app = app.clone();
            app.call(req.map(axum::body::Body::new))
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
    graceful
}

/// The span of a request: its method and route template (`/v1/deliveries/{id}`), never its
/// URI. Query strings and path ids carry personal data (a recipient, a title search, the id
/// of a redacted notification) that must not reach the log (found when the suite's servers
/// began logging at debug level).
fn request_span(req: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("(no route)", |m| m.as_str());
    tracing::debug_span!("request", method = %req.method(), route)
}

async fn refuse_when_stopping(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if st.is_shutting_down() {
        return ApiError::unavailable().into_response();
    }
    next.run(req).await
}

async fn record_request(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = req.method().as_str().to_owned();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics::counter!("tidemark_http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status).increment(1);
    metrics::histogram!("tidemark_http_request_duration_seconds", "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    resp
}

/// Record the configured notification settings in the log when they differ from the last
/// recorded ones (I3: projections and reactors read settings from the log, never the file).
async fn record_settings(engine: &Engine, settings: serde_json::Value) -> Result<(), RunError> {
    let e = engine.clone();
    let current = tokio::task::spawn_blocking(move || e.read().current_settings())
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .map_err(std::io::Error::other)?;
    if current.as_ref() == Some(&settings) {
        return Ok(());
    }
    let ev = tidemark_log::NewEvent::new(
        None,
        Stream::Settings,
        "",
        EventType::SettingsUpdated,
        &settings,
    )
    .map_err(|e| std::io::Error::other(format!("notification settings: {e}")))?;
    let r = engine
        .log()
        .append(vec![ev])
        .await
        .map_err(|e| std::io::Error::other(format!("recording settings: {e}")))?;
    tracing::info!(
        seq = r.last_seq,
        "notification settings recorded in the log"
    );
    Ok(())
}

/// Open the log and serve on `listener` until `shutdown` resolves; then stop accepting, let
/// in-flight requests finish (bounded by `server.shutdown_grace_secs`), end SSE streams, stop
/// the writer and close the log file cleanly.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let addr = listener.local_addr()?;
    if config.auth.tokens.is_empty() {
        if !addr.ip().is_loopback() {
            return Err(RunError::OpenOnNonLoopback(addr));
        }
        tracing::warn!(%addr, "no auth tokens configured: running open, on loopback only");
    }
    let log_cfg = config.log_config();
    let privacy = config
        .privacy()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let (engine, report) = tokio::task::spawn_blocking(move || Engine::open(&log_cfg))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    let engine = engine.with_privacy(privacy);
    tracing::info!(head = report.head, repaired = report.repaired, "log ready");
    record_settings(&engine, config.notification_settings()).await?;
    let metrics = crate::metrics_setup::handle();
    crate::metrics_setup::describe();
    metrics::gauge!("tidemark_log_head").set(report.head as f64);
    let token = CancellationToken::new();
    let state = AppState {
        engine: engine.clone(),
        auth: Auth::new(&config.auth.tokens),
        sse_slots: Arc::new(Semaphore::new(config.server.sse_max_clients)),
        shutting_down: Arc::new(AtomicBool::new(false)),
        shutdown: token.clone(),
        metrics,
        rebuilds: Default::default(),
        routing: Arc::new(
            tidemark_projections::routing::RoutingSettings::from_json(
                &config.notification_settings(),
            )
            .unwrap_or_default(),
        ),
        pull_hub: Default::default(),
        sources: tidemark_consumers::sources::Sources::new(
            tidemark_consumers::sources::from_config(&config.sources)
                .map_err(std::io::Error::other)?,
        ),
        config: Arc::new(config),
    };
    let reactors = tidemark_consumers::spawn(
        engine.clone(),
        (*state.routing).clone(),
        state.pull_hub.clone(),
        state.config.retention(),
        token.clone(),
    )
    .await
    .map_err(std::io::Error::other)?;
    let pollers = tidemark_consumers::sources::spawn(
        engine.clone(),
        state.sources.clone(),
        state.routing.max_pending,
        token.clone(),
    );
    let grace = Duration::from_secs(state.config.server.shutdown_grace_secs);
    let flag = state.shutting_down.clone();
    let trigger = token.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections; finishing in-flight requests");
        flag.store(true, Ordering::SeqCst);
        trigger.cancel();
    });
    let app = router(state);
    // Tests and scripts read the bound address (useful with port 0) from this first line: it
    // is printed once the log is open and the reactors run, so "listening" means ready to
    // serve (a start that fails exits 1 without it).
    {
        use std::io::Write;
        println!("listening on http://{addr}");
        let _ = std::io::stdout().flush();
    }
    tracing::info!(%addr, "serving");
    let graceful = accept_loop(listener, app, &token).await;
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            tracing::warn!(grace_secs = grace.as_secs(), "in-flight requests did not finish in time; closing anyway");
        }
    }
    let _ = reactors.await;
    let _ = pollers.await;
    engine.close().await;
    drop(engine);
    tracing::info!("stopped cleanly");
    Ok(())
}
