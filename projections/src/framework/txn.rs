//! The models store's transactions as the models read them: [`ModelsRead`], the store as
//! one request reads it, and [`ModelsTxn`], the store as the decider folds and decides on it
//! (a redb write transaction, or the overlay). The store itself, which knows every model,
//! opens them (`crate::models::Models`).

use std::sync::Arc;

use redb::{Database, ReadableDatabase, WriteTransaction};
use tidemark_log::StorageError;

use super::{Overlay, Src};

/// The models store as one request reads it (`Models::read`); the queries open their read
/// transaction on it.
#[derive(Clone)]
pub struct ModelsRead(pub(crate) Arc<Database>);

impl ModelsRead {
    /// One read transaction of the store, read through the same views as the commands'
    /// (an overlay with no layers over it): a query asks the model's view what a command
    /// would (`deliveries::View::new(&models.snapshot()?)?.pending()`).
    pub fn snapshot(&self) -> Result<ModelsTxn, StorageError> {
        let snap = self.0.begin_read().map_err(StorageError::of)?;
        Ok(ModelsTxn::of(Inner::Mem(Overlay::new(snap))))
    }

    /// Every key of table `table` of projection `proj`, in order (inspection, for tests and
    /// tools: what a model keeps is otherwise read through its view alone).
    pub fn keys(
        &self,
        proj: &'static str,
        table: &'static str,
    ) -> Result<Vec<Vec<u8>>, StorageError> {
        let snap = self.snapshot()?;
        let tables = super::Tables::new(snap.src(), snap.tenant(), proj)?;
        let mut out = Vec::new();
        for row in tables.table(table)?.iter()? {
            out.push(row.map_err(StorageError::of)?.0.value().to_vec());
        }
        Ok(out)
    }
}

/// The models store as the decider folds and decides on it: a write transaction (the start,
/// tools, tests, a compaction) or the overlay (`Models::overlay`). Outside this crate it is
/// read through the models' views alone (`deliveries::View::new(&txn)`, `cursors::View`, …),
/// each of which owns its model's key layout; no storage type leaves the crate.
///
/// A transaction reads one tenant's rows at a time ([`ModelsTxn::enter`]; the default
/// tenant's at first): the views made on it are that tenant's.
pub struct ModelsTxn {
    pub(crate) inner: Inner,
    tenant: Option<Arc<str>>,
}

/// One per decider (or per tool's transaction): its size does not matter.
#[allow(
    clippy::large_enum_variant,
    reason = "a temporary, one at a time: boxing would cost an allocation per use"
)]
pub(crate) enum Inner {
    Redb(WriteTransaction),
    Mem(Overlay),
}

impl ModelsTxn {
    pub(crate) fn of(inner: Inner) -> ModelsTxn {
        ModelsTxn {
            inner,
            tenant: None,
        }
    }

    /// Read `tenant`'s rows from now on (`None`: the default tenant's).
    pub fn enter(&mut self, tenant: Option<&str>) {
        if self.tenant.as_deref() != tenant {
            self.tenant = tenant.map(Arc::from);
        }
    }

    /// The tenant whose rows the views read (`None`: the default tenant).
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The store as a command reads it.
    pub(crate) fn src(&self) -> Src<'_> {
        match &self.inner {
            Inner::Redb(t) => Src::Redb(t),
            Inner::Mem(m) => Src::Mem(m),
        }
    }

    /// The redb transaction (not the overlay's: its writes go through `Models::write`).
    pub(crate) fn raw(&self) -> Result<&WriteTransaction, StorageError> {
        match &self.inner {
            Inner::Redb(t) => Ok(t),
            Inner::Mem(_) => Err(StorageError::msg(
                "the decider's overlay has no transaction of the file to write in",
            )),
        }
    }

    /// The overlay, when this is one.
    pub fn overlay(&mut self) -> Option<&mut Overlay> {
        match &mut self.inner {
            Inner::Redb(_) => None,
            Inner::Mem(m) => Some(m),
        }
    }

    /// Commit (without a sync: `Models::persist` makes it durable). An overlay is written
    /// by `Models::write`, layer by layer, not committed.
    pub fn commit(self) -> Result<(), StorageError> {
        match self.inner {
            Inner::Redb(t) => t.commit().map_err(StorageError::of),
            Inner::Mem(_) => Err(StorageError::msg("an overlay is written, not committed")),
        }
    }

    /// The seq of the last event of the tenant's `(stream, subject)` as the models have it
    /// (0: none, or every one of them is before `first_seq`, compacted):
    /// [`super::subjects`].
    pub fn last_of(
        &self,
        stream: &str,
        subject: &str,
        first_seq: u64,
    ) -> Result<u64, StorageError> {
        super::subjects::last(self.src(), self.tenant(), stream, subject, first_seq)
    }
}
