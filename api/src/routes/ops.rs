//! Operational endpoints outside `/v1`: health, readiness, metrics, the OpenAPI document and
//! the operator page.

use crate::state::Api;
use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, Problem};
use crate::routes::blocking;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
    /// Highest committed event_seq.
    pub head: u64,
}

/// The calling token's name and scopes (any valid token; in open mode, every scope).
#[utoipa::path(get, path = "/v1/whoami", tag = "ops", operation_id = "getWhoami",
    responses(
        (status = 200, body = crate::auth::Identity),
        (status = 401, description = "no or an unknown token", content_type = "application/problem+json"),
    ))]
pub async fn whoami(
    st: Api,
    headers: axum::http::HeaderMap,
) -> Result<axum::Json<crate::auth::Identity>, ApiError> {
    let h = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    st.auth.identify(h).map(axum::Json)
}

/// Liveness (section 18): the process answers. Never failed by storage: a full disk or a
/// poisoned log is not fixed by a restart of a live process's container (a poisoned log is
/// recovered by one, but `/healthz` says so and an operator decides).
#[utoipa::path(get, path = "/livez", operation_id = "getLiveness", tag = "ops", responses(
    (status = 200, body = Health),
))]
pub async fn livez(st: Api) -> axum::Json<Health> {
    axum::Json(Health {
        status: "alive",
        head: st.engine().head(),
    })
}

/// Overall health: 503 while the log refuses writes (a storage failure, or its disk short of
/// space) or the decider has panicked, with the refusal's `code` and the body's `status` equal
/// to the HTTP status.
#[utoipa::path(get, path = "/healthz", operation_id = "getHealth", tag = "ops", responses(
    (status = 200, body = Health),
    (status = 503, description = "The log refuses writes: unavailable after a storage failure (`log_unavailable`) or its disk short of space (`insufficient_storage`); or the decider panicked (`models_unavailable`)", body = crate::error::Problem, content_type = "application/problem+json"),
))]
pub async fn healthz(st: Api) -> Result<axum::Json<Health>, ApiError> {
    storage_ok(&st)?;
    Ok(axum::Json(Health {
        status: "ok",
        head: st.engine().head(),
    }))
}

/// The storage faults of I10 as the 503 health answers give them.
fn storage_ok(st: &Api) -> Result<(), ApiError> {
    if st.engine().is_poisoned() {
        return Err(ApiError::log_unavailable());
    }
    if let Some(why) = st.engine().models_poisoned() {
        return Err(ApiError::models_poisoned(format!(
            "{why}: commands are refused until tidemark is restarted"
        )));
    }
    if let Err(e) = st.engine().check_space() {
        return Err(ApiError::from(e).with_status(axum::http::StatusCode::SERVICE_UNAVAILABLE));
    }
    Ok(())
}

/// Read models further behind the head than this are still catching up (after a restart with
/// a long log to fold, or a rebuild): not ready.
pub const READY_MAX_LAG: u64 = 10 * tidemark_engine::FOLLOW_BATCH;

