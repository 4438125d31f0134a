//! `idle-tenants` (issue 58): what tenants that are never used cost a server. One
//! `tidemark-http` server (with `--shards`): its resident memory, data directory (files and
//! bytes) and CPU over `--idle-seconds` of doing nothing, before and after `--idle-tenants`
//! tenants are created through `POST /v1/tenants`, and nothing else asked of them.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::measure::Proc;
use crate::targets::{StartOpts, Target, tidemark::TidemarkHttp};

#[derive(Serialize, Default, Debug)]
pub struct IdleSide {
    pub rss_kib: u64,
    pub files: u64,
    pub data_bytes: u64,
    /// CPU the server's process tree used over the idle window, milliseconds.
    pub idle_cpu_ms: u64,
    /// Context switches over the idle window.
    pub idle_ctx_switches: u64,
}

#[derive(Serialize, Default, Debug)]
pub struct IdleResult {
    pub tenants: usize,
    pub shards: u32,
    pub idle_seconds: f64,
    pub create_seconds: f64,
    pub before: IdleSide,
    pub after: IdleSide,
    pub rss_bytes_per_tenant: f64,
    pub error: Option<String>,
}

fn rss_kib(pid: u32) -> u64 {
    Proc::Tree(pid)
        .pids()
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .sum()
}

fn walk(dir: &Path, files: &mut u64, bytes: &mut u64) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => walk(&e.path(), files, bytes),
            Ok(m) => {
                *files += 1;
                *bytes += m.len();
            }
            Err(_) => {}
        }
    }
}

async fn side(t: &TidemarkHttp, idle: Duration) -> IdleSide {
    let proc = Proc::Tree(t.pid());
    let ticks = crate::measure::clock_ticks() as u64;
    let c0 = proc.counters();
    tokio::time::sleep(idle).await;
    let c1 = proc.counters();
    let (mut files, mut data_bytes) = (0, 0);
    if let Some(d) = t.data_dir() {
        walk(d, &mut files, &mut data_bytes);
    }
    IdleSide {
        rss_kib: rss_kib(t.pid()),
        files,
        data_bytes,
        idle_cpu_ms: (c1.cpu_ticks - c0.cpu_ticks) * 1000 / ticks.max(1),
        idle_ctx_switches: c1.ctx_switches.saturating_sub(c0.ctx_switches),
    }
}

impl IdleResult {
    /// The run in one line, as `tidemark-bench` prints it.
    pub fn summary(&self) -> String {
        format!(
            "  idle-tenants: {} tenants ({} shards) made in {:.1} s; rss {} → {} KiB ({:.0} B each), \
             files {} → {}, data {} → {} B, idle cpu {} → {} ms over {} s{}",
            self.tenants,
            self.shards,
            self.create_seconds,
            self.before.rss_kib,
            self.after.rss_kib,
            self.rss_bytes_per_tenant,
            self.before.files,
            self.after.files,
            self.before.data_bytes,
            self.after.data_bytes,
            self.before.idle_cpu_ms,
            self.after.idle_cpu_ms,
            self.idle_seconds,
            crate::report::error_note(self.error.as_deref(), "  ")
        )
    }
}

pub async fn idle_tenants(o: &StartOpts, tenants: usize, idle: Duration) -> IdleResult {
    let mut r = IdleResult {
        tenants,
        shards: o.shards.max(1),
        idle_seconds: idle.as_secs_f64(),
        ..IdleResult::default()
    };
    let t = match TidemarkHttp::start(o).await {
        Ok(t) => t,
        Err(e) => {
            r.error = Some(e);
            return r;
        }
    };
    // Let the start's own work (the first checkpoints, the reactors' first passes) finish.
    tokio::time::sleep(Duration::from_secs(5)).await;
    r.before = side(&t, idle).await;
    let started = Instant::now();
    for i in 0..tenants {
        let resp = t
            .client()
            .post(format!("{}/v1/tenants", t.base()))
            .json(&serde_json::json!({"name": format!("idle-{i}"), "reason": "benchmark"}))
            .send()
            .await;
        match resp {
            Ok(resp) if resp.status().is_success() => {}
            Ok(resp) => {
                r.error = Some(format!("creating tenant {i}: {}", resp.status()));
                break;
            }
            Err(e) => {
                r.error = Some(format!("creating tenant {i}: {e}"));
                break;
            }
        }
    }
    r.create_seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(5)).await;
    r.after = side(&t, idle).await;
    r.rss_bytes_per_tenant =
        (r.after.rss_kib as f64 - r.before.rss_kib as f64) * 1024.0 / tenants.max(1) as f64;
    t.stop().await;
    r
}
