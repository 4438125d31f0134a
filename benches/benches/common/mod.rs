//! What the benchmarks that drive the release server over HTTP share: histograms and their
//! percentiles, CPU tick counters from `/proc`, the machine description, where the server
//! binary and the data directories are, and how errors are counted. Included by
//! `claim.rs` and `bridges.rs` with `mod common;`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::Value;

pub(crate) fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 10 min, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Latency percentiles in microseconds.
#[derive(Serialize, Clone, Copy, Default)]
pub(crate) struct Percentiles {
    pub(crate) count: u64,
    pub(crate) p50: u64,
    pub(crate) p99: u64,
    pub(crate) p999: u64,
    pub(crate) max: u64,
    pub(crate) mean: f64,
}

impl From<&Histogram<u64>> for Percentiles {
    fn from(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
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

pub(crate) fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// Clock ticks per second of /proc's CPU times.
pub(crate) fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime, in ticks, of a `/proc/.../stat` file.
pub(crate) fn stat_ticks(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which may hold spaces: state is field 3, utime 14.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[derive(Serialize)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) mem_total_kb: u64,
    pub(crate) kernel: String,
    pub(crate) work_dir: String,
    pub(crate) work_fs_type: String,
    pub(crate) work_fs_device: String,
    /// `git describe --always --dirty` of the workspace: which code was measured.
    pub(crate) source: String,
    pub(crate) server_bin: String,
    /// Modification time of the server binary, seconds since the epoch.
    pub(crate) server_bin_mtime: u64,
}

/// The cargo target directory: `CARGO_TARGET_DIR`, or the one this executable was built into
/// (`<target>/release/deps/<bench>-<hash>`).
pub(crate) fn target_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        let d = PathBuf::from(d);
        return Ok(if d.is_relative() {
            workspace_dir().join(d)
        } else {
            d
        });
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    exe.ancestors()
        .find(|p| p.join("CACHEDIR.TAG").exists())
        .map(Path::to_path_buf)
        .or_else(|| exe.ancestors().nth(3).map(Path::to_path_buf))
        .ok_or_else(|| "cannot find the target directory; pass --work-dir".to_owned())
}

pub(crate) fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub(crate) fn work_dir(chosen: Option<&PathBuf>) -> Result<PathBuf, String> {
    let dir = match chosen {
        Some(d) => d.clone(),
        None => target_dir()?.join("bench-data"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    dir.canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))
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

/// (device, fs type) of the mount holding `dir`: the longest mount point that is a prefix.
pub(crate) fn filesystem_of(dir: &Path) -> (String, String) {
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

pub(crate) fn machine(work: &Path, bin: &Path) -> Machine {
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
