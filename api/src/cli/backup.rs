//! Backups, restores, and the log as JSON lines (spec section 18): `tidemark backup`,
//! `tidemark restore`, `tidemark log export|import`.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use tidemark_log::EventLog;

use serde_json::json;
use tidemark_log::Log;
use tidemark_log::transfer::{self, TransferError};

use super::client::Client;
use super::error::CliError;
use super::{BackupArgs, CliResult, LogAction, LogArgs, Output, RestoreArgs};
use crate::config::Config;

/// The settings of the log in `data` (the config file's `[log]`, the data directory given).
fn log_config(config: Option<&Path>, data: &Path) -> Result<tidemark_log::LogConfig, CliError> {
    shard_log_config(config, data, 0)
}

/// The settings of shard `shard`'s log in `data` (spec section 20: shard 0 is the directory's
/// own, shard n in `shards/<n>/`).
fn shard_log_config(
    config: Option<&Path>,
    data: &Path,
    shard: u32,
) -> Result<tidemark_log::LogConfig, CliError> {
    let mut cfg = Config::load(config).map_err(|e| e.to_string())?;
    if cfg.log.backend != "embedded" {
        return Err(CliError::Other(format!(
            "the configuration puts the log on {} (spec section 16): this command reads and \
             writes the embedded log of a data directory",
            cfg.log.backend
        )));
    }
    cfg.server.data = data.to_owned();
    // One shard's settings as a server of one shard has them (its whole page cache).
    cfg.log.shards = 1;
    Ok(cfg.shard_log_config(shard))
}

/// Open the log of a stopped server's data directory, which must hold one log only (of
/// several, an export of shard 0 alone would look whole, spec section 20: `--shard` names
/// one).
fn open_offline(config: Option<&Path>, data: &Path) -> Result<Log, CliError> {
    let others = transfer::shard_dirs(data);
    if !others.is_empty() {
        return Err(CliError::Other(format!(
            "{} holds {} shards (shards/); an export is one log's, each with its own seqs: name \
             one with --shard (0 to {}), or back up every shard (`tidemark backup --data`)",
            data.display(),
            others.len() + 1,
            others.last().copied().unwrap_or(0)
        )));
    }
    open_shard_offline(config, data, 0)
}

/// Open shard `shard`'s log in a stopped server's data directory.
fn open_shard_offline(config: Option<&Path>, data: &Path, shard: u32) -> Result<Log, CliError> {
    let lc = shard_log_config(config, data, shard)?;
    if !lc.path.exists() {
        return Err(CliError::Other(format!(
            "{} holds no log ({} is missing)",
            data.display(),
            lc.path.display()
        )));
    }
    let (log, _) = Log::open(&lc).map_err(|e| {
        CliError::Other(format!(
            "cannot open the log in {}: {e} (a running server is backed up through it: \
             `tidemark backup --to DIR` without --data)",
            data.display()
        ))
    })?;
    Ok(log)
}

fn transfer_error(e: TransferError) -> CliError {
    CliError::Other(e.to_string())
}

pub(crate) async fn backup(a: BackupArgs) -> CliResult {
    let out = a.client.output();
    let started = std::time::Instant::now();
    // With several shards (spec section 20), every shard's log: shard 0 into the directory,
    // shard n into `shards/<n>/` of it, each as of its own head; full backups only (each log
    // has its own seqs).
    let shards: Vec<serde_json::Value>;
    let report = match (&a.data, &a.to, &a.on_server) {
        (Some(data), Some(to), _) => {
            let others = transfer::shard_dirs(data);
            refuse_shards_increment(others.len(), a.after)?;
            let report = offline_backup(a.config.as_deref(), data, 0, to, a.after).await?;
            shards = other_shards(to, &others, async |n, dir| {
                offline_backup(a.config.as_deref(), data, n, dir, 0).await
            })
            .await?;
            report
        }
        (None, Some(to), _) => {
            let c = Client::new(&a.client)?;
            // A token that may not list the shards backs up a deployment of one.
            let count = match c.ops().list_shards().await {
                Ok(page) => page["shards"].as_array().map_or(1, Vec::len).max(1) as u32,
                Err(_) => 1,
            };
            refuse_shards_increment(count as usize - 1, a.after)?;
            let home = (count > 1).then_some(0);
            let report = stream_backup(&c, home, to, a.after).await?;
            let others: Vec<u32> = (1..count).collect();
            shards = other_shards(to, &others, async |n, dir| {
                stream_backup(&c, Some(n), dir, 0).await
            })
            .await?;
            report
        }
        (_, None, Some(name)) => {
            let c = Client::new(&a.client)?;
            return out.one(
                &c.op(c.ops().take_backup(&json!({"to": name, "after": a.after})))
                    .await?,
            );
        }
        (_, None, None) => return Err(CliError::Other("give --to DIR or --on-server NAME".into())),
    };
    let mut v = serde_json::to_value(&report).map_err(|e| CliError::Other(e.to_string()))?;
    if let Some(to) = &a.to {
        v["dir"] = json!(absolute(to).display().to_string());
    }
    v["duration_ms"] = json!(started.elapsed().as_millis() as u64);
    if !shards.is_empty() {
        v["shards"] = json!(shards);
    }
    out.one(&v)
}

