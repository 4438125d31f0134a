//! Delivery claim → complete benchmark of tidemark (issue "delivery runtime"): round trips
//! per second over HTTP with 1, 8 and 32 claimers, claiming batches of 1 and 50, with p50/p99
//! latency. Target: at least 20,000 deliveries/s completed with 32 claimers and batches of 50.
//!
//! A plain `main` (`harness = false`). Build the server first, then run it:
//!
//! ```text
//! cargo build --release -p tidemark-api
//! cargo bench -p tidemark-benches --bench claim -- [options]
//! ```
//!
//! Progress rows and the closing markdown tables go to stderr; the JSON document with every
//! figure goes to stdout (and to `--json-out FILE`).
//!
//! # What one configuration does
//! Every configuration (claimers × batch) gets a server of its own: the real release binary
//! (`target/release/tidemark serve`) as a child process, on a fresh data directory, with a
//! config file that lifts `notifications.outbox.max_pending` and lengthens the lease. So every
//! configuration starts from the same log and the same queue, and the figures are comparable.
//!
//! 1. Preload: `--deliveries` urgent `notification.requested` events (unique ids, batches of
//!    `--preload-batch` over `POST /v1/events`), then wait until the routing reactor has made
//!    a queued `app` delivery of each (`GET /v1/outbox/kpis`). Not measured as the workload.
//! 2. Run: C claimer tasks on one shared keep-alive client. Each loops
//!    `POST /v1/deliveries/claim {"sink":"app","owner":"c<i>","limit":B,"lease_ms":…}`, then
//!    `POST /v1/deliveries/{id}/complete {"owner":"c<i>"}` for each claimed id in turn, until
//!    a claim comes back empty or the `--seconds` budget is used (a batch already claimed is
//!    still completed). Latencies: per delivery round trip (claim request start → that
//!    delivery's complete reply), per claim request, per complete request.
//!    Throughput = completed deliveries / wall time from the start until the last claimer ends.
//! 3. Check: the KPIs afterwards must show nothing leased, `sent` = completed, and
//!    `queued` = preloaded − completed.
//! 4. Where time goes: CPU seconds of the server (per thread name) and of this client over the
//!    run, and the bytes the server wrote, per completed delivery.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use common::*;
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};
use tidemark_benches::http::{get_ok_json, notification_requested, post_json_body};

/// The sink of desktop deliveries.
const SINK: &str = "app";
/// The throughput target of the issue, at `TARGET_CLAIMERS` claimers and `TARGET_BATCH`.
const TARGET_PER_SEC: f64 = 20_000.0;
const TARGET_CLAIMERS: usize = 32;
const TARGET_BATCH: usize = 50;

#[derive(Parser)]
#[command(name = "claim", about = "tidemark delivery claim → complete benchmark")]
struct Opts {
    /// Concurrent claimers.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    claimers: Vec<usize>,
    /// Deliveries claimed per claim request (`limit`, 1–1000).
    #[arg(long, value_delimiter = ',', default_value = "1,50")]
    batches: Vec<usize>,
    /// Deliveries preloaded before each configuration.
    #[arg(long, default_value_t = 40_000)]
    deliveries: u64,
    /// Time budget per configuration, seconds: claimers stop claiming after it.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Complete each claimed batch with one `POST /v1/deliveries/complete` (the batch form)
    /// instead of one `POST /v1/deliveries/{id}/complete` per delivery.
    #[arg(long)]
    batch_complete: bool,
    /// `lease_ms` of each claim (long enough that no lease expires during a run).
    #[arg(long, default_value_t = 600_000)]
    lease_ms: u64,
    /// Events per `POST /v1/events` of the preload (at most 1000).
    #[arg(long, default_value_t = 1000)]
    preload_batch: u64,
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    run_main("claim", bench_main)
}

// ---------------------------------------------------------------------------------------------
// Measuring

