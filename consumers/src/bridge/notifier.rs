//! The notifier's loop: which subscriptions to look at after each page of the log, what to do
//! for each (pull cache, webhook POST with retries, mismatch record), and confirming webhook
//! deliveries. One notifier follows a shard's log for every tenant in it (spec section 20):
//! each subscription is looked at, scanned and confirmed through its own tenant's handle, and
//! known by its tenant and id (two tenants may name a subscription alike).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark_log::StorageError;
use tidemark_projections::ids::SubscriptionId;

use tidemark_engine::Engine;
use tidemark_projections::bridges::{self, BridgeSink, Decision, Subscription};
use tidemark_projections::names::{EventType, Stream, ids};
use tidemark_projections::routing::{RoutingSettings, backoff_ms};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::follow::{Feed, Page};

use super::{
    PullHub, Scan, Signatures, confirm, receiver_retry_after_ms, record_failure, record_mismatch,
    scan,
};

/// State of one webhook subscription between passes.
#[derive(Default)]
struct Retry {
    attempts: u32,
    next: Option<Instant>,
    /// The seq being retried (a new seq starts over).
    seq: u64,
}

/// Webhook subscriptions are split into this many leases (spec section 16: a bridge notifier
/// per subscription, once per cluster), so a cluster renews a few keys, not one per
/// subscription.
pub const LEASE_SLOTS: usize = 16;

/// The lease of the notifier of `tenant`'s `subscription`'s webhook (the default tenant's by
/// the subscription id alone, as before tenants).
pub fn lease_name(tenant: &str, subscription: &str) -> String {
    let slot = if tenant == tidemark_log::DEFAULT_TENANT {
        tidemark_log::lease::slot(subscription, LEASE_SLOTS)
    } else {
        tidemark_log::lease::slot(&format!("{tenant}/{subscription}"), LEASE_SLOTS)
    };
    format!("bridge.{slot}")
}

/// A subscription of one tenant: the tenant's name and the subscription's id.
type Key = (String, SubscriptionId);

/// A subscription to look at, with the handle of its tenant.
type Work = (Engine, Subscription);

fn key(engine: &Engine, id: &SubscriptionId) -> Key {
    (engine.tenant().to_owned(), id.clone())
}

/// Start the notifier; it stops when `shutdown` is cancelled.
pub fn spawn(
    engine: Engine,
    settings: RoutingSettings,
    hub: PullHub,
    feed: Feed,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = match reqwest::Client::builder()
            .user_agent(crate::USER_AGENT)
            .timeout(Duration::from_secs(10))
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "bridge notifier: no HTTP client; webhooks disabled");
                return;
            }
        };
        let leases = engine.leases();
        for slot in 0..LEASE_SLOTS {
            leases.want(&format!("bridge.{slot}"));
        }
        tokio::select! {
            _ = leases.ready() => {}
            _ = shutdown.cancelled() => return,
        }
        let mut n = Notifier {
            leases,
            engine,
            http,
            settings,
            scanned_to: None,
            retries: HashMap::new(),
            inflight: JoinSet::new(),
            stopped: Default::default(),
            deferred: Default::default(),
            hub,
            busy: HashMap::new(),
            probing: HashSet::new(),
        };
        n.run(feed, shutdown).await;
    })
}

struct Notifier {
    /// Which webhook subscriptions this node posts to and records mismatches of; the pull
    /// cache is kept on every node (its long-polls are served anywhere).
    leases: tidemark_log::Leases,
    engine: Engine,
    http: reqwest::Client,
    settings: RoutingSettings,
    /// The log head the last pass looked at (`None`: look at every subscription).
    scanned_to: Option<u64>,
    retries: HashMap<Key, Retry>,
    /// Subscriptions stopped at a mismatch, and those with a deferred event, as last seen.
    stopped: HashSet<Key>,
    deferred: HashSet<Key>,
    /// Webhook POSTs in flight: (subscription, seq, cursor when scanned, outcome).
    inflight: JoinSet<(Key, u64, u64, Result<(), Failed>)>,
    hub: PullHub,
    /// Subscriptions with a webhook POST in flight.
    busy: HashMap<Key, u64>,
    /// Subscriptions whose POST in flight is their open circuit's probe.
    probing: HashSet<Key>,
}

