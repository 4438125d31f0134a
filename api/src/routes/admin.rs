//! `GET /v1/admin/projections`, `POST /v1/admin/projections/{name}/rebuild` and `/verify`.

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
use crate::request::{Validate, ValidatedJson, invalid};
use crate::routes::blocking;

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
    st: Api,
    headers: axum::http::HeaderMap,
) -> Result<Json<RetentionOut>, ApiError> {
    let by = Some(crate::routes::caller(&st, &headers));
    let run =
        tidemark_consumers::retention::run_now(st.engine(), st.config.retention(), by).await?;
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

/// `POST /v1/admin/backup`.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackupBody {
    /// The backup's directory on the server's machine, relative to its `[server] backup_dir`
    /// (`nightly/2026-11-27`): names of letters, digits, `.`, `_` and `-`, each starting with
    /// a letter, a digit or `_`, joined by `/`. It must not exist, or be empty.
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = "^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}(/[A-Za-z0-9_][A-Za-z0-9._-]{0,254})*$"
    )]
    pub to: String,
    /// An increment: only the events after this seq (the `through_seq` of the backup it
    /// follows). 0, the default, is a full backup.
    #[serde(default)]
    pub after: u64,
}

impl Validate for BackupBody {
    /// The schema's pattern and length, checked (one rule: a name never escapes backup_dir,
    /// `.` and `..` cannot be written, and each name fits a file system's 255 bytes).
    fn validate(&self) -> Result<(), ApiError> {
        let name_ok = |seg: &str| {
            let b = seg.as_bytes();
            !b.is_empty()
                && b.len() <= 255
                && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        };
        if self.to.len() > 1024 || !self.to.split('/').all(name_ok) {
            return Err(invalid(
                "to",
                "to must be a relative path of names of letters, digits, `.`, `_` and `-` \
                 (each starting with a letter, a digit or `_`, at most 255 bytes), at most 1024 \
                 bytes",
            ));
        }
        Ok(())
    }
}

/// What a backup wrote.
#[derive(Debug, Serialize, ToSchema)]
pub struct BackupOut {
    /// The backup's directory (absolute).
    pub dir: String,
    /// `tidemark-backup/1`.
    pub format: String,
    /// 0 for a full backup; else the seq the increment follows.
    pub after_seq: u64,
    /// The log's head when the backup began: the backup is the log as of this seq.
    pub through_seq: u64,
    /// Events written.
    pub events: u64,
    /// Bytes of `events.jsonl`, and its BLAKE3 hash (hex).
    pub bytes: u64,
    pub blake3: String,
    pub duration_ms: u64,
    /// With several shards (spec section 20), each shard's backup past the home shard's (the
    /// fields above), in `shards/<n>/` of the directory, each as of its own log's head.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardBackupOut>,
}

/// One shard's part of a deployment's backup.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShardBackupOut {
    pub shard: u32,
    pub dir: String,
    pub through_seq: u64,
    pub events: u64,
    pub bytes: u64,
    pub blake3: String,
}

/// The shard a streamed backup copies: the one `shard` names, which a deployment of several
/// shards must name (each shard's log has its own seqs: one stream is one log).
fn stream_shard(st: &Api, shard: Option<u32>) -> Result<tidemark_engine::Engine, ApiError> {
    if shard.is_none() && st.shards.len() > 1 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "shard_required",
            format!(
                "this deployment has {} shards, each a log of its own: stream each one's \
                 backup with ?shard=0 to {}",
                st.shards.len(),
                st.shards.len() - 1
            ),
        ));
    }
    shard_of(st, &ShardQuery { shard })
}

fn count_backup(r: &Result<tidemark_log::transfer::Manifest, ApiError>) {
    // A refusal (a name taken, a position past the head: the caller's to change) is not a
    // failed backup, which an operator must look into.
    let outcome = match r {
        Ok(_) => "ok",
        Err(e) if e.status.is_client_error() => "refused",
        Err(_) => "failed",
    };
    metrics::counter!("tidemark_backups_total", "outcome" => outcome).increment(1);
}

