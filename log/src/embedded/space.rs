//! The free space where the log is kept (I10).

use std::path::PathBuf;

use super::storage;
use crate::AppendError;

/// Where the log checks its free space.
#[derive(Debug, Clone)]
pub(crate) struct Space {
    pub storage: storage::Storage,
    pub path: PathBuf,
    pub min_free: u64,
}

impl Space {
    /// `Err((available, min_free))` when less than `min_free` is free.
    pub fn check(&self) -> Result<(), (u64, u64)> {
        match self.storage.available(&self.path) {
            Some(a) if a < self.min_free => Err((a, self.min_free)),
            _ => Ok(()),
        }
    }

    /// The refusal of a write while the disk is full.
    pub fn refusal(&self) -> AppendError {
        AppendError::InsufficientStorage {
            available: self.storage.available(&self.path).unwrap_or(0),
            min_free: self.min_free,
        }
    }
}
