//! Durable append benchmark of tidemark (spec section 11).
//!
//! A plain `main` (`harness = false`). Run it with
//!
//! ```text
//! cargo bench -p tidemark-benches --bench append -- [options]
//! ```
//!
//! Progress rows and the closing markdown tables go to stderr; the JSON document with every
//! figure goes to stdout (and to `--json-out FILE`), so `... > results.json` keeps it clean.
//!
//! # Layout
//! - Workload `fsync`: what one 4 KiB write + `sync_data` costs on the filesystem of the data
//!   directory. Every durable append pays at least this, so it is the yardstick of the latency
//!   target.
//! - [`Target`]: one system under test as the append workloads see it. [`InProcess`] drives a
//!   `tidemark_log::Log` directly, [`Http`] posts to a `tidemark_api::run` server started in
//!   this process on its own runtime. A peer (Redis Streams, NATS) is one more implementation.
//! - [`drive`]: N appenders, each appending one batch at a time and awaiting its durable reply,
//!   over a fixed number of events; hdrhistogram latency per append.
//! - Workload `reopen`: a child (this executable, hidden subcommand `fill`) appends until the
//!   log holds N events, is killed with SIGKILL mid-flight, and another child (`reopen`)
//!   measures `Log::open` on the dirty file, with its peak memory.
//! - The report: one row per run, a table of the targets of the issue, the JSON document.

use std::fmt::Write as _;
use std::future::Future;
use std::io::{BufRead, BufReader, Write as _};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::json;
use tidemark_log::{Log, LogConfig, NewEvent};

const STREAM: &str = "task_events";
const EVENT_TYPE: &str = "bench.appended";
/// Canonical payload size of every benchmark event.
const PAYLOAD_BYTES: usize = 256;
/// Distinct subjects (task ids) the events are spread over.
const SUBJECTS: u64 = 10_000;

#[derive(Parser)]
#[command(
    name = "append",
    about = "tidemark durable append benchmark",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    opts: Opts,
}

#[derive(Subcommand)]
enum Cmd {
    /// Child of the reopen workload: append until the log holds `events` events, report it on
    /// stdout, and keep appending until killed (or until `linger_secs` have passed).
    #[command(hide = true)]
    Fill {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        events: u64,
        /// Print a progress line (head, RSS) every this many events; 0: none.
        #[arg(long, default_value_t = 0)]
        progress_every: u64,
        #[arg(long, default_value_t = 60)]
        linger_secs: u64,
        #[command(flatten)]
        knobs: LogKnobs,
    },
    /// Child of the reopen workload: open the log, report what it cost, close it.
    #[command(hide = true)]
    Reopen {
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        knobs: LogKnobs,
    },
}

/// Log settings to try other than the defaults (`LogConfig::new`, `api/src/defaults.toml`), to
/// find out where time goes. They apply to every workload that opens a log.
#[derive(Args, Clone, Copy, Default, Serialize)]
struct LogKnobs {
    /// Override `quick_repair`.
    #[arg(long)]
    log_quick_repair: Option<bool>,
    /// Override `merge_threshold`.
    #[arg(long)]
    log_merge_threshold: Option<usize>,
    /// Override `max_group_events`.
    #[arg(long)]
    log_max_group_events: Option<usize>,
    /// Override the page cache size, MiB.
    #[arg(long)]
    log_cache_mb: Option<usize>,
}

impl LogKnobs {
    fn log_config(&self, path: PathBuf) -> LogConfig {
        let mut c = LogConfig::new(path);
        if let Some(v) = self.log_quick_repair {
            c.quick_repair = v;
        }
        if let Some(v) = self.log_merge_threshold {
            c.merge_threshold = v;
        }
        if let Some(v) = self.log_max_group_events {
            c.max_group_events = v;
        }
        if let Some(v) = self.log_cache_mb {
            c.cache_bytes = v * 1024 * 1024;
        }
        c
    }

    fn apply_to_server(&self, c: &mut tidemark_api::config::LogSettings) {
        if let Some(v) = self.log_quick_repair {
            c.quick_repair = v;
        }
        if let Some(v) = self.log_merge_threshold {
            c.merge_threshold = v;
        }
        if let Some(v) = self.log_max_group_events {
            c.max_group_events = v;
        }
        if let Some(v) = self.log_cache_mb {
            c.cache_mb = v;
        }
    }

    /// The same overrides as arguments of a child process.
    fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        let mut push = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                a.push(format!("--{k}={v}"));
            }
        };
        push(
            "log-quick-repair",
            self.log_quick_repair.map(|v| v.to_string()),
        );
        push(
            "log-merge-threshold",
            self.log_merge_threshold.map(|v| v.to_string()),
        );
        push(
            "log-max-group-events",
            self.log_max_group_events.map(|v| v.to_string()),
        );
        push("log-cache-mb", self.log_cache_mb.map(|v| v.to_string()));
        a
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
enum Workload {
    Fsync,
    Inproc,
    Http,
    Reopen,
}

