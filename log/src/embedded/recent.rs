//! The newest committed groups, in memory, as the writer stored them.
//!
//! Every reader that follows the log — the models' decider folding, the reactors' follower,
//! each live stream — asks for the events after where it is, and right after a commit that is
//! the commit just made. The writer already holds those events encoded (the journal record is
//! made of them); it keeps the newest groups here, shared by `Arc`, so a follower near the head
//! reads a commit from memory — no redb read transaction, no page lookups — and every follower
//! reads the same bytes the writer wrote once. A reader further behind than the ring reaches
//! reads redb as before.
//!
//! The ring holds a dense run of seqs ending at the published head (each group is pushed after
//! its journal sync and before the head is published). It is also where the indexer takes the
//! groups redb does not have yet from: a group leaves it only once redb holds it, and beyond
//! that the ring is bounded by [`MAX_EVENTS`] and [`MAX_BYTES`]. So every event is always in
//! memory here or in redb, and a read that redb cannot finish goes on from here. A compaction
//! drops the groups below its cut; an in-process reopen (which puts everything into redb)
//! clears it.

use std::collections::VecDeque;
use std::sync::Arc;

use super::store::{decode_event, decode_event_ref};
use crate::envelope::{Event, EventRef};
use crate::error::ReadError;
use crate::{ReadPage, ReadQuery};

/// At most this many events are kept.
pub(crate) const MAX_EVENTS: usize = 4_096;
/// At most this many bytes of stored records are kept (the newest group is kept whatever its
/// size).
pub(crate) const MAX_BYTES: usize = 1 << 20;

/// One committed group: its stored records, `(seq, record)`, seqs dense and ascending.
#[derive(Debug)]
pub(crate) struct Group {
    records: Vec<(u64, Vec<u8>)>,
    bytes: usize,
}

impl Group {
    fn first(&self) -> u64 {
        self.records.first().map_or(0, |r| r.0)
    }

    fn last(&self) -> u64 {
        self.records.last().map_or(0, |r| r.0)
    }
}

/// The groups of a read, taken from the ring under its lock and read after it is released.
pub(crate) struct Since {
    groups: Vec<Arc<Group>>,
    after: u64,
}

impl Since {
    /// The last seq the groups hold (the head when they were taken).
    pub fn head(&self) -> u64 {
        self.groups.last().map_or(self.after, |g| g.last())
    }

    /// Every stored record after `after` up to `upto`, in order.
    pub fn records(&self, upto: u64) -> impl Iterator<Item = (u64, &[u8])> {
        let after = self.after;
        self.groups
            .iter()
            .flat_map(|g| g.records.iter())
            .filter(move |(seq, _)| *seq > after && *seq <= upto)
            .map(|(seq, b)| (*seq, b.as_slice()))
    }

    /// A page as `store::read` answers it: the matching events after `after`, at most
    /// `q.limit`; `next_after` is the last one when the page is full, else the head.
    pub fn page(&self, q: &ReadQuery) -> Result<ReadPage, ReadError> {
        let limit = q.limit.max(1);
        let head = self.head();
        let mut events = Vec::new();
        let mut next_after = head.max(q.after);
        let keyed = q.stream.is_some() || q.subject.is_some() || q.event_type.is_some();
        // The default tenant's alone, unfiltered: the format version byte says (version 1 is
        // the default tenant's), without decoding the envelope.
        let default_only = !keyed && q.tenant.as_deref() == Some(crate::DEFAULT_TENANT);
        let filtered = keyed || (q.tenant.is_some() && !default_only);
        for (seq, bytes) in self.records(head) {
            if default_only && !super::codec::is_default_tenant(bytes) {
                continue;
            }
            if filtered {
                let e = decode_event_ref(seq, bytes)?;
                if !matches(&e, q, keyed) {
                    continue;
                }
            }
            events.push(decode_event(seq, bytes)?);
            if events.len() >= limit {
                next_after = seq;
                break;
            }
        }
        Ok(ReadPage {
            events,
            next_after,
            head,
        })
    }

    /// The event `seq`, if the groups hold it.
    pub fn get(&self, seq: u64) -> Result<Option<Event>, ReadError> {
        for g in &self.groups {
            if (g.first()..=g.last()).contains(&seq) {
                let (_, b) = &g.records[(seq - g.first()) as usize];
                return decode_event(seq, b).map(Some);
            }
        }
        Ok(None)
    }
}

/// Whether `e` matches `q` (a filter without a tenant names the default tenant's keys, as
/// the indexes read it: `store::read`).
/// `keyed`: `q` has a stream, subject or type filter.
fn matches(e: &EventRef<'_>, q: &ReadQuery, keyed: bool) -> bool {
    let tenant = match q.tenant.as_deref() {
        Some(t) => e.tenant() == t,
        None => !keyed || e.tenant.is_none(),
    };
    tenant
        && q.stream.as_deref().is_none_or(|s| s == e.stream)
        && q.subject.as_deref().is_none_or(|s| s == e.subject)
        && q.event_type.as_deref().is_none_or(|t| t == e.event_type)
}

