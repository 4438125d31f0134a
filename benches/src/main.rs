//! `tidemark-bench`: tidemark against Redis Streams, PostgreSQL, SQLite and NATS JetStream in
//! one run, on the same machine, each at its strongest single-node durability (acknowledged =
//! fsynced), each started here on loopback with a fresh data directory and stopped by its PID.
//! `tidemark bench …` runs this binary (the peers' client crates stay out of the server).
//!
//! Progress goes to stderr; the markdown tables at the end too; the JSON document to stdout and,
//! rewritten after every cell, to `--json-out`.
//!
//! Layout: [`events`] (what every system appends), [`targets`] (one [`targets::Target`] per
//! system), [`peers`] (starting and stopping servers), [`workloads`] (append cells, read-back,
//! growth), [`cluster_reads`], [`sse`], [`reopen`], [`measure`] (percentiles, /proc counters, strace), [`machine`]
//! (the machine and its fsync latency), [`report`] (tables and ratios).

/// mimalloc instead of glibc malloc: the folds and the writer allocate many small, short-lived
/// buffers, and glibc spent a fifth of a rebuild consolidating and unlinking them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use tidemark_benches::{
    cluster_reads, deliver, events, filled, machine, measure, peers, queue, reopen, report, sse,
    targets, workloads,
};

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

use report::{Report, Skipped, error_note};
use targets::{StartOpts, System, Target};
use workloads::{CellPlan, ClosedLoop, Driver, Rig, Windowed};

#[derive(Parser)]
#[command(
    name = "tidemark bench",
    bin_name = "tidemark bench",
    about = "tidemark against Redis Streams, PostgreSQL, SQLite and NATS JetStream, in one run",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Hidden>,
    #[command(flatten)]
    opts: Opts,
}

