//! A fault-injecting [`Store`] for tests: the written image and the durable image (what the
//! last `sync_data` covered) kept apart, so a test can cut the power and reopen from what a
//! disk would hold — the durable image plus any subset of the writes made since the last sync
//! — and fail the N-th operation with `EIO` or answer `ENOSPC`. A test tool, not a mock: the
//! log runs unchanged on top of it.

use std::io;
use std::sync::{Arc, Condvar, Mutex};

use super::storage::Store;

/// An operation of the store, for targeting faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    SetLen,
    Sync,
}

#[derive(Debug, Clone)]
enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

/// The power of a machine: the operations of every store on it counted together, and the
/// moment it goes out.
#[derive(Debug, Default)]
struct Power {
    ops: u64,
    cut_at: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    written: Vec<u8>,
    durable: Vec<u8>,
    /// Writes and resizes since the last sync, in order.
    pending: Vec<Pending>,
    syncs: u64,
    writes: u64,
    bytes_written: u64,
    /// The n-th operation of a kind (counted from when it was set) fails once.
    fail: Option<(Op, u64, io::ErrorKind)>,
    /// Growing writes and resizes fail with `StorageFull`.
    full: bool,
    /// What `available` answers.
    available: Option<u64>,
    /// Every write, resize and sync fails with this until cleared ([`FaultStore::fail_writes`]).
    failing: Option<io::ErrorKind>,
    /// Every read fails with this until cleared ([`FaultStore::fail_reads`]).
    failing_reads: Option<io::ErrorKind>,
    /// The next operation of this kind panics (a bug in the code below the writer, stood in
    /// for: [`FaultStore::panic_on`]).
    panic: Option<Op>,
    /// Syncs wait while this is set ([`FaultStore::hold_syncs`]).
    held: bool,
    /// Syncs waiting on `held`.
    waiting: usize,
}

/// A store in memory with a durable image. Clones share it; [`FaultStore::sibling`] makes
/// another file on the same machine (one power supply, one operation count).
#[derive(Debug, Clone, Default)]
pub struct FaultStore(Arc<Mutex<State>>, Arc<Mutex<Power>>, Arc<Condvar>);

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected fault: {what}"))
}

impl FaultStore {
    pub fn new() -> FaultStore {
        FaultStore::default()
    }

    /// A store whose disk holds `image` (written and durable).
    pub fn from_image(image: Vec<u8>) -> FaultStore {
        FaultStore(
            Arc::new(Mutex::new(State {
                written: image.clone(),
                durable: image,
                ..State::default()
            })),
            Arc::default(),
            Arc::default(),
        )
    }

    /// Another, empty file on the same machine: it shares this store's power (a cut stops
    /// both) and operation count.
    pub fn sibling(&self) -> FaultStore {
        FaultStore(Arc::default(), self.1.clone(), Arc::default())
    }

    /// [`FaultStore::crash`] of a file whose machine is `machine`'s (after the crash both run
    /// on one power supply again).
    pub fn crash_on(&self, machine: &FaultStore, keep: impl FnMut(usize) -> bool) -> FaultStore {
        let c = self.crash(keep);
        FaultStore(c.0, machine.1.clone(), c.2)
    }

    fn power(&self) -> std::sync::MutexGuard<'_, Power> {
        self.1.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cut the power after `n` more operations: they succeed, every later one fails with EIO.
    pub fn cut_after(&self, n: u64) {
        let mut p = self.power();
        p.cut_at = Some(p.ops + n);
    }

    /// The `n`-th (1-based) operation of kind `op` from now fails once with `kind`.
    pub fn fail_nth(&self, op: Op, n: u64, kind: io::ErrorKind) {
        self.st().fail = Some((op, n.max(1), kind));
    }

    /// A full disk: writes past the end and growing resizes fail with `StorageFull`.
    pub fn set_full(&self, full: bool) {
        self.st().full = full;
    }