#[derive(Debug, Default)]
pub(crate) struct Recent {
    groups: VecDeque<Arc<Group>>,
    events: usize,
    bytes: usize,
}

impl Recent {
    /// Keep a group just committed (its seqs follow the last group's), dropping the oldest
    /// groups beyond the bounds that redb holds (up to `indexed`).
    pub fn push(&mut self, records: Vec<(u64, Vec<u8>)>, indexed: u64) {
        if records.is_empty() {
            return;
        }
        let first = records[0].0;
        if self.groups.back().is_some_and(|g| g.last() + 1 != first) {
            // Not dense with what is kept (cannot happen while every commit is pushed): start
            // over rather than serve a gap.
            self.clear();
        }
        let bytes = records.iter().map(|(_, b)| b.len()).sum();
        self.events += records.len();
        self.bytes += bytes;
        self.groups.push_back(Arc::new(Group { records, bytes }));
        self.trim(indexed);
    }

    /// Drop the oldest groups beyond the bounds, of those redb holds (up to `indexed`).
    pub fn trim(&mut self, indexed: u64) {
        while self.groups.len() > 1
            && (self.events > MAX_EVENTS || self.bytes > MAX_BYTES)
            && self.groups.front().is_some_and(|g| g.last() <= indexed)
        {
            self.pop();
        }
    }

    fn pop(&mut self) {
        if let Some(g) = self.groups.pop_front() {
            self.events -= g.records.len();
            self.bytes -= g.bytes;
        }
    }

    /// Drop every group that holds a seq `<= through` (a compaction's cut, which redb holds).
    pub fn drop_through(&mut self, through: u64) {
        while self.groups.front().is_some_and(|g| g.first() <= through) {
            self.pop();
        }
    }

