//! Errors of the log, one enum per operation family, wrapped by [`Error`]. A storage failure
//! is a [`StorageError`]: it keeps the error that caused it as its `source`, so the chain
//! reaches the log line of whoever handles it; nothing decides on its text.

use std::path::PathBuf;
use std::sync::Arc;

/// A storage failure: what tidemark was doing, and the underlying error (redb, the codec, the
/// OS) as its `source`, or none when tidemark itself found the stored state inconsistent.
#[derive(Debug, Clone)]
pub struct StorageError {
    context: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl StorageError {
    /// `context` caused by `source`.
    pub fn new(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> StorageError {
        StorageError {
            context: context.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// A failure found by tidemark itself (an inconsistent or unreadable stored value).
    pub fn msg(context: impl Into<String>) -> StorageError {
        StorageError {
            context: context.into(),
            source: None,
        }
    }

    /// The underlying error as a storage failure (for `map_err`).
    pub fn of(source: impl std::error::Error + Send + Sync + 'static) -> StorageError {
        StorageError::new(String::new(), source)
    }

    /// Whether it comes from a full disk (`ENOSPC`) anywhere down its source chain.
    pub fn is_storage_full(&self) -> bool {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = self
            .source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static));
        while let Some(e) = cur {
            if io_of(e).is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull) {
                return true;
            }
            cur = e.source();
        }
        false
    }

    /// Whether redb only says that an earlier I/O error happened (it answers so until the
    /// database is reopened): the cause was an earlier error.
    pub fn is_previous_io(&self) -> bool {
        self.any_redb(|s| matches!(s, redb::StorageError::PreviousIo))
    }

    /// Whether redb found the file's content corrupt or not a database at all (not an I/O
    /// failure of the machine: permissions, a lock, a full disk).
    pub fn is_corrupt(&self) -> bool {
        self.any_redb(|s| matches!(s, redb::StorageError::Corrupted(_)))
            || self.chain().any(|e| {
                matches!(
                    e.downcast_ref::<redb::DatabaseError>(),
                    Some(redb::DatabaseError::UpgradeRequired(_))
                ) || io_of(e).is_some_and(|io| {
                    matches!(
                        io.kind(),
                        std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
                    )
                })
            })
    }

    fn chain(&self) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
        std::iter::successors(
            self.source
                .as_deref()
                .map(|s| s as &(dyn std::error::Error + 'static)),
            |e| e.source(),
        )
    }

    fn any_redb(&self, f: impl Fn(&redb::StorageError) -> bool) -> bool {
        self.chain().any(|e| redb_storage_of(e).is_some_and(&f))
    }

    /// The same failure, said to have happened while doing `context`.
    pub fn context(mut self, context: impl Into<String>) -> StorageError {
        let c = context.into();
        self.context = if self.context.is_empty() {
            c
        } else {
            format!("{c}: {}", self.context)
        };
        self
    }
}

/// The redb storage error inside `e`, if `e` is one of redb's errors that wrap one (redb's
/// errors do not name it as their `source`).
fn redb_storage_of<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a redb::StorageError> {
    if let Some(s) = e.downcast_ref::<redb::StorageError>() {
        return Some(s);
    }
    if let Some(redb::CommitError::Storage(s)) = e.downcast_ref::<redb::CommitError>() {
        return Some(s);
    }
    if let Some(redb::TableError::Storage(s)) = e.downcast_ref::<redb::TableError>() {
        return Some(s);
    }
    if let Some(redb::TransactionError::Storage(s)) = e.downcast_ref::<redb::TransactionError>() {
        return Some(s);
    }
    if let Some(redb::DatabaseError::Storage(s)) = e.downcast_ref::<redb::DatabaseError>() {
        return Some(s);
    }
    None
}

/// The OS error inside `e`: an `io::Error`, or one that redb wraps.
fn io_of<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        return Some(io);
    }
    if let Some(redb::Error::Io(io)) = e.downcast_ref::<redb::Error>() {
        return Some(io);
    }
    match redb_storage_of(e) {
        Some(redb::StorageError::Io(io)) => Some(io),
        _ => None,
    }
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.source, self.context.is_empty()) {
            (Some(s), true) => write!(f, "{s}"),
            (Some(s), false) => write!(f, "{}: {s}", self.context),
            (None, _) => f.write_str(&self.context),
        }
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl From<String> for StorageError {
    fn from(s: String) -> Self {
        StorageError::msg(s)
    }
}

impl From<&str> for StorageError {
    fn from(s: &str) -> Self {
        StorageError::msg(s)
    }
}