#[derive(Subcommand)]
enum Hidden {
    /// Child of the reopen workload: fill a log, then keep appending until killed.
    #[command(hide = true)]
    Fill {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        events: u64,
        #[arg(long, default_value_t = 0)]
        progress_every: u64,
        #[arg(long, default_value_t = 60)]
        linger_secs: u64,
    },
    /// Child of the reopen workload: open a killed log and report what it cost.
    #[command(hide = true)]
    Reopen {
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
enum Workload {
    /// The machine's fsync latency (append and overwrite).
    Fsync,
    /// Durable appends: every system × --clients × --batches.
    Append,
    /// Read back --readback-events from the start.
    Readback,
    /// Append rate per --growth-step as the log grows (batches of 1000).
    Growth,
    /// tidemark: append → SSE receipt latency.
    Sse,
    /// tidemark: reopen after kill -9 at --reopen-events.
    Reopen,
    /// tidemark-jetstream: fill the log with --readback-events, then read it from one node and
    /// from two nodes at once, as pages and as SSE streams (runs with the tidemark-jetstream
    /// system).
    ClusterReads,
    /// The delivery path beside the work queues users build (spec section 11): --queue-items
    /// enqueued, then --queue-workers × --queue-batches workers claim with a lease and report
    /// done, every step durable (tidemark-http, redis, postgres, nats).
    Queue,
    /// tidemark: notifications appended by 16 clients in batches of 100 until a webhook
    /// receiver on loopback got each (--deliver-notifications).
    Deliver,
    /// tidemark: how fast `notification.requested` events become queued deliveries
    /// (--queue-items of them).
    Route,
    /// tidemark: what --idle-tenants tenants that are never used cost the server: memory,
    /// files and idle CPU over --idle-seconds, before and after they are created.
    IdleTenants,
}

#[derive(clap::Args, serde::Serialize)]
struct Opts {
    /// Systems to run. `nats-window` and `nats-cluster-window` are `nats` and `nats-cluster`
    /// with --nats-window publishes in flight per client (append cells only).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tidemark-http,tidemark-inproc,redis,postgres,sqlite,nats"
    )]
    systems: Vec<System>,
    /// Workloads to run (default: all but reopen; --quick: fsync,append,readback,sse).
    #[arg(long, value_delimiter = ',')]
    workloads: Option<Vec<Workload>>,
    /// Concurrent clients of the append cells [full: 1,16,256; quick: 1,16].
    #[arg(long, value_delimiter = ',')]
    clients: Option<Vec<usize>>,
    /// Events per request of the append cells [1,100].
    #[arg(long, value_delimiter = ',')]
    batches: Option<Vec<usize>>,
    /// Events per append cell, at least; a cell also stops at --cell-seconds [full: 20000;
    /// quick: 2000].
    #[arg(long)]
    events: Option<u64>,
    /// Longest timed part of one append cell, seconds [full: 20; quick: 2].
    #[arg(long)]
    cell_seconds: Option<f64>,
    /// Events read back from the start [full: 1000000; quick: 20000].
    #[arg(long)]
    readback_events: Option<u64>,
    /// Publishes each client of a windowed NATS cell (nats-window, nats-cluster-window) keeps
    /// sent and unacknowledged; for batches > 1, at most 50 atomic batches are open per stream
    /// across all clients (the server's limit) [256].
    #[arg(long, default_value_t = 256)]
    nats_window: usize,
    /// cluster-reads: page readers per node (pages of 1000 over HTTP) [4].
    #[arg(long, default_value_t = 4)]
    reads_clients: usize,
    /// cluster-reads: SSE streams per node, each receiving the whole log from the start [2].
    #[arg(long, default_value_t = 2)]
    reads_sse_clients: usize,
    /// cluster-reads: the length of each of its four phases (pages and SSE, one node and two),
    /// seconds, the readers going round the log as often as it allows [full: 10; quick: 3].
    #[arg(long)]
    reads_seconds: Option<f64>,
    /// Growth target of tidemark and PostgreSQL [10000000].
    #[arg(long, default_value_t = 10_000_000)]
    growth_events: u64,
    /// Growth target of the other systems [1000000].
    #[arg(long, default_value_t = 1_000_000)]
    growth_peer_events: u64,
    /// One growth rate per this many events [1000000].
    #[arg(long, default_value_t = 1_000_000)]
    growth_step: u64,
    /// Writes + fdatasyncs per fsync mode [full: 1000; quick: 200].
    #[arg(long)]
    fsync_count: Option<usize>,
    /// Appends of the SSE latency workload [full: 2000; quick: 200].
    #[arg(long)]
    sse_events: Option<u64>,
    /// Events in the log before the reopen workload's kill [10000000].
    #[arg(long, default_value_t = 10_000_000)]
    reopen_events: u64,
    /// Kill + reopen samples [3].
    #[arg(long, default_value_t = 3)]
    reopen_samples: usize,
    /// Drop the page cache before each reopen (root), to measure a cold open.
    #[arg(long)]
    drop_caches: bool,
    /// Do not count sync calls (the strace pass after each append cell).
    #[arg(long)]
    no_fsync_count: bool,
    /// After each tidemark-http append cell, profile a pass of the same shape with `perf
    /// record` and print the server's CPU per event by layer (HTTP, front checks, handler,
    /// append body, log writer, decider, reactors, tokio).
    #[arg(long)]
    layers: bool,
    /// The preset that finishes in about a minute.
    #[arg(long)]
    quick: bool,
    /// Where the data directories go [<target>/bench-data]; must not be tmpfs.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// The `tidemark` binary to benchmark over HTTP [next to this one].
    #[arg(long, env = "TIDEMARK_BENCH_SERVER_BIN")]
    tidemark_bin: Option<PathBuf>,
    /// Write the JSON document here too (rewritten as the run goes).
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// tidemark-http: the server's `[log] shards` [1]; with more, a tenant is made in each
    /// shard but the home one and the clients' appends are spread over them and the default
    /// tenant (connection i to the i-th, round).
    #[arg(long, default_value_t = 1)]
    shards: u32,
    /// idle-tenants: tenants created [1000].
    #[arg(long, default_value_t = 1000)]
    idle_tenants: usize,
    /// idle-tenants: seconds of idleness measured before and after them [30].
    #[arg(long, default_value_t = 30.0)]
    idle_seconds: f64,
    /// queue: workers of its cells [1,16,64].
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    queue_workers: Vec<usize>,
    /// queue: items each worker claims at most per claim [1,50].
    #[arg(long, value_delimiter = ',', default_value = "1,50")]
    queue_batches: Vec<usize>,
    /// queue: items enqueued and done per cell; route: notifications routed [20000].
    #[arg(long, default_value_t = 20_000)]
    queue_items: u64,
    /// queue: longest timed part of one cell, seconds [60].
    #[arg(long, default_value_t = 60.0)]
    queue_seconds: f64,
    /// deliver: notifications appended and received [20000].
    #[arg(long, default_value_t = 20_000)]
    deliver_notifications: u64,
}

