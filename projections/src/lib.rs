//! Read models of tidemark: pure folds over the event log.
//!
//! # Layout
//! - [`ids`]: the typed ids (task, delivery, notification, subscription, bridge).
//! - [`names`]: the reserved streams, event types, delivery statuses and derived ids, each
//!   named once.
//! - [`schema`]: the event types tidemark reserves, who may write them, and the payload rules
//!   of the client-written ones (spec section 2). The API checks every append against it.
//! - [`models`]: the models store (`models.redb`): [`Models`], its read and write transactions
//!   ([`ModelsRead`], [`ModelsTxn`]).
//! - [`framework`]: the [`Projection`] trait, the fold runtime ([`framework::catch_up`]),
//!   the in-memory layers the decider folds into ([`framework::Overlay`]), checkpoints, digest
//!   chains and snapshots; [`Reader`] and `TxnTables`, a model's tables in either transaction.
//! - The read models, each a folder or a file with its fold, its view (what commands read at
//!   the head) and its queries: [`tasks`], [`notifications`], [`settings`], [`deliveries`],
//!   [`cursors`], [`bridges`], [`sources`], [`lists`], [`routes`], [`endpoints`]; and
//!   [`subjects`], the last seq of each conditioned subject.
//! - [`routing`]: the delivery runtime's settings and rules (routes, backoff); the commands
//!   that apply them are the engine's (`tidemark_engine::commands`).
//! - [`by`], [`retention`], [`secrets`], [`trailing`]: payloads and encodings more than one
//!   model shares.
//! - [`rebuild`]: rebuild and verify from the log.
//! - [`read`]: the queries that span models (the API's pages), each in one read transaction.
//!
//! # Public surface
//! [`Projection`] (with [`all`] and [`by_name`]); the models store; each model's row types,
//! views and queries; [`names`]; [`schema::check_client_event`]; [`rebuild::rebuild`]. The API
//! and the reactors reach the queries and rebuilds through `tidemark_engine`, never with a
//! database handle.

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
                Self::over(txn.src())
            }

            /// The view over `src` (a [`crate::framework::Reader`]'s transaction).
            pub(crate) fn over(src: crate::framework::Src<'t>) -> Result<Self, StorageError> {
                Ok(View {
                    t: crate::framework::TxnTables::new(src, $name)?,
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
