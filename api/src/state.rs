//! Shared state of the HTTP server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics_exporter_prometheus::PrometheusHandle;
use tidemark_engine::Engine;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::auth::Auth;
use crate::config::Config;

/// What every handler shares, behind one reference count: a handler's `State` (and each
/// middleware's) is a clone per request, and a struct of twenty reference-counted parts cost
/// about a tenth of the server's CPU at 256 clients × 1 event in clones and drops alone.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub struct Shared {
    pub engine: Engine,
    pub config: Arc<Config>,
    pub auth: Auth,
    /// Cancelled when shutdown starts: SSE streams and long polls end on it.
    pub shutdown: CancellationToken,
    pub shutting_down: Arc<AtomicBool>,
    /// One permit per open SSE stream (bounded, spec section 8).
    pub sse_slots: Arc<Semaphore>,
    pub metrics: PrometheusHandle,
    /// Rebuilds and verifies in progress: projection → (done, head).
    pub rebuilds: Arc<std::sync::Mutex<std::collections::HashMap<String, (u64, u64)>>>,
    /// The notification settings of the config (the ones recorded in the log at start).
    pub routing: Arc<tidemark_projections::routing::RoutingSettings>,
    /// The deployment's shards (spec section 20), the home shard first (its engine is
    /// `engine`): a tenant's requests go to the shard its directory row places it in.
    pub shards: Vec<Shard>,
    /// The home shard's seq of the directory's last change made here (the head at the start
    /// before any): what a tenant's request reads the directory as of.
    pub directory_seq: std::sync::atomic::AtomicU64,
    /// The configured source pollers and their in-memory state (spec section 12).
    pub sources: tidemark_consumers::sources::Sources,
    /// How the dispatcher's sinks are doing on this node (section 17).
    pub sink_health: tidemark_consumers::dispatch::Health,
    /// The OpenAPI document the router was built with ([`crate::router`] sets it).
    pub openapi: std::sync::OnceLock<String>,
}

/// One shard of the deployment as the API serves it: its engine and what its reactors feed.
#[derive(Clone)]
pub struct Shard {
    pub engine: Engine,
    /// Pending pull deliveries and long-poll wake-ups, kept by the shard's bridge notifier.
    pub pull_hub: tidemark_consumers::bridge::PullHub,
    /// What wakes the shard's live streams (only those a commit has an event for).
    pub streams: tidemark_consumers::streams::StreamHub,
}

impl Shard {
    /// Its head now, and the seq its read models have folded through (what a read of its
    /// tenants reflects without waiting).
    pub fn head_and_folded(&self) -> (u64, u64) {
        let head = self.engine.head();
        (head, head.saturating_sub(self.engine.read().lag()))
    }

    pub fn new(engine: Engine) -> Shard {
        Shard {
            engine,
            pull_hub: Default::default(),
            streams: Default::default(),
        }
    }
}

impl Shared {
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

/// The state as a handler reads it: the shared state, and the engine acting for the
/// request's tenant (spec section 20, [`crate::tenancy`]): its commands, appends and reads
/// are that tenant's alone. Built per request; a request of the default tenant clones nothing.
#[derive(Clone)]
pub struct Api {
    shared: AppState,
    /// The tenant's engine; `None`: the default tenant's, the shared one.
    scoped: Option<Engine>,
    /// The shard the tenant lives in.
    shard: usize,
    /// The tenant's gate, held shared while its request runs: a move fences the tenant by
    /// taking it exclusively (`tidemark_engine::moves`).
    _gate: Option<Arc<tokio::sync::OwnedRwLockReadGuard<()>>>,
}

impl Api {
    /// The engine acting for the request's tenant.
    pub fn engine(&self) -> &Engine {
        self.scoped.as_ref().unwrap_or(&self.shared.engine)
    }

    /// The tenant the request acts for, by name.
    pub fn tenant(&self) -> &str {
        self.engine().tenant()
    }

    /// The shared state (what outlives the request: streams, hubs).
    pub fn shared(&self) -> &AppState {
        &self.shared
    }

    /// The shard of the request's tenant: its live streams' and pulls' hubs.
    pub fn shard(&self) -> &Shard {
        &self.shared.shards[self.shard]
    }

    /// Until a move of the request's tenant takes a step (a long poll ends on it, so that
    /// the move's fence does not wait for it).
    pub async fn until_moved(&self) {
        if tidemark_log::tenant_of(self.tenant()).is_none() {
            return std::future::pending().await;
        }
        self.engine().placement().until_fencing(self.tenant()).await;
    }

    /// The number of the shard the request's tenant lives in.
    pub fn shard_number(&self) -> u32 {
        self.shard as u32
    }

