//! The lease holder's endpoints: claim, complete (one or many), fail, extend.

use crate::request::Bounded;
use crate::request::OneOf;
use crate::state::Api;
use axum::Json;
use serde::{Deserialize, Serialize};
use tidemark_engine::RejectKind;
use tidemark_engine::commands::outbox::{
    Claim, Complete, CompleteOne, Completed, Extend, Fail, Failure,
};
use tidemark_log::time::now_micros;
use tidemark_projections::names::Sink;
use utoipa::ToSchema;

use super::{
    DeliveriesPage, DeliveryId, DeliveryOut, invalid, lease_ms, settings, stuck_cut,
    with_provenance,
};
use crate::error::{ApiError, Problem};
use crate::request::{PathId, Text, Validate, ValidatedJson, check_count};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    /// The sink to claim for: `app` (desktop deliveries), `email` or `webhook`.
    #[schema(inline, value_type = crate::openapi::SinkName)]
    pub sink: OneOf<Sink>,
    /// Who holds the leases; only this owner may complete, fail or extend them.
    #[schema(inline)]
    pub owner: Text<128>,
    /// At most this many (1–1000; default `retry.batch_size`).
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Lease length (100–3600000 ms; default `retry.lease_ttl`).
    #[schema(minimum = 100, maximum = 3600000)]
    pub lease_ms: Option<u64>,
}

/// Lease due deliveries of a sink, oldest due first.
#[utoipa::path(
    post, path = "/v1/deliveries/claim", operation_id = "claimDeliveries", tag = "deliveries",
    request_body(content = ClaimBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The deliveries now leased to `owner` (possibly none), each with its notification's `type`, `type_data` and `source`", body = DeliveriesPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
        (status = 429, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(sink, claimed))]