    /// Every write, resize and sync fails with `kind` from now on, until called with `None`: a
    /// disk that stays broken (or full) for a while.
    pub fn fail_writes(&self, kind: Option<io::ErrorKind>) {
        self.st().failing = kind;
    }

    /// Every read fails with `kind` from now on, until called with `None`: a disk that
    /// returns errors where the data is.
    pub fn fail_reads(&self, kind: Option<io::ErrorKind>) {
        self.st().failing_reads = kind;
    }

    /// The next operation of kind `op` panics, once: what a writer does when code under it
    /// panics is then testable (it must poison the log, not vanish).
    pub fn panic_on(&self, op: Op) {
        self.st().panic = Some(op);
    }

    /// Hold every sync (it waits, not fails) until called again with `false`: a test keeps
    /// a writer busy inside a commit for as long as it needs.
    pub fn hold_syncs(&self, held: bool) {
        self.st().held = held;
        self.2.notify_all();
    }

    /// Syncs waiting on [`FaultStore::hold_syncs`] now.
    pub fn syncs_waiting(&self) -> usize {
        self.st().waiting
    }

    /// Say this much space is free (what the log checks before each commit).
    pub fn set_available(&self, bytes: Option<u64>) {
        self.st().available = bytes;
    }

    /// What a disk would hold after a power loss now: the durable image plus the writes since
    /// the last sync for which `keep(i)` says so (`i` counts them in order). A new store.
    pub fn crash(&self, mut keep: impl FnMut(usize) -> bool) -> FaultStore {
        self.crash_torn(|i, len| if keep(i) { len } else { 0 })
    }

    /// [`FaultStore::crash`] where a write may also be torn: `keep(i, len)` says how many of
    /// the first bytes of unsynced write `i` (of `len` bytes) reached the disk.
    pub fn crash_torn(&self, mut keep: impl FnMut(usize, usize) -> usize) -> FaultStore {
        let s = self.st();
        let mut image = s.durable.clone();
        for (i, p) in s.pending.iter().enumerate() {
            match p {
                Pending::Write(off, data) => {
                    let n = keep(i, data.len()).min(data.len());
                    if n == 0 {
                        continue;
                    }
                    let end = *off as usize + n;
                    if image.len() < end {
                        image.resize(end, 0);
                    }
                    image[*off as usize..end].copy_from_slice(&data[..n]);
                }
                Pending::SetLen(len) => {
                    if keep(i, 1) > 0 {
                        image.resize(*len as usize, 0);
                    }
                }
            }
        }
        FaultStore::from_image(image)
    }

    /// A power loss that tears writes at the device's granularity: every 512-byte sector
    /// (aligned on the file) of each unsynced write is kept or lost on its own,
    /// `keep(write, sector)`, in any order — a disk may persist the later sectors of a write
    /// and not the earlier ones. Resizes are kept.
    pub fn crash_sectors(&self, mut keep: impl FnMut(usize, u64) -> bool) -> FaultStore {
        const SECTOR: u64 = 512;
        let s = self.st();
        let mut image = s.durable.clone();
        for (i, p) in s.pending.iter().enumerate() {
            match p {
                Pending::Write(off, data) => {
                    let (start, end) = (*off, *off + data.len() as u64);
                    let mut sector = start / SECTOR;
                    while sector * SECTOR < end {
                        let from = (sector * SECTOR).max(start);
                        let to = ((sector + 1) * SECTOR).min(end);
                        if keep(i, sector) {
                            if image.len() < to as usize {
                                image.resize(to as usize, 0);
                            }
                            image[from as usize..to as usize].copy_from_slice(
                                &data[(from - start) as usize..(to - start) as usize],
                            );
                        }
                        sector += 1;
                    }
                }
                Pending::SetLen(len) => image.resize(*len as usize, 0),
            }
        }
        FaultStore::from_image(image)
    }

    /// Operations so far on this machine (reads, writes, resizes, syncs).
    pub fn ops(&self) -> u64 {
        self.power().ops
    }

    pub fn syncs(&self) -> u64 {
        self.st().syncs
    }

