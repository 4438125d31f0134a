//! `GET /v1/cursors`, `POST /v1/cursors/advance`, `POST /v1/cursors/reset` and
//! `GET /v1/consumers/lag` (spec sections 6, 7 and 10, I4).

use crate::request::Bounded;
use crate::state::Api;
use axum::Json;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tidemark_engine::Lag;
use tidemark_engine::commands::cursors::{Advance, Reset};
use tidemark_log::time::Micros;
use tidemark_projections::cursors::Cursor;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::Params;
use crate::request::{Reason, Text, Validate, ValidatedJson, invalid};
use crate::routes::blocking;
use crate::routes::deliveries::check_text;

#[derive(Debug, Serialize, ToSchema)]
pub struct CursorOut {
    pub consumer_id: String,
    pub stream_name: String,
    /// "" for an unscoped stream.
    pub subject_id: String,
    /// 0 = nothing delivered.
    pub last_sequence: u64,
    pub last_delivery_id: Option<String>,
    #[schema(value_type = Option<String>)]
    pub last_delivered_at: Option<Micros>,
    /// The last delivery failure or mismatch (≤ 512 characters).
    pub last_error: Option<String>,
    #[schema(value_type = Option<String>)]
    pub updated_at: Option<Micros>,
}

impl From<Cursor> for CursorOut {
    fn from(c: Cursor) -> Self {
        CursorOut {
            consumer_id: c.consumer_id,
            stream_name: c.stream_name,
            subject_id: c.subject_id,
            last_sequence: c.last_sequence,
            last_delivery_id: c.last_delivery_id,
            last_delivered_at: c.last_delivered_at_us.map(Micros),
            last_error: c.last_error,
            updated_at: c.updated_at_us.map(Micros),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CursorsPage {
    pub cursors: Vec<CursorOut>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CursorsQuery {
    #[param(
        min_length = 1,
        max_length = 160,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$"
    )]
    pub consumer_id: String,
    /// With it: that one cursor (its zero state when absent). Without: all of the consumer's.
    #[param(min_length = 1, max_length = 64, pattern = "^[a-z0-9_.-]+$")]
    pub stream_name: Option<String>,
    /// Default "" (the unscoped stream).
    #[param(max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub subject_id: Option<String>,
    /// Answer as of at least this seq (see `ReadAt`).
    #[param(value_type = Option<u64>)]
    pub min_seq: Option<String>,
}

fn check_key(consumer_id: &str, stream_name: &str, subject_id: &str) -> Result<(), ApiError> {
    check_text("consumer_id", consumer_id, 160)?;
    check_stream_subject(stream_name, subject_id)
}

fn check_stream_subject(stream_name: &str, subject_id: &str) -> Result<(), ApiError> {
    tidemark_log::envelope::check_stream(stream_name)
        .map_err(|e| invalid("stream_name", format!("stream_name: {e}")))?;
    tidemark_log::envelope::check_subject(subject_id)
        .map_err(|e| invalid("subject_id", format!("subject_id: {e}")))?;
    Ok(())
}

/// One cursor (zero state when it does not exist), or all cursors of a consumer.
#[utoipa::path(
    get, path = "/v1/cursors", operation_id = "getCursors", tag = "cursors", params(CursorsQuery),
    responses(
        (status = 200, description = "`{\"cursors\": [...]}`; one item when stream_name is given", body = CursorsPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn get(st: Api, Params(q): Params<CursorsQuery>) -> Result<Json<CursorsPage>, ApiError> {
    let min_seq = crate::routes::ReadAt {
        min_seq: q.min_seq.clone(),
    }
    .seq()?;
    let consumer = q.consumer_id;
    let (rows, as_of_seq) = match q.stream_name {
        Some(stream) => {
            let subject = q.subject_id.unwrap_or_default();
            check_key(&consumer, &stream, &subject)
                .map_err(|e| ApiError::invalid_query(e.problem.detail.clone()))?;
            crate::routes::read_model(st.engine(), min_seq, move |r| {
                Ok(vec![r.cursor(&consumer, &stream, &subject)?])
            })
            .await?
        }
        None => {
            check_text("consumer_id", &consumer, 160)
                .map_err(|e| ApiError::invalid_query(e.problem.detail.clone()))?;
            // Without a stream, subject_id narrows the consumer's cursors to that subject.
            let subject = q.subject_id;
            if let Some(s) = &subject {
                tidemark_log::envelope::check_subject(s)
                    .map_err(|e| ApiError::invalid_query(format!("subject_id: {e}")))?;
            }
            crate::routes::read_model(st.engine(), min_seq, move |r| {
                let mut all = r.cursors(Some(&consumer), 10_000)?;
                if let Some(s) = subject {
                    all.retain(|c| c.subject_id == s);
                }
                Ok(all)
            })
            .await?
        }
    };
    Ok(Json(CursorsPage {
        cursors: rows.into_iter().map(CursorOut::from).collect(),
        as_of_seq,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AdvanceBody {
    #[schema(inline)]
    pub consumer_id: Text<160>,
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9_.-]+$")]
    pub stream_name: String,
    #[serde(default)]
    #[schema(max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub subject_id: String,
    #[schema(minimum = 1)]
    pub last_sequence: u64,
    #[schema(inline)]
    pub delivery_id: Text<256>,
    /// Compare-and-swap: advance only if the cursor is at this seq now.
    pub expected_sequence: Option<u64>,
}

impl Validate for AdvanceBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.consumer_id.check_at("consumer_id")?;
        self.delivery_id.check_at("delivery_id")?;
        check_stream_subject(&self.stream_name, &self.subject_id)
    }
}

/// Advance a cursor: forward only; the same seq with the same delivery_id is an idempotent
/// replay. Durable when answered.
#[utoipa::path(
    post, path = "/v1/cursors/advance", operation_id = "advanceCursor", tag = "cursors",
    request_body(content = AdvanceBody, content_type = "application/json"),
    responses(
        (status = 200, body = CursorOut),
        (status = 409, description = "non_monotonic_cursor or cursor_conflict", body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all)]
pub async fn advance(
    st: Api,
    ValidatedJson(b): ValidatedJson<AdvanceBody>,
) -> Result<Json<CursorOut>, ApiError> {
    if b.last_sequence == 0 || b.last_sequence > st.engine().head() {
        return Err(invalid(
            "last_sequence",
            format!(
                "last_sequence must be from 1 to the log head ({})",
                st.engine().head()
            ),
        ));
    }
    let a = Advance {
        consumer_id: b.consumer_id.into_string(),
        stream_name: b.stream_name,
        subject_id: b.subject_id,
        last_sequence: b.last_sequence,
        delivery_id: b.delivery_id.into_string(),
        expected_sequence: b.expected_sequence,
    };
    let (c, _) = st.engine().execute(a).await?;
    metrics::counter!("tidemark_cursor_advances_total").increment(1);
    Ok(Json(c.into()))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetBody {
    #[schema(inline)]
    pub consumer_id: Text<160>,
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9_.-]+$")]
    pub stream_name: String,
    #[serde(default)]
    #[schema(max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub subject_id: String,
    /// The new position (may be lower: reset is the only way down).
    pub last_sequence: u64,
    /// Why; required, recorded in the `cursor.reset` event.
    #[schema(inline)]
    pub reason: Reason,
}

impl Validate for ResetBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.consumer_id.check_at("consumer_id")?;
        check_stream_subject(&self.stream_name, &self.subject_id)?;
        self.reason.check("a cursor reset")
    }
}

/// Operator: move a cursor to any position, with a reason recorded as an event.
#[utoipa::path(
    post, path = "/v1/cursors/reset", operation_id = "resetCursor", tag = "cursors",
    request_body(content = ResetBody, content_type = "application/json"),
    responses(
        (status = 200, body = CursorOut),
        (status = 422, description = "Empty reason or position past the head", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all)]
pub async fn reset(
    st: Api,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<ResetBody>,
) -> Result<Json<CursorOut>, ApiError> {
    if b.last_sequence > st.engine().head() {
        return Err(invalid(
            "last_sequence",
            format!(
                "last_sequence is past the log head ({})",
                st.engine().head()
            ),
        ));
    }
    let (c, _) = st
        .engine()
        .execute(Reset {
            consumer_id: b.consumer_id.into_string(),
            stream_name: b.stream_name,
            subject_id: b.subject_id,
            to: b.last_sequence,
            reason: b.reason.into_string(),
            by: crate::routes::caller(&st, &headers),
        })
        .await?;
    tracing::info!(
        consumer = %c.consumer_id,
        to = c.last_sequence,
        request_id = %crate::request_id::current(),
        "cursor reset"
    );
    metrics::counter!("tidemark_cursor_resets_total").increment(1);
    Ok(Json(c.into()))
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LagOut {
    pub consumer_id: String,
    pub stream_name: String,
    pub subject_id: String,
    pub last_sequence: u64,
    /// Matching events past the cursor (counted up to 10,000; `lag_capped` beyond).
    pub lag_events: u64,
    pub lag_capped: bool,
    /// How long its oldest deliverable work has waited, seconds: since the later of its last
    /// progress (an advance or a reset) and the first event it has to deliver; 0 when it has
    /// nothing to deliver (a bridge subscription: nothing its explain would deliver now). A
    /// stopped subscription: how long it has been stopped (since the mismatch, or a later
    /// reset).
    pub lag_seconds: f64,
    /// Deliverable work and no progress for `outbox.stuck_after` (section 10). A bridge
    /// subscription waiting on a running or review-gated task is not stalled, nor one whose
    /// endpoint holds it (`held_by`).
    pub stalled: bool,
    /// A bridge webhook subscription whose endpoint holds its POSTs (section 17):
    /// `circuit_open` (it goes when a probe succeeds) or `endpoint_disabled` (when an operator
    /// enables it, `tidemark endpoints enable bridge:<id>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(circuit_open|endpoint_disabled|endpoint_unresolved)$")]
    pub held_by: Option<String>,
    /// A bridge subscription stopped at a terminal-state mismatch: flagged at once; it
    /// resumes when the task's state is repaired or an operator resets its cursor.
    pub stopped: bool,
    /// Why it stopped (the mismatch's reason, starting with its code, e.g. `run_not_started`).
    pub stopped_reason: Option<String>,
    /// The seq of the event it stopped at.
    pub stopped_seq: Option<u64>,
    /// With `[retention] compact_log`: no progress for the retention window, so it no longer
    /// keeps the log's events from being compacted (and may have lost some: it then counts
    /// from the first retained event).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
    pub last_error: Option<String>,
}

impl From<Lag> for LagOut {
    fn from(l: Lag) -> Self {
        LagOut {
            consumer_id: l.consumer_id,
            stream_name: l.stream_name,
            subject_id: l.subject_id,
            last_sequence: l.last_sequence,
            lag_events: l.lag_events,
            lag_capped: l.lag_capped,
            lag_seconds: l.lag_seconds,
            stalled: l.stalled,
            held_by: l.held_by.map(str::to_owned),
            stopped: l.stopped.is_some(),
            stopped_seq: l.stopped.as_ref().map(|s| s.seq),
            stopped_reason: l.stopped.map(|s| s.reason),
            stale: l.compacted_past,
            last_error: l.last_error,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LagPage {
    /// Every consumer cursor, and every active bridge subscription's (zero or not).
    pub consumers: Vec<LagOut>,
    /// How many are stalled.
    pub stalled: u64,
    /// How many are stopped.
    pub stopped: u64,
}

/// Every cursor (and every active subscription's cursor, zero or not) with its lag.
pub(crate) async fn compute_lag(st: &Api) -> Result<Vec<LagOut>, ApiError> {
    let engine = st.engine().clone();
    let stuck_after = st.routing.stuck_after_ms;
    let retention = st.config.retention();
    let (lags, now) = blocking(move || {
        let now = engine.now_us();
        Ok::<_, tidemark_engine::QueryError>((
            tidemark_consumers::bridge::lags(&engine, now, stuck_after)?,
            now,
        ))
    })
    .await?;
    let window_us = (retention.window_ms as i64).saturating_mul(1_000);
    Ok(lags
        .into_iter()
        .map(|l| {
            let stale = retention.compact_log
                && (l.compacted_past
                    || l.updated_at_us
                        .is_some_and(|u| now.saturating_sub(u) >= window_us));
            LagOut {
                stale,
                ..LagOut::from(l)
            }
        })
        .collect())
}

/// Every cursor's lag in events and seconds; stalled and stopped ones flagged.
#[utoipa::path(
    get, path = "/v1/consumers/lag", operation_id = "getConsumerLag", tag = "cursors",
    responses((status = 200, body = LagPage)),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn lag(st: Api) -> Result<Response, ApiError> {
    let consumers = compute_lag(&st).await?;
    let stalled = consumers.iter().filter(|c| c.stalled).count() as u64;
    let stopped = consumers.iter().filter(|c| c.stopped).count() as u64;
    Ok(Json(LagPage {
        consumers,
        stalled,
        stopped,
    })
    .into_response())
}
