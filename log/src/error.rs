//! Errors of the log, one enum per operation family, wrapped by [`Error`].

use std::path::PathBuf;

/// Why a log could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("cannot create the data directory {path}: {source}; check permissions and free space")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the log file {path}: {source}; is another tidemark process using it?")]
    Database {
        path: PathBuf,
        source: Box<redb::DatabaseError>,
    },
    #[error("the log file is unreadable: {0}; restore it from a backup")]
    Storage(String),
    #[error("stored event {seq} has an unknown format: {detail}; upgrade tidemark to read it")]
    Format { seq: u64, detail: String },
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
    /// A conditional append whose condition did not hold: nothing was appended.
    #[error(
        "the append expected the last seq of {what} to be {expected}, it is {actual}; nothing \
         was appended"
    )]
    ExpectationFailed {
        /// `the log` or `stream/subject`.
        what: String,
        expected: u64,
        actual: u64,
    },
    #[error("the log is closed")]
    Closed,
    #[error("a storage failure poisoned the log: {0}; restart tidemark to reopen it")]
    Poisoned(String),
    #[error("storage failure while appending: {0}")]
    Storage(String),
}

/// How a command refused to act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectKind {
    /// The thing the command acts on does not exist.
    NotFound,
    /// The state does not allow it (illegal transition, non-monotonic cursor, wrong owner).
    Conflict,
    /// The request is well-formed but not acceptable.
    Invalid,
    /// Too much pending work (I8).
    Overloaded,
}

/// Why a command did not act. Nothing of it is in the log when this is returned.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    #[error("{detail}")]
    Rejected {
        kind: RejectKind,
        code: &'static str,
        detail: String,
    },
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error("storage failure in a command: {0}")]
    Storage(String),
}

impl CommandError {
    pub fn rejected(kind: RejectKind, code: &'static str, detail: impl Into<String>) -> Self {
        CommandError::Rejected {
            kind,
            code,
            detail: detail.into(),
        }
    }
}

/// Why a read failed. Reads never change the log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error("storage failure while reading: {0}")]
    Storage(String),
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
        matches!(self, AppendError::Overloaded { .. })
    }
}

pub(crate) fn storage<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}
