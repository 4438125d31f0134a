//! The router and the server's life: start, serve, shut down gracefully.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::response::IntoResponse;
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

use crate::auth::{Auth, Scope};
use crate::config::Config;
use crate::error::ApiError;
use crate::routes::{
    admin, bridges, cursors, deliveries, events, lists, notifications, ops, routing, sources,
    tasks, tenants,
};
use crate::state::{AppState, Shared};

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
        (name = "lists", description = "Notification lists, resolved when a delivery is attempted"),
        (name = "routes", description = "Notification routes: the configuration file's, and those managed at runtime"),
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
    #[error("TLS: {0}")]
    Tls(String),
}

/// What a group of routes needs: section 8's scope table is the list of `scoped` groups in
/// [`router`], written as each operation's `security` requirement in the OpenAPI document,
/// which is what the server enforces (`front::Front` reads it through `params::Allowed`), so
/// clients (and the test that tries every route with every scope) read the very table the
/// server checks. `admin` includes every scope.
fn scoped(mut router: OpenApiRouter<AppState>, scope: Scope) -> OpenApiRouter<AppState> {
    require_in_doc(router.get_openapi_mut(), &[scope.name()]);
    router
}

/// Set every operation's `security` to the bearer scheme with `scopes` (none: any token).
fn require_in_doc(doc: &mut utoipa::openapi::OpenApi, scopes: &[&str]) {
    for (_, op) in crate::openapi::operations(doc) {
        op.security = Some(vec![SecurityRequirement::new(
            "bearer",
            scopes.iter().copied(),
        )]);
    }
}

