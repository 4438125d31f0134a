//! The models store as the writer's fold and the commands' views reach it: a redb write
//! transaction (a rebuild, the start, tools and tests), or the decider's [`Overlay`] (the
//! layers in memory over a read transaction of the file). The metas and the subjects' seqs
//! are read and written through here in either.

use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};
use tidemark_log::StorageError;

use super::overlay::Overlay;
use super::{META, Meta};

/// The store as a fold writes it.
pub enum TxMut<'t> {
    Redb(&'t WriteTransaction),
    Mem(&'t mut Overlay),
}

/// The store as a command (or a fold) reads it.
#[derive(Clone, Copy)]
pub enum Src<'t> {
    Redb(&'t WriteTransaction),
    Mem(&'t Overlay),
}

impl TxMut<'_> {
    /// The same store, for a shorter while.
    pub fn reborrow(&mut self) -> TxMut<'_> {
        match self {
            TxMut::Redb(t) => TxMut::Redb(t),
            TxMut::Mem(m) => TxMut::Mem(m),
        }
    }

    pub fn src(&self) -> Src<'_> {
        match self {
            TxMut::Redb(t) => Src::Redb(t),
            TxMut::Mem(m) => Src::Mem(m),
        }
    }

    /// Write `name`'s meta.
    pub fn put_meta(&mut self, name: &str, m: &Meta) -> Result<(), StorageError> {
        let b = postcard::to_stdvec(m).map_err(StorageError::of)?;
        match self {
            TxMut::Redb(txn) => {
                let mut t = txn.open_table(META).map_err(StorageError::of)?;
                t.insert(name, b.as_slice()).map_err(StorageError::of)?;
            }
            TxMut::Mem(m) => m.active().put(META.name(), name.as_bytes(), Some(&b)),
        }
        Ok(())
    }

    /// Write `value` (`None`: delete) at `key` of a table keyed by bytes with u64 values.
    pub(crate) fn put_u64(
        &mut self,
        table: TableDefinition<&'static [u8], u64>,
        key: &[u8],
        value: u64,
    ) -> Result<(), StorageError> {
        match self {
            TxMut::Redb(txn) => {
                let mut t = txn.open_table(table).map_err(StorageError::of)?;
                t.insert(key, value).map_err(StorageError::of)?;
            }
            TxMut::Mem(m) => m
                .active()
                .put(table.name(), key, Some(&value.to_be_bytes())),
        }
        Ok(())
    }

    /// Write `value` at `key` of a table keyed by strings with u64 values.
    pub(crate) fn put_str_u64(
        &mut self,
        table: TableDefinition<&'static str, u64>,
        key: &str,
        value: u64,
    ) -> Result<(), StorageError> {
        match self {
            TxMut::Redb(txn) => {
                let mut t = txn.open_table(table).map_err(StorageError::of)?;
                t.insert(key, value).map_err(StorageError::of)?;
            }
            TxMut::Mem(m) => {
                m.active()
                    .put(table.name(), key.as_bytes(), Some(&value.to_be_bytes()));
            }
        }
        Ok(())
    }
}

impl Src<'_> {
    /// `name`'s meta, if it has one.
    pub fn meta(&self, name: &str) -> Result<Option<Meta>, StorageError> {
        let bytes = match self {
            Src::Redb(txn) => {
                let t = txn.open_table(META).map_err(StorageError::of)?;
                t.get(name)
                    .map_err(StorageError::of)?
                    .map(|v| v.value().to_vec())
            }
            Src::Mem(m) => m.get_typed("projections", name.as_bytes())?,
        };
        bytes
            .map(|b| postcard::from_bytes(&b).map_err(StorageError::of))
            .transpose()
    }

    /// The u64 at `key` of a table keyed by bytes.
    pub(crate) fn get_u64(
        &self,
        table: TableDefinition<&'static [u8], u64>,
        key: &[u8],
    ) -> Result<Option<u64>, StorageError> {
        match self {
            Src::Redb(txn) => {
                let t = txn.open_table(table).map_err(StorageError::of)?;
                Ok(t.get(key).map_err(StorageError::of)?.map(|v| v.value()))
            }
            Src::Mem(m) => mem_u64(m, table.name(), key),
        }
    }

    /// The u64 at `key` of a table keyed by strings.
    pub(crate) fn get_str_u64(
        &self,
        table: TableDefinition<&'static str, u64>,
        key: &str,
    ) -> Result<Option<u64>, StorageError> {
        match self {
            Src::Redb(txn) => {
                let t = txn.open_table(table).map_err(StorageError::of)?;
                Ok(t.get(key).map_err(StorageError::of)?.map(|v| v.value()))
            }
            Src::Mem(m) => mem_u64(m, table.name(), key.as_bytes()),
        }
    }
}

/// The u64 at `key` of table `name` through the overlay.
fn mem_u64(m: &Overlay, name: &str, key: &[u8]) -> Result<Option<u64>, StorageError> {
    m.get_typed(name, key)?
        .map(|b| super::overlay::u64_of(&b))
        .transpose()
}
