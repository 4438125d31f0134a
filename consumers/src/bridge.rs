//! The bridge terminal notifier (spec section 6): for each active subscription, replay its
//! task's `task_events` past the subscription's cursor and decide deliver / defer / mismatch
//! for each terminal event against the task's current state.
//!
//! - deliver: a pull sink shows the envelope to `GET /v1/bridges/{bridge_id}/deliveries` until
//!   the bridge acks it; a webhook sink gets it POSTed (HMAC-signed). Only a confirmation moves
//!   the cursor ([`confirm`], a command that re-checks the decision inside the writer), and the
//!   scan then goes on.
//! - defer: scanned past, the cursor does not move for it.
//! - mismatch: the subscription stops there; one `notification.terminal_state_mismatch`
//!   (event id `mismatch:<subscription_id>:<seq>`) records it; the next replay after new task
//!   events or a cursor reset decides afresh.
//!
//! Commits wake the notifier; the wake-up is only a nudge, the log is the authority.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use tidemark_engine::Engine;
use tidemark_engine::commands::{BridgeCommand, Confirmation};
use tidemark_log::{AppendError, CommandError, Event, EventLog, NewEvent, ReadQuery};
use tidemark_projections::bridges::{self, Decision, Subscription};
use tidemark_projections::cursors::{self, Cursor};
use tidemark_projections::routing::{RoutingSettings, backoff_ms};
use tidemark_projections::tasks::Task;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Candidates examined per scan (explain lists at most this many).
pub const SCAN_LIMIT: usize = 1_000;

/// One event past the cursor and what the notifier decides for it.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub seq: u64,
    pub event_type: String,
    pub decision: Decision,
    pub reason: String,
}

/// A subscription's position: its cursor, and what the next step is.
#[derive(Debug, Clone)]
pub struct Scan {
    pub cursor: Cursor,
    /// Every terminal candidate past the cursor, in order, up to the first deliver or mismatch
    /// (or all of them when `all`).
    pub candidates: Vec<Candidate>,
    /// The event to deliver next, if the scan reached one before any mismatch.
    pub deliver: Option<Event>,
    /// The event the subscription is stopped at, with the reason.
    pub mismatch: Option<(Event, String)>,
    /// The task's latest_event_seq when scanned.
    pub task_seq: u64,
}

/// Replay `sub`'s task events past its cursor and decide (blocking: redb reads).
pub fn scan(engine: &Engine, sub: &Subscription, all: bool) -> Result<Scan, String> {
    let task_id = &sub.target.task_id;
    let cursor = engine.read().cursor(
        &bridges::consumer_id(&sub.subscription_id),
        "task_events",
        task_id,
    )?;
    let task: Option<Task> = engine.read().task(task_id)?;
    let mut out = Scan {
        task_seq: task.as_ref().map(|t| t.latest_event_seq).unwrap_or(0),
        cursor,
        candidates: Vec::new(),
        deliver: None,
        mismatch: None,
    };
    let mut after = out.cursor.last_sequence;
    loop {
        let page = engine
            .log()
            .read(&ReadQuery {
                after,
                limit: 500,
                stream: Some("task_events".into()),
                subject: Some(task_id.clone()),
                ..ReadQuery::default()
            })
            .map_err(|e| e.to_string())?;
        for ev in page.events {
            let (decision, reason) = bridges::decide(task.as_ref(), &ev);
            if decision == Decision::Skip {
                continue;
            }
            out.candidates.push(Candidate {
                seq: ev.seq,
                event_type: ev.event_type.clone(),
                decision: decision.clone(),
                reason: reason.clone(),
            });
            let stop = match decision {
                Decision::Deliver if out.deliver.is_none() && out.mismatch.is_none() => {
                    out.deliver = Some(ev);
                    true
                }
                Decision::Mismatch if out.deliver.is_none() && out.mismatch.is_none() => {
                    out.mismatch = Some((ev, reason));
                    true
                }
                _ => false,
            };
            if (stop && !all) || out.candidates.len() >= SCAN_LIMIT {
                return Ok(out);
            }
        }
        if page.next_after <= after || page.next_after >= page.head {
            return Ok(out);
        }
        after = page.next_after;
    }
}

