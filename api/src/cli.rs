//! The `tidemark` command line (spec section 9).

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use futures::StreamExt;

use crate::config::Config;

#[derive(Debug, Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Event-sourced notification and delivery engine"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Append events from JSON lines (one event object per line) read from FILE or stdin.
    Append(AppendArgs),
    /// Print events as JSON lines, following the log live.
    Tail(TailArgs),
    /// Inspect, rebuild and verify the read models of a running server.
    Projections(ProjectionsArgs),
    /// List deliveries, and retry or discard parked ones.
    Deliveries(DeliveriesArgs),
    /// Show consumer cursors, or reset one (admin).
    Cursors(CursorsArgs),
    /// Benchmark tidemark against Redis Streams, PostgreSQL, SQLite and NATS JetStream
    /// (`tidemark bench --help` lists the options; peers: benches/peers/install.sh).
    #[command(disable_help_flag = true)]
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Options of the benchmark (`--quick`, `--systems`, `--clients`, `--batches`, `--events`,
    /// `--json-out`, …), passed on to `tidemark-bench`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct CursorsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: CursorsAction,
}

#[derive(Debug, Subcommand)]
pub enum CursorsAction {
    /// One cursor (with --stream), all of a consumer's cursors, or with --lag every cursor's lag.
    Show {
        /// e.g. `bridge_task_subscription:<subscription_id>`.
        #[arg(long)]
        consumer: Option<String>,
        #[arg(long)]
        stream: Option<String>,
        #[arg(long, default_value = "")]
        subject: String,
        /// Every cursor with its lag in events and seconds (stalled ones flagged).
        #[arg(long)]
        lag: bool,
    },
    /// Move a cursor to --to (also down); recorded as a `cursor.reset` event with the reason.
    Reset {
        #[arg(long)]
        consumer: String,
        #[arg(long)]
        stream: String,
        #[arg(long, default_value = "")]
        subject: String,
        #[arg(long)]
        to: u64,
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Args)]
pub struct DeliveriesArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: DeliveriesAction,
}

