//! Bridge terminal-notification benchmark of tidemark (spec sections 6 and 11): confirmed
//! deliveries per second with 10,000 pull subscriptions over 100 bridges, and the time from an
//! accepted-final event's commit to the bridge receiving its envelope.
//! Targets: at least 10,000 confirmed deliveries/s; p99 commit-to-receipt at most 10 ms at
//! 1,000 deliveries/s.
//!
//! A plain `main` (`harness = false`). Build the server first, then run it:
//!
//! ```text
//! cargo build --release -p tidemark-api
//! cargo bench -p tidemark-benches --bench bridges -- [options]
//! cargo bench -p tidemark-benches --bench bridges -- --subscriptions 1000 --bridges 10 \
//!     --latency-seconds 2          # a small smoke run
//! ```
//!
//! Progress rows and the closing markdown tables go to stderr; the JSON document with every
//! figure goes to stdout (and to `--json-out FILE`).
//!
//! # What it does
//! One server: the real release binary (`target/release/tidemark serve`) as a child process on
//! a fresh data directory, driven over HTTP on loopback by this process.
//!
//! - Setup (not measured as a workload): `--subscriptions` tasks `bt-<i>` (`task.created`),
//!   and one pull subscription `bs-<i>` per task, on bridge `bb-<i mod bridges>`, so every
//!   bridge has `subscriptions / bridges` of them.
//! - Round `throughput`: every task starts run `tp` (setup), then `task.run_completed` of `tp`
//!   is appended for every task in batches of `--append-batch` (timed apart). Then one worker
//!   per bridge loops `GET /v1/bridges/<b>/deliveries?wait_ms=<wait>` and acks every envelope
//!   (`POST …/deliveries/<id>/ack`, `--ack-concurrency` at a time), until all of its bridge's
//!   deliveries are confirmed. Throughput = confirmed / (time from the workers' start to the
//!   last confirmation). Each ack's answer must show the cursor at the envelope's seq.
//! - Round `latency`: every task starts a fresh run `lat` (setup), and the round waits until the
//!   bridge notifier is idle (its pass count in `/metrics` stops moving); the workers long-poll as
//!   above; a producer appends one `task.run_completed` of `lat` every `1/--rate` s (each its
//!   own request, not waiting for the previous one) for `--latency-seconds`. Per delivery: the
//!   time from the producer receiving the append's 201 (the commit) to the worker receiving
//!   the envelope, both on this process's monotonic clock. A worker may get the envelope before
//!   the producer has read its 201; such deliveries count as 0 and are reported.
//! - Also reported: server CPU seconds and peak RSS per round, pull and ack latencies.

mod common;

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use common::*;
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};

/// Target of the throughput round, confirmed deliveries/s.
const TARGET_PER_SEC: f64 = 10_000.0;
/// Target of the latency round: p99 commit-to-receipt, µs, at `TARGET_RATE` deliveries/s.
const TARGET_P99_US: u64 = 10_000;
const TARGET_RATE: f64 = 1_000.0;

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
enum Round {
    Throughput,
    Latency,
}

#[derive(Parser)]
#[command(name = "bridges", about = "tidemark bridge delivery benchmark")]
struct Opts {
    /// Rounds to run.
    #[arg(long, value_delimiter = ',', default_value = "throughput,latency")]
    only: Vec<Round>,
    /// Pull subscriptions, one per task.
    #[arg(long, default_value_t = 10_000)]
    subscriptions: usize,
    /// Bridges the subscriptions are spread over (one worker each).
    #[arg(long, default_value_t = 100)]
    bridges: usize,
    /// Events per `POST /v1/events` of the setup and of the throughput round (at most 1000).
    #[arg(long, default_value_t = 1000)]
    append_batch: usize,
    /// `wait_ms` of the workers' long-polls.
    #[arg(long, default_value_t = 1000)]
    wait_ms: u64,
    /// Acks a worker has in flight at once (envelopes of one pull).
    #[arg(long, default_value_t = 1)]
    ack_concurrency: usize,
    /// Ack each pull's envelopes with one `POST /v1/bridges/<b>/deliveries/ack` (the batch
    /// form) instead of one request per envelope.
    #[arg(long)]
    batch_ack: bool,
    /// Appends per second of the latency round.
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Duration of the latency round's producer, seconds (at most one event per task).
    #[arg(long, default_value_t = 5.0)]
    latency_seconds: f64,
    /// Concurrent requests of the setup (subscriptions).
    #[arg(long, default_value_t = 32)]
    setup_concurrency: usize,
    /// Bound of each round after its last append, seconds (then it reports what is missing).
    #[arg(long, default_value_t = 300)]
    round_timeout_secs: u64,
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    run_main("bridges", bench_main)
}

