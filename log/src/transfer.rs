//! The log out and in (spec section 18): JSON lines of events, one event per line with its
//! seq, id, stream, subject, type, time and payload (the shape `GET /v1/events` answers).
//! `tidemark log export` writes them, a backup holds them ([`backup`]) with a manifest, and
//! [`import`] writes them into a log holding no events with the same seqs, ids and times, so
//! every stored record is the original's byte for byte (the payload is the canonical text as
//! stored, the time has all six digits).
//!
//! What a copy of the files of a running server is worth: nothing certain. `log.redb` and its
//! journal are written in place by one writer; a copy taken while it commits can hold a redb
//! file from one moment and a journal from another. A backup (below) or a copy of the stopped
//! server's data directory is safe.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{AppendError, EventLog, Log, LogConfig, NewEvent, ReadError, ReadQuery};

/// The manifest's `format`.
pub const FORMAT: &str = "tidemark-backup/1";
/// A backup directory's files.
pub const MANIFEST: &str = "manifest.json";
pub const EVENTS: &str = "events.jsonl";
/// In a backup of a deployment of several shards (spec section 20): the shards beyond the
/// home one it holds in `shards/<n>/`, written after every one of them, so a backup cut short
/// (a failure, a killed process) has none and is not taken for a whole one.
pub const SHARDS: &str = "shards.json";

/// Record that `dir`'s backup holds `shards` (each in `shards/<n>/`, complete): the last
/// file a deployment's backup writes, synced.
pub fn write_shards(dir: &Path, shards: &[u32]) -> Result<(), TransferError> {
    let path = dir.join(SHARDS);
    let body = serde_json::to_vec(&serde_json::json!({ "shards": shards }))
        .map_err(|e| TransferError::Backup(e.to_string()))?;
    let mut f = create_private(&path).map_err(io(format!("creating {}", path.display())))?;
    f.write_all(&body)
        .and_then(|()| f.sync_all())
        .map_err(io(format!("writing {}", path.display())))?;
    sync_dir(dir)
}

/// The shards beyond the home one backup `dir` holds: `None` for a backup of one log;
/// refused when it has `shards/` but no complete list of them (a deployment's backup cut
/// short), or a list that does not match what it holds.
pub fn read_shards(dir: &Path) -> Result<Option<Vec<u32>>, TransferError> {
    let path = dir.join(SHARDS);
    let held = shard_dirs(dir);
    let listed = match std::fs::read(&path) {
        Ok(bytes) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| TransferError::Backup(format!("{}: {e}", path.display())))?;
            let mut list: Vec<u32> = v["shards"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok()))
                        .collect()
                })
                .unwrap_or_default();
            list.sort_unstable();
            Some(list)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(format!("reading {}", path.display()))(e)),
    };
    match listed {
        None if held.is_empty() => Ok(None),
        None => Err(TransferError::Backup(format!(
            "{} holds shards/ but no {SHARDS}: a backup of several shards that did not finish",
            dir.display()
        ))),
        Some(list) if list == held => Ok(Some(list)),
        Some(list) => Err(TransferError::Backup(format!(
            "{} lists shards {list:?} but holds {held:?}",
            dir.display()
        ))),
    }
}

/// The shards beyond the home one a data directory or a backup holds: its `shards/<n>/`
/// directories (n > 0), by number.
pub fn shard_dirs(dir: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(dir.join("shards"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|n| *n > 0)
        .collect();
    v.sort_unstable();
    v
}

/// Remove what `dir` holds (a backup of several shards that failed part way: the directory
/// was new or empty when it began).
pub fn clear_dir(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
}
/// Events read per page while exporting, and appended per batch while importing.
const PAGE: usize = 1_000;

/// What a backup holds: the events after `after_seq` through `through_seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    /// 0 for a full backup; else an increment that applies on top of a backup through it.
    pub after_seq: u64,
    /// The log's head when the backup began: the copy is the log as of this seq.
    pub through_seq: u64,
    /// Events in `events.jsonl`.
    pub events: u64,
    /// Bytes of `events.jsonl`, and its BLAKE3 hash (hex).
    pub bytes: u64,
    pub blake3: String,
    /// The tidemark version that wrote it.
    pub version: String,
}

/// What [`export`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub events: u64,
    pub bytes: u64,
    pub through_seq: u64,
}

/// What [`import`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Imported {
    pub events: u64,
    /// The log's head after it.
    pub head: u64,
}