    /// Bytes of the stored records held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn clear(&mut self) {
        self.groups.clear();
        self.events = 0;
        self.bytes = 0;
    }

    /// The groups holding every committed event after `after`, when the ring reaches back to
    /// `after + 1` (or `after` is the head); `None` sends the reader to redb.
    pub fn since(&self, after: u64) -> Option<Since> {
        let first = self.groups.front()?.first();
        let last = self.groups.back()?.last();
        if after + 1 < first || after > last {
            return None;
        }
        let skip = self.groups.partition_point(|g| g.last() <= after);
        Some(Since {
            groups: self.groups.iter().skip(skip).cloned().collect(),
            after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventLog;

    fn group(from: u64, n: u64, size: usize) -> Vec<(u64, Vec<u8>)> {
        (from..from + n).map(|s| (s, vec![0u8; size])).collect()
    }

    #[test]
    fn since_reaches_back_only_as_far_as_it_holds() {
        let mut r = Recent::default();
        assert!(r.since(0).is_none(), "empty");
        r.push(group(5, 3, 1), 0);
        r.push(group(8, 2, 1), 0);
        assert!(r.since(3).is_none(), "seq 4 is not held");
        let s = r.since(4).unwrap();
        assert_eq!(
            s.records(u64::MAX).map(|r| r.0).collect::<Vec<_>>(),
            [5, 6, 7, 8, 9]
        );
        let s = r.since(6).unwrap();
        assert_eq!(s.records(8).map(|r| r.0).collect::<Vec<_>>(), [7, 8]);
        assert_eq!(s.head(), 9);
        let s = r.since(9).unwrap();
        assert_eq!(s.records(u64::MAX).count(), 0, "at the head");
        assert_eq!(s.head(), 9);
        assert!(r.since(10).is_none(), "past the head");
    }

    #[test]
    fn the_bounds_drop_the_oldest_groups_and_a_gap_starts_over() {
        let mut r = Recent::default();
        let per = MAX_EVENTS as u64 / 4;
        for i in 0..6 {
            r.push(group(1 + i * per, per, 1), 0);
        }
        assert_eq!(
            r.events,
            6 * per as usize,
            "redb holds none of them: all kept"
        );
        r.trim(per);
        assert!(r.since(per).is_some() && r.since(per - 1).is_none());
        r.trim(u64::MAX);
        assert!(r.events <= MAX_EVENTS);
        assert!(r.since(0).is_none());
        assert!(r.since(6 * per - MAX_EVENTS as u64).is_some());
        r.push(group(6 * per + 1, 1, MAX_BYTES + 1), u64::MAX);
        assert_eq!(r.groups.len(), 1, "one huge group is kept alone");
        r.push(group(6 * per + 5, 1, 1), u64::MAX);
        assert_eq!(r.groups.len(), 1, "a gap starts over");
        assert!(r.since(6 * per + 4).is_some());
        r.push(group(6 * per + 6, 2, 1), 0);
        r.drop_through(6 * per + 5);
        assert!(
            r.since(6 * per + 4).is_none(),
            "a compaction's cut drops the groups below it"
        );
        assert!(r.since(6 * per + 5).is_some());
    }

    /// What a follower reads from memory is what redb answers: every page (any `after`,
    /// limit and filters) and every chunk, event for event.
    #[test]
    fn memory_answers_as_redb_does() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let mut runner = TestRunner::new(Config {
            cases: 24,
            ..Config::default()
        });
        // Each group is one tenant's (0: the default tenant).
        let groups = prop::collection::vec(
            (
                0..3u8,
                prop::collection::vec((0..3u8, 0..4u8, 0..3u8), 1..9),
            ),
            1..25,
        );
        let queries = prop::collection::vec(
            (
                prop::option::of(0..3u8),
                0..200u64,
                1..12usize,
                prop::option::of(0..3u8),
                prop::option::of(0..4u8),
                prop::option::of(0..3u8),
            ),
            1..40,
        );
        runner
            .run(&(groups, queries), |(groups, queries)| {
                let dir = tempfile::tempdir().unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                let (log, _) =
                    crate::embedded::Log::open(&crate::embedded::LogConfig::in_dir(dir.path()))
                        .unwrap();
                let tenant = |t: u8| ["default", "acme", "beta"][t as usize];
                // Every event appended, as (seq, tenant, stream, subject, type).
                let mut all = Vec::new();
                for (t, g) in &groups {
                    let evs: Vec<_> = g
                        .iter()
                        .map(|&(st, su, ty)| {
                            crate::NewEvent::new(
                                None,
                                format!("s{st}"),
                                format!("j{su}"),
                                format!("t.{ty}"),
                                &serde_json::json!({"st": st, "su": su}),
                            )
                            .unwrap()
                            .in_tenant(tenant(*t))
                            .unwrap()
                        })
                        .collect();
                    let r = rt.block_on(log.append(evs)).unwrap();
                    for (a, &(st, su, ty)) in r.events.iter().zip(g) {
                        all.push((a.seq, *t, st, su, ty));
                    }
                }
                let head = log.head();
                let key = |p: &ReadPage| {
                    (
                        p.events
                            .iter()
                            .map(|e| (e.seq, e.event_id.clone(), e.payload.get().to_owned()))
                            .collect::<Vec<_>>(),
                        p.next_after,
                        p.head,
                    )
                };
                for (t, after, limit, st, su, ty) in queries {
                    let q = ReadQuery {
                        tenant: t.map(|t| tenant(t).to_owned()),
                        after: after.min(head + 1),
                        limit,
                        stream: st.map(|v| format!("s{v}")),
                        subject: su.map(|v| format!("j{v}")),
                        event_type: ty.map(|v| format!("t.{v}")),
                    };
                    prop_assert!(log.shared.recent_since(q.after).is_some() || q.after > head);
                    let mem = log.read(&q).unwrap();
                    rt.block_on(log.flush_index()).unwrap();
                    let disk = crate::embedded::store::read(&log.shared.db(), &log.shared.tail, &q)
                        .unwrap();
                    prop_assert_eq!(key(&mem), key(&disk), "{:?}", q);
                    // The page is the query's tenant's matches (a filter without a tenant
                    // names the default tenant's keys), the first `limit` after `after`.
                    let filtered = st.is_some() || su.is_some() || ty.is_some();
                    let want: Vec<u64> = all
                        .iter()
                        .filter(|&&(seq, et, est, esu, ety)| {
                            seq > q.after
                                && t.map_or(!filtered || et == 0, |t| et == t)
                                && st.is_none_or(|v| v == est)
                                && su.is_none_or(|v| v == esu)
                                && ty.is_none_or(|v| v == ety)
                        })
                        .map(|e| e.0)
                        .take(limit)
                        .collect();
                    let got: Vec<u64> = mem.events.iter().map(|e| e.seq).collect();
                    prop_assert_eq!(got, want, "{:?}", q);
                    for e in &mem.events {
                        prop_assert_eq!(e.tenant(), tenant(all[e.seq as usize - 1].1));
                    }
                }
                let chunk = |log: &crate::embedded::Log| {
                    let mut c = crate::EventChunk::default();
                    c.read(log, 0, head).unwrap();
                    c.events()
                        .unwrap()
                        .iter()
                        .map(|e| (e.seq, e.event_id.to_owned(), e.payload.to_owned()))
                        .collect::<Vec<_>>()
                };
                let mem = chunk(&log);
                log.shared.recent.write().unwrap().clear();
                let disk = chunk(&log);
                prop_assert_eq!(mem.len() as u64, head);
                prop_assert_eq!(mem, disk);
                rt.block_on(log.close());
                Ok(())
            })
            .unwrap();
    }
}
