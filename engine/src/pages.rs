//! What the models' follower read, handed on: the decider reads each commit once (as it
//! lands, before it folds), and the reactors' follower takes the same events from here instead
//! of reading the log again (spec section 3: the follower, the reactors and the live streams
//! read each commit once between them).
//!
//! Only the newest chunks are kept ([`KEEP`], [`KEEP_BYTES`]); a reader further behind, or
//! ahead of the decider, reads the log itself.
//!
//! While the decider keeps up ([`Pages::keeping_up`]), a reader at the head waits for the next
//! chunk alone, not for the log's head as well: a commit then wakes the decider and, through
//! its chunk, the reader, not both at every commit (spec section 3: one wake-up per commit, at
//! most, for whoever has work). When the decider stops folding (its models failing, stopped,
//! panicked) the flag falls and the readers wait for the log's head themselves.
//!
//! A chunk no reader has any use for ([`Pages::set_interest`]: a claim whose lease expires
//! after the expiry loop's next look, a completion) wakes no one: its range is kept as quiet,
//! and a reader woken later for a chunk after it passes over it without reading the log
//! ([`Pages::quiet`]). A reader that must know how far the log has been looked at (a pull
//! long-poll, through the notifier) holds the pages ([`Pages::hold`]) while it waits: every
//! chunk then wakes the readers, and the hold itself does once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tidemark_log::{EventChunk, EventRef};
use tokio::sync::watch;

/// Chunks kept for a reader that is a little behind: at most this many, and no more bytes
/// than [`KEEP_BYTES`] together.
const KEEP: usize = 8;
const KEEP_BYTES: usize = 1 << 20;
/// Quiet ranges kept (contiguous ones are one range).
const KEEP_QUIET: usize = 64;

/// Whether a chunk's events concern any reader (asked on the decider's thread: cheap tests of
/// each event's type, stream and subject).
pub type Interest = Box<dyn Fn(&[EventRef<'_>]) -> bool + Send + Sync>;

/// The chunks the decider read, newest last; each is `(after, upto]` of the log.
pub struct Pages {
    chunks: Mutex<Kept>,
    /// The end of the newest chunk handed on; also changes when `keeping_up` does.
    upto: watch::Sender<u64>,
    /// Whether the decider reads each commit as it lands (see the module's doc).
    keeping_up: AtomicBool,
    /// What the readers have a use for (`None`: everything).
    interest: RwLock<Option<Interest>>,
    /// Readers holding the pages ([`Pages::hold`]).
    held: AtomicUsize,
}

/// The chunks handed on, and the quiet ranges passed over, each newest last.
#[derive(Default)]
struct Kept {
    chunks: VecDeque<Arc<EventChunk>>,
    quiet: VecDeque<(u64, u64)>,
}

impl Default for Pages {
    fn default() -> Self {
        Pages {
            chunks: Mutex::new(Kept::default()),
            upto: watch::channel(0).0,
            keeping_up: AtomicBool::new(false),
            interest: RwLock::new(None),
            held: AtomicUsize::new(0),
        }
    }
}

impl Pages {
    /// Whether anyone takes the chunks (the decider copies nothing for nobody).
    pub(crate) fn wanted(&self) -> bool {
        self.upto.receiver_count() > 0
    }

    /// Hand on a chunk the decider read. One larger than [`KEEP_BYTES`] is not kept (its
    /// readers read the log), but its end is still announced, so no reader waits for it. One
    /// that concerns no reader, while none holds the pages, is kept as a quiet range and
    /// wakes no one.
    pub(crate) fn publish(&self, chunk: Arc<EventChunk>) {
        let (after, upto) = chunk.range();
        let wanted = self.concerns(&chunk);
        // Under the lock: a hold either sees this chunk's end or makes it wanted.
        let mut k = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        if !wanted && self.held.load(Ordering::SeqCst) == 0 {
            match k.quiet.back_mut() {
                Some(q) if q.1 == after => q.1 = upto,
                _ => k.quiet.push_back((after, upto)),
            }
            while k.quiet.len() > KEEP_QUIET {
                k.quiet.pop_front();
            }
            self.upto.send_if_modified(|u| {
                *u = upto;
                false
            });
            metrics::counter!("tidemark_follower_commits_passed_over_total").increment(1);
            return;
        }
        if chunk.size() <= KEEP_BYTES {
            k.chunks.push_back(chunk);
            let mut bytes: usize = k.chunks.iter().map(|ch| ch.size()).sum();
            while k.chunks.len() > KEEP || bytes > KEEP_BYTES {
                bytes -= k.chunks.pop_front().map_or(0, |ch| ch.size());
            }
        }
        self.upto.send_replace(upto);
    }

    /// Whether a reader has any use for `chunk` (yes when its events do not decode: the
    /// reader meets that itself).
    fn concerns(&self, chunk: &EventChunk) -> bool {
        let interest = self.interest.read().unwrap_or_else(|p| p.into_inner());
        let Some(f) = interest.as_ref() else {
            return true;
        };
        chunk.events().map_or(true, |events| f(&events))
    }

    /// Say what the readers have a use for: chunks with nothing for it wake no one.
    pub fn set_interest(&self, f: Interest) {
        *self.interest.write().unwrap_or_else(|p| p.into_inner()) = Some(f);
    }

    /// Hold the pages while waiting for the readers to have looked at the log up to a
    /// point: the readers are woken now (to pass over what was quiet) and by every chunk
    /// until the hold is dropped.
    pub fn hold(&self) -> Held<'_> {
        let _k = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        self.held.fetch_add(1, Ordering::SeqCst);
        self.upto.send_modify(|_| {});
        Held(self)
    }

    /// The end of the quiet range that holds the event after `after`, if one does: nothing
    /// up to it concerns a reader.
    pub fn quiet(&self, after: u64) -> Option<u64> {
        let k = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        k.quiet
            .iter()
            .rev()
            .find(|&&(a, u)| a <= after && after < u)
            .map(|&(_, u)| u)
    }

    /// Whether the decider reads each commit as it lands: a reader at the head can wait for
    /// [`subscribe`](Self::subscribe) alone. Set by the decider only.
    pub fn keeping_up(&self) -> bool {
        self.keeping_up.load(Ordering::SeqCst)
    }

    /// The decider folds (`true`) or has stopped folding (`false`); a change wakes every
    /// reader, so one at the head starts or stops waiting for the log's head itself.
    pub(crate) fn set_keeping_up(&self, yes: bool) {
        if self.keeping_up.swap(yes, Ordering::SeqCst) != yes {
            self.upto.send_modify(|_| {});
        }
    }

    /// Changes when a chunk is handed on (the value is its end) and when
    /// [`keeping_up`](Self::keeping_up) changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.upto.subscribe()
    }

    /// The end of the newest chunk handed on (0: none yet).
    pub fn published(&self) -> u64 {
        *self.upto.borrow()
    }

    /// The newest chunk that holds the event after `after` (`after < upto`, starting at or
    /// before it).
    pub fn covering(&self, after: u64) -> Option<Arc<EventChunk>> {
        let k = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        k.chunks
            .iter()
            .rev()
            .find(|ch| {
                let (a, u) = ch.range();
                a <= after && after < u
            })
            .cloned()
    }
}

/// A reader's hold on the pages ([`Pages::hold`]), released when dropped.
pub struct Held<'a>(&'a Pages);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::SeqCst);
    }
}
