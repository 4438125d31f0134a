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

/// Run a blocking read off the async workers; a failure is a storage failure, internal
/// (logged with its source, opaque to the client).
pub(crate) async fn blocking<
    T: Send + 'static,
    E: Into<tidemark_engine::QueryError> + Send + 'static,
>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal("read task failed", e))?
        .map_err(|e| ApiError::query("read failed", &e.into()))
}
