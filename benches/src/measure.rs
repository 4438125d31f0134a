//! What a run measures besides time: hdrhistogram percentiles, and a server's CPU, bytes
//! written and fsync calls, read from `/proc` (and `strace`) over its whole process tree.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

pub fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 10 min, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Latency percentiles in microseconds.
#[derive(Serialize, serde::Deserialize, Clone, Copy, Default, Debug)]
pub struct Percentiles {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
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

/// Whose counters a run reads: a server's process tree, or this process (in-process targets).
#[derive(Clone, Copy, Debug)]
pub enum Proc {
    Tree(u32),
    /// Several servers' trees (a tidemark node and its NATS cluster); 0 = unused.
    Trees([u32; 4]),
    This,
}

impl Proc {
    fn roots(self) -> Vec<u32> {
        match self {
            Proc::Tree(pid) => vec![pid],
            Proc::Trees(pids) => pids.into_iter().filter(|p| *p != 0).collect(),
            Proc::This => vec![std::process::id()],
        }
    }

    /// Every pid of the trees rooted at the roots (the roots themselves first).
    pub fn pids(self) -> Vec<u32> {
        let roots = self.roots();
        let mut parent: HashMap<u32, u32> = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                if let Some(ppid) = stat_fields(&format!("/proc/{pid}/stat"))
                    .and_then(|f| f.get(1).and_then(|v| v.parse().ok()))
                {
                    parent.insert(pid, ppid);
                }
            }
        }
        let mut out = roots;
        let mut i = 0;
        while i < out.len() {
            let p = out[i];
            out.extend(parent.iter().filter(|(_, pp)| **pp == p).map(|(c, _)| *c));
            i += 1;
        }
        out
    }

    /// The counters summed over the tree now. A reaped child's CPU and I/O are already in its
    /// parent's (cutime/cstime and the signal-wide I/O accounting).
    pub fn counters(self) -> Counters {
        let mut c = Counters::default();
        for pid in self.pids() {
            if let Some(f) = stat_fields(&format!("/proc/{pid}/stat")) {
                // After the command: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
                let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                c.cpu_ticks += n(11) + n(12) + n(13) + n(14);
            }
            if let Ok(io) = std::fs::read_to_string(format!("/proc/{pid}/io")) {
                for line in io.lines() {
                    let mut kv = line.split(':');
                    let (Some(k), Some(v)) = (kv.next(), kv.next()) else {
                        continue;
                    };
                    let v: u64 = v.trim().parse().unwrap_or(0);
                    match k {
                        "wchar" => c.wchar += v,
                        "write_bytes" => c.write_bytes += v,
                        _ => {}
                    }
                }
            }
        }
        c
    }
}

/// The fields of a `/proc/.../stat` file after the command name (which may hold spaces).
fn stat_fields(path: &str) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(path).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

#[derive(Clone, Copy, Default, Debug)]
pub struct Counters {
    pub cpu_ticks: u64,
    pub wchar: u64,
    pub write_bytes: u64,
}

impl Counters {
    pub fn since(self, before: Counters) -> Counters {
        Counters {
            cpu_ticks: self.cpu_ticks.saturating_sub(before.cpu_ticks),
            wchar: self.wchar.saturating_sub(before.wchar),
            write_bytes: self.write_bytes.saturating_sub(before.write_bytes),
        }
    }
}

/// Clock ticks per second of /proc's CPU times.
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The sync calls strace counts.
const SYNC_CALLS: &str = "fsync,fdatasync,sync_file_range,msync,syncfs";

/// `strace -c` attached to every thread of a process tree, counting sync calls until
/// [`SyscallCount::finish`]. Attaching slows the traced process, so it runs only during a
/// separate calibration pass, never during a timed cell.
pub struct SyscallCount {
    child: std::process::Child,
    out: tempfile::NamedTempFile,
}

impl SyscallCount {
    pub fn attach(proc: Proc) -> Result<SyscallCount, String> {
        let out = tempfile::NamedTempFile::new().map_err(|e| format!("strace output: {e}"))?;
        let mut cmd = Command::new("strace");
        cmd.args(["-f", "-c", "-e", &format!("trace={SYNC_CALLS}"), "-o"])
            .arg(out.path());
        for pid in proc.pids() {
            cmd.arg("-p").arg(pid.to_string());
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run strace: {e}"))?;
        // strace says nothing once attached; give it time to stop every thread once.
        std::thread::sleep(Duration::from_millis(500));
        Ok(SyscallCount { child, out })
    }

    /// Detach and return the number of sync calls made while attached.
    pub fn finish(mut self) -> Result<u64, String> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let status = self.child.wait().map_err(|e| e.to_string())?;
        let text = std::fs::read_to_string(self.out.path()).unwrap_or_default();
        if !status.success() && text.is_empty() {
            return Err(format!("strace failed: {status}"));
        }
        Ok(parse_strace_summary(&text))
    }
}

/// Sum of the `calls` column of an `strace -c` table.
pub fn parse_strace_summary(text: &str) -> u64 {
    let mut total = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors], syscall
        if f.len() >= 5
            && let Some(name) = f.last()
            && SYNC_CALLS.split(',').any(|s| s == *name)
            && let Ok(calls) = f[3].parse::<u64>()
        {
            total += calls;
        }
    }
    total
}

pub fn have_command(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| {
            let p = d.join(name);
            p.is_file()
                && std::fs::metadata(&p).is_ok_and(|m| {
                    use std::os::unix::fs::PermissionsExt;
                    m.permissions().mode() & 0o111 != 0
                })
        })
    })
}

pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Free bytes of the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(st.blocks_available() as u64 * st.fragment_size() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_summary_counts_only_sync_calls() {
        let t = "% time     seconds  usecs/call     calls    errors syscall\n\
                 ------ ----------- ----------- --------- --------- ----------------\n\
                 100.00    0.120000         600       200           fdatasync\n\
                   0.00    0.000000           0         3         1 fsync\n\
                 ------ ----------- ----------- --------- --------- ----------------\n\
                 100.00    0.120000         590       203         1 total\n";
        assert_eq!(parse_strace_summary(t), 203);
    }

    #[test]
    fn this_process_counters_see_its_own_writes() {
        assert!(Proc::This.pids().contains(&std::process::id()));
        let before = Proc::This.counters();
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), vec![7u8; 1 << 16]).unwrap();
        let used = Proc::This.counters().since(before);
        assert!(
            used.wchar >= 1 << 16,
            "64 KiB written, wchar grew by {}",
            used.wchar
        );
    }
}
