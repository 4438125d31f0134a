//! The operator's endpoints on parked deliveries: retry, discard.

use crate::request::Bounded;
use crate::state::Api;
use axum::Json;
use axum::http::HeaderMap;
use serde::Deserialize;
use tidemark_engine::commands::outbox::{Operator, OperatorAction, RECOVER_MAX, Recover};
use utoipa::ToSchema;

use super::{DeliveryId, DeliveryOut};
use crate::error::{ApiError, Problem};
use crate::request::{OptionalJson, PathId, Reason, Text, Validate, ValidatedJson};

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

impl Validate for OperatorBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.by.check_at("by")?;
        self.reason.check_at("reason")
    }
}

async fn operator_action(
    st: Api,
    id: PathId<DeliveryId>,
    headers: HeaderMap,
    reason: Option<String>,
    action: OperatorAction,
) -> Result<Json<DeliveryOut>, ApiError> {
    // The action records the token that made it (section 8), `null` in open mode; a `by`
    // in the body is checked but never recorded.
    let by = crate::routes::caller(&st, &headers);
    let (row, _) = st
        .engine()
        .execute(Operator {
            id: id.0,
            action,
            by,
            reason,
        })
        .await?;
    metrics::counter!("tidemark_deliveries_operator_total", "action" => action.kind()).increment(1);
    Ok(Json(row.into()))
}

/// `POST /v1/deliveries/{id}/retry` and `…/discard`: a parked delivery, an optional reason.
macro_rules! parked_handler {
    ($(#[doc = $doc:literal])* $name:ident, $path:literal, $operation:literal, $action:expr) => {
        $(#[doc = $doc])*
        #[utoipa::path(
            post, path = $path, operation_id = $operation, tag = "deliveries",
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
        pub async fn $name(
            st: Api,
            id: PathId<DeliveryId>,
            headers: HeaderMap,
            OptionalJson(body): OptionalJson<OperatorBody>,
        ) -> Result<Json<DeliveryOut>, ApiError> {
            let reason = body.reason.map(Text::into_string);
            operator_action(st, id, headers, reason, $action).await
        }
    };
}

parked_handler!(
    /// Operator: put a parked delivery back in the queue with its attempts reset.
    retry, "/v1/deliveries/{id}/retry", "retryDelivery", OperatorAction::Retry
);
parked_handler!(
    /// Operator: give up on a parked delivery.
    discard, "/v1/deliveries/{id}/discard", "discardDelivery", OperatorAction::Discard
);

/// `POST /v1/deliveries/{id}/resend`: why (required).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResendBody {
    /// Why; required, recorded in the event.
    #[schema(inline)]
    pub reason: Reason,
}

impl Validate for ResendBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.reason.check("a resend")
    }
}

/// Operator: send a sent delivery again (section 17): back in the queue as a new attempt on
/// its timeline (`delivery.resent`), with the same id, so a receiver sees the same
/// `webhook-id` / `Message-ID` and can drop it as a repeat.
#[utoipa::path(
    post, path = "/v1/deliveries/{id}/resend", operation_id = "resendDelivery", tag = "deliveries",
    params(("id" = String, Path, description = "Delivery id")),
    request_body(content = ResendBody, content_type = "application/json"),
    responses(
        (status = 200, body = DeliveryOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not sent", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "reason_required", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn resend(
    st: Api,
    id: PathId<DeliveryId>,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<ResendBody>,
) -> Result<Json<DeliveryOut>, ApiError> {
    let reason = Some(b.reason.into_string());
    operator_action(st, id, headers, reason, OperatorAction::Resend).await
}

/// `POST /v1/deliveries/recover`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecoverBody {
    /// The route whose parked deliveries are retried.
    #[schema(inline)]
    pub route: Text<128>,
    /// Only deliveries made at or after this time (RFC 3339).
    #[schema(format = DateTime)]
    pub since: String,
    /// Why; required, recorded on each `delivery.retried`.
    #[schema(inline)]
    pub reason: Reason,
}

impl Validate for RecoverBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.route.check_at("route")?;
        self.reason.check("a recover")?;
        if tidemark_log::time::parse_rfc3339_micros(&self.since).is_none() {
            return Err(super::invalid("since", "since must be an RFC 3339 time"));
        }
        Ok(())
    }
}

#[derive(Debug, serde::Serialize, ToSchema)]
pub struct Recovered {
    /// Parked deliveries put back in the queue (at most 10,000 per call).
    pub retried: usize,
    /// True when the bound was reached: call again for the rest.
    pub more: bool,
}

/// Operator: retry every parked delivery of a route made since a time (section 17), at most
/// 10,000 per call, each recorded as `delivery.retried` with the reason and `by`.
#[utoipa::path(
    post, path = "/v1/deliveries/recover", operation_id = "recoverDeliveries", tag = "deliveries",
    request_body(content = RecoverBody, content_type = "application/json"),
    responses(
        (status = 200, body = Recovered),
        (status = 422, description = "reason_required or invalid_field", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all, fields(route = %b.route.as_str()))]
pub async fn recover(
    st: Api,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<RecoverBody>,
) -> Result<Json<Recovered>, ApiError> {
    let since_us = tidemark_log::time::parse_rfc3339_micros(&b.since).unwrap_or(i64::MAX);
    let (retried, _) = st
        .engine()
        .execute(Recover {
            route: b.route.into_string(),
            since_us,
            reason: b.reason.into_string(),
            by: crate::routes::caller(&st, &headers),
        })
        .await?;
    metrics::counter!("tidemark_deliveries_operator_total", "action" => "recovered")
        .increment(retried as u64);
    Ok(Json(Recovered {
        retried,
        more: retried >= RECOVER_MAX,
    }))
}
