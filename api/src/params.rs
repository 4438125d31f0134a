//! Unknown query parameters are refused (spec section 7): `400 unknown_parameter`, never
//! silently ignored. The parameters each operation takes are read from the OpenAPI document
//! the router is built with, so what the server accepts and what the document says cannot
//! drift apart: a parameter added to a handler's query struct but not to its `params(...)` is
//! refused, and a test calls every operation with an unknown one.

use std::collections::{HashMap, HashSet};

use utoipa::openapi::path::ParameterIn;

use crate::error::ApiError;

/// (method, path template) → what the operation takes: its query parameters, and the scope
/// its `security` requirement names (section 8's table, as the router's groups set it).
#[derive(Debug, Default)]
pub struct Allowed(HashMap<String, Vec<(axum::http::Method, Operation)>>);

#[derive(Debug, Default)]
struct Operation {
    params: HashSet<String>,
    scope: Option<crate::auth::Scope>,
}

impl Allowed {
    /// Every operation of `doc` with its documented query parameters.
    pub fn from_doc(doc: &utoipa::openapi::OpenApi) -> Allowed {
        use axum::http::Method;
        let mut map = HashMap::new();
        for (path, item) in &doc.paths.paths {
            for (method, op) in [
                (Method::GET, &item.get),
                (Method::POST, &item.post),
                (Method::PUT, &item.put),
                (Method::DELETE, &item.delete),
                (Method::PATCH, &item.patch),
            ] {
                let Some(op) = op else { continue };
                let params: HashSet<String> = op
                    .parameters
                    .iter()
                    .flatten()
                    .chain(item.parameters.iter().flatten())
                    .filter(|p| matches!(p.parameter_in, ParameterIn::Query))
                    .map(|p| p.name.clone())
                    .collect();
                map.entry(path.clone()).or_insert_with(Vec::new).push((
                    method,
                    Operation {
                        params,
                        scope: scope_of(op),
                    },
                ));
            }
        }
        Allowed(map)
    }

    /// The scope the operation needs: `None` for an open one and for one any valid token may
    /// call (its handler identifies the caller).
    pub(crate) fn scope(
        &self,
        method: &axum::http::Method,
        path: &str,
    ) -> Option<crate::auth::Scope> {
        self.operation(method, path).and_then(|op| op.scope)
    }

    /// The documented operation a request on this route runs: `HEAD` runs the `GET` handler
    /// (axum routes it there), so it is that operation, scope and all.
    fn operation(&self, method: &axum::http::Method, path: &str) -> Option<&Operation> {
        let method = if method == axum::http::Method::HEAD {
            &axum::http::Method::GET
        } else {
            method
        };
        self.0
            .get(path)?
            .iter()
            .find(|(m, _)| m == method)
            .map(|(_, op)| op)
    }

    pub(crate) fn check(
        &self,
        method: &axum::http::Method,
        path: &str,
        query: &str,
    ) -> Result<(), ApiError> {
        // A route the document does not list (none should exist) is not judged here.
        let Some(Operation { params: names, .. }) = self.operation(method, path) else {
            return Ok(());
        };
        for (key, _) in form_urlencoded::parse(query.as_bytes()) {
            if key.is_empty() || names.contains(key.as_ref()) {
                continue;
            }
            let mut known: Vec<&str> = names.iter().map(String::as_str).collect();
            known.sort_unstable();
            let shown: String = key.chars().take(64).collect();
            return Err(ApiError::bad_request(
                "unknown_parameter",
                if known.is_empty() {
                    format!("unknown query parameter {shown:?}: this operation takes none")
                } else {
                    format!(
                        "unknown query parameter {shown:?}: this operation takes {}",
                        known.join(", ")
                    )
                },
            ));
        }
        Ok(())
    }
}

/// The scope named by an operation's bearer requirement (one scope per operation; none for an
/// open operation or one any valid token may call). A scope this server does not know is a
/// mistake in the router, refused at start rather than left unchecked.
fn scope_of(op: &utoipa::openapi::path::Operation) -> Option<crate::auth::Scope> {
    let value = serde_json::to_value(op.security.as_ref()?).ok()?;
    let name = value.get(0)?.get("bearer")?.get(0)?.as_str()?.to_owned();
    Some(
        crate::auth::Scope::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .unwrap_or_else(|| panic!("an operation requires the unknown scope {name:?}")),
    )
}