/// The options with the preset applied.
struct Plan {
    workloads: Vec<Workload>,
    clients: Vec<usize>,
    batches: Vec<usize>,
    events: u64,
    cell_seconds: f64,
    readback_events: u64,
    fsync_count: usize,
    sse_events: u64,
    reads_seconds: f64,
}

impl Opts {
    fn plan(&self) -> Plan {
        let q = self.quick;
        Plan {
            workloads: self.workloads.clone().unwrap_or_else(|| {
                use Workload::*;
                if q {
                    vec![Fsync, Append, Readback, Sse]
                } else {
                    vec![Fsync, Append, Growth, Readback, Sse, ClusterReads]
                }
            }),
            clients: self
                .clients
                .clone()
                .unwrap_or_else(|| if q { vec![1, 16] } else { vec![1, 16, 256] }),
            batches: self.batches.clone().unwrap_or_else(|| vec![1, 100]),
            events: self.events.unwrap_or(if q { 2_000 } else { 20_000 }),
            cell_seconds: self.cell_seconds.unwrap_or(if q { 2.0 } else { 20.0 }),
            readback_events: self
                .readback_events
                .unwrap_or(if q { 20_000 } else { 1_000_000 }),
            fsync_count: self.fsync_count.unwrap_or(if q { 200 } else { 1000 }),
            sse_events: self.sse_events.unwrap_or(if q { 200 } else { 2000 }),
            reads_seconds: self.reads_seconds.unwrap_or(if q { 3.0 } else { 10.0 }),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Some(Hidden::Fill {
            dir,
            events,
            progress_every,
            linger_secs,
        }) => reopen::fill_main(&dir, events, progress_every, linger_secs),
        Some(Hidden::Reopen { dir }) => reopen::reopen_main(&dir),
        None => bench_main(&cli.opts),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tidemark bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The `tidemark` binary next to this one (both are built into the same target directory).
fn default_tidemark_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("tidemark"), dir.parent()?.join("tidemark")]
        .into_iter()
        .find(|p| p.is_file())
}

/// A started target of any system, so each workload is written once, generic over Target.
enum AnyTarget {
    TidemarkHttp(targets::tidemark::TidemarkHttp),
    TidemarkInproc(targets::tidemark::TidemarkInproc),
    Redis(targets::redis::Redis),
    Postgres(targets::postgres::Postgres),
    Sqlite(targets::sqlite::Sqlite),
    Nats(targets::nats::Nats),
    TidemarkJetstream(targets::cluster::TidemarkJetStream),
    NatsCluster(targets::cluster::NatsOnCluster),
}

macro_rules! dispatch {
    ($t:expr, |$x:ident| $body:expr) => {
        match $t {
            AnyTarget::TidemarkHttp($x) => $body,
            AnyTarget::TidemarkInproc($x) => $body,
            AnyTarget::Redis($x) => $body,
            AnyTarget::Postgres($x) => $body,
            AnyTarget::Sqlite($x) => $body,
            AnyTarget::Nats($x) => $body,
            AnyTarget::TidemarkJetstream($x) => $body,
            AnyTarget::NatsCluster($x) => $body,
        }
    };
}

struct Run<'a> {
    opts: &'a Opts,
    plan: Plan,
    start: StartOpts,
    report: Report,
}

