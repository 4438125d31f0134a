//! `GET /v1/outbox/sinks`: how the sinks tidemark delivers itself (section 17) are doing on
//! this node — attempts by outcome since the start, in flight, the last success and failure.
//! The queue of each sink is in `GET /v1/outbox/kpis` (`by_sink`).

use crate::state::Api;
use axum::Json;
use serde::Serialize;
use tidemark_log::time::format_micros;
use utoipa::ToSchema;

/// One sink's attempts on this node since it started.
#[derive(Debug, Serialize, ToSchema)]
pub struct SinkHealthOut {
    /// `email` or `webhook`.
    pub sink: String,
    /// `idle` (no attempt yet, none in flight), `sending` (first attempts in flight, none
    /// finished), `ok` (the last attempt succeeded) or `failing` (every attempt since the last
    /// success failed).
    #[schema(pattern = "^(idle|sending|ok|failing)$")]
    pub state: String,
    /// Attempts in flight, at most `concurrency`.
    pub in_flight: usize,
    pub concurrency: usize,
    /// Attempts that sent.
    pub sent: u64,
    /// Attempts that failed and will be retried (SMTP 4xx, timeouts, HTTP 5xx/408/429, …).
    pub transient: u64,
    /// Attempts that failed for good (the delivery was parked).
    pub permanent: u64,
    pub consecutive_failures: u64,
    pub last_attempt_at: Option<String>,
    pub last_success_at: Option<String>,
    pub last_failure_at: Option<String>,
    /// The adapter's code of the last failure (`smtp_451`, `http_503`, `smtp_timeout`, …).
    pub last_error_code: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SinksOut {
    /// This node (`GET /v1/admin/cluster`): the counts are its own.
    pub node: String,
    pub sinks: Vec<SinkHealthOut>,
}

/// The dispatcher's sinks on this node and how they are doing.
#[utoipa::path(
    get, path = "/v1/outbox/sinks", operation_id = "getSinkHealth", tag = "deliveries",
    responses((status = 200, body = SinksOut)),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn sinks(st: Api) -> Json<SinksOut> {
    let at = |t: Option<i64>| t.map(format_micros);
    Json(SinksOut {
        node: st.engine().leases().node().to_owned(),
        sinks: st
            .sink_health
            .snapshot()
            .into_iter()
            .map(|h| SinkHealthOut {
                sink: h.sink.as_str().to_owned(),
                state: h.state().to_owned(),
                in_flight: h.in_flight,
                concurrency: h.concurrency,
                sent: h.sent,
                transient: h.transient,
                permanent: h.permanent,
                consecutive_failures: h.consecutive_failures,
                last_attempt_at: at(h.last_attempt_at_us),
                last_success_at: at(h.last_success_at_us),
                last_failure_at: at(h.last_failure_at_us),
                last_error_code: h.last_error_code,
            })
            .collect(),
    })
}
