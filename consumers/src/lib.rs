//! Reactors of tidemark: read state, append derived events with deterministic ids.
//!
//! # Layout
//! Empty in the foundation: the notification router, delivery scheduler and bridge notifier
//! arrive with their issues.

#![forbid(unsafe_code)]