impl Notifier {
    /// A full pass at start, then one pass per page of the follower (and when a webhook retry
    /// is due), until the feed ends or `shutdown`.
    async fn run(&mut self, mut feed: Feed, shutdown: CancellationToken) {
        let mut page: Option<Arc<Page>> = None;
        let mut due = true;
        let mut leases = self.leases.changes();
        loop {
            if due {
                if let Err(e) = self.pass(page.take()).await {
                    tracing::warn!(error = %e, "bridge notifier pass failed; retrying");
                    // Look at every subscription again: the failed pass may have skipped some.
                    self.scanned_to = None;
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
                        _ = shutdown.cancelled() => return,
                    }
                }
                due = false;
            }
            let next_retry = self
                .retries
                .values()
                .filter_map(|r| r.next)
                .min()
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                p = feed.recv() => match p {
                    Some(p) => {
                        page = Some(p);
                        due = true;
                    }
                    None => return,
                },
                Some(done) = self.inflight.join_next(), if !self.inflight.is_empty() => {
                    if let Ok(done) = done { self.finished(done).await }
                }
                _ = tokio::time::sleep(next_retry) => due = true,
                // A lease taken (or lost): look at every subscription again.
                Ok(()) = leases.changed() => {
                    self.scanned_to = None;
                    due = true;
                }
                _ = shutdown.cancelled() => {
                    self.inflight.abort_all();
                    return;
                }
            }
        }
    }

    async fn finished(&mut self, (k, seq, expected, result): (Key, u64, u64, Result<(), Failed>)) {
        self.busy.remove(&k);
        let engine = self.engine.in_tenant(&k.0);
        let sub_id = &k.1;
        let Ok(Some(sub)) = ({
            let e = engine.clone();
            let id = sub_id.clone();
            tokio::task::spawn_blocking(move || {
                e.read().subscription(&id).map_err(StorageError::from)
            })
            .await
            .unwrap_or_else(|e| Err(StorageError::of(e)))
        }) else {
            return;
        };
        match result {
            Ok(()) => {
                self.retries.remove(&k);
                // Compare-and-swap on the cursor the scan saw: a reset meanwhile wins.
                // The confirmation also closes the endpoint's circuit if it is open.
                match confirm(&engine, &sub, seq, Some(expected)).await {
                    Ok(_) => {
                        self.probing.remove(&k);
                    }
                    Err(e) => {
                        tracing::warn!(subscription = %sub_id, seq, error = %e, "webhook delivery confirmed but the cursor did not advance");
                    }
                }
            }
            Err(Failed {
                error: err,
                code,
                retry_after_ms,
            }) => {
                metrics::counter!("tidemark_bridge_webhook_failures_total").increment(1);
                let r = self.retries.entry(k.clone()).or_default();
                let attempts = r.failed(seq);
                let u = rand::random::<f64>();
                // A receiver's Retry-After (429/503, capped at an hour) replaces the backoff.
                let ms = backoff_ms(&self.settings.retry, attempts, u, retry_after_ms);
                r.next = Some(Instant::now() + Duration::from_millis(ms));
                tracing::warn!(target: "tidemark::endpoints", tenant = %k.0, subscription = %sub_id, seq,
                    attempt = r.attempts, code = %code, cause = %err, retry_in_ms = ms,
                    "bridge webhook delivery failed");
                if record_failure(&engine, &sub, &err, Some(&code))
                    .await
                    .is_ok()
                {
                    let probe = self.probing.remove(&k);
                    circuit_after_failure(&engine, &sub, probe).await;
                }
            }
        }
    }

    /// Subscriptions to look at: all of them at the first pass (and after a failed one), then
    /// those whose task, cursor or subscription changed in `page` (each in its own tenant),
    /// and webhook retries now due.
    async fn dirty(&mut self, page: Option<Arc<Page>>) -> Result<Vec<Work>, StorageError> {
        let e = self.engine.clone();
        let since = self.scanned_to;
        // An endpoint enabled or closed lets its POST go now, not after the backoff it had.
        for ev in page.iter().flat_map(|p| p.events.iter()) {
            if ev.seq > since.unwrap_or(0)
                && (EventType::parse(&ev.event_type) == Some(EventType::EndpointEnabled)
                    || EventType::parse(&ev.event_type) == Some(EventType::EndpointCircuitClosed))
                && let Some(sub) = ids::subscription_of_endpoint(&ev.subject)
            {
                self.retries
                    .remove(&(ev.tenant().to_owned(), SubscriptionId::new(sub)));
            }
        }
        // A page with nothing for the bridges (no task, subscription or cursor event) is seen
        // without a read: no blocking task, no read transaction.
        let quiet = match (since, page.as_deref()) {
            (Some(since), Some(p)) => !p
                .events
                .iter()
                .any(|ev| ev.seq > since && concerns(&ev.as_ref())),
            _ => false,
        };
        let (subs, seen, forget) = if let (true, Some(since)) = (quiet, since) {
            let seen = page.map_or(since, |p| p.upto.max(since));
            (Vec::new(), seen, Vec::new())
        } else {
            tokio::task::spawn_blocking(move || {
                let Some(since) = since else {
                    let head = e.head();
                    // Every tenant the directory places here, as of its head (a pass that
                    // cannot wait for it fails and is made again).
                    e.settle_directory().map_err(StorageError::from)?;
                    let mut all = Vec::new();
                    for (tenant, _) in e.every_tenant().map_err(StorageError::from)? {
                        let subs = tenant.read().all_active_subscriptions()?;
                        all.extend(subs.into_iter().map(|s| (tenant.clone(), s)));
                    }
                    return Ok::<_, StorageError>((all, head, Vec::new()));
                };
                // Per tenant: the tasks and the subscriptions the page touches.
                type Touched = (BTreeSet<String>, BTreeSet<SubscriptionId>);
                let mut touched: BTreeMap<&str, Touched> = BTreeMap::new();
                // Subscriptions to drop from the pull cache: (key, its cursor was reset).
                let mut forget: Vec<(Key, bool)> = Vec::new();
                let events = page
                    .as_ref()
                    .map(|p| p.events.as_slice())
                    .unwrap_or_default();
                for ev in events.iter().filter(|ev| ev.seq > since) {
                    let (tasks, ids) = touched.entry(ev.tenant()).or_default();
                    match Stream::parse(&ev.stream) {
                        Some(Stream::TaskEvents) => {
                            tasks.insert(ev.subject.clone());
                        }
                        Some(Stream::Bridges) => {
                            ids.insert(SubscriptionId::new(ev.subject.as_str()));
                        }
                        Some(Stream::Endpoints) => {
                            if let Some(sub) = ids::subscription_of_endpoint(&ev.subject) {
                                ids.insert(SubscriptionId::new(sub));
                            }
                        }
                        Some(Stream::Cursors) => {
                            if let Some(sub) = ids::subscription_of_consumer(&ev.subject) {
                                ids.insert(SubscriptionId::new(sub));
                                if EventType::parse(&ev.event_type) == Some(EventType::CursorReset)
                                {
                                    forget.push((
                                        (ev.tenant().to_owned(), SubscriptionId::new(sub)),
                                        true,
                                    ));
                                }
                            }
                        }
                        _ => {}
                    }
                }
                let mut out: Vec<Work> = Vec::new();
                for (tenant, (tasks, ids)) in touched {
                    let te = e.in_tenant(tenant);
                    if !tasks.is_empty() {
                        let tasks: Vec<&str> = tasks.iter().map(String::as_str).collect();
                        let subs = te.read().task_subscriptions(&tasks)?;
                        out.extend(subs.into_iter().map(|s| (te.clone(), s)));
                    }
                    for id in &ids {
                        match te.read().subscription(id)? {
                            Some(s) if s.active => {
                                if !tasks.contains(s.target.task_id.as_str()) {
                                    out.push((te.clone(), s));
                                }
                            }
                            _ => forget.push(((tenant.to_owned(), id.clone()), false)),
                        }
                    }
                }
                let seen = page.map_or(since, |p| p.upto.max(since));
                Ok((out, seen, forget))
            })
            .await
            .map_err(StorageError::of)??
        };
        for (k, reset) in &forget {
            self.hub.forget(&k.0, &k.1, *reset);
            if !reset {
                self.stopped.remove(k);
                self.deferred.remove(k);
            }
        }
        self.scanned_to = Some(seen);
        let mut subs = subs;
        let now = Instant::now();
        let due: Vec<Key> = self
            .retries
            .iter()
            .filter(|(k, r)| {
                r.next.is_some_and(|t| t <= now)
                    && !subs
                        .iter()
                        .any(|(te, s)| te.tenant() == k.0 && s.subscription_id == k.1)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            // A tenant that no longer acts here (moved away, or fenced by a move) is retried
            // where it lives.
            let tenant = tidemark_log::tenant_of(&k.0);
            if !self
                .engine
                .placement()
                .commands_here(tenant, self.engine.shard())
            {
                if self.engine.placement().moving(&k.0).is_none() {
                    self.retries.remove(&k);
                }
                continue;
            }
            let te = self.engine.in_tenant(&k.0);
            let e = te.clone();
            let id = k.1.clone();
            let found = tokio::task::spawn_blocking(move || e.read().subscription(&id))
                .await
                .map_err(StorageError::of)??;
            match found {
                Some(s) if s.active => subs.push((te, s)),
                Some(_) => {
                    self.retries.remove(&k);
                }
                None => {}
            }
        }
        Ok(subs)
    }

    /// One look at the subscriptions that may have something to do.
    async fn pass(&mut self, page: Option<Arc<Page>>) -> Result<(), StorageError> {
        let full = self.scanned_to.is_none();
        let started = Instant::now();
        let subs = self.dirty(page).await?;
        metrics::histogram!("tidemark_bridge_notifier_dirty_subscriptions")
            .record(subs.len() as f64);
        let mut bridges_touched = BTreeSet::new();
        for (te, s) in &subs {
            if s.target.sink == BridgeSink::Pull {
                bridges_touched.insert((te.tenant().to_owned(), s.target.bridge_id.clone()));
            }
        }
        let r = self.look_at(subs).await;
        if r.is_ok() {
            if full {
                self.hub.set_ready();
            }
            self.hub.seen(self.scanned_to.unwrap_or(0));
        }
        // Wake the long-polls of the bridges whose pending deliveries may have changed.
        for (tenant, b) in &bridges_touched {
            self.hub.bump(tenant, b);
        }
        metrics::histogram!("tidemark_bridge_notifier_pass_seconds")
            .record(started.elapsed().as_secs_f64());
        r
    }

    async fn look_at(&mut self, subs: Vec<Work>) -> Result<(), StorageError> {
        let r = self.look_at_each(subs).await;
        // The decisions in force, for dashboards (the same as `…/explain`, in aggregate).
        metrics::gauge!("tidemark_bridge_subscriptions_stopped").set(self.stopped.len() as f64);
        metrics::gauge!("tidemark_bridge_subscriptions_deferring").set(self.deferred.len() as f64);
        metrics::gauge!("tidemark_bridge_webhooks_retrying").set(self.retries.len() as f64);
        r
    }

    async fn look_at_each(&mut self, subs: Vec<Work>) -> Result<(), StorageError> {
        let now = Instant::now();
        let subs: Vec<Work> = subs
            .into_iter()
            .filter(|(te, s)| {
                let k = key(te, &s.subscription_id);
                !self.busy.contains_key(&k)
                    && self
                        .retries
                        .get(&k)
                        .is_none_or(|r| r.next.is_none_or(|t| t <= now))
            })
            .collect();
        // Scan in chunks, each in one blocking task (a burst of task events can dirty
        // thousands of subscriptions at once).
        for chunk in subs.chunks(256) {
            let chunk = chunk.to_vec();
            let scanned = tokio::task::spawn_blocking(move || {
                chunk
                    .into_iter()
                    .map(|(te, s)| scan(&te, &s, false).map(|r| (te, s, r)))
                    .collect::<Result<Vec<_>, StorageError>>()
            })
            .await
            .map_err(StorageError::of)??;
            for (te, sub, scan) in scanned {
                self.act(te, sub, scan).await?;
            }
        }
        Ok(())
    }

    /// Act on one subscription's scan (`te`: its tenant's handle).
    async fn act(&mut self, te: Engine, sub: Subscription, scan: Scan) -> Result<(), StorageError> {
        let id = key(&te, &sub.subscription_id);
        {
            if sub.target.sink == BridgeSink::Pull {
                let entry = scan
                    .deliver
                    .as_ref()
                    .map(|ev| (ev.seq, bridges::envelope(&sub, ev)));
                self.hub.set(te.tenant(), &sub, entry);
            }
            let deferred = scan
                .candidates
                .iter()
                .filter(|c| c.decision == Decision::Defer)
                .count();
            if deferred > 0 {
                self.deferred.insert(id.clone());
            } else {
                self.deferred.remove(&id);
            }
            let act = act_on(
                self.leases.holds(&lease_name(&id.0, id.1.as_str())),
                sub.target.sink.is_webhook(),
                scan.deliver.as_ref(),
                scan.mismatch.as_ref(),
            );
            if let Act::Mismatch((ev, reason)) = act {
                self.stopped.insert(id.clone());
                record_mismatch(&te, &sub, ev, reason).await;
                return Ok(());
            }
            if !matches!(act, Act::Leave) {
                self.stopped.remove(&id);
            }
            if let Act::Post(ev) = act {
                if self.held(&te, &sub).await? {
                    return Ok(());
                }
                {
                    let envelope = bridges::envelope(&sub, ev);
                    let webhook_id = envelope["delivery_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let body = serde_json::to_vec(&envelope).map_err(StorageError::of)?;
                    let url = sub.target.sink.url().unwrap_or_default().to_owned();
                    let secret = sub.target.sink.secret().map(str::to_owned);
                    let http = self.http.clone();
                    let seq = ev.seq;
                    let expected = scan.cursor.last_sequence;
                    self.busy.insert(id.clone(), seq);
                    self.inflight.spawn(async move {
                        // The time of this attempt: a retry is signed anew.
                        let timestamp = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or(0);
                        let mut rb = http
                            .post(&url)
                            .header("content-type", "application/json")
                            .header("webhook-id", &webhook_id)
                            .header("webhook-timestamp", timestamp.to_string());
                        if let Some(secret) = &secret {
                            let sig = Signatures::new(secret, &webhook_id, timestamp, &body);
                            rb = rb
                                .header("webhook-signature", sig.standard)
                                .header("tidemark-signature", sig.legacy);
                        }
                        let r = match rb.body(body).send().await {
                            Ok(resp) if resp.status().is_success() => Ok(()),
                            Ok(resp) => Err(Failed {
                                error: format!("webhook answered {}", resp.status()),
                                code: format!("http_{}", resp.status().as_u16()),
                                retry_after_ms: receiver_retry_after_ms(
                                    resp.status().as_u16(),
                                    resp.headers()
                                        .get(reqwest::header::RETRY_AFTER)
                                        .and_then(|v| v.to_str().ok()),
                                ),
                            }),
                            Err(e) => Err(Failed {
                                error: format!("webhook unreachable: {}", without_url(&e)),
                                code: if e.is_timeout() {
                                    "http_timeout"
                                } else {
                                    "http_connection"
                                }
                                .to_owned(),
                                retry_after_ms: None,
                            }),
                        };
                        (id, seq, expected, r)
                    });
                }
            }
        }
        Ok(())
    }
}

impl Notifier {
    /// Whether webhook subscription `sub`'s endpoint holds its POSTs now (section 17): an
    /// operator disabled it (its enable brings the subscription back), or its circuit is open
    /// and the probe's time has not come (a retry is set for it). Past that time the POST goes
    /// out as the probe.
    async fn held(&mut self, te: &Engine, sub: &Subscription) -> Result<bool, StorageError> {
        let e = te.clone();
        let k = key(te, &sub.subscription_id);
        let id = k.1.clone();
        let endpoint = tokio::task::spawn_blocking(move || {
            e.read()
                .unwaited()
                .bridge_endpoint(&id)
                .map_err(StorageError::from)
        })
        .await
        .map_err(StorageError::of)??;
        let Some(endpoint) = endpoint.filter(|e| e.held()) else {
            return Ok(false);
        };
        let Some(probe_at) = endpoint.probe_at() else {
            // Disabled: no retry until its `endpoint.enabled` brings the subscription back
            // (a retry due now would look at it again at once, and again).
            if let Some(r) = self.retries.get_mut(&k) {
                r.next = None;
            }
            return Ok(true);
        };
        let wait_us = probe_at.saturating_sub(self.engine.now_us());
        if wait_us > 0 {
            let r = self.retries.entry(k).or_default();
            r.next = Some(Instant::now() + Duration::from_micros(wait_us as u64));
            return Ok(true);
        }
        self.probing.insert(k);
        Ok(false)
    }
}

/// After a failed POST of `sub` whose `cursor.failed` is in the log: the circuit's event, if
/// it calls for one, decided by the engine on the endpoint as the models have it
/// ([`tidemark_engine::commands::outbox::BridgeFailed`]).
async fn circuit_after_failure(engine: &Engine, sub: &Subscription, was_probe: bool) {
    let r = engine
        .execute(tidemark_engine::commands::outbox::BridgeFailed {
            subscription_id: sub.subscription_id.to_string(),
            was_probe,
        })
        .await;
    match r {
        Ok((Some(ty), _)) => {
            tracing::info!(subscription = %sub.subscription_id, event = ty.as_str(), "webhook subscription's circuit");
        }
        Ok((None, _)) => {}
        Err(e) => {
            tracing::warn!(subscription = %sub.subscription_id, error = %e, "recording the webhook's circuit failed");
        }
    }
}

/// What a node does for a subscription after its scan, beyond the pull cache every node
/// keeps (the notifier's decision table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act<D, M> {
    /// Nothing: another node holds the subscription's lease.
    Leave,
    /// Record the mismatch the subscription is stopped at and send nothing (I5).
    Mismatch(M),
    /// POST the next event to the webhook.
    Post(D),
    /// Nothing to send: caught up, deferred, or a pull sink (its bridge acks what it takes).
    Wait,
}