/// After the home shard's backup in `to`: each of the `others` shards' by `backup` into
/// `shards/<n>/`, then the list of them, written last (nothing for one log); their reports.
/// A failure removes what the backup wrote (the directory was new or empty), so no part of
/// it is taken for the whole.
async fn other_shards(
    to: &Path,
    others: &[u32],
    mut backup: impl AsyncFnMut(u32, &Path) -> Result<transfer::Manifest, CliError>,
) -> Result<Vec<serde_json::Value>, CliError> {
    let mut reports = Vec::new();
    let mut r = Ok(());
    for &n in others {
        let dir = to.join("shards").join(n.to_string());
        match backup(n, &dir).await {
            Ok(m) => reports.push(shard_report(n, &dir, &m)),
            Err(e) => {
                r = Err(e);
                break;
            }
        }
    }
    if r.is_ok() && !others.is_empty() {
        r = transfer::write_shards(to, others).map_err(transfer_error);
    }
    if r.is_err() {
        transfer::clear_dir(to);
    }
    r.map(|()| reports)
}

fn refuse_shards_increment(others: usize, after: u64) -> Result<(), CliError> {
    if others > 0 && after != 0 {
        return Err(CliError::Other(
            "a backup of several shards is full (--after 0): each shard's log has its own seqs"
                .into(),
        ));
    }
    Ok(())
}

fn shard_report(n: u32, dir: &Path, m: &transfer::Manifest) -> serde_json::Value {
    json!({"shard": n, "dir": absolute(dir).display().to_string(), "through_seq": m.through_seq,
           "events": m.events, "bytes": m.bytes, "blake3": m.blake3})
}

/// Back up shard `shard` of a stopped server's data directory into `to`.
async fn offline_backup(
    config: Option<&Path>,
    data: &Path,
    shard: u32,
    to: &Path,
    after: u64,
) -> Result<transfer::Manifest, CliError> {
    let log = open_shard_offline(config, data, shard)?;
    let to = to.to_owned();
    let l = log.clone();
    let r = tokio::task::spawn_blocking(move || transfer::backup(&l, &to, after))
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    log.close().await;
    r.map_err(transfer_error)
}

/// A running server's backup, streamed into `to` on this machine: the server sends the events
/// as JSON lines and says which seqs they span; here every seq is checked to have arrived, the
/// lines are hashed and the same manifest is written as a backup made on the server. A stream
/// cut off leaves nothing.
async fn stream_backup(
    c: &Client,
    shard: Option<u32>,
    to: &Path,
    after: u64,
) -> Result<transfer::Manifest, CliError> {
    // Refused here before the server reads its log for nothing (the directory is still claimed
    // exclusively when the stream arrives).
    transfer::refuse_taken(to).map_err(transfer_error)?;
    let mut stream = c.op(c.backup_stream(shard, after)).await?;
    let (from, through) = (stream.after_seq, stream.through_seq);
    if from != after {
        return Err(CliError::Other(format!(
            "asked for the events after seq {after}, the server sent those after {from}"
        )));
    }
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let dir = to.to_owned();
    let writer = tokio::task::spawn_blocking(move || {
        let input = std::io::BufReader::with_capacity(1 << 20, Chunks { rx, at: None });
        transfer::backup_from(input, &dir, after, through)
    });
    loop {
        let item = match stream.chunk().await {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => break,
            Err(e) => Err(std::io::Error::other(format!(
                "the stream from the server broke: {e}"
            ))),
        };
        let failed = item.is_err();
        if tx.send(item).await.is_err() || failed {
            break;
        }
    }
    drop(tx);
    writer
        .await
        .map_err(|e| CliError::Other(e.to_string()))?
        .map_err(transfer_error)
}

/// The chunks of a response body as a blocking `Read` (for [`transfer::backup_from`]).
struct Chunks {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<axum::body::Bytes>>,
    at: Option<axum::body::Bytes>,
}

