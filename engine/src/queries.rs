//! The one reader of the read models: every query of the API and the reactors. Each method
//! answers from one read transaction (blocking: call it from a blocking context in async
//! code). The models follow the log (the decider folds each commit), so a query of a read model first waits —
//! at most [`READ_WAIT`] — until every model has folded the log up to the head as of the call
//! (spec section 7: a client reads its own writes), or answers [`QueryError::Lagging`]. The
//! admin listing, the lags and the non-waiting KPIs (for `/metrics`) never wait.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark_projections::ids::{BridgeId, DeliveryId, NotificationId, SubscriptionId, TaskId};

use tidemark_log::{AnyLog, EventLog, ReadPage, ReadQuery, StorageError};
use tidemark_projections::bridges::Subscription;
use tidemark_projections::cursors::Cursor;
use tidemark_projections::deliveries::read::{DeliveryFilter, Kpis};
use tidemark_projections::deliveries::{self, Delivery, Step};
use tidemark_projections::framework::paged::{ListOrder, Page, Position};
use tidemark_projections::models::{self, ProjectionInfo};
use tidemark_projections::names::{Sink, Stream};
use tidemark_projections::notifications::Notification;
use tidemark_projections::notifications::read::{
    NotificationFilter, NotificationStatus, NotificationsWithTaskSeq,
};
use tidemark_projections::tasks::Task;
use tidemark_projections::tasks::read::TaskFilter;
use tidemark_projections::{ModelsTxn, bridges, cursors, notifications, tasks};

type R<T> = Result<T, QueryError>;

/// How long a read waits for the models to reach the head before answering `Lagging`.
pub const READ_WAIT: Duration = Duration::from_secs(5);

/// Why a query has no answer.
#[derive(Debug, Clone)]
pub enum QueryError {
    /// The log's storage failed (I10).
    Log(StorageError),
    /// The read models' store failed: a fault domain of its own (I10), the log is not
    /// affected.
    Models(StorageError),
    /// The read models had not folded the log up to `want` after [`READ_WAIT`]; they were at
    /// `at`.
    Lagging { want: u64, at: u64 },
    /// The read position is before the first event the log holds (spec section 13).
    Compacted { first: u64 },
}

/// A query reads the read models: a storage failure met by `?` is theirs. The few reads of
/// the log here say [`QueryError::Log`] themselves.
impl From<StorageError> for QueryError {
    fn from(e: StorageError) -> Self {
        QueryError::Models(e)
    }
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryError::Log(e) => write!(f, "the log: {e}"),
            QueryError::Models(e) => write!(f, "the read models' store: {e}"),
            QueryError::Lagging { want, at } => write!(
                f,
                "the read models are at seq {at}, behind the {want} this read waits for"
            ),
            QueryError::Compacted { first } => {
                write!(f, "the log was compacted: it starts at seq {first}")
            }
        }
    }
}

impl std::error::Error for QueryError {}

/// For the reactors, which treat any failed read as a storage failure to retry.
impl From<QueryError> for StorageError {
    fn from(e: QueryError) -> Self {
        match e {
            QueryError::Log(e) | QueryError::Models(e) => e,
            lagging @ QueryError::Lagging { .. } => {
                StorageError::new("the read models lag behind the log", lagging)
            }
            gone @ QueryError::Compacted { .. } => {
                StorageError::new("a read before the compacted prefix", gone)
            }
        }
    }
}

/// Events past a cursor are counted up to this many.
pub const LAG_CAP: u64 = 10_000;

/// How far a cursor is behind its stream (spec section 6).
#[derive(Debug, Clone, PartialEq)]
pub struct Lag {
    pub consumer_id: String,
    pub stream_name: String,
    pub subject_id: String,
    pub last_sequence: u64,
    /// Matching events past the cursor, up to [`LAG_CAP`].
    pub lag_events: u64,
    /// More than [`LAG_CAP`] events are past the cursor.
    pub lag_capped: bool,
    /// How long its oldest pending work has waited, seconds: since the later of its last
    /// progress (an advance or a reset) and the first event it has to deliver; 0 when it has
    /// nothing to deliver.
    pub lag_seconds: f64,
    /// Deliverable work and no progress for `stuck_after_ms` (section 10).
    pub stalled: bool,
    /// A bridge webhook subscription whose endpoint holds its POSTs (section 17):
    /// `circuit_open` or `endpoint_disabled`. It waits by design: not stalled.
    pub held_by: Option<&'static str>,
    /// A bridge subscription stopped at a terminal-state mismatch (section 6): flagged at
    /// once, with the mismatch's reason and seq.
    pub stopped: Option<Stopped>,
    /// When the cursor row last changed (an advance, a reset, a failure).
    pub updated_at_us: Option<i64>,
    /// When it last made progress (an advance or a reset).
    pub progress_at_us: Option<i64>,
    /// Events it had yet to deliver were compacted away (it made no progress for the
    /// retention window, so it no longer pinned them): counted from the first retained one.
    pub compacted_past: bool,
    pub last_error: Option<String>,
}

