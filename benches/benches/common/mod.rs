//! What the benchmarks that drive the release server over HTTP share: histograms and their
//! percentiles, CPU tick counters from `/proc`, the machine description, where the server
//! binary and the data directories are, and how errors are counted. Included by
//! `claim.rs`, `bridges.rs` and `sources.rs` with `mod common;`; the release server as a child
//! process ([`Server`]).

#![allow(
    dead_code,
    unused_imports,
    reason = "each bench binary uses its part of the shared helpers"
)]

pub(crate) use tidemark_benches::machine::{target_dir, work_dir};
pub(crate) use tidemark_benches::measure::{Percentiles, clock_ticks, micros, new_histogram};

use std::path::{Path, PathBuf};

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde_json::Value;

pub(crate) fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// `p50 <ms> ms p99 <ms> ms`.
pub(crate) fn p50_p99(p: &Percentiles) -> String {
    format!("p50 {} ms p99 {} ms", ms(p.p50), ms(p.p99))
}

/// The p50, p99, p99.9 and max of `p` in ms, as four cells of a markdown table row.
pub(crate) fn ms_cells(p: &Percentiles) -> String {
    format!(
        "{} | {} | {} | {}",
        ms(p.p50),
        ms(p.p99),
        ms(p.p999),
        ms(p.max)
    )
}

/// The options of every benchmark here that drives the release server and reports a JSON
/// document.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// The server binary (default: `<target dir>/release/tidemark`; build it with
    /// `cargo build --release -p tidemark-api`).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Where the data directories go (default: `<target dir>/bench-data`). Not tmpfs.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Also write the JSON document here.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The `main` of a benchmark: `run` with the options parsed; its error goes to stderr as
/// `<name> bench: <error>`, with a failure exit code.
pub(crate) fn run_main<O: clap::Parser>(
    name: &str,
    run: impl FnOnce(&O) -> Result<(), String>,
) -> ExitCode {
    let opts = O::parse();
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name} bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The server binary (warned about when older than its sources), the work directory and the
/// machine of a run of benchmark `name`, the machine said on stderr (and a warning when the
/// work directory is on tmpfs).
pub(crate) fn setup(name: &str, args: &BenchArgs) -> Result<(PathBuf, PathBuf, Machine), String> {
    let bin = server_bin(args.server_bin.as_ref())?;
    warn_if_stale(&bin);
    let work = work_dir(args.work_dir.as_ref())?;
    let machine = machine(&work, &bin);
    eprintln!(
        "{name} bench: {} cpus, {} MiB, kernel {}, data in {} ({} on {}), source {}, server {}",
        machine.cpus,
        machine.mem_total_kb / 1024,
        machine.kernel,
        machine.work_dir,
        machine.work_fs_type,
        machine.work_fs_device,
        machine.source,
        machine.server_bin
    );
    if machine.work_fs_type == "tmpfs" {
        eprintln!("WARNING: the data directory is on tmpfs: fsync is free there; use --work-dir");
    }
    Ok((bin, work, machine))
}

/// The JSON document of a run: pretty on stdout, and in `args.json_out` too when given.
pub(crate) fn emit_json(doc: &Value, args: &BenchArgs) -> Result<(), String> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
    println!("{text}");
    if let Some(path) = &args.json_out {
        std::fs::write(path, format!("{text}\n"))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// A target of the issue or spec and what the run measured against it.
#[derive(Serialize)]
pub(crate) struct TargetCheck {
    pub(crate) name: String,
    pub(crate) target: String,
    pub(crate) measured: String,
    pub(crate) met: bool,
}

impl TargetCheck {
    /// The name, the target, what was measured, and `yes` when the target was met, else
    /// `no`: what a report says of it.
    pub(crate) fn said<'a>(
        &'a self,
        yes: &'a str,
        no: &'a str,
    ) -> (&'a str, &'a str, &'a str, &'a str) {
        let met = if self.met { yes } else { no };
        (&self.name, &self.target, &self.measured, met)
    }
}

/// Errors of a round: counts per kind, the first few verbatim.
#[derive(Serialize, Default, Clone)]
pub(crate) struct Errors {
    pub(crate) count: u64,
    pub(crate) by_kind: std::collections::BTreeMap<String, u64>,
    pub(crate) samples: Vec<String>,
}

impl Errors {
    /// Error answers kept verbatim (the rest are only counted).
    const SAMPLES: usize = 5;

    pub(crate) fn add(&mut self, kind: String, detail: String) {
        self.count += 1;
        *self.by_kind.entry(kind).or_default() += 1;
        if self.samples.len() < Self::SAMPLES {
            self.samples.push(detail);
        }
    }

    pub(crate) fn merge(&mut self, o: Errors) {
        self.count += o.count;
        for (k, v) in o.by_kind {
            *self.by_kind.entry(k).or_default() += v;
        }
        for s in o.samples {
            if self.samples.len() < Self::SAMPLES {
                self.samples.push(s);
            }
        }
    }
}

