//! The in-process reopen after a full disk (I10): redb refuses every call after an I/O error
//! until it is reopened, so the indexer that met ENOSPC inside redb opens it again on the same
//! stores once space returns. Appends are refused meanwhile (the log is `full`); the reopen
//! holds the leaders' lock, so no group is written while the journal is replayed and started
//! over.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::indexer::Indexer;
use crate::error::{AppendError, StorageError};

/// What the log file must be able to grow by before an indexer that a full disk stopped
/// reopens it.
const REOPEN_PROBE: u64 = 8 << 20;

impl Indexer {
    /// After a full disk failed a redb write (redb refuses every later call until reopened),
    /// or at start when the journal's preallocation did not fit: once `min_free` is free
    /// again, open redb anew on the same stores — it goes back to its last durable commit and
    /// the journal puts back every group acknowledged since — and carry on. `Err` while the
    /// log stays closed.
    pub(crate) fn try_reopen(&mut self) -> Result<(), AppendError> {
        let shared = self.shared.clone();
        if !shared.full.load(Ordering::SeqCst) {
            return Ok(());
        }
        let refusal = || shared.space.refusal();
        if shared.space.check().is_err() {
            return Err(refusal());
        }
        // Free space may be unknown or under-reported (min_free 0, another store): only reopen
        // once the file can really grow, or the next commit meets ENOSPC again.
        if let Err(e) = self.stores.db.can_grow(REOPEN_PROBE) {
            tracing::debug!(error = %e, "the log file cannot grow yet; staying closed");
            return Err(refusal());
        }
        let mut core = shared.core.lock().unwrap_or_else(|p| p.into_inner());
        if core.journal.short_of_space() {
            // Opened on a disk too full for the journal: redb is fine, only the journal's
            // preallocation is missing.
            if let Err(e) = core.journal.preallocate(self.cfg.journal_prealloc) {
                tracing::debug!(error = %e, "the journal still does not fit; staying read-only");
                return Err(refusal());
            }
            shared.full.store(false, Ordering::SeqCst);
            tracing::warn!("space returned; the log takes appends again");
            return Ok(());
        }
        let opened = match super::store::open(&self.cfg, &self.stores) {
            Ok(o) if o.journal.short_of_space() => return Err(refusal()),
            Ok(o) => o,
            Err(crate::OpenError::Storage(why)) if why.is_storage_full() => {
                return Err(refusal());
            }
            Err(e) => {
                let why = StorageError::new("reopening the log after a full disk", e);
                shared.poison(why.clone());
                return Err(AppendError::Poisoned(why));
            }
        };
        let db = Arc::new(opened.db);
        {
            // Swap everything readers use at once.
            let mut tail = shared.tail.write().unwrap_or_else(|p| p.into_inner());
            let mut ids = shared.ids.write().unwrap_or_else(|p| p.into_inner());
            *shared.db.write().unwrap_or_else(|p| p.into_inner()) = db.clone();
            *tail = opened.tail;
            *ids = opened.runs;
            shared
                .recent
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
        self.db = db;
        self.compacting = true;
        core.journal = opened.journal;
        core.last_time_us = core.last_time_us.max(opened.last_time_us);
        let was = core.head;
        core.head = opened.head;
        // redb holds every event now, durably (the journal was replayed into it).
        shared.indexed.store(opened.head, Ordering::SeqCst);
        shared.checkpointed.store(opened.head, Ordering::SeqCst);
        shared.wanted.store(0, Ordering::SeqCst);
        shared.published.store(opened.head, Ordering::SeqCst);
        shared.head.send_replace(opened.head);
        self.stores.cause.clear();
        shared.full.store(false, Ordering::SeqCst);
        tracing::warn!(
            head = opened.head,
            before = was,
            replayed = opened.replayed,
            "space returned; the log was reopened and takes appends again"
        );
        Ok(())
    }
}
