//! `POST /v1/admin/backup` and `GET /v1/admin/backup/stream` (spec section 18), of every
//! shard of the deployment (section 20).

use axum::Json;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::{ShardQuery, shard_of};
use crate::error::{ApiError, Problem};
use crate::request::Params;
use crate::request::{Validate, ValidatedJson, invalid};
use crate::state::Api;

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