impl std::io::Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(chunk) = self.at.as_mut().filter(|c| !c.is_empty()) {
                let n = chunk.len().min(buf.len());
                buf[..n].copy_from_slice(&chunk[..n]);
                let _ = chunk.split_to(n);
                return Ok(n);
            }
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.at = Some(chunk),
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_owned())
}

/// The user `--owner` names, looked up before anything is written.
fn owner_of(name: &str) -> Result<nix::unistd::User, CliError> {
    let user = nix::unistd::User::from_name(name)
        .map_err(|e| CliError::Other(format!("cannot look up the user {name:?}: {e}")))?
        .ok_or_else(|| CliError::Other(format!("--owner {name}: there is no such user")))?;
    if !nix::unistd::geteuid().is_root() && nix::unistd::geteuid() != user.uid {
        return Err(CliError::Other(format!(
            "--owner {name}: giving files to another user needs root (run the restore with sudo)"
        )));
    }
    Ok(user)
}

/// A restored data directory as a backup keeps it and the service can open it: directories
/// 0700, files 0600, all of it the owner's (when one is named).
fn secure_tree(dir: &Path, owner: Option<&nix::unistd::User>) -> Result<(), CliError> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |p: &Path, e: &dyn std::fmt::Display| {
        CliError::Other(format!(
            "the log is restored, but setting the owner or mode of {} failed: {e}",
            p.display()
        ))
    };
    let meta = std::fs::symlink_metadata(dir).map_err(|e| fail(dir, &e))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if let Some(u) = owner {
        nix::unistd::chown(dir, Some(u.uid), Some(u.gid)).map_err(|e| fail(dir, &e))?;
    }
    let mode = if meta.is_dir() { 0o700 } else { 0o600 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| fail(dir, &e))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir).map_err(|e| fail(dir, &e))? {
            secure_tree(&entry.map_err(|e| fail(dir, &e))?.path(), owner)?;
        }
    }
    Ok(())
}

pub(crate) async fn restore(a: RestoreArgs) -> CliResult {
    let out = Output::resolve(a.output);
    let owner = a.owner.as_deref().map(owner_of).transpose()?;
    // Every backup read and checked (manifest, hash, the chain) before anything is written.
    let mut manifests = Vec::new();
    for dir in &a.from {
        let m = transfer::open_backup(dir).map_err(transfer_error)?;
        manifests.push(m);
    }
    let mut at = 0;
    for (dir, m) in a.from.iter().zip(&manifests) {
        if m.after_seq != at {
            return Err(CliError::Other(if at == 0 {
                format!(
                    "{} is an increment (after seq {}): a restore starts from a full backup",
                    dir.display(),
                    m.after_seq
                )
            } else {
                format!(
                    "{} follows seq {}, but the backups before it end at seq {at}: a gap, or \
                     the increments are out of order",
                    dir.display(),
                    m.after_seq
                )
            }));
        }
        at = m.through_seq;
    }
    if let Ok(mut entries) = std::fs::read_dir(&a.data)
        && entries.next().is_some()
    {
        return Err(CliError::Other(format!(
            "{} is not empty: a restore makes a new data directory",
            a.data.display()
        )));
    }
    // A deployment's backup of several shards (spec section 20): each shard's log restored
    // into its place, every one checked before anything is written.
    let others = transfer::read_shards(&a.from[0])
        .map_err(transfer_error)?
        .unwrap_or_default();
    if !others.is_empty() && a.from.len() > 1 {
        return Err(CliError::Other(format!(
            "{} is a backup of several shards, which is full: restore it alone",
            a.from[0].display()
        )));
    }
    let mut shards = Vec::new();
    for n in &others {
        let dir = a.from[0].join("shards").join(n.to_string());
        let m = transfer::open_backup(&dir).map_err(transfer_error)?;
        if m.after_seq != 0 {
            return Err(CliError::Other(format!(
                "{} is an increment: a restore starts from a full backup",
                dir.display()
            )));
        }
        shards.push((*n, dir));
    }
    let lc = log_config(a.config.as_deref(), &a.data)?;
    let mut inputs = Vec::new();
    for (dir, m) in a.from.iter().zip(&manifests) {
        inputs.push((m.after_seq, events_of(dir)?));
    }
    let started = std::time::Instant::now();
    let done = transfer::import(&a.data, &lc, 0, inputs)
        .await
        .map_err(transfer_error)?;
    let mut restored = Vec::new();
    for (n, dir) in shards {
        let r = async {
            let lc = shard_log_config(a.config.as_deref(), &a.data, n)?;
            let into = lc.path.parent().map(Path::to_path_buf).unwrap_or_default();
            transfer::import(&into, &lc, n, vec![(0, events_of(&dir)?)])
                .await
                .map_err(transfer_error)
        }
        .await;
        match r {
            Ok(d) => restored.push(json!({"shard": n, "through_seq": d.head, "events": d.events})),
            // The directory was empty: a restore that fails leaves it so, not one shard of it.
            Err(e) => {
                transfer::clear_dir(&a.data);
                return Err(e);
            }
        }
    }
    secure_tree(&a.data, owner.as_ref())?;
    out.one(&json!({
        "data": absolute(&a.data).display().to_string(),
        "owner": owner.as_ref().map(|u| u.name.clone()),
        "through_seq": done.head,
        "events": done.events,
        "backups": a.from.len(),
        "shards": restored,
        "duration_ms": started.elapsed().as_millis() as u64,
    }))
}

