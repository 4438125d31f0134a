//! The checks every request passes before its handler, as two plain tower services.
//!
//! They were six `axum::middleware::from_fn` layers, and each of those clones the whole service
//! beneath it (and its state) for every request so that its `async fn` can own it: six nested
//! layers made about twenty clones and drops of boxed services per request, a fifth of the
//! server's CPU at 256 clients × 1 event (`docs/benchmarks.md`, issue 31). Here each check is a
//! synchronous decision before the inner service is called, and the inner future is awaited
//! in place, so nothing is cloned. The scope an operation needs is read, like the query
//! parameters it takes, from the OpenAPI document the router is built with ([`Allowed`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use tower::{Layer, Service};

use crate::error::ApiError;
use crate::params::Allowed;
use crate::state::AppState;

/// The layer of [`FrontService`].
#[derive(Clone)]
pub struct Front {
    state: AppState,
    allowed: Arc<Allowed>,
}

impl Front {
    pub fn new(state: AppState, allowed: Arc<Allowed>) -> Front {
        Front { state, allowed }
    }
}

impl<S> Layer<S> for Front {
    type Service = FrontService<S>;
    fn layer(&self, inner: S) -> FrontService<S> {
        FrontService {
            front: self.clone(),
            inner,
        }
    }
}

/// Over every route and the fallback, in this order: `503` while shutting down; the caller's token found once and its rate limit taken (every answer to a
/// rate-limited token carries `RateLimit-Remaining`, past the limit `429` with `Retry-After`);
/// `400 unknown_parameter` for a query parameter the operation does not take
/// ([`Allowed`]); `401`/`403` without the scope the operation's `security` names (section 8:
/// `admin` has every scope); the request counted and timed by method, route and status.
#[derive(Clone)]
pub struct FrontService<S> {
    front: Front,
    inner: S,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<S, B> Service<Request> for FrontService<S>
where
    S: Service<Request, Response = axum::http::Response<B>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Answer {
        let started = Instant::now();
        let mut labels = Labels::of(&req);
        let mut served = None;
        let (inner, remaining) = match self.decide(&mut req) {
            Ok(remaining) => {
                labels.tenant = req
                    .extensions()
                    .get::<crate::tenancy::Acting>()
                    .and_then(|a| a.0.clone());
                if matches!(*req.method(), Method::GET | Method::HEAD) {
                    served = req
                        .extensions()
                        .get::<crate::tenancy::ServedBy>()
                        .cloned()
                        .zip(labels.tenant.clone());
                }
                (Ok(self.inner.call(req)), remaining)
            }
            Err((refusal, remaining)) => (Err(refusal), remaining),
        };
        let state = self.front.state.clone();
        Box::pin(async move {
            let mut resp = match inner {
                Ok(fut) => {
                    let Ok(resp) = fut.await;
                    match served {
                        Some((by, tenant)) if fenced_read(&state, &by, &tenant, &resp) => {
                            crate::tenancy::moving(&tenant).into_response()
                        }
                        _ => resp.map(axum::body::Body::new),
                    }
                }
                Err(refusal) => refusal.into_response(),
            };
            if let Some(n) = remaining {
                resp.headers_mut()
                    .insert("ratelimit-remaining", HeaderValue::from(n));
            }
            let logged = resp.extensions_mut().remove::<crate::error::Logged>();
            labels.record(resp.status().as_u16(), started, logged);
            Ok(resp)
        })
    }
}

/// Whether a tenant's read was answered from a shard the tenant is fenced out of (on a
/// cluster, spec section 20): what it says may reach past the fence (a position there means
/// something else in the shard the tenant goes to, an event there is void), so it is not
/// given; the client asks again once this node has seen the switch.
fn fenced_read<B>(
    state: &crate::state::AppState,
    by: &crate::tenancy::ServedBy,
    tenant: &str,
    resp: &axum::http::Response<B>,
) -> bool {
    let Some(shard) = by.0.get().and_then(|&n| state.shards.get(n)) else {
        return false;
    };
    resp.status().is_success() && shard.engine.fence_of(tenant).is_ok_and(|f| f > 0)
}

