//! The paged index-join of the task, notification and delivery lists: a list walked newest
//! first along a creation index, or in key order through the postings of its filters, a page
//! at a time.

use tidemark_log::StorageError;

use super::tables::{TableRef, Tables};

/// The order a list (`GET /v1/tasks`, `GET /v1/deliveries`) is paged in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListOrder {
    /// By id, bytewise; paged with `after`.
    #[default]
    Id,
    /// Newest first by creation, ties by id (the larger first); paged with `before`.
    Newest,
}

/// A row's place in creation order: its creation key (a task's `tasks::created_key`, a
/// delivery's `created_at_us`) and its id, which breaks ties. Ordered by key, then id, as the
/// `by_created` indexes hold them (`key (8 bytes, big-endian) ‖ id`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub key: u64,
    pub id: String,
}

impl Position {
    /// Whether this position comes after the row created at `key` with id `id` (the row is
    /// older: a `before` cursor here keeps it), without building a position of the row.
    pub(crate) fn follows(&self, key: u64, id: &str) -> bool {
        (key, id) < (self.key, self.id.as_str())
    }

    /// Its row in a `by_created` index.
    pub(crate) fn index_key(&self) -> Vec<u8> {
        crate::framework::created_row(self.key, &self.id)
    }
}

/// A page of a list: its rows, and the position of the last when more may follow (the cursor
/// of the next page: its id in id order, the position itself newest first).
pub type Page<T> = (Vec<T>, Option<Position>);

