//! Live streams' wake-ups: one reactor of the follower looks at each new page once and wakes
//! only the streams it holds an event for.
//!
//! A live stream (`/v1/events/stream`, a task's stream) that has caught up waits for more. It
//! used to wait for the log's head, so every commit woke every stream, each to read the log and
//! find, for a filtered stream, usually nothing. Now a stream registers its filter here
//! ([`StreamHub::watch`]); the hub, fed by the follower like the other reactors, wakes a stream
//! only when a page holds an event its filter matches, and hands it the page: a stream that has
//! everything up to the previous page it was handed takes its events from this one, so a commit
//! is read once (by the follower) for every caught-up stream. A stream further behind reads the
//! log itself (from the newest groups kept in memory), so a page the hub saw before the stream's
//! read and one it sees after are both covered (the stream marks its watch seen before each
//! read).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tidemark_log::{Event, ReadQuery};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::follow::Feed;

/// Events of a stream's filter the hub hands it from one page at most: a stream sends a page of
/// at most 256 events from the log (I9), and holds no more than that from the hub while it
/// waits; past it, the stream reads the log in pages as before.
pub const SHARED_MAX: usize = 256;

/// What the hub hands a stream: the events of its filter in a page (`None`: more than
/// [`SHARED_MAX`]), the end of that page, and the end of the page it was handed before (every
/// matching event between the two ends is in this one).
#[derive(Debug, Clone, Default)]
struct Wake {
    events: Option<Arc<[Event]>>,
    upto: u64,
    prev_upto: u64,
}

/// What a stream waits for: events of its filter.
#[derive(Debug)]
struct Interest {
    /// The tenant whose events it shows, by name (`None`: every tenant's, which no client
    /// stream is: `Queries::events` names one).
    tenant: Option<String>,
    stream: Option<String>,
    subject: Option<String>,
    event_type: Option<String>,
    /// The last page with events of this filter the hub has seen.
    tx: watch::Sender<Wake>,
    /// The end of that page.
    last_upto: AtomicU64,
}

impl Interest {
    fn matches(&self, e: &Event) -> bool {
        self.tenant.as_deref().is_none_or(|t| t == e.tenant())
            && self.stream.as_deref().is_none_or(|s| s == e.stream)
            && self.subject.as_deref().is_none_or(|s| s == e.subject)
            && self.event_type.as_deref().is_none_or(|t| t == e.event_type)
    }
}

/// What a woken stream does next ([`StreamWatch::next`]).
#[derive(Debug)]
pub enum Next {
    /// These events of its filter follow its position directly; then it is at `upto`.
    Events { events: Vec<Event>, upto: u64 },
    /// Nothing past its position: wait again.
    Nothing,
    /// It may have missed events: read the log.
    ReadLog,
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
    rx: watch::Receiver<Wake>,
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

    /// After a wake-up, for a stream at `after`: the events it was handed when it has everything
    /// up to the page handed before (clones: the caller redacts what it serves), else read the
    /// log (also when the page held more than [`SHARED_MAX`] of its events).
    pub fn next(&mut self, after: u64) -> Next {
        let w = self.rx.borrow_and_update();
        if w.upto <= after {
            return Next::Nothing;
        }
        match &w.events {
            Some(events) if after >= w.prev_upto => Next::Events {
                events: events.iter().filter(|e| e.seq > after).cloned().collect(),
                upto: w.upto,
            },
            _ => Next::ReadLog,
        }
    }
}

impl StreamHub {
    /// Register a stream reading with the filters of `q`.
    pub fn watch(&self, q: &ReadQuery) -> StreamWatch {
        let (tx, rx) = watch::channel(Wake::default());
        let interest = Arc::new(Interest {
            tenant: q.tenant.clone(),
            stream: q.stream.clone(),
            subject: q.subject.clone(),
            event_type: q.event_type.clone(),
            tx,
            last_upto: AtomicU64::new(0),
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
                let matching: Vec<Event> = page
                    .events
                    .iter()
                    .filter(|e| i.matches(e))
                    .take(SHARED_MAX + 1)
                    .cloned()
                    .collect();
                if !matching.is_empty() {
                    let events = (matching.len() <= SHARED_MAX).then(|| matching.into());
                    let prev_upto = i.last_upto.swap(page.upto, Ordering::SeqCst);
                    i.tx.send_replace(Wake {
                        events,
                        upto: page.upto,
                        prev_upto,
                    });
                }
            }
        }
    }
}
