//! `GET /v1/cursors`, `POST /v1/cursors/advance`, `POST /v1/cursors/reset` and
//! `GET /v1/consumers/lag` (spec sections 6, 7 and 10, I4).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tidemark_log::time::{format_micros, now_micros};
use tidemark_log::{Log, ReadQuery};
use tidemark_projections::cursors::{self, Advance, Cursor};
use tidemark_projections::read;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::routes::blocking;
use crate::routes::deliveries::{check_text, invalid, json_body};
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct CursorOut {
    pub consumer_id: String,
    pub stream_name: String,
    /// "" for an unscoped stream.
    pub subject_id: String,
    /// 0 = nothing delivered.
    pub last_sequence: u64,
    pub last_delivery_id: Option<String>,
    pub last_delivered_at: Option<String>,
    /// The last delivery failure or mismatch (≤ 512 characters).
    pub last_error: Option<String>,
    pub updated_at: Option<String>,
}

impl From<Cursor> for CursorOut {
    fn from(c: Cursor) -> Self {
        CursorOut {
            consumer_id: c.consumer_id,
            stream_name: c.stream_name,
            subject_id: c.subject_id,
            last_sequence: c.last_sequence,
            last_delivery_id: c.last_delivery_id,
            last_delivered_at: c.last_delivered_at_us.map(format_micros),
            last_error: c.last_error,
            updated_at: c.updated_at_us.map(format_micros),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CursorsPage {
    pub cursors: Vec<CursorOut>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CursorsQuery {
    pub consumer_id: String,
    /// With it: that one cursor (its zero state when absent). Without: all of the consumer's.
    pub stream_name: Option<String>,
    /// Default "" (the unscoped stream).
    pub subject_id: Option<String>,
}

fn check_key(consumer_id: &str, stream_name: &str, subject_id: &str) -> Result<(), ApiError> {
    check_text("consumer_id", consumer_id, 160)?;
    tidemark_log::envelope::check_stream(stream_name)
        .map_err(|e| invalid("stream_name", format!("stream_name: {e}")))?;
    tidemark_log::envelope::check_subject(subject_id)
        .map_err(|e| invalid("subject_id", format!("subject_id: {e}")))?;
    Ok(())
}

/// One cursor (zero state when it does not exist), or all cursors of a consumer.
#[utoipa::path(
    get, path = "/v1/cursors", tag = "cursors", params(CursorsQuery),
    responses(
        (status = 200, description = "`{\"cursors\": [...]}`; one item when stream_name is given", body = CursorsPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn get(
    State(st): State<AppState>,
    q: Result<Query<CursorsQuery>, QueryRejection>,
) -> Result<Json<CursorsPage>, ApiError> {
    let Query(q) = q.map_err(|r| ApiError::invalid_query(r.body_text()))?;
    let log = st.log.clone();
    let rows = match q.stream_name {
        Some(stream) => {
            let subject = q.subject_id.unwrap_or_default();
            check_key(&q.consumer_id, &stream, &subject)
                .map_err(|e| ApiError::invalid_query(e.problem.detail.clone()))?;
            vec![blocking(move || read::cursor(log.db(), &q.consumer_id, &stream, &subject)).await?]
        }
        None => {
            check_text("consumer_id", &q.consumer_id, 160)
                .map_err(|e| ApiError::invalid_query(e.problem.detail.clone()))?;
            blocking(move || read::cursors(log.db(), Some(&q.consumer_id), 10_000)).await?
        }
    };
    Ok(Json(CursorsPage {
        cursors: rows.into_iter().map(CursorOut::from).collect(),
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AdvanceBody {
    pub consumer_id: String,
    pub stream_name: String,
    #[serde(default)]
    pub subject_id: String,
    pub last_sequence: u64,
    pub delivery_id: String,
    /// Compare-and-swap: advance only if the cursor is at this seq now.
    pub expected_sequence: Option<u64>,
}

/// Advance a cursor: forward only; the same seq with the same delivery_id is an idempotent
/// replay. Durable when answered.
#[utoipa::path(
    post, path = "/v1/cursors/advance", tag = "cursors",
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
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CursorOut>, ApiError> {
    let b: AdvanceBody = json_body(&headers, body)?;
    check_key(&b.consumer_id, &b.stream_name, &b.subject_id)?;
    check_text("delivery_id", &b.delivery_id, 256)?;
    if b.last_sequence == 0 || b.last_sequence > st.log.head() {
        return Err(invalid(
            "last_sequence",
            format!(
                "last_sequence must be from 1 to the log head ({})",
                st.log.head()
            ),
        ));
    }
    let a = Advance {
        consumer_id: b.consumer_id,
        stream_name: b.stream_name,
        subject_id: b.subject_id,
        last_sequence: b.last_sequence,
        delivery_id: b.delivery_id,
        expected_sequence: b.expected_sequence,
    };
    let (c, _) = st
        .log
        .command(true, move |txn, _| cursors::advance(txn, now_micros(), &a))
        .await?;
    metrics::counter!("tidemark_cursor_advances_total").increment(1);
    Ok(Json(c.into()))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetBody {
    pub consumer_id: String,
    pub stream_name: String,
    #[serde(default)]
    pub subject_id: String,
    /// The new position (may be lower: reset is the only way down).
    pub last_sequence: u64,
    /// Why; required, recorded in the `cursor.reset` event.
    pub reason: String,
}

/// Operator: move a cursor to any position, with a reason recorded as an event.
#[utoipa::path(
    post, path = "/v1/cursors/reset", tag = "cursors",
    request_body(content = ResetBody, content_type = "application/json"),
    responses(
        (status = 200, body = CursorOut),
        (status = 422, description = "Empty reason or position past the head", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all)]
pub async fn reset(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CursorOut>, ApiError> {
    let b: ResetBody = json_body(&headers, body)?;
    check_key(&b.consumer_id, &b.stream_name, &b.subject_id)?;
    if b.reason.trim().is_empty() {
        return Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "reason_required",
            "a cursor reset needs a non-empty reason",
        )
        .at(0, Some("reason")));
    }
    check_text("reason", &b.reason, 4096)?;
    if b.last_sequence > st.log.head() {
        return Err(invalid(
            "last_sequence",
            format!("last_sequence is past the log head ({})", st.log.head()),
        ));
    }
    let (c, _) = st
        .log
        .command(true, move |txn, _| {
            cursors::reset(
                txn,
                now_micros(),
                &b.consumer_id,
                &b.stream_name,
                &b.subject_id,
                b.last_sequence,
                &b.reason,
            )
        })
        .await?;
    tracing::info!(consumer = %c.consumer_id, to = c.last_sequence, "cursor reset");
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
    /// Seconds since the cursor last moved (or since the oldest pending event when it never
    /// moved), 0 when it has nothing pending.
    pub lag_seconds: f64,
    /// Pending work and no progress for `outbox.stuck_after`.
    pub stalled: bool,
    pub last_error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LagPage {
    pub cursors: Vec<LagOut>,
    pub stalled: u64,
}

const LAG_CAP: u64 = 10_000;

/// Lag of one cursor (blocking).
fn lag_of(log: &Log, c: &Cursor, now_us: i64, stuck_after_ms: u64) -> Result<LagOut, String> {
    let mut after = c.last_sequence;
    let mut count = 0u64;
    let mut oldest: Option<i64> = None;
    let mut capped = false;
    loop {
        let page = log
            .read(&ReadQuery {
                after,
                limit: 1000,
                stream: Some(c.stream_name.clone()),
                subject: (!c.subject_id.is_empty()).then(|| c.subject_id.clone()),
                ..ReadQuery::default()
            })
            .map_err(|e| e.to_string())?;
        if oldest.is_none() {
            oldest = page.events.first().map(|e| e.time_us);
        }
        count += page.events.len() as u64;
        if count >= LAG_CAP {
            capped = true;
            break;
        }
        if page.next_after <= after || page.next_after >= page.head {
            break;
        }
        after = page.next_after;
    }
    let since = c.updated_at_us.or(oldest).unwrap_or(now_us);
    let lag_seconds = if count > 0 {
        (now_us - since).max(0) as f64 / 1e6
    } else {
        0.0
    };
    Ok(LagOut {
        consumer_id: c.consumer_id.clone(),
        stream_name: c.stream_name.clone(),
        subject_id: c.subject_id.clone(),
        last_sequence: c.last_sequence,
        lag_events: count.min(LAG_CAP),
        lag_capped: capped,
        lag_seconds,
        stalled: count > 0 && lag_seconds * 1000.0 >= stuck_after_ms as f64,
        last_error: c.last_error.clone(),
    })
}

/// Every cursor (and every active subscription's cursor, zero or not) with its lag.
pub(crate) async fn compute_lag(st: &AppState) -> Result<Vec<LagOut>, ApiError> {
    let log = st.log.clone();
    let stuck_after = st.routing.stuck_after_ms;
    blocking(move || {
        let mut all = read::cursors(log.db(), None, 100_000)?;
        let known: std::collections::HashSet<(String, String, String)> = all
            .iter()
            .map(|c| {
                (
                    c.consumer_id.clone(),
                    c.stream_name.clone(),
                    c.subject_id.clone(),
                )
            })
            .collect();
        for sub in read::all_active_subscriptions(log.db())? {
            let consumer = tidemark_projections::bridges::consumer_id(&sub.subscription_id);
            let key = (consumer, "task_events".to_owned(), sub.target.task_id);
            if !known.contains(&key) {
                all.push(Cursor::zero(&key.0, &key.1, &key.2));
            }
        }
        let now = now_micros();
        all.iter()
            .map(|c| lag_of(&log, c, now, stuck_after))
            .collect()
    })
    .await
}

/// Every cursor's lag in events and seconds; stalled ones flagged.
#[utoipa::path(
    get, path = "/v1/consumers/lag", tag = "cursors",
    responses((status = 200, body = LagPage)),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn lag(State(st): State<AppState>) -> Result<Response, ApiError> {
    let cursors = compute_lag(&st).await?;
    let stalled = cursors.iter().filter(|c| c.stalled).count() as u64;
    Ok(Json(LagPage { cursors, stalled }).into_response())
}
