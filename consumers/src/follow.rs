//! The one follower: it hands each new page of the log to every reactor, taking it from what
//! the decider read of it ([`tidemark_engine::pages`]) when it can, else reading the log.
//!
//! Reactors keep their own checkpoints (the router's and routing's are in the read models, the
//! notifier's is the head it last looked at) and skip what a page holds at or before theirs;
//! the follower starts at the lowest of them. A chunk handed on wakes it (a commit too, while
//! the decider does not keep up), but the wake-up is only a nudge: it takes its page from a
//! chunk that holds it, or reads the log. A commit with nothing for any reactor wakes no one
//! ([`tidemark_engine::pages::Pages::set_interest`]); the follower passes over it as an empty
//! page when a later one wakes it.
//! Each reactor has a small bounded queue, so a slow one holds the follower back instead of
//! letting pages pile up.

use std::sync::Arc;
use std::time::Duration;

use tidemark_engine::Engine;
use tidemark_log::{Event, EventLog, EventRef, ReadQuery, StorageError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Events read per page.
const PAGE: usize = 1_000;
/// Pages queued per reactor.
const QUEUE: usize = 2;
/// How long the follower waits for the decider's read of new commits before it reads them
/// itself.
const FALLBACK: Duration = Duration::from_millis(200);

/// One page of the log, shared by every reactor.
#[derive(Debug)]
pub struct Page {
    /// Committed events in seq order.
    pub events: Vec<Event>,
    /// The page covers the log after this seq ...
    pub after: u64,
    /// ... through this seq.
    pub upto: u64,
}

impl Page {
    /// Whether any event of the page is one `f` looks for.
    pub fn any(&self, f: impl Fn(&tidemark_log::EventRef<'_>) -> bool) -> bool {
        self.events.iter().any(|e| f(&e.as_ref()))
    }
}

/// A reactor's end of the follower.
pub type Feed = mpsc::Receiver<Arc<Page>>;

/// The follower before it runs: reactors subscribe with the checkpoint they resume from.
pub struct Follower {
    engine: Engine,
    from: Option<u64>,
    feeds: Vec<(mpsc::Sender<Arc<Page>>, Wants)>,
    nudges: Vec<(Wants, Nudge)>,
    observers: Vec<Observer>,
}

/// What reads each page in passing, on the follower's own task (cheap work only: the server
/// log's account of a page, [`crate::oplog`]).
pub type Observer = Box<dyn Fn(&Page) + Send + Sync>;

/// What a page a reactor wants calls, instead of queueing the page for it: for a reactor that
/// only needs to know that something happened (it reads the models itself), so that it never
/// holds the follower back.
pub type Nudge = Box<dyn Fn() + Send + Sync>;

/// Whether a reactor has anything to do with a page: a page it does not want is not sent to
/// it (the reactor is not woken). Only for reactors whose progress does not depend on seeing
/// every page: the router and routing keep their checkpoints in the read models, and a live
/// stream reads the log itself.
pub type Wants = Box<dyn Fn(&Page) -> bool + Send + Sync>;

impl Follower {
    pub fn new(engine: Engine) -> Follower {
        Follower {
            engine,
            from: None,
            feeds: Vec::new(),
            nudges: Vec::new(),
            observers: Vec::new(),
        }
    }

    /// Call `nudge` for each page from now on that `wants` (a page is not queued for it).
    pub fn nudge_if(&mut self, wants: Wants, nudge: Nudge) {
        self.nudges.push((wants, nudge));
    }

    /// Call `observe` with each page from now on.
    pub fn observe(&mut self, observe: Observer) {
        self.observers.push(observe);
    }

    /// A feed of every page after `after`.
    pub fn subscribe(&mut self, after: u64) -> Feed {
        self.subscribe_if(after, Box::new(|_| true))
    }

    /// A feed of the pages after `after` that `wants`.
    pub fn subscribe_if(&mut self, after: u64, wants: Wants) -> Feed {
        let (tx, rx) = mpsc::channel(QUEUE);
        self.feeds.push((tx, wants));
        self.from = Some(self.from.map_or(after, |f| f.min(after)));
        rx
    }

    /// Follow the log from the lowest checkpoint on, page by page, until `shutdown` or until
    /// every reactor has gone. A page is what the decider read of the new commits when it
    /// holds what comes next (each commit read once between the models and the reactors); the
    /// follower reads the log itself to catch up, when the decider is behind it, or when the
    /// decider's read does not come within [`FALLBACK`] (its models failing, say).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut after = self.from.unwrap_or(0);
        let mut head_rx = self.engine.log().subscribe();
        let mut pages_rx = self.engine.pages().subscribe();
        let mut backoff = Duration::from_millis(100);
        tracing::info!(after, reactors = self.feeds.len(), "log follower started");
        loop {
            head_rx.borrow_and_update();
            pages_rx.borrow_and_update();
            let page = match self.shared(after) {
                Some(p) => p,
                None => {
                    let head = self.engine.log().head();
                    if head <= after {
                        // At the head: while the decider keeps up, its read of the next commit
                        // is what wakes the follower (one wake-up per commit, not two); the
                        // log's head only when it does not.
                        let alone = !self.engine.pages().keeping_up();
                        tokio::select! {
                            changed = head_rx.changed(), if alone => if changed.is_err() { return },
                            _ = pages_rx.changed() => {},
                            _ = shutdown.cancelled() => return,
                        }
                        continue;
                    }
                    if self.engine.pages().published() == after {
                        // The decider keeps up: its read of the new commits comes in a moment.
                        tokio::select! {
                            _ = pages_rx.changed() => continue,
                            _ = tokio::time::sleep(FALLBACK) => {},
                            _ = shutdown.cancelled() => return,
                        }
                        if self.engine.pages().covering(after).is_some() {
                            continue;
                        }
                    }
                    match self.read(after).await {
                        Ok(p) => {
                            backoff = Duration::from_millis(100);
                            p
                        }
                        Err(e) => {
                            // A compaction (retention, section 13) overtook the follower:
                            // what the window dropped is behind every reactor's duty, as at
                            // start (`spawn`); go on from the first event the log keeps.
                            let e2 = self.engine.clone();
                            let first = tokio::task::spawn_blocking(move || e2.first_seq())
                                .await
                                .ok()
                                .and_then(Result::ok);
                            if let Some(first) = first
                                && first > after + 1
                            {
                                tracing::warn!(
                                    after,
                                    first_seq = first,
                                    "the log was compacted past the follower; following from its first retained event"
                                );
                                after = first - 1;
                                continue;
                            }
                            tracing::warn!(error = %e, "log follower read failed; retrying");
                            tokio::select! {
                                _ = tokio::time::sleep(backoff) => {},
                                _ = shutdown.cancelled() => return,
                            }
                            backoff = (backoff * 2).min(Duration::from_secs(5));
                            continue;
                        }
                    }
                }
            };
            if page.upto <= after {
                continue;
            }
            let Some(page) = self.placed(page, &shutdown).await else {
                return;
            };
            let p = Arc::new(page);
            after = p.upto;
            for (wants, nudge) in &self.nudges {
                if wants(&p) {
                    nudge();
                }
            }
            for observe in &self.observers {
                observe(&p);
            }
            self.feeds.retain(|(f, _)| !f.is_closed());
            for (f, wants) in &self.feeds {
                if !wants(&p) {
                    continue;
                }
                tokio::select! {
                    // A reactor that stopped no longer gets pages.
                    _ = f.send(p.clone()) => {},
                    _ = shutdown.cancelled() => return,
                }
            }
            if self.feeds.is_empty() {
                return;
            }
        }
    }

    /// `page` as this shard's reactors take it (spec section 20): without the events of a
    /// tenant that lives in another shard (a move's copy here, or what it left behind), nor,
    /// on a cluster, a tenant's events after its fence out of this shard (void: the stream
    /// ordered them after it, every node refused them); and held while it has events of a
    /// tenant being moved here, until the move switches (they are then its own) or fails.
    /// `None` at shutdown.
    async fn placed(&self, mut page: Page, shutdown: &CancellationToken) -> Option<Page> {
        use tidemark_engine::placement::Acts;
        let placement = self.engine.placement();
        let shard = self.engine.shard();
        // A fence in the page counts from its seq on, before any verdict on what follows it.
        for ev in &page.events {
            if let Some(tenant) = fence_of(ev) {
                placement.fenced_at(tenant, shard, ev.seq);
            }
        }
        // Watched only once a page waits (then looked at again, so no change is missed).
        let mut changes = None;
        loop {
            // One verdict a run of one tenant's events, used for both the wait and the cut (a
            // second look could see a fence the first did not, and drop what it must hold);
            // a run is cut at its tenant's fence, past which its events are void.
            let mut verdicts: Vec<(usize, Acts)> = Vec::new();
            for run in page.events.chunk_by(|a, b| a.tenant == b.tenant) {
                let (acts, fence) = placement.verdict(run[0].tenant.as_deref(), shard);
                let valid = fence.map_or(run.len(), |f| run.partition_point(|e| e.seq <= f));
                if valid > 0 {
                    verdicts.push((valid, acts));
                }
                if valid < run.len() {
                    verdicts.push((run.len() - valid, Acts::Elsewhere));
                }
            }
            if verdicts.iter().any(|(_, a)| *a == Acts::Wait) {
                let Some(changes) = changes.as_mut() else {
                    changes = Some(placement.changes());
                    continue;
                };
                tokio::select! {
                    _ = changes.changed() => continue,
                    _ = shutdown.cancelled() => return None,
                }
            }
            if verdicts.iter().any(|(_, a)| *a == Acts::Elsewhere) {
                let mut events = std::mem::take(&mut page.events).into_iter();
                for (n, acts) in verdicts {
                    let run = events.by_ref().take(n);
                    if acts == Acts::Here {
                        page.events.extend(run);
                    } else {
                        run.for_each(drop);
                    }
                }
            }
            return Some(page);
        }
    }

    /// The page after `after` from what the decider read, if it holds it: an empty page
    /// through the end of a quiet range the decider passed over (nothing in it for anyone).
    fn shared(&self, after: u64) -> Option<Page> {
        let Some(chunk) = self.engine.pages().covering(after) else {
            let upto = self.engine.pages().quiet(after)?;
            return Some(Page {
                events: Vec::new(),
                after,
                upto,
            });
        };
        match chunk.events_after(after, PAGE) {
            Ok(events) => {
                metrics::counter!("tidemark_follower_events_shared_total")
                    .increment(events.len() as u64);
                // A page of at most PAGE events: the rest of the chunk is the next page's.
                let upto = match events.last() {
                    Some(last) if events.len() == PAGE => last.seq,
                    _ => chunk.range().1,
                };
                Some(Page {
                    events,
                    after,
                    upto,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "an event the decider read does not decode; reading the log");
                None
            }
        }
    }

    /// A page of the log after `after`, read by the follower itself.
    async fn read(&self, after: u64) -> Result<Page, StorageError> {
        let e = self.engine.clone();
        let q = ReadQuery {
            after,
            limit: PAGE,
            ..ReadQuery::default()
        };
        let page = tokio::task::spawn_blocking(move || e.log().read(&q))
            .await
            .map_err(StorageError::of)?
            .map_err(StorageError::of)?;
        metrics::counter!("tidemark_follower_events_read_total")
            .increment(page.events.len() as u64);
        Ok(Page {
            events: page.events,
            after,
            upto: page.next_after,
        })
    }
}

/// The tenant a move fences out of this shard by `ev`, if it is a fence
/// ([`tidemark_log::MOVE_FENCE_TYPE`]: the default tenant's, in stream `tenants`).
pub fn fence_of(ev: &Event) -> Option<&str> {
    (ev.tenant.is_none()
        && ev.event_type == tidemark_log::MOVE_FENCE_TYPE
        && ev.stream == tidemark_log::MOVE_FENCE_STREAM)
        .then(|| tidemark_log::fenced_tenant(&ev.subject))
        .flatten()
}

/// What the deployment's placement learns from a page: a tenant created or moved (the home
/// shard's directory), or fenced out of a shard (a move's fence). The decider passes over no
/// page that holds one.
pub fn concerns(ev: &EventRef<'_>) -> bool {
    use tidemark_projections::names::EventType;
    ev.tenant.is_none()
        && ev.stream == tidemark_log::MOVE_FENCE_STREAM
        && matches!(
            EventType::parse(ev.event_type),
            Some(EventType::TenantCreated | EventType::TenantMoved | EventType::TenantFenced)
        )
}

/// What the home shard's `ev` tells the deployment's placement: a tenant created, or moved
/// (on a cluster's other nodes, the switch of a move made elsewhere).
pub fn learn_directory(placement: &tidemark_engine::placement::Placement, ev: &Event) {
    use tidemark_projections::names::EventType;
    if ev.tenant.is_some() || ev.stream != tidemark_log::MOVE_FENCE_STREAM {
        return;
    }
    let shard = |field: &str| {
        ev.payload_value()
            .get(field)
            .and_then(serde_json::Value::as_u64)
            .and_then(|s| u32::try_from(s).ok())
    };
    match EventType::parse(&ev.event_type) {
        Some(EventType::TenantCreated) => {
            placement.created(&ev.subject, shard("shard").unwrap_or(0));
        }
        Some(EventType::TenantMoved) => {
            if let (Some(from), Some(to)) = (shard("from"), shard("to")) {
                let through = ev
                    .payload_value()
                    .get("through_seq")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0);
                placement.switched(&ev.subject, from, to, through);
            }
        }
        _ => {}
    }
}
