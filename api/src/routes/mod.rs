//! HTTP handlers, one file per resource family.

pub mod admin;
pub mod bridges;
pub mod cursors;
pub mod deliveries;
pub mod events;
pub mod lists;
pub mod notifications;
pub mod ops;
pub(crate) mod order;
pub mod routing;
pub mod sources;
pub mod tasks;
pub mod tenants;

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

/// `min_seq`, taken by every read of a read model (spec section 7).
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReadAt {
    /// Answer as of at least this seq (one seen elsewhere, e.g. in an append's receipt on
    /// another node). The head at the request's arrival is always waited for; the wait is
    /// bounded (5 s, then `503 projection_lagging`).
    #[param(value_type = Option<u64>)]
    pub min_seq: Option<String>,
}

impl ReadAt {
    pub(crate) fn seq(&self) -> Result<u64, ApiError> {
        Ok(events::parse_u64("min_seq", self.min_seq.as_deref())?.unwrap_or(0))
    }
}

/// A read of the read models as of at least the head at the request's arrival (or `min_seq`),
/// off the async workers: the answer and the `as_of_seq` it reflects at least.
pub(crate) async fn read_model<T: Send + 'static>(
    engine: &tidemark_engine::Engine,
    min_seq: u64,
    f: impl FnOnce(&tidemark_engine::Queries) -> Result<T, tidemark_engine::QueryError> + Send + 'static,
) -> Result<(T, u64), ApiError> {
    let engine = engine.clone();
    blocking(move || {
        let q = engine.read();
        let as_of = q.floor(min_seq)?;
        Ok::<_, tidemark_engine::QueryError>((f(q)?, as_of))
    })
    .await
}

/// The request acting for each tenant of the deployment: the default one, then every live one
/// of the directory (as the home shard's models hold it: at least as of its head now when
/// `waited`, as they stand otherwise) in its shard.
pub(crate) async fn every_tenant(
    st: &crate::state::Api,
    waited: bool,
) -> Result<Vec<crate::state::Api>, ApiError> {
    let home = st.engine.clone();
    let rows = blocking(move || {
        let q = home.read();
        if waited {
            q.tenants()
        } else {
            q.unwaited().tenants()
        }
    })
    .await?;
    Ok(st
        .acting_for(tidemark_log::DEFAULT_TENANT, 0)
        .into_iter()
        .chain(
            rows.iter()
                .filter(|r| r.is_live())
                .filter_map(|r| st.acting_for(&r.name, r.shard as usize)),
        )
        .collect())
}

/// The name of the token that made this request (`None` in open mode): the `by` of operator
/// actions (spec section 8).
pub(crate) fn caller(st: &crate::state::Api, headers: &axum::http::HeaderMap) -> Option<String> {
    let h = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    st.auth.identify(h).ok().and_then(|i| i.name)
}
