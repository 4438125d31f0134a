//! A projection's tables in one transaction of the models store, for every reader of them:
//! its fold (through `Store`, in a redb write transaction), the commands' views at the head
//! (over the decider's overlay) and the queries (over a read transaction, an overlay with no
//! layers: `ModelsRead::snapshot`). One type, as redb's `ReadableTable` serves its read-only
//! and writable tables alike.

use std::cell::OnceCell;
use std::ops::RangeBounds;
use std::sync::Arc;

use redb::{ReadableTable, TableDefinition};
use serde::Deserialize;
use tidemark_log::StorageError;

use super::access::Src;
use super::cached::Row;
use super::overlay::{Merge, Overlay, Val};
use super::{Bytes, tenant_table_name};

/// The most tables one projection opens in one transaction (the deliveries model has 29).
const SLOTS: usize = 40;

/// A projection's tables of one tenant in one transaction, each opened once and held while
/// it lasts, so that several are read at once (the lists' paged join) through a shared
/// borrow.
pub(crate) struct Tables<'t> {
    pub(super) src: Src<'t>,
    /// `None`: the default tenant.
    tenant: Option<Arc<str>>,
    pub(super) proj: &'static str,
    pub(super) generation: u32,
    open: [OnceCell<Open<'t>>; SLOTS],
}

/// One table of a [`Tables`]: its full name, and the redb table when the transaction is one.
struct Open<'t> {
    table: &'static str,
    name: String,
    /// Boxed: a view over the overlay (each command's) opens none, and its slots stay small.
    redb: Option<Box<redb::Table<'t, Bytes, Bytes>>>,
}

impl<'t> Tables<'t> {
    /// `tenant`'s tables of the projection at its current generation.
    pub fn new(
        src: Src<'t>,
        tenant: Option<&str>,
        proj: &'static str,
    ) -> Result<Self, StorageError> {
        let generation = src.meta(proj)?.unwrap_or_default().generation;
        Ok(Self::at(src, tenant.map(Arc::from), proj, generation))
    }

    pub(super) fn at(
        src: Src<'t>,
        tenant: Option<Arc<str>>,
        proj: &'static str,
        generation: u32,
    ) -> Self {
        Tables {
            src,
            tenant,
            proj,
            generation,
            open: [const { OnceCell::new() }; SLOTS],
        }
    }

    /// The transaction (for another model's view over it: `View::over`).
    pub(crate) fn src(&self) -> Src<'t> {
        self.src
    }

    /// The tenant whose tables these are (`None`: the default tenant).
    pub(crate) fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// `table`, opened at its first use (created empty, in a write transaction, when the
    /// projection has not written it yet).
    fn slot(&self, table: &'static str) -> Result<&Open<'t>, StorageError> {
        for cell in &self.open {
            match cell.get() {
                Some(o) if o.table == table => return Ok(o),
                Some(_) => continue,
                None => {
                    let name = tenant_table_name(
                        self.tenant.as_deref(),
                        self.proj,
                        table,
                        self.generation,
                    );
                    let redb = match self.src {
                        Src::Redb(txn) => {
                            let def: TableDefinition<Bytes, Bytes> = TableDefinition::new(&name);
                            Some(Box::new(txn.open_table(def).map_err(StorageError::of)?))
                        }
                        Src::Mem(_) => None,
                    };
                    return Ok(cell.get_or_init(|| Open { table, name, redb }));
                }
            }
        }
        Err(StorageError::msg(format!(
            "projection {} opened more than {SLOTS} tables",
            self.proj
        )))
    }

    /// The table.
    pub fn table(&self, table: &'static str) -> Result<TableRef<'_>, StorageError> {
        let o = self.slot(table)?;
        Ok(match (&o.redb, self.src) {
            (Some(t), _) => TableRef::Redb(t),
            (None, Src::Mem(m)) => TableRef::Mem(m, o.name.as_str()),
            (None, Src::Redb(_)) => unreachable!("a redb transaction's tables are opened in it"),
        })
    }

    /// The table in the redb transaction (the fold's writes there).
    pub(super) fn table_mut(
        &mut self,
        table: &'static str,
    ) -> Result<&mut redb::Table<'t, Bytes, Bytes>, StorageError> {
        if !matches!(self.src, Src::Redb(_)) {
            return Err(StorageError::msg(
                "a table of the overlay opened for writing",
            ));
        }
        self.slot(table)?;
        self.open
            .iter_mut()
            .filter_map(OnceCell::get_mut)
            .find(|o| o.table == table)
            .and_then(|o| o.redb.as_deref_mut())
            .ok_or_else(|| StorageError::msg("a table opened above is gone"))
    }

    pub fn get(&self, table: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.table(table)?.get(key)?.map(|v| v.value().to_vec()))
    }

    pub fn get_val<T: for<'de> Deserialize<'de>>(
        &self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        match self.table(table)?.get(key)? {
            Some(v) => postcard::from_bytes(v.value())
                .map(Some)
                .map_err(StorageError::of),
            None => Ok(None),
        }
    }

    /// A row in its own encoding ([`Row`]).
    pub fn get_row<T: Row>(
        &self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        self.table(table)?
            .get(key)?
            .map(|v| T::decode(v.value()))
            .transpose()
    }

    /// The keys of `table` that start with `prefix ‖ 0`, each the rest after it (an index's
    /// ids under one value: `prefix ‖ 0 ‖ id`).
    pub(crate) fn suffixes(
        &self,
        table: &'static str,
        prefix: &str,
    ) -> Result<Vec<String>, StorageError> {
        let (lo, hi) = under(prefix);
        let mut out = Vec::new();
        for row in self.table(table)?.range(lo.as_slice()..hi.as_slice())? {
            let (k, _) = row.map_err(StorageError::of)?;
            out.push(String::from_utf8_lossy(&k.value()[lo.len()..]).into_owned());
        }
        Ok(out)
    }

    /// Every row of `table`, decoded, in key order.
    pub(crate) fn values<T: for<'de> Deserialize<'de>>(
        &self,
        table: &'static str,
    ) -> Result<Vec<T>, StorageError> {
        let mut out = Vec::new();
        for row in self.table(table)?.iter()? {
            let (_, v) = row.map_err(StorageError::of)?;
            out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        }
        Ok(out)
    }
}

