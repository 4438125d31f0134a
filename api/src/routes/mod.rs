//! HTTP handlers, one file per resource family.

pub mod events;
pub mod ops;