#[derive(Args)]
struct Opts {
    /// Workloads to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fsync,inproc,http,reopen"
    )]
    only: Vec<Workload>,
    /// Writes + fsyncs per fsync mode.
    #[arg(long, default_value_t = 2000)]
    fsync_count: usize,
    /// Concurrent appenders of the append workloads.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    appenders: Vec<usize>,
    /// Events per in-process run with more than one appender.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// Events per run with a single appender appending one event at a time.
    #[arg(long, default_value_t = 5_000)]
    single_events: u64,
    /// Events per HTTP run with batches of one and more than one appender.
    #[arg(long, default_value_t = 100_000)]
    http_events: u64,
    /// Events per HTTP run with batches of `--batch` events (any number of appenders).
    #[arg(long, default_value_t = 200_000)]
    http_batch_events: u64,
    /// Events per batch of the batched variants (at most 1000; 0 or 1: no batched runs).
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Events in the log before it is killed and reopened.
    #[arg(long, default_value_t = 10_000_000)]
    reopen_events: u64,
    /// Kill + reopen samples.
    #[arg(long, default_value_t = 3)]
    reopen_samples: usize,
    /// Events the filler appends before the second and later kills.
    #[arg(long, default_value_t = 300_000)]
    reopen_rerun_events: u64,
    /// Drop the OS page cache before each reopen (needs root), to measure a cold open.
    #[arg(long)]
    drop_caches: bool,
    /// Where the data directories go (default: `<target dir>/bench-data`). Must not be tmpfs
    /// for the figures to mean anything.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Also write the JSON document here.
    #[arg(long)]
    json_out: Option<PathBuf>,
    #[command(flatten)]
    knobs: LogKnobs,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Some(Cmd::Fill {
            dir,
            events,
            progress_every,
            linger_secs,
            knobs,
        }) => fill_main(&dir, events, progress_every, linger_secs, knobs),
        Some(Cmd::Reopen { dir, knobs }) => reopen_main(&dir, knobs),
        None => bench_main(&cli.opts),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("append bench: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Events

/// splitmix64: a bijection on u64, so distinct inputs give distinct, random-looking outputs.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The i-th event of a run. Event ids are unique within a run and random-looking, so the
/// `event_id` index receives random keys, as it would from real clients.
#[derive(Clone, Copy)]
struct EventGen {
    seed: u64,
}

impl EventGen {
    fn new(seed: u64) -> Self {
        EventGen { seed: mix(seed) }
    }

    /// A generator whose ids do not repeat those of an earlier process on the same log.
    fn from_clock() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        EventGen::new(nanos ^ u64::from(std::process::id()))
    }

    fn event_id(&self, i: u64) -> String {
        format!("bench-{:016x}", mix(i ^ self.seed))
    }

    fn subject(&self, i: u64) -> String {
        format!("task-{}", mix(i.wrapping_add(self.seed)) % SUBJECTS)
    }

    /// `{"n":i,"pad":"xxx…"}`, padded to exactly `PAYLOAD_BYTES` canonical bytes.
    fn payload(&self, i: u64) -> serde_json::Value {
        let base = r#"{"n":,"pad":""}"#.len() + i.to_string().len();
        json!({"n": i, "pad": "x".repeat(PAYLOAD_BYTES - base)})
    }

    fn new_event(&self, i: u64) -> NewEvent {
        NewEvent::new(
            Some(self.event_id(i)),
            STREAM,
            self.subject(i),
            EVENT_TYPE,
            &self.payload(i),
        )
        .expect("benchmark events are valid")
    }

    fn batch(&self, seqs: Range<u64>) -> Vec<NewEvent> {
        seqs.map(|i| self.new_event(i)).collect()
    }

    /// The HTTP body `{"events":[...]}` of a batch.
    fn http_body(&self, seqs: Range<u64>) -> Vec<u8> {
        let events: Vec<serde_json::Value> = seqs
            .map(|i| {
                json!({
                    "event_id": self.event_id(i),
                    "stream": STREAM,
                    "subject": self.subject(i),
                    "type": EVENT_TYPE,
                    "payload": self.payload(i),
                })
            })
            .collect();
        serde_json::to_vec(&json!({ "events": events })).expect("JSON encodes")
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring

fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 10 min, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Latency percentiles in microseconds.
#[derive(Serialize, Clone, Copy, Default)]
struct Percentiles {
    count: u64,
    p50: u64,
    p99: u64,
    p999: u64,
    max: u64,
    mean: f64,
}

impl From<&Histogram<u64>> for Percentiles {
    fn from(h: &Histogram<u64>) -> Self {
        Percentiles {
            count: h.len(),
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: (h.mean() * 10.0).round() / 10.0,
        }
    }
}

/// One line of /proc/self/status, in kB (`VmRSS`, `VmHWM`).
fn proc_status_kb(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Bytes this process caused to be written to storage so far.
fn proc_io_write_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// The machine and where the data goes

#[derive(Serialize)]
struct Machine {
    cpus: usize,
    mem_total_kb: u64,
    kernel: String,
    work_dir: String,
    work_fs_type: String,
    work_fs_device: String,
    /// `git describe --always --dirty` of the workspace: which code was measured.
    source: String,
}

fn work_dir(opts: &Opts) -> Result<PathBuf, String> {
    let dir = match &opts.work_dir {
        Some(d) => d.clone(),
        None => target_dir()?.join("bench-data"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    dir.canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))
}

/// The cargo target directory: `CARGO_TARGET_DIR`, or the one this executable was built into
/// (`<target>/release/deps/append-<hash>`).
fn target_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    exe.ancestors()
        .find(|p| p.join("CACHEDIR.TAG").exists())
        .map(Path::to_path_buf)
        .or_else(|| exe.ancestors().nth(3).map(Path::to_path_buf))
        .ok_or_else(|| "cannot find the target directory; pass --work-dir".to_owned())
}

/// (device, fs type) of the mount holding `dir`: the longest mount point that is a prefix.
fn filesystem_of(dir: &Path) -> (String, String) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best: Option<(usize, String, String)> = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 3 || !dir.starts_with(f[1]) {
            continue;
        }
        if best.as_ref().is_none_or(|(len, _, _)| f[1].len() >= *len) {
            best = Some((f[1].len(), f[0].to_owned(), f[2].to_owned()));
        }
    }
    best.map(|(_, dev, fs)| (dev, fs))
        .unwrap_or_else(|| ("?".into(), "?".into()))
}

