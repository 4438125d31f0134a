//! Read models of tidemark: pure folds over the event log.
//!
//! # Layout
//! - [`schema`]: the event types tidemark reserves, who may write them, and the payload rules
//!   of the client-written ones (spec section 2). The API checks every append against it.

#![forbid(unsafe_code)]

pub mod schema;