/// CPU ticks of each thread of a process, by thread id, with the thread's name.
fn thread_ticks(pid: u32) -> BTreeMap<u64, (String, u64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u64>().ok()) else {
            continue;
        };
        let name = std::fs::read_to_string(e.path().join("comm"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        if let Some(t) = stat_ticks(&e.path().join("stat")) {
            out.insert(tid, (name, t));
        }
    }
    out
}

/// CPU seconds per thread name between two samples (threads that came and went count from 0).
fn cpu_by_name(
    before: &BTreeMap<u64, (String, u64)>,
    after: &BTreeMap<u64, (String, u64)>,
    hz: f64,
) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for (tid, (name, t)) in after {
        let t0 = before.get(tid).map_or(0, |(_, t0)| *t0);
        let d = t.saturating_sub(t0) as f64 / hz;
        if d > 0.0 {
            *out.entry(name.clone()).or_default() += d;
        }
    }
    for v in out.values_mut() {
        *v = (*v * 100.0).round() / 100.0;
    }
    out
}

/// `write_bytes` of `/proc/<pid>/io`, when readable.
fn io_write_bytes(pid: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------------------------------------
// The machine and where things are

// ---------------------------------------------------------------------------------------------
// HTTP helpers

/// Percent-encode a path segment: everything but RFC 3986 `pchar`s. Delivery ids
/// (`dlv:<notification id>:desktop`) keep their `:`.
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The `app` sink's KPIs (zeros when the sink has no deliveries yet).
async fn app_kpis(client: &reqwest::Client, server: &Server) -> Result<Value, String> {
    let v = get_ok_json(client, &server.url("/v1/outbox/kpis?interval_s=86400")).await?;
    Ok(v["by_sink"][SINK].clone())
}

fn field(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Preload

/// Append `n` urgent notifications (`<prefix>-<i>`) in batches, a few requests at a time.
async fn preload(
    client: &reqwest::Client,
    server: &Server,
    prefix: &str,
    n: u64,
    batch: u64,
) -> Result<(), String> {
    const CONCURRENCY: u64 = 4;
    let url = server.url("/v1/events");
    let batches = n.div_ceil(batch);
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..CONCURRENCY {
        let (client, url, prefix) = (client.clone(), url.clone(), prefix.to_owned());
        tasks.spawn(async move {
            let mut k = t;
            while k < batches {
                let lo = k * batch;
                let events: Vec<Value> = (lo..(lo + batch).min(n))
                    .map(|i| {
                        let title = format!("bench delivery {i}");
                        let payload = json!({"priority": "urgent", "title": title});
                        notification_requested(&format!("{prefix}-{i}"), payload)
                    })
                    .collect();
                let body =
                    serde_json::to_vec(&json!({ "events": events })).map_err(|e| e.to_string())?;
                let (status, body) = post_json_body(&client, &url, body).await?;
                if status != reqwest::StatusCode::CREATED {
                    return Err(format!(
                        "preload: POST {url} answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    ));
                }
                let v: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
                if v["events"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|e| e["duplicate"] == true))
                {
                    return Err("preload: the server reported a duplicate event_id".into());
                }
                k += CONCURRENCY;
            }
            Ok::<_, String>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| format!("preload task: {e}"))??;
    }
    Ok(())
}

/// Wait until the routing reactor has made `n` queued `app` deliveries.
async fn wait_routed(client: &reqwest::Client, server: &Server, n: u64) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(120 + n / 1000);
    let mut queued = 0;
    while Instant::now() < until {
        let k = app_kpis(client, server).await?;
        queued = field(&k, "queued");
        if queued == n {
            return Ok(());
        }
        if queued > n {
            return Err(format!(
                "{queued} deliveries queued, more than the {n} preloaded"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "only {queued} of {n} deliveries were routed in time"
    ))
}

// ---------------------------------------------------------------------------------------------
// Claimers

#[derive(serde::Deserialize)]
struct ClaimReply {
    deliveries: Vec<ClaimedRow>,
}

#[derive(serde::Deserialize)]
struct ClaimedRow {
    id: String,
    status: String,
    lease_owner: Option<String>,
}

#[derive(serde::Deserialize)]
struct CompleteReply {
    status: String,
}

/// What one claimer measured.
struct ClaimerOut {
    round_trip: Histogram<u64>,
    claim: Histogram<u64>,
    complete: Histogram<u64>,
    completed: u64,
    claims: u64,
    empty_claims: u64,
    drained: bool,
    errors: Errors,
}

impl ClaimerOut {
    /// A non-2xx answer of the server to `POST url` of `what`: counted by its problem, kept
    /// verbatim.
    fn refused(&mut self, what: &str, url: &str, status: reqwest::StatusCode, body: &[u8]) {
        self.errors.add(
            problem_key(what, status, body),
            format!("POST {url} → {status}: {}", String::from_utf8_lossy(body)),
        );
    }
}

struct Claimer {
    client: reqwest::Client,
    base: String,
    owner: String,
    batch: usize,
    lease_ms: u64,
    batch_complete: bool,
}

#[derive(serde::Deserialize)]
struct CompleteManyReply {
    results: Vec<CompleteManyItem>,
}

#[derive(serde::Deserialize)]
struct CompleteManyItem {
    status: u16,
    code: Option<String>,
}

/// How a completion request went.
enum Completion {
    /// Answered with a success at this time, with this body.
    Done(Instant, bytes::Bytes),
    /// Refused (counted in the errors): claim again.
    Refused,
    /// The transport failed: the server is gone, the claimer stops.
    Gone,
}

impl Claimer {
    async fn run(self, deadline: Instant) -> ClaimerOut {
        let mut out = ClaimerOut {
            round_trip: new_histogram(),
            claim: new_histogram(),
            complete: new_histogram(),
            completed: 0,
            claims: 0,
            empty_claims: 0,
            drained: false,
            errors: Errors::default(),
        };
        let claim_url = format!("{}/v1/deliveries/claim", self.base);
        let claim_body = serde_json::to_vec(&json!({
            "sink": SINK,
            "owner": self.owner,
            "limit": self.batch,
            "lease_ms": self.lease_ms,
        }))
        .expect("JSON encodes");
        let complete_body =
            serde_json::to_vec(&json!({ "owner": self.owner })).expect("JSON encodes");
        while Instant::now() < deadline {
            let t0 = Instant::now();
            let (status, body) =
                match post_json_body(&self.client, &claim_url, claim_body.clone()).await {
                    Ok(answer) => answer,
                    Err(e) => {
                        // Loopback transport errors mean the server is gone: stop this claimer.
                        out.errors.add("claim transport".into(), e);
                        break;
                    }
                };
            if !status.is_success() {
                out.refused("claim", &claim_url, status, &body);
                // Overload (429) or a transient failure: back off a little and claim again.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            let reply: ClaimReply = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => {
                    out.errors
                        .add("claim bad_reply".into(), format!("claim reply: {e}"));
                    continue;
                }
            };
            if reply.deliveries.is_empty() {
                out.claim.saturating_record(micros(t0.elapsed()));
                out.empty_claims += 1;
                out.drained = true;
                break;
            }
            out.claim.saturating_record(micros(t0.elapsed()));
            out.claims += 1;
            if self.batch_complete {
                let url = format!("{}/v1/deliveries/complete", self.base);
                let ids: Vec<Value> = reply
                    .deliveries
                    .iter()
                    .map(|d| json!({"id": d.id}))
                    .collect();
                let body = serde_json::to_vec(&json!({"owner": self.owner, "deliveries": ids}))
                    .expect("JSON encodes");
                let (done, body) = match self.complete(&mut out, &url, body).await {
                    Completion::Done(done, body) => (done, body),
                    Completion::Refused => continue,
                    Completion::Gone => return out,
                };
                match serde_json::from_slice::<CompleteManyReply>(&body) {
                    Ok(reply) => {
                        for item in reply.results {
                            if item.status == 200 {
                                out.completed += 1;
                                out.round_trip.saturating_record(micros(done - t0));
                            } else {
                                out.errors.add(
                                    format!("complete item {}", item.code.unwrap_or_default()),
                                    "batch item refused".into(),
                                );
                            }
                        }
                    }
                    Err(e) => out
                        .errors
                        .add("complete bad_reply".into(), format!("reply: {e}")),
                }
                continue;
            }
            for row in reply.deliveries {
                if row.status != "leased" || row.lease_owner.as_deref() != Some(&self.owner) {
                    out.errors.add(
                        "claim not_leased_to_me".into(),
                        format!(
                            "claimed {} is {} by {:?}",
                            row.id, row.status, row.lease_owner
                        ),
                    );
                }
                let url = format!(
                    "{}/v1/deliveries/{}/complete",
                    self.base,
                    encode_segment(&row.id)
                );
                let (done, body) = match self.complete(&mut out, &url, complete_body.clone()).await
                {
                    Completion::Done(done, body) => (done, body),
                    Completion::Refused => continue,
                    Completion::Gone => return out,
                };
                match serde_json::from_slice::<CompleteReply>(&body) {
                    Ok(c) if c.status == "sent" => {
                        out.completed += 1;
                        out.round_trip.saturating_record(micros(done - t0));
                    }
                    Ok(c) => out.errors.add(
                        "complete not_sent".into(),
                        format!("completed {} is {}", row.id, c.status),
                    ),
                    Err(e) => out
                        .errors
                        .add("complete bad_reply".into(), format!("reply: {e}")),
                }
            }
        }
        out
    }

    /// `POST url` with `body`, a completion: its time goes to the `complete` histogram, a
    /// refusal or a failed transport to the errors.
    async fn complete(&self, out: &mut ClaimerOut, url: &str, body: Vec<u8>) -> Completion {
        let t1 = Instant::now();
        let (status, body) = match post_json_body(&self.client, url, body).await {
            Ok(answer) => answer,
            Err(e) => {
                out.errors.add("complete transport".into(), e);
                return Completion::Gone;
            }
        };
        let done = Instant::now();
        out.complete.saturating_record(micros(done - t1));
        if !status.is_success() {
            out.refused("complete", url, status, &body);
            return Completion::Refused;
        }
        Completion::Done(done, body)
    }
}

// ---------------------------------------------------------------------------------------------
// One configuration

#[derive(Serialize)]
struct ServerUsage {
    /// CPU seconds of the server over the run, by thread name.
    cpu_s_by_thread: BTreeMap<String, f64>,
    cpu_s: f64,
    /// Server CPU per completed delivery.
    cpu_us_per_delivery: f64,
    /// Bytes the server caused to be written to storage, per completed delivery.
    write_bytes_per_delivery: Option<f64>,
    /// CPU seconds of this process (the claimers and reqwest) over the run.
    client_cpu_s: f64,
}

#[derive(Serialize)]
struct AfterCheck {
    queued: u64,
    leased: u64,
    sent: u64,
    /// Nothing left leased, sent = completed, queued = preloaded − completed.
    consistent: bool,
}

#[derive(Serialize)]
struct Run {
    claimers: usize,
    batch: usize,
    preloaded: u64,
    preload_s: f64,
    routing_s: f64,
    completed: u64,
    /// Claim requests that leased at least one delivery.
    claims: u64,
    empty_claims: u64,
    /// `drained`: every claimer saw an empty claim; `time budget`: stopped by `--seconds`.
    ended: &'static str,
    seconds: f64,
    deliveries_per_sec: f64,
    round_trip_us: Percentiles,
    claim_us: Percentiles,
    complete_us: Percentiles,
    /// Non-2xx replies and transport failures by `endpoint status code`.
    errors: BTreeMap<String, u64>,
    error_samples: Vec<String>,
    after: AfterCheck,
    server: ServerUsage,
    /// WARN/ERROR lines of the server's log during the whole configuration.
    server_warnings: Vec<String>,
}

fn run_config(
    opts: &Opts,
    bin: &Path,
    work: &Path,
    rt: &tokio::runtime::Runtime,
    claimers: usize,
    batch: usize,
    k: usize,
) -> Result<Run, String> {
    let dir = tempfile::Builder::new()
        .prefix("claim-")
        .tempdir_in(work)
        .map_err(|e| format!("cannot create a data directory in {}: {e}", work.display()))?;
    let max_pending = (opts.deliveries * 2).max(10_000_000);
    // Deliveries are preloaded well above the default max_pending, and no lease may expire
    // during a run (the claims also ask for `lease_ms`).
    let lease_s = opts.lease_ms.div_ceil(1000).max(1);
    let config = format!(
        "[notifications.retry]\nlease_ttl = \"{lease_s}s\"\n\n\
         [notifications.outbox]\nmax_pending = {max_pending}\n"
    );
    let server = Server::start(bin, dir.path(), &config)?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| format!("HTTP client: {e}"))?;
    let run = rt.block_on(measure(opts, &server, &client, claimers, batch, k));
    let warnings = server.warnings();
    // The client (and its idle connections) goes before the server stops.
    drop(client);
    let stopped = server.stop();
    let mut run = run?;
    stopped?;
    run.server_warnings = warnings;
    Ok(run)
}

async fn measure(
    opts: &Opts,
    server: &Server,
    client: &reqwest::Client,
    claimers: usize,
    batch: usize,
    k: usize,
) -> Result<Run, String> {
    server.wait_ready(client).await?;
    let n = opts.deliveries;
    let t = Instant::now();
    preload(client, server, &format!("bench-{k}"), n, opts.preload_batch).await?;
    let preload_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    wait_routed(client, server, n).await?;
    let routing_s = t.elapsed().as_secs_f64();

    // Open one connection per claimer before the clock starts.
    let mut warm = tokio::task::JoinSet::new();
    for _ in 0..claimers {
        let (client, url) = (client.clone(), server.url("/healthz"));
        warm.spawn(async move { client.get(&url).send().await.map(|_| ()) });
    }
    while let Some(r) = warm.join_next().await {
        r.map_err(|e| e.to_string())?
            .map_err(|e| format!("warm-up: {e}"))?;
    }

    let hz = clock_ticks();
    let pid = server.pid();
    let cpu0 = thread_ticks(pid);
    let io0 = io_write_bytes(&pid.to_string());
    let self0 = stat_ticks(Path::new("/proc/self/stat")).unwrap_or(0);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(opts.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..claimers {
        let c = Claimer {
            client: client.clone(),
            base: format!("http://{}", server.addr),
            owner: format!("c{i}"),
            batch,
            lease_ms: opts.lease_ms,
            batch_complete: opts.batch_complete,
        };
        tasks.spawn(c.run(deadline));
    }
    let mut round_trip = new_histogram();
    let mut claim = new_histogram();
    let mut complete = new_histogram();
    let (mut completed, mut claims, mut empty_claims, mut drained) = (0, 0, 0, true);
    let mut errors = Errors::default();
    while let Some(j) = tasks.join_next().await {
        let o = j.map_err(|e| format!("claimer task failed: {e}"))?;
        let add =
            |a: &mut Histogram<u64>, b: &Histogram<u64>| a.add(b).map_err(|e| format!("{e:?}"));
        add(&mut round_trip, &o.round_trip)?;
        add(&mut claim, &o.claim)?;
        add(&mut complete, &o.complete)?;
        completed += o.completed;
        claims += o.claims;
        empty_claims += o.empty_claims;
        drained &= o.drained;
        errors.merge(o.errors);
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu1 = thread_ticks(pid);
    let io1 = io_write_bytes(&pid.to_string());
    let self1 = stat_ticks(Path::new("/proc/self/stat")).unwrap_or(0);

    let by_thread = cpu_by_name(&cpu0, &cpu1, hz);
    let cpu_s: f64 = by_thread.values().sum();
    let per = |x: f64| (x / completed.max(1) as f64 * 10.0).round() / 10.0;
    let server_usage = ServerUsage {
        cpu_s: (cpu_s * 100.0).round() / 100.0,
        cpu_us_per_delivery: per(cpu_s * 1e6),
        write_bytes_per_delivery: io0.zip(io1).map(|(a, b)| per(b.saturating_sub(a) as f64)),
        client_cpu_s: (self1.saturating_sub(self0) as f64 / hz * 100.0).round() / 100.0,
        cpu_s_by_thread: by_thread,
    };

    let k = app_kpis(client, server).await?;
    let (queued, leased, sent) = (
        field(&k, "queued"),
        field(&k, "leased"),
        field(&k, "sent_last_interval"),
    );
    let after = AfterCheck {
        queued,
        leased,
        sent,
        consistent: leased == 0 && sent == completed && queued + completed == n,
    };
    Ok(Run {
        claimers,
        batch,
        preloaded: n,
        preload_s: (preload_s * 100.0).round() / 100.0,
        routing_s: (routing_s * 100.0).round() / 100.0,
        completed,
        claims,
        empty_claims,
        ended: if drained { "drained" } else { "time budget" },
        seconds: (seconds * 1000.0).round() / 1000.0,
        deliveries_per_sec: (completed as f64 / seconds).round(),
        round_trip_us: Percentiles::from(&round_trip),
        claim_us: Percentiles::from(&claim),
        complete_us: Percentiles::from(&complete),
        errors: errors.by_kind,
        error_samples: errors.samples,
        after,
        server: server_usage,
        server_warnings: Vec::new(),
    })
}

fn print_run(r: &Run) {
    eprintln!(
        "claimers {:>3}  batch {:>3}  {:>7} completed in {:>6.2} s ({})  {:>7} deliveries/s  \
         round trip {}  claim {}  complete {}  server CPU {:.1} µs/delivery  errors {}",
        r.claimers,
        r.batch,
        r.completed,
        r.seconds,
        r.ended,
        r.deliveries_per_sec,
        p50_p99(&r.round_trip_us),
        p50_p99(&r.claim_us),
        p50_p99(&r.complete_us),
        r.server.cpu_us_per_delivery,
        r.errors.values().sum::<u64>(),
    );
    if !r.after.consistent {
        eprintln!(
            "  WARNING: KPIs after the run: queued {}, leased {}, sent {} (completed {} of {})",
            r.after.queued, r.after.leased, r.after.sent, r.completed, r.preloaded
        );
    }
    for (key, n) in &r.errors {
        eprintln!("  error: {key} × {n}");
    }
    for s in &r.error_samples {
        eprintln!("    e.g. {s}");
    }
    for w in r.server_warnings.iter().take(5) {
        eprintln!("  server: {w}");
    }
}

// ---------------------------------------------------------------------------------------------
// The report

fn check(runs: &[Run]) -> Option<TargetCheck> {
    let r = runs
        .iter()
        .find(|r| r.claimers == TARGET_CLAIMERS && r.batch == TARGET_BATCH)?;
    Some(TargetCheck {
        name: format!("claim → complete, {TARGET_CLAIMERS} claimers, batches of {TARGET_BATCH}"),
        target: format!(">= {TARGET_PER_SEC} deliveries/s completed"),
        measured: format!(
            "{} deliveries/s (p50 {} ms, p99 {} ms round trip)",
            r.deliveries_per_sec,
            ms(r.round_trip_us.p50),
            ms(r.round_trip_us.p99)
        ),
        met: r.deliveries_per_sec >= TARGET_PER_SEC,
    })
}

fn markdown(runs: &[Run], check: Option<&TargetCheck>) -> String {
    let mut s = String::new();
    s.push_str(
        "| claimers | batch | completed | s | deliveries/s | round trip p50 ms | p99 ms | p99.9 ms \
         | claim p50 ms | p99 ms | complete p50 ms | p99 ms | server CPU µs/delivery \
         | server B written/delivery | errors |\n",
    );
    s.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in runs {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.claimers,
            r.batch,
            r.completed,
            r.seconds,
            r.deliveries_per_sec,
            ms(r.round_trip_us.p50),
            ms(r.round_trip_us.p99),
            ms(r.round_trip_us.p999),
            ms(r.claim_us.p50),
            ms(r.claim_us.p99),
            ms(r.complete_us.p50),
            ms(r.complete_us.p99),
            r.server.cpu_us_per_delivery,
            r.server
                .write_bytes_per_delivery
                .map_or_else(|| "?".into(), |b| b.to_string()),
            r.errors.values().sum::<u64>(),
        );
    }
    s.push('\n');
    s.push_str("| claimers | batch | server CPU s by thread | client CPU s | ended |\n");
    s.push_str("|---:|---:|---|---:|---|\n");
    for r in runs {
        let threads: Vec<String> = r
            .server
            .cpu_s_by_thread
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {} |",
            r.claimers,
            r.batch,
            threads.join(", "),
            r.server.client_cpu_s,
            r.ended
        );
    }
    s.push('\n');
    match check {
        Some(c) => {
            let (name, target, measured, met) = c.said("MET", "MISSED");
            let _ = writeln!(
                s,
                "Target: {name}: wanted {target}, measured {measured}: {met}"
            );
        }
        None => {
            let _ = writeln!(
                s,
                "Target: {TARGET_CLAIMERS} claimers × batch {TARGET_BATCH} was not measured \
                 (not in --claimers/--batches)"
            );
        }
    }
    s
}

fn bench_main(opts: &Opts) -> Result<(), String> {
    if opts.claimers.is_empty() || opts.claimers.contains(&0) {
        return Err("--claimers must be positive".into());
    }
    if opts.batches.iter().any(|b| !(1..=1000).contains(b)) {
        return Err("--batches must be from 1 to 1000".into());
    }
    if !(1..=1000).contains(&opts.preload_batch) {
        return Err("--preload-batch must be from 1 to 1000".into());
    }
    if opts.deliveries == 0 || opts.seconds.is_nan() || opts.seconds <= 0.0 {
        return Err("--deliveries and --seconds must be positive".into());
    }
    if !(100..=3_600_000).contains(&opts.lease_ms) {
        return Err("--lease-ms must be from 100 to 3600000".into());
    }
    let (bin, work, machine) = setup("claim", &opts.args)?;
    eprintln!(
        "one server per configuration (fresh data directory, {} urgent deliveries preloaded), \
         budget {} s each",
        opts.deliveries, opts.seconds
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))?;
    let mut runs = Vec::new();
    let mut k = 0;
    for &claimers in &opts.claimers {
        for &batch in &opts.batches {
            let run = run_config(opts, &bin, &work, &rt, claimers, batch, k)?;
            k += 1;
            print_run(&run);
            runs.push(run);
        }
    }
    let check = check(&runs);
    eprintln!("\n{}", markdown(&runs, check.as_ref()));
    let doc = json!({
        "benchmark": "claim",
        "machine": machine,
        "setup": "one server (release binary, child process) per configuration, on a fresh data \
                  directory, with `deliveries` urgent notifications routed to queued `app` \
                  deliveries before the clock starts; one shared keep-alive HTTP/1.1 client",
        "options": {
            "claimers": opts.claimers,
            "batches": opts.batches,
            "deliveries": opts.deliveries,
            "seconds": opts.seconds,
            "lease_ms": opts.lease_ms,
            "preload_batch": opts.preload_batch,
        },
        "results": runs,
        "targets": check.into_iter().collect::<Vec<_>>(),
    });
    emit_json(&doc, &opts.args)
}
