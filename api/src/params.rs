//! Unknown query parameters are refused (spec section 7): `400 unknown_parameter`, never
//! silently ignored. The parameters each operation takes are read from the OpenAPI document
//! the router is built with, so what the server accepts and what the document says cannot
//! drift apart: a parameter added to a handler's query struct but not to its `params(...)` is
//! refused, and a test calls every operation with an unknown one.

use std::collections::{HashMap, HashSet};

use utoipa::openapi::path::ParameterIn;

use crate::error::ApiError;

/// (method, path template) → the query parameters the operation takes.
#[derive(Debug, Default)]
pub struct Allowed(HashMap<(axum::http::Method, String), HashSet<String>>);

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
                let names: HashSet<String> = op
                    .parameters
                    .iter()
                    .flatten()
                    .chain(item.parameters.iter().flatten())
                    .filter(|p| matches!(p.parameter_in, ParameterIn::Query))
                    .map(|p| p.name.clone())
                    .collect();
                map.insert((method, path.clone()), names);
            }
        }
        Allowed(map)
    }

    pub(crate) fn check(
        &self,
        method: &axum::http::Method,
        path: &str,
        query: &str,
    ) -> Result<(), ApiError> {
        // A route the document does not list (none should exist) is not judged here.
        let Some(names) = self.0.get(&(method.clone(), path.to_owned())) else {
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
