//! What a call can fail with: the server's problem (typed by its stable `code`), the
//! transport, or an answer that is not what the API documents.

use std::time::Duration;

use reqwest::StatusCode;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with a problem (`application/problem+json`).
    #[error("{0}")]
    Api(Box<Problem>),
    /// No answer: the connection failed or was lost (the request may or may not have landed).
    #[error("transport: {0}")]
    Transport(#[source] reqwest::Error),
    /// An answer that does not read as the API documents it.
    #[error("unexpected answer: {0}")]
    Decode(String),
    /// The client was set up wrongly (a base URL without a scheme, say).
    #[error("client configuration: {0}")]
    Config(String),
}

impl Error {
    /// The problem's stable `code` (`event_id_conflict`, `rate_limited`, …), for a problem.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api(p) => Some(&p.code),
            _ => None,
        }
    }

    /// The HTTP status of a problem.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Api(p) => Some(p.status),
            _ => None,
        }
    }

    /// Whether sending the same request again may succeed: a lost connection, a 5xx, a 408
    /// or a 429.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Api(p) => crate::is_retryable_status(p.status),
            Error::Transport(e) => !e.is_builder() && !e.is_redirect(),
            _ => false,
        }
    }
}

/// A problem the server answered (RFC 9457), with the fields tidemark adds.
#[derive(Debug, Clone)]
pub struct Problem {
    pub status: StatusCode,
    /// The stable machine-readable code: one code for one mistake.
    pub code: String,
    pub title: String,
    pub detail: String,
    /// The offending field, when one is at fault.
    pub field: Option<String>,
    /// The position of the offending event in a batch.
    pub index: Option<usize>,
    /// `Retry-After`, when the server asked for a wait.
    pub retry_after: Option<Duration>,
    /// The whole problem as sent.
    pub body: serde_json::Value,
}

impl Problem {
    pub(crate) fn of(status: StatusCode, bytes: &[u8], retry_after: Option<Duration>) -> Problem {
        let body: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_else(|_| {
            serde_json::json!({"detail": String::from_utf8_lossy(bytes).chars().take(512).collect::<String>()})
        });
        let text = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        Problem {
            status,
            code: text("code").unwrap_or_else(|| format!("http_{}", status.as_u16())),
            title: text("title").unwrap_or_default(),
            detail: text("detail").unwrap_or_default(),
            field: text("field"),
            index: body
                .get("index")
                .and_then(serde_json::Value::as_u64)
                .map(|i| i as usize),
            retry_after,
            body,
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.detail)
    }
}
