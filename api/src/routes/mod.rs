//! HTTP handlers, one file per resource family.

pub mod admin;
pub mod events;
pub mod notifications;
pub mod ops;
pub mod tasks;