/// Where and why a bridge subscription stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct Stopped {
    pub seq: u64,
    pub reason: String,
}

impl Lag {
    /// Judge the waiting work that started at `due_us` (the first event to deliver) against
    /// the cursor's last progress at `now_us`: how long it has waited, and whether that is
    /// longer than `stuck_after_ms`. `None`: nothing to deliver.
    pub fn judge(
        &mut self,
        due_us: Option<i64>,
        progress_us: Option<i64>,
        now_us: i64,
        stuck_after_ms: u64,
    ) {
        let waited_us = due_us.map(|due| (now_us - progress_us.map_or(due, |p| p.max(due))).max(0));
        self.lag_seconds = waited_us.map_or(0.0, |w| w as f64 / 1e6);
        self.stalled = waited_us.is_some_and(|w| w > stuck_after_ms as i64 * 1_000);
    }
}

/// Queries of the read models, as of at least the head when they are called.
#[derive(Clone)]
pub struct Queries<L = AnyLog> {
    log: L,
    models: tidemark_projections::Models,
    progress: Arc<crate::decider::Progress>,
    privacy: Option<Arc<crate::privacy::Privacy>>,
    /// Wait for the models to reach the head (false: [`Queries::unwaited`]).
    wait: bool,
    /// The tenant whose rows and events are read (`None`: the default tenant).
    tenant: Option<Arc<str>>,
}

impl<L: EventLog + Clone> Queries<L> {
    pub(crate) fn new(
        log: L,
        models: tidemark_projections::Models,
        progress: Arc<crate::decider::Progress>,
    ) -> Queries<L> {
        Queries {
            log,
            models,
            progress,
            privacy: None,
            wait: true,
            tenant: None,
        }
    }

    pub(crate) fn set_tenant(&mut self, tenant: Option<Arc<str>>) {
        self.tenant = tenant;
    }

    /// The tenant these queries read, by name.
    fn tenant_name(&self) -> &str {
        self.tenant
            .as_deref()
            .unwrap_or(tidemark_log::DEFAULT_TENANT)
    }

    /// One read transaction of the models, reading the tenant's rows.
    fn snapshot(&self) -> Result<ModelsTxn, StorageError> {
        let mut txn = self.models.read().snapshot()?;
        txn.enter(self.tenant.as_deref());
        Ok(txn)
    }

    /// The same queries as of whatever the models have folded, never waiting for the head: for
    /// the views that never wait (section 7: the lag view, `/metrics`), whose callers judge
    /// only what a row has seen.
    pub fn unwaited(&self) -> Queries<L> {
        Queries {
            wait: false,
            ..self.clone()
        }
    }

    pub(crate) fn set_privacy(&mut self, p: Option<Arc<crate::privacy::Privacy>>) {
        self.privacy = p;
    }

    /// Events committed that the read models have not folded yet (never waits).
    pub fn lag(&self) -> u64 {
        self.log.head().saturating_sub(self.progress.get())
    }

    /// Wait until every read model has folded the log up to the head now, or `min_seq` if
    /// higher (a seq the caller saw elsewhere), at most [`READ_WAIT`]; the seq every answer
    /// read afterwards reflects at least (`as_of_seq`).
    pub fn floor(&self, min_seq: u64) -> R<u64> {
        self.folded_to(self.log.head().max(min_seq))
    }

    /// Whether a read now sees the models folded through `want`, without waiting (a handler
    /// that finds it so reads on its own task instead of the blocking pool).
    pub fn folded_now(&self, want: u64) -> bool {
        !self.wait || self.progress.get() >= want
    }

