//! The ways a journal record can be made durable on this machine, measured side by side (issue
//! 39 item 2): what one small record (the size of a single event's journal record) costs in
//! latency, context switches and device bytes with each of them. The journal itself uses
//! `buffered` (a write into a preallocated file, then `fdatasync`); the others are the
//! alternatives the profile suggested:
//! - `buffered`: `pwrite` of the record into the page cache + `fdatasync` (two syscalls).
//! - `dsync`: the same file opened `O_DSYNC`, so the `pwrite` returns once it is durable (one
//!   syscall).
//! - `direct`: `O_DIRECT`, the 4 KiB blocks holding the record rewritten from an aligned
//!   buffer, then `fdatasync` for the device's cache.
//! - `direct-dsync`: `O_DIRECT | O_DSYNC`: one aligned `pwrite` that returns once durable.
//! - `uring`: a write and an `fdatasync` linked in one io_uring submission, waited for with one
//!   `io_uring_enter`.
//!
//! Every mode overwrites a file preallocated and synced beforehand, as the journal does.
#![expect(
    unsafe_code,
    reason = "an aligned buffer for O_DIRECT, getrusage, and io_uring's submission: no safe API"
)]

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::measure::{BlockDevice, Percentiles, micros, new_histogram};

/// One event's journal record at 1 × 1 in the HTTP bench is about 363 bytes.
pub const RECORD_BYTES: usize = 400;
const BLOCK: usize = 4096;

pub const MODES: [&str; 5] = ["buffered", "dsync", "direct", "direct-dsync", "uring"];

#[derive(Serialize, Clone)]
pub struct JournalWriteResult {
    pub mode: &'static str,
    pub record_bytes: usize,
    pub latency_us: Percentiles,
    /// Voluntary + involuntary context switches of this process (its io_uring workers
    /// included: `getrusage(RUSAGE_SELF)` counts exited threads too) per record.
    pub ctx_switches_per_record: f64,
    /// CPU time (user + system) of this process per record, µs.
    pub cpu_us_per_record: f64,
    /// Bytes the block device wrote per record (anything else writing meanwhile counts too).
    pub device_bytes_per_record: Option<f64>,
}

/// A 4 KiB-aligned buffer for `O_DIRECT`.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn zeroed(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, BLOCK).expect("layout");
        // SAFETY: a non-zero size and a valid alignment.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, len }
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `len` initialised bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, BLOCK).expect("layout");
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

fn rusage() -> (u64, u64) {
    // SAFETY: getrusage writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (
        (ru.ru_nvcsw + ru.ru_nivcsw) as u64,
        us(ru.ru_utime) + us(ru.ru_stime),
    )
}

