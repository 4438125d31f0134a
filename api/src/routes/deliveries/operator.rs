//! The operator's endpoints on parked deliveries: retry, discard.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use serde::Deserialize;
use tidemark_engine::commands::outbox::{Operator, OperatorAction};
use utoipa::ToSchema;

use super::{DeliveryId, DeliveryOut};
use crate::error::{ApiError, Problem};
use crate::request::{OptionalJson, PathId, Text, Validate};
use crate::state::AppState;

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorBody {
    /// Ignored (kept so that older clients are not refused): the action records the calling
    /// token's name as `by`, `null` in open mode (section 8).
    #[schema(inline)]
    pub by: Option<Text<128>>,
    #[schema(inline)]
    pub reason: Option<Text<4096>>,
}

impl Validate for OperatorBody {}

async fn operator_action(
    st: AppState,
    id: PathId<DeliveryId>,
    headers: HeaderMap,
    b: OperatorBody,
    action: OperatorAction,
) -> Result<Json<DeliveryOut>, ApiError> {
    // The action records the token that made it (section 8), `null` in open mode; a `by`
    // in the body is checked but never recorded.
    let by = crate::routes::caller(&st, &headers);
    let (row, _) = st
        .engine
        .execute(Operator {
            id: id.0,
            action,
            by,
            reason: b.reason.map(Text::into_string),
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
    id: PathId<DeliveryId>,
    headers: HeaderMap,
    OptionalJson(body): OptionalJson<OperatorBody>,
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
    id: PathId<DeliveryId>,
    headers: HeaderMap,
    OptionalJson(body): OptionalJson<OperatorBody>,
) -> Result<Json<DeliveryOut>, ApiError> {
    operator_action(st, id, headers, body, OperatorAction::Discard).await
}