/// Confirm deliveries in one command (one durable commit, one fold): inside the writer, each
/// re-reads its event and task, requires the decision to still be deliver and the cursor to be
/// where the caller saw it (or already there with this delivery id), and advances. Each item
/// is answered on its own; a refused item changes nothing.
pub async fn confirm_many(
    engine: &Engine,
    items: Vec<Confirmation>,
) -> Result<Vec<Result<Cursor, CommandError>>, CommandError> {
    let results = engine
        .execute(BridgeCommand::Confirm(items))
        .await?
        .0
        .into_confirmed()?;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    metrics::counter!("tidemark_bridge_confirmed_total").increment(ok as u64);
    Ok(results)
}

/// Confirm delivery `seq` of `sub` ([`confirm_many`] of one). `Conflict` when the decision or
/// the cursor changed.
pub async fn confirm(
    engine: &Engine,
    sub: &Subscription,
    seq: u64,
    expected: Option<u64>,
) -> Result<Cursor, CommandError> {
    let c = Confirmation {
        subscription_id: sub.subscription_id.clone(),
        task_id: sub.target.task_id.clone(),
        seq,
        expected,
    };
    confirm_many(engine, vec![c])
        .await?
        .pop()
        .unwrap_or_else(|| Err(CommandError::Storage("confirm answered nothing".into())))
}

/// Record a failed delivery attempt as the subscription cursor's `last_error`.
pub async fn record_failure(
    engine: &Engine,
    sub: &Subscription,
    error: &str,
) -> Result<(), CommandError> {
    let ev = tidemark_engine::commands::cursors::failed_event(
        &bridges::consumer_id(&sub.subscription_id),
        "task_events",
        &sub.target.task_id,
        error,
        engine.now_us(),
    )?;
    engine.log().append(vec![ev]).await?;
    Ok(())
}

/// Append the one mismatch event of (subscription, seq).
async fn record_mismatch(engine: &Engine, sub: &Subscription, ev: &Event, reason: &str) {
    let id = format!("mismatch:{}:{}", sub.subscription_id, ev.seq);
    let payload = serde_json::json!({
        "subscription_id": sub.subscription_id,
        "seq": ev.seq,
        "detail": cursors::bound_error(&format!("{} at seq {}: {reason}", ev.event_type, ev.seq)),
    });
    let Ok(new) = NewEvent::new(
        Some(id),
        "task_events",
        sub.target.task_id.as_str(),
        "notification.terminal_state_mismatch",
        &payload,
    ) else {
        return;
    };
    match engine.log().append(vec![new]).await {
        Ok(r) => {
            if r.events.iter().any(|e| !e.duplicate) {
                metrics::counter!("tidemark_bridge_mismatches_total").increment(1);
                tracing::warn!(subscription = %sub.subscription_id, seq = ev.seq, %reason, "terminal state mismatch");
            }
        }
        // Recorded earlier with another detail: it is recorded.
        Err(AppendError::Conflict { .. }) => {}
        Err(e) => tracing::warn!(error = %e, "recording a mismatch failed; will retry"),
    }
}

/// `sha256=<hex HMAC-SHA256 of body under secret>`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Pull-sink state shared by the notifier and the HTTP handlers: per bridge, the envelope each
/// pull subscription has pending (as of the notifier's last look at it) and a wake-up counter
/// for long-polls. The notifier updates an entry whenever the log changes anything the entry
/// depends on (the task, the cursor, the subscription), then bumps the bridge, so a long-poll
/// costs nothing until its own bridge has news. An ack lowers nothing: it raises the
/// subscription's floor, so an entry computed before the ack is never served after it.
#[derive(Clone)]
pub struct PullHub(
    std::sync::Arc<std::sync::Mutex<Hub>>,
    /// The log head the notifier's last completed pass looked at.
    tokio::sync::watch::Sender<u64>,
);

impl Default for PullHub {
    fn default() -> Self {
        PullHub(Default::default(), tokio::sync::watch::channel(0).0)
    }
}

#[derive(Default)]
struct Hub {
    /// Set after the notifier's first full pass; before it, handlers compute from the log.
    ready: bool,
    wake: HashMap<String, tokio::sync::watch::Sender<u64>>,
    /// bridge → subscription → (seq, envelope).
    pending: HashMap<String, std::collections::BTreeMap<String, (u64, serde_json::Value)>>,
    /// subscription → highest seq acked through the API.
    floor: HashMap<String, u64>,
}

