//! The retention reactor (spec section 13): every `run_every` it runs the engine's retention
//! command until nothing more has left the window; `POST /v1/admin/retention/run` runs it now.

use std::time::Duration;
use tidemark_engine::CommandError;

use tidemark_engine::Engine;
use tidemark_engine::commands::retention::{Compact, CompactReport, Purge, RetentionReport};
use tokio_util::sync::CancellationToken;

/// Ids one command names at most: a run is several bounded transactions, never one huge one.
const BATCH: usize = 5_000;

/// The retention settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub window_ms: u64,
    pub run_every: Duration,
    /// Also drop the log's events older than the window.
    pub compact_log: bool,
}

/// What a run did: the purge, and the compaction when `compact_log` is on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    pub purge: RetentionReport,
    pub compaction: Option<CompactReport>,
}

/// Purge everything that left the window by now, then (with `compact_log`) drop the log's
/// events older than it. `by`: who ran it by hand (section 8), `None` for the periodic run.
pub async fn run_now(
    engine: &Engine,
    r: Retention,
    by: Option<Option<String>>,
) -> Result<RunReport, CommandError> {
    if fault_fails(engine.shard()) {
        return Err(CommandError::Storage(tidemark_log::StorageError::msg(
            format!(
                "retention of shard {} failed (TIDEMARK_FAULT_RETENTION_FAIL_SHARD)",
                engine.shard()
            ),
        )));
    }
    let purge = purge(engine, r.window_ms, by).await?;
    let compaction = if r.compact_log {
        Some(compact(engine, r.window_ms).await?)
    } else {
        None
    };
    Ok(RunReport { purge, compaction })
}

/// The retention's fault injection for the tests of a deployment's run: a run of this shard
/// fails before it does anything.
fn fault_fails(shard: u32) -> bool {
    static SHARD: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *SHARD.get_or_init(|| {
        std::env::var("TIDEMARK_FAULT_RETENTION_FAIL_SHARD")
            .ok()
            .and_then(|v| v.parse().ok())
    }) == Some(shard)
}

/// Drop the log's events older than the window, in bounded commands; the totals.
async fn compact(engine: &Engine, window_ms: u64) -> Result<CompactReport, CommandError> {
    // Another shard's models know no directory: the tenants whose cursors pin it come from
    // the home shard's, as it stands after the directory has settled.
    // The home shard's cut reads its own directory, folded to the head by the decider.
    // A shard a move copies from or into keeps its prefix until the move ends (the copy
    // keeps the source's seqs from 1, and the destination's pins no tenant yet).
    if engine.placement().in_a_move(engine.shard()) {
        tracing::info!(
            shard = engine.shard(),
            "a tenant's move copies from or into this shard: compaction skipped this run"
        );
        return Ok(CompactReport::default());
    }
    let e = engine.clone();
    let tenants = match tokio::task::spawn_blocking(move || {
        if e.shard() == 0 {
            return Ok(None);
        }
        e.settle_directory()?;
        e.placed_here()
    })
    .await
    .map_err(|e| CommandError::Storage(tidemark_log::StorageError::of(e)))?
    {
        Ok(t) => t,
        // The directory lags: no cut this run (the next one tries again), rather than one
        // that would miss a tenant's cursors.
        Err(tidemark_engine::QueryError::Lagging { .. }) => {
            tracing::warn!(
                shard = engine.shard(),
                "the directory lags behind the home shard's log: compaction skipped this run"
            );
            return Ok(CompactReport::default());
        }
        Err(e) => {
            return Err(CommandError::Storage(tidemark_log::StorageError::of(e)));
        }
    };
    let mut total: Option<CompactReport> = None;
    loop {
        // A move that began meanwhile keeps the prefix from the next bounded cut on.
        if total.is_some() && engine.placement().in_a_move(engine.shard()) {
            break;
        }
        let tenants = tenants.clone();
        let (r, _) = engine.execute(Compact { window_ms, tenants }).await?;
        let more = r.more;
        match &mut total {
            None => total = Some(r),
            Some(t) => {
                t.removed += r.removed;
                t.first_seq = r.first_seq;
                t.cut = r.cut;
            }
        }
        if !more {
            break;
        }
    }
    let t = total.unwrap_or_default();
    // The home shard's series as before; another shard's with `shard`.
    let shard: Vec<(&'static str, String)> = match engine.shard() {
        0 => Vec::new(),
        n => vec![("shard", n.to_string())],
    };
    metrics::counter!("tidemark_log_compacted_events_total", &shard).increment(t.removed);
    metrics::gauge!("tidemark_log_first_seq", &shard).set(t.first_seq as f64);
    if t.removed > 0 {
        tracing::info!(
            shard = engine.shard(),
            removed = t.removed,
            first_seq = t.first_seq,
            pinned_below = t.window_cut,
            "log compacted"
        );
    }
    Ok(t)
}

