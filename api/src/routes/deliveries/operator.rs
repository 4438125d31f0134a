//! The operator's endpoints on parked deliveries: retry, discard.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde::Deserialize;
use tidemark_engine::commands::outbox::{Operator, OperatorAction};
use utoipa::ToSchema;

use super::{DeliveryOut, check_id, check_text, json_body};
use crate::error::{ApiError, Problem};
use crate::request::body_rejection;
use crate::state::AppState;

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorBody {
    /// Ignored (kept so that older clients are not refused): the action records the calling
    /// token's name as `by`, `null` in open mode (section 8).
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$"
    )]
    pub by: Option<String>,
    #[schema(
        min_length = 1,
        max_length = 4096,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$"
    )]
    pub reason: Option<String>,
}

async fn operator_action(
    st: AppState,
    id: String,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    action: OperatorAction,
) -> Result<Json<DeliveryOut>, ApiError> {
    check_id(&id)?;
    let raw = body.map_err(body_rejection)?;
    // No body, `null` or an object: the body is optional.
    let b: OperatorBody = if raw.is_empty() {
        OperatorBody::default()
    } else {
        json_body::<Option<OperatorBody>>(&headers, Ok(raw))?.unwrap_or_default()
    };
    // The action records the token that made it (section 8), `null` in open mode; a `by`
    // in the body is checked but never recorded.
    if let Some(x) = &b.by {
        check_text("by", x, 128)?;
    }
    let by = crate::routes::caller(&st, &headers);
    if let Some(r) = &b.reason {
        check_text("reason", r, 4096)?;
    }
    let (row, _) = st
        .engine
        .execute(Operator {
            id,
            action,
            by,
            reason: b.reason,
        })
        .await?;
    metrics::counter!("tidemark_deliveries_operator_total", "action" => action.kind()).increment(1);
    Ok(Json(row.into()))
}

/// Operator: put a parked delivery back in the queue with its attempts reset.
#[utoipa::path(
    post, path = "/v1/deliveries/{id}/retry", operation_id = "retryDelivery", tag = "deliveries",
    params(("id" = String, Path, description = "Delivery id")),
    request_body(content = Option<OperatorBody>, content_type = "application/json"),
    responses(
        (status = 200, body = DeliveryOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not parked", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn retry(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DeliveryOut>, ApiError> {
    operator_action(st, id, headers, body, OperatorAction::Retry).await
}

/// Operator: give up on a parked delivery.
#[utoipa::path(
    post, path = "/v1/deliveries/{id}/discard", operation_id = "discardDelivery", tag = "deliveries",
    params(("id" = String, Path, description = "Delivery id")),
    request_body(content = Option<OperatorBody>, content_type = "application/json"),
    responses(
        (status = 200, body = DeliveryOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not parked", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn discard(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DeliveryOut>, ApiError> {
    operator_action(st, id, headers, body, OperatorAction::Discard).await
}
