//! The tidemark HTTP/SSE server and its CLI.
//!
//! # Layout
//! - [`config`]: embedded defaults → file → `TIDEMARK_*` environment.
//! - [`server`]: the router (every handler is in the OpenAPI document) and [`run`].
//! - `routes`: handlers, one file per resource family.
//! - `front`: the checks before every handler (request id, shutdown, rate limit, unknown
//!   parameters, scopes, request metrics); `auth`: bearer tokens and scopes; `error`:
//!   problem+json.
//! - `tenancy`: the tenant a request acts for (the `/tenants/{tenant}` prefix and the
//!   token's tenant); `state::Api`, what handlers read, holds the engine acting for it.
//! - [`cli`]: the `tidemark` command line.

#![forbid(unsafe_code)]

pub mod auth;
mod bench;
pub mod cli;
pub mod config;
pub mod error;
mod front;
mod metrics_setup;
mod openapi;
mod params;
pub mod request;
pub mod request_id;
pub mod routes;
pub mod server;
pub mod state;
mod tenancy;
pub mod tls;

pub use server::{RunError, router, run};
