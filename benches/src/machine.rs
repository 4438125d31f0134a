//! The machine a run measured: cores, memory, kernel, the filesystem of the data directories,
//! `uptime` before the run, and what one `write + fdatasync` costs there, since every durable
//! append pays at least that and the disk's speed varies from run to run.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::Serialize;

use crate::measure::{Percentiles, micros, new_histogram};

#[derive(Serialize, Clone)]
pub struct Machine {
    pub cpus: usize,
    pub mem_total_kb: u64,
    pub kernel: String,
    pub uptime: String,
    pub work_dir: String,
    pub work_fs_type: String,
    pub work_fs_device: String,
    /// `git describe --always --dirty` of the workspace: which code was measured.
    pub source: String,
}

pub fn machine(work: &Path) -> Machine {
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
        uptime: uptime(),
        work_dir: work.display().to_string(),
        work_fs_type: fs,
        work_fs_device: dev,
        source: run_text(
            Command::new("git")
                .args(["describe", "--always", "--dirty"])
                .current_dir(env!("CARGO_MANIFEST_DIR")),
        ),
    }
}

/// What `uptime` prints (load averages), or /proc/loadavg.
pub fn uptime() -> String {
    let s = run_text(&mut Command::new("uptime"));
    if s.is_empty() {
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
            .to_owned()
    } else {
        s
    }
}

fn run_text(cmd: &mut Command) -> String {
    cmd.output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// (device, fs type) of the mount holding `dir`: the longest mount point that is a prefix.
fn filesystem_of(dir: &Path) -> (String, String) {
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

/// The directory the data directories go in: `--work-dir`, or `<target dir>/bench-data`.
pub fn work_dir(chosen: Option<&PathBuf>) -> Result<PathBuf, String> {
    let dir = match chosen {
        Some(d) => d.clone(),
        None => target_dir()?.join("bench-data"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    dir.canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))
}

/// The cargo target directory: `CARGO_TARGET_DIR`, or the one this executable was built into.
pub fn target_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        let d = PathBuf::from(d);
        // Relative to the workspace, as cargo reads it.
        return Ok(match Path::new(env!("CARGO_MANIFEST_DIR")).parent() {
            Some(ws) if d.is_relative() => ws.join(d),
            _ => d,
        });
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    exe.ancestors()
        .find(|p| p.join("CACHEDIR.TAG").exists())
        .map(Path::to_path_buf)
        .or_else(|| exe.parent().map(Path::to_path_buf))
        .ok_or_else(|| "cannot find the target directory; pass --work-dir".to_owned())
}

#[derive(Serialize, Clone)]
pub struct FsyncResult {
    /// `append`: each write extends the file (metadata changes too, like a growing log);
    /// `overwrite`: writes go to a preallocated, already durable region.
    pub mode: &'static str,
    pub block_bytes: usize,
    pub latency_us: Percentiles,
}

/// `count` × (4 KiB write + `fdatasync`) in `dir`, appending or overwriting.
pub fn fsync_bench(dir: &Path, count: usize, overwrite: bool) -> Result<FsyncResult, String> {
    const BLOCK: usize = 4096;
    let io = |e: std::io::Error| format!("fsync bench: {e}");
    let path = dir.join(if overwrite {
        "fsync-overwrite.dat"
    } else {
        "fsync-append.dat"
    });
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io)?;
    if overwrite {
        file.write_all_at(&vec![0u8; BLOCK * count], 0)
            .map_err(io)?;
        file.sync_all().map_err(io)?;
    }
    let block = [0xA5u8; BLOCK];
    let mut h = new_histogram();
    for i in 0..count {
        let t0 = Instant::now();
        file.write_all_at(&block, (i * BLOCK) as u64).map_err(io)?;
        file.sync_data().map_err(io)?;
        h.saturating_record(micros(t0.elapsed()));
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok(FsyncResult {
        mode: if overwrite { "overwrite" } else { "append" },
        block_bytes: BLOCK,
        latency_us: Percentiles::from(&h),
    })
}