/// The home shard's backup into `dir`, then every other shard's log into `shards/<n>/` of it,
/// each as of its own head, and the list of them last ([`tidemark_log::transfer::SHARDS`]); a
/// shard that fails takes the whole backup with it (a deployment's backup is every shard or
/// nothing).
async fn backup_all(
    home: tidemark_engine::Engine,
    others: &[tidemark_engine::Engine],
    dir: std::path::PathBuf,
    after: u64,
) -> (
    Result<tidemark_log::transfer::Manifest, ApiError>,
    Vec<ShardBackupOut>,
) {
    let made = !dir.exists();
    let m = match home.backup(dir.clone(), after).await {
        Ok(m) => m,
        Err(e) => return (Err(backup_error(e)), Vec::new()),
    };
    let mut shards = Vec::new();
    let mut failed = None;
    for engine in others {
        let n = engine.shard();
        let to = dir.join("shards").join(n.to_string());
        match engine.backup(to.clone(), 0).await {
            Ok(m) => shards.push(ShardBackupOut {
                shard: n,
                dir: to.display().to_string(),
                through_seq: m.through_seq,
                events: m.events,
                bytes: m.bytes,
                blake3: m.blake3,
            }),
            Err(e) => {
                failed = Some(backup_error(e));
                break;
            }
        }
    }
    if failed.is_none() && !shards.is_empty() {
        let list: Vec<u32> = shards.iter().map(|s| s.shard).collect();
        if let Err(e) = tidemark_log::transfer::write_shards(&dir, &list) {
            failed = Some(backup_error(e));
        }
    }
    match failed {
        None => (Ok(m), shards),
        Some(e) => {
            if made {
                let _ = std::fs::remove_dir_all(&dir);
            } else {
                tidemark_log::transfer::clear_dir(&dir);
            }
            (Err(e), Vec::new())
        }
    }
}

/// Take a backup of the log while appends go on: the events after `after` through the head as
/// of now, written with a manifest into a directory on the server's machine (under `[server]
/// backup_dir`). `tidemark restore` makes a data directory from a full backup and its
/// increments.
#[utoipa::path(
    post, path = "/v1/admin/backup", tag = "admin", operation_id = "takeBackup",
    request_body = BackupBody,
    responses(
        (status = 200, body = BackupOut),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
        (status = 507, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"]))
)]
#[tracing::instrument(skip_all)]
pub async fn backup(
    st: Api,
    ValidatedJson(b): ValidatedJson<BackupBody>,
) -> Result<Json<BackupOut>, ApiError> {
    let dir = backup_dir(&st.config.backup_root(), &b.to)?;
    if st.shards.len() > 1 && b.after != 0 {
        return Err(invalid(
            "after",
            "a backup of a deployment of several shards is full (after = 0): each shard's log \
             has its own seqs",
        ));
    }
    let started = std::time::Instant::now();
    // On a task of its own: a client that goes away does not cut a deployment's backup short.
    let engines: Vec<tidemark_engine::Engine> =
        st.shards.iter().map(|s| s.engine.clone()).collect();
    let (home, to, after) = (st.engine().clone(), dir.clone(), b.after);
    let (r, shards) = tokio::spawn(async move { backup_all(home, &engines[1..], to, after).await })
        .await
        .map_err(|e| ApiError::internal("the backup's task", e))?;
    count_backup(&r);
    let m = r?;
    metrics::gauge!("tidemark_backup_last_through_seq").set(m.through_seq as f64);
    metrics::gauge!("tidemark_backup_last_success_timestamp_seconds")
        .set(tidemark_log::time::now_micros() as f64 / 1e6);
    Ok(Json(BackupOut {
        dir: dir.display().to_string(),
        format: m.format,
        after_seq: m.after_seq,
        through_seq: m.through_seq,
        events: m.events,
        bytes: m.bytes,
        blake3: m.blake3,
        duration_ms: started.elapsed().as_millis() as u64,
        shards,
    }))
}

