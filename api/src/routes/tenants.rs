//! The deployment's tenants (spec section 20): `GET /v1/tenants`, `GET /v1/tenants/{name}`,
//! and `POST /v1/tenants` / `DELETE /v1/tenants/{name}` (admin), recorded as `tenant.created`
//! / `tenant.removed` with the reason and who did it. Only the deployment's operators (a `*`
//! token) reach them (`tenancy`); a tenant's own resources are under
//! `/tenants/{name}/v1/…`.

use axum::Json;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use tidemark_engine::commands::tenants::SetTenant;
use tidemark_log::time::Micros;
use tidemark_projections::tenants::TenantRow;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::{Reason, Validate, ValidatedJson};
use crate::routes::{caller, read_model};
use crate::state::Api;

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantOut {
    pub name: String,
    /// The shard its events and models live in.
    pub shard: u32,
    pub reason: String,
    /// The token that created it (absent in open mode).
    pub by: Option<String>,
    #[schema(value_type = String)]
    pub created_at: Micros,
    pub created_seq: u64,
    /// Set once removed: its events stay in the log, its API answers `404 tenant_not_found`.
    pub removed: Option<RemovedOut>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RemovedOut {
    pub reason: String,
    pub by: Option<String>,
    #[schema(value_type = String)]
    pub at: Micros,
    pub seq: u64,
}

impl From<TenantRow> for TenantOut {
    fn from(r: TenantRow) -> Self {
        TenantOut {
            name: r.name,
            shard: r.shard,
            reason: r.reason,
            by: r.by,
            created_at: Micros(r.created_at_us),
            created_seq: r.created_seq,
            removed: r.removed.map(|d| RemovedOut {
                reason: d.reason,
                by: d.by,
                at: Micros(d.at_us),
                seq: d.seq,
            }),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantsPage {
    pub tenants: Vec<TenantOut>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantAnswer {
    #[serde(flatten)]
    pub tenant: TenantOut,
    pub as_of_seq: u64,
}

/// A tenant's name in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TenantName {
    /// The tenant's name: 1 to 32 of `a-z0-9_-`, starting with a letter.
    #[param(min_length = 1, max_length = 32, pattern = "^[a-z][a-z0-9_-]{0,31}$")]
    pub name: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantBody {
    /// The new tenant's name: 1 to 32 of `a-z0-9_-`, starting with a letter; never one used
    /// before.
    #[schema(min_length = 1, max_length = 32, pattern = "^[a-z][a-z0-9_-]{0,31}$")]
    pub name: String,
    /// Why; required, recorded in the event.
    #[schema(inline)]
    pub reason: Reason,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantDeleteBody {
    /// Why; required, recorded in the event.
    #[schema(inline)]
    pub reason: Reason,
}

fn invalid(detail: String) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_tenant", detail)
}

fn check_name(name: &str) -> Result<(), ApiError> {
    tidemark_log::check_tenant(name).map_err(|e| invalid(e.to_string()))?;
    if name == tidemark_log::DEFAULT_TENANT {
        return Err(invalid(
            "the default tenant always exists; it is not created or removed".into(),
        ));
    }
    Ok(())
}

impl Validate for TenantBody {
    fn validate(&self) -> Result<(), ApiError> {
        check_name(&self.name)?;
        self.reason.check("a tenant's creation")
    }
}

impl Validate for TenantDeleteBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.reason.check("a tenant's removal")
    }
}

/// The engine of the default tenant, whose model is the directory (only the deployment's
/// operators reach these routes: `tenancy`).
fn directory(st: &Api) -> &tidemark_engine::Engine {
    &st.shared().engine
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "tenant_not_found",
        format!("no tenant {name:?}"),
    )
}

/// Every tenant ever created (removed ones marked), by name.
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants", operation_id = "listTenants",
    responses((status = 200, body = TenantsPage)),
    security(("bearer" = ["operator"])))]
pub async fn list(st: Api) -> Result<Json<TenantsPage>, ApiError> {
    let (rows, as_of_seq) = read_model(directory(&st), 0, |q| q.tenants()).await?;
    Ok(Json(TenantsPage {
        tenants: rows.into_iter().map(TenantOut::from).collect(),
        as_of_seq,
    }))
}

