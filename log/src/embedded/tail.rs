//! The hot tail of the indexes.
//!
//! Inserting random keys into a redb B-tree copies a page per key per commit, so keeping the
//! `event_id`, subject, type and stream indexes in every small group commit would cap appends
//! at a fraction of what the journal takes. Instead the newest events (those past
//! `indexed_through`) are indexed here, in memory, by the appender that leads their group
//! (before the group is published), and merged into the redb index tables in large, sorted
//! write transactions by the log's indexer thread.
//!
//! A merge never stops appends: the indexer *freezes* the active part (it becomes read-only,
//! shared by `Arc`) and a new, empty active part takes the next groups while the frozen one is
//! written into redb; once that commit is made the frozen part is dropped and
//! `indexed_through` moves to its end, in one step under the tail's lock. Lookups ask the
//! active part, then the frozen one, then redb. On open the tail is rebuilt from the events
//! past `indexed_through`, so its size (and the work of a restart) is bounded by the merge
//! threshold, not by the length of the log.

use std::collections::HashMap;
use std::sync::Arc;

use crate::envelope::scoped;

/// A posting list: (seq, stream) in seq order.
pub(crate) type Postings = Vec<(u64, Arc<str>)>;

/// One part of the tail: the index of a run of consecutive seqs.
#[derive(Debug, Default)]
pub(crate) struct Part {
    pub ids: HashMap<String, u64>,
    /// subject -> (seq, stream), in seq order.
    pub subjects: HashMap<String, Postings>,
    /// event type -> (seq, stream), in seq order.
    pub types: HashMap<String, Postings>,
    /// stream -> (seq, stream), in seq order (the value repeats the key so that every posting
    /// list has one shape).
    pub by_stream: HashMap<String, Postings>,
    streams: HashMap<String, Arc<str>>,
    /// The last seq inserted (0: none).
    pub last: u64,
}

impl Part {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    fn insert(&mut self, seq: u64, tenant: Option<&str>, keys: [&str; 4]) {
        let [event_id, ..] = keys;
        self.ids.insert(scoped(tenant, event_id).into_owned(), seq);
        self.insert_postings(seq, tenant, keys);
    }

    /// Add one event of `tenant` to the subject, type and stream posting lists (not to the
    /// ids), under its keys scoped to the tenant (`envelope::scoped`). `keys`: event_id,
    /// stream, subject, type.
    pub fn insert_postings(&mut self, seq: u64, tenant: Option<&str>, keys: [&str; 4]) {
        let [_, stream, subject, event_type] = keys;
        let (stream, subject, event_type) = (
            scoped(tenant, stream),
            scoped(tenant, subject),
            scoped(tenant, event_type),
        );
        let (stream, subject, event_type) = (&*stream, &*subject, &*event_type);
        self.last = seq;
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

    fn last_of(&self, stream: &str, subject: &str, upto: u64) -> Option<u64> {
        self.subjects
            .get(subject)?
            .iter()
            .rev()
            .find(|(seq, s)| *seq <= upto && &**s == stream)
            .map(|(seq, _)| *seq)
    }
}

/// Which posting list a filtered read walks.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Posting {
    Subject,
    Type,
    Stream,
}

#[derive(Debug, Default)]
pub(crate) struct Tail {
    /// Every event with `seq <= indexed_through` is in the redb index tables; the others are
    /// in the parts.
    pub indexed_through: u64,
    /// Being merged into redb (read-only), covering the seqs right after `indexed_through`.
    frozen: Option<Arc<Part>>,
    /// Takes the newest events.
    active: Part,
}

impl Tail {
    pub fn new(indexed_through: u64) -> Self {
        Tail {
            indexed_through,
            ..Tail::default()
        }
    }

    /// Events in the active part (what the next merge would take).
    pub fn len(&self) -> usize {
        self.active.len()
    }

    /// Events in both parts.
    pub fn total(&self) -> usize {
        self.active.len() + self.frozen.as_ref().map_or(0, |f| f.len())
    }

