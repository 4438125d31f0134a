//! Queries of the read models, for the API. Each takes the log's database and answers from
//! one read transaction.

use serde::Serialize;
use tidemark_log::StorageError;

use redb::ReadableTable;

use crate::deliveries::{self, Delivery};
use crate::framework::{Reader, be_u64};
use crate::ids::{BridgeId, DeliveryId, NotificationId, SubscriptionId, TaskId};
use crate::notifications::{self, Notification};
use crate::tasks::{self, Task};

#[derive(Debug, Clone, Serialize)]
pub struct ProjectionInfo {
    pub name: String,
    pub generation: u32,
    pub checkpoint: u64,
    pub lag: u64,
    pub digest: String,
    pub changes: u64,
}

pub fn projections(db: &redb::Database, head: u64) -> Result<Vec<ProjectionInfo>, StorageError> {
    let r = Reader::new(db)?;
    crate::all()
        .iter()
        .map(|p| {
            let m = r.meta(p.name())?;
            Ok(ProjectionInfo {
                name: p.name().to_owned(),
                generation: m.generation,
                checkpoint: m.checkpoint,
                lag: head.saturating_sub(m.checkpoint),
                digest: hex::encode(m.digest),
                changes: m.changes,
            })
        })
        .collect()
}

pub fn task(db: &redb::Database, task_id: &TaskId) -> Result<Option<Task>, StorageError> {
    Reader::new(db)?.get_val(tasks::NAME, tasks::ROWS, task_id.as_bytes())
}

#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub status: Option<String>,
    pub project_id: Option<String>,
    /// Only tasks whose id sorts after this one (bytewise): the cursor of `ListOrder::Id`.
    pub after: Option<String>,
    /// Only tasks created before this position: the cursor of `ListOrder::Newest`.
    pub before: Option<Position>,
    pub order: ListOrder,
    pub limit: usize,
}

/// The order a list (`GET /v1/tasks`, `GET /v1/deliveries`) is paged in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListOrder {
    /// By id, bytewise; paged with `after`.
    #[default]
    Id,
    /// Newest first by creation, ties by id (the larger first); paged with `before`.
    Newest,
}

/// A row's place in creation order: its creation key (a task's [`tasks::created_key`], a
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
    fn follows(&self, key: u64, id: &str) -> bool {
        (key, id) < (self.key, self.id.as_str())
    }

    /// Its row in a `by_created` index.
    fn index_key(&self) -> Vec<u8> {
        crate::framework::created_row(self.key, &self.id)
    }
}

impl From<&Task> for Position {
    fn from(t: &Task) -> Self {
        Position {
            key: tasks::created_key(t),
            id: t.task_id.clone(),
        }
    }
}

/// A notification's place: its seq (the key of its row).
impl From<&Notification> for Position {
    fn from(n: &Notification) -> Self {
        Position {
            key: n.seq,
            id: String::new(),
        }
    }
}

