//! Every error the API returns, as `application/problem+json` with a stable `code`.
//! Internal errors are logged with context and returned opaque.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tidemark_engine::{CommandError, RejectKind};
use tidemark_log::{AppendError, InvalidKind};
use utoipa::ToSchema;

/// RFC 9457 problem details.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable machine-readable code, e.g. `invalid_field`.
    pub code: String,
    /// Position of the offending event in the batch, when one event is at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// The offending field, when one is at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For conflicts: the seq of the event already in the log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// For `recipient_blocked`: the 0-based indexes of the blocked events of the batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<Vec<usize>>,
    /// For `recipient_blocked`: `"blocked"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub problem: Box<Problem>,
    pub retry_after_secs: Option<u64>,
    /// What went wrong on the server's side, for the operator: never sent to the client, written
    /// once, on the request's access-log line (one ERROR line per 5xx, with its route).
    cause: Option<Box<str>>,
}

/// What the access log learns of an error answer: its `code`, and the server-side cause when
/// there is one. Carried in the response's extensions from [`ApiError::into_response`] to the
/// front layer, which writes the request's one log line.
#[derive(Debug, Clone)]
pub struct Logged {
    pub code: String,
    pub cause: Option<Box<str>>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            problem: Box::new(Problem {
                kind: format!("https://tidemark.dev/problems/{code}"),
                title: status.canonical_reason().unwrap_or("error").to_owned(),
                status: status.as_u16(),
                detail: detail.into(),
                code: code.to_owned(),
                index: None,
                field: None,
                seq: None,
                blocked: None,
                outcome: None,
            }),
            retry_after_secs: None,
            cause: None,
        }
    }

    /// The server-side cause, logged on the request's access line (never answered).
    pub fn caused_by(mut self, cause: impl std::fmt::Display) -> Self {
        self.cause = Some(cause.to_string().into_boxed_str());
        self
    }

    pub fn at(mut self, index: usize, field: Option<&str>) -> Self {
        self.problem.index = Some(index);
        self.problem.field = field.map(str::to_owned);
        self
    }

    /// The same problem answered with another status (its title follows).
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self.problem.status = status.as_u16();
        self.problem.title = status.canonical_reason().unwrap_or("error").to_owned();
        self
    }

    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    pub fn bad_request(code: &str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, detail)
    }

    pub fn invalid_query(detail: impl Into<String>) -> Self {
        Self::bad_request("invalid_query", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down; retry against a running instance",
        )
        .retry_after(1)
    }

    /// A storage failure (I10): logged (on the access line) with its whole source chain; the
    /// client is told the log is unavailable (`503 log_unavailable`), never the cause.
    pub fn storage(context: &str, err: &tidemark_log::StorageError) -> Self {
        let mut chain = format!("{context}: {err}");
        let mut cur = std::error::Error::source(err);
        while let Some(s) = cur {
            chain.push_str(" ← ");
            chain.push_str(&s.to_string());
            cur = s.source();
        }
        Self::log_unavailable().caused_by(chain)
    }

    /// The log's storage failed (I10): appends and commands are refused until a restart.
    pub fn log_unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "log_unavailable",
            "a storage failure stopped the log: appends and commands are refused until tidemark \
             is restarted; reads of acknowledged data keep working where the storage allows",
        )
    }

    /// The models store failed (spec I10: a fault domain of its own; the log is not affected):
    /// `507` while its disk is full, else `503 models_unavailable`; the command appended
    /// nothing and can be retried.
    pub fn models_unavailable(err: &tidemark_log::StorageError) -> Self {
        let cause = format!("a command met a models store failure: {err}");
        if err.is_storage_full() {
            return Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                "the read models' disk is full; free space and retry (the log is not affected)",
            )
            .retry_after(5)
            .caused_by(cause);
        }
        Self::models_failed(
            "the read models' store failed and is being reopened (or, if its writer panicked, \
             until tidemark is restarted); nothing was appended, the log is not affected; retry",
        )
        .retry_after(1)
        .caused_by(cause)
    }

    /// A read of the read models met a failure of their store (spec I10: a fault domain of
    /// its own): `503 models_unavailable`, never `log_unavailable`, which would send an
    /// operator to the wrong store.
    pub fn models_read(context: &str, err: &tidemark_log::StorageError) -> Self {
        Self::models_failed(
            "the read models' store failed and is being reopened (or, if its writer panicked, \
             until tidemark is restarted); the log is not affected; retry",
        )
        .retry_after(1)
        .caused_by(format!("{context}: {err}"))
    }

    /// The decider panicked (spec I10): `503 models_unavailable` with what is known of the
    /// command, until a restart.
    pub fn models_poisoned(detail: impl Into<String>) -> Self {
        Self::models_failed(detail)
    }

    /// `503 models_unavailable`: the one answer of every failure of the models store.
    fn models_failed(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "models_unavailable",
            detail,
        )
    }

    /// The read models had not folded the log up to what the read waits for (spec section 7).
    pub fn projection_lagging(want: u64, at: u64) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "projection_lagging",
            format!(
                "the read models have folded the log up to seq {at}, behind the seq {want} this \
                 read must reflect; retry shortly"
            ),
        )
        .retry_after(1)
    }

    /// A failed query: lagging models, or storage.
    pub fn query(context: &str, err: &tidemark_engine::QueryError) -> Self {
        match err {
            tidemark_engine::QueryError::Lagging { want, at } => {
                Self::projection_lagging(*want, *at)
            }
            tidemark_engine::QueryError::Log(e) => Self::storage(context, e),
            tidemark_engine::QueryError::Models(e) => Self::models_read(context, e),
            tidemark_engine::QueryError::Compacted { first } => Self::new(
                StatusCode::GONE,
                "compacted",
                format!(
                    "the log was compacted: it starts at seq {first}, so a position before {} \
                     cannot be read; resume from {} or later",
                    first - 1,
                    first - 1
                ),
            ),
        }
    }

    /// A failure that is not the client's: logged (on the access line), answered without
    /// detail.
    pub fn internal(context: &str, err: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "an internal error occurred; it has been logged",
        )
        .caused_by(format!("{context}: {err}"))
    }
}

