//! What a run measures besides time: hdrhistogram percentiles, the longest pause between
//! completions, a server's CPU, bytes written, context switches and fsync calls, read from
//! `/proc` (and `strace`) over its whole process tree, and the bytes the block device under the
//! data directory wrote, read from `/sys`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    /// This process alone: not its children, which are the servers it started (and, while it
    /// traces, strace).
    This,
}

impl Proc {
    /// The processes whose trees are counted.
    pub fn roots(self) -> Vec<u32> {
        match self {
            Proc::Tree(pid) => vec![pid],
            Proc::Trees(pids) => pids.into_iter().filter(|p| *p != 0).collect(),
            Proc::This => vec![std::process::id()],
        }
    }

    /// Every pid of the trees rooted at the roots (the roots themselves first); this process
    /// alone for [`Proc::This`].
    pub fn pids(self) -> Vec<u32> {
        let roots = self.roots();
        if matches!(self, Proc::This) {
            return roots;
        }
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
    /// parent's (cutime/cstime and the signal-wide I/O accounting); its context switches are not
    /// (see [`Counters::ctx_switches`]).
    pub fn counters(self) -> Counters {
        let mut c = Counters::default();
        for pid in self.pids() {
            c.ctx_switches += ctx_switches_of(pid);
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

/// Context switches of every thread of `pid` alive now: the sum over `/proc/<pid>/task/*/status`
/// (each task's own counts; the process-level `status` holds only the main thread's).
fn ctx_switches_of(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|text| parse_ctx_switches(&text))
        .sum()
}

/// `voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches` of a `/proc/.../status` text, or
/// None when it holds neither.
pub fn parse_ctx_switches(status: &str) -> Option<u64> {
    let mut found = false;
    let mut total = 0u64;
    for line in status.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        if k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches" {
            total += v.trim().parse::<u64>().ok()?;
            found = true;
        }
    }
    found.then_some(total)
}

/// The fields of a `/proc/.../stat` file after the command name (which may hold spaces).
fn stat_fields(path: &str) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(path).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// A process tree's counters at one instant ([`Proc::counters`]), or their growth over a phase
/// ([`Counters::since`]).
#[derive(Clone, Copy, Default, Debug)]
pub struct Counters {
    /// CPU time, user + system, children reaped included, in clock ticks ([`clock_ticks`]).
    pub cpu_ticks: u64,
    /// Bytes passed to write calls (`wchar` of `/proc/<pid>/io`).
    pub wchar: u64,
    /// Bytes of page cache dirtied (`write_bytes` of `/proc/<pid>/io`): accounted when a page
    /// is dirtied, not when the device writes it, so a partial rewrite of a page counts it whole
    /// and a page rewritten before writeback counts twice.
    pub write_bytes: u64,
    /// Context switches, voluntary + involuntary, summed over the threads alive at the reading.
    /// A thread (or process) that exits takes its counts with it, so over a phase in which
    /// threads exit this under-counts; the servers here keep their threads, so it rarely does.
    pub ctx_switches: u64,
}

impl Counters {
    /// What grew from `before` to `self` (0 for a counter that shrank, as context switches
    /// can when threads exit).
    pub fn since(self, before: Counters) -> Counters {
        Counters {
            cpu_ticks: self.cpu_ticks.saturating_sub(before.cpu_ticks),
            wchar: self.wchar.saturating_sub(before.wchar),
            write_bytes: self.write_bytes.saturating_sub(before.write_bytes),
            ctx_switches: self.ctx_switches.saturating_sub(before.ctx_switches),
        }
    }
}

/// The block device under a data directory, whose sysfs `stat` counts the sectors it has
/// written: what reached the disk, journal and metadata included, whoever wrote it.
#[derive(Clone, Debug)]
pub struct BlockDevice {
    /// The kernel's name and major:minor, e.g. `vda (254:0)`.
    pub name: String,
    /// `/sys/dev/block/<major>:<minor>/stat` (a partition's own, when it is a partition).
    stat: PathBuf,
}

impl BlockDevice {
    /// The device of the filesystem holding `dir` (the major:minor of its `st_dev`), or why
    /// there is none to read: an overlay, tmpfs or btrfs filesystem has an anonymous device
    /// (major 0) without sector counters.
    pub fn of(dir: &Path) -> Result<BlockDevice, String> {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .dev();
        let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
        if major == 0 {
            return Err(format!(
                "{} is on an anonymous device {major}:{minor} (overlay, tmpfs, btrfs, …), \
                 not a block device",
                dir.display()
            ));
        }
        let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
        let stat = sys.join("stat");
        let text =
            std::fs::read_to_string(&stat).map_err(|e| format!("{}: {e}", stat.display()))?;
        if parse_block_stat(&text).is_none() {
            return Err(format!("{}: no write sectors field", stat.display()));
        }
        let kernel_name = std::fs::canonicalize(&sys)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "?".into());
        Ok(BlockDevice {
            name: format!("{kernel_name} ({major}:{minor})"),
            stat,
        })
    }

    /// Bytes the device has written since boot: its sectors written × 512 (sysfs counts
    /// 512-byte sectors whatever the device's own block size).
    pub fn written_bytes(&self) -> Option<u64> {
        let text = std::fs::read_to_string(&self.stat).ok()?;
        parse_block_stat(&text).map(|sectors| sectors.saturating_mul(512))
    }
}

/// Sectors written: field 7 of a sysfs block device `stat` file (reads completed, reads
/// merged, sectors read, ms reading, writes completed, writes merged, sectors written, …).
pub fn parse_block_stat(text: &str) -> Option<u64> {
    text.split_whitespace().nth(6)?.parse().ok()
}