/// Build the whole application router and its OpenAPI document.
pub fn router(state: AppState) -> Router {
    let append = scoped(
        OpenApiRouter::new().routes(routes!(events::append)),
        Scope::Append,
    );
    let read = scoped(
        OpenApiRouter::new()
            .routes(routes!(events::read::list))
            .routes(routes!(events::stream::stream)),
        Scope::Read,
    );
    let read = read.merge(scoped(
        OpenApiRouter::new()
            .routes(routes!(tasks::list))
            .routes(routes!(lists::list))
            .routes(routes!(lists::show))
            .routes(routes!(routing::list))
            .routes(routes!(routing::show))
            .routes(routes!(tasks::get))
            .routes(routes!(tasks::stream))
            .routes(routes!(notifications::list))
            .routes(routes!(notifications::get))
            .routes(routes!(deliveries::list))
            .routes(routes!(deliveries::get))
            .routes(routes!(deliveries::kpis))
            .routes(routes!(deliveries::sinks))
            .routes(routes!(deliveries::endpoints))
            .routes(routes!(cursors::get))
            .routes(routes!(cursors::lag))
            .routes(routes!(bridges::explain))
            .routes(routes!(sources::list))
            .routes(routes!(sources::get)),
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
        Scope::Bridge,
    );
    // Create/delete need the bridge scope, list/show the read scope, on the same paths.
    let subs_write = scoped(
        OpenApiRouter::new()
            .routes(routes!(bridges::create))
            .routes(routes!(bridges::delete)),
        Scope::Bridge,
    );
    let subs_read = scoped(
        OpenApiRouter::new()
            .routes(routes!(bridges::list))
            .routes(routes!(bridges::show)),
        Scope::Read,
    );
    let operator = scoped(
        OpenApiRouter::new()
            .routes(routes!(admin::list))
            .routes(routes!(tenants::list))
            .routes(routes!(tenants::show))
            .routes(routes!(tenants::shards))
            .routes(routes!(admin::rebuild_one))
            .routes(routes!(admin::verify_one))
            .routes(routes!(admin::cluster))
            .routes(routes!(admin::overview))
            .routes(routes!(deliveries::retry))
            .routes(routes!(deliveries::discard))
            .routes(routes!(deliveries::resend))
            .routes(routes!(deliveries::recover))
            .routes(routes!(deliveries::disable_endpoint))
            .routes(routes!(deliveries::enable_endpoint))
            .routes(routes!(sources::poll))
            .routes(routes!(sources::pause))
            .routes(routes!(sources::resume)),
        Scope::Operator,
    );
    // Only admin moves a cursor back (spec section 8).
    let admin = scoped(
        OpenApiRouter::new()
            .routes(routes!(cursors::reset))
            .routes(routes!(lists::put, lists::delete))
            .routes(routes!(routing::put, routing::delete))
            .routes(routes!(routing::preview))
            .routes(routes!(sources::reset))
            .routes(routes!(admin::run_retention))
            .routes(routes!(admin::backup))
            .routes(routes!(admin::backup_stream))
            .routes(routes!(tenants::create))
            .routes(routes!(tenants::delete))
            .routes(routes!(tenants::move_to)),
        Scope::Admin,
    );
    // Any valid token (the handler identifies the caller itself).
    let mut any_token = OpenApiRouter::new().routes(routes!(ops::whoami));
    require_in_doc(any_token.get_openapi_mut(), &[]);
    let open = OpenApiRouter::new()
        .routes(routes!(ops::livez))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi))
        .routes(routes!(ops::index))
        .routes(routes!(ops::console_alias))
        .routes(routes!(ops::console_asset))
        .routes(routes!(ops::favicon));
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
    crate::openapi::shape(&mut doc, state.config.server.max_wait_ms);
    let allowed = Arc::new(crate::params::Allowed::from_doc(&doc));
    let _ = state.openapi.set(crate::openapi::to_json(&doc));
    let router = router
        .fallback(|| async { ApiError::not_found("no such resource") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this resource does not support that method",
            )
        })
        // One layer of them all: axum boxes each `layer` call's service and clones the boxes
        // of a route for every request.
        .layer(
            tower::ServiceBuilder::new()
                .layer(crate::front::RequestId)
                .layer(cors(&state.config.server.cors_origins))
                .layer(crate::front::Front::new(state.clone(), allowed))
                // The access line (front.rs) is the request's one ERROR line for a 5xx, with its
                // code and cause; tower-http's failure line, without them, would be a second.
                .layer(
                    TraceLayer::new_for_http()
                        .make_span_with(request_span)
                        .on_failure(
                            tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
                        ),
                )
                .layer(CatchPanicLayer::custom(|_| {
                    ApiError::internal("handler panicked", "panic").into_response()
                }))
                .layer(DefaultBodyLimit::max(state.config.server.max_body_bytes)),
        )
        .with_state(state);
    // A tenant's paths (`/tenants/{tenant}/v1/…`) reach the same routes, the prefix taken off
    // before routing (`tenancy`).
    Router::new().fallback_service(crate::tenancy::TenantPrefix { inner: router })
}

/// Browsers on the listed origins may call the API (section 8): preflight answered, the
/// headers a client sends allowed, the ones it reads exposed. No origins: no CORS headers, so
/// a browser on another origin is refused (and `OPTIONS` is 405).
fn cors(
    origins: &[String],
) -> tower::util::Either<tower_http::cors::CorsLayer, tower::layer::util::Identity> {
    use axum::http::{HeaderName, HeaderValue, Method};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return tower::util::Either::Right(tower::layer::util::Identity::new());
    }
    let list: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    let h = HeaderName::from_static;
    tower::util::Either::Left(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(list))
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
            .allow_headers([
                h("authorization"),
                h("content-type"),
                h("last-event-id"),
                h("x-request-id"),
            ])
            .expose_headers([
                h("x-request-id"),
                h("retry-after"),
                h("ratelimit-remaining"),
                h("ratelimit-limit"),
                h("ratelimit-reset"),
            ])
            .max_age(Duration::from_secs(600)),
    )
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
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: &CancellationToken,
) -> hyper_util::server::graceful::GracefulShutdown {
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
        let (app, watcher) = (app.clone(), graceful.watcher());
        match &tls {
            None => serve_connection(stream, app, watcher),
            Some(acceptor) => {
                // The handshake in the connection's own task, bounded like a request's head.
                let accept = acceptor.accept(stream);
                tokio::spawn(async move {
                    match tokio::time::timeout(HEADER_READ_TIMEOUT, accept).await {
                        Ok(Ok(tls)) => serve_connection(tls, app, watcher),
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                });
            }
        }
    }
    graceful
}