impl From<AppendError> for ApiError {
    fn from(e: AppendError) -> Self {
        match e {
            AppendError::Invalid {
                index,
                field,
                reason,
                kind,
            } => {
                let (status, code) = match kind {
                    InvalidKind::EmptyBatch => (StatusCode::BAD_REQUEST, "empty_batch"),
                    InvalidKind::BatchTooLarge => {
                        (StatusCode::PAYLOAD_TOO_LARGE, "batch_too_large")
                    }
                    InvalidKind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
                    _ => (StatusCode::BAD_REQUEST, "invalid_field"),
                };
                ApiError::new(status, code, reason).at(index, Some(field))
            }
            AppendError::Conflict { event_id, seq } => {
                let mut err = ApiError::new(
                    StatusCode::CONFLICT,
                    "event_id_conflict",
                    format!(
                        "event_id {event_id:?} is already in the log at seq {seq} with other content; nothing was appended"
                    ),
                );
                err.problem.seq = Some(seq);
                err
            }
            AppendError::Overloaded { .. } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "overloaded",
                "the log writer queue is full; retry after the indicated delay",
            )
            .retry_after(1),
            AppendError::Closed => ApiError::unavailable(),
            AppendError::Fenced { tenant, .. } => crate::tenancy::moving(&tenant),
            e @ AppendError::InsufficientStorage { .. } => ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                format!("{e}; free space on the log's disk and retry"),
            )
            .retry_after(5),
            e @ AppendError::ExpectationFailed { .. } => {
                ApiError::new(StatusCode::CONFLICT, "expectation_failed", e.to_string())
            }
            AppendError::Storage(e) | AppendError::Poisoned(e) => {
                ApiError::storage("append failed", &e)
            }
            other => ApiError::internal("append failed", other),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(mut self) -> Response {
        // The body's `status` is the answer's, whatever changed `status` after `new`.
        self.problem.status = self.status.as_u16();
        let body = serde_json::to_vec(&*self.problem).unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        // A 5xx's access line says why: the server-side cause when one was kept, else what
        // the answer says (a 507's free-space reserve, a 503's lagging models).
        let cause = self.cause.take().or_else(|| {
            self.status
                .is_server_error()
                .then(|| self.problem.detail.as_str().into())
        });
        resp.extensions_mut().insert(Logged {
            code: std::mem::take(&mut self.problem.code),
            cause,
        });
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after_secs {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        // RFC 6750: a 401 names the scheme (and why, when a token was sent but is not valid).
        if self.status == StatusCode::UNAUTHORIZED {
            h.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tidemark\""),
            );
        }
        resp
    }
}

impl From<tidemark_engine::ClientAppendError> for ApiError {
    fn from(e: tidemark_engine::ClientAppendError) -> Self {
        match e {
            tidemark_engine::ClientAppendError::Command(e) => e.into(),
            full @ tidemark_engine::ClientAppendError::OutboxFull { retry_after_s, .. } => {
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "outbox_full",
                    full.to_string(),
                )
                .retry_after(retry_after_s)
            }
            tidemark_engine::ClientAppendError::RecipientBlocked { indexes } => {
                // The detail names no recipient and no content (section 14: the server keeps
                // nothing of a blocked request, its log and answers included).
                let mut err = ApiError::new(
                    StatusCode::CONFLICT,
                    "recipient_blocked",
                    format!(
                        "{} notification(s) of the batch are for a suppressed recipient; \
                         nothing was appended",
                        indexes.len()
                    ),
                );
                err.problem.blocked = Some(indexes);
                err.problem.outcome = Some("blocked".to_owned());
                err
            }
        }
    }
}

impl From<tidemark_engine::CommandError> for ApiError {
    fn from(e: tidemark_engine::CommandError) -> Self {
        match e {
            CommandError::Rejected { code, detail } => {
                let status = match code.kind() {
                    RejectKind::NotFound => StatusCode::NOT_FOUND,
                    RejectKind::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
                    _ => StatusCode::CONFLICT,
                };
                ApiError::new(status, code.code(), detail)
            }
            CommandError::Append(e) => e.into(),
            CommandError::Storage(e) => ApiError::storage("command failed", &e),
            CommandError::Models(e) => ApiError::models_unavailable(&e),
            CommandError::Poisoned(why) => ApiError::models_poisoned(why.clone()).caused_by(why),
            CommandError::Misconfigured(why) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "misconfigured",
                "the server's configuration cannot carry this out; nothing was appended",
            )
            .caused_by(why),
            other => ApiError::internal("command failed", other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that meets a failed models store names that store; one that meets the log's
    /// storage names the log (spec I10: two fault domains, two answers).
    #[test]
    fn a_failed_query_names_the_store_that_failed() {
        let e = tidemark_log::StorageError::msg("injected");
        let models = ApiError::query(
            "listing tasks",
            &tidemark_engine::QueryError::Models(e.clone()),
        );
        assert_eq!(models.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(models.problem.code, "models_unavailable");
        assert_eq!(models.retry_after_secs, Some(1));
        assert!(
            !models.problem.detail.contains("injected"),
            "the cause is never answered"
        );
        let log = ApiError::query("reading events", &tidemark_engine::QueryError::Log(e));
        assert_eq!(log.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(log.problem.code, "log_unavailable");
    }
}
