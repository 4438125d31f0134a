//! Why a command did not act, as its caller sees it: the engine's domain errors, not the
//! log's (the log speaks only of appends and reads).

use tidemark_log::{AppendError, StorageError};

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
    /// The log's storage failed under a command's read of it.
    #[error("storage failure in a command: {0}")]
    Storage(#[source] StorageError),
    /// The models store failed (or its writer, the decider, panicked): a fault domain of its
    /// own (spec I10): the log is not affected, and the command can be retried once the store
    /// is reopened (or, after a panic, once the server restarts).
    #[error("the models store failed: {0}")]
    Models(#[source] StorageError),
    /// The decider (the models' writer) panicked: the text says what is known of this command
    /// (nothing appended, or, for one in its hands at the panic, that it is not known).
    #[error("{0}")]
    Poisoned(String),
    /// The server's configuration cannot carry out the command (a redacting route without a
    /// privacy key): nothing was appended; the operator must fix the configuration.
    #[error("misconfigured: {0}")]
    Misconfigured(String),
}

/// A read model's view failed: the models store's failure (a command reads nothing else
/// through a view).
impl From<StorageError> for CommandError {
    fn from(e: StorageError) -> Self {
        CommandError::Models(e)
    }
}

impl CommandError {
    /// The event a command would record is not valid (a field too long, say): the input is
    /// refused, and the log is not touched. Never a storage failure, which would stop the log.
    pub fn invalid_event(e: impl std::fmt::Display) -> Self {
        CommandError::rejected(
            RejectKind::Invalid,
            "invalid_field",
            format!("the event this would record is not valid: {e}"),
        )
    }

    pub fn rejected(kind: RejectKind, code: &'static str, detail: impl Into<String>) -> Self {
        CommandError::Rejected {
            kind,
            code,
            detail: detail.into(),
        }
    }
}
