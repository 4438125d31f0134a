//! The projection framework: pure folds over the log, kept in redb tables of the log's file,
//! each with a checkpoint written in the same transaction as its state and a running digest.
//! The engine's follower folds committed events in batches ([`catch_up`]); a command catches
//! the models up to the head before it decides; readers wait until the models reach the head
//! of their request's arrival (`tidemark_engine::Queries`). The decider folds into in-memory
//! layers ([`Overlay`]) that the models store's writer commits after the reply.
//!
//! Tables of a projection are named `p.<projection>.<table>.g<generation>`, and another
//! tenant's than the default's `p.<projection>@<tenant>.<table>.g<generation>` (spec section
//! 20: each event is folded into its tenant's tables, and a view reads one tenant's; the
//! digest chain is one per projection, across its tenants). A rebuild folds the
//! log into generation `g+1` in chunks, and in the transaction that catches it up with the
//! head it switches the projection's meta row to `g+1` and drops generation `g`: readers see the
//! old model or the new one, never a half-built one.
//!
//! # Digest
//! Every write of a projection (table, key, value or deletion) while folding event `seq` is
//! hashed; when an event changed anything, the running digest becomes
//! `blake3(previous digest ‖ seq ‖ hash of the writes)`. The running digest is recorded in the
//! projection's `digests` table at fixed seq boundaries, every [`DIGEST_EVERY`] events (the
//! digest after folding every event up to and including the boundary), the same live and in a
//! rebuild (spec section 10). Two folds of the same log give the same rows; comparing two
//! generations finds the first boundary where they differ, and the rebuild names the first
//! event of that range which changed the model. (Data directories written before the
//! boundaries kept a row at every changing event; the digest at a boundary is read as the last
//! row at or before it, which is the same value in both layouts.)
//!
//! The parts: [`Store`] (a fold's writes, coalesced and hashed), the runtime that folds and
//! prepares the store (`runtime`), the read and write access to a projection's tables
//! (`Tables`, one type for every transaction) and snapshots.

mod access;
mod cached;
pub(crate) mod overlay;
pub mod paged;
mod runtime;
mod snapshots;
mod store;
pub mod subjects;
mod tables;
mod txn;

pub use access::{Src, TxMut};
pub(crate) use cached::postcard_row;
pub use cached::{Cached, CachedRow, Row};
pub use overlay::{Applied, Layer, Overlay};
pub use runtime::{FoldError, catch_up, checkpoint, prepare};
pub(crate) use runtime::{drop_other_generations, fold_events, read_meta, write_meta};
pub(crate) use snapshots::{restore_snapshot, snapshot};
pub use store::{DIGEST_EVERY, Store};
pub(crate) use tables::Tables;
pub(crate) use tables::under;
pub(crate) use txn::Inner;
pub use txn::{ModelsRead, ModelsTxn};

/// A model's view inside a models transaction (commands decide on it at the head): the
/// struct `View` over the model's tables (`$name`), each opened once, made by `View::new`.
/// The model's file adds what the view answers.
macro_rules! txn_view {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct View<'t> {
            /// The model's tables (named by its own file alone: `tests/model_keys.rs`).
            pub(crate) t: crate::framework::Tables<'t>,
        }

        impl<'t> View<'t> {
            /// The view of the transaction's tenant's rows (`ModelsTxn::tenant`).
            pub fn new(txn: &'t crate::framework::ModelsTxn) -> Result<Self, StorageError> {
                Self::over(txn.src(), txn.tenant())
            }

            /// The view of `tenant`'s rows in the transaction, whichever tenant it reads
            /// (`None`: the default tenant's): what looks at every tenant (the retention's
            /// cut) reads each so.
            pub fn of_tenant(
                txn: &'t crate::framework::ModelsTxn,
                tenant: Option<&str>,
            ) -> Result<Self, StorageError> {
                Self::over(txn.src(), tenant)
            }

            /// The view over `src` of `tenant`'s rows (another model's view's transaction
            /// and tenant).
            pub(crate) fn over(
                src: crate::framework::Src<'t>,
                tenant: Option<&str>,
            ) -> Result<Self, StorageError> {
                Ok(View {
                    t: crate::framework::Tables::new(src, tenant, $name)?,
                })
            }
        }
    };
}

pub(crate) use txn_view;

use redb::TableDefinition;
use serde::{Deserialize, Serialize};
use tidemark_log::{EventRef, StorageError};

/// A row of a `by_created` index (the newest-first lists of tasks and deliveries):
/// `key (8 bytes, big-endian) ‖ id`, so rows order by creation key, then id.
pub(crate) fn created_row(key: u64, id: &str) -> Vec<u8> {
    [&key.to_be_bytes()[..], id.as_bytes()].concat()
}

/// A u64 stored big-endian (counters, checkpoints), or `None` when the bytes are not one.
pub fn be_u64(b: &[u8]) -> Option<u64> {
    b.try_into().ok().map(u64::from_be_bytes)
}

/// A key or value read from a table, as its bytes (the file's, or the overlay's).
pub trait RowBytes {
    fn bytes(&self) -> &[u8];
}

impl RowBytes for redb::AccessGuard<'_, Bytes> {
    fn bytes(&self) -> &[u8] {
        self.value()
    }
}

impl RowBytes for overlay::Val<'_> {
    fn bytes(&self) -> &[u8] {
        self.value()
    }
}

/// The table of a projection's digests at seq boundaries (u64-keyed).
pub(crate) const DIGESTS: &str = "digests";

/// Per-projection bookkeeping, one row of the `projections` table.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("projections");

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub generation: u32,
    /// Last seq folded.
    pub checkpoint: u64,
    pub digest: [u8; 32],
    /// Number of events that changed this projection.
    pub changes: u64,
    /// [`Fold::VERSION`] of the code that built these tables.
    pub version: u32,
}

/// A projection: a pure fold of events into its tables. `apply` must depend only on the
/// event and the projection's own state: no clock, randomness or configuration (I3).
pub trait Fold: Send + Sync + 'static {
    const NAME: &'static str;
    /// Names of its tables (besides `digests`).
    const TABLES: &'static [&'static str];
    /// Bump when the stored rows or the fold change: at the next start the projection is
    /// rebuilt from the log instead of folding new events onto rows of another shape.
    const VERSION: u32 = 1;
    /// Fold one event, borrowed from the log: copy only what the model keeps.
    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError>;
}

/// A [`Fold`] as an object: what the fold runtime, the rebuilds and the snapshots hold.
pub trait Projection: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn tables(&self) -> &'static [&'static str];
    fn version(&self) -> u32;
    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError>;
}

impl<F: Fold> Projection for F {
    fn name(&self) -> &'static str {
        F::NAME
    }
    fn tables(&self) -> &'static [&'static str] {
        F::TABLES
    }
    fn version(&self) -> u32 {
        F::VERSION
    }
    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        Fold::apply(self, st, ev)
    }
}

pub(crate) fn table_name(proj: &str, table: &str, generation: u32) -> String {
    format!("p.{proj}.{table}.g{generation}")
}

/// The table of `tenant`'s rows (spec section 20): the default tenant's is the table as it
/// was before tenants ([`table_name`]), another's `p.<projection>@<tenant>.<table>.g<n>`. A
/// tenant's tables are made at its first write: a tenant never used costs no table.
pub(crate) fn tenant_table_name(
    tenant: Option<&str>,
    proj: &str,
    table: &str,
    generation: u32,
) -> String {
    match tenant {
        None => table_name(proj, table, generation),
        Some(t) => format!("p.{proj}@{t}.{table}.g{generation}"),
    }
}

pub(crate) type Bytes = &'static [u8];