/// The keys `prefix ‖ 0 ‖ …` of an index or timeline lie in `prefix ‖ 0 .. prefix ‖ 1`.
pub(crate) fn under(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    (
        [prefix.as_bytes(), &[0u8]].concat(),
        [prefix.as_bytes(), &[1u8]].concat(),
    )
}

/// One table of a [`Tables`]: in the redb transaction, or through the overlay.
#[derive(Clone, Copy)]
pub(crate) enum TableRef<'a> {
    Redb(&'a redb::Table<'a, Bytes, Bytes>),
    Mem(&'a Overlay, &'a str),
}

impl<'a> TableRef<'a> {
    pub fn get(self, key: &[u8]) -> Result<Option<Val<'a>>, StorageError> {
        match self {
            TableRef::Redb(t) => Ok(t.get(key).map_err(StorageError::of)?.map(Val::Guard)),
            TableRef::Mem(m, name) => m.get(name, key),
        }
    }

    /// The rows within `range`, in key order (read from one end only).
    pub fn range<'k>(self, range: impl RangeBounds<&'k [u8]>) -> Result<Rows<'a>, StorageError> {
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        match self {
            TableRef::Redb(t) => Ok(Rows::Redb(
                t.range::<&[u8]>(bounds).map_err(StorageError::of)?,
            )),
            TableRef::Mem(m, name) => Ok(Rows::Mem(m.range(name, bounds)?)),
        }
    }

    /// Every row, in key order.
    pub fn iter(self) -> Result<Rows<'a>, StorageError> {
        self.range::<'static>(..)
    }
}

/// The rows of a [`TableRef::range`] (a temporary of one scan: its size does not matter).
#[allow(
    clippy::large_enum_variant,
    reason = "a temporary, one at a time: boxing would cost an allocation per use"
)]
pub(crate) enum Rows<'a> {
    Redb(redb::Range<'a, Bytes, Bytes>),
    Mem(Merge<'a>),
}

type Entry<'a> = Result<(Val<'a>, Val<'a>), redb::StorageError>;

impl<'a> Iterator for Rows<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        match self {
            Rows::Redb(r) => r
                .next()
                .map(|r| r.map(|(k, v)| (Val::Guard(k), Val::Guard(v)))),
            Rows::Mem(m) => m.next(),
        }
    }
}

impl<'a> DoubleEndedIterator for Rows<'a> {
    fn next_back(&mut self) -> Option<Entry<'a>> {
        match self {
            Rows::Redb(r) => r
                .next_back()
                .map(|r| r.map(|(k, v)| (Val::Guard(k), Val::Guard(v)))),
            Rows::Mem(m) => m.next_back(),
        }
    }
}

/// A stored row decoded with postcard.
pub(super) fn decode<T: for<'de> Deserialize<'de>>(
    bytes: Option<Vec<u8>>,
) -> Result<Option<T>, StorageError> {
    match bytes {
        Some(b) => postcard::from_bytes(&b).map(Some).map_err(StorageError::of),
        None => Ok(None),
    }
}