/// Why an export, a backup, an import or a restore failed. An import or a restore that fails
/// leaves the data directory as it was.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: {reason}")]
    Line { line: u64, reason: String },
    #[error(
        "line {line}: seq {found} where {expected} was due: the input has a gap or a repeat \
         (events must follow each other from seq {first})"
    )]
    Sequence {
        line: u64,
        expected: u64,
        found: u64,
        first: u64,
    },
    #[error(
        "the events of seqs {first_seq} to {last_seq}: an event_id among them appears twice in \
         the input (there, or earlier)"
    )]
    Duplicate { first_seq: u64, last_seq: u64 },
    #[error(
        "the log in {dir} already holds events (head {head}): an import goes into a data \
         directory holding none"
    )]
    NotEmpty { dir: PathBuf, head: u64 },
    #[error("{0}")]
    Backup(String),
    #[error("after {after} is past the log's head ({head})")]
    PastHead { after: u64, head: u64 },
    #[error("{} is not empty: a backup goes into a new or empty directory", dir.display())]
    DirNotEmpty { dir: PathBuf },
    #[error(
        "the log was compacted through seq {first}: the events after {after} are no longer \
         all in it"
    )]
    Compacted { after: u64, first: u64 },
    #[error("reading the log: {0}")]
    Read(#[source] ReadError),
    #[error("writing the log: {0}")]
    Append(#[source] AppendError),
    #[error("opening the log: {0}")]
    Open(#[source] crate::OpenError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TransferError {
    let what = what.into();
    move |source| TransferError::Io { what, source }
}

/// Write the committed events after `after` through `through` (cut at the head) to `out` as
/// JSON lines, reading the log in pages: appends go on meanwhile, and what is written is the
/// log as of `through`.
pub fn export(
    log: &impl EventLog,
    after: u64,
    through: u64,
    out: &mut (impl Write + ?Sized),
) -> Result<Written, TransferError> {
    let through = through.min(log.head());
    let mut w = Written {
        events: 0,
        bytes: 0,
        through_seq: through.max(after),
    };
    let mut at = after;
    let mut line = Vec::with_capacity(4096);
    while at < through {
        let page = log
            .read(&ReadQuery {
                after: at,
                limit: PAGE.min((through - at) as usize),
                ..ReadQuery::default()
            })
            .map_err(|e| match e {
                ReadError::Compacted { first } => TransferError::Compacted { after, first },
                e => TransferError::Read(e),
            })?;
        for e in page.events.iter().take_while(|e| e.seq <= through) {
            line.clear();
            serde_json::to_writer(&mut line, e).map_err(|e| TransferError::Io {
                what: "encoding an event".into(),
                source: e.into(),
            })?;
            line.push(b'\n');
            out.write_all(&line).map_err(io("writing the events"))?;
            w.events += 1;
            w.bytes += line.len() as u64;
        }
        if page.next_after <= at {
            return Err(TransferError::Read(ReadError::Storage(
                crate::StorageError::new(
                    format!("the log's read after seq {at} made no progress before seq {through}"),
                    std::io::Error::other("no progress"),
                ),
            )));
        }
        at = page.next_after.min(through);
        // A backup on the log's own disk must not take it under its reserve (appends would
        // be refused): stop instead.
        if let Err(e) = log.check_space() {
            return Err(TransferError::Io {
                what: format!("the log's disk is short of space ({e}); the export stopped"),
                source: std::io::Error::from(std::io::ErrorKind::StorageFull),
            });
        }
    }
    out.flush().map_err(io("writing the events"))?;
    Ok(w)
}

/// How much of a backup's file is written before it is synced: its pages go to the device in
/// pieces this size, not all at its end, where hundreds of MB written back at once held the
/// journal's `fdatasync` (and so the appends) for up to 100 ms.
const PACE_BYTES: u64 = 8 << 20;

/// A file synced every [`PACE_BYTES`] written.
struct Paced {
    file: std::fs::File,
    unsynced: u64,
}

impl Write for Paced {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.unsynced += n as u64;
        if self.unsynced >= PACE_BYTES {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// A `Write` that hashes and counts what goes through it.
struct Hashing<W> {
    inner: W,
    hash: blake3::Hasher,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Write a backup of `log` into `dir` (made here; it must not exist, or be empty): the events
/// after `after` through the head as of now, and a manifest written last (a directory without
/// one is an unfinished backup). Reads only: appends go on. The directory and its files are
/// the owner's only (the log holds webhook secrets and personal data). Two backups into one
/// directory: the second is refused. A backup that fails leaves nothing (the directory it made
/// removed, or the empty one it was given emptied again); one that would take the log's disk
/// under its reserve (`check_space`) stops and is removed.
pub fn backup(log: &impl EventLog, dir: &Path, after: u64) -> Result<Manifest, TransferError> {
    let through = log.head();
    if after > through {
        return Err(TransferError::PastHead {
            after,
            head: through,
        });
    }
    backup_with(dir, after, |out| export(log, after, through, out))
}

/// Write a backup into `dir` from a stream of the events after `after` through `through` as
/// JSON lines (what a server sends to `tidemark backup --to` on another machine): the same
/// files, manifest and guarantees as [`backup`]. Each line's seq must follow the one before
/// from `after + 1`, and the last must be `through`: a stream that ends early, skips or
/// repeats an event is refused and leaves nothing.
pub fn backup_from(
    input: impl BufRead,
    dir: &Path,
    after: u64,
    through: u64,
) -> Result<Manifest, TransferError> {
    if after > through {
        return Err(TransferError::PastHead {
            after,
            head: through,
        });
    }
    backup_with(dir, after, |out| copy_dense(input, after, through, out))
}

/// Copy JSON event lines from `input` to `out`, checking that their seqs run from `after + 1`
/// through `through` without a gap or a repeat.
fn copy_dense(
    mut input: impl BufRead,
    after: u64,
    through: u64,
    out: &mut dyn Write,
) -> Result<Written, TransferError> {
    #[derive(Deserialize)]
    struct Seq {
        seq: u64,
    }
    let mut w = Written {
        events: 0,
        bytes: 0,
        through_seq: through,
    };
    let mut last = after;
    let mut line = Vec::with_capacity(4096);
    loop {
        line.clear();
        let n = input
            .read_until(b'\n', &mut line)
            .map_err(io("receiving the events"))?;
        if n == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            return Err(TransferError::Backup(format!(
                "the stream of events ended inside the line after seq {last}: it was cut off"
            )));
        }
        let seq = serde_json::from_slice::<Seq>(&line)
            .map_err(|e| {
                TransferError::Backup(format!("the line after seq {last} is not an event: {e}"))
            })?
            .seq;
        if seq != last + 1 || seq > through {
            return Err(TransferError::Backup(format!(
                "the stream sent seq {seq} after seq {last} (through {through}): a gap or a repeat"
            )));
        }
        out.write_all(&line).map_err(io("writing the events"))?;
        last = seq;
        w.events += 1;
        w.bytes += line.len() as u64;
    }
    if last != through {
        return Err(TransferError::Backup(format!(
            "the stream of events ended at seq {last}, before seq {through}: it was cut off"
        )));
    }
    out.flush().map_err(io("writing the events"))?;
    Ok(w)
}

/// [`backup`]'s directory, files and manifest, the events written by `fill`.
fn backup_with(
    dir: &Path,
    after: u64,
    fill: impl FnOnce(&mut dyn Write) -> Result<Written, TransferError>,
) -> Result<Manifest, TransferError> {
    let made = claim_dir(dir)?;
    let r = write_backup(dir, after, fill);
    if r.is_err() {
        if made {
            let _ = std::fs::remove_dir_all(dir);
        } else {
            for f in [
                format!("{EVENTS}.partial"),
                EVENTS.into(),
                format!("{MANIFEST}.partial"),
            ] {
                let _ = std::fs::remove_file(dir.join(f));
            }
        }
    }
    r
}

/// Make `dir` (0700), or take it when it exists empty; whether it was made here. The events
/// file is then created exclusively, so a second backup racing into the same directory fails.
fn claim_dir(dir: &Path) -> Result<bool, TransferError> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            refuse_taken(dir)?;
            Ok(false)
        }
        Err(e) => Err(io(format!("creating {}", dir.display()))(e)),
    }
}

/// `DirNotEmpty` when `dir` exists and holds anything: a backup goes into a new or empty
/// directory (also checked by a client before it asks a server to stream one).
pub fn refuse_taken(dir: &Path) -> Result<(), TransferError> {
    let taken = match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_some(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io(format!("reading {}", dir.display()))(e)),
    };
    if taken {
        return Err(TransferError::DirNotEmpty {
            dir: dir.to_owned(),
        });
    }
    Ok(())
}

