//! `GET /v1/admin/projections`, `POST /v1/admin/projections/{name}/rebuild` and `/verify`,
//! the retention run, the cluster view; backups in [`backups`], the deployment's overview in
//! [`overview`].

use crate::state::Api;
use std::time::Duration;

use axum::Json;
use axum::extract::Path;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tidemark_projections::rebuild::RebuildReport;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::Params;
use crate::routes::blocking;

mod backups;
mod overview;
pub use backups::*;
pub use overview::*;

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

/// Which shard a maintenance operation acts on (spec section 20).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ShardQuery {
    /// The shard (0 to `log.shards` − 1); absent: shard 0, the home shard.
    pub shard: Option<u32>,
}

/// The engine of the shard `q` names (`404 shard_not_found` past the deployment's).
fn shard_of(st: &Api, q: &ShardQuery) -> Result<tidemark_engine::Engine, ApiError> {
    let n = q.shard.unwrap_or(0);
    st.shards
        .get(n as usize)
        .map(|s| s.engine.clone())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "shard_not_found",
                format!("no shard {n}: this deployment has {}", st.shards.len()),
            )
        })
}

/// Every projection with its checkpoint, lag and digest (of shard 0, or of `shard`).
#[utoipa::path(
    get, path = "/v1/admin/projections", operation_id = "listProjections", tag = "admin",
    params(ShardQuery),
    responses(
        (status = 200, body = ProjectionsPage),
        (status = 404, description = "`shard_not_found`", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    st: Api,
    Params(q): Params<ShardQuery>,
) -> Result<Json<ProjectionsPage>, ApiError> {
    let engine = shard_of(&st, &q)?;
    let shard = q.shard.unwrap_or(0);
    let infos = blocking(move || engine.read().projections()).await?;
    let progress = st.rebuilds.lock().map(|m| m.clone()).unwrap_or_default();
    Ok(Json(ProjectionsPage {
        projections: infos
            .into_iter()
            .map(|i| ProjectionOut {
                rebuild: progress
                    .get(&progress_key(&i.name, shard))
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

/// The key a rebuild is tracked under: its projection's name, `@<shard>` past shard 0.
fn progress_key(name: &str, shard: u32) -> String {
    if shard == 0 {
        name.to_owned()
    } else {
        format!("{name}@{shard}")
    }
}

async fn run(
    st: Api,
    name: String,
    swap: bool,
    q: ShardQuery,
) -> Result<Json<RebuildOut>, ApiError> {
    let engine = shard_of(&st, &q)?;
    let key = progress_key(&name, q.shard.unwrap_or(0));
    if tidemark_projections::by_name(&name).is_none() {
        return Err(ApiError::not_found(format!("no projection {name:?}")));
    }
    {
        let mut m = st
            .rebuilds
            .lock()
            .map_err(|e| ApiError::internal("lock", e))?;
        if m.contains_key(&key) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "rebuild_in_progress",
                format!("a rebuild or verify of {name:?} is already running"),
            ));
        }
        m.insert(key.clone(), (0, engine.head()));
    }
    let progress_map = st.rebuilds.clone();
    let k = key.clone();
    let result = engine
        .rebuild(&name, swap, move |done, head| {
            if let Ok(mut m) = progress_map.lock() {
                m.insert(k.clone(), (done, head));
            }
        })
        .await;
    if let Ok(mut m) = st.rebuilds.lock() {
        m.remove(&key);
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

/// `POST /v1/admin/projections/{name}/rebuild` and `…/verify`: one path parameter, one
/// answer; `swap` tells them apart.
macro_rules! rebuild_handler {
    ($(#[doc = $doc:literal])* $name:ident, $path:literal, $operation:literal, swap: $swap:literal) => {
        $(#[doc = $doc])*
        #[utoipa::path(
            post, path = $path, operation_id = $operation, tag = "admin",
            params(("name" = String, Path, description = "tasks, notifications or settings"), ShardQuery),
            responses(
                (status = 200, body = RebuildOut),
                (status = 404, description = "No such projection, or `shard_not_found`", body = Problem, content_type = "application/problem+json"),
                (status = 409, description = "Already rebuilding", body = Problem, content_type = "application/problem+json"),
            ),
            security(("bearer" = ["operator"]))
        )]
        #[tracing::instrument(skip_all, fields(projection = %name))]
        pub async fn $name(
            st: Api,
            Path(name): Path<String>,
            Params(q): Params<ShardQuery>,
        ) -> Result<Json<RebuildOut>, ApiError> {
            run(st, name, $swap, q).await
        }
    };
}

rebuild_handler!(
    /// Rebuild a projection from the log and switch to it once caught up.
    rebuild_one, "/v1/admin/projections/{name}/rebuild", "rebuildProjection", swap: true
);
rebuild_handler!(
    /// Rebuild a projection into scratch tables and compare with the live model, without switching.
    verify_one, "/v1/admin/projections/{name}/verify", "verifyProjection", swap: false
);

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
    /// With several shards (spec section 20): each other shard's run, on its own log and
    /// models (the fields above are the home shard's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardRetentionOut>,
    /// The other shards whose run failed (the others ran, and say what they did): each with
    /// the code and detail its own request would have been answered with. Absent when every
    /// shard's ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<ShardFailureOut>,
}

/// One shard's failed retention run.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShardFailureOut {
    pub shard: u32,
    /// The problem code (`log_unavailable`, `models_unavailable`, `internal`, …).
    pub code: String,
    pub detail: String,
}

/// One shard's retention run.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShardRetentionOut {
    pub shard: u32,
    pub through_seq: u64,
    pub purged: Purged,
    pub events: usize,
    pub compacted_through_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compacted_events: Option<u64>,
}

impl From<tidemark_consumers::retention::RunReport> for ShardRetentionOut {
    fn from(run: tidemark_consumers::retention::RunReport) -> Self {
        let r = run.purge;
        ShardRetentionOut {
            shard: 0,
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
        }
    }
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
/// (as `retention.purged` events, which a rebuild replays). Nothing pending is purged. With
/// several shards, every shard's, each on its own log.
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
    st: Api,
    headers: axum::http::HeaderMap,
) -> Result<Json<RetentionOut>, ApiError> {
    let by = Some(crate::routes::caller(&st, &headers));
    let retention = st.config.retention();
    let run = tidemark_consumers::retention::run_now(st.engine(), retention, by.clone()).await?;
    let before = tidemark_log::time::format_micros(run.purge.before_us);
    let home = ShardRetentionOut::from(run);
    // Every other shard's, each on its own log (spec section 20); one failing does not keep
    // the others from running, nor hide what they did.
    let (mut shards, mut failed) = (Vec::new(), Vec::new());
    for s in st.shards.iter().skip(1) {
        let shard = s.engine.shard();
        match tidemark_consumers::retention::run_now(&s.engine, retention, by.clone()).await {
            Ok(run) => shards.push(ShardRetentionOut {
                shard,
                ..ShardRetentionOut::from(run)
            }),
            Err(e) => {
                tracing::error!(shard, error = %e, "the retention run of a shard failed");
                let answer = ApiError::from(e);
                failed.push(ShardFailureOut {
                    shard,
                    code: answer.problem.code.to_string(),
                    detail: answer.problem.detail.to_string(),
                });
            }
        }
    }
    Ok(Json(RetentionOut {
        before,
        through_seq: home.through_seq,
        purged: home.purged,
        events: home.events,
        compacted_through_seq: home.compacted_through_seq,
        compacted_events: home.compacted_events,
        shards,
        failed,
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
    /// Each shard of the deployment (spec section 20), as this node takes part in it.
    pub shards: Vec<ClusterShardOut>,
}

/// This node in one shard: whether it serves the shard (holds `shard.<n>` of the home shard's
/// leases: the shard's router, routing and lease expiry run here) and the once-per-cluster
/// work of the shard it holds (its own stream's leases, members and claim share).
#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterShardOut {
    pub shard: u32,
    pub serves: bool,
    pub members: Vec<String>,
    pub leases: Vec<String>,
    pub share_index: usize,
    pub share_of: usize,
}

/// Who this node is on its cluster: the live nodes, the leases it holds, its claim share.
#[utoipa::path(
    get, path = "/v1/admin/cluster", tag = "admin", operation_id = "getCluster",
    responses((status = 200, body = ClusterOut)),
    security(("bearer" = ["operator"]))
)]
pub async fn cluster(st: Api) -> Json<ClusterOut> {
    let leases = st.engine().leases();
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
        shards: st
            .shards
            .iter()
            .map(|s| {
                let own = s.engine.leases();
                let share = own.share();
                ClusterShardOut {
                    shard: s.engine.shard(),
                    // `held`, not `holds`: looking does not ask for the lease.
                    serves: leases
                        .held()
                        .contains(&format!("shard.{}", s.engine.shard())),
                    members: own.members(),
                    leases: own.held(),
                    share_index: share.index,
                    share_of: share.of,
                }
            })
            .collect(),
    })
}