impl PullHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, Hub> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that changes when `bridge_id` may have something new.
    pub fn subscribe(&self, bridge_id: &str) -> tokio::sync::watch::Receiver<u64> {
        self.lock()
            .wake
            .entry(bridge_id.to_owned())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }

    /// Wait (at most `limit`) until the notifier has looked at the log up to `head`; `false`
    /// when it has not by then.
    pub async fn caught_up(&self, head: u64, limit: std::time::Duration) -> bool {
        let mut rx = self.1.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|seen| *seen >= head))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The bridge's pending envelopes, or `None` until the notifier has looked at everything.
    pub fn pending(&self, bridge_id: &str) -> Option<Vec<serde_json::Value>> {
        let h = self.lock();
        if !h.ready {
            return None;
        }
        Some(
            h.pending
                .get(bridge_id)
                .map(|m| m.values().map(|(_, v)| v.clone()).collect())
                .unwrap_or_default(),
        )
    }

    /// A delivery was acked through the API: never serve it (or anything before it) again.
    pub fn acked(&self, bridge_id: &str, subscription_id: &str, seq: u64) {
        let mut h = self.lock();
        let f = h.floor.entry(subscription_id.to_owned()).or_insert(0);
        *f = (*f).max(seq);
        if let Some(m) = h.pending.get_mut(bridge_id)
            && m.get(subscription_id).is_some_and(|(s, _)| *s <= seq)
        {
            m.remove(subscription_id);
        }
    }

    fn set(&self, sub: &Subscription, entry: Option<(u64, serde_json::Value)>) {
        let mut h = self.lock();
        let floor = h.floor.get(&sub.subscription_id).copied().unwrap_or(0);
        let m = h.pending.entry(sub.target.bridge_id.clone()).or_default();
        match entry {
            Some((seq, v)) if seq > floor => {
                m.insert(sub.subscription_id.clone(), (seq, v));
            }
            _ => {
                m.remove(&sub.subscription_id);
            }
        }
    }

    /// The subscription is gone, or its cursor was reset (the floor no longer holds).
    fn forget(&self, subscription_id: &str, reset: bool) {
        let mut h = self.lock();
        for m in h.pending.values_mut() {
            m.remove(subscription_id);
        }
        if reset {
            h.floor.remove(subscription_id);
        }
    }

    fn set_ready(&self) {
        self.lock().ready = true;
    }

    fn seen(&self, head: u64) {
        self.1.send_if_modified(|s| {
            let changed = head > *s;
            *s = (*s).max(head);
            changed
        });
    }

    fn bump(&self, bridge_id: &str) {
        let h = self.lock();
        if let Some(tx) = h.wake.get(bridge_id) {
            tx.send_modify(|n| *n += 1);
        }
    }
}

/// State of one webhook subscription between passes.
#[derive(Default)]
struct Retry {
    attempts: u32,
    next: Option<Instant>,
    /// The seq being retried (a new seq starts over).
    seq: u64,
}

/// Start the notifier; it stops when `shutdown` is cancelled.
pub fn spawn(
    engine: Engine,
    settings: RoutingSettings,
    hub: PullHub,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = match reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "bridge notifier: no HTTP client; webhooks disabled");
                return;
            }
        };
        let mut n = Notifier {
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
        };
        n.run(shutdown).await;
    })
}

struct Notifier {
    engine: Engine,
    http: reqwest::Client,
    settings: RoutingSettings,
    /// The log head the last pass looked at (`None`: look at every subscription).
    scanned_to: Option<u64>,
    retries: HashMap<String, Retry>,
    /// Subscriptions stopped at a mismatch, and those with a deferred event, as last seen.
    stopped: std::collections::HashSet<String>,
    deferred: std::collections::HashSet<String>,
    /// Webhook POSTs in flight: (subscription, seq, cursor when scanned, outcome).
    inflight: JoinSet<(String, u64, u64, Result<(), String>)>,
    hub: PullHub,
    /// Subscriptions with a webhook POST in flight.
    busy: HashMap<String, u64>,
}

impl Notifier {
    async fn run(&mut self, shutdown: CancellationToken) {
        let mut head_rx = self.engine.log().subscribe();
        loop {
            head_rx.borrow_and_update();
            if let Err(e) = self.pass().await {
                tracing::warn!(error = %e, "bridge notifier pass failed; retrying");
                // Look at every subscription again: the failed pass may have skipped some.
                self.scanned_to = None;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let next_retry = self
                .retries
                .values()
                .filter_map(|r| r.next)
                .min()
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                changed = head_rx.changed() => if changed.is_err() { return },
                Some(done) = self.inflight.join_next(), if !self.inflight.is_empty() => {
                    if let Ok(done) = done { self.finished(done).await }
                }
                _ = tokio::time::sleep(next_retry) => {},
                _ = shutdown.cancelled() => {
                    self.inflight.abort_all();
                    return;
                }
            }
        }
    }