    /// Wait until every read model has folded the log up to `want` (not the head: a reader
    /// that needs only what it was told of, such as the notifications of the rows a claim
    /// leased), at most [`READ_WAIT`]; the seq the models stand at.
    pub fn folded_to(&self, want: u64) -> R<u64> {
        let known = self.progress.get();
        if !self.wait {
            return Ok(known);
        }
        if known >= want {
            return Ok(known);
        }
        let until = Instant::now() + READ_WAIT;
        let models = tidemark_projections::all();
        loop {
            // The models' own checkpoints (a rebuild's chunk may have folded them).
            let at = tidemark_projections::framework::checkpoint(&self.models.read(), &models)?;
            if at >= want {
                self.progress.advance(at);
                return Ok(at);
            }
            if Instant::now() >= until {
                metrics::counter!("tidemark_reads_lagging_total").increment(1);
                return Err(QueryError::Lagging { want, at });
            }
            self.progress.wait(want, until, Duration::from_millis(20));
        }
    }

    /// A page of events as clients see them: webhook secrets redacted.
    pub fn events(&self, q: &ReadQuery) -> R<ReadPage> {
        // The tenant's events alone.
        let q = ReadQuery {
            tenant: Some(self.tenant_name().to_owned()),
            ..q.clone()
        };
        let mut page = self.log.read(&q).map_err(|e| match e {
            tidemark_log::ReadError::Compacted { first } => QueryError::Compacted { first },
            e => QueryError::Log(StorageError::of(e)),
        })?;
        for ev in &mut page.events {
            tidemark_projections::secrets::redact(ev);
        }
        Ok(page)
    }

    /// Every projection with its checkpoint, lag behind the head and digest (never waits).
    pub fn projections(&self) -> R<Vec<ProjectionInfo>> {
        Ok(models::projections(&self.models.read(), self.log.head())?)
    }

    /// `f` asked of one read transaction of the models (through their views).
    fn on_models<T>(&self, f: impl FnOnce(&ModelsTxn) -> Result<T, StorageError>) -> R<T> {
        Ok(f(&self.snapshot()?)?)
    }

