//! The deliveries model's queries that take a filter or span the settings: the paged list
//! ([`View::page`]), the endpoints in force, and the types they answer with (the KPIs). The
//! keys they read are this folder's; the rest of the view is `view.rs`.

use serde::Serialize;
use tidemark_log::StorageError;

use crate::deliveries::{self, Delivery, View};
use crate::framework::paged::{ListOrder, Order, Page, Position, Walk, paged};
use crate::names::{DeliveryStatus, Sink, sink_or_none};

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

impl View<'_> {
    /// Deliveries ordered by id or newest first, filtered.
    pub fn page(&self, f: &DeliveryFilter) -> Result<Page<Delivery>, StorageError> {
        let limit = f.limit.max(1);
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
        paged(&self.t, deliveries::ROWS, walk, limit, keep)
    }
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
    pub(super) fn count(&mut self, status: &[u8], n: u64) {
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

    /// Add `k`'s counts (the oldest pending age is the older of the two).
    pub fn add(&mut self, k: &Kpis) {
        self.queue_depth += k.queue_depth;
        self.queued += k.queued;
        self.leased += k.leased;
        self.retry_wait += k.retry_wait;
        self.stuck += k.stuck;
        self.parked += k.parked;
        self.sent_last_interval += k.sent_last_interval;
        self.oldest_pending_age_s = self.oldest_pending_age_s.max(k.oldest_pending_age_s);
    }
}

impl View<'_> {
    /// Every endpoint as it stands, with its circuit's policy: each delivering route of the
    /// settings in force (a record with no attempt for one that has none) and the records of
    /// routes no longer configured (their deliveries are still tried), by route; then each active
    /// bridge webhook subscription's (`bridge:<id>`).
    pub fn endpoints_in_force(
        &self,
    ) -> Result<Vec<(crate::endpoints::Endpoint, crate::endpoints::CircuitPolicy)>, StorageError>
    {
        let settings = self.settings_in_force()?;
        let mut held: std::collections::BTreeMap<String, crate::endpoints::Endpoint> = self
            .endpoints()?
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
            crate::bridges::View::over(self.t.src(), self.t.tenant())?
                .endpoints()?
                .into_iter()
                .map(|e| (e, settings.circuit)),
        );
        Ok(out)
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