    pub fn writes(&self) -> u64 {
        self.st().writes
    }

    pub fn bytes_written(&self) -> u64 {
        self.st().bytes_written
    }

    /// Writes since the last sync (what a crash may or may not keep).
    pub fn unsynced(&self) -> usize {
        self.st().pending.len()
    }

    /// Count one operation; the fault it meets, if any.
    fn enter(&self, op: Op) -> io::Result<std::sync::MutexGuard<'_, State>> {
        {
            let mut p = self.power();
            p.ops += 1;
            if p.cut_at.is_some_and(|c| p.ops > c) {
                return Err(eio("power cut"));
            }
        }
        let mut s = self.st();
        if let Some(kind) = s.failing
            && op != Op::Read
        {
            return Err(io::Error::new(kind, format!("injected fault on {op:?}")));
        }
        if s.panic == Some(op) {
            s.panic = None;
            drop(s);
            panic!("injected panic on {op:?}");
        }
        if let Some((o, n, kind)) = s.fail
            && o == op
        {
            if n <= 1 {
                s.fail = None;
                return Err(io::Error::new(kind, format!("injected fault on {op:?}")));
            }
            s.fail = Some((o, n - 1, kind));
        }
        Ok(s)
    }
}

impl Store for FaultStore {
    fn available(&self) -> Option<u64> {
        self.st().available
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.st().written.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let s = self.enter(Op::Read)?;
        if let Some(kind) = s.failing_reads {
            return Err(io::Error::new(kind, "injected fault: a failing read"));
        }
        let end = offset as usize + out.len();
        if end > s.written.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end",
            ));
        }
        out.copy_from_slice(&s.written[offset as usize..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.enter(Op::SetLen)?;
        if s.full && len > s.written.len() as u64 {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "no space left on device",
            ));
        }
        s.written.resize(len as usize, 0);
        s.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        {
            let mut s = self.st();
            s.waiting += 1;
            while s.held {
                s = self.2.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            s.waiting -= 1;
        }
        let mut s = self.enter(Op::Sync)?;
        s.durable = s.written.clone();
        s.pending.clear();
        s.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut s = self.enter(Op::Write)?;
        let end = offset as usize + data.len();
        if s.full && end > s.written.len() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "no space left on device",
            ));
        }
        if s.written.len() < end {
            s.written.resize(end, 0);
        }
        s.written[offset as usize..end].copy_from_slice(data);
        s.pending.push(Pending::Write(offset, data.to_vec()));
        s.writes += 1;
        s.bytes_written += data.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_can_tear_a_write() {
        let s = FaultStore::new();
        s.write(0, b"abcd").unwrap();
        assert_eq!(s.crash_torn(|_, _| 2).st().written, b"ab");
    }

    #[test]
    fn a_crash_keeps_what_was_synced_and_what_it_is_told_to() {
        let s = FaultStore::new();
        s.write(0, b"aaaa").unwrap();
        s.sync_data().unwrap();
        s.write(0, b"bb").unwrap();
        s.write(4, b"cc").unwrap();
        assert_eq!(s.crash(|_| false).st().written, b"aaaa");
        assert_eq!(s.crash(|i| i == 1).st().written, b"aaaacc");
        assert_eq!(s.crash(|_| true).st().written, b"bbaacc");
        assert_eq!(s.syncs(), 1);
    }

    #[test]
    fn faults_fire_where_they_are_aimed() {
        let s = FaultStore::new();
        s.fail_nth(Op::Sync, 2, io::ErrorKind::Other);
        s.sync_data().unwrap();
        assert!(s.sync_data().is_err());
        s.sync_data().unwrap();
        s.set_full(true);
        assert_eq!(
            s.write(0, b"x").unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        s.set_full(false);
        s.write(0, b"x").unwrap();
        s.cut_after(1);
        s.write(1, b"y").unwrap();
        assert!(s.write(2, b"z").is_err());
        assert!(s.sync_data().is_err());
    }
}
