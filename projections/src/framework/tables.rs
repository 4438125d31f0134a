//! Access to a projection's tables: [`Reader`] for the queries (one read transaction) and
//! `TxnTables` inside the writer's transaction (the fold and the commands' views).

use std::collections::HashMap;

use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::Deserialize;
use tidemark_log::StorageError;

use super::{Bytes, META, Meta, read_meta, table_name};

/// Read access to projections for the API: one read transaction, so everything read through
/// one `Reader` is one consistent state of the log.
pub struct Reader {
    txn: redb::ReadTransaction,
}

impl Reader {
    pub fn new(db: &crate::models::ModelsRead) -> Result<Reader, StorageError> {
        Ok(Reader {
            txn: db.db().begin_read().map_err(StorageError::of)?,
        })
    }

    pub fn meta(&self, name: &str) -> Result<Meta, StorageError> {
        let t = match self.txn.open_table(META) {
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
        match self.txn.open_table(def) {
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

/// A projection's tables inside the writer's transaction, each opened once: the fold writes
/// through them (`Store`), and commands that decide from state (claim, complete, ...) read
/// them, seeing every event committed or staged before them.
pub(crate) struct TxnTables<'t> {
    pub(super) txn: &'t WriteTransaction,
    pub(super) proj: &'static str,
    pub(super) generation: u32,
    tables: HashMap<&'static str, redb::Table<'t, Bytes, Bytes>>,
}

impl<'t> TxnTables<'t> {
    /// The projection's tables at its current generation.
    pub fn new(txn: &'t WriteTransaction, proj: &'static str) -> Result<Self, StorageError> {
        let generation = read_meta(txn, proj)?.generation;
        Ok(Self::at(txn, proj, generation))
    }

    pub(super) fn at(txn: &'t WriteTransaction, proj: &'static str, generation: u32) -> Self {
        TxnTables {
            txn,
            proj,
            generation,
            tables: HashMap::new(),
        }
    }

    /// The table (created empty when the projection has not written it yet).
    pub fn table(
        &mut self,
        table: &'static str,
    ) -> Result<&redb::Table<'t, Bytes, Bytes>, StorageError> {
        self.table_mut(table).map(|t| &*t)
    }

    pub(super) fn table_mut(
        &mut self,
        table: &'static str,
    ) -> Result<&mut redb::Table<'t, Bytes, Bytes>, StorageError> {
        if !self.tables.contains_key(table) {
            let name = table_name(self.proj, table, self.generation);
            let def: TableDefinition<Bytes, Bytes> = TableDefinition::new(&name);
            let t = self.txn.open_table(def).map_err(StorageError::of)?;
            self.tables.insert(table, t);
        }
        Ok(self.tables.get_mut(table).expect("inserted above"))
    }

    pub fn get(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self
            .table(table)?
            .get(key)
            .map_err(StorageError::of)?
            .map(|v| v.value().to_vec()))
    }

    pub fn get_val<T: for<'de> Deserialize<'de>>(
        &mut self,
        table: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        decode(self.get(table, key)?)
    }

    /// The keys of `table` that start with `prefix ‖ 0`, each the rest after it (an index's
    /// ids under one value: `prefix ‖ 0 ‖ id`).
    pub(crate) fn suffixes(
        &mut self,
        table: &'static str,
        prefix: &str,
    ) -> Result<Vec<String>, StorageError> {
        let lo = [prefix.as_bytes(), &[0u8]].concat();
        let hi = [prefix.as_bytes(), &[1u8]].concat();
        let mut out = Vec::new();
        for row in self
            .table(table)?
            .range(lo.as_slice()..hi.as_slice())
            .map_err(StorageError::of)?
        {
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
        for row in self.table(table)?.iter().map_err(StorageError::of)? {
            let (_, v) = row.map_err(StorageError::of)?;
            out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        }
        Ok(out)
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
