//! Operational notifications (spec section 17, "Operators told where they already look"): with
//! `[notifications.operational] route = "<name>"`, what an operator must know becomes a
//! notification of type `tidemark.operational` that only that route takes (any sink, any body
//! preset): an endpoint's circuit opened or closed, an endpoint disabled, enabled or
//! unresolved, a delivery parked, a source parked, a bridge subscription stopped at a
//! mismatch, a node's free space near or at its reserve, a node's models poisoned. Each is
//! made from one of the log's own events, with the id `op:<seq>` of that event, so every node
//! that follows the event derives the same notification and the log keeps one.
//!
//! What only one node meets (its disk, its models) no other event says: [`watch_node`]
//! records it as a `node.*` event first. Free space is told as it comes within twice the
//! reserve (`node.space_low`, while appends are still taken), and once appends are taken again
//! after the reserve was reached (`node.space_reserve_reached`, with when and for how long:
//! while the log refuses appends, nothing can be told through it); poisoned models are told at
//! once, and delivered by a node whose decider works (on a single node, after its restart:
//! the notification is in the log, routed when the models take commands again).
//!
//! De-duplicated per endpoint and cause: a circuit that opens again while it is open (its probe
//! failed) says nothing more; it is told open once and closed once. Paced: a park, an
//! unresolved endpoint or a parked source is told at once, and what follows of the same cause
//! and endpoint within `every` (default 5 minutes) is told as one summary at the window's end
//! (`op:<first seq>:more`). Nothing about the operational route itself is told through it.
//!
//! Each tenant is told through its own operational route, of its own events, appended as its
//! own (spec section 20); the node's own (`node.*`) are the default tenant's, in the home
//! shard. Each shard's reactor tells its tenants.
//!
//! Each node follows what is committed from its start on (as the server log's account does):
//! events committed while no node ran are not told, and the circuits open at the start are
//! taken from the models.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::json;
use tidemark_engine::Engine;
use tidemark_log::{AppendError, Event, EventLog, NewEvent, SpaceLevel, SpaceState};
use tidemark_projections::endpoints::EndpointChange;
use tidemark_projections::names::{EventType, Stream};
use tidemark_projections::routing::{OPERATIONAL_TYPE, Operational};
use tokio_util::sync::CancellationToken;

use crate::follow::Feed;
use crate::oplog::{Transition, cause};

/// Whether `ev` may tell an operator something (read by type only).
pub(crate) fn concerns(ev: &tidemark_log::EventRef<'_>) -> bool {
    matches!(
        EventType::parse(ev.event_type),
        Some(
            EventType::DeliveryAttemptFailed
                | EventType::DeliveryLeaseExpired
                | EventType::EndpointCircuitOpened
                | EventType::EndpointCircuitClosed
                | EventType::EndpointDisabled
                | EventType::EndpointEnabled
                | EventType::EndpointUnresolved
                | EventType::SourceParked
                | EventType::NotificationTerminalStateMismatch
                | EventType::NodeSpaceLow
                | EventType::NodeSpaceReserveReached
                | EventType::NodeSpaceRecovered
                | EventType::NodeModelsPoisoned
        )
    )
}

/// One cause of one endpoint (or source) being told in a window.
#[derive(Debug, Clone)]
struct Window {
    /// Event time the window ends (the first event's time + `every`).
    until_us: i64,
    first_seq: u64,
    /// What came after the first, untold yet.
    more: u64,
    what: &'static str,
    key: String,
}

/// What the reactor keeps between events.
#[derive(Default)]
pub(crate) struct Told {
    /// Endpoints whose circuit was told open and not told closed.
    open: HashSet<String>,
    /// Nodes told low on space and not told recovered.
    low: HashSet<String>,
    windows: HashMap<(&'static str, String), Window>,
}

/// A notification of `tidemark.operational`.
fn note(id: String, priority: &str, title: String, body: String) -> Option<NewEvent> {
    let title: String = title.chars().take(200).collect();
    let body: String = body.chars().take(2000).collect();
    NewEvent::new(
        Some(id.clone()),
        Stream::Notifications,
        id,
        EventType::NotificationRequested,
        &json!({"priority": priority, "title": title, "body": body, "type": OPERATIONAL_TYPE}),
    )
    .ok()
}

impl Told {
    /// Start from the circuits the models show open.
    pub(crate) fn with_open(open: impl IntoIterator<Item = String>) -> Told {
        Told {
            open: open.into_iter().collect(),
            ..Told::default()
        }
    }