/// `count` records written and made durable in `mode`, in a fresh file in `dir`.
pub fn bench(dir: &Path, count: usize, mode: &'static str) -> Result<JournalWriteResult, String> {
    if !MODES.contains(&mode) {
        return Err(format!("unknown journal-write mode {mode}"));
    }
    let io = |e: std::io::Error| format!("journal-write bench ({mode}): {e}");
    let path = dir.join(format!("journal-{mode}.dat"));
    let size = (count * RECORD_BYTES).div_ceil(BLOCK) * BLOCK + BLOCK;
    {
        let f = std::fs::File::create(&path).map_err(io)?;
        let zeros = vec![0u8; BLOCK];
        for off in (0..size).step_by(BLOCK) {
            f.write_all_at(&zeros, off as u64).map_err(io)?;
        }
        f.sync_all().map_err(io)?;
    }
    let mut flags = 0;
    if mode == "dsync" || mode == "direct-dsync" {
        flags |= libc::O_DSYNC;
    }
    if mode == "direct" || mode == "direct-dsync" {
        flags |= libc::O_DIRECT;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(&path)
        .map_err(io)?;
    let record = [0xA5u8; RECORD_BYTES];
    // The aligned image of the file's blocks from the one holding the record's start.
    let mut image = Aligned::zeroed(2 * BLOCK);
    let mut ring = if mode == "uring" {
        Some(io_uring::IoUring::new(8).map_err(io)?)
    } else {
        None
    };
    let device = BlockDevice::of(dir).ok();
    let dev0 = device.as_ref().and_then(BlockDevice::written_bytes);
    let (ctx0, cpu0) = rusage();
    let mut h = new_histogram();
    let mut image_block = 0usize;
    for i in 0..count {
        let off = i * RECORD_BYTES;
        let t0 = Instant::now();
        match mode {
            "buffered" => {
                file.write_all_at(&record, off as u64).map_err(io)?;
                file.sync_data().map_err(io)?;
            }
            "dsync" => file.write_all_at(&record, off as u64).map_err(io)?,
            "direct" | "direct-dsync" => {
                let block = off / BLOCK;
                if block != image_block {
                    // The record starts in a later block: it begins the image (the block it
                    // started before is complete on disk).
                    let buf = image.bytes();
                    buf.copy_within(BLOCK.., 0);
                    buf[BLOCK..].fill(0);
                    image_block = block;
                }
                let at = off - image_block * BLOCK;
                let end = at + RECORD_BYTES;
                image.bytes()[at..end].copy_from_slice(&record);
                let len = end.div_ceil(BLOCK) * BLOCK;
                file.write_all_at(&image.bytes()[..len], (image_block * BLOCK) as u64)
                    .map_err(io)?;
                if mode == "direct" {
                    file.sync_data().map_err(io)?;
                }
            }
            "uring" => {
                use io_uring::{opcode, squeue, types};
                let ring = ring.as_mut().expect("a ring");
                let fd = types::Fd(file.as_raw_fd());
                let write = opcode::Write::new(fd, record.as_ptr(), RECORD_BYTES as u32)
                    .offset(off as u64)
                    .build()
                    .flags(squeue::Flags::IO_LINK)
                    .user_data(1);
                let sync = opcode::Fsync::new(fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(2);
                // SAFETY: `record` and the file outlive the submission, which is waited for
                // before the next iteration.
                unsafe {
                    let mut sq = ring.submission();
                    sq.push(&write).map_err(|e| format!("io_uring: {e}"))?;
                    sq.push(&sync).map_err(|e| format!("io_uring: {e}"))?;
                }
                ring.submit_and_wait(2).map_err(io)?;
                for cqe in ring.completion() {
                    if cqe.result() < 0 {
                        return Err(io(std::io::Error::from_raw_os_error(-cqe.result())));
                    }
                }
            }
            _ => unreachable!("checked above"),
        }
        h.saturating_record(micros(t0.elapsed()));
    }
    let (ctx1, cpu1) = rusage();
    let dev1 = device.as_ref().and_then(BlockDevice::written_bytes);
    drop(file);
    let _ = std::fs::remove_file(&path);
    let n = count as f64;
    Ok(JournalWriteResult {
        mode,
        record_bytes: RECORD_BYTES,
        latency_us: Percentiles::from(&h),
        ctx_switches_per_record: (ctx1 - ctx0) as f64 / n,
        cpu_us_per_record: (cpu1 - cpu0) as f64 / n,
        device_bytes_per_record: dev0.zip(dev1).map(|(a, b)| (b - a) as f64 / n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_writes_its_records_or_says_why_not() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        for mode in MODES {
            match bench(dir.path(), 50, mode) {
                Ok(r) => {
                    assert_eq!(r.latency_us.count, 50, "{mode}");
                    assert!(r.cpu_us_per_record >= 0.0);
                }
                // Where the filesystem or a sandbox refuses the mode (O_DIRECT on tmpfs,
                // io_uring under a seccomp profile), the error names it.
                Err(e) => assert!(e.contains(mode), "{mode}: {e}"),
            }
        }
        assert!(
            bench(dir.path(), 1, "mmap").is_err(),
            "an unknown mode is refused"
        );
    }
}
