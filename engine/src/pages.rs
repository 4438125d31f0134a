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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tidemark_log::EventChunk;
use tokio::sync::watch;

/// Chunks kept for a reader that is a little behind: at most this many, and no more bytes
/// than [`KEEP_BYTES`] together.
const KEEP: usize = 8;
const KEEP_BYTES: usize = 1 << 20;

/// The chunks the decider read, newest last; each is `(after, upto]` of the log.
pub struct Pages {
    chunks: Mutex<VecDeque<Arc<EventChunk>>>,
    /// The end of the newest chunk handed on; also changes when `keeping_up` does.
    upto: watch::Sender<u64>,
    /// Whether the decider reads each commit as it lands (see the module's doc).
    keeping_up: AtomicBool,
}

impl Default for Pages {
    fn default() -> Self {
        Pages {
            chunks: Mutex::new(VecDeque::new()),
            upto: watch::channel(0).0,
            keeping_up: AtomicBool::new(false),
        }
    }
}

impl Pages {
    /// Whether anyone takes the chunks (the decider copies nothing for nobody).
    pub(crate) fn wanted(&self) -> bool {
        self.upto.receiver_count() > 0
    }

    /// Hand on a chunk the decider read. One larger than [`KEEP_BYTES`] is not kept (its
    /// readers read the log), but its end is still announced, so no reader waits for it.
    pub(crate) fn publish(&self, chunk: Arc<EventChunk>) {
        let upto = chunk.range().1;
        if chunk.size() <= KEEP_BYTES {
            let mut c = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
            c.push_back(chunk);
            let mut bytes: usize = c.iter().map(|ch| ch.size()).sum();
            while c.len() > KEEP || bytes > KEEP_BYTES {
                bytes -= c.pop_front().map_or(0, |ch| ch.size());
            }
        }
        self.upto.send_replace(upto);
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
        let c = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        c.iter()
            .rev()
            .find(|ch| {
                let (a, u) = ch.range();
                a <= after && after < u
            })
            .cloned()
    }
}
