//! The id of the request being served: a task-local set by [`crate::front::Front`] around each
//! request, read by whoever logs a line for it. A module of its own, below everything that
//! logs (the server, the front, auth, the routes), so none of them reaches up into the server
//! for it.

/// Run `fut` as the request with this `X-Request-ID` ([`crate::front::Front`] gives each
/// request one): the header value itself (a reference-counted clone), made text only when a
/// line is logged ([`current`]).
pub(crate) fn scope<F: Future>(
    id: axum::http::HeaderValue,
    fut: F,
) -> impl Future<Output = F::Output> {
    REQUEST_ID.scope(id, fut)
}

/// [`scope`] for synchronous work (the front's checks, which may log a refusal).
pub(crate) fn scope_sync<R>(id: axum::http::HeaderValue, f: impl FnOnce() -> R) -> R {
    REQUEST_ID.sync_scope(id, f)
}

tokio::task_local! {
    static REQUEST_ID: axum::http::HeaderValue;
}

/// The id of the request being served (empty outside one): the request's log lines carry it.
pub fn current() -> String {
    REQUEST_ID
        .try_with(|v| v.to_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}