impl Run<'_> {
    /// Rewrite `--json-out` with what is known so far.
    fn save(&self) {
        if let Some(path) = &self.opts.json_out
            && let Ok(text) = serde_json::to_string_pretty(&self.report)
            && let Err(e) = std::fs::write(path, format!("{text}\n"))
        {
            eprintln!("cannot write {}: {e}", path.display());
        }
    }

    fn wants(&self, w: Workload) -> bool {
        self.plan.workloads.contains(&w)
    }

    async fn start(&self, system: System) -> Result<AnyTarget, String> {
        let o = &self.start;
        Ok(match system {
            System::TidemarkHttp => {
                AnyTarget::TidemarkHttp(targets::tidemark::TidemarkHttp::start(o).await?)
            }
            System::TidemarkInproc => {
                AnyTarget::TidemarkInproc(targets::tidemark::TidemarkInproc::start(o).await?)
            }
            System::Redis => AnyTarget::Redis(targets::redis::Redis::start(o).await?),
            System::Postgres => AnyTarget::Postgres(targets::postgres::Postgres::start(o).await?),
            System::Sqlite => AnyTarget::Sqlite(targets::sqlite::Sqlite::start(o).await?),
            // A windowed system drives the same target.
            System::Nats | System::NatsWindow => {
                AnyTarget::Nats(targets::nats::Nats::start(o).await?)
            }
            System::TidemarkJetstream => {
                AnyTarget::TidemarkJetstream(targets::cluster::TidemarkJetStream::start(o).await?)
            }
            System::NatsCluster | System::NatsClusterWindow => {
                AnyTarget::NatsCluster(targets::cluster::NatsOnCluster::start(o).await?)
            }
        })
    }

    /// Every workload of one system, each on a freshly started server.
    async fn system(&mut self, system: System, seed: u64) {
        if system.windowed() {
            // The windowed cells are append cells of the plain system's target; its other
            // workloads would measure nothing new.
            if self.wants(Workload::Append) {
                let w = Windowed(self.opts.nats_window);
                match self.start(system).await {
                    Ok(AnyTarget::Nats(x)) => self.append_cells(x, seed, &w).await,
                    Ok(AnyTarget::NatsCluster(x)) => self.append_cells(x, seed, &w).await,
                    Ok(other) => dispatch!(other, |x| x.stop().await),
                    Err(e) => self.fail(system, "append", e),
                }
            }
            return;
        }
        if self.wants(Workload::Append) {
            match self.start(system).await {
                Ok(t) => dispatch!(t, |x| self.append_cells(x, seed, &ClosedLoop).await),
                Err(e) => self.fail(system, "append", e),
            }
        }
        if system == System::TidemarkJetstream && self.wants(Workload::ClusterReads) {
            match targets::cluster::TidemarkJetStream::start(&self.start).await {
                Ok(t) => {
                    let plan = cluster_reads::ReadsPlan {
                        events: self.plan.readback_events,
                        clients: self.opts.reads_clients,
                        sse_clients: self.opts.reads_sse_clients,
                        seconds: self.plan.reads_seconds,
                    };
                    self.report.cluster_reads = Some(cluster_reads::cluster_reads(t, &plan).await);
                }
                Err(e) => self.fail(system, "cluster-reads", e),
            }
            self.save();
        }
        let grow = self.wants(Workload::Growth);
        if grow || self.wants(Workload::Readback) {
            match self.start(system).await {
                Ok(t) => dispatch!(t, |x| self.grow_and_read(x, system, seed + 1).await),
                Err(e) => self.fail(system, "growth/readback", e),
            }
        }
        self.queue_workloads(system).await;
        if system == System::TidemarkHttp && self.wants(Workload::Sse) {
            match targets::tidemark::TidemarkHttp::start(&self.start).await {
                Ok(t) => {
                    eprintln!("sse: {} appends, one client", self.plan.sse_events);
                    let r = sse::sse_latency(&t, self.plan.sse_events).await;
                    eprintln!(
                        "  POST → SSE receipt p50 {} µs  p99 {} µs{}",
                        r.append_to_receipt_us.p50,
                        r.append_to_receipt_us.p99,
                        r.error
                            .as_deref()
                            .map(|e| format!("  error: {e}"))
                            .unwrap_or_default()
                    );
                    self.report.sse = Some(r);
                    t.stop().await;
                }
                Err(e) => self.fail(system, "sse", e),
            }
            self.save();
        }
    }

    /// The `queue` cells of one system, on one server (each cell a fresh queue of its own).
    async fn queue_cells<Q: queue::Queue>(&mut self, q: Q) {
        let q = std::sync::Arc::new(q);
        let mut cell = 0;
        for &workers in &self.opts.queue_workers {
            for &batch in &self.opts.queue_batches {
                cell += 1;
                let c = queue::queue_cell(
                    &q,
                    cell,
                    workers,
                    batch,
                    self.opts.queue_items,
                    self.opts.queue_seconds,
                )
                .await;
                eprintln!(
                    "  queue {:<14} workers {:>3} batch {:>3}  {:>6} items {:>8} items/s  p50 {:>7} µs  \
                     p99 {:>7} µs  cpu {:>7} µs/item  ctxsw {:>6}/item  device {:>6} B/item  \
                     (enqueued in {:.3} s){}",
                    c.system,
                    c.workers,
                    c.batch,
                    c.items,
                    c.items_per_sec,
                    c.latency_us.p50,
                    c.latency_us.p99,
                    c.cpu_us_per_item,
                    c.ctx_switches_per_item,
                    c.device_bytes_per_item
                        .map_or("n/a".into(), |v| format!("{v:.0}")),
                    c.enqueue_seconds,
                    error_note(c.error.as_deref(), "  ")
                );
                self.report.queue.push(c);
                self.save();
            }
        }
        match std::sync::Arc::try_unwrap(q) {
            Ok(q) => q.stop().await,
            Err(_) => eprintln!("  (a queue's server outlived its cells)"),
        }
    }

    /// [`Run::queue_cells`] of a queue that started, or why it did not.
    async fn cells_of<Q: queue::Queue>(&mut self, q: Result<Q, String>) -> Result<(), String> {
        self.queue_cells(q?).await;
        Ok(())
    }

    /// The `queue`, `deliver` and `route` workloads of one system.
    async fn queue_workloads(&mut self, system: System) {
        if self.wants(Workload::Queue) {
            let o = self.start.clone();
            let r = match system {
                System::TidemarkHttp => self.cells_of(queue::TidemarkQueue::start(&o).await).await,
                System::TidemarkJetstream => {
                    self.cells_of(queue::TidemarkQueue::start_jetstream(&o).await)
                        .await
                }
                System::Redis => self.cells_of(queue::RedisQueue::start(&o).await).await,
                System::Postgres => self.cells_of(queue::PostgresQueue::start(&o).await).await,
                System::Nats => self.cells_of(queue::NatsQueue::start(&o).await).await,
                _ => Ok(()),
            };
            if let Err(e) = r {
                self.fail(system, "queue", e);
            }
        }
        if system != System::TidemarkHttp {
            return;
        }
        if self.wants(Workload::IdleTenants) {
            let idle = Duration::from_secs_f64(self.opts.idle_seconds);
            let r = tidemark_benches::idle::idle_tenants(&self.start, self.opts.idle_tenants, idle)
                .await;
            eprintln!("{}", r.summary());
            self.report.idle_tenants = Some(r);
            self.save();
        }
        if self.wants(Workload::Route) {
            let r = deliver::route(&self.start, self.opts.queue_items).await;
            eprintln!(
                "  route: {} notifications → queued deliveries in {:.3} s: {} /s, cpu {} µs each{}",
                r.notifications,
                r.seconds,
                r.notifications_per_sec,
                r.cpu_us_per_notification,
                error_note(r.error.as_deref(), "  ")
            );
            self.report.route = Some(r);
            self.save();
        }
        if self.wants(Workload::Deliver) {
            let d = deliver::deliver(&self.start, 16, 100, self.opts.deliver_notifications).await;
            eprintln!(
                "  deliver: {} of {} received in {:.3} s: {} /s, append → receipt p50 {} µs p99 {} µs, \
                 cpu {} µs each{}",
                d.received,
                d.notifications,
                d.seconds,
                d.notifications_per_sec,
                d.latency_us.p50,
                d.latency_us.p99,
                d.cpu_us_per_notification,
                error_note(d.error.as_deref(), "  ")
            );
            self.report.deliver = Some(d);
            self.save();
        }
    }

    fn fail(&mut self, system: System, what: &str, e: String) {
        eprintln!("{}: {what}: cannot start: {e}", system.name());
        self.report.skipped.push(Skipped {
            system: system.name().into(),
            reason: format!("{what}: cannot start: {e}"),
        });
        self.save();
    }

    async fn append_cells<T: Target, D: Driver<T>>(&mut self, t: T, seed: u64, driver: &D) {
        let mut rig = Rig::new(t, seed);
        let window = driver.window().unwrap_or(1);
        for &clients in &self.plan.clients.clone() {
            for &batch in &self.plan.batches.clone() {
                let plan = CellPlan {
                    clients,
                    batch,
                    // At least five requests per client (five windows of them), so a cell
                    // is mostly its steady state; --cell-seconds ends it sooner.
                    events: self.plan.events.max((clients * batch * 5 * window) as u64),
                    seconds: self.plan.cell_seconds,
                    count_fsyncs: !self.opts.no_fsync_count,
                    layers: self.opts.layers,
                };
                let c = workloads::append_cell(&mut rig, &plan, driver).await;
                eprintln!(
                    "  {:<19} clients {:>4} batch {:>4}  {:>8} events {:>10} events/s  p50 {:>7} µs  \
                     p99 {:>7} µs  pause {:>7} µs  cpu {:>6} µs/ev  ctxsw {:>6}/ev  wchar {:>6} B/ev  \
                     page cache {:>6} B/ev  device {:>6} B/ev  fsync/ev {}{}",
                    c.system,
                    c.clients,
                    c.batch,
                    c.events,
                    c.events_per_sec,
                    c.latency_us.p50,
                    c.latency_us.p99,
                    c.longest_pause_us,
                    c.cpu_us_per_event,
                    c.ctx_switches_per_event,
                    c.wchar_per_event,
                    c.write_bytes_per_event,
                    c.device_bytes_per_event
                        .map_or("n/a".into(), |v| v.to_string()),
                    c.fsyncs_per_event.map_or("-".into(), |v| v.to_string()),
                    error_note(c.error.as_deref(), "  ")
                );
                self.report.append.push(c);
                self.save();
            }
        }
        rig.stop().await;
    }

    async fn grow_and_read<T: Target>(&mut self, t: T, system: System, seed: u64) {
        let mut rig = Rig::new(t, seed);
        if self.wants(Workload::Growth) {
            let total = if system.is_tidemark() || system == System::Postgres {
                self.opts.growth_events
            } else {
                self.opts.growth_peer_events
            };
            // Roughly what each event costs on disk at most, with indexes and journals.
            let need = total.saturating_mul(2048);
            match measure::free_bytes(&self.start.work) {
                Some(free) if free < need => {
                    let msg = format!(
                        "growth to {total} needs about {} GiB free, {} GiB are",
                        need >> 30,
                        free >> 30
                    );
                    eprintln!("{}: {msg}", system.name());
                    self.report.skipped.push(Skipped {
                        system: system.name().into(),
                        reason: msg,
                    });
                }
                _ => {
                    let g = filled::growth(&mut rig, total, self.opts.growth_step).await;
                    self.report.growth.push(g);
                    self.save();
                }
            }
        }
        if self.wants(Workload::Readback) {
            let n = self.plan.readback_events;
            if let Err(e) = filled::fill(&mut rig, n).await {
                self.fail(system, "readback fill", e);
            } else {
                let r = filled::readback(&mut rig, n).await;
                eprintln!(
                    "  readback {:<16} {:>9} events {:>10} events/s {:>7} MB/s{}",
                    r.system,
                    r.events,
                    r.events_per_sec,
                    r.mb_per_sec,
                    error_note(r.error.as_deref(), "  ")
                );
                self.report.readback.push(r);
                self.save();
            }
        }
        rig.stop().await;
    }
}

