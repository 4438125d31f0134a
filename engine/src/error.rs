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
}

/// The refusals' stable codes, each with its kind.
macro_rules! rejections {
    ($($(#[$m:meta])* $v:ident = $code:literal: $kind:ident,)*) => {
        /// Why a command refused, as the stable code its caller reads (a problem document's
        /// `code`); each has one [`RejectKind`], which picks the HTTP status.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Rejection { $($(#[$m])* $v,)* }

        impl Rejection {
            /// Every refusal, in declaration order.
            pub const ALL: &'static [Rejection] = &[$(Rejection::$v,)*];

            /// The code as clients read it.
            pub const fn code(self) -> &'static str {
                match self { $(Rejection::$v => $code,)* }
            }

            pub const fn kind(self) -> RejectKind {
                match self { $(Rejection::$v => RejectKind::$kind,)* }
            }
        }
    };
}

rejections! {
    /// no such delivery.
    DeliveryNotFound = "delivery_not_found": NotFound,
    /// no such notification list.
    ListNotFound = "list_not_found": NotFound,
    /// no such route managed through the API.
    RouteNotFound = "route_not_found": NotFound,
    /// no delivering route (email or webhook) of that name.
    EndpointNotFound = "endpoint_not_found": NotFound,
    /// no such bridge subscription.
    SubscriptionNotFound = "subscription_not_found": NotFound,
    /// no shard of that number in the deployment.
    ShardNotFound = "shard_not_found": NotFound,
    /// no such tenant (or it was removed).
    TenantNotFound = "tenant_not_found": NotFound,
    /// a tenant of that name exists or existed.
    TenantExists = "tenant_exists": Conflict,
    /// a tenant moves only into a shard no tenant was ever placed in (or one holding only a
    /// crashed move's copy of that tenant).
    ShardNotEmpty = "shard_not_empty": Conflict,
    /// the default tenant (it lives in the home shard), or a tenant to the shard it lives in.
    NotMovable = "not_movable": Conflict,
    /// the tenant, or the shard, is in a move already.
    MoveInProgress = "move_in_progress": Conflict,
    /// this deployment cannot move a tenant (its log backend, or a compacted source).
    MoveUnsupported = "move_unsupported": Conflict,
    /// what the command acts on kept changing while it was decided.
    Contended = "contended": Conflict,
    /// the cursor is not where the caller saw it.
    CursorConflict = "cursor_conflict": Conflict,
    /// the delivery's status does not allow it.
    IllegalTransition = "illegal_transition": Conflict,
    /// the lease ended before the report.
    LeaseExpired = "lease_expired": Conflict,
    /// a cursor moves forward only.
    NonMonotonicCursor = "non_monotonic_cursor": Conflict,
    /// the task's state no longer allows the delivery.
    NotDeliverable = "not_deliverable": Conflict,
    /// another worker holds the lease.
    NotLeaseOwner = "not_lease_owner": Conflict,
    /// the source is paused or parked.
    SourceNotActive = "source_not_active": Conflict,
    /// the subscription exists with another target.
    SubscriptionConflict = "subscription_conflict": Conflict,
    /// the source's watermark moved since it was read.
    WatermarkConflict = "watermark_conflict": Conflict,
    /// the delivery belongs to another bridge.
    ForeignDelivery = "foreign_delivery": Conflict,
    /// the delivery is not pending (out of order).
    NotPending = "not_pending": Conflict,
    /// the route is the configuration file's: it is changed there.
    RouteFromConfig = "route_from_config": Conflict,
    /// the event this would record is not valid.
    InvalidField = "invalid_field": Invalid,
    /// a source item is not valid.
    InvalidItem = "invalid_item": Invalid,
    /// the list is not valid.
    InvalidList = "invalid_list": Invalid,
    /// the route is not valid.
    InvalidRoute = "invalid_route": Invalid,
    /// the tenant's name is not valid (or is the default tenant's).
    InvalidTenant = "invalid_tenant": Invalid,
    /// an `env:` reference names a variable the answering node does not have.
    EnvUnset = "env_unset": Invalid,
    /// an operator action needs a reason.
    ReasonRequired = "reason_required": Invalid,
    /// a source's watermark moves forward only.
    WatermarkBackwards = "watermark_backwards": Invalid,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

/// Why a command did not act. Nothing of it is in the log when this is returned.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    #[error("{detail}")]
    Rejected { code: Rejection, detail: String },
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
/// A read of the models a command needs (a tenant's move reads the directory and the logs).
impl From<crate::QueryError> for CommandError {
    fn from(e: crate::QueryError) -> Self {
        CommandError::Storage(StorageError::from(e))
    }
}

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
            Rejection::InvalidField,
            format!("the event this would record is not valid: {e}"),
        )
    }

    pub fn rejected(code: Rejection, detail: impl Into<String>) -> Self {
        CommandError::Rejected {
            code,
            detail: detail.into(),
        }
    }

    /// The refusal's code, when it is one.
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            CommandError::Rejected { code, .. } => Some(*code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rejection;

    /// A code is what clients match on: each is unique and in the shape of every problem
    /// code (lower snake case).
    #[test]
    fn every_refusal_has_its_own_stable_code() {
        let mut seen = std::collections::HashSet::new();
        for r in Rejection::ALL {
            let c = r.code();
            assert!(seen.insert(c), "{c} twice");
            assert!(
                !c.is_empty() && c.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{c}"
            );
            assert_eq!(r.to_string(), c);
        }
    }
}