/// The directory `to` names under `root`: relative to it, or absolute inside it; never
/// outside it (no `..`).
fn backup_dir(root: &std::path::Path, to: &str) -> Result<std::path::PathBuf, ApiError> {
    // `to` is relative names only (checked against its pattern): never `..` or absolute.
    let p = std::path::Path::new(to);
    let outside = || {
        invalid(
            "to",
            format!(
                "to must name a directory inside the server's backup_dir ({})",
                root.display()
            ),
        )
    };
    let full = root.join(p);
    if !full.starts_with(root) || full == root || p.is_absolute() {
        return Err(outside());
    }
    // Symlinks: what exists of the path, resolved, must still be inside the resolved root
    // (while the root does not exist yet, nothing under it can lead out).
    let Ok(real_root) = std::fs::canonicalize(root) else {
        return Ok(full);
    };
    let mut existing = full.as_path();
    while !existing.exists() {
        match existing.parent() {
            Some(up) => existing = up,
            None => break,
        }
    }
    if let Ok(real) = std::fs::canonicalize(existing)
        && (!real.starts_with(&real_root) || (existing == full && real == real_root))
    {
        return Err(outside());
    }
    Ok(full)
}

/// The backup metrics as the backups on disk say (at start): the newest finished backup's
/// time (its manifest's) and through_seq, so an alert on their age holds across restarts; 0
/// when there is none, so that "backup too old" fires on a server never backed up (an absent
/// series makes no alert). Each outcome's counter exists from the start, at 0.
pub fn backup_gauges_from_disk(root: &std::path::Path) {
    for outcome in ["ok", "refused", "failed"] {
        metrics::counter!("tidemark_backups_total", "outcome" => outcome).increment(0);
    }
    metrics::gauge!("tidemark_backup_last_success_timestamp_seconds").set(0.0);
    metrics::gauge!("tidemark_backup_last_through_seq").set(0.0);
    let Ok(dirs) = std::fs::read_dir(root) else {
        return;
    };
    let newest = dirs
        .filter_map(Result::ok)
        .filter_map(|d| {
            let manifest = d.path().join(tidemark_log::transfer::MANIFEST);
            let modified = std::fs::metadata(&manifest).ok()?.modified().ok()?;
            Some((modified, manifest))
        })
        .max_by_key(|(t, _)| *t);
    let newest = newest.and_then(|(t, manifest)| {
        let m: tidemark_log::transfer::Manifest =
            serde_json::from_slice(&std::fs::read(&manifest).ok()?).ok()?;
        Some((t, m.through_seq))
    });
    if let Some((t, seq)) = newest {
        let secs = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        metrics::gauge!("tidemark_backup_last_success_timestamp_seconds").set(secs);
        metrics::gauge!("tidemark_backup_last_through_seq").set(seq as f64);
    }
}

fn backup_error(e: tidemark_log::transfer::TransferError) -> ApiError {
    use tidemark_log::transfer::TransferError as T;
    match e {
        // A state of the log, not a malformed request: the head may pass it later.
        T::PastHead { .. } => ApiError::new(StatusCode::CONFLICT, "past_head", e.to_string()),
        T::DirNotEmpty { .. } => {
            ApiError::new(StatusCode::CONFLICT, "backup_exists", e.to_string())
        }
        T::Compacted { .. } => ApiError::new(StatusCode::CONFLICT, "compacted", e.to_string()),
        T::Io { ref source, .. }
            if source.kind() == std::io::ErrorKind::StorageFull
                || source.raw_os_error() == Some(28) =>
        {
            ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                "the backup directory's disk is full; nothing was changed in the log",
            )
        }
        T::Read(r) => ApiError::storage("backup read failed", &tidemark_log::StorageError::of(r)),
        e => ApiError::internal("backup failed", e),
    }
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BackupStreamQuery {
    /// 0 (the default): a full backup; else an increment of the events after this seq (the
    /// `through_seq` of the backup it follows).
    #[serde(default)]
    pub after: u64,
    /// The shard whose log to stream (spec section 20); required with several shards.
    pub shard: Option<u32>,
}