fn bench_main(opts: &Opts) -> Result<(), String> {
    let plan = opts.plan();
    if let Some(&b) = plan.batches.iter().find(|b| **b == 0 || **b > 1000) {
        return Err(format!("--batches {b}: a batch holds 1 to 1000 events"));
    }
    if plan.clients.contains(&0) {
        return Err("--clients: at least 1".into());
    }
    if !(1..=targets::nats::MAX_WINDOW).contains(&opts.nats_window) {
        return Err(format!(
            "--nats-window {}: from 1 to {}",
            opts.nats_window,
            targets::nats::MAX_WINDOW
        ));
    }
    let work = machine::work_dir(opts.work_dir.as_ref())?;
    let machine = machine::machine(&work);
    if machine.work_fs_type == "tmpfs" {
        eprintln!("WARNING: the data directory is on tmpfs: fsync is free there; use --work-dir");
    }
    peers::stop_all_on_signal();
    let tidemark_bin = opts.tidemark_bin.clone().or_else(default_tidemark_bin);
    eprintln!(
        "tidemark bench: {} cpus, {} MiB, data in {} ({}), uptime: {}",
        machine.cpus,
        machine.mem_total_kb / 1024,
        machine.work_dir,
        machine.work_fs_type,
        machine.uptime
    );
    let max_clients = plan.clients.iter().copied().max().unwrap_or(1).max(4);
    let mut run = Run {
        opts,
        start: StartOpts {
            work: work.clone(),
            tidemark_bin: tidemark_bin.clone(),
            max_clients,
            shards: opts.shards.max(1),
        },
        report: Report {
            benchmark: "tidemark bench",
            machine: Some(machine),
            options: json!({
                "systems": opts.systems,
                "shards": opts.shards,
                "workloads": plan.workloads,
                "clients": plan.clients,
                "batches": plan.batches,
                "events_per_cell": plan.events,
                "cell_seconds": plan.cell_seconds,
                "readback_events": plan.readback_events,
                "nats_window": opts.nats_window,
                "reads_clients": opts.reads_clients,
                "reads_sse_clients": opts.reads_sse_clients,
                "reads_seconds": plan.reads_seconds,
                "growth_events": opts.growth_events,
                "growth_peer_events": opts.growth_peer_events,
                "growth_step": opts.growth_step,
                "payload_bytes": events::PAYLOAD_BYTES,
                "subjects": events::SUBJECTS,
                "quick": opts.quick,
                "tidemark_bin": tidemark_bin,
                "queue_workers": opts.queue_workers,
                "queue_batches": opts.queue_batches,
                "queue_items": opts.queue_items,
                "queue_seconds": opts.queue_seconds,
                "deliver_notifications": opts.deliver_notifications,
            }),
            ..Report::default()
        },
        plan,
    };
    if run.wants(Workload::Fsync) {
        let dir = targets::tidemark::temp_dir_in(&work, "fsync-")?;
        for overwrite in [false, true] {
            let f = machine::fsync_bench(dir.path(), run.plan.fsync_count, overwrite)?;
            eprintln!(
                "fsync {:<9}  {} x 4 KiB  p50 {} µs  p99 {} µs  p99.9 {} µs",
                f.mode, f.latency_us.count, f.latency_us.p50, f.latency_us.p99, f.latency_us.p999
            );
            run.report.fsync.push(f);
        }
        for mode in tidemark_benches::journal_write::MODES {
            let j = match tidemark_benches::journal_write::bench(
                dir.path(),
                run.plan.fsync_count,
                mode,
            ) {
                Ok(j) => j,
                // io_uring may be refused (a container's seccomp profile), O_DIRECT on tmpfs.
                Err(e) => {
                    eprintln!("journal record {mode:<12}  skipped: {e}");
                    continue;
                }
            };
            eprintln!(
                "journal record {:<12}  {} x {} B  p50 {} µs  p99 {} µs  cpu {:.1} µs  ctx {:.2}  device {} B",
                j.mode,
                j.latency_us.count,
                j.record_bytes,
                j.latency_us.p50,
                j.latency_us.p99,
                j.cpu_us_per_record,
                j.ctx_switches_per_record,
                j.device_bytes_per_record
                    .map_or("n/a".into(), |b| format!("{b:.0}"))
            );
            run.report.journal_write.push(j);
        }
        run.save();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))?;
    for (i, &system) in opts.systems.iter().enumerate() {
        if let Some(reason) = system.missing(tidemark_bin.as_deref()) {
            eprintln!("{}: skipped: {reason}", system.name());
            run.report.skipped.push(Skipped {
                system: system.name().into(),
                reason,
            });
            continue;
        }
        eprintln!("{}:", system.name());
        rt.block_on(run.system(system, 1000 * (i as u64 + 1)));
        run.report.compute_ratios();
        run.save();
    }
    if run.wants(Workload::Reopen) {
        let r = reopen::reopen_workload(
            &reopen::ReopenOpts {
                events: opts.reopen_events,
                samples: opts.reopen_samples,
                rerun_events: 300_000,
                drop_caches: opts.drop_caches,
            },
            &work,
        )?;
        run.report.reopen = Some(serde_json::to_value(&r).map_err(|e| e.to_string())?);
    }
    run.report.compute_ratios();
    run.report.uptime_after = Some(machine::uptime());
    run.report.complete = true;
    run.save();
    eprintln!("\n{}", run.report.markdown());
    let text = serde_json::to_string_pretty(&run.report).map_err(|e| e.to_string())?;
    println!("{text}");
    Ok(())
}