/// What a storage failure at open means for the operator: a full disk is not damage (I10),
/// so it names the space needed and never advises a restore; a restore is advised only for
/// damage redb or the log has verified (I10): an I/O error may be the machine's, and a restore
/// over good data loses what the backup lacks.
fn open_storage_message(e: &StorageError) -> String {
    if e.is_storage_full() {
        format!(
            "the disk holding the log is full ({e}); nothing is damaged: free space (the journal \
             takes 16 MiB at open, and [log] min_free is kept in reserve, 64 MiB by default) and \
             start tidemark again"
        )
    } else if e.is_corrupt() {
        format!("the log file is damaged: {e}; restore it from a backup (docs/operations.md)")
    } else if let Some(io) = e.chain().find_map(io_of) {
        format!(
            "the log file cannot be read: {e}; nothing is known to be damaged: {}",
            io_advice(None, io)
        )
    } else {
        format!(
            "the log file cannot be read: {e}; nothing is known to be damaged: check the disk and \
             the file's permissions, then start tidemark again"
        )
    }
}

/// What to do about an I/O error met opening `path`: a permission problem names the file, its
/// owner and mode, and the user tidemark runs as (a restore run as root leaves `root:root` files
/// the service user cannot open); anything else, the disk and the permissions to check.
fn io_advice(path: Option<&std::path::Path>, io: &std::io::Error) -> String {
    match io.kind() {
        std::io::ErrorKind::PermissionDenied => {}
        // What redb read is not a database: a damaged file, or not a tidemark log at all.
        std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => {
            return "the file is damaged or is not a tidemark log: if --data names the right \
                    directory, restore it from a backup (docs/operations.md)"
                .to_owned();
        }
        _ => {
            return "check the disk, its free space and the file's permissions, then start \
                    tidemark again"
                .to_owned();
        }
    }
    let user_name = |uid: nix::unistd::Uid| {
        nix::unistd::User::from_uid(uid)
            .ok()
            .flatten()
            .map(|u| u.name)
    };
    let who = |uid: nix::unistd::Uid| {
        user_name(uid).map_or_else(|| format!("uid {uid}"), |n| format!("{n} (uid {uid})"))
    };
    let me = nix::unistd::getuid();
    let mut out = format!("tidemark runs as user {}", who(me));
    let Some(path) = path else {
        out.push_str(": give the data directory to that user or run tidemark as its owner");
        return out;
    };
    use std::os::unix::fs::MetadataExt;
    // The file itself, or the first directory above it that exists.
    if let Some((p, m)) = path
        .ancestors()
        .find_map(|p| std::fs::metadata(p).ok().map(|m| (p, m)))
    {
        out.push_str(&format!(
            ", and {} belongs to {} with mode {:o}",
            p.display(),
            who(nix::unistd::Uid::from_raw(m.uid())),
            m.mode() & 0o7777
        ));
    }
    out.push_str(&format!(
        ": give the data directory to that user (`chown -R {}: {}`) or run tidemark as its owner; \
         nothing is damaged",
        user_name(me).unwrap_or_else(|| me.to_string()),
        path.parent().unwrap_or(path).display()
    ));
    out
}

/// The pid of another process holding `path` open, when this process may look (Linux: a walk
/// of `/proc/<pid>/fd`; processes of other users are skipped unless tidemark runs as root).
fn holder_of(path: &std::path::Path) -> Option<u32> {
    let want = std::fs::canonicalize(path).ok()?;
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == want))
        {
            return Some(pid);
        }
    }
    None
}

fn database_message(path: &std::path::Path, e: &redb::DatabaseError) -> String {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => locked_message(path),
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => file_message(path, io),
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(_)) => format!(
            "the log file {} is damaged or not a tidemark log: {e}; restore it from a backup \
             (docs/operations.md)",
            path.display()
        ),
        _ => format!(
            "cannot open the log file {}: {e}; nothing is known to be damaged: check the disk and \
             the file's permissions",
            path.display()
        ),
    }
}

fn locked_message(path: &std::path::Path) -> String {
    let by = holder_of(path).map_or_else(
        || "another tidemark process".to_owned(),
        |pid| format!("another process (pid {pid})"),
    );
    format!(
        "the file {} is in use by {by}: a data directory is served by one tidemark at a time; \
         stop that one first, or give this one another --data directory; nothing is damaged",
        path.display()
    )
}

fn file_message(path: &std::path::Path, source: &std::io::Error) -> String {
    format!(
        "cannot open {}: {source}; {}",
        path.display(),
        io_advice(Some(path), source)
    )
}