fn machine(work: &Path) -> Machine {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_total_kb = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let (dev, fs) = filesystem_of(work);
    Machine {
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem_total_kb,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        work_dir: work.display().to_string(),
        work_fs_type: fs,
        work_fs_device: dev,
        source: Command::new("git")
            .args(["describe", "--always", "--dirty"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default(),
    }
}

fn temp_dir_in(work: &Path, prefix: &str) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(work)
        .map_err(|e| format!("cannot create a data directory in {}: {e}", work.display()))
}

// ---------------------------------------------------------------------------------------------
// Workload: fsync

#[derive(Serialize)]
struct FsyncResult {
    /// `append`: each write extends the file (metadata changes too, like a growing log);
    /// `overwrite`: writes go to a preallocated, already durable region.
    mode: &'static str,
    block_bytes: usize,
    latency_us: Percentiles,
}

fn fsync_bench(dir: &Path, count: usize, overwrite: bool) -> Result<FsyncResult, String> {
    const BLOCK: usize = 4096;
    let io = |e: std::io::Error| format!("fsync bench: {e}");
    let path = dir.join(if overwrite {
        "fsync-overwrite.dat"
    } else {
        "fsync-append.dat"
    });
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io)?;
    if overwrite {
        file.write_all_at(&vec![0u8; BLOCK * count], 0)
            .map_err(io)?;
        file.sync_all().map_err(io)?;
    }
    let block = [0xA5u8; BLOCK];
    let mut h = new_histogram();
    for i in 0..count {
        let t0 = Instant::now();
        file.write_all_at(&block, (i * BLOCK) as u64).map_err(io)?;
        file.sync_data().map_err(io)?;
        h.saturating_record(micros(t0.elapsed()));
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok(FsyncResult {
        mode: if overwrite { "overwrite" } else { "append" },
        block_bytes: BLOCK,
        latency_us: Percentiles::from(&h),
    })
}

// ---------------------------------------------------------------------------------------------
// Append targets and the driver

/// One system under test, as the append workloads see it. `prepare` builds a batch (not
/// timed as latency: it is the client's own work); `append` sends it and resolves when the
/// batch is durable.
trait Target: Send + Sync + 'static {
    type Batch: Send + 'static;
    fn prepare(&self, evgen: &EventGen, seqs: Range<u64>) -> Self::Batch;
    /// Resolves to the receipt's `last_seq`, the head right after the commit that took the
    /// batch: distinct values count the group commits.
    fn append(&self, batch: Self::Batch) -> impl Future<Output = Result<u64, String>> + Send;
}

/// `tidemark_log::Log` in this process.
struct InProcess {
    log: Log,
}

impl Target for InProcess {
    type Batch = Vec<NewEvent>;

    fn prepare(&self, evgen: &EventGen, seqs: Range<u64>) -> Vec<NewEvent> {
        evgen.batch(seqs)
    }

    async fn append(&self, batch: Vec<NewEvent>) -> Result<u64, String> {
        let receipt = self.log.append(batch).await.map_err(|e| e.to_string())?;
        // A duplicate would mean the generator repeated an id, and the run measured less work.
        if receipt.events.iter().any(|e| e.duplicate) {
            return Err("the log reported a duplicate event_id".into());
        }
        Ok(receipt.last_seq)
    }
}

/// `POST /v1/events` on a server over loopback, one shared keep-alive client.
struct Http {
    client: reqwest::Client,
    url: String,
}

impl Target for Http {
    type Batch = Vec<u8>;

    fn prepare(&self, evgen: &EventGen, seqs: Range<u64>) -> Vec<u8> {
        evgen.http_body(seqs)
    }

    async fn append(&self, body: Vec<u8>) -> Result<u64, String> {
        let resp = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("POST {}: {e}", self.url))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("reading the reply: {e}"))?;
        if status != reqwest::StatusCode::CREATED {
            return Err(format!(
                "POST {} answered {status}: {}",
                self.url,
                String::from_utf8_lossy(&body)
            ));
        }
        let receipt: HttpReceipt = serde_json::from_slice(&body)
            .map_err(|e| format!("unexpected reply {}: {e}", String::from_utf8_lossy(&body)))?;
        if receipt.events.iter().any(|e| e.duplicate) {
            return Err("the server reported a duplicate event_id".into());
        }
        Ok(receipt.last_seq)
    }
}

#[derive(serde::Deserialize)]
struct HttpReceipt {
    events: Vec<HttpAppended>,
    last_seq: u64,
}

