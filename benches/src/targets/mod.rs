//! One system under test as every workload sees it: `prepare` a batch (the client's own work,
//! not timed), `append` it durably (resolves once the system has fsynced it), `read_from` a
//! position. One implementation per system; each is started and stopped by the benchmark.
//! A system whose clients can keep several requests in flight on one connection (NATS's
//! asynchronous publish) also implements [`Pipelined`], which the windowed cells drive.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::events::BenchEvent;
use crate::measure::Proc;

pub mod cluster;
pub mod nats;
pub mod postgres;
pub mod redis;
pub mod sqlite;
pub mod tidemark;

/// A page read back: how many events it held and where the next page starts.
pub struct Page<P> {
    pub events: usize,
    /// Payload bytes received (to check nothing came back empty).
    pub bytes: usize,
    pub next: P,
}

pub trait Target: Send + Sync + 'static {
    /// One client's connection.
    type Conn: Send + 'static;
    /// A batch encoded for this system.
    type Batch: Send + 'static;
    /// A read position.
    type Pos: Clone + Send + Default + 'static;

    fn name(&self) -> &'static str;
    /// Whose CPU and I/O counters a run reads.
    fn proc(&self) -> Proc;
    /// The directory holding the system's data: an append cell counts what the block device
    /// under it writes. None when the system keeps no data of its own here.
    fn data_dir(&self) -> Option<&Path>;
    fn connect(&self) -> impl Future<Output = Result<Self::Conn, String>> + Send;
    fn prepare(&self, events: &[BenchEvent]) -> Self::Batch;
    /// Resolves once the whole batch is durable.
    fn append(
        &self,
        conn: &mut Self::Conn,
        batch: Self::Batch,
    ) -> impl Future<Output = Result<(), String>> + Send;
    /// Up to `limit` events after `pos`, in the system's order.
    fn read_from(
        &self,
        conn: &mut Self::Conn,
        pos: &Self::Pos,
        limit: usize,
    ) -> impl Future<Output = Result<Page<Self::Pos>, String>> + Send;
    /// Bytes the system wrote that its process counters miss (PostgreSQL: WAL position).
    fn extra_written(&self) -> impl Future<Output = Option<u64>> + Send {
        async { None }
    }
    /// How far the system's read models lag behind its log at the end of a cell, and how long
    /// they take to catch up (tidemark in process: its projections follow the log).
    fn follow_lag(&self) -> impl Future<Output = Option<FollowLag>> + Send {
        async { None }
    }
    /// Stop the server (if any) and remove its data.
    fn stop(self) -> impl Future<Output = ()> + Send;
}

/// A target whose client can send a request before the previous one is acknowledged: `send`
/// returns once the batch is on its way, with its acknowledgement to await later. The windowed
/// driver ([`crate::workloads::Windowed`]) keeps a window of these in flight per client.
pub trait Pipelined: Target {
    /// A sent batch's acknowledgement: resolves once the whole batch is durable, or with what
    /// the system refused (a duplicate counts as an error, as it does for `append`).
    type Ack: Future<Output = Result<(), String>> + Send + 'static;

    /// Send `batch` without waiting for its acknowledgement.
    fn send(
        &self,
        conn: &mut Self::Conn,
        batch: Self::Batch,
    ) -> impl Future<Output = Result<Self::Ack, String>> + Send;

    /// A bound the system puts on requests of `batch` events open at once across every
    /// client, as a semaphore the driver takes a permit of before each send and gives back at
    /// its acknowledgement; None when there is none (NATS: at most 50 atomic batches open per
    /// stream, and no bound on single publishes).
    fn open_limit(&self, batch: usize) -> Option<Arc<Semaphore>> {
        let _ = batch;
        None
    }
}

/// Read models behind the log when a cell ends.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct FollowLag {
    /// Events the slowest read model had still to fold.
    pub lag_events: u64,
    /// Until every read model had folded the head as of the cell's end.
    pub catch_up_ms: u64,
}

/// The systems `--systems` names.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// tidemark's `serve` binary over HTTP (a child process).
    TidemarkHttp,
    /// tidemark's log in the benchmark process.
    TidemarkInproc,
    Redis,
    Postgres,
    Sqlite,
    Nats,
    /// `tidemark serve` on a three-node JetStream cluster (`[log] backend = "jetstream"`).
    TidemarkJetstream,
    /// NATS's own publish to a three-replica stream on the same kind of cluster.
    NatsCluster,
    /// `nats` with a window of asynchronous publishes in flight per client (`--nats-window`).
    NatsWindow,
    /// `nats-cluster` with a window of asynchronous publishes in flight per client.
    NatsClusterWindow,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::TidemarkHttp => "tidemark-http",
            System::TidemarkInproc => "tidemark-inproc",
            System::Redis => "redis",
            System::Postgres => "postgres",
            System::Sqlite => "sqlite",
            System::Nats => "nats",
            System::TidemarkJetstream => "tidemark-jetstream",
            System::NatsCluster => "nats-cluster",
            System::NatsWindow => "nats-window",
            System::NatsClusterWindow => "nats-cluster-window",
        }
    }

    /// A windowed system: the target of its closed-loop namesake (`nats-window`: `nats`),
    /// driven with a window of publishes in flight per client.
    pub fn windowed(self) -> bool {
        matches!(self, System::NatsWindow | System::NatsClusterWindow)
    }

    pub fn is_tidemark(self) -> bool {
        matches!(
            self,
            System::TidemarkHttp | System::TidemarkInproc | System::TidemarkJetstream
        )
    }

    /// Why it cannot run on this machine, if it cannot.
    pub fn missing(self, tidemark_bin: Option<&Path>) -> Option<String> {
        match self {
            System::TidemarkHttp => match tidemark_bin {
                Some(p) if p.is_file() => None,
                Some(p) => Some(format!("no tidemark binary at {}", p.display())),
                None => Some("no tidemark binary (pass --tidemark-bin)".into()),
            },
            System::TidemarkJetstream => System::TidemarkHttp
                .missing(tidemark_bin)
                .or_else(|| crate::peers::missing("nats")),
            System::NatsCluster | System::NatsWindow | System::NatsClusterWindow => {
                crate::peers::missing("nats")
            }
            System::TidemarkInproc | System::Sqlite => None,
            other => crate::peers::missing(other.name()),
        }
    }
}

/// Where a target is started.
#[derive(Clone)]
pub struct StartOpts {
    pub work: std::path::PathBuf,
    pub tidemark_bin: Option<std::path::PathBuf>,
    /// Connections the run will open (PostgreSQL's `max_connections` must allow them).
    pub max_clients: usize,
    /// tidemark-http: the server's `[log] shards`, appends spread over a tenant per shard.
    pub shards: u32,
}