/// One tenant.
#[utoipa::path(get, path = "/v1/tenants/{name}", tag = "tenants", operation_id = "getTenant",
    params(TenantName),
    responses(
        (status = 200, body = TenantAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"])))]
pub async fn show(
    st: Api,
    Path(TenantName { name }): Path<TenantName>,
) -> Result<Json<TenantAnswer>, ApiError> {
    let n = name.clone();
    let (row, as_of_seq) = read_model(directory(&st), 0, move |q| q.tenant(&n)).await?;
    let row = row.ok_or_else(|| not_found(&name))?;
    Ok(Json(TenantAnswer {
        tenant: row.into(),
        as_of_seq,
    }))
}

/// Admin: create a tenant, with a reason. Its resources are then under
/// `/tenants/{name}/v1/…`, and tokens configured with `tenant = "{name}"` act for it.
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", operation_id = "createTenant",
    request_body(content = TenantBody, content_type = "application/json"),
    responses(
        (status = 201, body = TenantAnswer),
        (status = 409, description = "tenant_exists: the name is or was a tenant's", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "invalid_tenant, reason_required or a malformed body", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"])))]
#[tracing::instrument(skip_all, fields(tenant = %b.name))]
pub async fn create(
    st: Api,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<TenantBody>,
) -> Result<(StatusCode, Json<TenantAnswer>), ApiError> {
    let (_, receipt) = directory(&st)
        .execute(SetTenant {
            name: b.name.clone(),
            create: true,
            reason: b.reason.into_string(),
            by: caller(&st, &headers),
            shards: st.config.log.shards,
            reserved: st.engine.placement().reserved(),
        })
        .await?;
    st.directory_seq
        .fetch_max(receipt.last_seq, std::sync::atomic::Ordering::AcqRel);
    let n = b.name.clone();
    let (row, as_of_seq) =
        read_model(directory(&st), receipt.last_seq, move |q| q.tenant(&n)).await?;
    let row = row.ok_or_else(|| not_found(&b.name))?;
    tracing::info!(tenant = %b.name, "tenant created");
    Ok((
        StatusCode::CREATED,
        Json(TenantAnswer {
            tenant: row.into(),
            as_of_seq,
        }),
    ))
}

/// Admin: remove a tenant, with a reason. Its events stay in the log; its API answers `404
/// tenant_not_found` and its name is not given again.
#[utoipa::path(delete, path = "/v1/tenants/{name}", tag = "tenants", operation_id = "deleteTenant",
    params(TenantName),
    request_body(content = TenantDeleteBody, content_type = "application/json"),
    responses(
        (status = 204, description = "removed"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"])))]
#[tracing::instrument(skip_all, fields(tenant = %name))]
pub async fn delete(
    st: Api,
    Path(TenantName { name }): Path<TenantName>,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<TenantDeleteBody>,
) -> Result<StatusCode, ApiError> {
    let (_, receipt) = directory(&st)
        .execute(SetTenant {
            name: name.clone(),
            create: false,
            reason: b.reason.into_string(),
            by: caller(&st, &headers),
            shards: st.config.log.shards,
            reserved: Vec::new(),
        })
        .await?;
    st.directory_seq
        .fetch_max(receipt.last_seq, std::sync::atomic::Ordering::AcqRel);
    tracing::info!(tenant = %name, "tenant removed");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantMoveBody {
    /// The shard to move it to: one no tenant was ever placed in (a shard added by raising
    /// `log.shards`), or the destination of a move of this tenant that did not finish.
    pub shard: u32,
    /// Why; required, recorded in the event.
    #[schema(inline)]
    pub reason: Reason,
}

impl Validate for TenantMoveBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.reason.check("a tenant's move")
    }
}

/// A finished move.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantMoved {
    /// The tenant after it (its `shard` the destination).
    pub tenant: TenantOut,
    /// The shard it lived in.
    pub from_shard: u32,
    /// The shard it lives in now.
    pub to_shard: u32,
    /// The source's head at the switch: the destination holds every event of the tenant
    /// through it at the same seq (the tenant's later events are the destination's alone).
    pub through_seq: u64,
    /// Where the copy began: 0, or the end of an earlier move's copy it verified and resumed.
    pub resumed_after: u64,
    /// How many of the copied events are the tenant's.
    pub tenant_events: u64,
    /// The directory's seq of `tenant.moved` (shard 0's).
    pub as_of_seq: u64,
}

/// Admin: move a tenant to another shard (spec section 20) — copy its events at the same
/// seqs, fence its changes, copy the rest, verify, switch. Its positions (`after_sequence`,
/// `Last-Event-ID`, cursors) mean the same afterwards; its live streams end at the switch
/// and resume in the new shard; its requests wait for the last step (the fence). Answers once
/// the tenant lives there. On a cluster, from any node: the fence is an event in the source's
/// stream, and every node answers the tenant's requests `503 tenant_moving` from it until it
/// has seen the switch; a move stopped after its fence is finished by running it again.
#[utoipa::path(post, path = "/v1/tenants/{name}/move", tag = "tenants", operation_id = "moveTenant",
    params(TenantName),
    request_body(content = TenantMoveBody, content_type = "application/json"),
    responses(
        (status = 200, body = TenantMoved),
        (status = 404, description = "tenant_not_found, shard_not_found", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "not_movable, shard_not_empty, move_in_progress or move_unsupported", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "reason_required or a malformed body", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"])))]
#[tracing::instrument(skip_all, fields(tenant = %name))]
pub async fn move_to(
    st: Api,
    Path(TenantName { name }): Path<TenantName>,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<TenantMoveBody>,
) -> Result<Json<TenantMoved>, ApiError> {
    let engines: Vec<tidemark_engine::Engine> =
        st.shards.iter().map(|s| s.engine.clone()).collect();
    let req = tidemark_engine::moves::MoveRequest {
        tenant: name,
        to: b.shard,
        reason: b.reason.into_string(),
        by: caller(&st, &headers),
    };
    // On a task of its own: a client that goes away does not stop a move half-way (between
    // its record in the directory and its switch in this process).
    let moved =
        tokio::spawn(async move { tidemark_engine::moves::move_tenant(&engines, req).await })
            .await
            .map_err(|e| ApiError::internal("moving a tenant", e))??;
    st.directory_seq
        .fetch_max(moved.directory_seq, std::sync::atomic::Ordering::AcqRel);
    Ok(Json(TenantMoved {
        tenant: moved.row.into(),
        from_shard: moved.from,
        to_shard: moved.to,
        through_seq: moved.through_seq,
        resumed_after: moved.resumed_after,
        tenant_events: moved.tenant_events,
        as_of_seq: moved.directory_seq,
    }))
}

/// One shard as it answers for itself.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShardOut {
    pub shard: u32,
    /// Its log's highest committed `event_seq` (each shard numbers its own events).
    pub head: u64,
    /// The seq its read models have folded through: what a read of its tenants reflects now.
    pub as_of_seq: u64,
    /// The live tenants placed in it (`default` in shard 0).
    pub tenants: Vec<String>,
}

/// The deployment's shards, each read on its own.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShardsPage {
    pub shards: Vec<ShardOut>,
    /// The directory (the home shard's) as of this seq of shard 0.
    pub as_of_seq: u64,
}

/// Every shard of the deployment (spec section 20): its head, the seq its models have folded
/// and its live tenants. A fan-out: each shard answers with its own positions; there is no
/// order across shards.
#[utoipa::path(get, path = "/v1/shards", tag = "tenants", operation_id = "listShards",
    responses((status = 200, body = ShardsPage)),
    security(("bearer" = ["operator"])))]
pub async fn shards(st: Api) -> Result<Json<ShardsPage>, ApiError> {
    let (rows, as_of_seq) = read_model(directory(&st), 0, |q| q.tenants()).await?;
    let shards = st
        .shards
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (head, as_of_seq) = s.head_and_folded();
            let mut tenants: Vec<String> = rows
                .iter()
                .filter(|r| r.is_live() && r.shard as usize == i)
                .map(|r| r.name.clone())
                .collect();
            if i == 0 {
                tenants.insert(0, tidemark_log::DEFAULT_TENANT.to_owned());
            }
            ShardOut {
                shard: i as u32,
                head,
                as_of_seq,
                tenants,
            }
        })
        .collect();
    Ok(Json(ShardsPage { shards, as_of_seq }))
}
