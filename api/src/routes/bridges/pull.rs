//! A bridge's delivery endpoints: pull (with long-poll), ack (one or many), nack.

use crate::request::Bounded;
use crate::state::Api;
use std::time::Duration;
use tidemark_engine::CommandError;

use axum::Json;
use axum::extract::Path;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_consumers::bridge;
use tidemark_projections::bridges::Subscription;
use tidemark_projections::ids::SubscriptionId;
use tidemark_projections::names::{Stream, ids};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::Params;
use crate::request::{
    BridgeId, PathId, Text, Validate, ValidatedJson, check_count, check_text, path_id,
};
use crate::routes::blocking;
use crate::routes::cursors::CursorOut;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PullQuery {
    /// Long-poll: wait up to this long (0–30000 ms, default 0) for a delivery.
    #[param(value_type = Option<u64>, minimum = 0, maximum = 30000)]
    pub wait_ms: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PullPage {
    /// One envelope per pull subscription of the bridge that has a delivery pending.
    #[schema(value_type = Vec<Object>)]
    pub deliveries: Vec<Value>,
}

/// Pending envelopes of the bridge's pull subscriptions; with `wait_ms`, waits for one.
#[utoipa::path(
    get, path = "/v1/bridges/{bridge_id}/deliveries", operation_id = "pullBridgeDeliveries", tag = "bridges",
    params(("bridge_id" = String, Path), PullQuery),
    responses(
        (status = 200, body = PullPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(bridge = %bridge_id))]
pub async fn pull(
    st: Api,
    PathId(bridge_id): PathId<BridgeId>,
    Params(q): Params<PullQuery>,
) -> Result<Json<PullPage>, ApiError> {
    let max = st.config.server.max_wait_ms;
    let wait_ms =
        match q.wait_ms.as_deref() {
            None => 0,
            Some(v) => v.parse::<u64>().ok().filter(|n| *n <= max).ok_or_else(|| {
                ApiError::invalid_query(format!("wait_ms must be from 0 to {max}"))
            })?,
        };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    // Woken by the notifier when one of this bridge's subscriptions may have changed; the
    // answer is always computed from the log.
    let mut wake = st.shard().pull_hub.subscribe(st.tenant(), &bridge_id);
    // The first answer reflects every commit made before the request (read your writes): wait
    // briefly for the notifier to have looked at them, else ask the log. Later answers come
    // after a wake-up for this bridge, so the notifier's view is current.
    let mut fresh = st
        .shard()
        .pull_hub
        .caught_up(st.engine().head(), Duration::from_millis(250))
        .await;
    loop {
        wake.borrow_and_update();
        let cached = if fresh {
            st.shard().pull_hub.pending(st.tenant(), &bridge_id)
        } else {
            None
        };
        fresh = true;
        let found = match cached {
            Some(found) => found,
            // The notifier has not looked at every subscription since the start: ask the log.
            None => {
                let engine = st.engine().clone();
                let id = bridge_id.clone();
                blocking(move || bridge::pending_for_bridge(&engine, &id)).await?
            }
        };
        if !found.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(Json(PullPage { deliveries: found }));
        }
        tokio::select! {
            changed = wake.changed() => if changed.is_err() { return Ok(Json(PullPage { deliveries: found })) },
            _ = tokio::time::sleep_until(deadline) => {},
            _ = st.shutdown.cancelled() => return Ok(Json(PullPage { deliveries: found })),
            // A move of the tenant is fencing it: answer now, the next poll goes where it lives.
            () = st.until_moved() => return Ok(Json(PullPage { deliveries: found })),
        }
    }
}

/// The subscription a delivery id names, checked to belong to `bridge_id`.
async fn delivery_target(
    st: &Api,
    bridge_id: String,
    delivery_id: &str,
) -> Result<(Subscription, u64), ApiError> {
    let bridge_id: BridgeId = path_id(bridge_id)?;
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "delivery_not_found",
            format!("no delivery {delivery_id:?}"),
        )
    };
    let (sub_id, seq) = ids::parse_bridge_delivery(delivery_id).ok_or_else(not_found)?;
    let engine = st.engine().clone();
    let id = SubscriptionId::new(sub_id);
    let sub = blocking(move || engine.read().subscription(&id))
        .await?
        .filter(|s| s.active)
        .ok_or_else(not_found)?;
    if sub.target.bridge_id != bridge_id {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "foreign_delivery",
            format!("{delivery_id:?} belongs to another bridge"),
        ));
    }
    Ok((sub, seq))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AckOut {
    pub delivery_id: String,
    pub cursor: CursorOut,
}