/// A file of the owner's only, which must not exist yet.
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

fn write_backup(
    dir: &Path,
    after: u64,
    fill: impl FnOnce(&mut dyn Write) -> Result<Written, TransferError>,
) -> Result<Manifest, TransferError> {
    let partial = dir.join(format!("{EVENTS}.partial"));
    let file = create_private(&partial).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            TransferError::DirNotEmpty {
                dir: dir.to_owned(),
            }
        } else {
            io(format!("creating {}", partial.display()))(e)
        }
    })?;
    let mut out = Hashing {
        inner: std::io::BufWriter::with_capacity(1 << 20, Paced { file, unsynced: 0 }),
        hash: blake3::Hasher::new(),
    };
    let w = fill(&mut out)?;
    let file = out
        .inner
        .into_inner()
        .map_err(|e| io("writing the events")(e.into_error()))?
        .file;
    file.sync_all().map_err(io("syncing the events"))?;
    std::fs::rename(&partial, dir.join(EVENTS)).map_err(io("naming the events file"))?;
    sync_dir(dir)?;
    let m = Manifest {
        format: FORMAT.into(),
        after_seq: after,
        through_seq: w.through_seq,
        events: w.events,
        bytes: w.bytes,
        blake3: out.hash.finalize().to_hex().to_string(),
        version: env!("CARGO_PKG_VERSION").into(),
    };
    let mut text = serde_json::to_vec_pretty(&m).unwrap_or_default();
    text.push(b'\n');
    write_synced(&dir.join(MANIFEST), &text)?;
    sync_dir(dir)?;
    Ok(m)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), TransferError> {
    let tmp = path.with_extension("partial");
    let mut f = create_private(&tmp).map_err(io(format!("creating {}", tmp.display())))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io(format!("naming {}", path.display())))
}