    async fn finished(
        &mut self,
        (sub_id, seq, expected, result): (String, u64, u64, Result<(), String>),
    ) {
        self.busy.remove(&sub_id);
        let Ok(Some(sub)) = ({
            let e = self.engine.clone();
            let id = sub_id.clone();
            tokio::task::spawn_blocking(move || e.read().subscription(&id))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }) else {
            return;
        };
        match result {
            Ok(()) => {
                self.retries.remove(&sub_id);
                // Compare-and-swap on the cursor the scan saw: a reset meanwhile wins.
                match confirm(&self.engine, &sub, seq, Some(expected)).await {
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(subscription = %sub_id, seq, error = %e, "webhook delivery confirmed but the cursor did not advance")
                    }
                }
            }
            Err(err) => {
                metrics::counter!("tidemark_bridge_webhook_failures_total").increment(1);
                let r = self.retries.entry(sub_id.clone()).or_default();
                if r.seq != seq {
                    *r = Retry {
                        seq,
                        ..Retry::default()
                    };
                }
                r.attempts += 1;
                let u = rand::random::<f64>();
                let ms = backoff_ms(&self.settings.retry, r.attempts, u, None);
                r.next = Some(Instant::now() + Duration::from_millis(ms));
                tracing::info!(subscription = %sub_id, seq, attempt = r.attempts, retry_in_ms = ms, "webhook delivery failed");
                let _ = record_failure(&self.engine, &sub, &err).await;
            }
        }
    }

    /// Subscriptions to look at: all of them at the first pass, then those whose task, cursor
    /// or subscription changed in the log since the last pass, and webhook retries now due.
    async fn dirty(&mut self) -> Result<Vec<Subscription>, String> {
        let e = self.engine.clone();
        let since = self.scanned_to;
        let (subs, head, forget) = tokio::task::spawn_blocking(move || {
            let head = e.log().head();
            let Some(since) = since else {
                return Ok::<_, String>((e.read().all_active_subscriptions()?, head, Vec::new()));
            };
            let mut tasks = std::collections::BTreeSet::new();
            let mut ids = std::collections::BTreeSet::new();
            // Subscriptions to drop from the pull cache: (id, its cursor was reset).
            let mut forget: Vec<(String, bool)> = Vec::new();
            let mut after = since;
            while after < head {
                let page = e
                    .log()
                    .read(&ReadQuery {
                        after,
                        limit: 1_000,
                        ..ReadQuery::default()
                    })
                    .map_err(|e| e.to_string())?;
                for ev in &page.events {
                    match ev.stream.as_str() {
                        "task_events" => {
                            tasks.insert(ev.subject.clone());
                        }
                        "bridges" => {
                            ids.insert(ev.subject.clone());
                        }
                        "cursors" => {
                            if let Some(sub) = ev.subject.strip_prefix("bridge_task_subscription:")
                            {
                                ids.insert(sub.to_owned());
                                if ev.event_type == "cursor.reset" {
                                    forget.push((sub.to_owned(), true));
                                }
                            }
                        }
                        _ => {}
                    }
                }
                if page.next_after <= after {
                    break;
                }
                after = page.next_after;
            }
            let mut out: Vec<Subscription> = Vec::new();
            for t in &tasks {
                out.extend(e.read().task_subscriptions(t)?);
            }
            for id in &ids {
                match e.read().subscription(id)? {
                    Some(s) if s.active => {
                        if !tasks.contains(&s.target.task_id) {
                            out.push(s);
                        }
                    }
                    _ => forget.push((id.clone(), false)),
                }
            }
            Ok((out, head, forget))
        })
        .await
        .map_err(|e| e.to_string())??;
        for (id, reset) in &forget {
            self.hub.forget(id, *reset);
            if !reset {
                self.stopped.remove(id);
                self.deferred.remove(id);
            }
        }
        self.scanned_to = Some(head);
        let mut subs = subs;
        let now = Instant::now();
        let due: Vec<String> = self
            .retries
            .iter()
            .filter(|(id, r)| {
                r.next.is_some_and(|t| t <= now) && !subs.iter().any(|s| &s.subscription_id == *id)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let e = self.engine.clone();
            let found = tokio::task::spawn_blocking(move || e.read().subscription(&id))
                .await
                .map_err(|e| e.to_string())??;
            match found {
                Some(s) if s.active => subs.push(s),
                Some(s) => {
                    self.retries.remove(&s.subscription_id);
                }
                None => {}
            }
        }
        Ok(subs)
    }

    /// One look at the subscriptions that may have something to do.
    async fn pass(&mut self) -> Result<(), String> {
        let full = self.scanned_to.is_none();
        let started = Instant::now();
        let subs = self.dirty().await?;
        metrics::histogram!("tidemark_bridge_notifier_dirty_subscriptions")
            .record(subs.len() as f64);
        let mut bridges_touched = std::collections::BTreeSet::new();
        for s in &subs {
            if s.target.sink.kind == "pull" {
                bridges_touched.insert(s.target.bridge_id.clone());
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
        for b in &bridges_touched {
            self.hub.bump(b);
        }
        metrics::histogram!("tidemark_bridge_notifier_pass_seconds")
            .record(started.elapsed().as_secs_f64());
        r
    }

    async fn look_at(&mut self, subs: Vec<Subscription>) -> Result<(), String> {
        let r = self.look_at_each(subs).await;
        // The decisions in force, for dashboards (the same as `…/explain`, in aggregate).
        metrics::gauge!("tidemark_bridge_subscriptions_stopped").set(self.stopped.len() as f64);
        metrics::gauge!("tidemark_bridge_subscriptions_deferring").set(self.deferred.len() as f64);
        metrics::gauge!("tidemark_bridge_webhooks_retrying").set(self.retries.len() as f64);
        r
    }

    async fn look_at_each(&mut self, subs: Vec<Subscription>) -> Result<(), String> {
        let now = Instant::now();
        let subs: Vec<Subscription> = subs
            .into_iter()
            .filter(|s| {
                !self.busy.contains_key(&s.subscription_id)
                    && self
                        .retries
                        .get(&s.subscription_id)
                        .is_none_or(|r| r.next.is_none_or(|t| t <= now))
            })
            .collect();
        // Scan in chunks, each in one blocking task (a burst of task events can dirty
        // thousands of subscriptions at once).
        for chunk in subs.chunks(256) {
            let e = self.engine.clone();
            let chunk = chunk.to_vec();
            let scanned = tokio::task::spawn_blocking(move || {
                chunk
                    .into_iter()
                    .map(|s| scan(&e, &s, false).map(|r| (s, r)))
                    .collect::<Result<Vec<_>, String>>()
            })
            .await
            .map_err(|e| e.to_string())??;
            for (sub, scan) in scanned {
                self.act(sub, scan).await?;
            }
        }
        Ok(())
    }

    /// Act on one subscription's scan.
    async fn act(&mut self, sub: Subscription, scan: Scan) -> Result<(), String> {
        let id = sub.subscription_id.clone();
        {
            if sub.target.sink.kind == "pull" {
                let entry = scan
                    .deliver
                    .as_ref()
                    .map(|ev| (ev.seq, bridges::envelope(&sub, ev)));
                self.hub.set(&sub, entry);
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
            if let Some((ev, reason)) = &scan.mismatch {
                self.stopped.insert(id.clone());
                record_mismatch(&self.engine, &sub, ev, reason).await;
                return Ok(());
            }
            self.stopped.remove(&id);
            // A pull sink's envelope waits for the bridge's ack; a webhook's is POSTed.
            if let (Some(ev), "webhook") = (&scan.deliver, sub.target.sink.kind.as_str()) {
                {
                    let body = serde_json::to_vec(&bridges::envelope(&sub, ev))
                        .map_err(|e| e.to_string())?;
                    let url = sub.target.sink.url.clone().unwrap_or_default();
                    let sig = sub
                        .target
                        .sink
                        .secret
                        .as_deref()
                        .map(|s| signature(s, &body));
                    let http = self.http.clone();
                    let seq = ev.seq;
                    let expected = scan.cursor.last_sequence;
                    self.busy.insert(id.clone(), seq);
                    self.inflight.spawn(async move {
                        let mut rb = http
                            .post(&url)
                            .header("content-type", "application/json")
                            .body(body);
                        if let Some(sig) = sig {
                            rb = rb.header("tidemark-signature", sig);
                        }
                        let r = match rb.send().await {
                            Ok(resp) if resp.status().is_success() => Ok(()),
                            Ok(resp) => Err(format!("webhook answered {}", resp.status())),
                            Err(e) => Err(format!("webhook unreachable: {}", without_url(&e))),
                        };
                        (id, seq, expected, r)
                    });
                }
            }
        }
        Ok(())
    }
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
