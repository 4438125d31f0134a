//! Read models of tidemark: pure folds over the event log.
//!
//! # Layout
//! - [`ids`]: the typed ids (task, delivery, notification, subscription, bridge).
//! - [`names`]: the reserved streams, event types, delivery statuses and derived ids, each
//!   named once.
//! - [`schema`]: the event types tidemark reserves, who may write them, and the payload rules
//!   of the client-written ones (spec section 2). The API checks every append against it.
//! - [`framework`]: the [`Projection`] trait, the [`Projector`] hook that keeps every
//!   projection current inside the log's write transactions, checkpoints and digest chains.
//! - [`tasks`], [`notifications`], [`settings`], [`deliveries`]: the read models.
//! - [`cursors`], [`bridges`]: consumer cursors, bridge subscriptions and the terminal
//!   decision table.
//! - [`routing`]: the delivery runtime's settings and rules (routes, backoff); the commands
//!   that apply them are the engine's (`tidemark_engine::commands`).
//! - [`rebuild`]: rebuild and verify from the log.
//! - [`read`]: queries for the API, each in one read transaction.

//!
//! # Public surface
//! [`Projection`] and [`Projector`] (with [`all`], [`by_name`], [`projector`]); each model's
//! row types and table names; [`names`]; [`schema::check_client_event`]; the queries in
//! [`read`]; [`rebuild::rebuild`]. The API and the reactors reach the queries and rebuilds
//! through `tidemark_engine`, never with a database handle.

#![forbid(unsafe_code)]

/// A model's view inside a models transaction (commands decide on it at the head): the
/// struct `View` over the model's tables (`$name`), each opened once, made by `View::new`.
/// The model's file adds what the view answers.
macro_rules! txn_view {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct View<'t> {
            t: crate::framework::TxnTables<'t>,
        }

        impl<'t> View<'t> {
            pub fn new(txn: &'t crate::models::ModelsTxn) -> Result<Self, StorageError> {
                Ok(View {
                    t: crate::framework::TxnTables::new(txn.src(), $name)?,
                })
            }
        }
    };
}

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
pub mod read;
pub mod rebuild;
pub mod retention;
pub mod routes;
pub mod routing;
pub mod schema;
pub mod secrets;
pub mod settings;
pub mod sources;
pub mod subjects;
pub mod tasks;
pub mod trailing;

pub use framework::{Meta, Projection, Reader};
pub use models::{Models, ModelsConfig, ModelsRead, ModelsTxn};

static TASKS: tasks::Tasks = tasks::Tasks;
static NOTIFICATIONS: notifications::Notifications = notifications::Notifications;
static SETTINGS: settings::Settings = settings::Settings;
static DELIVERIES: deliveries::Deliveries = deliveries::Deliveries;
static CURSORS: cursors::Cursors = cursors::Cursors;
static BRIDGES: bridges::Bridges = bridges::Bridges;
static SOURCES: sources::Sources = sources::Sources;
static LISTS: lists::Lists = lists::Lists;
static ROUTES: routes::Routes = routes::Routes;

/// Every projection, in the order they are applied.
pub fn all() -> Vec<&'static dyn Projection> {
    vec![
        &TASKS,
        &NOTIFICATIONS,
        &SETTINGS,
        &DELIVERIES,
        &CURSORS,
        &BRIDGES,
        &SOURCES,
        &LISTS,
        &ROUTES,
    ]
}

/// A projection by name.
pub fn by_name(name: &str) -> Option<&'static dyn Projection> {
    all().into_iter().find(|p| p.name() == name)
}