    /// Told at once when it is the first of its cause and key in a window; counted into the
    /// window's summary otherwise.
    fn paced(
        &mut self,
        ev: &Event,
        what: &'static str,
        key: &str,
        every_ms: u64,
        first: impl FnOnce() -> Option<NewEvent>,
    ) -> Option<NewEvent> {
        let slot = (what, key.to_owned());
        match self.windows.get_mut(&slot) {
            Some(w) if ev.time_us < w.until_us => {
                w.more += 1;
                None
            }
            _ => {
                self.windows.insert(
                    slot,
                    Window {
                        until_us: ev.time_us.saturating_add(every_ms as i64 * 1_000),
                        first_seq: ev.seq,
                        more: 0,
                        what,
                        key: key.to_owned(),
                    },
                );
                first()
            }
        }
    }

    /// The summaries of the windows ended by `now_us` (event time), each once.
    pub(crate) fn ended(&mut self, now_us: i64, every_ms: u64) -> Vec<NewEvent> {
        let done: Vec<(&'static str, String)> = self
            .windows
            .iter()
            .filter(|(_, w)| w.until_us <= now_us)
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::new();
        for k in done {
            let Some(w) = self.windows.remove(&k) else {
                continue;
            };
            if w.more == 0 {
                continue;
            }
            let mins = every_ms / 60_000;
            let span = if mins >= 1 {
                format!("{mins} min")
            } else {
                format!("{} s", every_ms / 1_000)
            };
            out.extend(note(
                format!("op:{}:more", w.first_seq),
                "warning",
                format!("{} more: {} {}", w.more, w.what, w.key),
                format!(
                    "{} more of the same ({} {}) in the {span} after the one told at seq {}",
                    w.more, w.what, w.key, w.first_seq
                ),
            ));
        }
        out
    }

    /// Follow what `ev` does to the circuits, telling nothing (no route is configured).
    fn follow(&mut self, ev: &Event) {
        match EventType::parse(&ev.event_type) {
            Some(EventType::EndpointCircuitOpened) => {
                self.open.insert(ev.subject.clone());
            }
            Some(EventType::EndpointCircuitClosed | EventType::EndpointEnabled) => {
                self.open.remove(&ev.subject);
            }
            Some(EventType::NodeSpaceLow) => {
                self.low.insert(ev.subject.clone());
            }
            Some(EventType::NodeSpaceRecovered) => {
                self.low.remove(&ev.subject);
            }
            _ => {}
        }
    }

    /// When the earliest window ends (event time).
    pub(crate) fn next_end(&self) -> Option<i64> {
        self.windows.values().map(|w| w.until_us).min()
    }

    /// The notification `ev` makes under `op`, if any.
    pub(crate) fn derive(&mut self, ev: &Event, op: &Operational) -> Option<NewEvent> {
        let ty = EventType::parse(&ev.event_type)?;
        let id = format!("op:{}", ev.seq);
        match ty {
            EventType::DeliveryAttemptFailed | EventType::DeliveryLeaseExpired => {
                let t: Transition = serde_json::from_str(ev.payload.get()).unwrap_or_default();
                if t.parked != Some(true) {
                    return None;
                }
                // `dlv:<notification id>:<route>`.
                let route = ev.subject.rsplit_once(':').map(|(_, r)| r)?;
                if route == op.route {
                    return None;
                }
                let code = t.error_code.clone().unwrap_or_else(|| {
                    if ty == EventType::DeliveryLeaseExpired {
                        "lease_expired".into()
                    } else {
                        "failed".into()
                    }
                });
                let subject = ev.subject.clone();
                self.paced(ev, "deliveries parked on route", route, op.every_ms, || {
                    note(
                        id,
                        "warning",
                        format!("Delivery parked on route {route}: {code}"),
                        format!(
                            "{subject} parked ({}): {}. It waits for an operator's retry or \
                             discard.",
                            t.reason.as_deref().unwrap_or(&code),
                            cause(t.error.as_deref())
                        ),
                    )
                })
            }
            EventType::SourceParked => {
                let source = ev.subject.as_str();
                let error = ev.payload_value()["error"].as_str().map(str::to_owned);
                self.paced(ev, "parks of source", source, op.every_ms, || {
                    note(
                        id,
                        "warning",
                        format!("Source {source} parked"),
                        format!(
                            "It polls no more until it is resumed: {}",
                            cause(error.as_deref())
                        ),
                    )
                })
            }
            EventType::NotificationTerminalStateMismatch => {
                let p = ev.payload_value();
                let sub = p["subscription_id"].as_str()?.to_owned();
                let at = p["seq"].as_u64().unwrap_or(0);
                let detail = p["detail"].as_str().map(str::to_owned);
                self.paced(
                    ev,
                    "stops of bridge subscription",
                    &sub,
                    op.every_ms,
                    || {
                        note(
                            id,
                            "warning",
                            format!("Bridge subscription {sub} stopped at seq {at}"),
                            format!(
                                "{}. It sends nothing past that event until its cursor is reset.",
                                cause(detail.as_deref())
                            ),
                        )
                    },
                )
            }
            EventType::NodeSpaceLow
            | EventType::NodeSpaceReserveReached
            | EventType::NodeSpaceRecovered
            | EventType::NodeModelsPoisoned => {
                let node = ev.subject.as_str();
                let p = ev.payload_value();
                let mib = |f: &str| p[f].as_u64().unwrap_or(0) / (1 << 20);
                let (free, reserve) = (mib("available"), mib("min_free"));
                match ty {
                    EventType::NodeSpaceLow => {
                        if !self.low.insert(node.to_owned()) {
                            return None;
                        }
                        note(
                            id,
                            "warning",
                            format!("Node {node}: free space low ({free} MiB)"),
                            format!(
                                "{free} MiB is free where the log is kept; under {reserve} MiB \
                                 (its reserve, [log] min_free) it refuses appends. Free space \
                                 or grow the disk."
                            ),
                        )
                    }
                    EventType::NodeSpaceRecovered => {
                        if !self.low.remove(node) {
                            return None;
                        }
                        note(
                            id,
                            "info",
                            format!("Node {node}: free space recovered ({free} MiB)"),
                            format!("{free} MiB is free where the log is kept."),
                        )
                    }
                    EventType::NodeSpaceReserveReached => {
                        let secs = p["refused_ms"].as_u64().unwrap_or(0) / 1_000;
                        self.paced(ev, "reserve reached on node", node, op.every_ms, || {
                            note(
                                id,
                                "urgent",
                                format!("Node {node} reached its free-space reserve"),
                                format!(
                                    "Less than {reserve} MiB was free where the log is kept: \
                                     appends were refused for {secs} s. They are taken again \
                                     ({free} MiB free now); free more space before it \
                                     happens again."
                                ),
                            )
                        })
                    }
                    _ => note(
                        id,
                        "urgent",
                        match p["shard"].as_u64() {
                            Some(n) => format!("Node {node}: models of shard {n} poisoned"),
                            None => format!("Node {node}: models poisoned"),
                        },
                        format!(
                            "{}. Commands are refused on this node until tidemark is \
                             restarted; the log is not affected.",
                            cause(p["error"].as_str())
                        ),
                    ),
                }
            }
            EventType::EndpointCircuitOpened
            | EventType::EndpointCircuitClosed
            | EventType::EndpointDisabled
            | EventType::EndpointEnabled
            | EventType::EndpointUnresolved => {
                let endpoint = ev.subject.as_str();
                if endpoint == op.route {
                    return None;
                }
                let c: EndpointChange = serde_json::from_str(ev.payload.get()).unwrap_or_default();
                match ty {
                    EventType::EndpointCircuitOpened => {
                        // Opened again while open (its probe failed): told already.
                        if !self.open.insert(endpoint.to_owned()) {
                            return None;
                        }
                        note(
                            id,
                            "warning",
                            format!("Endpoint {endpoint}: circuit opened"),
                            format!(
                                "After {} failed attempts in a row (last: {}) its deliveries \
                                 wait, spending no attempt; a probe goes after the cool-down.",
                                c.failures.unwrap_or(0),
                                c.error_code.as_deref().unwrap_or("failed")
                            ),
                        )
                    }
                    EventType::EndpointCircuitClosed => {
                        if !self.open.remove(endpoint) {
                            return None;
                        }
                        note(
                            id,
                            "info",
                            format!("Endpoint {endpoint}: circuit closed"),
                            "A probe succeeded: its deliveries go again.".to_owned(),
                        )
                    }
                    EventType::EndpointDisabled => note(
                        id,
                        "warning",
                        format!("Endpoint {endpoint} disabled"),
                        format!(
                            "By {}: {}. Its deliveries wait until it is enabled.",
                            c.by.as_deref().unwrap_or("an operator"),
                            cause(c.reason.as_deref())
                        ),
                    ),
                    EventType::EndpointEnabled => {
                        // An enable closes an open circuit.
                        self.open.remove(endpoint);
                        note(
                            id,
                            "info",
                            format!("Endpoint {endpoint} enabled"),
                            format!(
                                "By {}: {}. Its deliveries go again.",
                                c.by.as_deref().unwrap_or("an operator"),
                                cause(c.reason.as_deref())
                            ),
                        )
                    }
                    _ => self.paced(ev, "unresolved endpoint", endpoint, op.every_ms, || {
                        note(
                            id,
                            "warning",
                            format!("Endpoint {endpoint} unresolved"),
                            format!(
                                "Node {} lacks {}; its deliveries wait until a node that has \
                                 them sends them or the route is set again.",
                                c.by.as_deref().unwrap_or("?"),
                                cause(c.reason.as_deref())
                            ),
                        )
                    }),
                }
            }
            _ => None,
        }
    }
}

/// The circuits `tenant`'s models show open (where its [`Told`] starts).
async fn open_circuits(engine: &Engine) -> Vec<String> {
    let e = engine.clone();
    tokio::task::spawn_blocking(move || {
        e.read()
            .unwaited()
            .endpoints()
            .map(|eps| {
                eps.into_iter()
                    .filter(|(ep, _)| ep.state() == "open")
                    .map(|(ep, _)| ep.route)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    })
    .await
    .unwrap_or_default()
}

/// One tenant of the shard as the reactor tells it: its engine, what it has told, and its
/// operational route as last in force.
struct TenantTold {
    engine: Engine,
    told: Told,
    op: Option<Operational>,
}

/// Tell what each page says, from `feed`, until `shutdown`: each tenant of the shard (spec
/// section 20) through its own operational route, of its own events (another tenant's
/// circuits and parks are not its operators' business), appended as its own.
pub(crate) async fn run(engine: Engine, mut feed: Feed, shutdown: CancellationToken) {
    let mut tenants: HashMap<Option<String>, TenantTold> = HashMap::new();
    let walked = {
        let e = engine.clone();
        tokio::task::spawn_blocking(move || e.every_tenant())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default()
    };
    for (e, _) in walked {
        let key = tidemark_log::tenant_of(e.tenant()).map(str::to_owned);
        let told = Told::with_open(open_circuits(&e).await);
        tenants.insert(
            key,
            TenantTold {
                engine: e,
                told,
                op: None,
            },
        );
    }
    loop {
        let wait = tenants
            .values()
            .filter_map(|t| t.told.next_end())
            .min()
            .map(|end| Duration::from_micros((end - engine.now_us()).max(0) as u64));
        let page = tokio::select! {
            p = feed.recv() => match p { Some(p) => Some(p), None => return },
            _ = async {
                match wait {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            } => None,
            _ = shutdown.cancelled() => return,
        };
        let mut out: Vec<(Engine, NewEvent)> = Vec::new();
        if let Some(page) = page {
            let mut by_tenant: Vec<(Option<String>, Vec<&Event>)> = Vec::new();
            // What a move brought into this shard is history, told (or not) where it happened.
            let moves = engine.placement();
            for ev in page.events.iter().filter(|e| {
                concerns(&e.as_ref())
                    && !moves.is_history(e.tenant.as_deref(), engine.shard(), e.seq)
            }) {
                match by_tenant.iter_mut().find(|(t, _)| *t == ev.tenant) {
                    Some((_, evs)) => evs.push(ev),
                    None => by_tenant.push((ev.tenant.clone(), vec![ev])),
                }
            }
            for (key, evs) in by_tenant {
                if !tenants.contains_key(&key) {
                    // A tenant placed here after the start: every event of it since is in the
                    // pages, this one included, so it starts with nothing open (its models,
                    // which have folded this page, would hide a circuit it opens).
                    let e =
                        engine.in_tenant(key.as_deref().unwrap_or(tidemark_log::DEFAULT_TENANT));
                    tenants.insert(
                        key.clone(),
                        TenantTold {
                            engine: e,
                            told: Told::default(),
                            op: None,
                        },
                    );
                }
                let Some(t) = tenants.get_mut(&key) else {
                    continue;
                };
                // The route in force as the page lands (the settings are events too). Kept
                // when the models cannot say (poisoned, their store failing): what must be
                // told then is told through the route last in force.
                let e = t.engine.clone();
                let now = tokio::task::spawn_blocking(move || {
                    e.read()
                        .unwaited()
                        .settings_in_force()
                        .map(|s| s.operational)
                })
                .await;
                if let Ok(Ok(now)) = now {
                    t.op = now;
                }
                for ev in evs {
                    match &t.op {
                        Some(op) => {
                            let told = t.told.derive(ev, op);
                            out.extend(told.map(|n| (t.engine.clone(), n)));
                        }
                        // Nothing is told without a route, but circuits are followed.
                        None => t.told.follow(ev),
                    }
                }
                if t.op.is_none() {
                    t.told.windows.clear();
                }
            }
        }
        let now = engine.now_us();
        for t in tenants.values_mut() {
            if let Some(op) = &t.op {
                let ended = t.told.ended(now, op.every_ms);
                out.extend(ended.into_iter().map(|n| (t.engine.clone(), n)));
            }
        }
        for (e, ev) in out {
            if append(&e, ev, &shutdown).await {
                metrics::counter!("tidemark_operational_notifications_total").increment(1);
            }
        }
    }
}

/// Record what this node meets that an operator must know and no event says (see the module
/// notes): its free space crossing into and out of twice the reserve and the reserve, its
/// models poisoned. Sleeps until one happens; looks at the free space every 5 s only while
/// the log refuses appends for it (nothing else would look).
pub(crate) async fn watch_node(engine: Engine, shutdown: CancellationToken) {
    let node = engine.leases().node().to_owned();
    let space = engine.log().space();
    tokio::join!(
        watch_space(&engine, &node, space, &shutdown),
        watch_models(engine.clone(), shutdown.clone())
    );
}

/// Record this node's models of `engine`'s shard poisoned, in the home shard's log (spec
/// section 20: the deployment's own records are there, and its default tenant's operational
/// route tells them), naming the shard when it is not the home one.
pub(crate) async fn watch_models(engine: Engine, shutdown: CancellationToken) {
    let node = engine.leases().node().to_owned();
    let why = tokio::select! {
        why = engine.models_poisoned_wait() => why,
        _ = shutdown.cancelled() => return,
    };
    let payload = match engine.shard() {
        0 => json!({"error": why.to_string()}),
        n => json!({"error": format!("shard {n}: {why}"), "shard": n}),
    };
    record(
        &engine.home(),
        &node,
        EventType::NodeModelsPoisoned,
        payload,
        &shutdown,
    )
    .await;
}

async fn watch_space(
    engine: &Engine,
    node: &str,
    space: Option<tokio::sync::watch::Receiver<SpaceState>>,
    shutdown: &CancellationToken,
) {
    let Some(mut space) = space else {
        return;
    };
    let mut was = SpaceLevel::Ok;
    // When the reserve was met (event time), while it holds.
    let mut reached: Option<i64> = None;
    loop {
        let now = *space.borrow_and_update();
        let sizes = json!({"available": now.available, "min_free": now.min_free});
        match (was, now.level) {
            (a, b) if a == b => {}
            (_, SpaceLevel::Reserve) => {
                tracing::error!(
                    available = now.available,
                    min_free = now.min_free,
                    "free space is under the log's reserve: appends are refused until space returns"
                );
                reached = Some(engine.now_us());
            }
            (SpaceLevel::Reserve, level) => {
                let at = reached.take().unwrap_or_else(|| engine.now_us());
                let refused_ms = (engine.now_us() - at).max(0) / 1_000;
                let mut p = sizes.clone();
                p["reached_at_us"] = json!(at);
                p["refused_ms"] = json!(refused_ms);
                record(
                    engine,
                    node,
                    EventType::NodeSpaceReserveReached,
                    p,
                    shutdown,
                )
                .await;
                if level == SpaceLevel::Ok {
                    record(engine, node, EventType::NodeSpaceRecovered, sizes, shutdown).await;
                }
            }
            (SpaceLevel::Ok, _) => {
                tracing::warn!(
                    available = now.available,
                    min_free = now.min_free,
                    "free space is under twice the log's reserve"
                );
                record(engine, node, EventType::NodeSpaceLow, sizes, shutdown).await;
            }
            (SpaceLevel::Low, _) => {
                record(engine, node, EventType::NodeSpaceRecovered, sizes, shutdown).await;
            }
        }
        was = now.level;
        let look_again = was == SpaceLevel::Reserve;
        tokio::select! {
            changed = space.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(5)), if look_again => {
                // Records the level it finds.
                let _ = engine.check_space();
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Append the `node.*` event `ty` of this node (id `node:<node>:<type>:<time>`) until it is in
/// the log.
async fn record(
    engine: &Engine,
    node: &str,
    ty: EventType,
    payload: serde_json::Value,
    shutdown: &CancellationToken,
) {
    let id = format!("node:{node}:{}:{}", ty.as_str(), engine.now_us());
    if let Ok(ev) = NewEvent::new(Some(id), Stream::Nodes, node, ty, &payload) {
        append(engine, ev, shutdown).await;
    }
}

/// Append one notification until it is in the log (another node's same one is a duplicate).
async fn append(engine: &Engine, ev: NewEvent, shutdown: &CancellationToken) -> bool {
    let mut backoff = Duration::from_millis(50);
    loop {
        match engine.append_own(vec![ev.clone()]).await {
            Ok(_) => return true,
            // The same id with other content: another node told it (its own count).
            Err(AppendError::Conflict { .. }) | Err(AppendError::Closed) => return false,
            // Refused as it is: retrying would hold every reactor behind it.
            Err(
                e @ (AppendError::Invalid { .. }
                | AppendError::Poisoned(_)
                | AppendError::Fenced { .. }),
            ) => {
                tracing::warn!(error = %e, "an operational notification was refused; it is not told");
                return false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "an operational notification could not be appended; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {},
                    _ = shutdown.cancelled() => return false,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64, time_s: i64, ty: &str, subject: &str, payload: serde_json::Value) -> Event {
        Event {
            seq,
            tenant: None,
            event_id: format!("e{seq}"),
            stream: "s".into(),
            subject: subject.into(),
            event_type: ty.into(),
            time_us: time_s * 1_000_000,
            payload: serde_json::value::to_raw_value(&payload).unwrap(),
        }
    }

    fn titles(out: &[NewEvent]) -> Vec<String> {
        out.iter()
            .map(|e| {
                let v: serde_json::Value = serde_json::from_str(e.payload_raw().get()).unwrap();
                v["title"].as_str().unwrap().to_owned()
            })
            .collect()
    }

    /// A circuit is told open once and closed once however often it opens again; parks are
    /// told at once, then summed up when the window ends; the operational route's own
    /// trouble is not told through it.
    #[test]
    fn told_once_per_open_circuit_and_paced_per_cause() {
        let op = Operational {
            route: "ops".into(),
            every_ms: 10_000,
        };
        let mut t = Told::default();
        let mut out = Vec::new();
        let opened = |seq| {
            ev(
                seq,
                seq as i64,
                "endpoint.circuit_opened",
                "hook",
                json!({"at_us": 0, "failures": 20}),
            )
        };
        out.extend(t.derive(&opened(1), &op));
        out.extend(t.derive(&opened(2), &op));
        out.extend(t.derive(&opened(3), &op));
        out.extend(t.derive(
            &ev(4, 4, "endpoint.circuit_closed", "hook", json!({"at_us": 0})),
            &op,
        ));
        out.extend(t.derive(
            &ev(5, 5, "endpoint.circuit_closed", "hook", json!({"at_us": 0})),
            &op,
        ));
        out.extend(t.derive(
            &ev(6, 6, "endpoint.circuit_opened", "ops", json!({"at_us": 0})),
            &op,
        ));
        let parked = |seq, s| {
            ev(
                seq,
                s,
                "delivery.attempt_failed",
                &format!("dlv:n{seq}:hook"),
                json!({"parked": true, "error_code": "http_404"}),
            )
        };
        for (seq, s) in [(7, 7), (8, 8), (9, 9)] {
            out.extend(t.derive(&parked(seq, s), &op));
        }
        out.extend(t.derive(
            &ev(
                10,
                10,
                "delivery.attempt_failed",
                "dlv:n10:ops",
                json!({"parked": true}),
            ),
            &op,
        ));
        assert_eq!(
            titles(&out),
            [
                "Endpoint hook: circuit opened",
                "Endpoint hook: circuit closed",
                "Delivery parked on route hook: http_404"
            ]
        );
        assert_eq!(out[0].event_id.as_deref(), Some("op:1"));
        assert!(
            t.ended(16 * 1_000_000, op.every_ms).is_empty(),
            "the window is open"
        );
        let summary = t.ended(17 * 1_000_000, op.every_ms);
        assert_eq!(
            titles(&summary),
            ["2 more: deliveries parked on route hook"]
        );
        assert_eq!(summary[0].event_id.as_deref(), Some("op:7:more"));
        assert!(
            t.ended(100 * 1_000_000, op.every_ms).is_empty(),
            "told once"
        );
    }

    /// A node told low once until told recovered (a second low in between says nothing), a
    /// recovery with no low told says nothing, a reserve reached and poisoned models are
    /// urgent; a bridge subscription's stops are paced per subscription.
    #[test]
    fn nodes_and_bridge_stops_are_told_once_per_cause() {
        let op = Operational {
            route: "ops".into(),
            every_ms: 10_000,
        };
        let mut t = Told::default();
        let mib = |n: u64| n << 20;
        let space = |seq, ty| {
            ev(
                seq,
                seq as i64,
                ty,
                "n1",
                json!({"available": mib(20), "min_free": mib(16), "refused_ms": 4_000}),
            )
        };
        let mut out = Vec::new();
        out.extend(t.derive(&space(1, "node.space_recovered"), &op));
        out.extend(t.derive(&space(2, "node.space_low"), &op));
        out.extend(t.derive(&space(3, "node.space_low"), &op));
        out.extend(t.derive(&space(4, "node.space_reserve_reached"), &op));
        out.extend(t.derive(&space(5, "node.space_recovered"), &op));
        out.extend(t.derive(&space(6, "node.space_recovered"), &op));
        out.extend(t.derive(
            &ev(7, 7, "node.models_poisoned", "n1", json!({"error": "boom"})),
            &op,
        ));
        let stop = |seq: u64, sub: &str| {
            ev(
                seq,
                seq as i64,
                "notification.terminal_state_mismatch",
                "task-1",
                json!({"subscription_id": sub, "seq": seq - 1, "detail": "d"}),
            )
        };
        out.extend(t.derive(&stop(8, "s1"), &op));
        out.extend(t.derive(&stop(9, "s1"), &op));
        out.extend(t.derive(&stop(10, "s2"), &op));
        assert_eq!(
            titles(&out),
            [
                "Node n1: free space low (20 MiB)",
                "Node n1 reached its free-space reserve",
                "Node n1: free space recovered (20 MiB)",
                "Node n1: models poisoned",
                "Bridge subscription s1 stopped at seq 7",
                "Bridge subscription s2 stopped at seq 9",
            ]
        );
        let priority = |e: &NewEvent| {
            let v: serde_json::Value = serde_json::from_str(e.payload_raw().get()).unwrap();
            v["priority"].as_str().unwrap().to_owned()
        };
        assert_eq!(priority(&out[1]), "urgent");
        assert_eq!(priority(&out[3]), "urgent");
        assert_eq!(
            titles(&t.ended(100 * 1_000_000, op.every_ms)),
            ["1 more: stops of bridge subscription s1"]
        );
    }
}
