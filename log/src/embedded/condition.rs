//! How the leader of a group judges a [`Condition`] of a conditional append against redb.
//!
//! The leader judges a batch's condition on the log as it stands just before the batch: the
//! committed log plus the batches accepted earlier in the same group commit. A group's
//! accepted events are indexed by (stream, subject) once, lazily — only when some batch of the
//! group has a subject condition — so a condition costs one map lookup for the group and, when
//! the group has not written that subject, one lookup in the log's subject index (the in-memory
//! tail, then the merged `subject_seq` table), never a scan of the group.

use std::collections::HashMap;

use super::ids::LazyRead;
use super::postings::{self, SUBJECT_BLOCKS};
use super::tail::Tail;
use crate::condition::Condition;
use crate::envelope::{NewEvent, scoped};
use crate::error::{AppendError, StorageError, storage};

/// The last seq of each (stream, subject) among a group's accepted events: subject → (stream,
/// seq), a subject having few streams; both keys scoped to the event's tenant.
#[derive(Debug, Default)]
pub(crate) struct GroupLast {
    /// How many of the group's staged events are indexed.
    indexed: usize,
    last: HashMap<String, Vec<(String, u64)>>,
}

impl GroupLast {
    /// Index the events of `staged` not indexed yet. `staged` only ever grows by accepted
    /// batches before it is looked at again (a refused batch is removed before the next one is
    /// judged), so what is indexed stays in it.
    fn catch_up(&mut self, staged: &[(u64, NewEvent)]) {
        debug_assert!(self.indexed <= staged.len(), "indexed events were unstaged");
        for (seq, ev) in staged.iter().skip(self.indexed) {
            let tenant = ev.tenant.as_deref();
            let (subject, stream) = (scoped(tenant, &ev.subject), scoped(tenant, &ev.stream));
            match self.last.get_mut(&*subject) {
                Some(streams) => match streams.iter_mut().find(|(s, _)| *s == *stream) {
                    Some((_, last)) => *last = *seq,
                    None => streams.push((stream.into_owned(), *seq)),
                },
                None => {
                    self.last
                        .insert(subject.into_owned(), vec![(stream.into_owned(), *seq)]);
                }
            }
        }
        self.indexed = staged.len();
    }

    fn get(&self, stream: &str, subject: &str) -> Option<u64> {
        self.last
            .get(subject)?
            .iter()
            .find(|(s, _)| s == stream)
            .map(|(_, seq)| *seq)
    }
}

/// `Some(ExpectationFailed)` naming the first part of `cond` (the head first, then the
/// subjects in the order given) that does not hold for the log as it stands before a batch:
/// the committed log up to `head`, then `staged`, the events the group accepted before it.
/// The batch is `tenant`'s, and its condition names that tenant's streams and subjects.
pub(crate) fn failed(
    tenant: Option<&str>,
    cond: &Condition,
    head: u64,
    staged: &[(u64, NewEvent)],
    group: &mut GroupLast,
    txn: &LazyRead<'_>,
    tail: &Tail,
) -> Result<Option<AppendError>, StorageError> {
    if !cond.subjects.is_empty() {
        group.catch_up(staged);
    }
    crate::condition::first_failed(cond, head + staged.len() as u64, |stream, subject| {
        let (stream, subject) = (scoped(tenant, stream), scoped(tenant, subject));
        match group.get(&stream, &subject) {
            Some(seq) => Ok(seq),
            None => last_of_subject(txn, tail, &stream, &subject, u64::MAX),
        }
    })
}

/// The last committed seq `<= upto` of `stream` with `subject` (0: none; both scoped to their
/// tenant, `envelope::scoped`): the in-memory tail
/// first (it holds the newest events), then the merged subject index.
pub(crate) fn last_of_subject(
    txn: &LazyRead<'_>,
    tail: &Tail,
    stream: &str,
    subject: &str,
    upto: u64,
) -> Result<u64, StorageError> {
    if let Some(seq) = tail.last_of(stream, subject, upto) {
        return Ok(seq);
    }
    let t = match txn.txn()?.open_table(SUBJECT_BLOCKS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(storage(e)),
    };
    postings::last_upto(&t, subject, stream, upto)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ev(stream: &str, subject: &str) -> NewEvent {
        NewEvent::new(None, stream, subject, "t", &json!({})).unwrap()
    }

    /// The group index answers the last seq per (stream, subject), not per subject, and picks
    /// up events staged after it was last asked.
    #[test]
    fn the_group_index_keeps_the_last_seq_per_stream_and_subject() {
        let mut g = GroupLast::default();
        let mut staged = vec![(1, ev("s", "x")), (2, ev("o", "x")), (3, ev("s", "y"))];
        g.catch_up(&staged);
        assert_eq!(g.get("s", "x"), Some(1));
        assert_eq!(g.get("o", "x"), Some(2));
        assert_eq!(g.get("o", "y"), None);
        staged.push((4, ev("s", "x")));
        g.catch_up(&staged);
        assert_eq!((g.get("s", "x"), g.get("o", "x")), (Some(4), Some(2)));
        // Another tenant's (stream, subject) is its own.
        staged.push((5, ev("s", "x").in_tenant("acme").unwrap()));
        g.catch_up(&staged);
        assert_eq!(g.get("s", "x"), Some(4));
        assert_eq!(g.get("acme\u{1f}s", "acme\u{1f}x"), Some(5));
    }
}