#[derive(serde::Deserialize)]
struct HttpAppended {
    duplicate: bool,
}

/// One append run.
#[derive(Serialize, Clone)]
struct AppendRun {
    target: &'static str,
    appenders: usize,
    batch: usize,
    events: u64,
    requests: u64,
    seconds: f64,
    events_per_sec: f64,
    /// Per append call (in-process) or per request (HTTP), from send to durable reply.
    latency_us: Percentiles,
    /// Group commits that carried the measured appends, and their mean size.
    commits: u64,
    events_per_commit: f64,
    /// Bytes this process (client, server and log) caused to be written to disk during the
    /// run, per event (`write_bytes` of /proc/self/io).
    disk_bytes_per_event: f64,
}

/// `appenders` tasks, each taking the next batch of `batch` events, appending it and awaiting
/// the reply, until `events` events are durable. The clock starts after a warm-up batch per
/// appender.
async fn drive<T: Target>(
    target: Arc<T>,
    name: &'static str,
    evgen: EventGen,
    events: u64,
    appenders: usize,
    batch: usize,
) -> Result<AppendRun, String> {
    let batch = batch.max(1);
    let batches = events.div_ceil(batch as u64);
    let appenders = appenders.max(1);
    let next = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(appenders + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..appenders {
        let (target, next, barrier) = (target.clone(), next.clone(), barrier.clone());
        tasks.spawn(async move {
            // Warm-up, not measured: one batch per appender (events past the measured range),
            // so connections are open and the writer is running when the clock starts.
            let lo = events + (t * batch) as u64;
            let warm = target
                .append(target.prepare(&evgen, lo..lo + batch as u64))
                .await;
            barrier.wait().await;
            warm?;
            let mut h = new_histogram();
            let mut commits = Vec::new();
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= batches {
                    break;
                }
                let lo = k * batch as u64;
                let b = target.prepare(&evgen, lo..(lo + batch as u64).min(events));
                let t0 = Instant::now();
                commits.push(target.append(b).await?);
                h.saturating_record(micros(t0.elapsed()));
            }
            Ok::<_, String>((h, commits))
        });
    }
    barrier.wait().await;
    let written = proc_io_write_bytes();
    let started = Instant::now();
    let mut hist = new_histogram();
    let mut commits = std::collections::HashSet::new();
    while let Some(joined) = tasks.join_next().await {
        match joined.map_err(|e| format!("appender task failed: {e}"))? {
            Ok((h, c)) => {
                hist.add(&h).map_err(|e| format!("histogram: {e:?}"))?;
                commits.extend(c);
            }
            Err(e) => {
                tasks.abort_all();
                return Err(e);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let written = proc_io_write_bytes().saturating_sub(written);
    let commits = commits.len() as u64;
    Ok(AppendRun {
        target: name,
        appenders,
        batch,
        events,
        requests: batches,
        seconds: (seconds * 1000.0).round() / 1000.0,
        events_per_sec: (events as f64 / seconds).round(),
        latency_us: Percentiles::from(&hist),
        commits,
        events_per_commit: (events as f64 / commits.max(1) as f64 * 10.0).round() / 10.0,
        disk_bytes_per_event: (written as f64 / events as f64).round(),
    })
}

/// The append runs of a target: each appender count with batches of one, then batches of
/// `opts.batch` at the highest count (in-process) or at every count (HTTP), unless `opts.batch`
/// is 0 or 1.
fn append_plan(opts: &Opts, http: bool) -> Vec<(usize, usize, u64)> {
    let mut plan = Vec::new();
    for &n in &opts.appenders {
        let events = match (n, http) {
            (1, _) => opts.single_events,
            (_, false) => opts.events,
            (_, true) => opts.http_events,
        };
        plan.push((n, 1, events));
    }
    let batched: Vec<usize> = if opts.batch <= 1 {
        Vec::new()
    } else if http {
        opts.appenders.clone()
    } else {
        opts.appenders.iter().max().copied().into_iter().collect()
    };
    for n in batched {
        let events = if http {
            opts.http_batch_events
        } else {
            opts.events
        };
        plan.push((n, opts.batch, events));
    }
    plan
}

fn print_run(r: &AppendRun) {
    eprintln!(
        "{:<10} appenders {:>4}  batch {:>4}  {:>9} events in {:>7.2} s  {:>9} events/s  \
         p50 {:>7} µs  p99 {:>7} µs  p99.9 {:>7} µs  {:>7.1} events/commit  {:>6} disk B/event",
        r.target,
        r.appenders,
        r.batch,
        r.events,
        r.seconds,
        r.events_per_sec,
        r.latency_us.p50,
        r.latency_us.p99,
        r.latency_us.p999,
        r.events_per_commit,
        r.disk_bytes_per_event,
    );
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))
}

fn inproc_workload(
    opts: &Opts,
    work: &Path,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<AppendRun>, String> {
    let mut runs = Vec::new();
    for (k, (appenders, batch, events)) in append_plan(opts, false).into_iter().enumerate() {
        let dir = temp_dir_in(work, "inproc-")?;
        let cfg = opts.knobs.log_config(log_path(dir.path()));
        let (log, _) = Log::open(&cfg).map_err(|e| format!("cannot open the log: {e}"))?;
        let target = Arc::new(InProcess { log: log.clone() });
        let evgen = EventGen::new(k as u64);
        let run = rt.block_on(drive(target, "in-process", evgen, events, appenders, batch))?;
        let expected = events + (appenders * batch) as u64;
        if log.head() != expected {
            return Err(format!(
                "the log holds {} events, expected {expected} (with the warm-up)",
                log.head()
            ));
        }
        rt.block_on(log.close());
        print_run(&run);
        runs.push(run);
    }
    Ok(runs)
}

// ---------------------------------------------------------------------------------------------
// Workload: HTTP

/// A `tidemark_api::run` server on 127.0.0.1:0, on a runtime of its own thread.
struct Server {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Server {
    fn start(data: PathBuf, knobs: LogKnobs) -> Result<Server, String> {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-server".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("bench-server-rt")
                    .build()
                    .map_err(|e| format!("server runtime: {e}"))?;
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                        .await
                        .map_err(|e| format!("cannot bind 127.0.0.1:0: {e}"))?;
                    let addr = listener.local_addr().map_err(|e| e.to_string())?;
                    let _ = addr_tx.send(addr);
                    let mut cfg = tidemark_api::config::Config::defaults();
                    cfg.server.data = data;
                    cfg.server.listen = addr;
                    knobs.apply_to_server(&mut cfg.log);
                    tidemark_api::run(cfg, listener, async move {
                        let _ = stop_rx.await;
                    })
                    .await
                    .map_err(|e| format!("server: {e}"))
                })
            })
            .map_err(|e| format!("cannot start the server thread: {e}"))?;
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "the server did not start".to_owned())?;
        Ok(Server {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    async fn wait_ready(&self, client: &reqwest::Client) -> Result<(), String> {
        let url = format!("http://{}/readyz", self.addr);
        for _ in 0..300 {
            if let Ok(r) = client.get(&url).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("{url} did not answer 200 within 30 s"))
    }

    fn stop(mut self) -> Result<(), String> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err("the server thread panicked".into()),
            None => Ok(()),
        }
    }
}

