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
