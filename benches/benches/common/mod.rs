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
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde_json::Value;

pub(crate) fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
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
