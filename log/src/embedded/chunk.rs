//! The embedded log as an [`EventLog`], and the chunks the models fold from it.

use crate::{
    AppendError, AppendReceipt, Compacted, Condition, Event, EventChunk, EventLog, NewEvent,
    ReadError, ReadPage, ReadQuery, StorageError,
};

use tokio::sync::watch;

use super::{Log, compact, store};

impl EventLog for Log {
    async fn append(&self, events: Vec<NewEvent>) -> Result<AppendReceipt, AppendError> {
        Log::append(self, events).await
    }
    async fn append_if(
        &self,
        events: Vec<NewEvent>,
        condition: Condition,
    ) -> Result<AppendReceipt, AppendError> {
        Log::append_if(self, events, condition).await
    }
    async fn append_all(
        &self,
        batches: Vec<(Vec<NewEvent>, Condition)>,
    ) -> Vec<Result<AppendReceipt, AppendError>> {
        Log::append_all(self, batches).await
    }
    fn read(&self, q: &ReadQuery) -> Result<ReadPage, ReadError> {
        Log::read(self, q)
    }
    fn get_by_id(&self, event_id: &str) -> Result<Option<Event>, ReadError> {
        Log::get_by_id(self, event_id)
    }
    fn head(&self) -> u64 {
        Log::head(self)
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        Log::subscribe(self)
    }
    fn read_chunk(&self, after: u64, upto: u64, out: &mut EventChunk) -> Result<(), ReadError> {
        out.read_stored(self, after, upto)
    }
    async fn compact(&self, through: u64) -> Result<Compacted, AppendError> {
        Log::compact(self, through).await
    }
    fn queued(&self) -> usize {
        Log::queued(self)
    }
    fn check_space(&self) -> Result<(), AppendError> {
        Log::check_space(self)
    }
    fn free_bytes(&self) -> Option<u64> {
        self.shared.space.storage.available(&self.shared.space.path)
    }
    fn space(&self) -> Option<tokio::sync::watch::Receiver<crate::SpaceState>> {
        Some(self.shared.space.watch())
    }
    fn is_poisoned(&self) -> bool {
        Log::is_poisoned(self)
    }
    async fn close(&self) {
        Log::close(self).await;
    }
}

impl EventChunk {
    /// The redb backend's chunk read: the stored records copied in one buffer, from redb as
    /// far as it holds them and from memory after that.
    fn read_stored(&mut self, log: &Log, after: u64, upto: u64) -> Result<(), ReadError> {
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
