//! `GET /v1/admin/projections`, `POST /v1/admin/projections/{name}/rebuild` and `/verify`.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use tidemark_projections::rebuild::RebuildReport;
use utoipa::ToSchema;

use crate::error::{ApiError, Problem};
use crate::routes::blocking;
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct RebuildProgress {
    pub done: u64,
    pub head: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProjectionOut {
    pub name: String,
    /// Last seq folded into the model.
    pub checkpoint: u64,
    /// Events committed but not yet folded (0: the model is current).
    pub lag: u64,
    /// Hex running digest at the checkpoint.
    pub digest: String,
    pub generation: u32,
    /// Present while a rebuild or verify runs.
    pub rebuild: Option<RebuildProgress>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProjectionsPage {
    pub projections: Vec<ProjectionOut>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RebuildOut {
    pub name: String,
    pub events_replayed: u64,
    pub duration_ms: u64,
    pub digest: String,
    /// The rebuilt model is identical to the one it replaced (or, for verify, to the live one).
    pub identical: bool,
    /// The first seq at which they diverged; null when identical.
    pub first_divergent_seq: Option<u64>,
    /// Whether the rebuilt model is now live (false for verify).
    pub swapped: bool,
}

impl From<RebuildReport> for RebuildOut {
    fn from(r: RebuildReport) -> Self {
        RebuildOut {
            name: r.name,
            events_replayed: r.events_replayed,
            duration_ms: r.duration_ms,
            digest: r.digest,
            identical: r.identical,
            first_divergent_seq: r.first_divergent_seq,
            swapped: r.swapped,
        }
    }
}

/// Every projection with its checkpoint, lag and digest.
#[utoipa::path(
    get, path = "/v1/admin/projections", operation_id = "listProjections", tag = "admin",
    responses((status = 200, body = ProjectionsPage)),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all)]
pub async fn list(State(st): State<AppState>) -> Result<Json<ProjectionsPage>, ApiError> {
    let engine = st.engine.clone();
    let infos = blocking(move || engine.read().projections()).await?;
    let progress = st.rebuilds.lock().map(|m| m.clone()).unwrap_or_default();
    Ok(Json(ProjectionsPage {
        projections: infos
            .into_iter()
            .map(|i| ProjectionOut {
                rebuild: progress
                    .get(&i.name)
                    .map(|&(done, head)| RebuildProgress { done, head }),
                name: i.name,
                checkpoint: i.checkpoint,
                lag: i.lag,
                digest: i.digest,
                generation: i.generation,
            })
            .collect(),
    }))
}

async fn run(st: AppState, name: String, swap: bool) -> Result<Json<RebuildOut>, ApiError> {
    if tidemark_projections::by_name(&name).is_none() {
        return Err(ApiError::not_found(format!("no projection {name:?}")));
    }
    {
        let mut m = st
            .rebuilds
            .lock()
            .map_err(|e| ApiError::internal("lock", e))?;
        if m.contains_key(&name) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "rebuild_in_progress",
                format!("a rebuild or verify of {name:?} is already running"),
            ));
        }
        m.insert(name.clone(), (0, st.engine.head()));
    }
    let progress_map = st.rebuilds.clone();
    let key = name.clone();
    let result = st
        .engine
        .rebuild(&name, swap, move |done, head| {
            if let Ok(mut m) = progress_map.lock() {
                m.insert(key.clone(), (done, head));
            }
        })
        .await;
    if let Ok(mut m) = st.rebuilds.lock() {
        m.remove(&name);
    }
    let report = result
        .ok_or_else(|| ApiError::not_found(format!("no projection {name:?}")))?
        .map_err(|e| ApiError::internal("rebuild failed", e))?;
    metrics::histogram!("tidemark_rebuild_duration_seconds", "projection" => name.clone())
        .record(Duration::from_millis(report.duration_ms).as_secs_f64());
    metrics::gauge!("tidemark_projection_identical", "projection" => name)
        .set(if report.identical { 1.0 } else { 0.0 });
    Ok(Json(report.into()))
}

