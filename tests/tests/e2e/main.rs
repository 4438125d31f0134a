//! End-to-end tests: each test starts its own `tidemark serve` (port 0, own data dir) through
//! the harness in `tidemark_tests`, and checks the HTTP/SSE/CLI contract of
//! `docs/http-contract.md` and the invariants of the spec (I1, I2, I6, I9) from the outside.
//!
//! Build the binary first: `cargo build -p tidemark-api`.

mod common;
mod e2e_append;
mod e2e_auth;
mod e2e_bad_input;
mod e2e_cli;
mod e2e_crash;
mod e2e_ops;
mod e2e_resume;
mod e2e_shutdown;
