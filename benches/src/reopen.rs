//! Reopen after `kill -9` (tidemark only): a child (this executable, hidden subcommand `fill`)
//! appends until the log holds N events and is killed with SIGKILL mid-flight; another child
//! (`reopen`) measures `Log::open` on the file left behind, with its peak memory. Filling also
//! records the filler's RSS by log length (memory flat in log length, I9).

use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tidemark_log::EventLog;

use serde::Serialize;
use serde_json::json;
use tidemark_log::{Log, LogConfig};

use crate::events::EventGen;
use crate::targets::tidemark::{temp_dir_in, to_new_events};

pub struct ReopenOpts {
    pub events: u64,
    pub samples: usize,
    pub rerun_events: u64,
    pub drop_caches: bool,
}

fn proc_status_kb(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))
}

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
pub struct ReopenResult {
    events: u64,
    fills: Vec<FillResult>,
    samples: Vec<ReopenSample>,
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join("log.redb")
}

/// The filler child: fill the log to `events`, report, keep appending until killed.
pub fn fill_main(
    dir: &Path,
    events: u64,
    progress_every: u64,
    linger_secs: u64,
) -> Result<(), String> {
    // Large batches from a few tasks fill fastest: each group commit takes up to
    // `max_group_events` (20,000) events, so 16 requests of 1,000 keep it full.
    const TASKS: usize = 16;
    const BATCH: u64 = 1000;
    let (log, report) = Log::open(&LogConfig::new(log_path(dir)))
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
                    if let Err(e) = log
                        .append(to_new_events(&evgen.batch(lo..lo + BATCH)))
                        .await
                    {
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
pub fn reopen_main(dir: &Path) -> Result<(), String> {
    let path = log_path(dir);
    let t0 = Instant::now();
    let (log, report) = Log::open(&LogConfig::new(path.clone()))
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
) -> Result<FillResult, String> {
    let mut child = Command::new(exe)
        .arg("fill")
        .arg("--dir")
        .arg(dir)
        .arg("--events")
        .arg(events.to_string())
        .arg("--progress-every")
        .arg(progress_every.to_string())
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

fn run_reopen(exe: &Path, dir: &Path) -> Result<ReopenSample, String> {
    let out = Command::new(exe)
        .arg("reopen")
        .arg("--dir")
        .arg(dir)
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

pub fn reopen_workload(opts: &ReopenOpts, work: &Path) -> Result<ReopenResult, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = temp_dir_in(work, "reopen-")?;
    let progress_every = if opts.events >= 2_000_000 {
        1_000_000
    } else {
        (opts.events / 10).max(1)
    };
    let mut fills = Vec::new();
    let mut samples = Vec::new();
    let mut head = 0;
    for s in 0..opts.samples.max(1) {
        let fill = if s == 0 {
            run_filler(&exe, dir.path(), opts.events, progress_every)?
        } else {
            run_filler(&exe, dir.path(), head + opts.rerun_events, 0)?
        };
        let cold = opts.drop_caches && drop_page_cache();
        let mut sample = run_reopen(&exe, dir.path())?;
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
        events: opts.events,
        fills,
        samples,
    })
}