/// Readiness: the log is open and accepting appends, and the read models are caught up.
#[utoipa::path(get, path = "/readyz", tag = "ops", operation_id = "getReadiness", responses(
    (status = 200, body = Health),
    (status = 503, description = "Shutting down, the log is unavailable, its disk is short of space, or the read models are catching up", body = crate::error::Problem, content_type = "application/problem+json"),
))]
pub async fn readyz(st: Api) -> Result<axum::Json<Health>, ApiError> {
    if st.is_shutting_down() {
        return Err(ApiError::unavailable());
    }
    storage_ok(&st)?;
    let lag = st.engine().read().lag();
    if lag > READY_MAX_LAG {
        return Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "catching_up",
            format!("the read models are {lag} events behind the head"),
        )
        .retry_after(1));
    }
    Ok(axum::Json(Health {
        status: "ready",
        head: st.engine().head(),
    }))
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(get, path = "/metrics", operation_id = "getMetrics", tag = "ops", responses(
    (status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)
))]
pub async fn metrics(st: Api) -> Response {
    metrics::gauge!("tidemark_log_queue_depth").set(st.engine().queued() as f64);
    metrics::gauge!("tidemark_build_info", "version" => env!("CARGO_PKG_VERSION"), "commit" => env!("TIDEMARK_COMMIT")).set(1.0);
    crate::metrics_setup::process_metrics();
    if let Some(free) = st.engine().disk_free() {
        metrics::gauge!("tidemark_log_disk_free_bytes").set(free as f64);
    }
    // Each shard's head, storage, models and their lag, judged at scrape time: the home
    // shard's series without a label, another's with `shard="<n>"` (spec section 20), so the
    // alert rules judge each shard.
    for s in &st.shards {
        let engine = s.engine.clone();
        let shard = (engine.shard() > 0).then(|| engine.shard().to_string());
        let at = |extra: &[(&'static str, &str)]| -> Labels {
            let mut l: Labels = extra.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
            l.extend(shard.clone().map(|n| ("shard", n)));
            // In name order: one order for every series of a family.
            l.sort_unstable();
            l
        };
        metrics::gauge!("tidemark_log_head", &at(&[])).set(engine.head() as f64);
        // One series per state, 1 for the one it is in: an alert reads `== 1` of the bad ones.
        let state = engine.storage_state();
        for st in ["ok", "full", "poisoned"] {
            metrics::gauge!("tidemark_storage_state", &at(&[("state", st)]))
                .set(f64::from(u8::from(st == state)));
        }
        let poisoned = engine.models_poisoned().is_some();
        metrics::gauge!("tidemark_models_poisoned", &at(&[])).set(f64::from(u8::from(poisoned)));
        let e = engine.clone();
        if let Ok(infos) = blocking(move || e.read().projections()).await {
            for i in infos {
                metrics::gauge!(
                    "tidemark_projection_lag_events",
                    &at(&[("projection", &i.name)])
                )
                .set(i.lag as f64);
            }
        }
    }
    // Sources: seconds since the last success (since the process start before the first),
    // and whether it is stale, judged at scrape time.
    // Another tenant's sources carry `tenant` (its bounded label), as its other series do.
    for (name, l) in st.sources.labelled() {
        if let Some(rt) = st.sources.runtime(&name) {
            metrics::gauge!("tidemark_source_seconds_since_success", &l)
                .set(rt.seconds_since_success);
            metrics::gauge!("tidemark_source_stale", &l).set(f64::from(u8::from(rt.stale)));
        }
    }
    // The outbox, endpoints and consumers of every tenant (spec section 20), judged at scrape
    // time: the default tenant's series as before, another tenant's with `tenant` (bounded:
    // past `server.metrics_tenant_labels`, summed under `other`).
    let mut series = Series::default();
    let tenants = crate::routes::every_tenant(&st, false).await;
    let tenants = tenants.unwrap_or_else(|_| {
        // The directory unreadable: the default tenant's series at least.
        st.acting_for(tidemark_log::DEFAULT_TENANT, 0)
            .into_iter()
            .collect()
    });
    for t in tenants {
        let tenant = (t.tenant() != tidemark_log::DEFAULT_TENANT)
            .then(|| tidemark_engine::labels::tenant_label(t.tenant()));
        tenant_series(&t, tenant, &mut series).await;
    }
    series.publish();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics_setup::render(&st.metrics),
    )
        .into_response()
}

