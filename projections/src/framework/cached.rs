//! The rows a fold keeps decoded between events ([`super::Store::take_row`] /
//! [`super::Store::put_row`]): the models' rows a fold rewrites at almost every event (a task,
//! a delivery, a cursor), decoded once and encoded once per flush. The cache knows no model: it
//! holds any [`Row`], and a row cannot be taken back as another type than it was put as.

use std::any::{Any, TypeId};

use tidemark_log::StorageError;

/// A row kept decoded: a model's row of any type ([`Cached`]), taken back only as the type
/// it was put as.
pub struct CachedRow(Box<dyn Kept>);

/// What the cache asks of a row it keeps: its stored bytes, and the row back.
trait Kept: Any + Send {
    fn encode_into(&self, buf: Vec<u8>) -> Result<Vec<u8>, StorageError>;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
    /// The row's own type (not the trait object's).
    fn row_type(&self) -> TypeId;
}

impl<T: Row + Send + 'static> Kept for T {
    fn encode_into(&self, buf: Vec<u8>) -> Result<Vec<u8>, StorageError> {
        self.encode(buf)
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }

    fn row_type(&self) -> TypeId {
        TypeId::of::<T>()
    }
}

impl CachedRow {
    /// Its stored bytes, appended to `out`.
    pub(super) fn encode(&self, out: &mut Vec<u8>) -> Result<(), StorageError> {
        let buf = std::mem::take(out);
        *out = self.0.encode_into(buf)?;
        Ok(())
    }
}

/// A row of a table with its encoding: postcard (`postcard_row!`), or its own when its
/// stored form keeps a release history ([`crate::deliveries::Delivery`]).
pub trait Row: Sized {
    /// Its stored bytes, appended to `buf`.
    fn encode(&self, buf: Vec<u8>) -> Result<Vec<u8>, StorageError>;
    fn decode(bytes: &[u8]) -> Result<Self, StorageError>;
}

/// [`Row`] as postcard encodes the type (each model says it of its rows).
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

pub(crate) use postcard_row;

/// A row type a fold may keep decoded: every [`Row`] that can cross threads.
pub trait Cached: Row + Send + 'static {
    fn into_cached(self) -> CachedRow;
    /// The row, or the cached row back when it is of another type.
    fn from_cached(row: CachedRow) -> Result<Self, CachedRow>;
}

impl<T: Row + Send + 'static> Cached for T {
    fn into_cached(self) -> CachedRow {
        CachedRow(Box::new(self))
    }

    fn from_cached(row: CachedRow) -> Result<Self, CachedRow> {
        if row.0.row_type() != TypeId::of::<T>() {
            return Err(row);
        }
        match row.0.into_any().downcast::<T>() {
            Ok(r) => Ok(*r),
            Err(_) => unreachable!("the type was compared above"),
        }
    }
}