fn http_workload(
    opts: &Opts,
    work: &Path,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<AppendRun>, String> {
    let mut runs = Vec::new();
    for (k, (appenders, batch, events)) in append_plan(opts, true).into_iter().enumerate() {
        let dir = temp_dir_in(work, "http-")?;
        let server = Server::start(dir.path().to_path_buf(), opts.knobs)?;
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(usize::MAX)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        rt.block_on(server.wait_ready(&client))?;
        let target = Arc::new(Http {
            client,
            url: format!("http://{}/v1/events", server.addr),
        });
        let evgen = EventGen::new(1000 + k as u64);
        let run = rt.block_on(drive(target, "http", evgen, events, appenders, batch));
        // The client (and its idle connections) goes before the server stops.
        let stopped = server.stop();
        let run = run?;
        stopped?;
        print_run(&run);
        runs.push(run);
    }
    Ok(runs)
}

// ---------------------------------------------------------------------------------------------
// Workload: reopen after kill -9

#[derive(Serialize, Clone, Copy)]
struct RssPoint {
    head: u64,
    rss_kb: u64,
    elapsed_s: f64,
}

#[derive(Serialize)]
struct FillResult {
    /// The head the filler had published (so acknowledged) when it said it was ready.
    acknowledged_head: u64,
    /// Events appended by this filler until it was ready, and how long it took.
    appended: u64,
    seconds: f64,
    events_per_sec: f64,
    rss_by_head: Vec<RssPoint>,
}

#[derive(Serialize, serde::Deserialize, Clone)]
struct ReopenSample {
    /// `Log::open` wall time on the file left by the kill.
    open_ms: f64,
    head: u64,
    repaired: bool,
    tail_events: usize,
    /// Peak RSS of the reopening process (a fresh one) after the open.
    peak_rss_kb: u64,
    rss_kb: u64,
    close_ms: f64,
    file_bytes: u64,
    file_allocated_bytes: u64,
    #[serde(default)]
    cold_cache: bool,
    #[serde(default)]
    acknowledged_head: u64,
}

#[derive(Serialize)]
struct ReopenResult {
    events: u64,
    fills: Vec<FillResult>,
    samples: Vec<ReopenSample>,
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join("log.redb")
}

/// The filler child: fill the log to `events`, report, keep appending until killed.
fn fill_main(
    dir: &Path,
    events: u64,
    progress_every: u64,
    linger_secs: u64,
    knobs: LogKnobs,
) -> Result<(), String> {
    // Large batches from a few tasks fill fastest: each group commit takes up to
    // `max_group_events` (20,000) events, so 16 requests of 1,000 keep it full.
    const TASKS: usize = 16;
    const BATCH: u64 = 1000;
    let (log, report) = Log::open(&knobs.log_config(log_path(dir)))
        .map_err(|e| format!("cannot open the log: {e}"))?;
    let start_head = report.head;
    let evgen = EventGen::from_clock();
    let rt = runtime()?;
    rt.block_on(async move {
        let next = Arc::new(AtomicU64::new(0));
        for _ in 0..TASKS {
            let (log, next) = (log.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let lo = next.fetch_add(BATCH, Ordering::Relaxed);
                    if let Err(e) = log.append(evgen.batch(lo..lo + BATCH)).await {
                        eprintln!("fill: append failed: {e}");
                        std::process::exit(2);
                    }
                }
            });
        }
        let started = Instant::now();
        let mut milestone = if progress_every > 0 {
            progress_every
        } else {
            u64::MAX
        };
        let mut ready_at: Option<Instant> = None;
        let mut out = std::io::stdout();
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let head = log.head();
            while head >= milestone {
                let line = json!({
                    "kind": "progress",
                    "head": head,
                    "rss_kb": proc_status_kb("VmRSS"),
                    "elapsed_s": started.elapsed().as_secs_f64(),
                });
                let _ = writeln!(out, "{line}");
                milestone = milestone.saturating_add(progress_every);
            }
            if ready_at.is_none() && head >= events {
                let line = json!({
                    "kind": "ready",
                    "head": head,
                    "appended": head - start_head,
                    "rss_kb": proc_status_kb("VmRSS"),
                    "elapsed_s": started.elapsed().as_secs_f64(),
                });
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
                ready_at = Some(Instant::now());
            }
            // Bounded even if the parent is gone and never kills us.
            if ready_at.is_some_and(|t| t.elapsed() > Duration::from_secs(linger_secs)) {
                eprintln!("fill: not killed within {linger_secs} s; exiting");
                std::process::exit(3);
            }
        }
    })
}