#[derive(Debug, Subcommand)]
pub enum DeliveriesAction {
    /// Deliveries as JSON lines, by id, filtered (all pages unless --limit).
    List {
        /// queued, leased, retry_wait, sent, parked, discarded, skipped, cancelled.
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        sink: Option<String>,
        #[arg(long)]
        route: Option<String>,
        #[arg(long)]
        recipient: Option<String>,
        /// Stop after this many.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Put a parked delivery back in the queue (attempts reset).
    Retry {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Give up on a parked delivery.
    Discard {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct ProjectionsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: ProjectionsAction,
}

#[derive(Debug, Subcommand)]
pub enum ProjectionsAction {
    /// Each projection's checkpoint, lag and digest.
    List,
    /// Rebuild one projection from the log and switch to it; shows progress.
    Rebuild { name: String },
    /// Rebuild into scratch tables and compare with the live model (all when no name).
    Verify { name: Option<String> },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Data directory (default ./tidemark-data).
    #[arg(long, env = "TIDEMARK_DATA")]
    pub data: Option<PathBuf>,
    /// Listen address (default 127.0.0.1:7700).
    #[arg(long, env = "TIDEMARK_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// TOML config file.
    #[arg(long, env = "TIDEMARK_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Server base URL.
    #[arg(
        long,
        global = true,
        env = "TIDEMARK_URL",
        default_value = "http://127.0.0.1:7700"
    )]
    pub url: String,
    /// Bearer token.
    #[arg(long, global = true, env = "TIDEMARK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Debug, Args)]
pub struct AppendArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// JSON-lines file; stdin when absent.
    pub file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Start after this seq.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    #[arg(long)]
    pub stream: Option<String>,
    #[arg(long)]
    pub subject: Option<String>,
    #[arg(long = "type")]
    pub event_type: Option<String>,
    /// Exit after this many events.
    #[arg(long)]
    pub count: Option<u64>,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tidemark: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match cli.command {
            Command::Serve(a) => serve(a).await,
            Command::Append(a) => append(a).await,
            Command::Tail(a) => tail(a).await,
            Command::Projections(a) => projections(a).await,
            Command::Deliveries(a) => deliveries(a).await,
            Command::Cursors(a) => cursors(a).await,
            // Replaces this process; returns only when the benchmark could not be started.
            Command::Bench(b) => crate::bench::exec(b.args),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tidemark: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tower_http=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

type CliResult = Result<(), String>;

async fn serve(a: ServeArgs) -> CliResult {
    let mut cfg = Config::load(a.config.as_deref()).map_err(|e| e.to_string())?;
    if let Some(d) = a.data {
        cfg.server.data = d;
    }
    if let Some(l) = a.listen {
        cfg.server.listen = l;
    }
    let listener = tokio::net::TcpListener::bind(cfg.server.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.server.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    if cfg.auth.tokens.is_empty() && !addr.ip().is_loopback() {
        return Err(crate::RunError::OpenOnNonLoopback(addr).to_string());
    }
    // Tests and scripts read the bound address (useful with port 0) from this first line.
    println!("listening on http://{addr}");
    let _ = std::io::stdout().flush();
    crate::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn client(args: &ClientArgs) -> Result<reqwest::Client, String> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = &args.token {
        let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {t}"))
            .map_err(|_| "the token contains characters not allowed in a header".to_owned())?;
        v.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .map_err(|e| e.to_string())
}

const APPEND_BATCH_EVENTS: usize = 1000;
const APPEND_BATCH_BYTES: usize = 900 * 1024;

async fn append(a: AppendArgs) -> CliResult {
    let http = client(&a.client)?;
    let url = format!("{}/v1/events", a.client.url.trim_end_matches('/'));
    let reader: Box<dyn BufRead> = match &a.file {
        Some(p) => Box::new(std::io::BufReader::new(
            std::fs::File::open(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?,
        )),
        None => Box::new(std::io::BufReader::new(std::io::stdin())),
    };
    let mut batch: Vec<serde_json::Value> = Vec::new();
    let mut bytes = 0usize;
    let mut total = 0u64;
    for (n, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| format!("cannot read input: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("line {}: not JSON: {e}", n + 1))?;
        if batch.len() >= APPEND_BATCH_EVENTS || bytes + line.len() > APPEND_BATCH_BYTES {
            total += post_batch(&http, &url, std::mem::take(&mut batch)).await?;
            bytes = 0;
            eprintln!("appended {total} events");
        }
        bytes += line.len();
        batch.push(v);
    }
    if !batch.is_empty() {
        total += post_batch(&http, &url, batch).await?;
    }
    eprintln!("appended {total} events");
    Ok(())
}

async fn post_batch(
    http: &reqwest::Client,
    url: &str,
    events: Vec<serde_json::Value>,
) -> Result<u64, String> {
    let body = serde_json::json!({ "events": events });
    loop {
        let resp = http
            .post(url)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("cannot reach the server: {e}"))?;
        let status = resp.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            let secs = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.parse().ok())
                .unwrap_or(1u64);
            tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
            continue;
        }
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("server refused the batch ({status}): {text}"));
        }
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let mut out = std::io::stdout().lock();
        let mut n = 0;
        for e in v["events"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "{e}");
            n += 1;
        }
        return Ok(n);
    }
}

async fn tail(a: TailArgs) -> CliResult {
    let http = client(&a.client)?;
    let mut url = reqwest::Url::parse(&format!(
        "{}/v1/events/stream",
        a.client.url.trim_end_matches('/')
    ))
    .map_err(|e| format!("bad --url: {e}"))?;
    {
        let mut q = url.query_pairs_mut();
        if let Some(s) = &a.stream {
            q.append_pair("stream", s);
        }
        if let Some(s) = &a.subject {
            q.append_pair("subject", s);
        }
        if let Some(s) = &a.event_type {
            q.append_pair("type", s);
        }
    }
    let mut last = a.after;
    let mut printed = 0u64;
    let mut failures = 0u32;
    loop {
        let resp = http
            .get(url.clone())
            .header("Last-Event-ID", last.to_string())
            .send()
            .await;
        let resp = match resp {
            Ok(r) if r.status().is_success() => {
                failures = 0;
                r
            }
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                return Err(format!("server refused the stream ({status}): {text}"));
            }
            Err(e) => {
                failures += 1;
                if failures > 5 {
                    return Err(format!("cannot reach the server: {e}"));
                }
                tokio::time::sleep(std::time::Duration::from_millis(500 * u64::from(failures)))
                    .await;
                continue;
            }
        };
        let mut events = eventsource_stream::Eventsource::eventsource(resp.bytes_stream());
        while let Some(ev) = events.next().await {
            let Ok(ev) = ev else { break };
            if let Ok(seq) = ev.id.parse::<u64>() {
                last = seq;
            }
            println!("{}", ev.data);
            printed += 1;
            if a.count.is_some_and(|c| printed >= c) {
                return Ok(());
            }
        }
        // The stream ended (server restart or shutdown): resume after the last event seen.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

async fn get_json(http: &reqwest::Client, url: &str) -> Result<serde_json::Value, String> {
    let resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("cannot reach the server: {e}"))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("server answered {status}: {text}"));
    }
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

