//! The projection follower: the read models follow the log instead of being folded inside
//! every commit (spec section 3). A thread drives it: while the models are behind the head it
//! has them fold the committed events in batches, each in a transaction of its own, with the
//! fold code a rebuild uses ([`tidemark_projections::framework::catch_up`]); commands catch
//! the models up to the head themselves before they decide. [`Progress`] says how far every
//! model has folded, so a reader waits for its own writes (section 7) without polling.
//!
//! The batch transactions are run by the log's writer (as commands that append nothing and
//! skip the fsync; the next checkpoint makes them durable, and a crash before it only means
//! folding again): redb has one writer at a time anyway, and a storage failure met while
//! folding is then the writer's to judge (a full disk refuses writes until space returns and
//! the file is reopened; anything else poisons the log), as for any other commit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tidemark_log::{CommandError, Log};
use tidemark_projections::framework::{catch_up, checkpoint};

/// Events one follower transaction folds at most: it holds redb's write lock meanwhile, so the
/// log writer waits at most one such batch.
pub const FOLLOW_BATCH: u64 = 4_096;

/// The lowest seq every read model has folded (committed), with a wake-up for readers.
#[derive(Default)]
pub struct Progress {
    seq: Mutex<u64>,
    cv: Condvar,
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

    /// Wait until the models reach `want` or `until` passes, checking at least every
    /// `recheck` (the caller then reads the models' checkpoints itself); the seq reached.
    pub fn wait(&self, want: u64, until: Instant, recheck: Duration) -> u64 {
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

/// The follower thread; stopped by [`Follower::stop`] or when the last engine handle drops.
pub struct Follower {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Follower {
    pub fn spawn(log: Log, progress: Arc<Progress>) -> std::io::Result<Follower> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tidemark-projection-follower".into())
            .spawn(move || run(log, progress, flag))?;
        Ok(Follower {
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stop after the batch in hand, and wait for the thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn run(log: Log, progress: Arc<Progress>, stop: Arc<AtomicBool>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "the projection follower cannot start");
            return;
        }
    };
    let mut heads = log.subscribe();
    let mut backoff = Duration::from_millis(10);
    while !stop.load(Ordering::SeqCst) {
        let head = log.head();
        if progress.get() >= head {
            rt.block_on(async {
                let _ = tokio::time::timeout(Duration::from_millis(100), heads.changed()).await;
            });
            continue;
        }
        match rt.block_on(fold_batch(&log, head)) {
            Ok(at) => {
                progress.advance(at);
                metrics::gauge!("tidemark_projection_follower_lag_events")
                    .set(log.head().saturating_sub(at) as f64);
                backoff = Duration::from_millis(10);
            }
            Err(e) => {
                tracing::warn!(error = %e, "projection follower: a batch failed; retrying");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// One batch: fold every model towards `head` (at most [`FOLLOW_BATCH`] events) in the
/// writer; the lowest checkpoint after. Nothing to fold (a command already caught the models
/// up) is seen in a read transaction, without queueing for the writer.
async fn fold_batch(log: &Log, head: u64) -> Result<u64, CommandError> {
    let at = checkpoint(&log.db(), &tidemark_projections::all()).map_err(CommandError::Storage)?;
    if at >= head {
        return Ok(at);
    }
    let started = Instant::now();
    let (at, _) = log
        .command(false, move |txn, head| {
            let at = catch_up(txn, &tidemark_projections::all(), head, FOLLOW_BATCH)
                .map_err(CommandError::Storage)?;
            Ok((at, Vec::new()))
        })
        .await?;
    metrics::histogram!("tidemark_projection_batch_seconds")
        .record(started.elapsed().as_secs_f64());
    Ok(at)
}