fn sync_dir(dir: &Path) -> Result<(), TransferError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing {}", dir.display())))
}

/// A backup directory read back: its manifest, checked against its events file (count, bytes
/// and hash) before anything is written from it.
pub fn open_backup(dir: &Path) -> Result<Manifest, TransferError> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read(&path).map_err(|e| {
        TransferError::Backup(format!(
            "{} is not a finished backup (no readable {MANIFEST}: {e})",
            dir.display()
        ))
    })?;
    let m: Manifest = serde_json::from_slice(&text).map_err(|e| {
        TransferError::Backup(format!("{}: not a backup manifest: {e}", path.display()))
    })?;
    if m.format != FORMAT {
        return Err(TransferError::Backup(format!(
            "{}: format {:?}, this tidemark reads {FORMAT:?}",
            path.display(),
            m.format
        )));
    }
    let events = dir.join(EVENTS);
    let mut f =
        std::fs::File::open(&events).map_err(io(format!("opening {}", events.display())))?;
    let mut h = blake3::Hasher::new();
    let bytes =
        std::io::copy(&mut f, &mut h).map_err(io(format!("reading {}", events.display())))?;
    if bytes != m.bytes || h.finalize().to_hex().as_str() != m.blake3 {
        return Err(TransferError::Backup(format!(
            "{} does not match its manifest (bytes or BLAKE3 differ): the backup is damaged",
            events.display()
        )));
    }
    Ok(m)
}

/// One line of the input.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    seq: u64,
    /// Absent: the default tenant (an export written before tenants).
    #[serde(default)]
    tenant: Option<String>,
    event_id: String,
    stream: String,
    subject: String,
    #[serde(rename = "type")]
    event_type: String,
    time: String,
    payload: Box<RawValue>,
}

/// Read JSON lines of events following `after` (the first has seq `after + 1`, each the next),
/// with no event_id twice, and hand them on in batches of events of one time.
struct Reader<R> {
    input: R,
    line: u64,
    next: u64,
    first: u64,
    buf: String,
    /// A line read past the end of the batch before it.
    held: Option<(u64, i64, NewEvent)>,
}

impl<R: BufRead> Reader<R> {
    fn new(input: R, after: u64) -> Self {
        Reader {
            input,
            line: 0,
            next: after + 1,
            first: after + 1,
            buf: String::new(),
            held: None,
        }
    }