/// Confirm a delivery: the subscription's cursor advances to its seq (durable when answered).
#[utoipa::path(
    post, path = "/v1/bridges/{bridge_id}/deliveries/{delivery_id}/ack", operation_id = "ackBridgeDelivery", tag = "bridges",
    params(("bridge_id" = String, Path), ("delivery_id" = String, Path)),
    responses(
        (status = 200, body = AckOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another bridge's delivery, or no longer deliverable, or behind the cursor", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(bridge = %bridge_id, delivery = %delivery_id))]
pub async fn ack(
    st: Api,
    Path((bridge_id, delivery_id)): Path<(String, String)>,
) -> Result<Json<AckOut>, ApiError> {
    let bridge_id: BridgeId = path_id(bridge_id)?;
    let r = ack_ids(&st, &bridge_id, vec![delivery_id])
        .await?
        .pop()
        .ok_or_else(|| ApiError::internal("ack", "no result for the one id"))?;
    match r.cursor {
        Some(cursor) if r.status == 200 => Ok(Json(AckOut {
            delivery_id: r.delivery_id,
            cursor,
        })),
        _ => Err(ApiError::new(
            StatusCode::from_u16(r.status).unwrap_or(StatusCode::CONFLICT),
            r.code.as_deref().unwrap_or("conflict"),
            r.detail.unwrap_or_default(),
        )),
    }
}

/// The schema of a delivery id as a bridge received it: 1–300 printable characters.
pub enum BridgeDeliveryId {}

impl utoipa::PartialSchema for BridgeDeliveryId {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::openapi::printable_string(1, 300).into()
    }
}

impl ToSchema for BridgeDeliveryId {}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckManyBody {
    /// 1–1000 delivery ids of this bridge, in the order they were received.
    #[schema(min_items = 1, max_items = 1000, value_type = Vec<BridgeDeliveryId>)]
    pub delivery_ids: Vec<String>,
}

impl Validate for AckManyBody {
    fn validate(&self) -> Result<(), ApiError> {
        check_count("delivery_ids", self.delivery_ids.len(), "ids")?;
        for id in &self.delivery_ids {
            check_text("delivery_ids", id, 300)?;
        }
        Ok(())
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AckResult {
    pub delivery_id: String,
    /// 200, 404 or 409, as the single ack would answer.
    pub status: u16,
    pub cursor: Option<CursorOut>,
    pub code: Option<String>,
    pub detail: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AckManyOut {
    /// One result per delivery id, in request order.
    pub results: Vec<AckResult>,
}

/// An ack refused as the single-id endpoint would answer it.
fn refusal(delivery_id: &str, e: CommandError) -> AckResult {
    let e = ApiError::from(e);
    AckResult {
        delivery_id: delivery_id.to_owned(),
        status: e.status.as_u16(),
        cursor: None,
        code: Some(e.problem.code.clone()),
        detail: Some(e.problem.detail.clone()),
    }
}

/// Confirm many deliveries of the bridge in one durable command (the batch form of
/// `…/{delivery_id}/ack`). Per subscription, the ids must follow its pending deliveries in
/// order (nothing deliverable is skipped); each id is answered on its own.
#[utoipa::path(
    post, path = "/v1/bridges/{bridge_id}/deliveries/ack", operation_id = "ackBridgeDeliveries", tag = "bridges",
    params(("bridge_id" = String, Path)),
    request_body(content = AckManyBody, content_type = "application/json"),
    responses(
        (status = 200, body = AckManyOut),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(bridge = %bridge_id, items))]
pub async fn ack_many(
    st: Api,
    bridge_id: PathId<BridgeId>,
    ValidatedJson(body): ValidatedJson<AckManyBody>,
) -> Result<Json<AckManyOut>, ApiError> {
    let PathId(bridge_id) = bridge_id;
    tracing::Span::current().record("items", body.delivery_ids.len());
    let results = ack_ids(&st, &bridge_id, body.delivery_ids).await?;
    Ok(Json(AckManyOut { results }))
}

/// Judge and confirm `ids` (one durable command for all the confirmations); one result per
/// id, in order.
async fn ack_ids(
    st: &Api,
    bridge_id: &BridgeId,
    ids: Vec<String>,
) -> Result<Vec<AckResult>, ApiError> {
    let engine = st.engine().clone();
    let (bridge, for_judge) = (bridge_id.clone(), ids.clone());
    let judged = blocking(move || bridge::plan_acks(&engine, &bridge, &for_judge)).await?;
    let mut to_confirm = Vec::new();
    let mut results: Vec<Option<AckResult>> = Vec::with_capacity(judged.len());
    for j in judged {
        match j {
            Ok(c) => {
                to_confirm.push(c);
                results.push(None);
            }
            Err(e) => results.push(Some(refusal(&ids[results.len()], e))),
        }
    }
    if !to_confirm.is_empty() {
        let confirmed = bridge::confirm_many(st.engine(), to_confirm.clone()).await?;
        let open = results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_none())
            .map(|(i, _)| i)
            .collect::<Vec<_>>();
        for ((slot, c), r) in open.into_iter().zip(to_confirm).zip(confirmed) {
            let id = &ids[slot];
            results[slot] = Some(match r {
                Ok(cursor) => {
                    st.shard()
                        .pull_hub
                        .acked(st.tenant(), bridge_id, &c.subscription_id, c.seq);
                    AckResult {
                        delivery_id: id.clone(),
                        status: 200,
                        cursor: Some(cursor.into()),
                        code: None,
                        detail: None,
                    }
                }
                Err(e) => refusal(id, e),
            });
        }
    }
    Ok(results.into_iter().flatten().collect())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NackBody {
    /// Why the bridge could not deliver it (kept as the cursor's last_error, ≤ 512 chars).
    #[schema(inline)]
    pub error: Text<4096>,
}

impl Validate for NackBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.error.check_at("error")
    }
}

/// Report a delivery the bridge could not make: recorded as the cursor's `last_error`; the
/// cursor does not move and the delivery stays pending.
#[utoipa::path(
    post, path = "/v1/bridges/{bridge_id}/deliveries/{delivery_id}/nack", operation_id = "nackBridgeDelivery", tag = "bridges",
    params(("bridge_id" = String, Path), ("delivery_id" = String, Path)),
    request_body(content = NackBody, content_type = "application/json"),
    responses(
        (status = 200, body = AckOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(bridge = %bridge_id, delivery = %delivery_id))]
pub async fn nack(
    st: Api,
    Path((bridge_id, delivery_id)): Path<(String, String)>,
    ValidatedJson(body): ValidatedJson<NackBody>,
) -> Result<Json<AckOut>, ApiError> {
    let (sub, seq) = delivery_target(&st, bridge_id.clone(), &delivery_id).await?;
    let engine = st.engine().clone();
    let s2 = sub.clone();
    let scan = blocking(move || bridge::scan(&engine, &s2, false)).await?;
    if scan.deliver.as_ref().map(|e| e.seq) != Some(seq) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_pending",
            format!("{delivery_id:?} is not the subscription's pending delivery"),
        ));
    }
    bridge::record_failure(st.engine(), &sub, &body.error, None).await?;
    metrics::counter!("tidemark_bridge_nacks_total").increment(1);
    let engine = st.engine().clone();
    let (consumer, task) = (
        ids::bridge_consumer(sub.subscription_id.as_str()),
        sub.target.task_id.clone(),
    );
    let c = blocking(move || {
        engine
            .read()
            .cursor(&consumer, Stream::TaskEvents.as_str(), task.as_str())
    })
    .await?;
    Ok(Json(AckOut {
        delivery_id,
        cursor: c.into(),
    }))
}
