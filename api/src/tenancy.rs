//! Tenants at the API (spec section 20): which tenant a request acts for.
//!
//! A request names its tenant with a path prefix, `/tenants/{tenant}` before any `/v1` path
//! (`/tenants/acme/v1/events`), or not at all. A path rather than a header: a proxy routes and
//! rate-limits tenants on the path without reading headers, access logs and bookmarks show
//! it. A prefix before `/v1` rather than a segment after it: a client of a tenant is any
//! client with its base URL ending in `/tenants/{tenant}` (the generated clients need no
//! parameter on every operation, and the console switches tenants by its base). [`TenantPrefix`]
//! takes the prefix off before routing, so every route serves every tenant; [`resolve`] then
//! decides, with the caller's token:
//! - a tenant's token acts for its tenant; naming another is `403 tenant_forbidden` (never a
//!   404 that would tell the other exists), and the deployment's own operations (`/v1/admin/…`,
//!   the tenants' directory) are `403 tenant_forbidden` to it;
//! - a `*` token (or open mode) acts for the tenant it names, or for the default tenant;
//! - a tenant that is not in the directory (never created, or removed) is `404
//!   tenant_not_found` ([`crate::state::Api`] reads the directory).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{StatusCode, Uri};
use tower::Service;

use crate::error::ApiError;
use crate::state::Shared;

/// The tenant a request named in its path, taken off it by [`TenantPrefix`].
#[derive(Debug, Clone)]
pub(crate) struct Named(pub Arc<str>);

/// The tenant a request acts for once its token and path agree (`None`: the default tenant).
#[derive(Debug, Clone, Default)]
pub(crate) struct Acting(pub Option<Arc<str>>);

/// The shard a tenant's request was served from, as its [`crate::state::Api`] resolved it
/// (set once, read by the front after the answer: a read answered from a shard the tenant is
/// fenced out of is not given, spec section 20).
#[derive(Clone, Default)]
pub(crate) struct ServedBy(pub Arc<std::sync::OnceLock<usize>>);

/// The refusal of a tenant's request while a move fences it (on a cluster: until this node
/// has seen the move's switch): nothing was done; the same request succeeds shortly.
pub(crate) fn moving(tenant: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "tenant_moving",
        format!(
            "tenant {tenant:?} is being moved to another shard; nothing was done: retry after \
             the indicated delay"
        ),
    )
    .retry_after(1)
}

const PREFIX: &str = "/tenants/";

/// `/tenants/{tenant}/v1/{rest}` as (`tenant`, `/v1/{rest}`); `None` for any other path.
pub(crate) fn split(path: &str) -> Option<(&str, String)> {
    let rest = path.strip_prefix(PREFIX)?;
    let (tenant, tail) = rest.split_once('/')?;
    if !tail.starts_with("v1/") || tidemark_log::check_tenant(tenant).is_err() {
        return None;
    }
    Some((tenant, format!("/{tail}")))
}

/// The router behind a rewrite of `/tenants/{tenant}/v1/…` to `/v1/…`, the tenant kept on
/// the request as [`Named`].
#[derive(Clone)]
pub struct TenantPrefix<S> {
    pub(crate) inner: S,
}

impl<S> Service<Request> for TenantPrefix<S>
where
    S: Service<Request, Error = Infallible>,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> S::Future {
        if let Some((tenant, path)) = split(req.uri().path()) {
            let tenant: Arc<str> = Arc::from(tenant);
            let path_and_query = match req.uri().query() {
                Some(q) => format!("{path}?{q}"),
                None => path,
            };
            let mut parts = req.uri().clone().into_parts();
            if let Ok(pq) = path_and_query.parse() {
                parts.path_and_query = Some(pq);
                if let Ok(uri) = Uri::from_parts(parts) {
                    *req.uri_mut() = uri;
                    req.extensions_mut().insert(Named(tenant));
                }
            }
        }
        self.inner.call(req)
    }
}

/// Whether `path` (a matched route) is the deployment's, not a tenant's: its operators' alone.
fn deployment_wide(path: &str) -> bool {
    path.starts_with("/v1/admin/")
        || path == "/v1/tenants"
        || path.starts_with("/v1/tenants/")
        || path == "/v1/shards"
}

fn forbidden(detail: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "tenant_forbidden", detail)
}

/// Decide the tenant `req` acts for from its token and its path ([`Acting`]), or refuse.
pub(crate) fn resolve(state: &Shared, req: &mut Request, matched: &str) -> Result<(), ApiError> {
    let named = req.extensions_mut().remove::<Named>().map(|n| n.0);
    let token = state.auth.tenant_of(req);
    if deployment_wide(matched) {
        if let Some(t) = token {
            return Err(forbidden(format!(
                "this token acts for tenant {t:?}; the deployment's operations are its \
                 operators' (a \"*\" token)"
            )));
        }
        if named.is_some() {
            return Err(ApiError::not_found("no such resource"));
        }
    }
    let acting = match (token, named) {
        (Some(t), Some(n)) if t != n => {
            return Err(forbidden(format!("this token acts for tenant {t:?} only")));
        }
        (Some(t), _) => Some(t),
        (None, named) => named,
    };
    // The default tenant is what a request without `Acting` acts for: nothing to insert.
    if let Some(t) = acting.filter(|t| &**t != tidemark_log::DEFAULT_TENANT) {
        req.extensions_mut().insert(Acting(Some(t)));
        req.extensions_mut().insert(ServedBy::default());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_is_taken_off_a_tenants_paths_only() {
        assert_eq!(
            split("/tenants/acme/v1/events"),
            Some(("acme", "/v1/events".to_owned()))
        );
        assert_eq!(
            split("/tenants/acme/v1/deliveries/d-1/fail"),
            Some(("acme", "/v1/deliveries/d-1/fail".to_owned()))
        );
        for other in [
            "/v1/tenants",
            "/v1/tenants/acme",
            "/v1/tenants/acme/events",
            "/tenants/acme",
            "/tenants/acme/",
            "/tenants/acme/v2/events",
            "/tenants/acme/healthz",
            "/tenants/ACME/v1/events",
            "/tenants/9lives/v1/events",
            "/v1/events",
        ] {
            assert_eq!(split(other), None, "{other}");
        }
    }

    #[test]
    fn the_deployments_operations_are_its_operators() {
        for p in [
            "/v1/admin/projections",
            "/v1/tenants",
            "/v1/tenants/{name}",
            "/v1/shards",
        ] {
            assert!(deployment_wide(p), "{p}");
        }
        for p in ["/v1/events", "/v1/routes/{name}", "/v1/tasks/{id}/stream"] {
            assert!(!deployment_wide(p), "{p}");
        }
    }
}
