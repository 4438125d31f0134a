//! HTTP handlers, one file per resource family.

pub mod admin;
pub mod bridges;
pub mod cursors;
pub mod deliveries;
pub mod events;
pub mod notifications;
pub mod ops;
pub mod tasks;

use crate::error::ApiError;

/// Run a blocking read (redb) off the async workers; a failure is internal (logged, opaque).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal("read task failed", e))?
        .map_err(|e| ApiError::internal("read failed", e))
}

/// A read model can be read a moment before the writer publishes the log head of the commit
/// that produced it (the commit is visible to new read transactions first). Before answering a
/// seq taken from a read model, wait (bounded: it is the next instruction of the writer) until
/// the log's event reads reach it too, so a client that reads a model and then the log, or
/// streams from `latest_event_seq`, sees no gap (I6).
pub(crate) async fn reach(log: &tidemark_log::Log, seq: u64) {
    if log.head() >= seq {
        return;
    }
    let mut rx = log.subscribe();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        rx.wait_for(|h| *h >= seq),
    )
    .await;
}