    fn read_one(&mut self) -> Result<Option<(u64, i64, NewEvent)>, TransferError> {
        loop {
            self.buf.clear();
            let n = self
                .input
                .read_line(&mut self.buf)
                .map_err(io(format!("reading line {}", self.line + 1)))?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            if self.buf.trim().is_empty() {
                continue;
            }
            let line = self.line;
            let bad = |reason: String| TransferError::Line { line, reason };
            let l: Line = serde_json::from_str(self.buf.trim_end())
                .map_err(|e| bad(format!("not an event: {e}")))?;
            if l.seq != self.next {
                return Err(TransferError::Sequence {
                    line,
                    expected: self.next,
                    found: l.seq,
                    first: self.first,
                });
            }
            let time = crate::time::parse_rfc3339_micros(&l.time)
                .ok_or_else(|| bad(format!("time {:?} is not an RFC 3339 time", l.time)))?;
            let ev = NewEvent::from_json_text(
                Some(l.event_id),
                l.stream,
                l.subject,
                l.event_type,
                &l.payload,
            )
            .and_then(|ev| match &l.tenant {
                Some(t) => ev.in_tenant(t),
                None => Ok(ev),
            })
            .map_err(|e| bad(format!("invalid event: {e}")))?;
            self.next += 1;
            return Ok(Some((l.seq, time, ev)));
        }
    }

    /// The next batch: consecutive events of one time and one tenant, at most [`PAGE`].
    fn batch(&mut self) -> Result<Option<(u64, i64, Vec<NewEvent>)>, TransferError> {
        let Some((seq, time, ev)) = (match self.held.take() {
            Some(h) => Some(h),
            None => self.read_one()?,
        }) else {
            return Ok(None);
        };
        let mut events = vec![ev];
        while events.len() < PAGE {
            match self.read_one()? {
                Some((_, t, e)) if t == time && e.tenant == events[0].tenant => events.push(e),
                Some(other) => {
                    self.held = Some(other);
                    break;
                }
                None => break,
            }
        }
        Ok(Some((seq, time, events)))
    }
}

/// Where an import writes before the data directory takes the result.
const STAGING: &str = ".tidemark-import";

/// Import `inputs` in order — JSON lines of events, the first following seq `after` of the
/// pair, which must be where the ones before left the log — into the log of the data directory
/// `data`, which must hold no events (a missing directory is made). With the same seqs, ids
/// and times as the input. The log is written in a staging directory first and takes the
/// data directory's place only when every input went in whole: on any failure (a gap, a
/// repeat, an invalid line, a full disk) the data directory is as it was. Read models left
/// there are removed (they rebuild from the new log at the next start). `shard`: the shard
/// (spec section 20) whose log `data` is; the default tenant's events belong to shard 0
/// alone, so an input that has any is refused by another shard (but a tenant's move's
/// fillers, [`crate::MOVE_FILLER_TYPE`]).
pub async fn import<R: BufRead>(
    data: &Path,
    cfg: &LogConfig,
    shard: u32,
    inputs: Vec<(u64, R)>,
) -> Result<Imported, TransferError> {
    let created = !data.exists();
    std::fs::create_dir_all(data).map_err(io(format!("creating {}", data.display())))?;
    let r = import_checked(data, cfg, shard, inputs).await;
    if r.is_err() && created {
        // Nothing was there: nothing is left.
        let _ = std::fs::remove_dir_all(data);
    }
    r
}

