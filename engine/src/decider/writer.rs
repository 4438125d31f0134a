//! The models store's writer: a thread of its own that writes the decider's frozen layers
//! into the file after the replies (spec section 3: the models store follows the reply),
//! each in a transaction that commits without a sync, and syncs the file every
//! [`PERSIST_EVERY`] while it changes and when it stops. Readers see a layer once it is
//! committed ([`Progress::advance`]); the decider drops it from its overlay when told.
//!
//! Every layer is answered, in order. After a failed or stale layer every later one of the
//! same epoch is skipped (each was folded on top of it); the decider drains what it handed
//! over, folds again from the file, and goes on in the next epoch.
//!
//! A panic on the writer poisons the decider (spec I10): the layers it held are lost as at a
//! crash (the log has them; the file is at its last commit), and commands are refused until
//! a restart, as after a panic of the decider itself.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tidemark_log::StorageError;
use tidemark_projections::Models;
use tidemark_projections::framework::{Applied, Layer};

use super::{PERSIST_EVERY, Progress, WRITER_PANIC_KNOB, knob};

enum Msg {
    Layer(Arc<Layer>, u64),
    Stop,
}

/// What became of a layer handed to the writer.
pub(super) enum Ack {
    Written,
    /// Folded on a state the file no longer has (a rebuild's): not written.
    Stale,
    Failed(StorageError),
    /// After a failed or stale layer of its epoch: not written.
    Skipped,
}