/// Serve one connection (plain or TLS) on its own task, watched for a graceful shutdown.
fn serve_connection<I>(io: I, app: Router, watcher: hyper_util::server::graceful::Watcher)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::Service;
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
        .serve_connection_with_upgrades(TokioIo::new(io), svc)
        .into_owned();
    let conn = watcher.watch(conn);
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "connection ended");
        }
    });
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
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // At debug, so that it costs nothing when off (an info span per request cost ~10 % of
    // the CPU per event at 256 × 1); the request's own info/warn/error lines name the request
    // id themselves ([`crate::request_id::current`]).
    tracing::debug_span!("request", method = %req.method(), route, request_id)
}

/// A route the routing table names but no `[notifications.routes.<name>]` configures is kept
/// (its notifications get a `skipped` delivery, section 4, as seed 000 asks), and said at start.
fn warn_unknown_routes(config: &Config) {
    let Ok(routing) =
        tidemark_projections::routing::RoutingSettings::from_json(&config.notification_settings())
    else {
        return;
    };
    for (priority, route) in routing.unknown_routes() {
        tracing::warn!(
            priority = %priority,
            route = %route,
            "notifications.routing.{priority} names the route {route:?}, which is not configured \
             (no [notifications.routes.{route}] with a sink): its notifications get a skipped \
             delivery (reason unknown_route) and are never delivered there"
        );
    }
}

/// A route is the file's or the API's, never both (section 4): a file naming a route the log
/// holds from `PUT /v1/routes/{name}` refuses the start, naming it.
async fn refuse_file_routes_held_by_the_api(
    engine: &Engine,
    config: &Config,
) -> Result<(), RunError> {
    let file: Vec<String> = config
        .notifications_config()
        .map_err(std::io::Error::other)?
        .routes
        .map(|r| r.into_keys().collect())
        .unwrap_or_default();
    if file.is_empty() {
        return Ok(());
    }
    let e = engine.clone();
    let held = tokio::task::spawn_blocking(move || e.read().routes())
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .map_err(std::io::Error::other)?;
    if let Some(r) = held.iter().find(|r| file.contains(&r.name)) {
        return Err(RunError::Io(std::io::Error::other(format!(
            "notifications.routes.{name}: the route {name:?} is managed through the API \
             (route.updated at seq {seq}); remove it from the configuration file, or delete it \
             with DELETE /v1/routes/{name} (tidemark routes delete) before the file names it",
            name = r.name,
            seq = r.updated_seq
        ))));
    }
    Ok(())
}

/// Record the configured notification settings in the log when they differ from the last
/// recorded ones (I3: projections and reactors read settings from the log, never the file).
async fn record_settings(
    engine: &Engine,
    settings: serde_json::Value,
    stop: CancellationToken,
) -> Result<(), RunError> {
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
    let r = match engine.log().append(vec![ev.clone()]).await {
        // A full disk found at start is a full disk, not damage (I10): serve reads and refuse
        // writes, and record the settings as soon as space returns.
        Err(e @ tidemark_log::AppendError::InsufficientStorage { .. }) => {
            tracing::warn!(error = %e, "the log's disk is full: serving reads; the notification settings are recorded once space returns");
            let engine = engine.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    match engine.log().append(vec![ev.clone()]).await {
                        Ok(r) => {
                            tracing::info!(
                                seq = r.last_seq,
                                "notification settings recorded in the log"
                            );
                            return;
                        }
                        Err(tidemark_log::AppendError::InsufficientStorage { .. }) => {}
                        Err(e) => {
                            tracing::error!(error = %e, "recording the notification settings failed");
                            return;
                        }
                    }
                }
            });
            return Ok(());
        }
        r => r.map_err(|e| std::io::Error::other(format!("recording settings: {e}")))?,
    };
    tracing::info!(
        seq = r.last_seq,
        "notification settings recorded in the log"
    );
    Ok(())
}