/// The reopen child: open the log left by a kill, report what it cost, close it.
fn reopen_main(dir: &Path, knobs: LogKnobs) -> Result<(), String> {
    let path = log_path(dir);
    let t0 = Instant::now();
    let (log, report) = Log::open(&knobs.log_config(path.clone()))
        .map_err(|e| format!("cannot reopen the log: {e}"))?;
    let open_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let peak_rss_kb = proc_status_kb("VmHWM");
    let rss_kb = proc_status_kb("VmRSS");
    let t1 = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(log.close());
    drop(log);
    let close_ms = t1.elapsed().as_secs_f64() * 1000.0;
    let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let sample = ReopenSample {
        open_ms: (open_ms * 10.0).round() / 10.0,
        head: report.head,
        repaired: report.repaired,
        tail_events: report.tail_events,
        peak_rss_kb,
        rss_kb,
        close_ms: (close_ms * 10.0).round() / 10.0,
        file_bytes: meta.len(),
        file_allocated_bytes: meta.blocks() * 512,
        cold_cache: false,
        acknowledged_head: 0,
    };
    println!(
        "{}",
        serde_json::to_string(&sample).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// Run a filler to `events`, then SIGKILL it while it is still appending.
fn run_filler(
    exe: &Path,
    dir: &Path,
    events: u64,
    progress_every: u64,
    knobs: LogKnobs,
) -> Result<FillResult, String> {
    let mut child = Command::new(exe)
        .arg("fill")
        .arg("--dir")
        .arg(dir)
        .arg("--events")
        .arg(events.to_string())
        .arg("--progress-every")
        .arg(progress_every.to_string())
        .args(knobs.args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the filler: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout from the filler")?;
    let mut rss_by_head = Vec::new();
    let mut ready = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| format!("reading the filler: {e}"))?;
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("filler said {line:?}: {e}"))?;
        let point = RssPoint {
            head: v["head"].as_u64().unwrap_or(0),
            rss_kb: v["rss_kb"].as_u64().unwrap_or(0),
            elapsed_s: v["elapsed_s"].as_f64().unwrap_or(0.0),
        };
        if v["kind"] == "progress" {
            eprintln!(
                "  fill: {:>10} events  rss {:>7} kB  {:>6.1} s",
                point.head, point.rss_kb, point.elapsed_s
            );
            rss_by_head.push(point);
        } else if v["kind"] == "ready" {
            ready = Some((point, v["appended"].as_u64().unwrap_or(0)));
            break;
        }
    }
    let Some((point, appended)) = ready else {
        let status = child.wait().map_err(|e| e.to_string())?;
        return Err(format!("the filler stopped before it was ready: {status}"));
    };
    // Let it get a few more groups in flight, so the kill lands mid-commit.
    std::thread::sleep(Duration::from_millis(150));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).map_err(|e| e.to_string())?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("cannot kill the filler: {e}"))?;
    let status = child.wait().map_err(|e| e.to_string())?;
    if status.code().is_some() {
        return Err(format!(
            "the filler exited by itself ({status}) before the kill"
        ));
    }
    Ok(FillResult {
        acknowledged_head: point.head,
        appended,
        seconds: (point.elapsed_s * 100.0).round() / 100.0,
        events_per_sec: (appended as f64 / point.elapsed_s.max(1e-9)).round(),
        rss_by_head,
    })
}