/// utime + stime, in ticks, of a `/proc/.../stat` file.
pub(crate) fn stat_ticks(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which may hold spaces: state is field 3, utime 14.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The machine of `tidemark_benches::machine` and the server binary the run measured.
#[derive(Serialize)]
pub(crate) struct Machine {
    #[serde(flatten)]
    pub(crate) base: tidemark_benches::machine::Machine,
    pub(crate) server_bin: String,
    /// Modification time of the server binary, seconds since the epoch.
    pub(crate) server_bin_mtime: u64,
}

impl std::ops::Deref for Machine {
    type Target = tidemark_benches::machine::Machine;
    fn deref(&self) -> &Self::Target {
        &self.base
    }
}

pub(crate) fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub(crate) fn server_bin(chosen: Option<&PathBuf>) -> Result<PathBuf, String> {
    let bin = match chosen {
        Some(b) => b.clone(),
        None => target_dir()?.join("release").join("tidemark"),
    };
    if !bin.is_file() {
        return Err(format!(
            "no server binary at {}; build it with `cargo build --release -p tidemark-api` \
             (or pass --server-bin)",
            bin.display()
        ));
    }
    Ok(bin)
}

pub(crate) fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest modification time of the sources the server is built from.
pub(crate) fn newest_source(dir: &Path) -> Option<(SystemTime, PathBuf)> {
    let mut best: Option<(SystemTime, PathBuf)> = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .extension()
                .is_some_and(|x| x == "rs" || x == "toml" || x == "sql")
                && let Some(t) = mtime(&p)
                && best.as_ref().is_none_or(|(b, _)| t > *b)
            {
                best = Some((t, p));
            }
        }
    }
    best
}

/// Warn when a source of the server is newer than its binary: the run would measure old code.
pub(crate) fn warn_if_stale(bin: &Path) {
    let Some(built) = mtime(bin) else {
        return;
    };
    let ws = workspace_dir();
    // The crates' `src` trees and manifests, and the lock file (tests do not go into it).
    let newest = ["log", "projections", "consumers", "api"]
        .iter()
        .filter_map(|c| newest_source(&ws.join(c).join("src")))
        .chain(
            ["log", "projections", "consumers", "api"]
                .iter()
                .map(|c| ws.join(c).join("Cargo.toml"))
                .chain([ws.join("Cargo.lock")])
                .filter_map(|p| Some((mtime(&p)?, p))),
        )
        .max_by_key(|(t, _)| *t);
    if let Some((t, p)) = newest
        && t > built
    {
        eprintln!(
            "WARNING: {} is newer than {}; rebuild with `cargo build --release -p tidemark-api`",
            p.display(),
            bin.display()
        );
    }
}

pub(crate) fn machine(work: &Path, bin: &Path) -> Machine {
    Machine {
        base: tidemark_benches::machine::machine(work),
        server_bin: bin.display().to_string(),
        server_bin_mtime: mtime(bin)
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs()),
    }
}

/// What went wrong with a request, for the error counts: `ack 409 not_pending`.
pub(crate) fn problem_key(what: &str, status: reqwest::StatusCode, body: &[u8]) -> String {
    let code = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "-".into());
    format!("{what} {} {code}", status.as_u16())
}

// The server: the release binary as a child process

pub(crate) struct Server {
    child: Child,
    pub(crate) addr: String,
    stderr_path: PathBuf,
}

impl Server {
    /// `tidemark serve --data <dir>/data --listen 127.0.0.1:0 --config <dir>/bench.toml` with
    /// `text` as that config (the built-in settings when empty, whatever `TIDEMARK_*` the shell
    /// running the bench has exported); the bound address comes from its first stdout line.
    pub(crate) fn start(bin: &Path, dir: &Path, text: &str) -> Result<Server, String> {
        let config = dir.join("bench.toml");
        std::fs::write(&config, text)
            .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let stderr_path = dir.join("server.stderr");
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| format!("cannot create {}: {e}", stderr_path.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--data")
            .arg(dir.join("data"))
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--config")
            .arg(&config);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TIDEMARK_") {
                cmd.env_remove(&k);
            }
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout from the server")?;
        let (tx, rx) = std::sync::mpsc::channel();
        // Read the first line, then drain stdout until the server exits.
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            for _ in lines {}
        });
        let mut server = Server {
            child,
            addr: String::new(),
            stderr_path,
        };
        let Ok(Some(Ok(first))) = rx.recv_timeout(Duration::from_secs(60)) else {
            return Err(format!(
                "the server did not say where it listens; its stderr:\n{}",
                server.stderr_tail(20)
            ));
        };
        server.addr = first
            .strip_prefix("listening on http://")
            .ok_or_else(|| format!("unexpected first line from the server: {first:?}"))?
            .trim()
            .to_owned();
        Ok(server)
    }

    /// `http://<addr>`.
    pub(crate) fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn stderr_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// WARN and ERROR lines the server logged, but the expected one of an open server.
    pub(crate) fn warnings(&self) -> Vec<String> {
        std::fs::read_to_string(&self.stderr_path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .filter(|l| !l.contains("no auth tokens configured"))
            .map(str::to_owned)
            .collect()
    }

    pub(crate) async fn wait_ready(&self, client: &reqwest::Client) -> Result<(), String> {
        let url = self.url("/readyz");
        for _ in 0..600 {
            if let Ok(r) = client.get(&url).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("{url} did not answer 200 within 60 s"))
    }

    /// SIGTERM, then SIGKILL if it has not stopped within 30 s.
    pub(crate) fn stop(mut self) -> Result<(), String> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(0));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(format!(
                        "the server exited with {status}; its stderr:\n{}",
                        self.stderr_tail(20)
                    ));
                }
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(50)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err("the server did not stop within 30 s of SIGTERM".into());
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only when `stop` did not reap it (an error path): do not leave a server behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