/// Load the certificate again on every `SIGHUP` until `stop`.
fn spawn_reload_on_hangup(certs: Arc<crate::tls::Certs>, stop: CancellationToken) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    let c = certs.clone();
                    let _ = tokio::task::spawn_blocking(move || c.reload_now()).await;
                }
            }
        }
    });
}

/// Open shard `shard`'s log and models (spec section 20): its embedded log in its directory,
/// or its stream on the cluster with the replica in that directory (`node`: this node's id on
/// the cluster, the home shard's).
async fn open_shard(
    config: &Config,
    shard: u32,
    node: Option<String>,
) -> Result<(Engine, tidemark_log::OpenReport), RunError> {
    let log_cfg = config.shard_log_config(shard);
    let js_cfg = config.shard_jetstream_config(shard).map(|mut js| {
        if let Some(node) = node {
            js.node = node;
        }
        js
    });
    let opened = tokio::task::spawn_blocking(move || {
        let dir = match &js_cfg {
            Some(js) => js.replica.path.parent(),
            None => log_cfg.path.parent(),
        };
        if let Some(dir) = dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| tidemark_log::OpenError::Storage(tidemark_log::StorageError::of(e)))?;
        }
        match js_cfg {
            Some(js) => Engine::open_jetstream(&js, &tidemark_engine::models_config(&log_cfg)),
            None => Engine::open(&log_cfg),
        }
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok(opened)
}