/// Gauges gathered over the tenants before they are set: several tenants past the label bound
/// share `tenant="other"`, their counts summed and their worst kept.
#[derive(Default)]
struct Series(std::collections::BTreeMap<(&'static str, Labels), f64>);

/// A series' labels, in order.
type Labels = Vec<(&'static str, String)>;

impl Series {
    fn add(&mut self, name: &'static str, labels: Labels, v: f64) {
        *self.0.entry((name, labels)).or_default() += v;
    }

    fn max(&mut self, name: &'static str, labels: Labels, v: f64) {
        let e = self.0.entry((name, labels)).or_default();
        *e = e.max(v);
    }

    /// Set every gauge; a series set at the last scrape and not now (a tenant removed, a
    /// bridge subscription deleted) is set to 0, not left at what it was last seen at.
    fn publish(mut self) {
        static SEEN: std::sync::Mutex<Vec<(&'static str, Labels)>> =
            std::sync::Mutex::new(Vec::new());
        let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        let now: Vec<(&'static str, Labels)> = self.0.keys().cloned().collect();
        for gone in std::mem::take(&mut *seen) {
            self.0.entry(gone).or_insert(0.0);
        }
        *seen = now;
        drop(seen);
        for ((name, labels), v) in self.0 {
            metrics::gauge!(name, &labels).set(v);
        }
    }
}

const ENDPOINT_STATES: [&str; 5] = ["ok", "failing", "open", "disabled", "unresolved"];

/// One tenant's outbox KPIs per sink, endpoints and consumer lag into `series` (`tenant`: its
/// label, `None` for the default tenant's series as before tenants).
async fn tenant_series(st: &Api, tenant: Option<&'static str>, series: &mut Series) {
    let with = |pairs: &[(&'static str, String)]| {
        let mut l: Vec<(&'static str, String)> = pairs.to_vec();
        l.extend(tenant.map(|t| ("tenant", t.to_owned())));
        l
    };
    // Per sink only: a `sink="all"` series would double-count in a sum over sinks.
    if let Ok((_, by_sink, _)) = crate::routes::deliveries::compute_kpis(st, 60, None).await {
        for (sink, k) in &by_sink {
            let l = with(&[("sink", sink.clone())]);
            series.add(
                "tidemark_outbox_queue_depth",
                l.clone(),
                k.queue_depth as f64,
            );
            series.add("tidemark_outbox_stuck", l.clone(), k.stuck as f64);
            series.add("tidemark_outbox_parked", l.clone(), k.parked as f64);
            series.add(
                "tidemark_outbox_sent_last_interval",
                l.clone(),
                k.sent_last_interval as f64,
            );
            series.max(
                "tidemark_outbox_oldest_pending_age_seconds",
                l,
                k.oldest_pending_age_s,
            );
        }
    }
    // Each delivering route's endpoint (section 17): one series per state, 1 for the one it
    // is in, and its failures in a row, as the models have them (never waiting for the head).
    let engine = st.engine().clone();
    if let Ok(endpoints) = blocking(move || engine.read().unwaited().endpoints()).await {
        for (e, _) in endpoints {
            let state = e.state();
            let l = with(&[("route", e.route.clone())]);
            for s in ENDPOINT_STATES {
                let mut ls = l.clone();
                ls.push(("state", s.to_owned()));
                series.max(
                    "tidemark_endpoint_state",
                    ls,
                    f64::from(u8::from(s == state)),
                );
            }
            series.max(
                "tidemark_endpoint_consecutive_failures",
                l,
                e.consecutive_failures as f64,
            );
        }
    }
    // Consumer lag (spec section 10: stuck work is visible): totals, worst cursor, stalled.
    if let Ok(lag) = crate::routes::cursors::compute_lag(st).await {
        let count = |f: &dyn Fn(&crate::routes::cursors::LagOut) -> bool| {
            lag.iter().filter(|c| f(c)).count() as f64
        };
        series.add("tidemark_consumer_cursors", with(&[]), lag.len() as f64);
        series.add(
            "tidemark_consumer_cursors_behind",
            with(&[]),
            count(&|c| c.lag_events > 0),
        );
        series.add(
            "tidemark_consumer_cursors_stalled",
            with(&[]),
            count(&|c| c.stalled),
        );
        series.add(
            "tidemark_consumer_cursors_stopped",
            with(&[]),
            count(&|c| c.stopped),
        );
        let max_events = lag.iter().map(|c| c.lag_events).max().unwrap_or(0);
        let max_secs = lag.iter().map(|c| c.lag_seconds).fold(0.0, f64::max);
        series.max(
            "tidemark_consumer_lag_events_max",
            with(&[]),
            max_events as f64,
        );
        series.max("tidemark_consumer_lag_seconds_max", with(&[]), max_secs);
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "getOpenApi", tag = "ops", responses(
    (status = 200, description = "OpenAPI 3.1 document", content_type = "application/json", body = Object)
))]
pub async fn openapi(st: Api) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        st.openapi
            .get()
            .map(|d| d.as_str())
            .unwrap_or("{}")
            .to_owned(),
    )
        .into_response()
}

/// The console's page, embedded in the binary (spec section 15): it fetches nothing but the
/// [`CONSOLE_FILES`] below and the API.
const CONSOLE_HTML: &str = include_str!("../../console/index.html");
const CONSOLE_ICON: &str = include_str!("../../console/favicon.svg");
const JS: &str = "text/javascript; charset=utf-8";

/// The files the page loads, by name under `/console/`: its scripts (in the order the page
/// loads them, one part of the console each; `app.js`, last, wires them), its style sheet and
/// its icon.
const CONSOLE_FILES: &[(&str, &str, &str)] = &[
    ("core.js", JS, include_str!("../../console/core.js")),
    ("outbox.js", JS, include_str!("../../console/outbox.js")),
    (
        "notifications.js",
        JS,
        include_str!("../../console/notifications.js"),
    ),
    ("tasks.js", JS, include_str!("../../console/tasks.js")),
    (
        "operations.js",
        JS,
        include_str!("../../console/operations.js"),
    ),
    ("routes.js", JS, include_str!("../../console/routes.js")),
    ("tail.js", JS, include_str!("../../console/tail.js")),
    ("events.js", JS, include_str!("../../console/events.js")),
    ("app.js", JS, include_str!("../../console/app.js")),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../console/app.css"),
    ),
    ("favicon.svg", "image/svg+xml", CONSOLE_ICON),
];

/// The console's pages load only the server's own files and talk only to the server.
const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                           connect-src 'self'; img-src 'self'; form-action 'none'; \
                           frame-ancestors 'none'; base-uri 'none'";

fn console_file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONSOLE_CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The operator console: a single page that uses the public API under `/v1` only.
#[utoipa::path(get, path = "/", operation_id = "getConsole", tag = "ops", responses(
    (status = 200, description = "The console's HTML page", content_type = "text/html", body = String)
))]
pub async fn index() -> Response {
    console_file("text/html; charset=utf-8", CONSOLE_HTML)
}

/// The console where an operator may look for it first: the same page as `/`.
#[utoipa::path(get, path = "/console", operation_id = "getConsoleAlias", tag = "ops", responses(
    (status = 200, description = "The console's HTML page (as at `/`)", content_type = "text/html", body = String)
))]
pub async fn console_alias() -> Response {
    console_file("text/html; charset=utf-8", CONSOLE_HTML)
}

/// One of the console's files: a script (`core.js`, `outbox.js`, `notifications.js`,
/// `tasks.js`, `operations.js`, `routes.js`, `tail.js`, `events.js`, `app.js`), its style sheet
/// (`app.css`) or its icon (`favicon.svg`).
#[utoipa::path(get, path = "/console/{file}", operation_id = "getConsoleFile", tag = "ops",
    params(("file" = String, Path, description = "The file's name, e.g. `app.js`")),
    responses(
        (status = 200, description = "JavaScript, CSS or SVG", body = String),
        (status = 404, description = "No such file", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn console_asset(Path(file): Path<String>) -> Result<Response, ApiError> {
    CONSOLE_FILES
        .iter()
        .find(|(name, _, _)| *name == file)
        .map(|(_, ty, body)| console_file(ty, body))
        .ok_or_else(|| ApiError::not_found("no such console file"))
}

/// The same icon where browsers look for one without a link (every page load used to log a
/// 404 for it).
#[utoipa::path(get, path = "/favicon.ico", operation_id = "getFavicon", tag = "ops", responses(
    (status = 200, description = "SVG", content_type = "image/svg+xml", body = String)
))]
pub async fn favicon() -> Response {
    console_file("image/svg+xml", CONSOLE_ICON)
}