/// Why a log could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("cannot create the data directory {path}: {source}; {}", io_advice(Some(.path), .source))]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", database_message(.path, .source))]
    Database {
        path: PathBuf,
        source: Box<redb::DatabaseError>,
    },
    #[error("{}", locked_message(.path))]
    Locked { path: PathBuf },
    #[error("{}", file_message(.path, .source))]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", open_storage_message(.0))]
    Storage(#[source] StorageError),
    #[error("stored event {seq} has an unknown format: {detail}; upgrade tidemark to read it")]
    Format { seq: u64, detail: String },
    /// A store derived from the log (the read models') cannot be opened: nothing of the log is
    /// at stake.
    #[error(
        "{what} cannot be opened: {source}; it is derived from the log, which is not affected: \
         fix the cause (permissions, free space) or delete it to have it rebuilt from the log"
    )]
    Derived {
        what: String,
        #[source]
        source: StorageError,
    },
}

/// Why an append was not applied. Nothing of the request is in the log when this is returned.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    #[error("invalid event at index {index}: {reason}")]
    Invalid {
        index: usize,
        field: &'static str,
        reason: String,
        kind: crate::envelope::InvalidKind,
    },
    #[error(
        "event_id {event_id:?} is already in the log at seq {seq} with different content; \
         send the original event or use a new event_id"
    )]
    Conflict { event_id: String, seq: u64 },
    #[error("the log is busy: {queued} requests are queued; retry shortly")]
    Overloaded { queued: usize },
    /// A conditional append whose condition did not hold: nothing was appended. Names the
    /// first part of the condition that failed (the head first, then the subjects in the
    /// order given).
    #[error(
        "the append expected the last seq of {on} to be {expected}, it is {actual}; nothing \
         was appended"
    )]
    ExpectationFailed {
        on: crate::condition::ConditionOn,
        expected: u64,
        actual: u64,
    },
    /// Free space is under `min_free` (or the disk is full): nothing was appended; retry when
    /// space returns (I10).
    #[error(
        "only {available} bytes are free for the log, under the {min_free} it keeps in reserve; \
         nothing was appended"
    )]
    InsufficientStorage { available: u64, min_free: u64 },
    /// The batch's tenant is fenced out of this log by a move (spec section 20): a batch that
    /// the stream ordered after the fence is void (no model or reactor acts on it, the move
    /// does not copy it), so nothing of it counts as appended; retry once the tenant lives in
    /// its new shard.
    #[error(
        "tenant {tenant:?} is being moved out of this shard (fenced at seq {fence_seq}); \
         nothing was appended: retry shortly"
    )]
    Fenced { tenant: String, fence_seq: u64 },
    #[error("the log is closed")]
    Closed,
    #[error("a storage failure poisoned the log: {0}; restart tidemark to reopen it")]
    Poisoned(#[source] StorageError),
    #[error("storage failure while appending: {0}")]
    Storage(#[source] StorageError),
}

/// Why a read failed. Reads never change the log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error("storage failure while reading: {0}")]
    Storage(#[source] StorageError),
    /// The position is before the first event the log still holds (compaction, spec
    /// section 13): events after it are gone.
    #[error("the log was compacted: it starts at seq {first}; read from seq {} on", first - 1)]
    Compacted { first: u64 },
    #[error("stored event {seq} cannot be decoded: {detail}")]
    Format { seq: u64, detail: String },
}

/// Umbrella error of the log crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Read(#[from] ReadError),
}

impl AppendError {
    /// Whether sending the same request again may succeed. Decided here, in one place.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            AppendError::Overloaded { .. } | AppendError::Fenced { .. }
        )
    }
}

pub(crate) fn storage<E: std::error::Error + Send + Sync + 'static>(e: E) -> StorageError {
    StorageError::of(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A storage failure keeps what caused it: the source is the original error, reachable by
    /// type, through every error that wraps it.
    #[test]
    fn a_storage_failure_keeps_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device");
        let e = StorageError::new("committing a group", io).context("appending");
        assert_eq!(
            e.to_string(),
            "appending: committing a group: no space left on device"
        );
        let wrapped = AppendError::Storage(e);
        let src = std::error::Error::source(&wrapped).expect("the storage error");
        let inner = src.source().expect("the io error");
        let io = inner
            .downcast_ref::<std::io::Error>()
            .expect("an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
        // A failure tidemark found itself has no source.
        let own = StorageError::msg("indexed event 7 is missing");
        assert!(std::error::Error::source(&own).is_none());
    }
}
