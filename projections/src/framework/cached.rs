//! The rows a fold keeps decoded between events ([`super::Store::take_row`] /
//! [`super::Store::put_row`]): the models' rows a fold rewrites at almost every event (a task,
//! a delivery, a cursor), decoded once and encoded once per flush. A closed set of types, so
//! the cache holds them as one enum: nothing is downcast, and a row cannot be taken back as
//! another type than it was put as.

use tidemark_log::StorageError;

use crate::cursors::Cursor;
use crate::deliveries::Delivery;
use crate::tasks::Task;

/// A row kept decoded.
pub enum CachedRow {
    Task(Box<Task>),
    Delivery(Box<Delivery>),
    Cursor(Box<Cursor>),
}

impl CachedRow {
    /// Its stored bytes, appended to `out`.
    pub(super) fn encode(&self, out: &mut Vec<u8>) -> Result<(), StorageError> {
        let buf = std::mem::take(out);
        *out = match self {
            CachedRow::Task(r) => r.encode(buf),
            CachedRow::Delivery(r) => r.encode(buf),
            CachedRow::Cursor(r) => r.encode(buf),
        }?;
        Ok(())
    }
}

/// A row of a table with its encoding: postcard ([`postcard_row!`]), or its own when its
/// stored form keeps a release history ([`crate::deliveries::Delivery`]).
pub trait Row: Sized {
    /// Its stored bytes, appended to `buf`.
    fn encode(&self, buf: Vec<u8>) -> Result<Vec<u8>, StorageError>;
    fn decode(bytes: &[u8]) -> Result<Self, StorageError>;
}

/// [`Row`] as postcard encodes the type (each model says it of its rows).
#[macro_export]
macro_rules! postcard_row {
    ($($t:ty),*) => {$(
        impl $crate::framework::Row for $t {
            fn encode(&self, buf: Vec<u8>) -> Result<Vec<u8>, tidemark_log::StorageError> {
                postcard::to_extend(self, buf).map_err(tidemark_log::StorageError::of)
            }

            fn decode(bytes: &[u8]) -> Result<Self, tidemark_log::StorageError> {
                postcard::from_bytes(bytes).map_err(tidemark_log::StorageError::of)
            }
        }
    )*};
}

/// A row type a fold may keep decoded.
pub trait Cached: Row + Send + 'static {
    fn into_cached(self) -> CachedRow;
    /// The row, or the cached row back when it is of another type.
    fn from_cached(row: CachedRow) -> Result<Self, CachedRow>;
}

macro_rules! cached {
    ($($t:ident),*) => {$(
        impl Cached for $t {
            fn into_cached(self) -> CachedRow {
                CachedRow::$t(Box::new(self))
            }

            fn from_cached(row: CachedRow) -> Result<Self, CachedRow> {
                match row {
                    CachedRow::$t(r) => Ok(*r),
                    other => Err(other),
                }
            }
        }
    )*};
}
cached!(Task, Delivery, Cursor);