impl From<&Delivery> for Position {
    fn from(d: &Delivery) -> Self {
        Position {
            key: deliveries::created_key(d),
            id: d.id.to_string(),
        }
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
fn walk_newest(
    idx: &Table,
    lower: &[u8],
    upper: Option<&[u8]>,
    limit: usize,
    mut visit: impl FnMut(&[u8]) -> Result<bool, StorageError>,
) -> Result<bool, StorageError> {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    if upper.is_some_and(|u| u <= lower) {
        return Ok(false);
    }
    let range = idx
        .range::<&[u8]>((Included(lower), upper.map_or(Unbounded, Excluded)))
        .map_err(StorageError::of)?;
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

/// Tasks ordered by id or newest first, filtered.
pub fn tasks(db: &redb::Database, f: &TaskFilter) -> Result<Page<Task>, StorageError> {
    let r = Reader::new(db)?;
    let limit = f.limit.max(1);
    let Some(rows) = r.table(tasks::NAME, tasks::ROWS)? else {
        return Ok((Vec::new(), None));
    };
    let keep = |t: &Task| {
        f.status.as_deref().is_none_or(|s| s == t.status)
            && f.project_id
                .as_deref()
                .is_none_or(|p| t.project_id.as_deref() == Some(p))
            && f.after.as_deref().is_none_or(|a| t.task_id.as_str() > a)
            && f.before
                .as_ref()
                .is_none_or(|b| b.follows(tasks::created_key(t), &t.task_id))
    };
    let walk = if f.order == ListOrder::Newest {
        Walk::Newest {
            index: tasks::BY_CREATED,
            lower: Vec::new(),
            upper: f.before.as_ref().map(Position::index_key),
        }
    } else {
        Walk::ByKey {
            filters: vec![
                (tasks::BY_PROJECT, f.project_id.as_deref()),
                (tasks::BY_STATUS, f.status.as_deref()),
            ],
            from: f.after.as_deref().map(str::as_bytes),
            order: Order::Asc,
        }
    };
    paged(&r, tasks::NAME, &rows, walk, limit, keep)
}

/// How a list is walked: newest first along its creation index between two keys, or in the
/// order of its rows' keys (ids ascending; a notification's seq descending) through the
/// postings of its indexed filters (every row when none is set), from past `from`.
enum Walk<'f> {
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

/// One page of the rows of `model` (`rows`, its stored rows by id) that `keep` keeps, walked
/// as `walk` says: up to `limit` of them, and the position to go on from when there may be
/// more. The one paged index-join of the task, notification and delivery lists.
fn paged<T>(
    r: &Reader,
    model: &str,
    rows: &Table,
    walk: Walk<'_>,
    limit: usize,
    keep: impl Fn(&T) -> bool,
) -> Result<Page<T>, StorageError>
where
    T: serde::de::DeserializeOwned,
    for<'a> Position: From<&'a T>,
{
    let mut out: Vec<T> = Vec::new();
    // Decode a stored row; keep it when it passes the filters.
    let take = |v: &[u8]| -> Result<bool, StorageError> {
        let row: T = postcard::from_bytes(v).map_err(StorageError::of)?;
        let kept = keep(&row);
        if kept {
            out.push(row);
        }
        Ok(kept)
    };
    let more = match walk {
        Walk::Newest {
            index,
            lower,
            upper,
        } => match r.table(model, index)? {
            Some(idx) => walk_newest(&idx, &lower, upper.as_deref(), limit, by_id(rows, take))?,
            None => false,
        },
        Walk::ByKey {
            filters,
            from,
            order,
        } => match Postings::of_filters(r, model, &filters)? {
            Some(lists) => intersect(&lists, order, from, limit, by_id(rows, take))?.is_some(),
            None => scan_rows(rows, from, order, limit, take)?,
        },
    };
    let next = more.then(|| out.last().map(Position::from)).flatten();
    Ok((out, next))
}

/// A model table (or index) opened for reading.
type Table = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// `take` given the stored row of each id (a missing row does not count).
fn by_id<'a>(
    rows: &'a Table,
    mut take: impl FnMut(&[u8]) -> Result<bool, StorageError> + 'a,
) -> impl FnMut(&[u8]) -> Result<bool, StorageError> + 'a {
    move |id| match rows.get(id).map_err(StorageError::of)? {
        Some(v) => take(v.value()),
        None => Ok(false),
    }
}

/// Walk the rows of `rows` in id order past `after` (from the first when `None`), giving
/// `take` each stored row; answers whether it stopped after `limit` counted rows.
fn scan_rows(
    rows: &Table,
    from: Option<&[u8]>,
    order: Order,
    limit: usize,
    mut take: impl FnMut(&[u8]) -> Result<bool, StorageError>,
) -> Result<bool, StorageError> {
    use std::ops::Bound::{Excluded, Unbounded};
    let from = from.map_or(Unbounded, Excluded);
    let range: Box<dyn Iterator<Item = _>> = match order {
        Order::Asc => Box::new(
            rows.range::<&[u8]>((from, Unbounded))
                .map_err(StorageError::of)?,
        ),
        Order::Desc => Box::new(
            rows.range::<&[u8]>((Unbounded, from))
                .map_err(StorageError::of)?
                .rev(),
        ),
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
enum Order {
    Asc,
    Desc,
}

/// The rows of one value in a secondary index whose keys are `value ‖ 0 ‖ suffix` (the suffix
/// is a row id, or a big-endian seq): the suffixes, ordered bytewise.
struct Postings {
    idx: redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    /// `value ‖ 0`.
    prefix: Vec<u8>,
    /// `value ‖ 1`: the first key past the value's rows.
    end: Vec<u8>,
}

impl Postings {
    /// The index of one list filter for each filter given (`(table, Some(value))`), or `None`
    /// when no filter is given. An index table the projection has not written yet holds no
    /// rows: the answer is then empty, so it is given as an empty list.
    fn of_filters(
        r: &Reader,
        proj: &str,
        filters: &[(&str, Option<&str>)],
    ) -> Result<Option<Vec<Postings>>, StorageError> {
        let mut lists = Vec::new();
        for (table, value) in filters {
            let Some(value) = value else { continue };
            let mut prefix = value.as_bytes().to_vec();
            prefix.push(0);
            let mut end = value.as_bytes().to_vec();
            end.push(1);
            match r.table(proj, table)? {
                Some(idx) => lists.push(Postings { idx, prefix, end }),
                None => return Ok(Some(Vec::new())),
            }
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
        let mut range = self
            .idx
            .range::<&[u8]>((lo, hi))
            .map_err(StorageError::of)?;
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
    lists: &[Postings],
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

#[derive(Debug, Clone, Default)]
pub struct NotificationFilter {
    pub priority: Option<String>,
    pub recipient: Option<String>,
    pub before_seq: Option<u64>,
    pub limit: usize,
}

/// Notifications newest first; the second value is the `before_seq` of the next page, if any.
pub fn notifications(
    db: &redb::Database,
    f: &NotificationFilter,
) -> Result<(Vec<Notification>, Option<u64>), StorageError> {
    notifications_in(&Reader::new(db)?, f)
}

/// A page of notifications, each with its task's `latest_event_seq`, and the `before_seq` of
/// the next page.
pub type NotificationsWithTaskSeq = (Vec<(Notification, u64)>, Option<u64>);

/// [`notifications`], each with the `latest_event_seq` of its task (0 when it names no task
/// or its task has no events), read in the same transaction: the seed a dashboard opens the
/// task's stream after (`/v1/tasks/{id}/stream?after_sequence=…`, seed 002), so no event
/// between the read and the stream's start is missed.
pub fn notifications_with_task_seq(
    db: &redb::Database,
    f: &NotificationFilter,
) -> Result<NotificationsWithTaskSeq, StorageError> {
    let r = Reader::new(db)?;
    let (rows, next) = notifications_in(&r, f)?;
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(rows.len());
    for n in rows {
        let seq = match &n.task_id {
            None => 0,
            Some(t) => match seen.get(t) {
                Some(s) => *s,
                None => {
                    let s = r
                        .get_val::<Task>(tasks::NAME, tasks::ROWS, t.as_bytes())?
                        .map_or(0, |t| t.latest_event_seq);
                    seen.insert(t.clone(), s);
                    s
                }
            },
        };
        out.push((n, seq));
    }
    Ok((out, next))
}

fn notifications_in(
    r: &Reader,
    f: &NotificationFilter,
) -> Result<(Vec<Notification>, Option<u64>), StorageError> {
    let Some(rows) = r.table(notifications::NAME, notifications::BY_SEQ)? else {
        return Ok((Vec::new(), None));
    };
    let keep = |n: &Notification| {
        f.priority.as_deref().is_none_or(|p| p == n.priority)
            && f.recipient
                .as_deref()
                .is_none_or(|r| n.recipient.as_deref() == Some(r))
    };
    let before = f.before_seq.map(u64::to_be_bytes);
    let walk = Walk::ByKey {
        filters: vec![
            (notifications::BY_PRIORITY, f.priority.as_deref()),
            (notifications::BY_RECIPIENT, f.recipient.as_deref()),
        ],
        from: before.as_ref().map(<[u8; 8]>::as_slice),
        order: Order::Desc,
    };
    let (out, next) = paged(r, notifications::NAME, &rows, walk, f.limit.max(1), keep)?;
    Ok((out, next.map(|p| p.key)))
}

/// Highest source seq the router has produced a notification for.
pub fn router_checkpoint(db: &redb::Database) -> Result<u64, StorageError> {
    stored_u64(
        db,
        notifications::NAME,
        notifications::ROUTER,
        notifications::ROUTER_KEY,
    )
}

/// A big-endian u64 a projection keeps under `key` (a checkpoint), 0 when absent.
fn stored_u64(
    db: &redb::Database,
    proj: &str,
    table: &str,
    key: &[u8],
) -> Result<u64, StorageError> {
    let r = Reader::new(db)?;
    let Some(t) = r.table(proj, table)? else {
        return Ok(0);
    };
    Ok(t.get(key)
        .map_err(StorageError::of)?
        .and_then(|v| be_u64(v.value()))
        .unwrap_or(0))
}

/// The notification settings in force (payload of the last `settings.updated`).
pub fn current_settings(db: &redb::Database) -> Result<Option<serde_json::Value>, StorageError> {
    let r = Reader::new(db)?;
    let Some(t) = r.table(crate::settings::NAME, crate::settings::CURRENT)? else {
        return Ok(None);
    };
    match t.get(crate::settings::KEY).map_err(StorageError::of)? {
        Some(v) => serde_json::from_slice(v.value())
            .map(Some)
            .map_err(StorageError::of),
        None => Ok(None),
    }
}

/// A delivery and its attempt timeline, oldest step first.
pub fn delivery(
    db: &redb::Database,
    id: &DeliveryId,
) -> Result<Option<(Delivery, Vec<deliveries::Step>)>, StorageError> {
    let id = id.as_str();
    let r = Reader::new(db)?;
    let Some(row) = r.get_val::<Delivery>(deliveries::NAME, deliveries::ROWS, id.as_bytes())?
    else {
        return Ok(None);
    };
    let mut steps = Vec::new();
    if let Some(t) = r.table(deliveries::NAME, deliveries::TIMELINE)? {
        let (from, to) = under(id);
        for row in t
            .range(from.as_slice()..to.as_slice())
            .map_err(StorageError::of)?
        {
            let (_, v) = row.map_err(StorageError::of)?;
            steps.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        }
    }
    Ok(Some((row, steps)))
}

#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    pub status: Option<String>,
    pub sink: Option<String>,
    pub route: Option<String>,
    pub recipient: Option<String>,
    /// Deliveries carrying this notification (a digest carries the ones that joined it).
    pub notification_id: Option<String>,
    /// Deliveries of notifications from this `source.site_id`.
    pub source_site: Option<String>,
    /// Deliveries of notifications of this `type`.
    pub ntype: Option<String>,
    /// Deliveries to this notification list (section 17).
    pub list: Option<String>,
    /// Created at or after this time (µs).
    pub created_after_us: Option<i64>,
    /// Created before this time (µs).
    pub created_before_us: Option<i64>,
    /// `Some(cut)`: only stuck deliveries (due since before `cut`, µs); with
    /// `stuck_only == false`, only those that are not stuck.
    pub stuck: Option<StuckFilter>,
    /// A case-insensitive substring of the title (or of a digest item's title).
    pub title_contains: Option<String>,
    /// Only deliveries whose id sorts after this one (bytewise): the cursor of
    /// `ListOrder::Id`.
    pub after: Option<String>,
    /// Only deliveries created before this position: the cursor of `ListOrder::Newest`.
    pub before: Option<Position>,
    pub order: ListOrder,
    pub limit: usize,
}

/// The `stuck` filter: deliveries due since before `cut_us` (now − `stuck_after`) are stuck.
#[derive(Debug, Clone, Copy)]
pub struct StuckFilter {
    pub cut_us: i64,
    pub stuck_only: bool,
}

impl StuckFilter {
    /// Whether `d` is stuck (section 5): not terminal, and due (its next attempt time passed,
    /// or its lease expired) since before the cut. A delivery scheduled for later (a delay,
    /// quiet hours, a digest window, a backoff) or under a live lease is not stuck, whatever its
    /// age; an operator retry makes it due at the retry, which restarts the clock.
    pub fn is_stuck(cut_us: i64, d: &Delivery) -> bool {
        d.due_us().is_some_and(|due| due < cut_us)
    }
}

impl DeliveryFilter {
    /// The filters no index answers (time range, stuck, title): checked on each row.
    fn keeps_unindexed(&self, d: &Delivery) -> bool {
        self.created_after_us.is_none_or(|t| d.created_at_us >= t)
            && self.created_before_us.is_none_or(|t| d.created_at_us < t)
            && self
                .stuck
                .is_none_or(|s| StuckFilter::is_stuck(s.cut_us, d) == s.stuck_only)
            && self.title_contains.as_deref().is_none_or(|q| {
                let q = q.to_lowercase();
                std::iter::once(d.title.as_str())
                    .chain(d.all_items().map(|i| i.title.as_str()))
                    .any(|t| t.to_lowercase().contains(&q))
            })
    }
}

/// Deliveries ordered by id or newest first, filtered.
pub fn deliveries(db: &redb::Database, f: &DeliveryFilter) -> Result<Page<Delivery>, StorageError> {
    let r = Reader::new(db)?;
    let limit = f.limit.max(1);
    let Some(rows) = r.table(deliveries::NAME, deliveries::ROWS)? else {
        return Ok((Vec::new(), None));
    };
    let keep = |d: &Delivery| {
        f.sink.as_deref().is_none_or(|s| s == d.sink)
            && f.route.as_deref().is_none_or(|s| s == d.route)
            && f.status.as_deref().is_none_or(|s| s == d.status)
            && f.recipient
                .as_deref()
                .is_none_or(|s| d.recipient.as_deref() == Some(s))
            && f.notification_id
                .as_deref()
                .is_none_or(|n| d.all_items().any(|i| i.notification_id == n))
            && f.source_site
                .as_deref()
                .is_none_or(|s| d.ext.source_site.as_deref() == Some(s))
            && f.ntype
                .as_deref()
                .is_none_or(|t| d.ext.more.later.ntype.as_deref() == Some(t))
            && f.list
                .as_deref()
                .is_none_or(|l| d.ext.more.list.as_deref() == Some(l))
            && f.keeps_unindexed(d)
            && f.after.as_deref().is_none_or(|a| d.id.as_str() > a)
            && f.before
                .as_ref()
                .is_none_or(|b| b.follows(deliveries::created_key(d), &d.id))
    };
    let walk = if f.order == ListOrder::Newest {
        // The time range bounds the walk (the index is by creation time).
        Walk::Newest {
            index: deliveries::BY_CREATED,
            lower: deliveries::us_key(f.created_after_us.unwrap_or(0)).to_vec(),
            upper: [
                f.before.as_ref().map(Position::index_key),
                f.created_before_us
                    .map(|t| deliveries::us_key(t.max(1)).to_vec()),
            ]
            .into_iter()
            .flatten()
            .min(),
        }
    } else {
        Walk::ByKey {
            filters: vec![
                (deliveries::BY_STATUS, f.status.as_deref()),
                (deliveries::BY_SINK, f.sink.as_deref()),
                (deliveries::BY_ROUTE, f.route.as_deref()),
                (deliveries::BY_RECIPIENT, f.recipient.as_deref()),
                (deliveries::BY_NOTIFICATION, f.notification_id.as_deref()),
                (deliveries::BY_SITE, f.source_site.as_deref()),
                (deliveries::BY_TYPE, f.ntype.as_deref()),
                (deliveries::BY_LIST, f.list.as_deref()),
            ],
            from: f.after.as_deref().map(str::as_bytes),
            order: Order::Asc,
        }
    };
    paged(&r, deliveries::NAME, &rows, walk, limit, keep)
}

/// What became of one notification (spec section 14), derived from its deliveries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotificationStatus {
    pub notification: Notification,
    /// dashboard_only, pending, parked, delivered, discarded, cancelled or skipped.
    pub status: &'static str,
    /// Attempts of all its deliveries.
    pub attempts: u32,
    /// The error of the delivery that failed most recently.
    pub last_error: Option<String>,
    /// When it was enqueued: its `source.enqueued_at`, else the event time.
    pub enqueued_at_us: i64,
    pub created_at_us: i64,
    /// The latest delivery time of its deliveries.
    pub delivered_at_us: Option<i64>,
    /// Its deliveries (a digest it joined counts as its own), by id.
    pub deliveries: Vec<Delivery>,
}

/// The provenance of the notification at `seq` (section 2), if there is one there.
pub fn provenance_at(
    db: &redb::Database,
    seq: u64,
) -> Result<Option<notifications::Provenance>, StorageError> {
    Ok(Reader::new(db)?
        .get_val::<Notification>(
            notifications::NAME,
            notifications::BY_SEQ,
            &seq.to_be_bytes(),
        )?
        .map(|n| n.ext))
}

/// The status of a notification with these deliveries: none → `dashboard_only`; any queued,
/// leased or retry_wait → `pending`; else any parked → `parked`; else any sent → `delivered`;
/// else any discarded → `discarded`; else any cancelled → `cancelled`; else `skipped`.
pub fn notification_status_of(deliveries: &[Delivery]) -> &'static str {
    let any = |s: &[&str]| deliveries.iter().any(|d| s.contains(&d.status.as_str()));
    if deliveries.is_empty() {
        "dashboard_only"
    } else if any(&["queued", "leased", "retry_wait"]) {
        "pending"
    } else if any(&["parked"]) {
        "parked"
    } else if any(&["sent"]) {
        "delivered"
    } else if any(&["discarded"]) {
        "discarded"
    } else if any(&["cancelled"]) {
        "cancelled"
    } else {
        "skipped"
    }
}

/// Deliveries a status record lists at most (one per route; a notification has a handful).
const STATUS_DELIVERIES_MAX: usize = 1000;

/// The status record of notification `id`, or `None` when no notification has that id.
pub fn notification_status(
    db: &redb::Database,
    id: &NotificationId,
    intent_key: Option<&str>,
) -> Result<Option<NotificationStatus>, StorageError> {
    let id = id.as_str();
    let r = Reader::new(db)?;
    let Some(ids) = r.table(notifications::NAME, notifications::IDS)? else {
        return Ok(None);
    };
    let Some(seq) = ids
        .get(id.as_bytes())
        .map_err(StorageError::of)?
        .and_then(|v| be_u64(v.value()))
    else {
        return Ok(None);
    };
    let Some(notification) = r.get_val::<Notification>(
        notifications::NAME,
        notifications::BY_SEQ,
        &seq.to_be_bytes(),
    )?
    else {
        return Ok(None);
    };
    let mut found = Vec::new();
    if let (Some(index), Some(rows)) = (
        r.table(deliveries::NAME, deliveries::BY_NOTIFICATION)?,
        r.table(deliveries::NAME, deliveries::ROWS)?,
    ) {
        // Its deliveries on redacting routes carry the intent key in place of its id.
        for key in std::iter::once(id).chain(intent_key) {
            let mut prefix = key.as_bytes().to_vec();
            prefix.push(0);
            for row in index.range(prefix.as_slice()..).map_err(StorageError::of)? {
                let (k, _) = row.map_err(StorageError::of)?;
                let Some(delivery_id) = k.value().strip_prefix(prefix.as_slice()) else {
                    break;
                };
                if let Some(v) = rows.get(delivery_id).map_err(StorageError::of)? {
                    found.push(
                        postcard::from_bytes::<Delivery>(v.value()).map_err(StorageError::of)?,
                    );
                }
                if found.len() >= STATUS_DELIVERIES_MAX {
                    break;
                }
            }
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
    }
    let canceled = r
        .table(deliveries::NAME, deliveries::NOTIFICATIONS_CANCELED)?
        .map(|t| t.get(id.as_bytes()).map(|v| v.is_some()))
        .transpose()
        .map_err(StorageError::of)?
        .unwrap_or(false);
    // A canceled notification whose digest let it go has no delivery left: cancelled.
    let status = match notification_status_of(&found) {
        "dashboard_only" if canceled => "cancelled",
        s => s,
    };
    let last_error = found
        .iter()
        .filter(|d| d.last_error.is_some())
        .max_by_key(|d| (d.updated_at_us, d.last_seq))
        .and_then(|d| d.last_error.clone());
    Ok(Some(NotificationStatus {
        status,
        attempts: found.iter().map(|d| d.attempts).sum(),
        last_error,
        enqueued_at_us: notification
            .ext
            .enqueued_at_us()
            .unwrap_or(notification.time_us),
        created_at_us: notification.time_us,
        delivered_at_us: found.iter().filter_map(|d| d.delivered_at_us).max(),
        deliveries: found,
        notification,
    }))
}

/// Outbox KPIs of one sink or of all (spec section 5).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Kpis {
    /// queued + leased + retry_wait.
    pub queue_depth: u64,
    pub queued: u64,
    pub leased: u64,
    pub retry_wait: u64,
    /// Due (next attempt time passed, or lease expired) for longer than `stuck_after`.
    pub stuck: u64,
    pub parked: u64,
    /// Sent within the last interval.
    pub sent_last_interval: u64,
    /// Age of the oldest pending delivery, seconds (0 when none).
    pub oldest_pending_age_s: f64,
}

impl Kpis {
    /// Count `n` deliveries in `status`.
    fn count(&mut self, status: &[u8], n: u64) {
        match status {
            b"queued" => self.queued += n,
            b"leased" => self.leased += n,
            b"retry_wait" => self.retry_wait += n,
            b"parked" => self.parked += n,
            _ => {}
        }
    }
}

/// Per sink and overall; times are judged at `now_us` (reads may use the clock; folds never).
pub fn kpis(
    db: &redb::Database,
    now_us: i64,
    stuck_after_ms: u64,
    interval_ms: u64,
) -> Result<(Kpis, std::collections::BTreeMap<String, Kpis>), StorageError> {
    let r = Reader::new(db)?;
    let mut by_sink: std::collections::BTreeMap<String, Kpis> = Default::default();
    if let Some(t) = r.table(deliveries::NAME, deliveries::COUNTS)? {
        for row in t.iter().map_err(StorageError::of)? {
            let (k, v) = row.map_err(StorageError::of)?;
            let k = k.value();
            let Some(split) = k.iter().position(|b| *b == 0) else {
                continue;
            };
            let sink = String::from_utf8_lossy(&k[..split]).into_owned();
            let status = &k[split + 1..];
            let n = be_u64(v.value()).unwrap_or(0);
            by_sink.entry(sink).or_default().count(status, n);
        }
    }
    let pending = r.table(deliveries::NAME, deliveries::PENDING)?;
    let due = r.table(deliveries::NAME, deliveries::DUE)?;
    let sent = r.table(deliveries::NAME, deliveries::SENT)?;
    let stuck_before = now_us.saturating_sub(stuck_after_ms as i64 * 1_000);
    let sent_since = now_us.saturating_sub(interval_ms as i64 * 1_000);
    for (sink, k) in &mut by_sink {
        timed_kpis(
            k,
            sink,
            Timed {
                pending: pending.as_ref(),
                due: due.as_ref(),
                sent: sent.as_ref(),
            },
            stuck_before,
            sent_since,
            now_us,
        )?;
    }
    let mut all = Kpis::default();
    for k in by_sink.values() {
        all.queue_depth += k.queue_depth;
        all.queued += k.queued;
        all.leased += k.leased;
        all.retry_wait += k.retry_wait;
        all.stuck += k.stuck;
        all.parked += k.parked;
        all.sent_last_interval += k.sent_last_interval;
        all.oldest_pending_age_s = all.oldest_pending_age_s.max(k.oldest_pending_age_s);
    }
    Ok((all, by_sink))
}

/// The `dim ‖ 0 ‖ time ‖ id` indexes of one dimension (sink or site): pending rows by
/// creation, claimable rows by due time, sent rows by delivery.
struct Timed<'a> {
    pending: Option<&'a Table>,
    due: Option<&'a Table>,
    sent: Option<&'a Table>,
}

/// The KPIs of one sink or site `dim` read from its [`Timed`] indexes: queue depth, stuck
/// (due since before `stuck_before`), oldest pending age, sent in the interval.
fn timed_kpis(
    k: &mut Kpis,
    dim: &str,
    t: Timed<'_>,
    stuck_before: i64,
    sent_since: i64,
    now_us: i64,
) -> Result<(), StorageError> {
    k.queue_depth = k.queued + k.leased + k.retry_wait;
    let lo = deliveries::timed_key(dim, 0, "");
    let hi = deliveries::timed_key(dim, i64::MAX, "");
    if let Some(d) = t.due {
        let cut = deliveries::timed_key(dim, stuck_before, "");
        k.stuck = d
            .range(lo.as_slice()..cut.as_slice())
            .map_err(StorageError::of)?
            .count() as u64;
    }
    if let Some(p) = t.pending
        && let Some(first) = p
            .range(lo.as_slice()..hi.as_slice())
            .map_err(StorageError::of)?
            .next()
    {
        let (key, _) = first.map_err(StorageError::of)?;
        let key = key.value();
        let at = &key[dim.len() + 1..dim.len() + 9];
        let created = u64::from_be_bytes(at.try_into().expect("8 bytes")) as i64;
        k.oldest_pending_age_s = (now_us - created).max(0) as f64 / 1e6;
    }
    if let Some(s) = t.sent {
        let cut = deliveries::timed_key(dim, sent_since, "");
        k.sent_last_interval = s
            .range(cut.as_slice()..hi.as_slice())
            .map_err(StorageError::of)?
            .count() as u64;
    }
    Ok(())
}

/// KPIs per source site (`by_source_site`, section 5), from the per-site indexes; times are
/// judged at `now_us`. Deliveries of notifications without a site are not in it.
pub fn kpis_by_site(
    db: &redb::Database,
    now_us: i64,
    stuck_after_ms: u64,
    interval_ms: u64,
) -> Result<std::collections::BTreeMap<String, Kpis>, StorageError> {
    let r = Reader::new(db)?;
    let mut out: std::collections::BTreeMap<String, Kpis> = Default::default();
    let Some(status) = r.table(deliveries::NAME, deliveries::SITE_STATUS)? else {
        return Ok(out);
    };
    for row in status.iter().map_err(StorageError::of)? {
        let (k, _) = row.map_err(StorageError::of)?;
        let mut parts = k.value().splitn(3, |b| *b == 0);
        let (Some(site), Some(st)) = (parts.next(), parts.next()) else {
            continue;
        };
        out.entry(String::from_utf8_lossy(site).into_owned())
            .or_default()
            .count(st, 1);
    }
    let pending = r.table(deliveries::NAME, deliveries::SITE_PENDING)?;
    let due = r.table(deliveries::NAME, deliveries::SITE_DUE)?;
    let sent = r.table(deliveries::NAME, deliveries::SITE_SENT)?;
    let stuck_before = now_us.saturating_sub(stuck_after_ms as i64 * 1_000);
    let sent_since = now_us.saturating_sub(interval_ms as i64 * 1_000);
    for (site, k) in &mut out {
        timed_kpis(
            k,
            site,
            Timed {
                pending: pending.as_ref(),
                due: due.as_ref(),
                sent: sent.as_ref(),
            },
            stuck_before,
            sent_since,
            now_us,
        )?;
    }
    Ok(out)
}

/// Pending deliveries (queued + leased + retry_wait) over all sinks: the backpressure gauge.
pub fn pending_deliveries(db: &redb::Database) -> Result<u64, StorageError> {
    let r = Reader::new(db)?;
    match r.table(deliveries::NAME, deliveries::COUNTS)? {
        Some(t) => deliveries::count_pending(&t),
        None => Ok(0),
    }
}

/// When the first of the held leases expires (µs since the epoch); `None` when no delivery is
/// leased.
pub fn earliest_lease_expiry(db: &redb::Database) -> Result<Option<i64>, StorageError> {
    let r = Reader::new(db)?;
    let Some(t) = r.table(deliveries::NAME, deliveries::LEASES)? else {
        return Ok(None);
    };
    let first = t.first().map_err(StorageError::of)?;
    Ok(first.and_then(|(k, _)| be_u64(k.value().get(..8)?).map(|us| us as i64)))
}

/// When the first delivery of `sink` falls due (µs since the epoch; in the past when one is
/// due now); `None` when none waits.
pub fn earliest_due(db: &redb::Database, sink: &str) -> Result<Option<i64>, StorageError> {
    let r = Reader::new(db)?;
    match r.table(deliveries::NAME, deliveries::DUE)? {
        Some(t) => deliveries::first_due(&t, sink),
        None => Ok(None),
    }
}

/// Highest source seq the delivery routing has handled.
pub fn routing_checkpoint(db: &redb::Database) -> Result<u64, StorageError> {
    stored_u64(
        db,
        deliveries::NAME,
        deliveries::STATE,
        deliveries::ROUTED_KEY,
    )
}

/// One cursor, or its zero state.
pub fn cursor(
    db: &redb::Database,
    consumer_id: &str,
    stream_name: &str,
    subject_id: &str,
) -> Result<crate::cursors::Cursor, StorageError> {
    use crate::cursors;
    Ok(Reader::new(db)?
        .get_val(
            cursors::NAME,
            cursors::ROWS,
            &cursors::key(consumer_id, stream_name, subject_id),
        )?
        .unwrap_or_else(|| cursors::Cursor::zero(consumer_id, stream_name, subject_id)))
}

/// Cursors whose key starts with `consumer_id` (all of that consumer's), or every cursor
/// when `None`; at most `limit`, after the key `after` (paging).
pub fn cursors(
    db: &redb::Database,
    consumer_id: Option<&str>,
    limit: usize,
) -> Result<Vec<crate::cursors::Cursor>, StorageError> {
    use crate::cursors;
    let r = Reader::new(db)?;
    let Some(t) = r.table(cursors::NAME, cursors::ROWS)? else {
        return Ok(Vec::new());
    };
    let (from, to) = match consumer_id {
        Some(c) => {
            let mut from = c.as_bytes().to_vec();
            from.push(0);
            let mut to = c.as_bytes().to_vec();
            to.push(1);
            (from, Some(to))
        }
        None => (Vec::new(), None),
    };
    let mut out = Vec::new();
    let range = match &to {
        Some(to) => t.range(from.as_slice()..to.as_slice()),
        None => t.range(from.as_slice()..),
    }
    .map_err(StorageError::of)?;
    for row in range {
        let (_, v) = row.map_err(StorageError::of)?;
        out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// A subscription (active or deleted).
pub fn subscription(
    db: &redb::Database,
    id: &SubscriptionId,
) -> Result<Option<crate::bridges::Subscription>, StorageError> {
    use crate::bridges;
    Reader::new(db)?.get_val(bridges::NAME, bridges::ROWS, id.as_bytes())
}

/// The keys `prefix ‖ 0 ‖ …` of an index or timeline lie in `prefix ‖ 0 .. prefix ‖ 1`.
fn under(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    let bound = |b: u8| {
        let mut k = Vec::with_capacity(prefix.len() + 1);
        k.extend_from_slice(prefix.as_bytes());
        k.push(b);
        k
    };
    (bound(0), bound(1))
}

/// Active subscriptions whose index key starts with `prefix ‖ 0` in `index` (`by_task`,
/// `by_bridge`) for any of `prefixes`, or every active one when `prefixes` is `None`; one read
/// transaction for all of them (the bridge notifier asks for every task of a commit at once).
fn active_subscriptions(
    db: &redb::Database,
    index: &'static str,
    prefixes: Option<&[&str]>,
) -> Result<Vec<crate::bridges::Subscription>, StorageError> {
    use crate::bridges;
    let r = Reader::new(db)?;
    let (Some(idx), Some(rows)) = (
        r.table(bridges::NAME, index)?,
        r.table(bridges::NAME, bridges::ROWS)?,
    ) else {
        return Ok(Vec::new());
    };
    let mut ids = Vec::new();
    match prefixes {
        Some(prefixes) => {
            if redb::ReadableTableMetadata::is_empty(&idx).map_err(StorageError::of)? {
                return Ok(Vec::new());
            }
            for p in prefixes {
                let (from, to) = under(p);
                for row in idx
                    .range(from.as_slice()..to.as_slice())
                    .map_err(StorageError::of)?
                {
                    let (k, _) = row.map_err(StorageError::of)?;
                    ids.push(k.value()[from.len()..].to_vec());
                }
            }
        }
        None => {
            for row in idx.iter().map_err(StorageError::of)? {
                let (k, _) = row.map_err(StorageError::of)?;
                ids.push(k.value().to_vec());
            }
        }
    }
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(v) = rows.get(id.as_slice()).map_err(StorageError::of)? {
            out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        }
    }
    Ok(out)
}

/// The active subscriptions of these tasks.
pub fn task_subscriptions(
    db: &redb::Database,
    task_ids: &[&str],
) -> Result<Vec<crate::bridges::Subscription>, StorageError> {
    active_subscriptions(db, crate::bridges::BY_TASK, Some(task_ids))
}

pub fn bridge_subscriptions(
    db: &redb::Database,
    bridge_id: &BridgeId,
) -> Result<Vec<crate::bridges::Subscription>, StorageError> {
    active_subscriptions(db, crate::bridges::BY_BRIDGE, Some(&[bridge_id.as_str()]))
}

pub fn all_active_subscriptions(
    db: &redb::Database,
) -> Result<Vec<crate::bridges::Subscription>, StorageError> {
    active_subscriptions(db, crate::bridges::ACTIVE, None)
}
