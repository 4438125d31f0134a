//! Live streams' wake-ups: one reactor of the follower looks at each new page once and wakes
//! only the streams it holds an event for.
//!
//! A live stream (`/v1/events/stream`, a task's stream) that has caught up waits for more. It
//! used to wait for the log's head, so every commit woke every stream, each to read the log and
//! find, for a filtered stream, usually nothing. Now a stream registers its filter here
//! ([`StreamHub::watch`]); the hub, fed by the follower like the other reactors, wakes a stream
//! only when a page holds an event its filter matches. The wake-up is still a nudge: the stream
//! reads the log itself (from the newest groups kept in memory), so a page the hub saw before
//! the stream's read and one it sees after are both covered (the stream marks its watch seen
//! before each read).

use std::sync::{Arc, Mutex, Weak};

use tidemark_log::{Event, ReadQuery};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::follow::Feed;

/// What a stream waits for: events of its filter.
#[derive(Debug)]
struct Interest {
    stream: Option<String>,
    subject: Option<String>,
    event_type: Option<String>,
    /// The last matching seq the hub has seen.
    tx: watch::Sender<u64>,
}

impl Interest {
    fn matches(&self, e: &Event) -> bool {
        self.stream.as_deref().is_none_or(|s| s == e.stream)
            && self.subject.as_deref().is_none_or(|s| s == e.subject)
            && self.event_type.as_deref().is_none_or(|t| t == e.event_type)
    }
}

/// The live streams' registry and the reactor that wakes them.
#[derive(Debug, Clone, Default)]
pub struct StreamHub {
    interests: Arc<Mutex<Vec<Weak<Interest>>>>,
}

/// A stream's end: dropped with the stream, which unregisters it.
#[derive(Debug)]
pub struct StreamWatch {
    _interest: Arc<Interest>,
    rx: watch::Receiver<u64>,
}

impl StreamWatch {
    /// Mark every wake-up so far seen: call before reading the log.
    pub fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Wait for a page holding an event of this stream's filter (seen after the last
    /// [`StreamWatch::mark_seen`]); `false` when the hub has stopped.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

impl StreamHub {
    /// Register a stream reading with the filters of `q`.
    pub fn watch(&self, q: &ReadQuery) -> StreamWatch {
        let (tx, rx) = watch::channel(0);
        let interest = Arc::new(Interest {
            stream: q.stream.clone(),
            subject: q.subject.clone(),
            event_type: q.event_type.clone(),
            tx,
        });
        self.interests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(&interest));
        StreamWatch {
            _interest: interest,
            rx,
        }
    }

    /// Whether any live stream waits (the follower sends pages only then).
    pub fn is_watched(&self) -> bool {
        let mut all = self.interests.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        !all.is_empty()
    }

    /// Look at each page of the follower once and wake the streams it has events for.
    pub async fn run(self, mut feed: Feed, shutdown: CancellationToken) {
        loop {
            let page = tokio::select! {
                p = feed.recv() => match p {
                    Some(p) => p,
                    None => return,
                },
                _ = shutdown.cancelled() => return,
            };
            if page.events.is_empty() {
                continue;
            }
            let live: Vec<Arc<Interest>> = {
                let mut all = self.interests.lock().unwrap_or_else(|p| p.into_inner());
                all.retain(|w| w.strong_count() > 0);
                all.iter().filter_map(Weak::upgrade).collect()
            };
            for i in &live {
                if let Some(e) = page.events.iter().rev().find(|e| i.matches(e)) {
                    i.tx.send_replace(e.seq);
                }
            }
        }
    }
}