pub async fn claim(
    st: Api,
    ValidatedJson(b): ValidatedJson<ClaimBody>,
) -> Result<Json<DeliveriesPage>, ApiError> {
    let s = settings(&st);
    let limit = b.limit.unwrap_or(s.retry.batch_size);
    if !(1..=1000).contains(&limit) {
        return Err(invalid("limit", "limit must be from 1 to 1000"));
    }
    let lease = lease_ms(b.lease_ms, s)?;
    let sink = b.sink.get();
    tracing::Span::current().record("sink", sink.as_str());
    let owner = b.owner.into_string();
    let (rows, receipt) = st
        .engine()
        .execute(Claim {
            sink,
            owner,
            limit: limit as usize,
            lease_ms: lease,
            share: st.engine().leases().share(),
        })
        .await?;
    tracing::Span::current().record("claimed", rows.len());
    metrics::counter!("tidemark_deliveries_leased_total", "sink" => sink.as_str(), "tenant" => tidemark_engine::labels::tenant_label(st.tenant()))
        .increment(rows.len() as u64);
    // A worker delivers from the claim alone: each row with its notification's `type_data` and
    // `source` (section 2). The decider folded the notification of every claimed row before
    // it decided the claim; readers see it once the models store has committed it (at once
    // when a reader waits, and nearly always long before).
    let cut = stuck_cut(now_micros(), s.stuck_after_ms);
    // The claimed rows' notifications are nearly always in the file already: read them here
    // (point reads of cached pages), not through the blocking pool, which would cost every
    // claim two more thread wake-ups; only a claim of rows routed a moment ago waits there.
    let seen = rows.iter().map(|d| d.notification_seq).max().unwrap_or(0);
    let deliveries = if st.engine().read().folded_now(seen) {
        with_provenance(st.engine().read(), rows, cut)
            .map_err(|e| ApiError::query("read failed", &e))?
    } else {
        let engine = st.engine().clone();
        crate::routes::blocking(move || {
            engine.read().folded_to(seen)?;
            with_provenance(engine.read(), rows, cut)
        })
        .await?
    };
    Ok(Json(DeliveriesPage {
        deliveries,
        next_after: None,
        next_before: None,
        // The claim decided at the head its own commit made.
        as_of_seq: receipt.last_seq,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBody {
    #[schema(inline)]
    pub owner: Text<128>,
    /// The sink's own id for what it delivered.
    #[schema(inline)]
    pub external_id: Option<Text<256>>,
}

/// The lease owner reports the delivery sent (repeating it answers the same row).
#[utoipa::path(
    post, path = "/v1/deliveries/{id}/complete", operation_id = "completeDelivery", tag = "deliveries",
    params(("id" = String, Path, description = "Delivery id")),
    request_body(content = CompleteBody, content_type = "application/json"),
    responses(
        (status = 200, body = DeliveryOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not leased, or leased by another owner", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn complete(
    st: Api,
    id: PathId<DeliveryId>,
    ValidatedJson(b): ValidatedJson<CompleteBody>,
) -> Result<Json<DeliveryOut>, ApiError> {
    let row = st
        .engine()
        .execute(CompleteOne {
            id: id.0,
            owner: b.owner.into_string(),
            external_id: b.external_id.map(Text::into_string),
            resolved_targets: Vec::new(),
        })
        .await?
        .0
        .into_result()?;
    metrics::counter!("tidemark_deliveries_sent_total", "sink" => row.sink_name(), "tenant" => tidemark_engine::labels::tenant_label(st.tenant())).increment(1);
    Ok(Json(row.into()))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteItem {
    #[schema(inline)]
    pub id: Text<128>,
    #[schema(inline)]
    pub external_id: Option<Text<256>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteManyBody {
    #[schema(inline)]
    pub owner: Text<128>,
    /// 1–1000 deliveries leased by `owner`.
    #[schema(min_items = 1, max_items = 1000)]
    pub deliveries: Vec<CompleteItem>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompleteResult {
    #[schema(value_type = String)]
    pub id: DeliveryId,
    /// 200 (sent), 404 or 409, as `POST /v1/deliveries/{id}/complete` would answer.
    pub status: u16,
    /// The row when sent.
    pub delivery: Option<DeliveryOut>,
    /// The problem code when refused (`delivery_not_found`, `illegal_transition`,
    /// `not_lease_owner`).
    pub code: Option<String>,
    pub detail: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompleteManyOut {
    /// One result per requested delivery, in request order.
    pub results: Vec<CompleteResult>,
}

/// The lease owner reports many deliveries sent in one durable command (the batch form of
/// `…/{id}/complete`, for a claimer that claimed with a `limit` > 1). Each item succeeds or is
/// refused on its own; refused items change nothing.
#[utoipa::path(
    post, path = "/v1/deliveries/complete", operation_id = "completeDeliveries", tag = "deliveries",
    request_body(content = CompleteManyBody, content_type = "application/json"),
    responses(
        (status = 200, body = CompleteManyOut),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(items))]
pub async fn complete_many(
    st: Api,
    ValidatedJson(b): ValidatedJson<CompleteManyBody>,
) -> Result<Json<CompleteManyOut>, ApiError> {
    tracing::Span::current().record("items", b.deliveries.len());
    let items: Vec<(DeliveryId, Option<String>)> = b
        .deliveries
        .into_iter()
        .map(|d| {
            (
                DeliveryId::new(d.id.into_string()),
                d.external_id.map(Text::into_string),
            )
        })
        .collect();
    let ids: Vec<DeliveryId> = items.iter().map(|(id, _)| id.clone()).collect();
    let owner = b.owner.into_string();
    let (results, _) = st
        .engine()
        .execute(Complete {
            owner,
            items,
            resolved_targets: Vec::new(),
        })
        .await?;
    let mut out = Vec::with_capacity(results.len());
    for (id, r) in ids.into_iter().zip(results) {
        out.push(match r {
            Completed::Sent(row) => {
                metrics::counter!("tidemark_deliveries_sent_total", "sink" => row.sink_name(), "tenant" => tidemark_engine::labels::tenant_label(st.tenant()))
                    .increment(1);
                CompleteResult {
                    id,
                    status: 200,
                    delivery: Some((*row).into()),
                    code: None,
                    detail: None,
                }
            }
            Completed::Refused { code, detail } => CompleteResult {
                id,
                status: if code.kind() == RejectKind::NotFound {
                    404
                } else {
                    409
                },
                delivery: None,
                code: Some(code.code().to_owned()),
                detail: Some(detail),
            },
        });
    }
    Ok(Json(CompleteManyOut { results: out }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailBody {
    #[schema(inline)]
    pub owner: Text<128>,
    /// Stable code of the failure, e.g. `timeout`.
    #[schema(inline)]
    pub error_code: Text<64>,
    #[schema(max_length = 4096)]
    pub error: Option<String>,
    /// Default true; false parks the delivery at once.
    pub retryable: Option<bool>,
    /// Retry after this long instead of the backoff (capped at 1 h). Read as a JSON number:
    /// a large integer written as a float (`2037253834360445.0`) may parse a fraction off
    /// (serde_json's fast float parsing) and is still the integer it is.
    #[schema(value_type = Option<u64>)]
    pub retry_after_ms: Option<f64>,
}

impl Validate for ClaimBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.owner.check_at("owner")?;
        self.sink.check_at("sink")
    }
}

impl Validate for CompleteBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.owner.check_at("owner")?;
        self.external_id.check_at("external_id")
    }
}

impl Validate for CompleteManyBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.owner.check_at("owner")?;
        for d in &self.deliveries {
            d.id.check_at("deliveries.id")?;
            d.external_id.check_at("deliveries.external_id")?;
        }
        check_count("deliveries", self.deliveries.len(), "items")
    }
}

impl Validate for FailBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.owner.check_at("owner")?;
        self.error_code.check_at("error_code")?;
        if self
            .error
            .as_ref()
            .is_some_and(|e| e.chars().count() > 4096)
        {
            return Err(invalid("error", "error must be at most 4096 characters"));
        }
        Ok(())
    }
}

impl Validate for ExtendBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.owner.check_at("owner")
    }
}

/// `retry_after_ms` as milliseconds, capped at an hour: a non-negative integer (beyond 2^53,
/// where a float cannot tell, any value).
fn retry_after(v: Option<f64>) -> Result<Option<u64>, ApiError> {
    const HOUR_MS: f64 = 3_600_000.0;
    match v {
        None => Ok(None),
        Some(x) if x >= 0.0 && (x.fract() == 0.0 || x > 9_007_199_254_740_992.0) => {
            Ok(Some(x.min(HOUR_MS) as u64))
        }
        Some(_) => Err(invalid(
            "retry_after_ms",
            "retry_after_ms must be a non-negative integer",
        )),
    }
}

/// The lease owner reports a failed attempt: retry later with backoff, or parked.
#[utoipa::path(
    post, path = "/v1/deliveries/{id}/fail", operation_id = "failDelivery", tag = "deliveries",
    params(("id" = String, Path, description = "Delivery id")),
    request_body(content = FailBody, content_type = "application/json"),
    responses(
        (status = 200, body = DeliveryOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn fail(
    st: Api,
    id: PathId<DeliveryId>,
    ValidatedJson(b): ValidatedJson<FailBody>,
) -> Result<Json<DeliveryOut>, ApiError> {
    let error = b.error.unwrap_or_default();
    let f = Failure {
        error_code: b.error_code.into_string(),
        error,
        retryable: b.retryable.unwrap_or(true),
        retry_after_ms: retry_after(b.retry_after_ms)?,
    };
    let (row, _) = st
        .engine()
        .execute(Fail {
            id: id.0,
            owner: b.owner.into_string(),
            failure: f,
        })
        .await?;
    metrics::counter!("tidemark_deliveries_failed_total", "sink" => row.sink_name(), "tenant" => tidemark_engine::labels::tenant_label(st.tenant()), "parked" => (row.status == tidemark_projections::names::DeliveryStatus::Parked).to_string()).increment(1);
    Ok(Json(row.into()))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    #[schema(inline)]
    pub owner: Text<128>,
    /// New lease length from now (default `retry.lease_ttl`).
    #[schema(minimum = 100, maximum = 3600000)]
    pub lease_ms: Option<u64>,
}

/// The lease owner extends its lease (heartbeat).
#[utoipa::path(
    post, path = "/v1/deliveries/{id}/extend", operation_id = "extendDeliveryLease", tag = "deliveries",
    params(("id" = String, Path, description = "Delivery id")),
    request_body(content = ExtendBody, content_type = "application/json"),
    responses(
        (status = 200, body = DeliveryOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not the owner, not leased, or the lease already expired", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn extend(
    st: Api,
    id: PathId<DeliveryId>,
    ValidatedJson(b): ValidatedJson<ExtendBody>,
) -> Result<Json<DeliveryOut>, ApiError> {
    let lease = lease_ms(b.lease_ms, settings(&st))?;
    let (row, _) = st
        .engine()
        .execute(Extend {
            id: id.0,
            owner: b.owner.into_string(),
            lease_ms: lease,
        })
        .await?;
    Ok(Json(row.into()))
}