    /// `f` asked of the deliveries model's view, over one read transaction of the models.
    fn on_deliveries<T>(
        &self,
        f: impl FnOnce(&deliveries::View<'_>) -> Result<T, StorageError>,
    ) -> R<T> {
        self.on_models(|m| f(&deliveries::View::new(m)?))
    }

    /// `f` asked of the bridges model's view, over one read transaction of the models.
    fn on_bridges<T>(&self, f: impl FnOnce(&bridges::View<'_>) -> Result<T, StorageError>) -> R<T> {
        self.on_models(|m| f(&bridges::View::new(m)?))
    }

    /// Outbox KPIs as the deliveries model stands now, without waiting (for `/metrics`).
    pub fn kpis_now(
        &self,
        now_us: i64,
        stuck_after_ms: u64,
        interval_ms: u64,
    ) -> R<(Kpis, BTreeMap<String, Kpis>)> {
        self.on_deliveries(|d| d.kpis(now_us, stuck_after_ms, interval_ms))
    }

    pub fn task(&self, task_id: &TaskId) -> R<Option<Task>> {
        self.floor(0)?;
        self.on_models(|m| tasks::View::new(m)?.row(task_id.as_str()))
    }

    /// A page of tasks and the position of its last row when more may follow.
    pub fn tasks(&self, f: &TaskFilter) -> R<Page<Task>> {
        self.floor(0)?;
        self.on_models(|m| tasks::View::new(m)?.page(f))
    }

    /// Notifications newest first and the `before_seq` of the next page.
    pub fn notifications(&self, f: &NotificationFilter) -> R<(Vec<Notification>, Option<u64>)> {
        self.floor(0)?;
        self.on_models(|m| notifications::View::new(m)?.page(f))
    }

    /// [`Queries::notifications`], each with its task's `latest_event_seq` (0 without one).
    pub fn notifications_with_task_seq(
        &self,
        f: &NotificationFilter,
    ) -> R<NotificationsWithTaskSeq> {
        self.floor(0)?;
        self.on_models(|m| notifications::View::new(m)?.page_with_task_seq(f))
    }

    /// The status record of one notification (`None`: no notification has that id).
    pub fn notification_status(&self, id: &NotificationId) -> R<Option<NotificationStatus>> {
        self.floor(0)?;
        let intent = self.privacy.as_ref().map(|p| p.intent_key(id.as_str()));
        self.on_models(|m| notifications::View::new(m)?.status(id, intent.as_deref()))
    }

    /// The project and provenance of the notification at each of `seqs` (what a delivery of
    /// it serves), in one read.
    pub fn provenances(&self, seqs: &[u64]) -> R<Vec<Option<notifications::read::Origin>>> {
        self.on_models(|m| notifications::View::new(m)?.provenances(seqs))
    }

    /// The highest source seq the notification router has derived from.
    pub fn router_checkpoint(&self) -> R<u64> {
        self.floor(0)?;
        self.on_models(|m| notifications::View::new(m)?.router_checkpoint())
    }

    /// The routing settings in force: the file's, with the routes managed at runtime.
    pub fn settings_in_force(&self) -> R<tidemark_projections::routing::RoutingSettings> {
        self.floor(0)?;
        self.on_deliveries(|d| d.settings_in_force())
    }

    /// The notification settings last recorded in the log.
    pub fn current_settings(&self) -> R<Option<serde_json::Value>> {
        self.floor(0)?;
        let txn = self.snapshot()?;
        Ok(tidemark_projections::settings::View::new(&txn)?.current()?)
    }

    /// One delivery and its timeline.
    pub fn delivery(&self, id: &DeliveryId) -> R<Option<(Delivery, Vec<Step>)>> {
        self.floor(0)?;
        self.on_deliveries(|d| {
            let Some(row) = d.row(id.as_str())? else {
                return Ok(None);
            };
            Ok(Some((row, d.timeline(id.as_str())?)))
        })
    }

    /// The delivery `d` waits for in its route's order (section 4): the first of its key,
    /// when `d` holds a key and is not that first one.
    pub fn order_waits_for(&self, d: &Delivery) -> R<Option<String>> {
        let Some(key) = d.holds_order_key() else {
            return Ok(None);
        };
        self.floor(0)?;
        Ok(self
            .on_deliveries(|v| v.order_first(&d.route, key))?
            .filter(|first| first != d.id.as_str()))
    }

    /// A page of deliveries and the position of its last row when more may follow.
    pub fn deliveries(&self, f: &DeliveryFilter) -> R<Page<Delivery>> {
        self.floor(0)?;
        let txn = self.snapshot()?;
        let view = deliveries::View::new(&txn)?;
        let clear = view.page(f)?;
        // Redacted deliveries carry the keyed hashes of the recipient and the notification id
        // (section 14): a filter by either also finds them, merged in the list's order.
        let Some(p) = self
            .privacy
            .as_ref()
            .filter(|_| f.recipient.is_some() || f.notification_id.is_some())
        else {
            return Ok(clear);
        };
        let hashed = DeliveryFilter {
            recipient: f.recipient.as_deref().map(|r| p.recipient_hash(r)),
            notification_id: f.notification_id.as_deref().map(|n| p.intent_key(n)),
            ..f.clone()
        };
        let other = view.page(&hashed)?;
        let more = clear.1.is_some() || other.1.is_some();
        let mut all: Vec<Delivery> = clear.0.into_iter().chain(other.0).collect();
        match f.order {
            ListOrder::Id => all.sort_by(|a, b| a.id.cmp(&b.id)),
            ListOrder::Newest => all.sort_by_key(|d| std::cmp::Reverse(Position::from(d))),
        }
        all.dedup_by(|a, b| a.id == b.id);
        let limit = f.limit.max(1);
        let more = more || all.len() > limit;
        all.truncate(limit);
        let next = if more {
            all.last().map(Position::from)
        } else {
            None
        };
        Ok((all, next))
    }

    /// Outbox KPIs overall and per sink, judged at `now_us`.
    pub fn kpis(
        &self,
        now_us: i64,
        stuck_after_ms: u64,
        interval_ms: u64,
    ) -> R<(Kpis, BTreeMap<String, Kpis>)> {
        self.floor(0)?;
        self.kpis_now(now_us, stuck_after_ms, interval_ms)
    }

    /// Outbox KPIs per source site (`by_source_site`), judged at `now_us`.
    pub fn kpis_by_site(
        &self,
        now_us: i64,
        stuck_after_ms: u64,
        interval_ms: u64,
    ) -> R<BTreeMap<String, Kpis>> {
        self.floor(0)?;
        self.on_deliveries(|d| d.kpis_by_site(now_us, stuck_after_ms, interval_ms))
    }

    /// Deliveries not yet sent, skipped, cancelled or discarded.
    pub fn pending_deliveries(&self) -> R<u64> {
        self.floor(0)?;
        self.on_deliveries(|d| d.pending())
    }

    /// When the first held lease expires (µs since the epoch), as the models show it now (not
    /// waiting for them); `None` when nothing is leased.
    pub fn earliest_lease_expiry(&self) -> R<Option<i64>> {
        self.on_deliveries(|d| d.first_lease_expiry())
    }

    /// When the first delivery of `sink` falls due (µs since the epoch), as the models show it
    /// now (not waiting for them); `None` when none waits.
    pub fn earliest_due(&self, sink: Sink) -> R<Option<i64>> {
        self.on_deliveries(|d| d.earliest_due(sink))
    }

    /// The seq of the last notification or cancellation routing has handled.
    pub fn routing_checkpoint(&self) -> R<u64> {
        self.floor(0)?;
        self.on_deliveries(|d| d.routed())
    }

    /// What the log says about source `name` (`None`: nothing yet).
    pub fn source(&self, name: &str) -> R<Option<tidemark_projections::sources::SourceRow>> {
        self.floor(0)?;
        self.on_models(|m| tidemark_projections::sources::View::new(m)?.recorded(name))
    }

    /// A notification list (section 17).
    pub fn list(&self, name: &str) -> R<Option<tidemark_projections::lists::ListRow>> {
        self.floor(0)?;
        self.on_models(|m| tidemark_projections::lists::View::new(m)?.row(name))
    }

    /// A route managed through the API.
    pub fn route(&self, name: &str) -> R<Option<tidemark_projections::routes::RouteRow>> {
        self.floor(0)?;
        self.on_models(|m| tidemark_projections::routes::View::new(m)?.row(name))
    }

    /// Every route managed through the API, by name.
    pub fn routes(&self) -> R<Vec<tidemark_projections::routes::RouteRow>> {
        self.floor(0)?;
        self.on_models(|m| tidemark_projections::routes::View::new(m)?.all())
    }

    /// Every endpoint (each delivering route's, each bridge webhook subscription's): its
    /// health, circuit and the circuit's policy (section 17).
    pub fn endpoints(
        &self,
    ) -> R<
        Vec<(
            tidemark_projections::endpoints::Endpoint,
            tidemark_projections::routing::CircuitPolicy,
        )>,
    > {
        self.floor(0)?;
        self.on_deliveries(|d| d.endpoints_in_force())
    }

    /// The health and circuit of delivering route `route` (`None`: no attempt or switch yet;
    /// a bridge webhook subscription's is [`Queries::bridge_endpoint`]).
    pub fn endpoint(&self, route: &str) -> R<Option<tidemark_projections::endpoints::Endpoint>> {
        self.floor(0)?;
        self.on_deliveries(|d| d.endpoint(route))
    }

    /// The health and circuit of bridge webhook subscription `id` (section 17).
    pub fn bridge_endpoint(
        &self,
        id: &SubscriptionId,
    ) -> R<Option<tidemark_projections::endpoints::Endpoint>> {
        self.floor(0)?;
        self.on_bridges(|b| b.endpoint(id.as_str()))
    }

    /// Every notification list, by name.
    pub fn lists(&self) -> R<Vec<tidemark_projections::lists::ListRow>> {
        self.floor(0)?;
        self.on_models(|m| tidemark_projections::lists::View::new(m)?.all())
    }

    /// A cursor, or its zero state.
    pub fn cursor(&self, consumer_id: &str, stream_name: &str, subject_id: &str) -> R<Cursor> {
        self.floor(0)?;
        let txn = self.snapshot()?;
        Ok(cursors::View::new(&txn)?.get(consumer_id, stream_name, subject_id)?)
    }

    /// Cursors (of one consumer), at most `limit`.
    pub fn cursors(&self, consumer_id: Option<&str>, limit: usize) -> R<Vec<Cursor>> {
        self.floor(0)?;
        let txn = self.snapshot()?;
        Ok(cursors::View::new(&txn)?.page(consumer_id, limit)?)
    }

    pub fn subscription(&self, id: &SubscriptionId) -> R<Option<Subscription>> {
        self.floor(0)?;
        self.on_bridges(|b| b.row(id.as_str()))
    }

    /// Active subscriptions of these tasks (one read for all).
    pub fn task_subscriptions(&self, task_ids: &[&str]) -> R<Vec<Subscription>> {
        self.floor(0)?;
        self.on_bridges(|b| b.of_tasks(task_ids))
    }

    /// Active subscriptions of a bridge.
    pub fn bridge_subscriptions(&self, bridge_id: &BridgeId) -> R<Vec<Subscription>> {
        self.floor(0)?;
        self.on_bridges(|b| b.of_bridge(bridge_id.as_str()))
    }

    /// Every active subscription.
    pub fn all_active_subscriptions(&self) -> R<Vec<Subscription>> {
        self.floor(0)?;
        self.on_bridges(|b| b.active())
    }

    /// Tenant `name` in the deployment's directory (the default tenant's model, whichever
    /// tenant these queries read; never waits).
    pub fn tenant(&self, name: &str) -> R<Option<tidemark_projections::tenants::TenantRow>> {
        let txn = self.models.read().snapshot()?;
        Ok(tidemark_projections::tenants::View::new(&txn)?.row(name)?)
    }

    /// Every tenant ever created (removed ones marked), by name.
    pub fn tenants(&self) -> R<Vec<tidemark_projections::tenants::TenantRow>> {
        self.floor(0)?;
        let txn = self.models.read().snapshot()?;
        Ok(tidemark_projections::tenants::View::new(&txn)?.all()?)
    }

    /// Every cursor, and every active bridge subscription's cursor (zero or not), with its lag
    /// judged at `now_us`.
    pub fn lags(&self, now_us: i64, stuck_after_ms: u64) -> R<Vec<Lag>> {
        let first = self.log.first_seq().map_err(QueryError::Log)?;
        let mut all = cursors::View::new(&self.snapshot()?)?.page(None, 100_000)?;
        let known: std::collections::HashSet<(String, String, String)> = all
            .iter()
            .map(|c| {
                (
                    c.consumer_id.clone(),
                    c.stream_name.clone(),
                    c.subject_id.clone(),
                )
            })
            .collect();
        for sub in bridges::View::new(&self.snapshot()?)?.active()? {
            let consumer =
                tidemark_projections::names::ids::bridge_consumer(sub.subscription_id.as_str());
            let key = (
                consumer,
                Stream::TaskEvents.into(),
                sub.target.task_id.into_string(),
            );
            if !known.contains(&key) {
                all.push(Cursor::zero(&key.0, &key.1, &key.2));
            }
        }
        all.iter()
            .map(|c| self.lag_of(c, now_us, stuck_after_ms, first))
            .collect()
    }

    fn lag_of(&self, c: &Cursor, now_us: i64, stuck_after_ms: u64, first: u64) -> R<Lag> {
        let mut after = c.last_sequence.max(first.saturating_sub(1));
        let mut count = 0u64;
        let mut oldest: Option<i64> = None;
        let mut capped = false;
        loop {
            let page = self
                .log
                .read(&ReadQuery {
                    after,
                    limit: 1000,
                    stream: Some(c.stream_name.clone()),
                    subject: (!c.subject_id.is_empty()).then(|| c.subject_id.clone()),
                    // The cursor's tenant's events alone.
                    tenant: Some(self.tenant_name().to_owned()),
                    ..ReadQuery::default()
                })
                .map_err(StorageError::of)?;
            if oldest.is_none() {
                oldest = page.events.first().map(|e| e.time_us);
            }
            count += page.events.len() as u64;
            if count >= LAG_CAP {
                capped = true;
                break;
            }
            if page.next_after <= after || page.next_after >= page.head {
                break;
            }
            after = page.next_after;
        }
        let mut lag = Lag {
            consumer_id: c.consumer_id.clone(),
            stream_name: c.stream_name.clone(),
            subject_id: c.subject_id.clone(),
            last_sequence: c.last_sequence,
            lag_events: count.min(LAG_CAP),
            lag_capped: capped,
            lag_seconds: 0.0,
            stalled: false,
            held_by: None,
            stopped: None,
            updated_at_us: c.updated_at_us,
            progress_at_us: c.progress_at_us(),
            compacted_past: c.last_sequence + 1 < first,
            last_error: c.last_error.clone(),
        };
        // A plain consumer has every event past its cursor to deliver.
        lag.judge(oldest, c.progress_at_us(), now_us, stuck_after_ms);
        Ok(lag)
    }
}