fn drop_page_cache() -> bool {
    // Dirty pages first, so dropping the cache drops everything.
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn run_reopen(exe: &Path, dir: &Path, knobs: LogKnobs) -> Result<ReopenSample, String> {
    let out = Command::new(exe)
        .arg("reopen")
        .arg("--dir")
        .arg(dir)
        .args(knobs.args())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start the reopen child: {e}"))?;
    if !out.status.success() {
        return Err(format!("the reopen child failed: {}", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).map_err(|e| format!("reopen child said {text:?}: {e}"))
}

fn reopen_workload(opts: &Opts, work: &Path) -> Result<ReopenResult, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = temp_dir_in(work, "reopen-")?;
    let progress_every = if opts.reopen_events >= 2_000_000 {
        1_000_000
    } else {
        (opts.reopen_events / 10).max(1)
    };
    let mut fills = Vec::new();
    let mut samples = Vec::new();
    let mut head = 0;
    for s in 0..opts.reopen_samples.max(1) {
        let fill = if s == 0 {
            run_filler(
                &exe,
                dir.path(),
                opts.reopen_events,
                progress_every,
                opts.knobs,
            )?
        } else {
            run_filler(
                &exe,
                dir.path(),
                head + opts.reopen_rerun_events,
                0,
                opts.knobs,
            )?
        };
        let cold = opts.drop_caches && drop_page_cache();
        let mut sample = run_reopen(&exe, dir.path(), opts.knobs)?;
        sample.cold_cache = cold;
        sample.acknowledged_head = fill.acknowledged_head;
        // I1: everything acknowledged before the kill is there after it.
        if sample.head < fill.acknowledged_head {
            return Err(format!(
                "reopened head {} is below the acknowledged head {}",
                sample.head, fill.acknowledged_head
            ));
        }
        head = sample.head;
        eprintln!(
            "reopen #{}: killed at acknowledged head {}, reopened head {} in {:.1} ms \
             (repaired {}, tail {}, peak RSS {} kB, file {:.2} GiB)",
            s + 1,
            fill.acknowledged_head,
            sample.head,
            sample.open_ms,
            sample.repaired,
            sample.tail_events,
            sample.peak_rss_kb,
            sample.file_bytes as f64 / (1u64 << 30) as f64,
        );
        fills.push(fill);
        samples.push(sample);
    }
    Ok(ReopenResult {
        events: opts.reopen_events,
        fills,
        samples,
    })
}

// ---------------------------------------------------------------------------------------------
// The report

#[derive(Serialize)]
struct TargetCheck {
    name: &'static str,
    target: String,
    measured: String,
    met: bool,
}

#[derive(Serialize, Default)]
struct Results {
    fsync: Vec<FsyncResult>,
    in_process: Vec<AppendRun>,
    http: Vec<AppendRun>,
    reopen: Option<ReopenResult>,
}

fn checks(r: &Results) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    let at = |runs: &[AppendRun], n: usize, b: usize| {
        runs.iter()
            .find(|x| x.appenders == n && x.batch == b)
            .cloned()
    };
    if let Some(run) = at(&r.in_process, 256, 1) {
        out.push(TargetCheck {
            name: "in-process throughput, 256 appenders",
            target: ">= 200000 events/s".into(),
            measured: format!("{} events/s", run.events_per_sec),
            met: run.events_per_sec >= 200_000.0,
        });
    }
    if let Some(best) = r
        .http
        .iter()
        .filter(|x| x.batch > 1)
        .max_by(|a, b| a.events_per_sec.total_cmp(&b.events_per_sec))
    {
        out.push(TargetCheck {
            name: "HTTP throughput, batches of 100",
            target: ">= 50000 events/s".into(),
            measured: format!(
                "{} events/s (best: {} appenders)",
                best.events_per_sec, best.appenders
            ),
            met: best.events_per_sec >= 50_000.0,
        });
    }
    let fsync_p99 = r.fsync.iter().map(|f| f.latency_us.p99).min();
    if let (Some(run), Some(f99)) = (at(&r.in_process, 1, 1), fsync_p99) {
        out.push(TargetCheck {
            name: "p99 single append, 1 appender (in-process)",
            target: format!("<= 3 x fsync p99 = {} µs", 3 * f99),
            measured: format!(
                "{} µs ({:.1} x fsync p99 {} µs)",
                run.latency_us.p99,
                run.latency_us.p99 as f64 / f99 as f64,
                f99
            ),
            met: run.latency_us.p99 <= 3 * f99,
        });
    }
    if let Some(re) = &r.reopen {
        let worst = re.samples.iter().map(|s| s.open_ms).fold(0.0, f64::max);
        out.push(TargetCheck {
            name: "reopen after kill -9",
            target: format!("<= 1000 ms at {} events", re.events),
            measured: format!("{worst:.1} ms (worst of {})", re.samples.len()),
            met: worst <= 1000.0,
        });
        if let Some(fill) = re.fills.first()
            && let (Some(first), Some(last)) = (
                fill.rss_by_head
                    .iter()
                    .find(|p| p.head >= 1_000_000)
                    .or(fill.rss_by_head.first()),
                fill.rss_by_head.last(),
            )
        {
            // Flat: the writer's memory at N events is within 20% of what it was at the
            // first milestone (the redb cache is full well before then).
            out.push(TargetCheck {
                name: "memory flat in log length (filler RSS)",
                target: format!("RSS at {} <= 1.2 x RSS at {}", last.head, first.head),
                measured: format!(
                    "{} kB at {} events, {} kB at {} events ({:.2} x)",
                    first.rss_kb,
                    first.head,
                    last.rss_kb,
                    last.head,
                    last.rss_kb as f64 / first.rss_kb.max(1) as f64
                ),
                met: last.rss_kb as f64 <= 1.2 * first.rss_kb as f64,
            });
        }
    }
    out
}

fn markdown(r: &Results, checks: &[TargetCheck]) -> String {
    let mut s = String::new();
    if !r.fsync.is_empty() {
        s.push_str("| fsync (4 KiB + sync_data) | count | p50 µs | p99 µs | p99.9 µs | max µs |\n");
        s.push_str("|---|---:|---:|---:|---:|---:|\n");
        for f in &r.fsync {
            let l = f.latency_us;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                f.mode, l.count, l.p50, l.p99, l.p999, l.max
            );
        }
        s.push('\n');
    }
    let runs: Vec<&AppendRun> = r.in_process.iter().chain(&r.http).collect();
    if !runs.is_empty() {
        s.push_str(
            "| target | appenders | batch | events | events/s | p50 µs | p99 µs | p99.9 µs | max µs \
             | events/commit | disk B/event |\n",
        );
        s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for x in runs {
            let l = x.latency_us;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                x.target,
                x.appenders,
                x.batch,
                x.events,
                x.events_per_sec,
                l.p50,
                l.p99,
                l.p999,
                l.max,
                x.events_per_commit,
                x.disk_bytes_per_event
            );
        }
        s.push('\n');
    }
    if let Some(re) = &r.reopen {
        s.push_str("| reopen after SIGKILL | acknowledged head | reopened head | open ms | repaired | tail events | peak RSS kB | file GiB |\n");
        s.push_str("|---|---:|---:|---:|---|---:|---:|---:|\n");
        for (i, x) in re.samples.iter().enumerate() {
            let _ = writeln!(
                s,
                "| #{} | {} | {} | {:.1} | {} | {} | {} | {:.2} |",
                i + 1,
                x.acknowledged_head,
                x.head,
                x.open_ms,
                x.repaired,
                x.tail_events,
                x.peak_rss_kb,
                x.file_bytes as f64 / (1u64 << 30) as f64
            );
        }
        s.push('\n');
        if let Some(fill) = re.fills.first() {
            let _ = writeln!(
                s,
                "Filler: {} events in {:.1} s ({} events/s).\n",
                fill.appended, fill.seconds, fill.events_per_sec
            );
        }
    }
    if !checks.is_empty() {
        s.push_str("| target | wanted | measured | met |\n|---|---|---|---|\n");
        for c in checks {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                c.name,
                c.target,
                c.measured,
                if c.met { "yes" } else { "**no**" }
            );
        }
    }
    s
}

