//! The deliveries model seen from inside a models transaction: what the commands decide from
//! (claim, expiry, completion, routing, admission, retention) and what the queries answer
//! (over [`crate::framework::ModelsRead::snapshot`]), asked for by what it means — a row and its
//! timeline, the due deliveries of a sink at a priority, the leases expired by a time, the
//! deliveries of a notification or a task, a recipient, the settings in force, the outbox's
//! KPIs. The keys are this folder's: the fold writes them and this view reads them; no caller
//! builds or parses one. The paged list and the endpoints in force are its methods too, in
//! `read.rs` beside the filters they take.

use tidemark_log::StorageError;

use super::read::Kpis;
use super::{
    BY_NOTIFICATION, BY_TASK, CANCELED, COUNTS, DUE, DUE_BY_PRIORITY, Delivery, ENDPOINTS, GROUPS,
    Group, LEASES, NAME, NOTIFICATIONS_CANCELED, PENDING, RECIPIENTS, ROUTE_DUE, ROUTED_KEY, ROWS,
    Recipient, SENT, SETTINGS, SITE_DUE, SITE_PENDING, SITE_SENT, SITE_STATUS, STATE, Step,
    TIMELINE, count_pending, group_key, timed_key, us_key,
};
use crate::endpoints::Endpoint;
use crate::framework::{be_u64, under};
use crate::names::Sink;
use crate::routing::RoutingSettings;

crate::framework::txn_view! {
    /// The deliveries model inside one models transaction (each table opened once).
    NAME
}

/// Where a page of [`View::due`] ended: the next page starts after it.
#[derive(Debug, Clone)]
pub struct DueAfter(Vec<u8>);

fn of(e: impl std::error::Error + Send + Sync + 'static) -> StorageError {
    StorageError::of(e)
}