async fn projections(a: ProjectionsArgs) -> CliResult {
    let http = client(&a.client)?;
    let base = format!(
        "{}/v1/admin/projections",
        a.client.url.trim_end_matches('/')
    );
    let names: Vec<(String, &str)> = match &a.action {
        ProjectionsAction::List => {
            let v = get_json(&http, &base).await?;
            println!("{:<16} {:>12} {:>8}  digest", "name", "checkpoint", "lag");
            for p in v["projections"].as_array().into_iter().flatten() {
                println!(
                    "{:<16} {:>12} {:>8}  {}",
                    p["name"].as_str().unwrap_or(""),
                    p["checkpoint"].as_u64().unwrap_or(0),
                    p["lag"].as_u64().unwrap_or(0),
                    p["digest"].as_str().unwrap_or("")
                );
            }
            return Ok(());
        }
        ProjectionsAction::Rebuild { name } => vec![(name.clone(), "rebuild")],
        ProjectionsAction::Verify { name: Some(name) } => vec![(name.clone(), "verify")],
        ProjectionsAction::Verify { name: None } => {
            let v = get_json(&http, &base).await?;
            v["projections"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str().map(|n| (n.to_owned(), "verify")))
                .collect()
        }
    };
    let mut all_identical = true;
    for (name, action) in names {
        let url = format!("{base}/{name}/{action}");
        let req = http.post(&url).send();
        tokio::pin!(req);
        // Show progress while the server works.
        let resp = loop {
            tokio::select! {
                r = &mut req => break r.map_err(|e| format!("cannot reach the server: {e}"))?,
                _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {
                    if let Ok(v) = get_json(&http, &base).await
                        && let Some(p) = v["projections"].as_array().into_iter().flatten().find(|p| p["name"] == name.as_str())
                        && let Some(r) = p.get("rebuild").filter(|r| !r.is_null())
                    {
                        eprint!("\r{action} {name}: {} / {} events", r["done"], r["head"]);
                    }
                }
            }
        };
        let status = resp.status();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{action} {name} failed ({status}): {text}"));
        }
        eprintln!();
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        all_identical &= v["identical"].as_bool().unwrap_or(false);
        println!("{v}");
    }
    if all_identical {
        Ok(())
    } else {
        Err("a rebuilt model differs from the live one (see first_divergent_seq)".into())
    }
}

/// Percent-encode a query or path value.
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn deliveries(a: DeliveriesArgs) -> CliResult {
    let http = client(&a.client)?;
    let base = format!("{}/v1/deliveries", a.client.url.trim_end_matches('/'));
    match a.action {
        DeliveriesAction::List {
            status,
            sink,
            route,
            recipient,
            limit,
        } => {
            let mut filters = String::new();
            for (k, v) in [
                ("status", &status),
                ("sink", &sink),
                ("route", &route),
                ("recipient", &recipient),
            ] {
                if let Some(v) = v {
                    filters.push_str(&format!("&{k}={}", enc(v)));
                }
            }
            let mut after: Option<String> = None;
            let mut printed = 0u64;
            let stdout = std::io::stdout();
            loop {
                let mut url = format!("{base}?limit=1000{filters}");
                if let Some(a) = &after {
                    url.push_str(&format!("&after={}", enc(a)));
                }
                let v = get_json(&http, &url).await?;
                let mut out = stdout.lock();
                for d in v["deliveries"].as_array().into_iter().flatten() {
                    if limit.is_some_and(|l| printed >= l) {
                        return Ok(());
                    }
                    writeln!(out, "{d}").map_err(|e| e.to_string())?;
                    printed += 1;
                }
                match v["next_after"].as_str() {
                    Some(n) => after = Some(n.to_owned()),
                    None => return Ok(()),
                }
            }
        }
        DeliveriesAction::Retry { id, reason } => {
            operator_action(&http, &base, &id, "retry", reason).await
        }
        DeliveriesAction::Discard { id, reason } => {
            operator_action(&http, &base, &id, "discard", reason).await
        }
    }
}

async fn operator_action(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    action: &str,
    reason: Option<String>,
) -> CliResult {
    let url = format!("{base}/{}/{action}", enc(id));
    let mut body = serde_json::json!({"by": "cli"});
    if let Some(r) = reason {
        body["reason"] = serde_json::Value::String(r);
    }
    let resp = http
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("cannot reach the server: {e}"))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{action} {id} failed ({status}): {text}"));
    }
    println!("{text}");
    Ok(())
}

async fn cursors(a: CursorsArgs) -> CliResult {
    let http = client(&a.client)?;
    let base = a.client.url.trim_end_matches('/').to_owned();
    match a.action {
        CursorsAction::Show {
            consumer,
            stream,
            subject,
            lag,
        } => {
            let v = if lag {
                get_json(&http, &format!("{base}/v1/consumers/lag")).await?
            } else {
                let consumer = consumer.ok_or("give --consumer (or --lag for every cursor)")?;
                let mut url = format!("{base}/v1/cursors?consumer_id={}", enc(&consumer));
                if let Some(s) = &stream {
                    url.push_str(&format!(
                        "&stream_name={}&subject_id={}",
                        enc(s),
                        enc(&subject)
                    ));
                }
                get_json(&http, &url).await?
            };
            for c in v["cursors"].as_array().into_iter().flatten() {
                println!("{c}");
            }
            Ok(())
        }
        CursorsAction::Reset {
            consumer,
            stream,
            subject,
            to,
            reason,
        } => {
            let body = serde_json::json!({
                "consumer_id": consumer, "stream_name": stream, "subject_id": subject,
                "last_sequence": to, "reason": reason,
            });
            let resp = http
                .post(format!("{base}/v1/cursors/reset"))
                .json(&body)
                .send()
                .await
                .map_err(|e| format!("cannot reach the server: {e}"))?;
            let status = resp.status();
            let text = resp.text().await.map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("reset failed ({status}): {text}"));
            }
            println!("{text}");
            Ok(())
        }
    }
}