/// The longest pause of a run: the longest time during which at least one request was in
/// flight and none completed, over all its clients. A gap ends at a completed request and
/// starts at the completion before it or, if no request was in flight then, at the send that
/// ended the idle time (a lone client preparing its next batch is not a pause of the server).
/// Every send and completion takes its instant under one lock, so their order is the order of
/// the instants and the answer is exact for what the clients saw.
#[derive(Default)]
pub struct Pauses(Mutex<PauseState>);

impl Pauses {
    /// A request is about to be sent.
    pub fn sent(&self) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.sent(Instant::now());
    }

    /// A request has ended: `ok` when it completed (a failed request ends without completing).
    pub fn done(&self, ok: bool) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.done(Instant::now(), ok);
    }

    /// The longest pause so far (zero before two instants were seen).
    pub fn longest(&self) -> Duration {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).longest
    }
}

/// What [`Pauses`] keeps: requests in flight, since when some have been, the last completion
/// and the longest pause.
#[derive(Default, Debug)]
pub struct PauseState {
    in_flight: u64,
    busy_since: Option<Instant>,
    last_done: Option<Instant>,
    longest: Duration,
}

impl PauseState {
    /// A request sent at `now`.
    pub fn sent(&mut self, now: Instant) {
        if self.in_flight == 0 {
            self.busy_since = Some(now);
        }
        self.in_flight += 1;
    }

    /// A request ended at `now`, completed if `ok`.
    pub fn done(&mut self, now: Instant, ok: bool) {
        if ok {
            // In flight without a break since `busy_since`; the last completion, if later, is
            // where this gap starts.
            let start = match (self.busy_since, self.last_done) {
                (Some(b), Some(d)) => Some(b.max(d)),
                (b, d) => b.or(d),
            };
            if let Some(start) = start {
                self.longest = self.longest.max(now.saturating_duration_since(start));
            }
            self.last_done = Some(now);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The longest pause seen.
    pub fn longest(&self) -> Duration {
        self.longest
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
    fn ctx_switches_sum_both_kinds() {
        let status = "Name:\ttokio-runtime-w\nState:\tS (sleeping)\nTgid:\t4242\n\
                      Cpus_allowed_list:\t0-1\n\
                      voluntary_ctxt_switches:\t1200\n\
                      nonvoluntary_ctxt_switches:\t34\n";
        assert_eq!(parse_ctx_switches(status), Some(1234));
        assert_eq!(parse_ctx_switches("Name:\tx\nState:\tR (running)\n"), None);
        assert_eq!(
            parse_ctx_switches("voluntary_ctxt_switches:\tmany\n"),
            None,
            "an unreadable count is no count"
        );
    }

    #[test]
    fn block_stat_gives_sectors_written() {
        // A disk's /sys/block/vda/stat (17 fields on recent kernels) and a partition's older
        // 11-field one: field 7 is sectors written either way.
        let disk = "   20714        0  1196242    11408  3315787  3021366 92773136  2616361        0  \
                    2169168  2697853   0   0   0   0   93310   70083\n";
        assert_eq!(parse_block_stat(disk), Some(92_773_136));
        let part = "  4356   120  301858  2816  51200  18000  5242880  99000  0  41000  101816\n";
        assert_eq!(parse_block_stat(part), Some(5_242_880));
        assert_eq!(parse_block_stat("1 2 3\n"), None);
        assert_eq!(parse_block_stat(""), None);
    }

    #[test]
    fn a_directory_on_no_block_device_says_so() {
        // procfs has an anonymous device (major 0), as overlay and tmpfs do.
        let e = BlockDevice::of(Path::new("/proc")).unwrap_err();
        assert!(e.contains("anonymous device 0:"), "{e}");
        // A directory on a disk reads its counter; one in a container's overlay says why not.
        let dir = tempfile::tempdir().unwrap();
        match BlockDevice::of(dir.path()) {
            Ok(dev) => assert!(dev.written_bytes().is_some(), "{dev:?}"),
            Err(e) => assert!(!e.is_empty()),
        }
    }

    #[test]
    fn the_longest_pause_counts_only_time_with_a_request_in_flight() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = PauseState::default();
        // Two clients: a sends at 0, b at 1; a completes at 5, b at 6.
        p.sent(at(0));
        p.sent(at(1));
        p.done(at(5), true);
        assert_eq!(
            p.longest(),
            Duration::from_millis(5),
            "first send to first completion"
        );
        p.done(at(6), true);
        assert_eq!(p.longest(), Duration::from_millis(5));
        // Nothing in flight from 6 to 20 (both clients preparing): not a pause.
        p.sent(at(20));
        p.sent(at(21));
        p.done(at(23), true);
        assert_eq!(p.longest(), Duration::from_millis(5));
        // The request sent at 21 stays in flight: 9 ms from the completion at 23 to the next,
        // though the request that completes then was sent at 30.
        p.sent(at(30));
        p.done(at(32), true);
        assert_eq!(p.longest(), Duration::from_millis(9));
        // A failed request ends its flight but is no completion; then nothing is in flight.
        p.done(at(33), false);
        p.sent(at(40));
        p.done(at(41), true);
        assert_eq!(p.longest(), Duration::from_millis(9));
    }

    #[test]
    fn pauses_are_shared_by_clients() {
        let p = Pauses::default();
        p.sent();
        std::thread::sleep(Duration::from_millis(3));
        p.done(true);
        assert!(p.longest() >= Duration::from_millis(3));
    }

    #[test]
    fn this_process_has_context_switches() {
        std::thread::sleep(Duration::from_millis(1));
        assert!(Proc::This.counters().ctx_switches > 0);
    }

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
