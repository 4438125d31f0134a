//! The hot tail of the indexes.
//!
//! Inserting random keys into a redb B-tree copies a page per key per commit, so keeping the
//! `event_id`, subject, type and stream indexes in every small group commit would cap appends at a fraction of
//! what the events table alone takes. Instead the newest events (those past
//! `indexed_through`) are indexed here, in memory, and merged into the redb index tables in one
//! large, sorted write transaction once the tail holds `merge_threshold` events. On open the tail
//! is rebuilt from the events past `indexed_through`, so its size (and the work of a restart) is
//! bounded by the threshold, not by the length of the log.

use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Default)]
pub(crate) struct Tail {
    /// Every event with `seq <= indexed_through` is in the redb index tables; the others are here.
    pub indexed_through: u64,
    pub ids: HashMap<String, u64>,
    /// subject -> (seq, stream), in seq order.
    pub subjects: HashMap<String, Vec<(u64, Arc<str>)>>,
    /// event type -> (seq, stream), in seq order.
    pub types: HashMap<String, Vec<(u64, Arc<str>)>>,
    /// stream -> (seq, stream), in seq order (the value repeats the key so that every posting
    /// list has one shape).
    pub by_stream: HashMap<String, Vec<(u64, Arc<str>)>>,
    streams: HashMap<String, Arc<str>>,
}

impl Tail {
    pub fn new(indexed_through: u64) -> Self {
        Tail {
            indexed_through,
            ..Tail::default()
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn insert(
        &mut self,
        seq: u64,
        event_id: &str,
        stream: &str,
        subject: &str,
        event_type: &str,
    ) {
        self.ids.insert(event_id.to_owned(), seq);
        let stream = match self.streams.get(stream) {
            Some(s) => s.clone(),
            None => {
                let s: Arc<str> = Arc::from(stream);
                self.streams.insert(stream.to_owned(), s.clone());
                s
            }
        };
        match self.by_stream.get_mut(&*stream) {
            Some(list) => list.push((seq, stream.clone())),
            None => {
                self.by_stream
                    .insert(stream.to_string(), vec![(seq, stream.clone())]);
            }
        }
        match self.types.get_mut(event_type) {
            Some(list) => list.push((seq, stream.clone())),
            None => {
                self.types
                    .insert(event_type.to_owned(), vec![(seq, stream.clone())]);
            }
        }
        self.subjects
            .entry(subject.to_owned())
            .or_default()
            .push((seq, stream));
    }

    /// Forget everything up to `through`, which is now in the redb index tables.
    pub fn merged(&mut self, through: u64) {
        self.indexed_through = through;
        self.ids.clear();
        self.subjects.clear();
        self.types.clear();
        self.by_stream.clear();
        self.streams.clear();
    }
}

/// Write one of the tail's postings (subject, type or stream → `(seq, stream)` in seq order) into its
/// redb table, keys in order.
pub(crate) fn write_postings(
    txn: &redb::WriteTransaction,
    def: redb::TableDefinition<(&str, u64), &str>,
    postings: &HashMap<String, Vec<(u64, Arc<str>)>>,
) -> Result<(), redb::Error> {
    let mut keys: Vec<_> = postings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    keys.sort_unstable_by_key(|(k, _)| *k);
    let mut t = txn.open_table(def)?;
    for (key, list) in keys {
        for (seq, stream) in list {
            t.insert((key, *seq), &**stream)?;
        }
    }
    Ok(())
}