/// Walk a `by_created` index (`key (8 bytes BE) ‖ id`) newest first, from just below `upper`
/// (the newest row when `None`) down to `lower` (inclusive), giving `visit` each row id;
/// `visit` answers whether the row counted (a row that is missing or does not pass the
/// caller's check does not). Answers whether it stopped after `limit` counted rows (more may
/// follow) rather than at the end of the index. It scans: every row between two matches is
/// read, so a page holds up to `limit` matches whenever they exist.
pub(crate) fn walk_newest(
    idx: TableRef<'_>,
    lower: &[u8],
    upper: Option<&[u8]>,
    limit: usize,
    mut visit: impl FnMut(&[u8]) -> Result<bool, StorageError>,
) -> Result<bool, StorageError> {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    if upper.is_some_and(|u| u <= lower) {
        return Ok(false);
    }
    let range = idx.range((Included(lower), upper.map_or(Unbounded, Excluded)))?;
    let mut counted = 0;
    for row in range.rev() {
        let (k, _) = row.map_err(StorageError::of)?;
        let Some(id) = k.value().get(8..) else {
            continue;
        };
        if visit(id)? {
            counted += 1;
            if counted >= limit {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// How a list is walked: newest first along its creation index between two keys, or in the
/// order of its rows' keys (ids ascending; a notification's seq descending) through the
/// postings of its indexed filters (every row when none is set), from past `from`.
pub(crate) enum Walk<'f> {
    Newest {
        index: &'static str,
        lower: Vec<u8>,
        upper: Option<Vec<u8>>,
    },
    ByKey {
        filters: Vec<(&'static str, Option<&'f str>)>,
        from: Option<&'f [u8]>,
        order: Order,
    },
}

/// One page of the rows of a model (`rows`, its table of stored rows by id, among its
/// `tables`) that `keep` keeps, walked as `walk` says: up to `limit` of them, and the position
/// to go on from when there may be more. The one paged index-join of the task, notification
/// and delivery lists.
pub(crate) fn paged<T>(
    tables: &Tables<'_>,
    rows: &'static str,
    walk: Walk<'_>,
    limit: usize,
    keep: impl Fn(&T) -> bool,
) -> Result<Page<T>, StorageError>
where
    T: crate::framework::Row,
    for<'a> Position: From<&'a T>,
{
    let mut out: Vec<T> = Vec::new();
    // Decode a stored row; keep it when it passes the filters.
    let take = |v: &[u8]| -> Result<bool, StorageError> {
        let row = T::decode(v)?;
        let kept = keep(&row);
        if kept {
            out.push(row);
        }
        Ok(kept)
    };
    let rows = tables.table(rows)?;
    let more = match walk {
        Walk::Newest {
            index,
            lower,
            upper,
        } => walk_newest(
            tables.table(index)?,
            &lower,
            upper.as_deref(),
            limit,
            by_id(rows, take),
        )?,
        Walk::ByKey {
            filters,
            from,
            order,
        } => match Postings::of_filters(tables, &filters)? {
            Some(lists) => intersect(&lists, order, from, limit, by_id(rows, take))?.is_some(),
            None => scan_rows(rows, from, order, limit, take)?,
        },
    };
    let next = more.then(|| out.last().map(Position::from)).flatten();
    Ok((out, next))
}

/// `take` given the stored row of each id (a missing row does not count).
fn by_id<'a>(
    rows: TableRef<'a>,
    mut take: impl FnMut(&[u8]) -> Result<bool, StorageError> + 'a,
) -> impl FnMut(&[u8]) -> Result<bool, StorageError> + 'a {
    move |id| match rows.get(id)? {
        Some(v) => take(v.value()),
        None => Ok(false),
    }
}

/// Walk the rows of `rows` in id order past `after` (from the first when `None`), giving
/// `take` each stored row; answers whether it stopped after `limit` counted rows.
fn scan_rows(
    rows: TableRef<'_>,
    from: Option<&[u8]>,
    order: Order,
    limit: usize,
    mut take: impl FnMut(&[u8]) -> Result<bool, StorageError>,
) -> Result<bool, StorageError> {
    use std::ops::Bound::{Excluded, Unbounded};
    let from = from.map_or(Unbounded, Excluded);
    let range: Box<dyn Iterator<Item = _>> = match order {
        Order::Asc => Box::new(rows.range((from, Unbounded))?),
        Order::Desc => Box::new(rows.range((Unbounded, from))?.rev()),
    };
    let mut counted = 0;
    for row in range {
        let (_, v) = row.map_err(StorageError::of)?;
        if take(v.value())? {
            counted += 1;
            if counted >= limit {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The direction a list is walked in: ids ascending, or seqs newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    Asc,
    Desc,
}

/// The rows of one value in a secondary index whose keys are `value ‖ 0 ‖ suffix` (the suffix
/// is a row id, or a big-endian seq): the suffixes, ordered bytewise.
struct Postings<'a> {
    idx: TableRef<'a>,
    /// `value ‖ 0`.
    prefix: Vec<u8>,
    /// `value ‖ 1`: the first key past the value's rows.
    end: Vec<u8>,
}

impl<'a> Postings<'a> {
    /// The index of one list filter for each filter given (`(table, Some(value))`), or `None`
    /// when no filter is given.
    fn of_filters(
        tables: &'a Tables<'_>,
        filters: &[(&'static str, Option<&str>)],
    ) -> Result<Option<Vec<Postings<'a>>>, StorageError> {
        let mut lists = Vec::new();
        for (table, value) in filters {
            let Some(value) = value else { continue };
            let mut prefix = value.as_bytes().to_vec();
            prefix.push(0);
            let mut end = value.as_bytes().to_vec();
            end.push(1);
            let idx = tables.table(table)?;
            lists.push(Postings { idx, prefix, end });
        }
        Ok((!lists.is_empty()).then_some(lists))
    }

    /// The first suffix from `from` on in `order` — ascending the smallest at or above it,
    /// descending the largest at or below it, `from` itself only when `inclusive` — or from
    /// the start of the list when `from` is `None`.
    fn seek(
        &self,
        from: Option<&[u8]>,
        inclusive: bool,
        order: Order,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        use std::ops::Bound::{self, Excluded, Included};
        fn bound(k: &[u8], inclusive: bool) -> Bound<&[u8]> {
            if inclusive { Included(k) } else { Excluded(k) }
        }
        let at = from.map(|f| [self.prefix.as_slice(), f].concat());
        let (lo, hi) = match (order, &at) {
            (_, None) => (
                Included(self.prefix.as_slice()),
                Excluded(self.end.as_slice()),
            ),
            (Order::Asc, Some(at)) => (bound(at, inclusive), Excluded(self.end.as_slice())),
            (Order::Desc, Some(at)) => (Included(self.prefix.as_slice()), bound(at, inclusive)),
        };
        // An empty interval: a descending seek strictly below the empty suffix.
        if matches!((lo, hi), (Included(l), Excluded(h)) if l >= h) {
            return Ok(None);
        }
        let mut range = self.idx.range((lo, hi))?;
        let row = match order {
            Order::Asc => range.next(),
            Order::Desc => range.next_back(),
        };
        match row {
            Some(row) => {
                let (k, _) = row.map_err(StorageError::of)?;
                Ok(Some(k.value()[self.prefix.len()..].to_vec()))
            }
            None => Ok(None),
        }
    }
}

/// The suffixes (row ids, seqs) present in every one of `lists`, in `order`, past the cursor
/// `after` (from the start when `None`), by a zig-zag (leapfrog) join: the candidate is the
/// next suffix of the first list; each other list in turn seeks to it, and either holds it
/// or names its own next suffix, which becomes the candidate; a candidate every list holds
/// is a match. Each step is one index seek and skips every row between two candidates, so the
/// work is bounded by the shortest list, not the longest: a page holds up to `limit` matches
/// whenever they exist, however many rows separate them.
///
/// `visit` is given each match and answers whether it counted (a row that is missing or
/// does not pass the caller's check does not). The walk ends after `limit` counted matches,
/// answering the last as the cursor of the next page, or at the end of a list with `None`.
fn intersect(
    lists: &[Postings<'_>],
    order: Order,
    after: Option<&[u8]>,
    limit: usize,
    mut visit: impl FnMut(&[u8]) -> Result<bool, StorageError>,
) -> Result<Option<Vec<u8>>, StorageError> {
    let Some((first, _)) = lists.split_first() else {
        return Ok(None);
    };
    let mut from = after.map(<[u8]>::to_vec);
    let mut counted = 0;
    loop {
        // A cursor is exclusive: the page after it.
        let Some(mut cand) = first.seek(from.as_deref(), false, order)? else {
            return Ok(None);
        };
        // Lists that hold `cand`, counting the one it came from.
        let mut agree = 1;
        let mut i = 1;
        while agree < lists.len() {
            let Some(next) = lists[i % lists.len()].seek(Some(&cand), true, order)? else {
                return Ok(None);
            };
            if next == cand {
                agree += 1;
            } else {
                // This list holds nothing between `cand` and `next`, so neither does the
                // intersection: `next` is the candidate, held by this list so far.
                cand = next;
                agree = 1;
            }
            i += 1;
        }
        if visit(&cand)? {
            counted += 1;
            if counted >= limit {
                return Ok(Some(cand));
            }
        }
        from = Some(cand);
    }
}