    /// The same request acting for `tenant`, placed in `shard` (a deployment-wide read's
    /// fan-out over the directory's tenants, spec section 20); `None` past the shards.
    pub(crate) fn acting_for(&self, tenant: &str, shard: usize) -> Option<Api> {
        let home = self.shared.shards.get(shard)?;
        Some(Api {
            shared: self.shared.clone(),
            scoped: (tenant != tidemark_log::DEFAULT_TENANT).then(|| home.engine.in_tenant(tenant)),
            shard,
            _gate: None,
        })
    }
}

impl std::ops::Deref for Api {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl axum::extract::FromRequestParts<AppState> for Api {
    type Rejection = crate::error::ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Api, crate::error::ApiError> {
        let acting = parts
            .extensions
            .get::<crate::tenancy::Acting>()
            .and_then(|a| a.0.clone());
        let Some(tenant) = acting else {
            return Ok(Api {
                shared: state.clone(),
                scoped: None,
                shard: 0,
                _gate: None,
            });
        };
        // The tenant's gate, held shared while the request runs (reads too: a position read
        // from the old shard after a move's fence would mean something else in the new one);
        // a move fences the tenant by taking it exclusively. Taken once a request (a handler
        // may extract `Api` twice), and only for a tenant found in the directory (so a name
        // that is no tenant makes no gate); looked up again if a move stepped meanwhile.
        let moves = state.engine.placement();
        // On a cluster, a tenant a move fenced out of the shard it lives in waits for this
        // node to see the switch (the directory's `tenant.moved`), at most a while.
        if moves.fenced_where_it_lives(&tenant) {
            let mut changes = moves.changes();
            let waited = tokio::time::timeout(FENCED_WAIT, async {
                while moves.fenced_where_it_lives(&tenant) {
                    if changes.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
            if waited.is_err() {
                return Err(crate::tenancy::moving(&tenant));
            }
        }
        let mut seen = moves.version();
        let mut shard = resolve(state, &tenant).await?;
        let gate = match parts.extensions.get::<HeldGate>() {
            Some(g) => g.0.clone(),
            None => {
                let g = Arc::new(moves.gate(&tenant).read_owned().await);
                parts.extensions.insert(HeldGate(g.clone()));
                g
            }
        };
        while moves.version() != seen {
            seen = moves.version();
            shard = resolve(state, &tenant).await?;
        }
        // A start with fewer shards than a placement is refused (`crate::server`).
        let Some(home) = state.shards.get(shard as usize) else {
            return Err(crate::error::ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "shard_unavailable",
                format!(
                    "tenant {:?} lives in shard {shard}, which this node does not serve",
                    &*tenant
                ),
            ));
        };
        if let Some(by) = parts.extensions.get::<crate::tenancy::ServedBy>() {
            let _ = by.0.set(shard as usize);
        }
        Ok(Api {
            shared: state.clone(),
            scoped: Some(home.engine.in_tenant(&tenant)),
            shard: shard as usize,
            _gate: Some(gate),
        })
    }
}

/// How long a request of a tenant fenced by a move waits for this node to see its switch
/// before it is refused (`503 tenant_moving`, retried by the client).
const FENCED_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The gate a request holds ([`Api`]), kept on the request so a second extraction reuses it.
#[derive(Clone)]
struct HeldGate(Arc<tokio::sync::OwnedRwLockReadGuard<()>>);

/// The shard live tenant `tenant` lives in, from the directory, or the request's refusal.
async fn resolve(state: &AppState, tenant: &Arc<str>) -> Result<u32, crate::error::ApiError> {
    // In the directory, and not removed: as of the last change of the directory, not of the
    // home shard's head (which moves with the default tenant's appends: waiting for it sent
    // every tenant request through the blocking pool). The directory changes only by this
    // node's `POST`/`DELETE /v1/tenants` and moves, which record their seq in `directory_seq`
    // (the head at the start before any); on the blocking pool only while the models have not
    // folded that far.
    let want = state.directory_seq.load(Ordering::Acquire);
    let mut live = placement(state, tenant, want).await?;
    if live.is_none() {
        // Not (or no longer) a tenant as of then: as of the head, which another node of a
        // cluster may have changed it by.
        live = placement(state, tenant, state.engine.head()).await?;
    }
    let shard = live.ok_or_else(|| {
        crate::error::ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "tenant_not_found",
            format!("no tenant {:?}", &**tenant),
        )
    })?;
    // Where this process knows it lives: a move switches it here before the directory's
    // models may have folded the move's record.
    Ok(state.engine.placement().shard_of(tenant).unwrap_or(shard))
}

/// The shard of live tenant `tenant` in the directory as the home shard's models hold it once
/// folded through `want` (`None`: not a tenant, or removed): read on this task when they have,
/// on the blocking pool while they catch up.
async fn placement(
    state: &AppState,
    tenant: &Arc<str>,
    want: u64,
) -> Result<Option<u32>, crate::error::ApiError> {
    let (t, engine) = (tenant.clone(), state.engine.clone());
    let read = move || -> Result<Option<u32>, tidemark_engine::QueryError> {
        engine.read().folded_to(want)?;
        let row = engine.read().unwaited().tenant(&t)?;
        Ok(row.filter(|r| r.is_live()).map(|r| r.shard))
    };
    if state.engine.read().folded_now(want) {
        read().map_err(|e| crate::error::ApiError::query("reading the tenants", &e))
    } else {
        crate::routes::blocking(read).await
    }
}
