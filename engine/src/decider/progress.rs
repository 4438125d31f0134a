//! How far the read models have folded, and the readers waiting for them to reach a seq.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The lowest seq every read model has folded (committed), with a wake-up for readers.
#[derive(Default)]
pub struct Progress {
    seq: Mutex<u64>,
    cv: Condvar,
    /// Readers waiting in [`Progress::wait`].
    waiting: std::sync::atomic::AtomicUsize,
    /// Told when a reader starts to wait: the decider commits what it has folded for it.
    readers: std::sync::Arc<tokio::sync::Notify>,
}

impl Progress {
    pub fn get(&self) -> u64 {
        *self.seq.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record that every model has folded through `seq` (never goes back).
    pub fn advance(&self, seq: u64) {
        let mut g = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        if seq > *g {
            *g = seq;
            self.cv.notify_all();
        }
    }

    /// The models went back to `seq` (their store was reopened at its last synced commit).
    pub fn reset(&self, seq: u64) {
        *self.seq.lock().unwrap_or_else(|p| p.into_inner()) = seq;
    }

    /// Wait until the models reach `want` or `until` passes, checking at least every
    /// `recheck` (the caller then reads the models' checkpoints itself); the seq reached.
    /// Readers waiting for the models now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// What the decider waits on besides its work: a reader that waits for the models.
    pub fn readers(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.readers.clone()
    }

    pub fn wait(&self, want: u64, until: Instant, recheck: Duration) -> u64 {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.get() < want {
            self.readers.notify_one();
        }
        let _done = Waiting(&self.waiting);
        let mut g = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        let start = Instant::now();
        while *g < want {
            let now = Instant::now();
            if now >= until || now.duration_since(start) >= recheck {
                break;
            }
            let left = (until - now).min(recheck);
            g = self
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *g
    }
}

/// Counts a reader out of [`Progress::wait`] however it leaves.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
