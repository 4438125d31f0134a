//! The embedded log as an [`EventLog`], and the chunks the models fold from it.

use crate::{EventChunk, EventLog, ReadError, StorageError};

use super::{Log, compact, store};

impl EventChunk {
    /// The redb backend's chunk read: the stored records copied in one buffer, from redb as
    /// far as it holds them and from memory after that.
    pub(super) fn read_stored(
        &mut self,
        log: &Log,
        after: u64,
        upto: u64,
    ) -> Result<(), ReadError> {
        use redb::ReadableDatabase;
        self.bytes.clear();
        self.ends.clear();
        self.owned.clear();
        let upto = upto.min(log.head());
        let mut after = after;
        let mut first_round = true;
        while after < upto {
            if let Some(recent) = log.shared.recent_since(after) {
                for (seq, record) in recent.records(upto) {
                    self.bytes.extend_from_slice(record);
                    self.ends.push((seq, self.bytes.len()));
                }
                return Ok(());
            }
            let db = log.shared.db();
            let txn = db
                .begin_read()
                .map_err(|e| ReadError::Storage(StorageError::of(e)))?;
            if first_round {
                let first = compact::first_seq_of(&txn).map_err(ReadError::Storage)?;
                if after + 1 < first {
                    return Err(ReadError::Compacted { first });
                }
                first_round = false;
            }
            let t = txn
                .open_table(store::EVENTS)
                .map_err(|e| ReadError::Storage(StorageError::of(e)))?;
            let before = after;
            for row in t
                .range(after + 1..=upto)
                .map_err(|e| ReadError::Storage(StorageError::of(e)))?
            {
                let (k, v) = row.map_err(|e| ReadError::Storage(StorageError::of(e)))?;
                self.bytes.extend_from_slice(v.value());
                self.ends.push((k.value(), self.bytes.len()));
                after = k.value();
            }
            if after == before && log.shared.recent_since(after).is_none() {
                return Err(ReadError::Storage(StorageError::msg(format!(
                    "event {} is neither in redb nor in memory",
                    after + 1
                ))));
            }
        }
        Ok(())
    }
}