async fn import_checked<R: BufRead>(
    data: &Path,
    cfg: &LogConfig,
    shard: u32,
    inputs: Vec<(u64, R)>,
) -> Result<Imported, TransferError> {
    let target = data.join(cfg.path.file_name().unwrap_or("log.redb".as_ref()));
    if target.exists() {
        let mut existing = cfg.clone();
        existing.path = target.clone();
        let (log, _) = Log::open(&existing).map_err(TransferError::Open)?;
        let head = EventLog::head(&log);
        log.close().await;
        if head > 0 {
            return Err(TransferError::NotEmpty {
                dir: data.to_owned(),
                head,
            });
        }
    }
    let staging = data.join(STAGING);
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(io(format!("creating {}", staging.display())))?;
    let r = import_into(&staging, cfg, shard, inputs).await;
    match r {
        Ok(done) => {
            let staged: Vec<PathBuf> = std::fs::read_dir(&staging)
                .map_err(io("reading the staging directory"))?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()
                .map_err(io("reading the staging directory"))?;
            for path in &staged {
                std::fs::File::open(path)
                    .and_then(|f| f.sync_all())
                    .map_err(io(format!("syncing {}", path.display())))?;
            }
            // The journal first, the log file last: a crash between them leaves the old,
            // empty log with no journal of its own, never the new log with the old journal.
            let log_name = cfg
                .path
                .file_name()
                .unwrap_or("log.redb".as_ref())
                .to_owned();
            let mut staged = staged;
            staged.sort_by_key(|p| p.file_name() == Some(log_name.as_os_str()));
            for path in &staged {
                let name = path.file_name().unwrap_or_default();
                std::fs::rename(path, data.join(name))
                    .map_err(io("moving the imported log into place"))?;
            }
            let _ = std::fs::remove_dir(&staging);
            for stale in ["models.redb", "models.redb.unreadable"] {
                let _ = std::fs::remove_file(data.join(stale));
            }
            sync_dir(data)?;
            Ok(done)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

async fn import_into<R: BufRead>(
    dir: &Path,
    cfg: &LogConfig,
    shard: u32,
    inputs: Vec<(u64, R)>,
) -> Result<Imported, TransferError> {
    let mut c = cfg.clone();
    c.path = dir.join(cfg.path.file_name().unwrap_or("log.redb".as_ref()));
    // No sync per group: the staged files are synced once, whole, before they take the data
    // directory's place (a crash before that leaves only the staging directory, which the
    // next import removes).
    c.sync = false;
    let (log, _) = Log::open(&c).map_err(TransferError::Open)?;
    let r = write_inputs(&log, shard, inputs).await;
    log.close().await;
    r
}

/// A log an import writes to at exact seqs and times: the embedded log, or a JetStream stream
/// (every node's replica then records the imported times).
pub trait ImportTarget: EventLog {
    fn import_batch(
        &self,
        events: Vec<NewEvent>,
        first_seq: u64,
        at_us: i64,
    ) -> impl std::future::Future<Output = Result<crate::AppendReceipt, AppendError>> + Send;
}

/// The embedded log imports as it replicates (`JetStreamLog`'s impl is beside its appends).
impl ImportTarget for Log {
    async fn import_batch(
        &self,
        events: Vec<NewEvent>,
        first_seq: u64,
        at_us: i64,
    ) -> Result<crate::AppendReceipt, AppendError> {
        self.replicate(events, first_seq, at_us).await
    }
}

/// Import `inputs` (as [`import`] reads them) into the JetStream stream of `log`, which must
/// hold no events: the way from the embedded log to a cluster, with the same seqs, ids and
/// times. On a fault the stream keeps what was imported before it (a stream cannot be
/// rolled back): start again on a new stream. `shard`: as [`import`] takes it.
pub async fn import_jetstream<R: BufRead>(
    log: &crate::JetStreamLog,
    shard: u32,
    inputs: Vec<(u64, R)>,
) -> Result<Imported, TransferError> {
    let head = EventLog::head(log);
    if head > 0 {
        return Err(TransferError::NotEmpty {
            dir: PathBuf::from("(the JetStream stream)"),
            head,
        });
    }
    write_inputs(log, shard, inputs).await
}

/// Write each input in order into `log` (shard `shard`'s), each following where the one
/// before left it.
async fn write_inputs<L: ImportTarget, R: BufRead>(
    log: &L,
    shard: u32,
    inputs: Vec<(u64, R)>,
) -> Result<Imported, TransferError> {
    let mut events = 0;
    for (after, input) in inputs {
        let head = log.head();
        if after != head {
            return Err(TransferError::Backup(format!(
                "an input follows seq {after}, but the inputs before it end at {head}: a gap, \
                 or the inputs are out of order"
            )));
        }
        let mut reader = Reader::new(input, after);
        while let Some((first, time, batch)) = reader.batch()? {
            let n = batch.len() as u64;
            events += n;
            let tenant = batch[0].tenant.clone();
            if shard > 0
                && tenant.is_none()
                && batch
                    .iter()
                    .any(|e| e.event_type != crate::MOVE_FILLER_TYPE)
            {
                return Err(TransferError::Backup(format!(
                    "the events from seq {first} are the default tenant's, which lives in shard \
                     0: this is not shard {shard}'s log (spec section 20)"
                )));
            }
            let ids: Vec<String> = batch.iter().filter_map(|e| e.event_id.clone()).collect();
            if let Err(e) = log.import_batch(batch, first, time).await {
                // The log refuses an id it holds (or one twice in the batch): said as the
                // input's fault, naming where.
                let mut seen = std::collections::HashSet::new();
                let twice = ids.iter().any(|id| !seen.insert(id.as_str()))
                    || ids
                        .iter()
                        .any(|id| matches!(log.get_by_id(tenant.as_deref(), id), Ok(Some(_))));
                return Err(if twice {
                    TransferError::Duplicate {
                        first_seq: first,
                        last_seq: first + n - 1,
                    }
                } else {
                    TransferError::Append(e)
                });
            }
        }
    }
    Ok(Imported {
        events,
        head: log.head(),
    })
}

#[cfg(test)]
mod tests;
