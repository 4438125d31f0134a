//! The deliveries model's queries (served from [`crate::read`]): a delivery with its
//! timeline, the list, the deliveries of a notification, the outbox's KPIs and the
//! dispatcher's wake-up times. The keys they read are this folder's.

use serde::Serialize;
use tidemark_log::StorageError;

use redb::ReadableTable;

use crate::deliveries::{self, Delivery};
use crate::framework::{Reader, Row, be_u64};
use crate::ids::DeliveryId;
use crate::names::{DeliveryStatus, Sink, sink_or_none};
use crate::read::paged::{ListOrder, Order, Page, Position, Table, Walk, paged};
use crate::read::{stored_u64, under};

/// A delivery and its attempt timeline, oldest step first.
pub fn delivery(
    db: &crate::models::ModelsRead,
    id: &DeliveryId,
) -> Result<Option<(Delivery, Vec<deliveries::Step>)>, StorageError> {
    let id = id.as_str();
    let r = Reader::new(db)?;
    let Some(row) = r.get_row::<Delivery>(deliveries::NAME, deliveries::ROWS, id.as_bytes())?
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
    pub status: Option<DeliveryStatus>,
    /// `Some(None)`: the deliveries no sink takes (skipped).
    pub sink: Option<Option<Sink>>,
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
pub fn deliveries(
    db: &crate::models::ModelsRead,
    f: &DeliveryFilter,
) -> Result<Page<Delivery>, StorageError> {
    let r = Reader::new(db)?;
    let limit = f.limit.max(1);
    let Some(rows) = r.table(deliveries::NAME, deliveries::ROWS)? else {
        return Ok((Vec::new(), None));
    };
    let keep = |d: &Delivery| {
        f.sink.is_none_or(|s| s == d.sink)
            && f.route.as_deref().is_none_or(|s| s == d.route)
            && f.status.is_none_or(|s| s == d.status)
            && f.recipient
                .as_deref()
                .is_none_or(|s| d.recipient.as_deref() == Some(s))
            && f.notification_id
                .as_deref()
                .is_none_or(|n| d.all_items().any(|i| i.notification_id == n))
            && f.source_site
                .as_deref()
                .is_none_or(|s| d.source_site.as_deref() == Some(s))
            && f.ntype
                .as_deref()
                .is_none_or(|t| d.ntype.as_deref() == Some(t))
            && f.list
                .as_deref()
                .is_none_or(|l| d.list.as_deref() == Some(l))
            && f.keeps_unindexed(d)
            && f.after.as_deref().is_none_or(|a| d.id.as_str() > a)
            && f.before
                .as_ref()
                .is_none_or(|b| b.follows(deliveries::created_key(d), d.id.as_str()))
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
                (deliveries::BY_STATUS, f.status.map(DeliveryStatus::as_str)),
                (deliveries::BY_SINK, f.sink.map(sink_or_none::name)),
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
    /// Count `n` deliveries in `status` (as a key stores it).
    fn count(&mut self, status: &[u8], n: u64) {
        use DeliveryStatus as S;
        let status = std::str::from_utf8(status).ok().and_then(S::parse);
        match status {
            Some(S::Queued) => self.queued += n,
            Some(S::Leased) => self.leased += n,
            Some(S::RetryWait) => self.retry_wait += n,
            Some(S::Parked) => self.parked += n,
            Some(S::Sent | S::Discarded | S::Skipped | S::Cancelled) | None => {}
        }
    }
}

/// Per sink and overall; times are judged at `now_us` (reads may use the clock; folds never).
pub fn kpis(
    db: &crate::models::ModelsRead,
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
    db: &crate::models::ModelsRead,
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
pub fn pending_deliveries(db: &crate::models::ModelsRead) -> Result<u64, StorageError> {
    let r = Reader::new(db)?;
    match r.table(deliveries::NAME, deliveries::COUNTS)? {
        Some(t) => deliveries::count_pending(t.iter().map_err(StorageError::of)?),
        None => Ok(0),
    }
}

/// When the first of the held leases expires (µs since the epoch); `None` when no delivery is
/// leased.
pub fn earliest_lease_expiry(db: &crate::models::ModelsRead) -> Result<Option<i64>, StorageError> {
    let r = Reader::new(db)?;
    let Some(t) = r.table(deliveries::NAME, deliveries::LEASES)? else {
        return Ok(None);
    };
    let first = t.first().map_err(StorageError::of)?;
    Ok(first.and_then(|(k, _)| be_u64(k.value().get(..8)?).map(|us| us as i64)))
}

/// When the first delivery of `sink` falls due (µs since the epoch; in the past when one is
/// due now); `None` when none waits.
pub fn earliest_due(
    db: &crate::models::ModelsRead,
    sink: Sink,
) -> Result<Option<i64>, StorageError> {
    let r = Reader::new(db)?;
    let mut first = match r.table(deliveries::NAME, deliveries::DUE)? {
        Some(t) => deliveries::first_due(&t, sink.as_str())?,
        None => None,
    };
    // A held route's deliveries are not in `due`: an open circuit's next probe is due at its
    // probe time, when one of them waits.
    let (Some(eps), Some(route_due)) = (
        r.table(deliveries::NAME, deliveries::ENDPOINTS)?,
        r.table(deliveries::NAME, deliveries::ROUTE_DUE)?,
    ) else {
        return Ok(first);
    };
    for e in endpoints_in(&eps)? {
        let Some(probe_at) = e.probe_at().filter(|_| e.sink == Some(sink)) else {
            continue;
        };
        if let Some(due) = deliveries::first_due(&route_due, &e.route)? {
            let at = probe_at.max(due);
            first = Some(first.map_or(at, |f| f.min(at)));
        }
    }
    Ok(first)
}

/// Every delivering route's health and circuit that has one (an attempt or a switch), by
/// route.
pub fn endpoints(
    db: &crate::models::ModelsRead,
) -> Result<Vec<crate::endpoints::Endpoint>, StorageError> {
    let r = Reader::new(db)?;
    match r.table(deliveries::NAME, deliveries::ENDPOINTS)? {
        Some(t) => endpoints_in(&t),
        None => Ok(Vec::new()),
    }
}

/// The routing settings in force at the head: the file's, with the routes managed at runtime.
pub fn settings_in_force(
    db: &crate::models::ModelsRead,
) -> Result<crate::routing::RoutingSettings, StorageError> {
    let r = Reader::new(db)?;
    Ok(match r.table(deliveries::NAME, deliveries::SETTINGS)? {
        Some(t) => match t.last().map_err(StorageError::of)? {
            Some((_, v)) => serde_json::from_slice::<serde_json::Value>(v.value())
                .ok()
                .and_then(|j| crate::routing::RoutingSettings::from_json(&j).ok())
                .unwrap_or_default(),
            None => Default::default(),
        },
        None => Default::default(),
    })
}

/// Every endpoint as it stands, with its circuit's policy: each delivering route of the
/// settings in force (a record with no attempt for one that has none) and the records of
/// routes no longer configured (their deliveries are still tried), by route; then each active
/// bridge webhook subscription's (`bridge:<id>`).
pub fn endpoints_in_force(
    db: &crate::models::ModelsRead,
) -> Result<Vec<(crate::endpoints::Endpoint, crate::routing::CircuitPolicy)>, StorageError> {
    let settings = settings_in_force(db)?;
    let mut held: std::collections::BTreeMap<String, crate::endpoints::Endpoint> = endpoints(db)?
        .into_iter()
        .map(|e| (e.route.clone(), e))
        .collect();
    for (name, p) in &settings.routes {
        if crate::endpoints::delivering(p.sink) && !held.contains_key(name) {
            held.insert(name.clone(), crate::endpoints::Endpoint::new(name, p.sink));
        }
    }
    let mut out: Vec<_> = held
        .into_values()
        .map(|e| {
            let policy = settings
                .routes
                .get(&e.route)
                .map_or(settings.circuit, |p| p.circuit);
            (e, policy)
        })
        .collect();
    // The bridge webhook subscriptions' endpoints, under `[notifications.circuit]`.
    out.extend(
        crate::bridges::read::bridge_endpoints(db)?
            .into_iter()
            .map(|e| (e, settings.circuit)),
    );
    Ok(out)
}

/// The first delivery of `route`'s key `key` in its order (section 4): the one that may be
/// in flight; the others of the key wait for it.
pub fn order_first(
    db: &crate::models::ModelsRead,
    route: &str,
    key: &str,
) -> Result<Option<String>, StorageError> {
    let r = Reader::new(db)?;
    let Some(t) = r.table(deliveries::NAME, deliveries::ORDER)? else {
        return Ok(None);
    };
    let prefix = deliveries::order_prefix(route, key);
    let mut range = t.range(prefix.as_slice()..).map_err(StorageError::of)?;
    let Some(row) = range.next() else {
        return Ok(None);
    };
    let (k, _) = row.map_err(StorageError::of)?;
    Ok(deliveries::order_entry_id(&prefix, k.value()))
}

/// Delivering route `route`'s health and circuit (`None`: no attempt or switch yet).
pub fn endpoint(
    db: &crate::models::ModelsRead,
    route: &str,
) -> Result<Option<crate::endpoints::Endpoint>, StorageError> {
    Reader::new(db)?.get_val(deliveries::NAME, deliveries::ENDPOINTS, route.as_bytes())
}

fn endpoints_in(
    t: &impl ReadableTable<&'static [u8], &'static [u8]>,
) -> Result<Vec<crate::endpoints::Endpoint>, StorageError> {
    let mut out = Vec::new();
    for row in t.iter().map_err(StorageError::of)? {
        let (_, v) = row.map_err(StorageError::of)?;
        out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
    }
    Ok(out)
}

/// Highest source seq the delivery routing has handled.
pub fn routing_checkpoint(db: &crate::models::ModelsRead) -> Result<u64, StorageError> {
    stored_u64(
        db,
        deliveries::NAME,
        deliveries::STATE,
        deliveries::ROUTED_KEY,
    )
}

/// The deliveries of the notification whose id (or intent key, on redacting routes) is each
/// of `keys`, by id, at most `max` per key; and whether the notification `id` was canceled.
/// Read in `r`, the caller's read transaction.
pub(crate) fn of_notification(
    r: &Reader,
    keys: &[&str],
    id: &str,
    max: usize,
) -> Result<(Vec<Delivery>, bool), StorageError> {
    let mut found = Vec::new();
    if let (Some(index), Some(rows)) = (
        r.table(deliveries::NAME, deliveries::BY_NOTIFICATION)?,
        r.table(deliveries::NAME, deliveries::ROWS)?,
    ) {
        for key in keys {
            let (from, to) = under(key);
            for row in index
                .range(from.as_slice()..to.as_slice())
                .map_err(StorageError::of)?
            {
                let (k, _) = row.map_err(StorageError::of)?;
                let delivery_id = &k.value()[from.len()..];
                if let Some(v) = rows.get(delivery_id).map_err(StorageError::of)? {
                    found.push(Delivery::decode(v.value())?);
                }
                if found.len() >= max {
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
    Ok((found, canceled))
}
