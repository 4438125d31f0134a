//! The one follower: it reads each new page of the log once and hands it to every reactor.
//!
//! Reactors keep their own checkpoints (the router's and routing's are in the read models, the
//! notifier's is the head it last looked at) and skip what a page holds at or before theirs;
//! the follower starts at the lowest of them. A commit wakes it, but the wake-up is only a
//! nudge: it always reads the log. Each reactor has a small bounded queue, so a slow one holds
//! the follower back instead of letting pages pile up.

use std::sync::Arc;
use std::time::Duration;

use tidemark_engine::Engine;
use tidemark_log::{Event, EventLog, ReadQuery, StorageError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Events read per page.
const PAGE: usize = 1_000;
/// Pages queued per reactor.
const QUEUE: usize = 2;

/// One page of the log, shared by every reactor.
#[derive(Debug)]
pub struct Page {
    /// Committed events in seq order.
    pub events: Vec<Event>,
    /// The page covers the log after this seq ...
    pub after: u64,
    /// ... through this seq.
    pub upto: u64,
}

/// A reactor's end of the follower.
pub type Feed = mpsc::Receiver<Arc<Page>>;

/// The follower before it runs: reactors subscribe with the checkpoint they resume from.
pub struct Follower {
    engine: Engine,
    from: Option<u64>,
    feeds: Vec<(mpsc::Sender<Arc<Page>>, Wants)>,
}

/// Whether a reactor has anything to do with a page: a page it does not want is not sent to
/// it (the reactor is not woken). Only for reactors whose progress does not depend on seeing
/// every page: the router and routing keep their checkpoints in the read models, and a live
/// stream reads the log itself.
pub type Wants = Box<dyn Fn(&Page) -> bool + Send + Sync>;

impl Follower {
    pub fn new(engine: Engine) -> Follower {
        Follower {
            engine,
            from: None,
            feeds: Vec::new(),
        }
    }

    /// A feed of every page after `after`.
    pub fn subscribe(&mut self, after: u64) -> Feed {
        self.subscribe_if(after, Box::new(|_| true))
    }

    /// A feed of the pages after `after` that `wants`.
    pub fn subscribe_if(&mut self, after: u64, wants: Wants) -> Feed {
        let (tx, rx) = mpsc::channel(QUEUE);
        self.feeds.push((tx, wants));
        self.from = Some(self.from.map_or(after, |f| f.min(after)));
        rx
    }

    /// Read the log from the lowest checkpoint on, page by page, until `shutdown` or until
    /// every reactor has gone.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut after = self.from.unwrap_or(0);
        let mut head_rx = self.engine.log().subscribe();
        let mut backoff = Duration::from_millis(100);
        tracing::info!(after, reactors = self.feeds.len(), "log follower started");
        loop {
            head_rx.borrow_and_update();
            let e = self.engine.clone();
            let q = ReadQuery {
                after,
                limit: PAGE,
                ..ReadQuery::default()
            };
            let read = tokio::task::spawn_blocking(move || e.log().read(&q))
                .await
                .map_err(StorageError::of)
                .and_then(|r| r.map_err(StorageError::of));
            let page = match read {
                Ok(p) => {
                    backoff = Duration::from_millis(100);
                    p
                }
                Err(e) => {
                    tracing::warn!(error = %e, "log follower read failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {},
                        _ = shutdown.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            let head = page.head;
            if page.next_after > after {
                metrics::counter!("tidemark_follower_events_read_total")
                    .increment(page.events.len() as u64);
                let p = Arc::new(Page {
                    events: page.events,
                    after,
                    upto: page.next_after,
                });
                after = p.upto;
                self.feeds.retain(|(f, _)| !f.is_closed());
                for (f, wants) in &self.feeds {
                    if !wants(&p) {
                        continue;
                    }
                    tokio::select! {
                        // A reactor that stopped no longer gets pages.
                        _ = f.send(p.clone()) => {},
                        _ = shutdown.cancelled() => return,
                    }
                }
                if self.feeds.is_empty() {
                    return;
                }
            }
            if after < head {
                continue;
            }
            tokio::select! {
                changed = head_rx.changed() => if changed.is_err() { return },
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