/// [`Act`] for a subscription whose lease this node holds or not, on a webhook sink or not,
/// with the scan's event to deliver and its mismatch (a mismatch comes first: nothing is sent
/// past one).
fn act_on<D, M>(
    holds_lease: bool,
    webhook: bool,
    deliver: Option<D>,
    mismatch: Option<M>,
) -> Act<D, M> {
    match (holds_lease, mismatch, deliver) {
        (false, _, _) => Act::Leave,
        (true, Some(m), _) => Act::Mismatch(m),
        (true, None, Some(d)) if webhook => Act::Post(d),
        (true, None, _) => Act::Wait,
    }
}

impl Retry {
    /// Count a failed attempt at `seq` (a new seq starts the count over): the attempts made.
    fn failed(&mut self, seq: u64) -> u32 {
        if self.seq != seq {
            *self = Retry {
                seq,
                ..Retry::default()
            };
        }
        self.attempts += 1;
        self.attempts
    }
}

/// Why a webhook POST failed, and the wait its receiver asked for.
#[derive(Debug)]
struct Failed {
    error: String,
    /// `http_<status>`, `http_timeout` or `http_connection`, as the webhook sink's.
    code: String,
    retry_after_ms: Option<u64>,
}

/// A reqwest error without its URL (a webhook URL may carry credentials).
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_request() {
        "request error"
    } else {
        "error"
    };
    kind.to_owned()
}