fn bench_main(opts: &Opts) -> Result<(), String> {
    // The payload size is part of the workload's definition: check it, do not assume it.
    for i in [0, 7, 123_456_789, u64::MAX] {
        let n = EventGen::new(0).new_event(i).payload_bytes().len();
        if n != PAYLOAD_BYTES {
            return Err(format!(
                "payload of event {i} is {n} bytes, not {PAYLOAD_BYTES}"
            ));
        }
    }
    if opts.batch > tidemark_log::limits::BATCH_MAX_EVENTS {
        return Err(format!(
            "--batch {} is more than the {} events a batch may hold",
            opts.batch,
            tidemark_log::limits::BATCH_MAX_EVENTS
        ));
    }
    let work = work_dir(opts)?;
    let machine = machine(&work);
    eprintln!(
        "append bench: {} cpus, {} MiB, kernel {}, data in {} ({} on {}), source {}",
        machine.cpus,
        machine.mem_total_kb / 1024,
        machine.kernel,
        machine.work_dir,
        machine.work_fs_type,
        machine.work_fs_device,
        machine.source
    );
    if machine.work_fs_type == "tmpfs" {
        eprintln!("WARNING: the data directory is on tmpfs: fsync is free there; use --work-dir");
    }
    let mut results = Results::default();
    let wants = |w| opts.only.contains(&w);
    if wants(Workload::Fsync) {
        let dir = temp_dir_in(&work, "fsync-")?;
        for overwrite in [false, true] {
            let f = fsync_bench(dir.path(), opts.fsync_count, overwrite)?;
            eprintln!(
                "fsync {:<9}  {} x 4 KiB  p50 {} µs  p99 {} µs  p99.9 {} µs",
                f.mode, f.latency_us.count, f.latency_us.p50, f.latency_us.p99, f.latency_us.p999
            );
            results.fsync.push(f);
        }
    }
    if wants(Workload::Inproc) || wants(Workload::Http) {
        let rt = runtime()?;
        if wants(Workload::Inproc) {
            results.in_process = inproc_workload(opts, &work, &rt)?;
        }
        if wants(Workload::Http) {
            results.http = http_workload(opts, &work, &rt)?;
        }
    }
    if wants(Workload::Reopen) {
        results.reopen = Some(reopen_workload(opts, &work)?);
    }
    let checks = checks(&results);
    eprintln!("\n{}", markdown(&results, &checks));
    let doc = json!({
        "benchmark": "append",
        "machine": machine,
        "options": {
            "fsync_count": opts.fsync_count,
            "appenders": opts.appenders,
            "events": opts.events,
            "single_events": opts.single_events,
            "http_events": opts.http_events,
            "http_batch_events": opts.http_batch_events,
            "batch": opts.batch,
            "reopen_events": opts.reopen_events,
            "reopen_samples": opts.reopen_samples,
            "payload_bytes": PAYLOAD_BYTES,
            "subjects": SUBJECTS,
            "log_overrides": opts.knobs,
        },
        "results": results,
        "targets": checks,
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    println!("{text}");
    if let Some(path) = &opts.json_out {
        std::fs::write(path, format!("{text}\n"))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}