    /// Index event `seq` of `tenant` by its keys: event_id, stream, subject, type (each scoped
    /// to the tenant here; the lookups below take keys scoped so).
    pub fn insert(&mut self, seq: u64, tenant: Option<&str>, keys: [&str; 4]) {
        self.active.insert(seq, tenant, keys);
    }

    /// The seq of `event_id` (scoped), if the tail holds it.
    pub fn id(&self, event_id: &str) -> Option<u64> {
        self.active
            .ids
            .get(event_id)
            .or_else(|| self.frozen.as_ref()?.ids.get(event_id))
            .copied()
    }

    /// The last seq `<= upto` of `stream` with `subject` the tail holds.
    pub fn last_of(&self, stream: &str, subject: &str, upto: u64) -> Option<u64> {
        self.active
            .last_of(stream, subject, upto)
            .or_else(|| self.frozen.as_ref()?.last_of(stream, subject, upto))
    }

    /// The tail's posting lists of `key`: the frozen part's, then the active part's (seqs
    /// ascending across both).
    pub fn postings(&self, posting: Posting, key: &str) -> [&[(u64, Arc<str>)]; 2] {
        fn of<'p>(p: &'p Part, posting: Posting, key: &str) -> &'p [(u64, Arc<str>)] {
            let map = match posting {
                Posting::Subject => &p.subjects,
                Posting::Type => &p.types,
                Posting::Stream => &p.by_stream,
            };
            map.get(key).map(Vec::as_slice).unwrap_or(&[])
        }
        [
            self.frozen
                .as_deref()
                .map(|f| of(f, posting, key))
                .unwrap_or(&[]),
            of(&self.active, posting, key),
        ]
    }

    /// Freeze the active part for a merge (none may be frozen already) and start a new one:
    /// the frozen part, which ends at its `last` seq. `None` when the active part is empty.
    pub fn freeze(&mut self) -> Option<Arc<Part>> {
        debug_assert!(self.frozen.is_none(), "one merge at a time");
        if self.active.len() == 0 {
            return None;
        }
        let part = Arc::new(std::mem::take(&mut self.active));
        self.frozen = Some(part.clone());
        Some(part)
    }

    /// The frozen part is in the redb index tables now (their commit is made): forget it.
    pub fn merged(&mut self) {
        if let Some(f) = self.frozen.take() {
            self.indexed_through = self.indexed_through.max(f.last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_span_the_frozen_and_active_parts() {
        let mut t = Tail::new(10);
        t.insert(11, None, ["a", "s", "x", "t.1"]);
        t.insert(12, None, ["b", "s", "y", "t.1"]);
        let frozen = t.freeze().unwrap();
        assert_eq!(frozen.last, 12);
        t.insert(13, None, ["c", "s", "x", "t.2"]);
        assert_eq!(
            (t.id("a"), t.id("c"), t.id("z")),
            (Some(11), Some(13), None)
        );
        assert_eq!(t.last_of("s", "x", 99), Some(13));
        assert_eq!(t.last_of("s", "x", 12), Some(11));
        let [f, a] = t.postings(Posting::Type, "t.1");
        assert_eq!((f.len(), a.len()), (2, 0));
        assert_eq!(t.total(), 3);
        assert_eq!(t.len(), 1);
        t.merged();
        assert_eq!(t.indexed_through, 12);
        assert_eq!((t.id("a"), t.id("c")), (None, Some(13)));
        // Another tenant's event of the same stream, subject and id is under its own keys.
        t.insert(14, Some("acme"), ["c", "s", "x", "t.1"]);
        assert_eq!((t.id("c"), t.id("acme\u{1f}c")), (Some(13), Some(14)));
        assert_eq!(t.last_of("s", "x", 99), Some(13));
        assert_eq!(t.last_of("acme\u{1f}s", "acme\u{1f}x", 99), Some(14));
        assert_eq!(t.postings(Posting::Type, "t.1")[1].len(), 0);
    }
}