impl View<'_> {
    /// Delivery `id`'s row.
    pub fn row(&self, id: &str) -> Result<Option<Delivery>, StorageError> {
        self.t.get_row(ROWS, id.as_bytes())
    }

    /// The ids of the claimable deliveries of `sink` at priority `rank`
    /// ([`super::priority_rank`]) due by `now_us` — queued and retry_wait rows by their next
    /// attempt, leased rows by their lease's expiry — oldest due first, after `after` (the
    /// previous page's end), at most `max`; and where this page ended (`None` when it is
    /// empty).
    pub fn due(
        &self,
        sink: Sink,
        rank: u8,
        now_us: i64,
        after: Option<&DueAfter>,
        max: usize,
    ) -> Result<(Vec<String>, Option<DueAfter>), StorageError> {
        let mut prefix = sink.as_str().as_bytes().to_vec();
        prefix.push(0);
        prefix.push(rank);
        let mut to = prefix.clone();
        to.extend_from_slice(&us_key(now_us.saturating_add(1)));
        let from = match after {
            Some(DueAfter(k)) => [k.as_slice(), &[0]].concat(),
            None => prefix.clone(),
        };
        // `prefix ‖ due_us (8) ‖ id`.
        let id_at = prefix.len() + 8;
        let mut ids = Vec::new();
        // The page's last key, rewritten in place (one buffer for the page, not one per key).
        let mut last = Vec::new();
        if from < to && max > 0 {
            for row in self
                .t
                .table(DUE_BY_PRIORITY)?
                .range(from.as_slice()..to.as_slice())?
            {
                let (k, _) = row.map_err(of)?;
                let k = k.value();
                ids.push(String::from_utf8_lossy(&k[id_at..]).into_owned());
                last.clear();
                last.extend_from_slice(k);
                if ids.len() >= max {
                    break;
                }
            }
        }
        Ok((ids, (!last.is_empty()).then_some(DueAfter(last))))
    }

    /// The ids of leased deliveries whose lease expired by `now_us`, the earliest first, at
    /// most `max`.
    pub fn leases_expired(&self, now_us: i64, max: usize) -> Result<Vec<String>, StorageError> {
        // `lease_expires_us (8) ‖ id`.
        let to = us_key(now_us.saturating_add(1));
        let mut ids = Vec::new();
        for row in self.t.table(LEASES)?.range(..to.as_slice())? {
            if ids.len() >= max {
                break;
            }
            let (k, _) = row.map_err(of)?;
            ids.push(String::from_utf8_lossy(&k.value()[8..]).into_owned());
        }
        Ok(ids)
    }

    /// The ids of the deliveries carrying notification `nid` (a digest carries several).
    pub fn of_notification(&self, nid: &str) -> Result<Vec<String>, StorageError> {
        self.t.suffixes(BY_NOTIFICATION, nid)
    }

    /// The ids of the deliveries of task `task`.
    pub fn of_task(&self, task: &str) -> Result<Vec<String>, StorageError> {
        self.t.suffixes(BY_TASK, task)
    }

    /// The parked deliveries of `route` made at or after `since_us`, at most `max` (by id;
    /// read from the parked ones, which an operator keeps few).
    pub fn parked_of_route(
        &self,
        route: &str,
        since_us: i64,
        max: usize,
    ) -> Result<Vec<Delivery>, StorageError> {
        let mut out = Vec::new();
        for id in self.t.suffixes(
            super::BY_STATUS,
            crate::names::DeliveryStatus::Parked.as_str(),
        )? {
            if out.len() >= max {
                break;
            }
            if let Some(d) = self.row(&id)?
                && d.route == route
                && d.created_at_us >= since_us
            {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// The health and circuit of delivering route `route` (`None`: no attempt or switch yet).
    pub fn endpoint(&self, route: &str) -> Result<Option<Endpoint>, StorageError> {
        self.t.get_val(ENDPOINTS, route.as_bytes())
    }

    /// Every delivering route's health and circuit that has one (an attempt or a switch), by
    /// route.
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, StorageError> {
        self.t.values(ENDPOINTS)
    }

    /// The open circuits of `sink`'s routes whose next probe may go out by `now_us` (none
    /// is disabled).
    pub fn probes_due(&self, sink: Sink, now_us: i64) -> Result<Vec<Endpoint>, StorageError> {
        let mut out = self.endpoints()?;
        out.retain(|e| e.sink == Some(sink) && e.probe_at().is_some_and(|at| at <= now_us));
        Ok(out)
    }

    /// Delivery `id`'s attempt timeline, oldest step first.
    pub fn timeline(&self, id: &str) -> Result<Vec<Step>, StorageError> {
        let (lo, hi) = under(id);
        let mut steps = Vec::new();
        for row in self
            .t
            .table(TIMELINE)?
            .range(lo.as_slice()..hi.as_slice())?
        {
            let (_, v) = row.map_err(of)?;
            steps.push(postcard::from_bytes(v.value()).map_err(of)?);
        }
        Ok(steps)
    }

    /// The deliveries of the notification whose id (or intent key, on redacting routes) is
    /// each of `keys`, by id, at most `max` per key.
    pub fn rows_of_notification(
        &self,
        keys: &[&str],
        max: usize,
    ) -> Result<Vec<Delivery>, StorageError> {
        let mut found = Vec::new();
        for key in keys {
            for id in self.of_notification(key)?.into_iter().take(max) {
                found.extend(self.row(&id)?);
            }
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }

    /// When the first of the held leases expires (µs since the epoch); `None` when no
    /// delivery is leased.
    pub fn first_lease_expiry(&self) -> Result<Option<i64>, StorageError> {
        let Some(row) = self.t.table(LEASES)?.iter()?.next() else {
            return Ok(None);
        };
        let (k, _) = row.map_err(of)?;
        Ok(be_u64(k.value().get(..8).unwrap_or_default()).map(|us| us as i64))
    }

    /// When the first delivery of `sink` falls due (µs since the epoch; in the past when one
    /// is due now); `None` when none waits. A held route's deliveries are not in [`DUE`]: an
    /// open circuit's next probe is due at its probe time, when one of them waits.
    pub fn earliest_due(&self, sink: Sink) -> Result<Option<i64>, StorageError> {
        let mut first = self.first_timed(DUE, sink.as_str())?;
        for e in self.endpoints()? {
            let Some(probe_at) = e.probe_at().filter(|_| e.sink == Some(sink)) else {
                continue;
            };
            if let Some(due) = self.first_timed(ROUTE_DUE, &e.route)? {
                let at = probe_at.max(due);
                first = Some(first.map_or(at, |f| f.min(at)));
            }
        }
        Ok(first)
    }

    /// The time of the first entry of `prefix` in a `prefix ‖ 0 ‖ time ‖ id` index.
    fn first_timed(&self, table: &'static str, prefix: &str) -> Result<Option<i64>, StorageError> {
        let from = timed_key(prefix, 0, "");
        let (_, to) = under(prefix);
        let Some(row) = self
            .t
            .table(table)?
            .range(from.as_slice()..to.as_slice())?
            .next()
        else {
            return Ok(None);
        };
        let (k, _) = row.map_err(of)?;
        let at = prefix.len() + 1;
        Ok(k.value()
            .get(at..at + 8)
            .and_then(be_u64)
            .map(|us| us as i64))
    }

    /// The outbox's KPIs over all sinks and per sink (spec section 5); times are judged at
    /// `now_us` (a query may read the clock; folds never).
    pub fn kpis(
        &self,
        now_us: i64,
        stuck_after_ms: u64,
        interval_ms: u64,
    ) -> Result<(Kpis, std::collections::BTreeMap<String, Kpis>), StorageError> {
        let mut by_sink: std::collections::BTreeMap<String, Kpis> = Default::default();
        for row in self.t.table(COUNTS)?.iter()? {
            let (k, v) = row.map_err(of)?;
            let k = k.value();
            let Some(split) = k.iter().position(|b| *b == 0) else {
                continue;
            };
            let sink = String::from_utf8_lossy(&k[..split]).into_owned();
            let n = be_u64(v.value()).unwrap_or(0);
            by_sink.entry(sink).or_default().count(&k[split + 1..], n);
        }
        let when = Judged::at(now_us, stuck_after_ms, interval_ms);
        for (sink, k) in &mut by_sink {
            self.timed_kpis(k, sink, [PENDING, DUE, SENT], when)?;
        }
        let mut all = Kpis::default();
        for k in by_sink.values() {
            all.add(k);
        }
        Ok((all, by_sink))
    }

    /// KPIs per source site (`by_source_site`, section 5), from the per-site indexes.
    /// Deliveries of notifications without a site are not in it.
    pub fn kpis_by_site(
        &self,
        now_us: i64,
        stuck_after_ms: u64,
        interval_ms: u64,
    ) -> Result<std::collections::BTreeMap<String, Kpis>, StorageError> {
        let mut out: std::collections::BTreeMap<String, Kpis> = Default::default();
        for row in self.t.table(SITE_STATUS)?.iter()? {
            let (k, _) = row.map_err(of)?;
            let mut parts = k.value().splitn(3, |b| *b == 0);
            let (Some(site), Some(st)) = (parts.next(), parts.next()) else {
                continue;
            };
            out.entry(String::from_utf8_lossy(site).into_owned())
                .or_default()
                .count(st, 1);
        }
        let when = Judged::at(now_us, stuck_after_ms, interval_ms);
        for (site, k) in &mut out {
            self.timed_kpis(k, site, [SITE_PENDING, SITE_DUE, SITE_SENT], when)?;
        }
        Ok(out)
    }

    /// The KPIs of one sink or site `dim` read from its `dim ‖ 0 ‖ time ‖ id` indexes
    /// (`[pending by creation, claimable by due time, sent by delivery]`): queue depth,
    /// stuck, oldest pending age, sent in the interval.
    fn timed_kpis(
        &self,
        k: &mut Kpis,
        dim: &str,
        [pending, due, sent]: [&'static str; 3],
        when: Judged,
    ) -> Result<(), StorageError> {
        k.queue_depth = k.queued + k.leased + k.retry_wait;
        let lo = timed_key(dim, 0, "");
        let hi = timed_key(dim, i64::MAX, "");
        let cut = timed_key(dim, when.stuck_before, "");
        k.stuck = self
            .t
            .table(due)?
            .range(lo.as_slice()..cut.as_slice())?
            .count() as u64;
        if let Some(created) = self.first_timed(pending, dim)? {
            k.oldest_pending_age_s = (when.now_us - created).max(0) as f64 / 1e6;
        }
        let cut = timed_key(dim, when.sent_since, "");
        k.sent_last_interval = self
            .t
            .table(sent)?
            .range(cut.as_slice()..hi.as_slice())?
            .count() as u64;
        Ok(())
    }

    /// The id of the delivery of `route` to `sink` due first, if one is due by `now_us` (held
    /// or not; a route whose sink changed may have rows of the other sink, passed over).
    pub fn first_due_of_route(
        &self,
        route: &str,
        sink: Sink,
        now_us: i64,
    ) -> Result<Option<String>, StorageError> {
        let from = timed_key(route, 0, "");
        let to = timed_key(route, now_us.saturating_add(1), "");
        let ids: Vec<String> = self
            .t
            .table(ROUTE_DUE)?
            .range(from.as_slice()..to.as_slice())?
            // A route changes sink rarely: the first rows are this sink's, or few are not.
            .take(64)
            .map(|row| {
                row.map(|(k, _)| String::from_utf8_lossy(&k.value()[from.len()..]).into_owned())
                    .map_err(of)
            })
            .collect::<Result<_, _>>()?;
        for id in ids {
            if let Some(r) = self.row(&id)?
                && r.sink == Some(sink)
                && self.order_waits(&r)?.is_none()
            {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// The delivery `d` waits for in its route's order (section 4): the first of its key,
    /// when that is not `d`.
    pub fn order_waits(&self, d: &Delivery) -> Result<Option<String>, StorageError> {
        let Some(key) = d.holds_order_key() else {
            return Ok(None);
        };
        Ok(self
            .order_first(&d.route, key)?
            .filter(|first| first != d.id.as_str()))
    }

    /// The first delivery of `route`'s key `key` in its order (section 4): the one that may
    /// be in flight; the others of the key wait for it.
    pub fn order_first(&self, route: &str, key: &str) -> Result<Option<String>, StorageError> {
        let prefix = super::order_prefix(route, key);
        let t = self.t.table(super::ORDER)?;
        let mut range = t.range(prefix.as_slice()..)?;
        let Some(row) = range.next() else {
            return Ok(None);
        };
        let (k, _) = row.map_err(of)?;
        Ok(super::order_entry_id(&prefix, k.value()))
    }

    /// Recipient `r`'s state (the defaults for none, or one without state).
    pub fn recipient(&self, r: Option<&str>) -> Result<Recipient, StorageError> {
        let Some(r) = r else {
            return Ok(Recipient::default());
        };
        Ok(self
            .t
            .get_val(RECIPIENTS, r.as_bytes())?
            .unwrap_or_default())
    }

    /// The state of the first recipient whose name `matches` (one pass over the recipients
    /// with state: a redacted row names its recipient by a keyed hash only).
    pub fn find_recipient(
        &self,
        matches: impl Fn(&str) -> bool,
    ) -> Result<Option<Recipient>, StorageError> {
        for entry in self.t.table(RECIPIENTS)?.iter()? {
            let (k, v) = entry.map_err(of)?;
            if matches(&String::from_utf8_lossy(k.value())) {
                return postcard::from_bytes(v.value()).map(Some).map_err(of);
            }
        }
        Ok(None)
    }

    /// A `notification.canceled` for `id` has been folded.
    pub fn notification_canceled(&self, id: &str) -> Result<bool, StorageError> {
        Ok(self.t.get(NOTIFICATIONS_CANCELED, id.as_bytes())?.is_some())
    }

    /// The seq of task `task`'s first `task.canceled`, if it was canceled.
    pub fn task_canceled_at(&self, task: &str) -> Result<Option<u64>, StorageError> {
        Ok(self
            .t
            .get(CANCELED, task.as_bytes())?
            .and_then(|b| be_u64(&b)))
    }

    /// The open digest of `route`, `recipient` and `group`, if any.
    pub fn open_group(
        &self,
        route: &str,
        recipient: &str,
        group: &str,
    ) -> Result<Option<Group>, StorageError> {
        self.t.get_val(GROUPS, &group_key(route, recipient, group))
    }

    /// The seq of the last notification or cancellation routing has handled.
    pub fn routed(&self) -> Result<u64, StorageError> {
        Ok(self
            .t
            .get(STATE, ROUTED_KEY)?
            .and_then(|b| be_u64(&b))
            .unwrap_or(0))
    }

    /// The routing settings in force at the head: the file's, with the routes managed at
    /// runtime.
    pub fn settings_in_force(&self) -> Result<RoutingSettings, StorageError> {
        self.settings_at(u64::MAX)
    }

    /// The settings in force at `seq` (the last `settings.updated` at or before it).
    pub fn settings_at(&self, seq: u64) -> Result<RoutingSettings, StorageError> {
        let t = self.t.table(SETTINGS)?;
        let mut range = t.range(..=seq.to_be_bytes().as_slice())?;
        let Some(row) = range.next_back() else {
            return Ok(RoutingSettings::default());
        };
        let (_, v) = row.map_err(of)?;
        let json: serde_json::Value = serde_json::from_slice(v.value()).map_err(of)?;
        // The server validated the settings before recording them.
        Ok(RoutingSettings::from_json(&json).unwrap_or_default())
    }

    /// Pending deliveries (queued, leased, retry_wait) over all sinks.
    pub fn pending(&self) -> Result<u64, StorageError> {
        count_pending(self.t.table(COUNTS)?.iter()?)
    }

    /// Deliveries sent at or after `since_us` over all sinks (the outbox's drain rate).
    pub fn sent_since(&self, since_us: i64) -> Result<u64, StorageError> {
        // The sinks are the first part of the counts' keys, `sink ‖ 0 ‖ status`.
        let mut sinks: Vec<Vec<u8>> = Vec::new();
        for row in self.t.table(COUNTS)?.iter()? {
            let (k, _) = row.map_err(of)?;
            let k = k.value();
            if let Some(split) = k.iter().position(|b| *b == 0)
                && sinks.last().is_none_or(|s| s.as_slice() != &k[..split])
            {
                sinks.push(k[..split].to_vec());
            }
        }
        let sent = self.t.table(SENT)?;
        let mut n = 0;
        for sink in sinks {
            let sink = String::from_utf8_lossy(&sink);
            let lo = timed_key(&sink, since_us, "");
            let hi = timed_key(&sink, i64::MAX, "");
            n += sent.range(lo.as_slice()..hi.as_slice())?.count() as u64;
        }
        Ok(n)
    }
}

/// When a KPI query judges: now, and the cuts `stuck_after` and the interval make.
#[derive(Clone, Copy)]
struct Judged {
    now_us: i64,
    stuck_before: i64,
    sent_since: i64,
}

impl Judged {
    fn at(now_us: i64, stuck_after_ms: u64, interval_ms: u64) -> Judged {
        Judged {
            now_us,
            stuck_before: now_us.saturating_sub(stuck_after_ms as i64 * 1_000),
            sent_since: now_us.saturating_sub(interval_ms as i64 * 1_000),
        }
    }
}