impl<S> FrontService<S> {
    /// The checks before the handler: `Ok` with the rate limit's remaining requests (when the
    /// token has one), or the refusal to answer with (and what remains: none past the limit).
    fn decide(&self, req: &mut Request) -> Result<Option<u64>, (Box<ApiError>, Option<u64>)> {
        if self.front.state.is_shutting_down() {
            return Err((Box::new(ApiError::unavailable()), None));
        }
        let remaining = self
            .front
            .state
            .auth
            .take_rate(req)
            .map_err(|e| (Box::new(e), Some(0)))?;
        if let Some(path) = req.extensions().get::<MatchedPath>() {
            let refused = |e| (Box::new(e), remaining);
            let allowed = &self.front.allowed;
            if let Some(query) = req.uri().query() {
                allowed
                    .check(req.method(), path.as_str(), query)
                    .map_err(refused)?;
            }
            if let Some(scope) = allowed.scope(req.method(), path.as_str()) {
                self.front
                    .state
                    .auth
                    .check_scope(req, scope)
                    .map_err(refused)?;
            }
            let path = path.clone();
            crate::tenancy::resolve(&self.front.state, req, path.as_str()).map_err(refused)?;
        }
        Ok(remaining)
    }
}

/// The layer of [`RequestIdService`].
#[derive(Clone, Copy, Default)]
pub struct RequestId;

impl<S> Layer<S> for RequestId {
    type Service = RequestIdService<S>;
    fn layer(&self, inner: S) -> RequestIdService<S> {
        RequestIdService { inner }
    }
}

/// `X-Request-ID` (section 8): the client's when it sent one of 1–128 printable characters,
/// else a new UUID v7; on the request, in the task-local [`crate::request_id::current`] reads
/// (while the services beneath decide and while they answer), and on every answer.
#[derive(Clone)]
pub struct RequestIdService<S> {
    inner: S,
}

impl<S> Service<Request> for RequestIdService<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Answer {
        let id = request_id_of(&req);
        req.headers_mut().insert(REQUEST_ID_HEADER, id.clone());
        let fut = crate::request_id::scope_sync(id.clone(), || self.inner.call(req));
        Box::pin(crate::request_id::scope(id.clone(), async move {
            let Ok(mut resp) = fut.await;
            resp.headers_mut().insert(REQUEST_ID_HEADER, id);
            Ok(resp)
        }))
    }
}

const REQUEST_ID_HEADER: &str = "x-request-id";

fn request_id_of(req: &Request) -> HeaderValue {
    let given = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .filter(|v| {
            let b = v.as_bytes();
            !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic() || *c == b' ')
        })
        .cloned();
    given.unwrap_or_else(|| {
        let mut buf = uuid::Uuid::encode_buffer();
        let text = uuid::Uuid::now_v7().hyphenated().encode_lower(&mut buf);
        HeaderValue::from_str(text).expect("a UUID is ASCII")
    })
}

/// The method and route template of a request (`/v1/deliveries/{id}`, never its URI: paths
/// carry ids of personal data), and the metrics recorded under them.
struct Labels {
    method: Method,
    route: Option<MatchedPath>,
    /// The tenant the request acted for (`None`: the default tenant, or refused before one
    /// was decided).
    tenant: Option<Arc<str>>,
}

thread_local! {
    /// The request metrics' handles by (method, route, status): `metrics::counter!` with
    /// labels builds and hashes its key and looks it up in the registry on every call.
    static HANDLES: RefCell<HandleCache> = RefCell::new(HashMap::new());
}