/// The events file of backup `dir`, to read.
fn events_of(dir: &Path) -> Result<std::io::BufReader<std::fs::File>, CliError> {
    let path = dir.join(transfer::EVENTS);
    let f = std::fs::File::open(&path)
        .map_err(|e| CliError::Other(format!("cannot open {}: {e}", path.display())))?;
    Ok(std::io::BufReader::with_capacity(1 << 20, f))
}

pub(crate) async fn log(a: LogArgs) -> CliResult {
    match a.action {
        LogAction::Export {
            data,
            shard,
            after,
            through,
            config,
        } => {
            let log = match shard {
                None => open_offline(config.as_deref(), &data)?,
                Some(n) => {
                    if n > 0 && !transfer::shard_dirs(&data).contains(&n) {
                        return Err(CliError::Other(format!(
                            "{} holds no shard {n} (shards/{n}/ is missing)",
                            data.display()
                        )));
                    }
                    open_shard_offline(config.as_deref(), &data, n)?
                }
            };
            let l = log.clone();
            let r = tokio::task::spawn_blocking(move || {
                let stdout = std::io::stdout();
                let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
                transfer::export(&l, after, through.unwrap_or(u64::MAX), &mut w)
            })
            .await
            .map_err(|e| CliError::Other(e.to_string()))?;
            log.close().await;
            match r {
                Ok(_) => Ok(()),
                Err(TransferError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::BrokenPipe =>
                {
                    Err(CliError::ClosedPipe)
                }
                Err(e) => Err(transfer_error(e)),
            }
        }
        LogAction::Import {
            data,
            shard,
            file,
            config,
            output,
        } => {
            let input: Box<dyn BufRead + Send> = match &file {
                Some(p) if p.as_os_str() != "-" => Box::new(std::io::BufReader::with_capacity(
                    1 << 20,
                    std::fs::File::open(p).map_err(|e| {
                        CliError::Other(format!("cannot open {}: {e}", p.display()))
                    })?,
                )),
                _ => Box::new(std::io::BufReader::with_capacity(1 << 20, std::io::stdin())),
            };
            let started = std::time::Instant::now();
            let mut cfg = Config::load(config.as_deref()).map_err(|e| e.to_string())?;
            cfg.server.data = data.clone();
            if shard >= cfg.log.shards.max(1) {
                return Err(CliError::Other(format!(
                    "--shard {shard} is beyond the configuration's log.shards ({}): a server \
                     started with it would not open that shard",
                    cfg.log.shards.max(1)
                )));
            }
            let done = match cfg.shard_jetstream_config(shard) {
                // Into the cluster's stream (section 16): the way from the embedded log to a
                // cluster, with the same seqs, ids and times on every node.
                Some(js) => {
                    let log =
                        tokio::task::spawn_blocking(move || tidemark_log::JetStreamLog::open(&js))
                            .await
                            .map_err(|e| CliError::Other(e.to_string()))?
                            .map_err(|e| {
                                CliError::Other(format!("cannot open the JetStream log: {e}"))
                            })?;
                    let r = transfer::import_jetstream(&log, shard, vec![(0, input)]).await;
                    log.close().await;
                    r.map_err(transfer_error)?
                }
                None => {
                    // Shard n's log is in `shards/<n>/` of the data directory.
                    let lc = cfg.shard_log_config(shard);
                    let into = lc.path.parent().map(Path::to_path_buf).unwrap_or_default();
                    let created = !data.exists();
                    let r = transfer::import(&into, &lc, shard, vec![(0, input)]).await;
                    if r.is_err() && created {
                        // Nothing was there: nothing is left (`shards/` above the shard too).
                        let _ = std::fs::remove_dir_all(&data);
                    }
                    r.map_err(transfer_error)?
                }
            };
            Output::resolve(output).one(&json!({
                "data": absolute(&data).display().to_string(),
                "shard": shard,
                "events": done.events,
                "head": done.head,
                "duration_ms": started.elapsed().as_millis() as u64,
            }))
        }
    }
}
