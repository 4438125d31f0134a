//! What a failed command tells its operator: in words by default (what went wrong and what to
//! do), or the server's problem document itself under `-o json|jsonl`, for scripts.

use std::fmt::Write as _;

use serde_json::Value;
use tidemark_client::StatusCode;

/// Why a command failed.
#[derive(Debug)]
pub(crate) enum CliError {
    /// The server answered with an error status (its body is usually a problem document).
    Refused {
        status: StatusCode,
        /// The problem document, when the body was one (else `None` and `body` says why).
        problem: Option<Value>,
        body: String,
        /// The problem's detail said for this command's input (`append` says which line where
        /// the server says which event of the batch); the server's own when `None`.
        detail: Option<String>,
        /// Where the fault lies beyond what the server knows, e.g. `line 4 of events.jsonl`.
        context: Vec<String>,
    },
    /// No answer from the server at `url`.
    Unreachable {
        url: String,
        /// The innermost cause, e.g. `Connection refused (os error 111)`.
        cause: String,
        /// Nothing listens there: the server is not running at that address.
        refused: bool,
    },
    /// Whoever read stdout went away (`| head -1`): there is no one left to tell; exit quietly.
    ClosedPipe,
    /// Anything else, already said in words (a usage mistake, an unreadable file, ...).
    Other(String),
}

impl From<String> for CliError {
    fn from(s: String) -> Self {
        CliError::Other(s)
    }
}

impl From<&str> for CliError {
    fn from(s: &str) -> Self {
        CliError::Other(s.to_owned())
    }
}

impl CliError {
    /// An error answer of the server, from its status and body.
    pub(crate) fn refused(status: StatusCode, body: String) -> Self {
        let problem = serde_json::from_str::<Value>(&body)
            .ok()
            .filter(|v| v.get("code").is_some_and(Value::is_string));
        CliError::Refused {
            status,
            problem,
            body,
            detail: None,
            context: Vec::new(),
        }
    }

    /// Say the problem's detail in other words (the problem document keeps the server's).
    pub(crate) fn detail(mut self, text: String) -> Self {
        if let CliError::Refused { detail, .. } = &mut self {
            *detail = Some(text);
        }
        self
    }

    /// Add a line saying where the fault lies (shown under the error in words; ignored by the
    /// other kinds of error).
    pub(crate) fn context(mut self, line: impl Into<String>) -> Self {
        if let CliError::Refused { context, .. } = &mut self {
            context.push(line.into());
        }
        self
    }

    /// The problem's `code`, when the server sent one.
    pub(crate) fn code(&self) -> Option<&str> {
        match self {
            CliError::Refused {
                problem: Some(p), ..
            } => p["code"].as_str(),
            _ => None,
        }
    }

    /// The problem document, for `-o json|jsonl`: the server's, as it came.
    pub(crate) fn problem(&self) -> Option<&Value> {
        match self {
            CliError::Refused { problem, .. } => problem.as_ref(),
            _ => None,
        }
    }

    /// Mutable access to the problem document (`append` adds the `line` it came from).
    pub(crate) fn problem_mut(&mut self) -> Option<&mut Value> {
        match self {
            CliError::Refused { problem, .. } => problem.as_mut(),
            _ => None,
        }
    }

    /// The error in words: `error: <what> (<status> <code>): <detail>`, the context lines, and
    /// a `hint:` line saying what to do.
    pub(crate) fn human(&self) -> String {
        let mut s = String::new();
        match self {
            CliError::Refused {
                status,
                problem,
                body,
                detail,
                context,
            } => {
                let reason = status
                    .canonical_reason()
                    .unwrap_or("error")
                    .to_ascii_lowercase();
                match problem {
                    Some(p) => {
                        let title = p["title"].as_str().map_or(reason, str::to_ascii_lowercase);
                        let code = p["code"].as_str().unwrap_or_default();
                        let detail = detail
                            .as_deref()
                            .or(p["detail"].as_str())
                            .unwrap_or_default();
                        let _ = write!(s, "error: {title} ({} {code}): {detail}", status.as_u16());
                        if let Some(f) = p["field"].as_str() {
                            let _ = write!(s, " (field {f})");
                        }
                    }
                    None => {
                        let body = one_line(body, 200);
                        let _ =
                            write!(s, "error: the server answered {} {reason}", status.as_u16());
                        if !body.is_empty() {
                            let _ = write!(s, ": {body}");
                        }
                    }
                }
                for c in context {
                    let _ = write!(s, "\n  {c}");
                }
                let _ = write!(s, "\nhint: {}", hint(self.code(), *status));
            }
            CliError::Unreachable {
                url,
                cause,
                refused,
            } => {
                if *refused {
                    let _ = write!(
                        s,
                        "error: cannot reach the server at {url}: nothing is listening there \
                         ({cause})\nhint: the server is not running at that address: start it \
                         (`tidemark serve`), or point --url (or TIDEMARK_URL) at the one that runs"
                    );
                } else {
                    let _ = write!(
                        s,
                        "error: cannot reach the server at {url}: {cause}\nhint: check --url (or \
                         TIDEMARK_URL) and that the server is running and reachable from here"
                    );
                }
            }
            CliError::ClosedPipe => {}
            CliError::Other(m) => {
                let _ = write!(s, "error: {m}");
            }
        }
        s
    }
}