/// The deployment's shards (spec section 20): `home` (shard 0, the data directory's own log)
/// and `[log] shards - 1` more, shard n in `shards/<n>/` of the data directory, each with its
/// own log, models and decider, made when missing (`Config::shard_log_config`, on a cluster
/// `Config::shard_jetstream_config`). A directory
/// that places a tenant in a shard beyond them refuses the start (shards are not taken away:
/// its events would be out of reach).
async fn open_shards(
    config: &Config,
    home: &Engine,
    privacy: Option<tidemark_engine::privacy::Privacy>,
) -> Result<Vec<crate::state::Shard>, RunError> {
    let n = config.log.shards.max(1);
    let mut shards = vec![crate::state::Shard::new(home.clone())];
    for shard in 1..n {
        // On a cluster, one node id for every shard's leases and membership.
        let node = home.leases().node().to_owned();
        let (engine, report) = open_shard(config, shard, Some(node)).await?;
        tracing::info!(
            shard,
            head = report.head,
            repaired = report.repaired,
            "shard ready"
        );
        shards.push(crate::state::Shard::new(
            engine.with_privacy(privacy.clone()).as_shard(shard, home),
        ));
    }
    let e = home.clone();
    let beyond = tokio::task::spawn_blocking(move || {
        let q = e.read();
        q.floor(0)?;
        Ok::<_, tidemark_engine::QueryError>(
            q.tenants()?
                .into_iter()
                .filter(|t| t.is_live() && t.shard >= n)
                .map(|t| format!("{} (shard {})", t.name, t.shard))
                .collect::<Vec<_>>(),
        )
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))?
    .map_err(|e| std::io::Error::other(e.to_string()))?;
    if !beyond.is_empty() {
        return Err(std::io::Error::other(format!(
            "log.shards = {n}, but the directory places tenants beyond: {}; start with at \
             least as many shards as before",
            beyond.join(", ")
        ))
        .into());
    }
    Ok(shards)
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
    // The certificate is checked before the log is opened: a start it fails changes nothing.
    let certs = match config.tls() {
        None => None,
        Some((cert, key)) => Some(crate::tls::Certs::load(&cert, &key).map_err(RunError::Tls)?),
    };
    if config.auth.tokens.is_empty() {
        if !addr.ip().is_loopback() {
            return Err(RunError::OpenOnNonLoopback(addr));
        }
        tracing::warn!(%addr, "no auth tokens configured: running open, on loopback only");
    }
    let privacy = config
        .privacy()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let (engine, report) = open_shard(&config, 0, None).await?;
    let engine = engine.with_privacy(privacy.clone());
    tracing::info!(head = report.head, repaired = report.repaired, "log ready");
    let shards = open_shards(&config, &engine, privacy).await?;
    let token = CancellationToken::new();
    warn_unknown_routes(&config);
    refuse_file_routes_held_by_the_api(&engine, &config).await?;
    record_settings(&engine, config.notification_settings(), token.clone()).await?;
    let metrics = crate::metrics_setup::handle();
    crate::metrics_setup::describe();
    tidemark_engine::labels::set_tenant_labels(config.server.metrics_tenant_labels);
    crate::routes::admin::backup_gauges_from_disk(&config.backup_root());
    metrics::gauge!("tidemark_log_head").set(report.head as f64);
    // Tidemark's own sinks (section 17), checked before anything runs.
    let sinks = config.dispatch_sinks().map_err(std::io::Error::other)?;
    let state = AppState::new(Shared {
        sink_health: sinks.health.clone(),
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
        shards,
        directory_seq: report.head.into(),
        sources: tidemark_consumers::sources::Sources::new(
            tidemark_consumers::sources::from_config(&config.sources)
                .map_err(std::io::Error::other)?,
        ),
        config: Arc::new(config),
        openapi: Default::default(),
    });
    // Each shard's reactors and sinks' loops follow its own log (a shard's dispatcher woken by
    // its own follower); the sinks' pools and health are the node's.
    let mut reactors = Vec::new();
    let mut shard_sinks = Vec::new();
    let limits = tidemark_consumers::dispatch::limits(&sinks.adapters);
    for shard in &state.shards {
        let sinks = tidemark_consumers::dispatch::Sinks {
            adapters: sinks.adapters.clone(),
            health: sinks.health.clone(),
            wake: Default::default(),
            limits: limits.clone(),
        };
        reactors.push(
            tidemark_consumers::spawn(
                shard.engine.clone(),
                (*state.routing).clone(),
                shard.pull_hub.clone(),
                shard.streams.clone(),
                state.config.retention(),
                sinks.wake.clone(),
                token.clone(),
            )
            .await
            .map_err(std::io::Error::other)?,
        );
        shard_sinks.push((shard.engine.clone(), sinks));
    }
    let pollers = tidemark_consumers::sources::spawn(
        state.shards.iter().map(|s| s.engine.clone()).collect(),
        state.sources.clone(),
        state.routing.max_pending,
        token.clone(),
    );
    // The webhook routes of the API whose `env:` this node lacks wait, listed `unresolved`
    // (section 17), instead of spending their deliveries' attempts.
    tidemark_consumers::dispatch::webhook::check_api_routes(&engine, None).await;
    // Each sink on its own bounded pool.
    let dispatchers: Vec<_> = shard_sinks
        .into_iter()
        .map(|(engine, sinks)| {
            tidemark_consumers::dispatch::spawn(
                engine,
                sinks,
                state.routing.retry.lease_ttl_ms,
                token.clone(),
            )
        })
        .collect();
    let shard_engines: Vec<Engine> = state.shards.iter().map(|s| s.engine.clone()).collect();
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
    let tls = match certs {
        None => None,
        Some(certs) => {
            let server = certs.server_config().map_err(RunError::Tls)?;
            spawn_reload_on_hangup(certs, token.clone());
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
        }
    };
    {
        use std::io::Write;
        let scheme = if tls.is_some() { "https" } else { "http" };
        println!("listening on {scheme}://{addr}");
        let _ = std::io::stdout().flush();
    }
    tracing::info!(%addr, tls = tls.is_some(), "serving");
    let graceful = accept_loop(listener, app, tls, &token).await;
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            tracing::warn!(grace_secs = grace.as_secs(), "in-flight requests did not finish in time; closing anyway");
        }
    }
    for r in reactors {
        let _ = r.await;
    }
    let _ = pollers.await;
    for d in dispatchers {
        let _ = d.await;
    }
    for e in shard_engines.iter().rev() {
        e.close().await;
    }
    drop(shard_engines);
    drop(engine);
    tracing::info!("stopped cleanly");
    Ok(())
}