/// Route → (method, status, tenant label, handles).
type HandleCache = HashMap<String, Vec<(Method, u16, &'static str, Handles)>>;

#[derive(Clone)]
struct Handles {
    requests: metrics::Counter,
    duration: metrics::Histogram,
}

/// The health probes, which a load balancer or an orchestrator asks every few seconds: while one
/// fails, its ERROR line is written when its answer changes, not at each probe.
fn is_probe(route: &str) -> bool {
    matches!(route, "/healthz" | "/readyz")
}

/// Whether `route`'s answer (status and problem code) differs from its previous one; records it.
fn probe_changed(route: &str, status: u16, code: &str) -> bool {
    static LAST: std::sync::Mutex<Vec<(String, u16, String)>> = std::sync::Mutex::new(Vec::new());
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match last.iter_mut().find(|(r, _, _)| r == route) {
        Some(seen) if seen.1 == status && seen.2 == code => false,
        Some(seen) => {
            let was_ok = seen.1 < 500;
            seen.1 = status;
            seen.2 = code.to_owned();
            // A change between two healthy answers is not news.
            !(was_ok && status < 500)
        }
        None => {
            last.push((route.to_owned(), status, code.to_owned()));
            status >= 500
        }
    }
}

impl Labels {
    fn of(req: &Request) -> Labels {
        Labels {
            method: req.method().clone(),
            route: req.extensions().get::<MatchedPath>().cloned(),
            tenant: None,
        }
    }

    fn record(self, status: u16, started: Instant, logged: Option<crate::error::Logged>) {
        let route = self.route.as_ref().map_or("unmatched", MatchedPath::as_str);
        let code = logged.as_ref().map_or("", |l| l.code.as_str());
        // A name the directory does not hold takes no label of the bounded set
        // (`tidemark_engine::labels`): only a tenant that exists can.
        let tenant = match &self.tenant {
            None => tidemark_log::DEFAULT_TENANT,
            Some(_) if code == "tenant_not_found" => tidemark_engine::labels::OTHER,
            Some(t) => tidemark_engine::labels::tenant_label(t),
        };
        let handles = HANDLES.with(|cache| {
            let mut cache = cache.borrow_mut();
            if let Some(h) = cache.get(route).and_then(|hs| {
                hs.iter()
                    .find(|(m, s, t, _)| *m == self.method && *s == status && *t == tenant)
            }) {
                return h.3.clone();
            }
            let method = self.method.as_str().to_owned();
            let h = Handles {
                requests: metrics::counter!("tidemark_http_requests_total",
                    "method" => method.clone(), "route" => route.to_owned(), "status" => status.to_string(),
                    "tenant" => tenant),
                duration: metrics::histogram!("tidemark_http_request_duration_seconds",
                    "method" => method, "route" => route.to_owned(), "tenant" => tenant),
            };
            cache
                .entry(route.to_owned())
                .or_default()
                .push((self.method.clone(), status, tenant, h.clone()));
            h
        });
        let took = started.elapsed();
        handles.requests.increment(1);
        handles.duration.record(took.as_secs_f64());
        // The access log (section 18): method, route template, status, duration and request
        // id; never the URI's query or path ids, never a body. A 5xx is one error line, with the
        // problem's code and its server-side cause; a probe's only when its answer changes.
        // Milliseconds to the microsecond (`0.131`, not `0.13073800000000002`).
        let ms = took.as_micros() as f64 / 1e3;
        let cause = logged
            .as_ref()
            .and_then(|l| l.cause.as_deref())
            .unwrap_or("");
        let request_id = crate::request_id::current();
        let method = &self.method;
        let probe = is_probe(route);
        let probe_news = probe && probe_changed(route, status, code);
        if status >= 500 && (probe_news || !probe) {
            tracing::error!(target: "tidemark::access", %method, route, status, code, error = cause,
                duration_ms = ms, %request_id, "request failed");
        } else if probe_news {
            tracing::info!(target: "tidemark::access", %method, route, status,
                duration_ms = ms, %request_id, "probe answers {status} again");
        } else if logged.is_some() {
            tracing::info!(target: "tidemark::access", %method, route, status, code,
                duration_ms = ms, %request_id, "request");
        } else {
            tracing::info!(target: "tidemark::access", %method, route, status,
                duration_ms = ms, %request_id, "request");
        }
    }
}
