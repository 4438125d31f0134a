//! Reactors of tidemark: they follow the log and the read models and append derived events
//! (with deterministic `event_id`s, so a crash and a replay cannot duplicate them) or run the
//! engine's commands.
//!
//! # Layout
//! - [`follow`]: the one follower that reads each new page of the log once and hands it to
//!   every reactor.
//! - [`router`]: lifecycle events → `notification.created` (`ntf:<source_seq>`).
//! - [`scheduler`]: notifications → deliveries (exactly once, through a command that advances
//!   the routing checkpoint in the same transaction), task cancellations, lease expiry.
//! - [`bridge`]: the bridge terminal notifier (deliver / defer / mismatch per subscription),
//!   its webhook sink, the pull cache, the ack planner and the confirmation that advances a
//!   subscription's cursor.
//! - [`dispatch`]: tidemark's own sinks (email, webhook): claim, attempt, report.
//! - [`sources`]: the pollers that turn an upstream API into events (section 12).
//! - [`operational`]: operational notifications through `[notifications.operational]`, and
//!   the `node.*` events only one node can record (its free space, its models poisoned).
//! - [`oplog`]: the server log's account of parks, circuits and switches, read from the log.
//! - [`retention`]: the periodic purge of what left the retention window.
//! - [`retry_after`]: the wait a server asks for (`Retry-After`, or a JSON body's
//!   `retryAfter`), read one way by the webhook sinks and the source poller.
//! - [`streams`]: the live streams' wake-ups ([`streams::StreamHub`]): a stream is woken only
//!   by a page holding an event of its filter.

//!
//! # Public surface
//! [`spawn`] (the follower and every reactor); [`follow::Follower`]; from [`bridge`]:
//! `scan`, `confirm` / `confirm_many`, `record_failure`, `plan_acks`, `pending_for_bridge`,
//! `Signatures`, `PullHub`; [`scheduler::expire_now`].

#![forbid(unsafe_code)]

pub mod bridge;
pub mod dispatch;
pub mod follow;
pub mod operational;
pub mod oplog;
pub mod retention;
pub mod retry_after;
pub mod router;
pub mod scheduler;
pub mod sources;
pub mod streams;

use tidemark_engine::Engine;

/// How tidemark names itself to the servers it calls (`User-Agent` of webhooks and source
/// polls, `X-Mailer` of email): a receiver's logs can tell its requests, and the release that
/// sent them, from anyone else's.
pub const USER_AGENT: &str = concat!("tidemark/", env!("CARGO_PKG_VERSION"));

/// A configured value that may name an environment variable (`env:NAME`): the variable's
/// value, or the text itself. Secrets (source headers, SMTP credentials, webhook URLs and
/// secrets) enter this way and are never written in the file.
pub fn env_value(v: &str) -> Result<String, String> {
    match v.strip_prefix("env:") {
        Some(var) => match std::env::var(var) {
            Ok(value) => Ok(value),
            Err(_) if unset_env::tolerated() => Ok(unset_env::placeholder(var)),
            Err(_) => Err(format!("environment variable {var} is not set")),
        },
        None => Ok(v.to_owned()),
    }
}

/// `tidemark config show` checks a configuration on a machine that may not have the service's
/// environment (the secrets are the unit's): there an unset `env:NAME` stands for a valid
/// placeholder, and the names are kept to be reported, where the server refuses to start.
pub mod unset_env {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    static TOLERATED: AtomicBool = AtomicBool::new(false);
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// From now on, in this process, an unset variable is a placeholder (`config show` only).
    pub fn tolerate() {
        TOLERATED.store(true, Ordering::Relaxed);
    }

    pub(crate) fn tolerated() -> bool {
        TOLERATED.load(Ordering::Relaxed)
    }

    /// A value any setting accepts (a URL, a header value, a key), never used to send.
    pub fn placeholder(var: &str) -> String {
        let mut seen = SEEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !seen.iter().any(|v| v == var) {
            seen.push(var.to_owned());
        }
        "https://env-unset.invalid/".to_owned()
    }