/// The decider's handle on the writer thread.
pub(super) struct Writer {
    tx: Sender<Msg>,
    acks: Receiver<Ack>,
    /// Layers handed over and not answered yet.
    pub(super) outstanding: usize,
    /// Held by the writer while it writes or syncs, and by the decider while it reopens the
    /// file: the two never meet on the file.
    pub(super) file: Arc<Mutex<()>>,
    /// Told when a layer failed or was stale: the decider, idle, wakes to fold again.
    pub(super) broke: Arc<tokio::sync::Notify>,
    /// A sync of the file that failed (no layer answers it): the decider reopens the file.
    pub(super) sync_failed: Arc<Mutex<Option<StorageError>>>,
    /// Why the writer panicked, once it has.
    panicked: Arc<Mutex<Option<StorageError>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    pub(super) fn spawn(models: Models, progress: Arc<Progress>) -> std::io::Result<Writer> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (ack_tx, acks) = std::sync::mpsc::channel();
        let file = Arc::new(Mutex::new(()));
        let broke = Arc::new(tokio::sync::Notify::new());
        let sync_failed = Arc::new(Mutex::new(None));
        let panicked = Arc::new(Mutex::new(None));
        let parts = Parts {
            file: file.clone(),
            broke: broke.clone(),
            sync_failed: sync_failed.clone(),
        };
        let why = panicked.clone();
        let thread = std::thread::Builder::new()
            .name("tidemark-models-writer".into())
            .spawn(move || {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run(&models, &progress, &parts, &rx, &ack_tx);
                }));
                if let Err(panic) = ran {
                    let e = tidemark_log::Poison::panicked("the models writer", panic.as_ref());
                    tracing::error!(error = %e, "the models writer panicked");
                    *why.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    // The decider, idle or not, meets it next.
                    parts.broke.notify_one();
                }
            })?;
        Ok(Writer {
            tx,
            acks,
            outstanding: 0,
            file,
            broke,
            sync_failed,
            panicked,
            thread: Some(thread),
        })
    }

    /// Why the writer panicked, if it has (the decider then panics too: it is poisoned).
    pub(super) fn panicked(&self) -> Option<StorageError> {
        self.panicked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Hand a frozen layer of `epoch` over.
    pub(super) fn send(&mut self, layer: Arc<Layer>, epoch: u64) {
        if self.tx.send(Msg::Layer(layer, epoch)).is_ok() {
            self.outstanding += 1;
        }
    }

    /// The next answer, if one is in (`wait`: waiting for it while any layer is out).
    pub(super) fn ack(&mut self, wait: bool) -> Option<Ack> {
        if self.outstanding == 0 {
            return None;
        }
        let a = if wait {
            // A writer that is gone answers nothing more: what it held is lost, as at a crash.
            self.acks.recv().unwrap_or(Ack::Skipped)
        } else {
            self.acks.try_recv().ok()?
        };
        self.outstanding -= 1;
        Some(a)
    }

    /// Stop after every layer handed over, the file synced; wait for the thread.
    pub(super) fn stop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the writer shares with the decider besides its channels.
struct Parts {
    file: Arc<Mutex<()>>,
    broke: Arc<tokio::sync::Notify>,
    sync_failed: Arc<Mutex<Option<StorageError>>>,
}

/// The writer panicked for the test knob already (a restart in the same process writes).
static WRITER_PANICKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn run(
    models: &Models,
    progress: &Progress,
    parts: &Parts,
    rx: &Receiver<Msg>,
    acks: &Sender<Ack>,
) {
    let (file, broke) = (&parts.file, &parts.broke);
    // Written since the last sync.
    let mut dirty: Option<Instant> = None;
    // The newest epoch with a failed or stale layer: its later layers are skipped.
    let mut broken: Option<u64> = None;
    // The file's last failure (redb answers only "previous I/O error" after one until it is
    // reopened: the decider is told the cause, a full disk say).
    let mut cause: Option<StorageError> = None;
    let sync = |dirty: &mut Option<Instant>, cause: &mut Option<StorageError>| {
        if dirty.is_some() {
            let _file = file.lock().unwrap_or_else(|p| p.into_inner());
            match models.persist() {
                Ok(()) => *dirty = None,
                // The next write meets the failure too; the decider is told then.
                Err(e) => {
                    tracing::warn!(error = %e, "the models store cannot be synced");
                    let e = match cause.take() {
                        Some(c) if e.is_previous_io() => c,
                        _ => e,
                    };
                    *cause = Some(e.clone());
                    *parts.sync_failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    broke.notify_one();
                }
            }
        }
    };
    loop {
        let msg = match dirty {
            Some(since) => match rx.recv_timeout(PERSIST_EVERY.saturating_sub(since.elapsed())) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    sync(&mut dirty, &mut cause);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => Msg::Stop,
            },
            None => rx.recv().unwrap_or(Msg::Stop),
        };
        let (layer, epoch) = match msg {
            Msg::Layer(l, e) => (l, e),
            Msg::Stop => {
                sync(&mut dirty, &mut cause);
                return;
            }
        };
        let ack = if broken.is_some_and(|b| epoch <= b) {
            Ack::Skipped
        } else {
            let started = Instant::now();
            if knob("TIDEMARK_FAULT_WRITER_PANIC", &WRITER_PANIC_KNOB).is_some()
                && !WRITER_PANICKED.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                // A test knob: the writer panics at its first layer, once per process.
                panic!("an injected panic (TIDEMARK_FAULT_WRITER_PANIC)");
            }
            let _file = file.lock().unwrap_or_else(|p| p.into_inner());
            match models.write(&layer) {
                Ok(Applied::Written) => {
                    cause = None;
                    dirty.get_or_insert_with(Instant::now);
                    progress.advance(layer.upto());
                    metrics::histogram!("tidemark_projection_batch_seconds")
                        .record(started.elapsed().as_secs_f64());
                    Ack::Written
                }
                Ok(Applied::Stale) => {
                    broken = Some(epoch);
                    Ack::Stale
                }
                Err(e) => {
                    broken = Some(epoch);
                    let e = match cause.take() {
                        Some(c) if e.is_previous_io() => c,
                        _ => e,
                    };
                    cause = Some(e.clone());
                    Ack::Failed(e)
                }
            }
        };
        drop(layer);
        let tell = matches!(ack, Ack::Stale | Ack::Failed(_));
        if acks.send(ack).is_err() {
            sync(&mut dirty, &mut cause);
            return;
        }
        if tell {
            broke.notify_one();
        }
        if dirty.is_some_and(|d| d.elapsed() >= PERSIST_EVERY) {
            sync(&mut dirty, &mut cause);
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop();
    }
}