// ---------------------------------------------------------------------------------------------
// Measuring

/// A `/proc/<pid>/status` line in kB (`VmHWM`, `VmRSS`).
fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds of the server and of this process over a round.
#[derive(Serialize, Clone, Copy, Default)]
struct Cpu {
    server_s: f64,
    client_s: f64,
}

struct CpuMark {
    server: u64,
    client: u64,
}

impl CpuMark {
    fn now(server_pid: u32) -> CpuMark {
        CpuMark {
            server: stat_ticks(Path::new(&format!("/proc/{server_pid}/stat"))).unwrap_or(0),
            client: stat_ticks(Path::new("/proc/self/stat")).unwrap_or(0),
        }
    }

    fn since(&self, server_pid: u32, hz: f64) -> Cpu {
        let now = CpuMark::now(server_pid);
        let r = |t: u64| (t as f64 / hz * 100.0).round() / 100.0;
        Cpu {
            server_s: r(now.server.saturating_sub(self.server)),
            client_s: r(now.client.saturating_sub(self.client)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The machine and where things are

// ---------------------------------------------------------------------------------------------
// Names and HTTP helpers

fn task_id(i: usize) -> String {
    format!("bt-{i}")
}

fn sub_id(i: usize) -> String {
    format!("bs-{i}")
}

fn bridge_id(b: usize) -> String {
    format!("bb-{b}")
}

/// The task index of a delivery id `notif:bs-<i>:<seq>`, and the seq.
fn parse_delivery(id: &str) -> Option<(usize, u64)> {
    let rest = id.strip_prefix("notif:bs-")?;
    let (i, seq) = rest.split_once(':')?;
    Some((i.parse().ok()?, seq.parse().ok()?))
}

fn lifecycle(task: &str, ty: &str, payload: Value) -> Value {
    json!({"stream": "task_events", "subject": task, "type": ty, "payload": payload})
}

/// `POST url` with a JSON body; the status, the parsed answer, and when its headers arrived.
async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: Option<&Value>,
) -> Result<(reqwest::StatusCode, Value, Instant, Vec<u8>), String> {
    let mut rb = client.post(url);
    if let Some(b) = body {
        rb = rb.json(b);
    }
    let r = rb.send().await.map_err(|e| format!("POST {url}: {e}"))?;
    let at = Instant::now();
    let status = r.status();
    let bytes = r.bytes().await.map_err(|e| format!("POST {url}: {e}"))?;
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((status, v, at, bytes.to_vec()))
}

/// Append `events` in batches of `batch`, `concurrency` requests at a time; the seqs in order.
async fn append_all(
    client: &reqwest::Client,
    base: &str,
    events: Vec<Value>,
    batch: usize,
    concurrency: usize,
) -> Result<Vec<u64>, String> {
    let url = format!("{base}/v1/events");
    let chunks: Vec<Vec<Value>> = events.chunks(batch.max(1)).map(<[Value]>::to_vec).collect();
    let results: Vec<Result<Vec<u64>, String>> = futures::stream::iter(chunks)
        .map(|chunk| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let n = chunk.len();
                let (status, v, _, raw) =
                    post_json(&client, &url, Some(&json!({ "events": chunk }))).await?;
                if status != reqwest::StatusCode::CREATED {
                    return Err(format!(
                        "POST {url} answered {status}: {}",
                        String::from_utf8_lossy(&raw)
                    ));
                }
                let seqs: Vec<u64> = v["events"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|e| e["seq"].as_u64()).collect())
                    .unwrap_or_default();
                if seqs.len() != n {
                    return Err(format!(
                        "POST {url}: {} receipts for {n} events",
                        seqs.len()
                    ));
                }
                Ok(seqs)
            }
        })
        .buffered(concurrency.max(1))
        .collect()
        .await;
    let mut out = Vec::with_capacity(events.len());
    for r in results {
        out.extend(r?);
    }
    Ok(out)
}