/// What to do about a refusal, from the problem's `code` (or the status when there is none).
pub(crate) fn hint(code: Option<&str>, status: StatusCode) -> &'static str {
    match code.unwrap_or_default() {
        "unauthorized" => {
            "pass a valid token with --token or the TIDEMARK_TOKEN environment variable"
        }
        "forbidden_scope" => {
            "this token lacks the scope the action needs (GET /v1/whoami lists its scopes); use \
             a token that has it"
        }
        "server_only_type" => {
            "only the server appends events of this type; send another type (nothing was appended)"
        }
        "not_found"
        | "delivery_not_found"
        | "notification_not_found"
        | "subscription_not_found" => {
            "check the id or name (list them with the matching `list` command) and --url"
        }
        "illegal_transition" => {
            "only a parked delivery can be retried or discarded; see its status with `tidemark \
             deliveries list`"
        }
        "non_monotonic_cursor" => {
            "a cursor only moves forward; to move it back, `tidemark cursors reset --to N \
             --reason ...` (admin)"
        }
        "cursor_conflict" => {
            "the cursor moved meanwhile; read it again (`tidemark cursors show`) and retry"
        }
        "reason_required" => "say why with --reason",
        "subscription_conflict" => {
            "a subscription with this id exists with another target: pick another \
             --subscription-id, or delete the old one first"
        }
        "event_id_conflict" => {
            "an event with this event_id is already in the log with other content; give this \
             one a new event_id (nothing was appended)"
        }
        "recipient_blocked" => {
            "the recipient is suppressed; drop those events or lift the suppression (nothing \
             was appended)"
        }
        "source_not_active" => {
            "the source is paused or parked: `tidemark sources resume NAME` first"
        }
        "rebuild_in_progress" => "a rebuild of this projection is running; wait for it, then retry",
        "malformed_json"
        | "invalid_field"
        | "schema_violation"
        | "reserved_event_id"
        | "empty_batch"
        | "invalid_query"
        | "unknown_parameter"
        | "invalid_last_event_id" => {
            "fix the input named above and run the command again (the server changed nothing)"
        }
        "body_too_large" | "batch_too_large" | "payload_too_large" => {
            "send less at once: smaller payloads or fewer events per request"
        }
        "compacted" => {
            "those events were compacted away; start later (a higher --after), at the first seq \
             the log still holds"
        }
        "overloaded" | "too_many_streams" | "outbox_full" | "rate_limited" => {
            "the server is pushing back: retry after a while (its Retry-After says how long)"
        }
        "shutting_down" => "the server is stopping; retry once it is back",
        "projection_lagging" | "catching_up" => {
            "the read models are catching up with the log; retry in a moment"
        }
        "log_unavailable" => {
            "the server's log stopped after a storage error: read the server's own log, fix the \
             cause, then restart it"
        }
        "models_unavailable" => {
            "the server's read models failed (its log did not): retry shortly; if it persists, \
             read the server's own log and restart it (the models rebuild from the log)"
        }
        "misconfigured" => {
            "the server's configuration cannot do this: its own log names the setting"
        }
        "insufficient_storage" => "the server's disk is full: free space, then retry",
        _ if status.is_server_error() => {
            "the server failed; its own log says why (look for this request's X-Request-ID)"
        }
        _ => "the server refused the request and changed nothing; the detail above says why",
    }
}

/// `s` on one line, cut to `max` characters.
fn one_line(s: &str, max: usize) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max - 1).collect::<String>())
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_reads_as_words_with_its_code_and_a_hint() {
        let body = r#"{"type":"x","title":"Conflict","status":409,"code":"non_monotonic_cursor",
                       "detail":"cursor is at 7"}"#;
        let e = CliError::refused(StatusCode::CONFLICT, body.into()).context("at line 3 of f");
        let text = e.human();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "error: conflict (409 non_monotonic_cursor): cursor is at 7"
        );
        assert_eq!(lines[1], "  at line 3 of f");
        assert!(
            lines[2].starts_with("hint: a cursor only moves forward"),
            "{text}"
        );
        assert_eq!(e.code(), Some("non_monotonic_cursor"));
    }

    #[test]
    fn a_body_that_is_no_problem_is_still_said_in_words() {
        let e = CliError::refused(StatusCode::BAD_GATEWAY, "<html>\n bad\n</html>".into());
        assert!(e.problem().is_none());
        let text = e.human();
        assert!(
            text.starts_with("error: the server answered 502 bad gateway: <html> bad </html>"),
            "{text}"
        );
        assert!(text.contains("\nhint: the server failed"), "{text}");
    }
}