/// Whether `ev` may change what a bridge subscription has to do (a task, subscription or
/// cursor event): the pages the follower hands the notifier.
pub(crate) fn concerns(ev: &tidemark_log::EventRef<'_>) -> bool {
    match Stream::parse(ev.stream) {
        Some(Stream::TaskEvents | Stream::Bridges | Stream::Cursors) => true,
        // A webhook subscription's endpoint switched or its circuit moved.
        Some(Stream::Endpoints) => ids::subscription_of_endpoint(ev.subject).is_some(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{Act, Retry, act_on};

    #[test]
    fn the_notifiers_decision_table() {
        type A = Act<&'static str, &'static str>;
        type Row = (bool, bool, Option<&'static str>, Option<&'static str>, A);
        let (ev, mm) = (Some("ev"), Some("mismatch"));
        // (holds the lease, webhook, deliver, mismatch) → what the node does.
        let table: [Row; 10] = [
            (false, true, ev, None, Act::Leave),
            (false, true, None, mm, Act::Leave),
            (false, false, ev, None, Act::Leave),
            (true, true, ev, None, Act::Post("ev")),
            (true, true, None, None, Act::Wait),
            (true, true, None, mm, Act::Mismatch("mismatch")),
            (true, true, ev, mm, Act::Mismatch("mismatch")),
            (true, false, ev, None, Act::Wait),
            (true, false, None, mm, Act::Mismatch("mismatch")),
            (true, false, None, None, Act::Wait),
        ];
        for (holds, webhook, deliver, mismatch, want) in table {
            assert_eq!(
                act_on(holds, webhook, deliver, mismatch),
                want,
                "holds {holds}, webhook {webhook}, deliver {deliver:?}, mismatch {mismatch:?}"
            );
        }
    }

    #[test]
    fn retries_count_per_seq() {
        let mut r = Retry::default();
        assert_eq!(r.failed(7), 1);
        assert_eq!(r.failed(7), 2);
        assert_eq!(r.failed(7), 3);
        // The next seq starts over; so does a return to an earlier one.
        assert_eq!(r.failed(9), 1);
        assert_eq!(r.failed(7), 1);
    }
}
