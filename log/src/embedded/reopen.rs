//! The in-process reopen after a full disk (I10): redb refuses every call after an I/O error
//! until it is reopened, so the writer that met ENOSPC inside redb opens it again on the same
//! stores once space returns.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::writer::Writer;
use crate::error::{AppendError, StorageError};

/// What the log file must be able to grow by before a writer that a full disk stopped reopens
/// it.
const REOPEN_PROBE: u64 = 8 << 20;

impl Writer {
    /// After a full disk failed a redb write (redb refuses every later call until reopened):
    /// once `min_free` is free again, open redb anew on the same stores — it goes back to its
    /// last durable commit and the journal puts back every group acknowledged since — and
    /// carry on. `Err` while the log stays closed.
    pub(crate) fn try_reopen(&mut self) -> Result<(), AppendError> {
        let refusal = |space: &super::Space| AppendError::InsufficientStorage {
            available: space.storage.available(&space.path).unwrap_or(0),
            min_free: space.min_free,
        };
        if !self.is_full() {
            return Ok(());
        }
        if self.space.check().is_err() {
            return Err(refusal(&self.space));
        }
        // Free space may be unknown or under-reported (min_free 0, another store): only reopen
        // once the file can really grow, or the next commit meets ENOSPC again.
        if let Err(e) = self.stores.db.can_grow(REOPEN_PROBE) {
            tracing::debug!(error = %e, "the log file cannot grow yet; staying closed");
            return Err(refusal(&self.space));
        }
        if self.journal.short_of_space() {
            // Opened on a disk too full for the journal: redb is fine, only the journal's
            // preallocation is missing.
            if let Err(e) = self.journal.preallocate(self.cfg.journal_prealloc) {
                tracing::debug!(error = %e, "the journal still does not fit; staying read-only");
                return Err(refusal(&self.space));
            }
            self.shared.full.store(false, Ordering::SeqCst);
            tracing::warn!("space returned; the log takes appends again");
            return Ok(());
        }
        let opened = match super::store::open(&self.cfg, &self.stores) {
            Ok(o) if o.journal.short_of_space() => return Err(refusal(&self.space)),
            Ok(o) => o,
            Err(crate::OpenError::Storage(why)) if why.is_storage_full() => {
                return Err(refusal(&self.space));
            }
            Err(e) => {
                let why = StorageError::new("reopening the log after a full disk", e);
                self.poison(why.clone());
                return Err(AppendError::Poisoned(why));
            }
        };
        let db = Arc::new(opened.db);
        {
            // Swap everything readers use at once.
            let mut tail = self.shared.tail.write().unwrap_or_else(|p| p.into_inner());
            let mut ids = self.shared.ids.write().unwrap_or_else(|p| p.into_inner());
            *self.shared.db.write().unwrap_or_else(|p| p.into_inner()) = db.clone();
            *tail = opened.tail;
            *ids = opened.runs;
            self.shared
                .recent
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
        self.db = db;
        self.journal = opened.journal;
        self.last_time_us = self.last_time_us.max(opened.last_time_us);
        let was = self.head;
        self.head = opened.head;
        self.shared.head.send_replace(self.head);
        self.stores.cause.clear();
        self.shared.full.store(false, Ordering::SeqCst);
        tracing::warn!(
            head = self.head,
            before = was,
            replayed = opened.replayed,
            "space returned; the log was reopened and takes appends again"
        );
        Ok(())
    }
}