    /// The variables met unset, in the order met.
    pub fn seen() -> Vec<String> {
        SEEN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
use tidemark_log::StorageError;
use tidemark_projections::routing::RoutingSettings;
use tokio_util::sync::CancellationToken;

/// Where the router and the routing resume, and the head now (blocking reads, on the pool).
async fn checkpoints(engine: &Engine) -> Result<(u64, u64, u64), StorageError> {
    let e = engine.clone();
    tokio::task::spawn_blocking(move || {
        // A checkpoint before a compacted prefix resumes at its end: what the window dropped
        // was handled long before (a checkpoint only moves with what it derives, so a quiet
        // one can be far behind what it has seen).
        let floor = e.first_seq()?.saturating_sub(1);
        Ok::<_, StorageError>((
            router::checkpoint(&e)?.max(floor),
            scheduler::checkpoint(&e)?.max(floor),
            e.head(),
        ))
    })
    .await
    .map_err(StorageError::of)?
}

/// The shard's derivations on `follower`: the router (lifecycle → notifications), the routing
/// (notifications → deliveries) and the claims' lease expiry.
fn derivations(
    follower: &mut follow::Follower,
    engine: &Engine,
    (router_after, routing_after, head): (u64, u64, u64),
    lease_clock: scheduler::LeaseClock,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    // A commit with nothing for a reactor does not wake it: the router takes lifecycle events,
    // routing notifications and cancellations.
    let router_feed =
        follower.subscribe_if(router_after, Box::new(|p| p.any(router::derives_from)));
    let routing_feed =
        follower.subscribe_if(routing_after, Box::new(|p| p.any(scheduler::relevant)));
    // Lease expiry wakes at the earliest expiry, or for a page that takes a lease expiring
    // before then.
    let clock = lease_clock.clone();
    let leases_feed = follower.subscribe_if(head, Box::new(move |p| p.any(|e| clock.wants(e))));
    vec![
        tokio::spawn(router::run(
            engine.clone(),
            router_after,
            router_feed,
            shutdown.clone(),
        )),
        tokio::spawn(scheduler::run(
            engine.clone(),
            routing_after,
            routing_feed,
            shutdown.clone(),
        )),
        tokio::spawn(scheduler::expiry_loop(
            engine.clone(),
            leases_feed,
            lease_clock,
            shutdown.clone(),
        )),
    ]
}

/// On a cluster, a shard's derivations run on the node holding its lease, `shard.<n>` of the
/// home shard's leases (spec section 20): started from their checkpoints, with a follower of
/// their own, when this node takes the lease, and stopped when it loses it; the node that
/// takes it over resumes from the checkpoints the log holds (every derived event has a
/// deterministic id or a condition, so work done twice across a handover lands once).
async fn serve_while_held(
    engine: Engine,
    lease_clock: scheduler::LeaseClock,
    shutdown: CancellationToken,
) {
    let leases = engine.home_leases();
    let name = format!("shard.{}", engine.shard());
    let shard = engine.shard();
    // Asked for only once this node's models of the shard (and the directory) have caught up
    // with the log: a node that is still folding would take the shard and route nothing.
    while caught_up(&engine).await.is_err() {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
    leases.want(&name);
    let mut changes = leases.changes();
    // A lease lapses by time too (it counts as held only so long after its last renewal).
    let recheck = (leases.ttl() / 6).max(std::time::Duration::from_millis(100));
    // Wait until this node holds the lease (`held`) or not; `false` at shutdown.
    let mut until = async |held: bool| {
        while leases.holds(&name) != held {
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(recheck) => {}
                _ = shutdown.cancelled() => return false,
            }
        }
        true
    };
    loop {
        if !until(true).await {
            return;
        }
        let held = shutdown.child_token();
        // The checkpoints over every tenant the directory places here, as of now.
        let at = match caught_up(&engine).await {
            Ok(()) => checkpoints(&engine).await,
            Err(e) => Err(e),
        };
        let run = match at {
            Ok(at) => {
                tracing::info!(
                    shard,
                    "serving the shard: its router, routing and lease expiry run here"
                );
                lease_clock.here();
                let mut follower = follow::Follower::new(engine.clone());
                let mut tasks = derivations(&mut follower, &engine, at, lease_clock.clone(), &held);
                tasks.push(tokio::spawn(follower.run(held.clone())));
                tasks
            }
            Err(e) => {
                tracing::warn!(shard, error = %e, "cannot start serving the shard; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                    _ = shutdown.cancelled() => return,
                }
            }
        };
        let live = until(false).await;
        held.cancel();
        for t in run {
            let _ = t.await;
        }
        lease_clock.elsewhere();
        if !live {
            return;
        }
        tracing::info!(shard, "the shard's lease is lost: another node serves it");
    }
}

/// Take the directory's placements into the deployment's [`tidemark_engine::placement`];
/// answers the home shard's seq they are as of (at least).
async fn load_placement(engine: &Engine) -> Result<u64, StorageError> {
    let e = engine.clone();
    tokio::task::spawn_blocking(move || {
        let home = e.home();
        let as_of = home.head().saturating_sub(home.read().lag());
        let rows = home.read().unwaited().tenants()?;
        e.placement().load(&rows);
        // On a cluster, the fences of the tenants placed here (a move under way, or one
        // that stopped after its fence): what the stream holds after them is void.
        for r in rows.iter().filter(|r| r.shard == e.shard()) {
            let fence = e.fence_of(&r.name)?;
            if fence > 0 {
                e.placement().fenced_at(&r.name, e.shard(), fence);
            }
        }
        Ok::<_, StorageError>(as_of)
    })
    .await
    .map_err(StorageError::of)?
}

/// Whether the directory (the home shard's models) and this shard's models have folded their
/// logs' heads as of now (waiting at most the read wait; blocking reads, on the pool).
async fn caught_up(engine: &Engine) -> Result<(), StorageError> {
    let e = engine.clone();
    tokio::task::spawn_blocking(move || {
        e.settle_directory()?;
        e.read().floor(0).map(drop)
    })
    .await
    .map_err(StorageError::of)?
    .map_err(StorageError::from)
}

/// Start the follower and the reactors (router, scheduler with its lease-expiry tick, bridge
/// notifier, the live streams' hub); the handle ends when all have stopped after `shutdown`.
/// On a cluster the router, routing and lease expiry run where the shard's lease is held
/// ([`serve_while_held`]); the rest on every node.
pub async fn spawn(
    engine: Engine,
    settings: RoutingSettings,
    hub: bridge::PullHub,
    streams: streams::StreamHub,
    retention: retention::Retention,
    dispatch: dispatch::Wake,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, StorageError> {
    // The checkpoints are the least over the tenants the directory places here: taken once
    // the directory (and this shard's models) have folded their heads, so a tenant the home
    // models do not list yet is not resumed from another's checkpoint. Waited for as long as
    // a read waits, no longer: the server does not listen before this returns, and models
    // still far behind are `checkpoints`' to report, as before.
    if let Err(e) = caught_up(&engine).await {
        tracing::warn!(shard = engine.shard(), error = %e, "the directory or the shard's models lag at start");
    }
    // Where each tenant lives, before any reactor of the shard acts on a page: a crashed
    // move's copy in this shard is not acted on (`follow`).
    let placed_as_of = load_placement(&engine).await?;
    let at = checkpoints(&engine).await?;
    let head = at.2;
    let mut follower = follow::Follower::new(engine.clone());
    let lease_clock = scheduler::LeaseClock::default();
    // A commit with nothing for any reactor (a claim's lease expiring after the next look, a
    // completion) does not wake the follower at all: the decider asks this as it hands the
    // commit on, and passes over what no one wants (spec section 3: a round wakes only who has
    // work). Every page a feed, a nudge or an observer below wants is one of these.
    let watched = streams.clone();
    let clock = lease_clock.clone();
    engine.pages().set_interest(Box::new(move |events| {
        watched.is_watched()
            || events.iter().any(|e| {
                router::derives_from(e)
                    || scheduler::relevant(e)
                    || bridge::concerns(e)
                    || clock.wants(e)
                    || dispatch::makes_due(e)
                    || operational::concerns(e)
                    || oplog::concerns(e)
                    || follow::concerns(e)
            })
    }));
    let mut tasks = if engine.leases().clustered() {
        lease_clock.elsewhere();
        vec![tokio::spawn(serve_while_held(
            engine.clone(),
            lease_clock.clone(),
            shutdown.clone(),
        ))]
    } else {
        derivations(&mut follower, &engine, at, lease_clock.clone(), &shutdown)
    };
    // The notifier looks at every subscription at the head first, then follows from there,
    // handed only the pages with a task, subscription or cursor event; the others are passed
    // over in the pull hub, which pull long-polls wait on (for the notifier to have looked at
    // the head).
    hub.attach(&engine);
    let offered = hub.clone();
    let notifier_feed = follower.subscribe_if(
        head,
        Box::new(move |p| {
            let wanted = p.any(bridge::concerns);
            offered.offered(p.upto, wanted);
            wanted
        }),
    );
    // Live streams wait for what is committed from now on; the hub only has work while a
    // stream waits.
    let watched = streams.clone();
    let streams_feed = follower.subscribe_if(head, Box::new(move |_| watched.is_watched()));
    // The sinks' dispatchers sleep until a delivery is due: a page that may make one due
    // sooner nudges them.
    follower.nudge_if(
        Box::new(|p| p.any(dispatch::makes_due)),
        Box::new(move || dispatch.nudge()),
    );
    // Operators told through the operational route (section 17): what is committed from now
    // on, each tenant's through its own.
    let operational_feed = follower.subscribe_if(head, Box::new(|p| p.any(operational::concerns)));
    // The directory's changes after those loaded, as this node learns where each tenant
    // lives: a tenant created or moved on another node of a cluster (this node's own moves
    // switch it already; a change read again moves nothing).
    if engine.shard() == 0 {
        let mut feed = follower.subscribe_if(placed_as_of, Box::new(|p| p.any(follow::concerns)));
        let (home, stop) = (engine.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(page) = tokio::select! {
                p = feed.recv() => p,
                _ = stop.cancelled() => None,
            } {
                for ev in &page.events {
                    follow::learn_directory(home.placement(), ev);
                }
            }
        }));
    }
    // The server log's account of parks and circuits: what is committed from now on.
    let moves = engine.clone();
    follower.observe(Box::new(move |p| {
        if p.upto > head && p.any(oplog::concerns) {
            // Not what a move brought here: that is history.
            let shard = moves.shard();
            let placement = moves.placement();
            oplog::observe(p, head, |e| {
                !placement.is_history(e.tenant.as_deref(), shard, e.seq)
            });
        }
    }));
    tasks.extend([
        tokio::spawn(retention::run_loop(
            engine.clone(),
            retention,
            shutdown.clone(),
        )),
        bridge::spawn(
            engine.clone(),
            settings,
            hub,
            notifier_feed,
            shutdown.clone(),
        ),
        tokio::spawn(streams.run(streams_feed, shutdown.clone())),
    ]);
    // Operators are told through their tenant's operational route (section 17), of what
    // their tenant's events say; this node's own (`node.*`) go to the home shard's default
    // tenant.
    tasks.push(tokio::spawn(operational::run(
        engine.clone(),
        operational_feed,
        shutdown.clone(),
    )));
    if engine.shard() == 0 {
        tasks.push(tokio::spawn(operational::watch_node(
            engine.clone(),
            shutdown.clone(),
        )));
    } else {
        // Another shard's decider poisoned is the node's to tell too, in the home shard.
        tasks.push(tokio::spawn(operational::watch_models(
            engine.clone(),
            shutdown.clone(),
        )));
    }
    tasks.push(tokio::spawn(follower.run(shutdown)));
    Ok(tokio::spawn(async move {
        for t in tasks {
            let _ = t.await;
        }
    }))
}