/// Purge everything that left the window by now, in every tenant; the totals of every
/// command it took (the first one's `before` and `through_seq`).
async fn purge(
    engine: &Engine,
    window_ms: u64,
    by: Option<Option<String>>,
) -> Result<RetentionReport, CommandError> {
    let e = engine.clone();
    let tenants = tokio::task::spawn_blocking(move || e.every_tenant())
        .await
        .map_err(|e| CommandError::Storage(tidemark_log::StorageError::of(e)))?
        .map_err(|e| CommandError::Storage(tidemark_log::StorageError::of(e)))?;
    let mut total: Option<RetentionReport> = None;
    for (tenant, _) in &tenants {
        purge_in(tenant, window_ms, by.clone(), &mut total).await?;
    }
    finish_purge(total)
}

/// Purge one tenant's, adding to `total`.
async fn purge_in(
    engine: &Engine,
    window_ms: u64,
    by: Option<Option<String>>,
    total: &mut Option<RetentionReport>,
) -> Result<(), CommandError> {
    loop {
        let (r, _) = engine
            .execute(Purge {
                window_ms,
                max: BATCH,
                by: by.clone(),
            })
            .await?;
        let more = r.more;
        match total {
            None => *total = Some(r),
            Some(t) => {
                t.deliveries += r.deliveries;
                t.notifications += r.notifications;
                t.tasks += r.tasks;
                t.events += r.events;
            }
        }
        if !more {
            return Ok(());
        }
    }
}

/// The purge's totals counted and logged.
fn finish_purge(total: Option<RetentionReport>) -> Result<RetentionReport, CommandError> {
    let mut t = total.unwrap_or_default();
    t.more = false;
    for (kind, n) in [
        ("deliveries", t.deliveries),
        ("notifications", t.notifications),
        ("tasks", t.tasks),
    ] {
        metrics::counter!("tidemark_retention_purged_total", "kind" => kind).increment(n as u64);
    }
    tracing::info!(
        deliveries = t.deliveries,
        notifications = t.notifications,
        tasks = t.tasks,
        events = t.events,
        "retention run"
    );
    Ok(t)
}

/// The lease that makes the periodic run once per cluster (spec section 16).
pub const LEASE: &str = "retention";

/// Run retention at start, then every `run_every`, until `shutdown` — on the node holding the
/// retention lease (on a cluster the other nodes wait, and one of them takes the lease when
/// its holder dies). `POST /v1/admin/retention/run` runs it on the node asked, lease or not.
pub(crate) async fn run_loop(engine: Engine, r: Retention, shutdown: CancellationToken) {
    let leases = engine.leases();
    leases.want(LEASE);
    leases.ready().await;
    let mut changes = leases.changes();
    loop {
        if leases.holds(LEASE) {
            match run_now(&engine, r, None).await {
                Ok(_) => {}
                Err(CommandError::Append(tidemark_log::AppendError::Closed)) => return,
                Err(e) => tracing::warn!(error = %e, "retention run failed; will retry"),
            }
            tokio::select! {
                _ = tokio::time::sleep(r.run_every) => {},
                _ = shutdown.cancelled() => return,
            }
        } else {
            // Not ours: look again when the leases change (a run is due on taking it).
            tokio::select! {
                _ = changes.changed() => {},
                _ = tokio::time::sleep(leases.ttl()) => {},
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
