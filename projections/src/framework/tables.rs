//! Access to a projection's tables: [`Reader`] for the queries (one read transaction) and
//! `TxnTables` inside the writer's transaction (the fold and the commands' views).

use std::collections::HashMap;

use redb::{ReadableTable, TableDefinition};
use serde::Deserialize;
use tidemark_log::StorageError;

use std::ops::RangeBounds;

use super::access::Src;
use super::cached::Row;
use super::overlay::{Merge, Overlay, Val};
use super::{Bytes, META, Meta, table_name};

/// Read access to projections for the API's paged lists: one read transaction (made by
/// `ModelsRead::reader`), so everything read through one `Reader`, and through the models'
/// views over [`Reader::src`] (`View::over`), is one consistent state of the log.
pub struct Reader {
    snap: Overlay,
}

impl Reader {
    pub(crate) fn new(snap: redb::ReadTransaction) -> Reader {
        Reader {
            snap: Overlay::new(snap),
        }
    }

    /// The same transaction, for the models' views (an overlay with no layers).
    pub fn src(&self) -> Src<'_> {
        Src::Mem(&self.snap)
    }

    fn txn(&self) -> &redb::ReadTransaction {
        self.snap.snap()
    }

    pub fn meta(&self, name: &str) -> Result<Meta, StorageError> {
        let t = match self.txn().open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Meta::default()),
            Err(e) => return Err(StorageError::of(e)),
        };
        match t.get(name).map_err(StorageError::of)? {
            Some(b) => postcard::from_bytes(b.value()).map_err(StorageError::of),
            None => Ok(Meta::default()),
        }
    }

    /// A projection table at its current generation, or `None` while it has no rows.
    pub fn table(
        &self,
        proj: &str,
        table: &str,
    ) -> Result<Option<redb::ReadOnlyTable<Bytes, Bytes>>, StorageError> {
        let generation = self.meta(proj)?.generation;
        let name = table_name(proj, table, generation);
        let def: TableDefinition<Bytes, Bytes> = TableDefinition::new(&name);
        match self.txn().open_table(def) {
            Ok(t) => Ok(Some(t)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(StorageError::of(e)),
        }
    }

    pub fn get_val<T: for<'de> Deserialize<'de>>(
        &self,
        proj: &str,
        table: &str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        let Some(t) = self.table(proj, table)? else {
            return Ok(None);
        };
        match t.get(key).map_err(StorageError::of)? {
            Some(v) => postcard::from_bytes(v.value())
                .map(Some)
                .map_err(StorageError::of),
            None => Ok(None),
        }
    }

    /// Every row of a table, decoded, in key order (none while it has no rows).
    pub fn values<T: for<'de> Deserialize<'de>>(
        &self,
        proj: &str,
        table: &str,
    ) -> Result<Vec<T>, StorageError> {
        use redb::ReadableTable;
        let Some(t) = self.table(proj, table)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for row in t.iter().map_err(StorageError::of)? {
            let (_, v) = row.map_err(StorageError::of)?;
            out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        }
        Ok(out)
    }
}

/// A projection's tables inside the writer's transaction or the decider's overlay, each
/// opened once: the fold writes through them (`Store`, in a redb transaction), and commands
/// that decide from state (claim, complete, ...) read them, seeing every event folded before
/// them.
pub(crate) struct TxnTables<'t> {
    pub(super) src: Src<'t>,
    pub(super) proj: &'static str,
    pub(super) generation: u32,
    tables: HashMap<&'static str, redb::Table<'t, Bytes, Bytes>>,
    /// The full names of the tables read through the overlay.
    names: HashMap<&'static str, String>,
}

impl<'t> TxnTables<'t> {
    /// The projection's tables at its current generation.
    pub fn new(src: Src<'t>, proj: &'static str) -> Result<Self, StorageError> {
        let generation = src.meta(proj)?.unwrap_or_default().generation;
        Ok(Self::at(src, proj, generation))
    }

    pub(super) fn at(src: Src<'t>, proj: &'static str, generation: u32) -> Self {
        TxnTables {
            src,
            proj,
            generation,
            tables: HashMap::new(),
            names: HashMap::new(),
        }
    }

    /// The table (created empty when the projection has not written it yet).
    pub fn table(&mut self, table: &'static str) -> Result<TableRef<'_>, StorageError> {
        match self.src {
            Src::Redb(_) => Ok(TableRef::Redb(&*self.table_mut(table)?)),
            Src::Mem(m) => {
                let (proj, generation) = (self.proj, self.generation);
                let name = self
                    .names
                    .entry(table)
                    .or_insert_with(|| table_name(proj, table, generation));
                Ok(TableRef::Mem(m, name.as_str()))
            }
        }
    }

    /// The table in the redb transaction (the fold's writes there).
    pub(super) fn table_mut(
        &mut self,
        table: &'static str,
    ) -> Result<&mut redb::Table<'t, Bytes, Bytes>, StorageError> {
        let Src::Redb(txn) = self.src else {
            return Err(StorageError::msg(
                "a table of the overlay opened for writing",
            ));
        };
        if !self.tables.contains_key(table) {
            let name = table_name(self.proj, table, self.generation);
            let def: TableDefinition<Bytes, Bytes> = TableDefinition::new(&name);
            let t = txn.open_table(def).map_err(StorageError::of)?;
            self.tables.insert(table, t);
        }
        Ok(self.tables.get_mut(table).expect("inserted above"))
    }

    pub fn get(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.table(table)?.get(key)?.map(|v| v.value().to_vec()))
    }

    pub fn get_val<T: for<'de> Deserialize<'de>>(
        &mut self,
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
        &mut self,
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
        &mut self,
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
        &mut self,
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

/// One table of a [`TxnTables`]: in the redb transaction, or through the overlay.
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
