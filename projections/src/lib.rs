//! Read models of tidemark: pure folds over the event log.
//!
//! # Layout
//! - [`ids`]: the typed ids (task, delivery, notification, subscription, bridge).
//! - [`names`]: the reserved streams, event types, delivery statuses and derived ids, each
//!   named once.
//! - [`schema`]: the event types tidemark reserves, who may write them, and the payload rules
//!   of the client-written ones (spec section 2). The API checks every append against it.
//! - [`framework`]: the [`Projection`] trait, the fold runtime ([`framework::catch_up`]),
//!   the in-memory layers the decider folds into ([`framework::Overlay`]), checkpoints, digest
//!   chains and snapshots; the store's transactions ([`ModelsRead`], [`ModelsTxn`]); `Tables`, a
//!   model's tables in any of them; the lists' paged join
//!   ([`framework::paged`]); [`subjects`], the last seq of each conditioned subject. It names
//!   no model.
//! - The read models, each a folder or a file with its fold, its view (what commands read at
//!   the head) and its queries: [`tasks`], [`notifications`], [`settings`], [`deliveries`],
//!   [`cursors`], [`bridges`], [`sources`], [`lists`], [`routes`], [`endpoints`].
//! - [`models`]: the models store (`models.redb`), which knows every model: [`Models`], and
//!   [`all`] the projections in the order they are applied, and their metas as operators
//!   read them ([`models::projections`]).
//! - [`routing`]: the delivery runtime's settings and rules (routes, backoff); the commands
//!   that apply them are the engine's (`tidemark_engine::commands`).
//! - [`by`], [`retention`], [`secrets`], [`trailing`]: payloads and encodings more than one
//!   model shares.
//! - [`rebuild`]: rebuild and verify from the log.
//!
//! # Public surface
//! [`Projection`] (with [`all`] and [`by_name`]); the models store; each model's row types,
//! views and queries; [`names`]; [`schema::check_client_event`]; [`rebuild::rebuild`]. The API
//! and the reactors reach the queries and rebuilds through `tidemark_engine`, never with a
//! database handle.

#![forbid(unsafe_code)]

pub mod bridges;
pub mod by;
pub mod cursors;
pub mod deliveries;
pub mod endpoints;
pub mod framework;
pub mod ids;
pub mod lists;
pub mod models;
pub mod names;
pub mod notifications;
pub mod rebuild;
pub mod retention;
pub mod routes;
pub mod routing;
pub mod schema;
pub mod secrets;
pub mod settings;
pub mod sources;
pub mod tasks;
pub mod tenants;
pub mod trailing;

pub use framework::{Meta, ModelsRead, ModelsTxn, Projection, subjects};
pub use models::{Models, ModelsConfig, all, by_name};
