//! What the benchmarks that drive the release server over HTTP share: histograms and their
//! percentiles, CPU tick counters from `/proc`, the machine description, where the server
//! binary and the data directories are, and how errors are counted. Included by
//! `claim.rs` and `bridges.rs` with `mod common;`.

#![allow(dead_code)]

pub(crate) use tidemark_benches::machine::{target_dir, work_dir};
pub(crate) use tidemark_benches::measure::{Percentiles, clock_ticks, micros, new_histogram};

use std::path::{Path, PathBuf};

use std::time::SystemTime;

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