/// Rebuild a projection from the log and switch to it once caught up.
#[utoipa::path(
    post, path = "/v1/admin/projections/{name}/rebuild", operation_id = "rebuildProjection", tag = "admin",
    params(("name" = String, Path, description = "tasks, notifications or settings")),
    responses(
        (status = 200, body = RebuildOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already rebuilding", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all, fields(projection = %name))]
pub async fn rebuild_one(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<RebuildOut>, ApiError> {
    run(st, name, true).await
}

/// Rebuild a projection into scratch tables and compare with the live model, without switching.
#[utoipa::path(
    post, path = "/v1/admin/projections/{name}/verify", operation_id = "verifyProjection", tag = "admin",
    params(("name" = String, Path, description = "tasks, notifications or settings")),
    responses(
        (status = 200, body = RebuildOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already rebuilding", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all, fields(projection = %name))]
pub async fn verify_one(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<RebuildOut>, ApiError> {
    run(st, name, false).await
}

/// What a retention run purged (spec section 13).
#[derive(Debug, Serialize, ToSchema)]
pub struct RetentionOut {
    /// Rows whose last change is before this left the read models.
    pub before: String,
    /// The head the run decided at.
    pub through_seq: u64,
    /// Rows that left the read models.
    pub purged: Purged,
    /// `retention.purged` events appended (none when nothing was due).
    pub events: usize,
    /// With `compact_log`: the last seq the log dropped (it now starts after it); null when
    /// nothing was compacted.
    pub compacted_through_seq: Option<u64>,
    /// With `compact_log`: how many events the log dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compacted_events: Option<u64>,
}

/// Rows a retention run purged, by model.
#[derive(Debug, Serialize, ToSchema)]
pub struct Purged {
    pub deliveries: usize,
    pub notifications: usize,
    pub tasks: usize,
}

/// Run retention now: terminal deliveries, notifications whose deliveries are all terminal and
/// terminal tasks nobody follows, unchanged for `[retention] window`, leave the read models
/// (as `retention.purged` events, which a rebuild replays). Nothing pending is purged.
#[utoipa::path(
    post, path = "/v1/admin/retention/run", tag = "admin", operation_id = "runRetention",
    responses(
        (status = 200, body = RetentionOut),
        (status = 507, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"]))
)]
#[tracing::instrument(skip_all)]
pub async fn run_retention(
    State(st): State<AppState>,
    headers: axum::http::HeaderMap,
) -> Result<Json<RetentionOut>, ApiError> {
    let by = Some(crate::routes::caller(&st, &headers));
    let run = tidemark_consumers::retention::run_now(&st.engine, st.config.retention(), by).await?;
    let r = run.purge;
    Ok(Json(RetentionOut {
        before: tidemark_log::time::format_micros(r.before_us),
        through_seq: r.through_seq,
        purged: Purged {
            deliveries: r.deliveries,
            notifications: r.notifications,
            tasks: r.tasks,
        },
        events: r.events,
        compacted_through_seq: run
            .compaction
            .as_ref()
            .filter(|c| c.removed > 0)
            .map(|c| c.first_seq.saturating_sub(1)),
        compacted_events: run.compaction.as_ref().map(|c| c.removed),
    }))
}

/// This node among the nodes of its cluster (spec section 16).
#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterOut {
    /// `embedded` or `jetstream`.
    pub backend: &'static str,
    /// This node's id (host, process, a few random bits).
    pub node: String,
    /// The live nodes, sorted (this one alone on the embedded log).
    pub members: Vec<String>,
    /// The once-per-cluster work this node holds now: `retention`, `source.<name>`,
    /// `bridge.<slot>` (every one, unlisted, on the embedded log).
    pub leases: Vec<String>,
    /// This node's share of the due deliveries its claims take first: `index` of `of`.
    pub share_index: usize,
    pub share_of: usize,
}

/// Who this node is on its cluster: the live nodes, the leases it holds, its claim share.
#[utoipa::path(
    get, path = "/v1/admin/cluster", tag = "admin", operation_id = "getCluster",
    responses((status = 200, body = ClusterOut)),
    security(("bearer" = ["operator"]))
)]
pub async fn cluster(State(st): State<AppState>) -> Json<ClusterOut> {
    let leases = st.engine.leases();
    let share = leases.share();
    Json(ClusterOut {
        backend: if leases.clustered() {
            "jetstream"
        } else {
            "embedded"
        },
        node: leases.node().to_owned(),
        members: leases.members(),
        leases: leases.held(),
        share_index: share.index,
        share_of: share.of,
    })
}