/// Events on their way to the client, in chunks of about this many bytes.
const STREAM_CHUNK: usize = 256 << 10;

/// A `Write` that hands its bytes to the response body in chunks; fails once the client is gone
/// (so the export stops reading the log).
struct ToBody {
    tx: tokio::sync::mpsc::Sender<Result<axum::body::Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl std::io::Write for ToBody {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= STREAM_CHUNK {
            self.flush()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = axum::body::Bytes::from(std::mem::take(&mut self.buf));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client left"))
    }
}

/// Stream a backup to the caller (`tidemark backup --to DIR` on any machine): the events after
/// `after` through the head as of now, as the JSON lines of a backup's `events.jsonl`, read in
/// pages while appends go on. `Tidemark-After-Seq` and `Tidemark-Through-Seq` say what the
/// body holds; the client checks every seq from one to the other arrived, hashes the lines
/// and writes the same manifest as a backup made on the server. A stream that fails partway is
/// cut off (the client sees it short and keeps nothing).
#[utoipa::path(
    get, path = "/v1/admin/backup/stream", tag = "admin", operation_id = "streamBackup",
    params(BackupStreamQuery),
    responses(
        (status = 200, description = "The events as JSON lines", content_type = "application/x-ndjson", body = String,
         headers(("tidemark-after-seq" = u64), ("tidemark-through-seq" = u64))),
        (status = 400, description = "Several shards and none named (`shard_required`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such shard (`shard_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`after` is past the head (`past_head`), or the log was compacted past it (`compacted`)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"]))
)]
#[tracing::instrument(skip_all)]
pub async fn backup_stream(
    st: Api,
    Params(q): Params<BackupStreamQuery>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let shard = stream_shard(&st, q.shard)?;
    let through = shard.head();
    let refused = |e: tidemark_log::transfer::TransferError| {
        metrics::counter!("tidemark_backups_total", "outcome" => "refused").increment(1);
        backup_error(e)
    };
    if q.after > through {
        return Err(refused(tidemark_log::transfer::TransferError::PastHead {
            after: q.after,
            head: through,
        }));
    }
    let first = shard.first_seq().unwrap_or(1);
    if q.after + 1 < first && q.after < through {
        return Err(refused(tidemark_log::transfer::TransferError::Compacted {
            after: q.after,
            first,
        }));
    }
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let engine = shard;
    let after = q.after;
    tokio::task::spawn_blocking(move || {
        let mut out = ToBody {
            tx: tx.clone(),
            buf: Vec::with_capacity(STREAM_CHUNK),
        };
        let r = tidemark_log::transfer::export(engine.log(), after, through, &mut out);
        match r {
            Ok(_) => {
                metrics::counter!("tidemark_backups_total", "outcome" => "ok").increment(1);
                metrics::gauge!("tidemark_backup_last_through_seq").set(through as f64);
                metrics::gauge!("tidemark_backup_last_success_timestamp_seconds")
                    .set(tidemark_log::time::now_micros() as f64 / 1e6);
            }
            Err(e) => {
                // Cut the body off: the client sees the stream end short and keeps nothing.
                metrics::counter!("tidemark_backups_total", "outcome" => "failed").increment(1);
                tracing::warn!(error = %e, after, through, "a streamed backup stopped");
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        }
    });
    let mut rx = rx;
    let body = axum::body::Body::from_stream(async_stream::stream! {
        while let Some(chunk) = rx.recv().await {
            yield chunk;
        }
    });
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/x-ndjson"),
            ),
            (
                axum::http::HeaderName::from_static("tidemark-after-seq"),
                axum::http::HeaderValue::from(after),
            ),
            (
                axum::http::HeaderName::from_static("tidemark-through-seq"),
                axum::http::HeaderValue::from(through),
            ),
        ],
        body,
    )
        .into_response())
}