/// Create the pull subscription of every task, `concurrency` at a time.
async fn subscribe_all(
    client: &reqwest::Client,
    base: &str,
    n: usize,
    bridges: usize,
    concurrency: usize,
) -> Result<(), String> {
    let results: Vec<Result<(), String>> = futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let url = format!("{base}/v1/tasks/{}/notifications/bridges", task_id(i));
            async move {
                let body = json!({
                    "subscription_id": sub_id(i),
                    "bridge_id": bridge_id(i % bridges),
                    "thread_id": format!("th-{i}"),
                    "sink": {"kind": "pull"},
                });
                let (status, _, _, raw) = post_json(&client, &url, Some(&body)).await?;
                if status != reqwest::StatusCode::CREATED && status != reqwest::StatusCode::OK {
                    return Err(format!(
                        "POST {url} answered {status}: {}",
                        String::from_utf8_lossy(&raw)
                    ));
                }
                Ok(())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    results.into_iter().collect()
}

// ---------------------------------------------------------------------------------------------
// Bridge workers

/// What one bridge worker measured, or all of a round's together.
struct WorkerOut {
    /// Whole `GET …/deliveries` requests (long-polls included).
    pull: Histogram<u64>,
    ack: Histogram<u64>,
    pulls: u64,
    empty_pulls: u64,
    envelopes: u64,
    /// Delivery id → when the worker first received it.
    received: HashMap<String, Instant>,
    confirmed: HashSet<String>,
    /// Envelopes received again after their ack had succeeded.
    again_after_ack: u64,
    /// Envelopes whose content is not what was appended (type, run).
    wrong: u64,
    errors: Errors,
    last_confirm: Option<Instant>,
}

struct Worker {
    client: reqwest::Client,
    base: String,
    bridge: String,
    wait_ms: u64,
    ack_concurrency: usize,
    batch_ack: bool,
    /// The run whose completions this round delivers.
    run: &'static str,
    /// Stop when this many are confirmed (throughput), or when `stop` is set.
    expect: usize,
    stop: Arc<AtomicBool>,
    deadline: Instant,
    confirmed_total: Arc<AtomicU64>,
}

impl WorkerOut {
    fn new() -> WorkerOut {
        WorkerOut {
            pull: new_histogram(),
            ack: new_histogram(),
            pulls: 0,
            empty_pulls: 0,
            envelopes: 0,
            received: HashMap::new(),
            confirmed: HashSet::new(),
            again_after_ack: 0,
            wrong: 0,
            errors: Errors::default(),
            last_confirm: None,
        }
    }

    /// Every worker's measurements together (each bridge's deliveries are its own, so the
    /// confirmed sets do not overlap).
    fn gather(outs: Vec<WorkerOut>) -> WorkerOut {
        let mut w = WorkerOut::new();
        for o in outs {
            w.pull.add(&o.pull).ok();
            w.ack.add(&o.ack).ok();
            w.pulls += o.pulls;
            w.empty_pulls += o.empty_pulls;
            w.envelopes += o.envelopes;
            w.received.extend(o.received);
            w.confirmed.extend(o.confirmed);
            w.again_after_ack += o.again_after_ack;
            w.wrong += o.wrong;
            w.errors.merge(o.errors);
            w.last_confirm = w.last_confirm.max(o.last_confirm);
        }
        w
    }
}

impl Worker {
    async fn run(self) -> WorkerOut {
        let mut out = WorkerOut::new();
        let pull_url = format!(
            "{}/v1/bridges/{}/deliveries?wait_ms={}",
            self.base, self.bridge, self.wait_ms
        );
        while out.confirmed.len() < self.expect
            && !self.stop.load(Ordering::Relaxed)
            && Instant::now() < self.deadline
        {
            let t0 = Instant::now();
            let resp = match self.client.get(&pull_url).send().await {
                Ok(r) => r,
                Err(e) => {
                    out.errors.add("pull transport".into(), e.to_string());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let status = resp.status();
            let body = match resp.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    out.errors.add("pull body".into(), e.to_string());
                    continue;
                }
            };
            let got_at = Instant::now();
            out.pull.record(micros(got_at - t0)).ok();
            out.pulls += 1;
            if status != reqwest::StatusCode::OK {
                out.errors.add(
                    problem_key("pull", status, &body),
                    String::from_utf8_lossy(&body).into_owned(),
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let envs = v["deliveries"].as_array().cloned().unwrap_or_default();
            if envs.is_empty() {
                out.empty_pulls += 1;
                continue;
            }
            let mut to_ack = Vec::new();
            for env in envs {
                out.envelopes += 1;
                let id = env["delivery_id"].as_str().unwrap_or_default().to_owned();
                if out.confirmed.contains(&id) {
                    out.again_after_ack += 1;
                    continue;
                }
                out.received.entry(id.clone()).or_insert(got_at);
                if env["metadata"]["terminal_event_type"] != "task.run_completed"
                    || env["metadata"]["run_id"] != self.run
                    || env["bridge_id"] != self.bridge.as_str()
                {
                    out.wrong += 1;
                }
                to_ack.push((id, env["seq"].as_u64().unwrap_or(0)));
            }
            if self.batch_ack && !to_ack.is_empty() {
                let url = format!("{}/v1/bridges/{}/deliveries/ack", self.base, self.bridge);
                let ids: Vec<&str> = to_ack.iter().map(|(id, _)| id.as_str()).collect();
                let body = json!({ "delivery_ids": ids });
                let t0 = Instant::now();
                match post_json(&self.client, &url, Some(&body)).await {
                    Ok((st, v, at, raw)) if st == reqwest::StatusCode::OK => {
                        let results = v["results"].as_array().cloned().unwrap_or_default();
                        for ((id, seq), r) in to_ack.into_iter().zip(results) {
                            if r["status"] == 200
                                && r["cursor"]["last_sequence"].as_u64() == Some(seq)
                            {
                                out.ack.record(micros(at - t0)).ok();
                                if out.confirmed.insert(id) {
                                    self.confirmed_total.fetch_add(1, Ordering::Relaxed);
                                }
                                out.last_confirm = Some(Instant::now());
                            } else {
                                out.errors
                                    .add("batch ack item".into(), format!("{id}: {r}"));
                            }
                        }
                        let _ = raw;
                    }
                    Ok((st, _, _, raw)) => out.errors.add(
                        problem_key("ack", st, &raw),
                        String::from_utf8_lossy(&raw).into_owned(),
                    ),
                    Err(e) => out.errors.add("ack transport".into(), e),
                }
                continue;
            }
            let mut acks = std::pin::pin!(
                futures::stream::iter(to_ack)
                    .map(|(id, seq)| {
                        let client = self.client.clone();
                        let url = format!(
                            "{}/v1/bridges/{}/deliveries/{id}/ack",
                            self.base, self.bridge
                        );
                        async move {
                            let t0 = Instant::now();
                            let r = match post_json(&client, &url, None).await {
                                Ok((st, v, at, raw)) => {
                                    if st != reqwest::StatusCode::OK {
                                        Err((
                                            problem_key("ack", st, &raw),
                                            String::from_utf8_lossy(&raw).into_owned(),
                                        ))
                                    } else if v["cursor"]["last_sequence"].as_u64() != Some(seq) {
                                        Err((
                                            "ack cursor not at the seq".into(),
                                            format!("ack of {id}: {v}"),
                                        ))
                                    } else {
                                        Ok(at - t0)
                                    }
                                }
                                Err(e) => Err(("ack transport".into(), e)),
                            };
                            (id, r)
                        }
                    })
                    .buffer_unordered(self.ack_concurrency.max(1))
            );
            // Each confirmation counts as it lands (progress, time of the last one).
            while let Some((id, r)) = acks.next().await {
                match r {
                    Ok(d) => {
                        out.ack.record(micros(d)).ok();
                        if out.confirmed.insert(id) {
                            self.confirmed_total.fetch_add(1, Ordering::Relaxed);
                        }
                        out.last_confirm = Some(Instant::now());
                    }
                    Err((kind, detail)) => out.errors.add(kind, detail),
                }
            }
        }
        out
    }
}

/// What every round is run with: the options, the client, the server and its clock ticks.
struct Bench<'a> {
    opts: &'a Opts,
    client: &'a reqwest::Client,
    server: &'a Server,
    base: String,
    hz: f64,
}

/// What a round's workers share while they run: the flag that stops them, and the count of
/// confirmations over all of them.
#[derive(Default)]
struct Shared {
    stop: Arc<AtomicBool>,
    confirmed: Arc<AtomicU64>,
}

impl Bench<'_> {
    /// One worker per bridge, each expecting its `per_bridge` confirmations of run `run`.
    fn spawn(
        &self,
        run: &'static str,
        per_bridge: &[usize],
        deadline: Instant,
        shared: &Shared,
    ) -> tokio::task::JoinSet<WorkerOut> {
        let mut set = tokio::task::JoinSet::new();
        for (b, expect) in per_bridge.iter().enumerate() {
            let w = Worker {
                client: self.client.clone(),
                base: self.base.clone(),
                bridge: bridge_id(b),
                wait_ms: self.opts.wait_ms,
                ack_concurrency: self.opts.ack_concurrency,
                batch_ack: self.opts.batch_ack,
                run,
                expect: *expect,
                stop: shared.stop.clone(),
                deadline,
                confirmed_total: shared.confirmed.clone(),
            };
            set.spawn(w.run());
        }
        set
    }

    /// `ty` of run `run` for every task.
    fn every_task(&self, ty: &str, run: &str) -> Vec<Value> {
        (0..self.opts.subscriptions)
            .map(|i| lifecycle(&task_id(i), ty, json!({ "run_id": run })))
            .collect()
    }

    /// Append `events` in batches of `--append-batch`, 4 requests at a time.
    async fn append(&self, events: Vec<Value>) -> Result<(), String> {
        append_all(self.client, &self.base, events, self.opts.append_batch, 4).await?;
        Ok(())
    }

    /// Round `round` begins: every task starts run `run` (set-up, not measured).
    async fn start_run(&self, round: &str, run: &str) -> Result<(), String> {
        let n = self.opts.subscriptions;
        eprintln!("{round}: starting run {run} of {n} tasks");
        self.append(self.every_task("task.run_started", run)).await
    }
}

async fn join_workers(set: tokio::task::JoinSet<WorkerOut>) -> WorkerOut {
    WorkerOut::gather(set.join_all().await)
}

/// How many subscriptions each bridge has (`i mod bridges`).
fn per_bridge(n: usize, bridges: usize) -> Vec<usize> {
    (0..bridges)
        .map(|b| (0..n).filter(|i| i % bridges == b).count())
        .collect()
}

/// What every round reports of its workers and of the server.
#[derive(Serialize, Default)]
struct WorkersResult {
    wrong_envelopes: u64,
    again_after_ack: u64,
    pull_us: Percentiles,
    ack_us: Percentiles,
    errors: Errors,
    cpu: Cpu,
    server_peak_rss_kb: u64,
}

impl WorkersResult {
    /// What `w` measured, the server's and this process's `cpu` over the round, and the
    /// server's peak RSS so far.
    fn of(w: WorkerOut, cpu: Cpu, server: &Server) -> WorkersResult {
        WorkersResult {
            wrong_envelopes: w.wrong,
            again_after_ack: w.again_after_ack,
            pull_us: (&w.pull).into(),
            ack_us: (&w.ack).into(),
            errors: w.errors,
            cpu,
            server_peak_rss_kb: status_kb(server.pid(), "VmHWM"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Round: throughput

#[derive(Serialize, Default)]
struct ThroughputResult {
    deliveries: usize,
    /// Appending the completions (before the workers start), seconds.
    append_s: f64,
    seconds: f64,
    confirmed: usize,
    confirmed_per_sec: f64,
    pulls: u64,
    empty_pulls: u64,
    envelopes: u64,
    #[serde(flatten)]
    workers: WorkersResult,
}

impl Bench<'_> {
    async fn throughput_round(&self) -> Result<ThroughputResult, String> {
        let (opts, server) = (self.opts, self.server);
        let n = opts.subscriptions;
        self.start_run("throughput", "tp").await?;
        let completed = self.every_task("task.run_completed", "tp");
        let t_append = Instant::now();
        self.append(completed).await?;
        let append_s = t_append.elapsed().as_secs_f64();
        eprintln!(
            "throughput: {n} completions appended in {append_s:.2} s; {} workers pull and ack",
            opts.bridges
        );

        let cpu0 = CpuMark::now(server.pid());
        let shared = Shared::default();
        let start = Instant::now();
        let deadline = start + Duration::from_secs(opts.round_timeout_secs);
        let set = self.spawn("tp", &per_bridge(n, opts.bridges), deadline, &shared);
        let progress = tokio::spawn({
            let confirmed = shared.confirmed.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    eprintln!(
                        "  {:>6.1} s: {} confirmed",
                        start.elapsed().as_secs_f64(),
                        confirmed.load(Ordering::Relaxed)
                    );
                }
            }
        });
        let w = join_workers(set).await;
        progress.abort();
        let cpu = cpu0.since(server.pid(), self.hz);
        let end = w.last_confirm.unwrap_or_else(Instant::now);
        let seconds = end.saturating_duration_since(start).as_secs_f64();
        let confirmed = w.confirmed.len();
        Ok(ThroughputResult {
            deliveries: n,
            append_s: (append_s * 1000.0).round() / 1000.0,
            seconds: (seconds * 1000.0).round() / 1000.0,
            confirmed,
            confirmed_per_sec: (confirmed as f64 / seconds.max(1e-9)).round(),
            pulls: w.pulls,
            empty_pulls: w.empty_pulls,
            envelopes: w.envelopes,
            workers: WorkersResult::of(w, cpu, server),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Round: latency

#[derive(Serialize, Default)]
struct LatencyResult {
    rate_wanted: f64,
    appends: usize,
    /// Appends per second the producer achieved (first request to last 201).
    rate_achieved: f64,
    append_us: Percentiles,
    /// 201 of the append → the worker has the envelope.
    commit_to_receipt_us: Percentiles,
    /// Deliveries the worker had before the producer read the append's 201 (counted as 0).
    received_before_201: u64,
    received: usize,
    confirmed: usize,
    missing: usize,
    /// Received deliveries that name another seq than the append's receipt.
    wrong_seq: u64,
    append_errors: Errors,
    #[serde(flatten)]
    workers: WorkersResult,
}

/// Per append of the latency round: when its 201 arrived, and its seq.
type Commits = Arc<Mutex<Vec<Option<(Instant, u64)>>>>;

impl Bench<'_> {
    async fn latency_round(&self) -> Result<LatencyResult, String> {
        let (opts, client, server, base) = (self.opts, self.client, self.server, &self.base);
        let n = opts.subscriptions;
        let rate = opts.rate.max(1.0);
        let k = ((rate * opts.latency_seconds).round() as usize).clamp(1, n);
        self.start_run("latency", "lat").await?;
        // Steady state is what the target is about: let the notifier finish looking at the
        // setup's 10,000 run starts (a burst it takes a while to digest) before measuring.
        settle(client, base).await;
        eprintln!(
            "latency: {} workers long-poll; {k} completions at {rate} /s",
            opts.bridges
        );

        let cpu0 = CpuMark::now(server.pid());
        let shared = Shared::default();
        let far = Instant::now() + Duration::from_secs(opts.round_timeout_secs * 4);
        let set = self.spawn("lat", &vec![usize::MAX; opts.bridges], far, &shared);
        // Let the workers park their first long-poll.
        tokio::time::sleep(Duration::from_millis(500)).await;

        // The producer: the i-th append is sent at start + i / rate, whether or not the
        // earlier ones have been answered.
        let url = format!("{base}/v1/events");
        let commits: Commits = Arc::new(Mutex::new(vec![None; k]));
        let append_hist = Arc::new(Mutex::new(new_histogram()));
        let append_errors = Arc::new(Mutex::new(Errors::default()));
        let mut producers = tokio::task::JoinSet::new();
        let start = tokio::time::Instant::now() + Duration::from_millis(10);
        for i in 0..k {
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
            let (client, url) = (client.clone(), url.clone());
            let (commits, hist, errs) =
                (commits.clone(), append_hist.clone(), append_errors.clone());
            producers.spawn(async move {
                let body = lifecycle(&task_id(i), "task.run_completed", json!({"run_id": "lat"}));
                let t0 = Instant::now();
                match post_json(&client, &url, Some(&body)).await {
                    Ok((st, v, at, raw)) if st == reqwest::StatusCode::CREATED => {
                        hist.lock().expect("lock").record(micros(at - t0)).ok();
                        let seq = v["events"][0]["seq"].as_u64().unwrap_or(0);
                        commits.lock().expect("lock")[i] = Some((at, seq));
                        let _ = raw;
                    }
                    Ok((st, _, _, raw)) => errs.lock().expect("lock").add(
                        problem_key("append", st, &raw),
                        String::from_utf8_lossy(&raw).into_owned(),
                    ),
                    Err(e) => errs.lock().expect("lock").add("append transport".into(), e),
                }
            });
        }
        producers.join_all().await;
        let produced_at = Instant::now();
        let sent_s = (start.elapsed().as_secs_f64()).max(1e-9);
        let committed = commits.lock().expect("lock").iter().flatten().count();
        eprintln!(
            "latency: {committed} of {k} appends committed in {sent_s:.2} s; waiting for the \
             bridges"
        );
        let deadline = produced_at + Duration::from_secs(opts.round_timeout_secs);
        while (shared.confirmed.load(Ordering::Relaxed) as usize) < committed
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shared.stop.store(true, Ordering::Relaxed);
        let w = join_workers(set).await;
        let cpu = cpu0.since(server.pid(), self.hz);

        let commits = commits.lock().expect("lock").clone();
        let mut hist = new_histogram();
        let mut early = 0;
        let mut wrong_seq = 0;
        let mut missing = 0;
        for (i, c) in commits.iter().enumerate() {
            let Some((at, seq)) = c else {
                continue;
            };
            let id = format!("notif:{}:{seq}", sub_id(i));
            match w.received.get(&id) {
                Some(recv) => {
                    if *recv < *at {
                        early += 1;
                    }
                    hist.record(micros(recv.saturating_duration_since(*at)))
                        .ok();
                }
                None => missing += 1,
            }
        }
        for id in w.received.keys() {
            match parse_delivery(id) {
                Some((i, seq)) if i < k && commits[i].is_some_and(|(_, s)| s == seq) => {}
                _ => wrong_seq += 1,
            }
        }
        let append_hist = append_hist.lock().expect("lock").clone();
        let append_errors = append_errors.lock().expect("lock").clone();
        Ok(LatencyResult {
            rate_wanted: rate,
            appends: k,
            rate_achieved: (committed as f64 / sent_s).round(),
            append_us: (&append_hist).into(),
            commit_to_receipt_us: (&hist).into(),
            received_before_201: early,
            received: w.received.len(),
            confirmed: w.confirmed.len(),
            missing,
            wrong_seq,
            append_errors,
            workers: WorkersResult::of(w, cpu, server),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The report

#[derive(Serialize, Default)]
struct Results {
    setup: Setup,
    throughput: Option<ThroughputResult>,
    latency: Option<LatencyResult>,
}

#[derive(Serialize, Default)]
struct Setup {
    tasks_s: f64,
    subscriptions_s: f64,
    subscriptions_per_sec: f64,
}

fn checks(opts: &Opts, r: &Results) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    let shape = format!(
        "{} subscriptions / {} bridges",
        opts.subscriptions, opts.bridges
    );
    if let Some(t) = &r.throughput {
        let complete = t.confirmed == t.deliveries && t.workers.errors.count == 0;
        out.push(TargetCheck {
            name: "confirmed deliveries/s (pull)".into(),
            target: format!(">= {TARGET_PER_SEC} /s at 10000 subscriptions / 100 bridges"),
            measured: format!(
                "{} /s ({} of {} confirmed, {shape})",
                t.confirmed_per_sec, t.confirmed, t.deliveries
            ),
            met: complete && t.confirmed_per_sec >= TARGET_PER_SEC,
        });
    }
    if let Some(l) = &r.latency {
        let p99 = l.commit_to_receipt_us.p99;
        let complete = l.missing == 0 && l.wrong_seq == 0 && l.append_errors.count == 0;
        out.push(TargetCheck {
            name: "p99 commit-to-receipt".into(),
            target: format!("<= {} ms at {TARGET_RATE} deliveries/s", ms(TARGET_P99_US)),
            measured: format!(
                "{} ms at {} /s achieved ({} missing, {shape})",
                ms(p99),
                l.rate_achieved,
                l.missing
            ),
            met: complete && p99 <= TARGET_P99_US && l.rate_achieved >= 0.95 * TARGET_RATE,
        });
    }
    out
}

fn markdown(r: &Results, checks: &[TargetCheck]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Setup: tasks {:.2} s, subscriptions {:.2} s ({} /s).\n",
        r.setup.tasks_s, r.setup.subscriptions_s, r.setup.subscriptions_per_sec
    );
    s.push_str(
        "| round | deliveries | confirmed | seconds | confirmed/s | p50 ms | p99 ms | p99.9 ms | max ms \
         | server CPU s | errors |\n",
    );
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    if let Some(t) = &r.throughput {
        let (w, l) = (&t.workers, &t.workers.ack_us);
        let _ = writeln!(
            s,
            "| throughput (ack latency) | {} | {} | {:.2} | {} | {} | {} | {} |",
            t.deliveries,
            t.confirmed,
            t.seconds,
            t.confirmed_per_sec,
            ms_cells(l),
            w.cpu.server_s,
            w.errors.count
        );
    }
    if let Some(x) = &r.latency {
        let (w, rate) = (&x.workers, x.rate_achieved);
        let seconds = x.appends as f64 / rate.max(1e-9);
        let errors = w.errors.count + x.append_errors.count;
        let _ = writeln!(
            s,
            "| latency (commit → receipt) at {rate} /s | {} | {} | {seconds:.2} | {rate} | {} | {} \
             | {errors} |",
            x.appends,
            x.confirmed,
            ms_cells(&x.commit_to_receipt_us),
            w.cpu.server_s,
        );
    }
    s.push('\n');
    s.push_str("| requests | count | p50 ms | p99 ms | p99.9 ms | max ms |\n|---|---:|---:|---:|---:|---:|\n");
    let mut row = |name: &str, p: &Percentiles| {
        let _ = writeln!(s, "| {name} | {} | {} |", p.count, ms_cells(p));
    };
    if let Some(t) = &r.throughput {
        row("throughput: GET deliveries", &t.workers.pull_us);
        row("throughput: POST ack", &t.workers.ack_us);
    }
    if let Some(x) = &r.latency {
        row("latency: POST /v1/events (1 event)", &x.append_us);
        row("latency: GET deliveries (long-poll)", &x.workers.pull_us);
        row("latency: POST ack", &x.workers.ack_us);
    }
    if let Some(x) = &r.latency {
        let _ = writeln!(
            s,
            "\nLatency round: {} received, {} missing, {} received before the producer read the \
             201, {} with a wrong seq.",
            x.received, x.missing, x.received_before_201, x.wrong_seq
        );
    }
    if !checks.is_empty() {
        s.push_str("\n| target | wanted | measured | met |\n|---|---|---|---|\n");
        for c in checks {
            let (name, target, measured, met) = c.said("yes", "**no**");
            let _ = writeln!(s, "| {name} | {target} | {measured} | {met} |");
        }
    }
    s
}

fn bench_main(opts: &Opts) -> Result<(), String> {
    if opts.subscriptions == 0 || opts.bridges == 0 || opts.bridges > opts.subscriptions {
        return Err("need 1 <= --bridges <= --subscriptions".into());
    }
    if opts.append_batch == 0 || opts.append_batch > 1000 {
        return Err("--append-batch must be 1..=1000".into());
    }
    if opts.wait_ms > 30_000 {
        return Err("--wait-ms must be at most 30000".into());
    }
    let (bin, work, machine) = setup("bridges", &opts.args)?;
    let dir = tempfile::Builder::new()
        .prefix("bridges-")
        .tempdir_in(&work)
        .map_err(|e| format!("cannot create a directory in {}: {e}", work.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let hz = clock_ticks();
    let server = Server::start(&bin, dir.path(), "")?;
    let results = rt.block_on(async {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(120))
            .pool_max_idle_per_host(1024)
            .build()
            .map_err(|e| format!("http client: {e}"))?;
        server.wait_ready(&client).await?;
        let bench = Bench {
            opts,
            client: &client,
            server: &server,
            base: server.base(),
            hz,
        };
        let n = opts.subscriptions;
        let mut results = Results::default();

        let t0 = Instant::now();
        let created: Vec<Value> = (0..n)
            .map(|i| lifecycle(&task_id(i), "task.created", json!({"project_id": "bench"})))
            .collect();
        bench.append(created).await?;
        results.setup.tasks_s = (t0.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        let t0 = Instant::now();
        subscribe_all(
            &client,
            &bench.base,
            n,
            opts.bridges,
            opts.setup_concurrency,
        )
        .await?;
        let subs_s = t0.elapsed().as_secs_f64();
        results.setup.subscriptions_s = (subs_s * 1000.0).round() / 1000.0;
        results.setup.subscriptions_per_sec = (n as f64 / subs_s.max(1e-9)).round();
        eprintln!(
            "setup: {n} tasks in {:.2} s, {n} pull subscriptions over {} bridges in {:.2} s",
            results.setup.tasks_s, opts.bridges, subs_s
        );

        if opts.only.contains(&Round::Throughput) {
            let t = bench.throughput_round().await?;
            eprintln!(
                "throughput: {} of {} confirmed in {:.2} s = {} /s; ack {}; {} errors",
                t.confirmed,
                t.deliveries,
                t.seconds,
                t.confirmed_per_sec,
                p50_p99(&t.workers.ack_us),
                t.workers.errors.count
            );
            results.throughput = Some(t);
        }
        if opts.only.contains(&Round::Latency) {
            let l = bench.latency_round().await?;
            let p = &l.commit_to_receipt_us;
            eprintln!(
                "latency: {} appends at {} /s; commit → receipt {} p99.9 {} ms; {} missing",
                l.appends,
                l.rate_achieved,
                p50_p99(p),
                ms(p.p999),
                l.missing
            );
            results.latency = Some(l);
        }
        Ok::<_, String>(results)
    });
    let warnings = server.warnings();
    let stopped = server.stop();
    let results = results?;
    stopped?;
    let checks = checks(opts, &results);
    eprintln!("\n{}", markdown(&results, &checks));
    if !warnings.is_empty() {
        eprintln!(
            "The server logged {} WARN/ERROR lines; the first: {}",
            warnings.len(),
            warnings[0]
        );
    }
    let doc = json!({
        "benchmark": "bridges",
        "machine": machine,
        "options": {
            "only": opts.only,
            "subscriptions": opts.subscriptions,
            "bridges": opts.bridges,
            "append_batch": opts.append_batch,
            "wait_ms": opts.wait_ms,
            "ack_concurrency": opts.ack_concurrency,
            "batch_ack": opts.batch_ack,
            "rate": opts.rate,
            "latency_seconds": opts.latency_seconds,
            "setup_concurrency": opts.setup_concurrency,
        },
        "setup": "one server (release binary, child process) on a fresh data directory; one \
                  pull subscription per task, task i on bridge i mod bridges; one worker per \
                  bridge (long-poll + ack), all in this process over loopback HTTP",
        "results": results,
        "server_warnings": warnings.len(),
        "targets": checks,
    });
    emit_json(&doc, &opts.args)
}

/// Wait until the bridge notifier is idle: its pass count stops moving for 500 ms (bounded).
async fn settle(client: &reqwest::Client, base: &str) {
    let count = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("tidemark_bridge_notifier_pass_seconds_count"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < deadline {
        let text = match client.get(format!("{base}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let now = count(&text);
        if now.is_some() && now == last {
            return;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("latency: the notifier did not settle in 60 s; measuring anyway");
}
