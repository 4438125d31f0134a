//! Shared state of the HTTP server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics_exporter_prometheus::PrometheusHandle;
use tidemark_engine::Engine;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::auth::Auth;
use crate::config::Config;

#[derive(Clone)]
pub struct AppState {
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
    /// Pending pull deliveries and long-poll wake-ups, kept by the bridge notifier.
    pub pull_hub: tidemark_consumers::bridge::PullHub,
    /// What wakes the live streams (only those a commit has an event for).
    pub streams: tidemark_consumers::streams::StreamHub,
    /// The configured source pollers and their in-memory state (spec section 12).
    pub sources: tidemark_consumers::sources::Sources,
    /// How the dispatcher's sinks are doing on this node (section 17).
    pub sink_health: tidemark_consumers::dispatch::Health,
}

impl AppState {
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}
