//! A live stream of the log that survives its connection: after any failure (the server
//! restarted, killed, a proxy cut the connection) it reconnects with `Last-Event-ID` set to the
//! last seq it yielded, after a jittered backoff, and yields each seq once, in order, skipping
//! none the server has for its filters. It ends when the caller drops it or calls
//! [`EventStream::close`], or with a problem no retry can fix (`400`, `401`, `403`, `410`).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use reqwest::Method;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{Client, Error, Event};

/// Where a stream starts and what it holds.
#[derive(Debug, Clone, Default)]
pub struct StreamOptions {
    /// Events after this seq (0: from the start).
    pub after_sequence: u64,
    pub stream: Option<String>,
    pub subject: Option<String>,
    pub event_type: Option<String>,
    /// `None` (the default): reconnect for as long as the stream lives. `Some(n)`: end with
    /// the failure (yielded as the last item) when the very first connection fails (a server
    /// that is not there), or when `n` reconnects in a row fail after one had succeeded (a
    /// server that went away and does not come back): what a command-line tool wants.
    pub give_up_after: Option<u32>,
}

impl StreamOptions {
    /// Every event after `seq`.
    pub fn after(seq: u64) -> StreamOptions {
        StreamOptions {
            after_sequence: seq,
            ..StreamOptions::default()
        }
    }

    /// Only the events of `stream`.
    #[must_use]
    pub fn stream(mut self, stream: impl Into<String>) -> StreamOptions {
        self.stream = Some(stream.into());
        self
    }

    /// Only the events of `subject`.
    #[must_use]
    pub fn subject(mut self, subject: impl Into<String>) -> StreamOptions {
        self.subject = Some(subject.into());
        self
    }

    /// Only the events of type `event_type`.
    #[must_use]
    pub fn event_type(mut self, event_type: impl Into<String>) -> StreamOptions {
        self.event_type = Some(event_type.into());
        self
    }

    /// Give up as [`StreamOptions::give_up_after`] says.
    #[must_use]
    pub fn give_up_after(mut self, failures: u32) -> StreamOptions {
        self.give_up_after = Some(failures);
        self
    }
}

/// The stream of [`Client::stream`]: `Result<Event, Error>` items; an `Err` is the last item.
pub struct EventStream {
    rx: mpsc::Receiver<Result<Event, Error>>,
    stop: CancellationToken,
    reconnects: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl EventStream {
    pub(crate) fn start(client: Client, opts: StreamOptions) -> EventStream {
        let (tx, rx) = mpsc::channel(256);
        let stop = CancellationToken::new();
        let reconnects = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        tokio::spawn(follow(client, opts, tx, stop.clone(), reconnects.clone()));
        EventStream {
            rx,
            stop,
            reconnects,
        }
    }

    /// End the stream: no reconnect, the connection closed.
    pub fn close(&self) {
        self.stop.cancel();
    }

    /// How many times the stream has reconnected.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Stream for EventStream {
    type Item = Result<Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// What one connection ended with.
enum Ended {
    /// The caller went away.
    Stopped,
    /// Reconnect (after a wait of at least this); with the failure when no connection was
    /// made.
    Again(Option<Duration>, Option<Error>),
    /// A problem no retry fixes: yielded, then the end.
    Fatal(Error),
}

async fn follow(
    client: Client,
    opts: StreamOptions,
    tx: mpsc::Sender<Result<Event, Error>>,
    stop: CancellationToken,
    reconnects: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let mut last = opts.after_sequence;
    let mut failures = 0u32;
    let mut first = true;
    // Connections made, and connection attempts failed in a row (for `give_up_after`).
    let mut connected = false;
    let mut refused = 0u32;
    loop {
        let before = last;
        let ended = tokio::select! {
            e = connect(&client, &opts, &mut last, first, &tx) => e,
            () = stop.cancelled() => Ended::Stopped,
        };
        first = false;
        let ended = match (ended, opts.give_up_after) {
            (Ended::Again(_, Some(e)), Some(n)) if !connected || refused >= n => Ended::Fatal(e),
            (Ended::Again(wait, e), _) => {
                connected |= e.is_none();
                refused = if e.is_some() { refused + 1 } else { 0 };
                Ended::Again(wait, None)
            }
            (ended, _) => ended,
        };
        let wait = match ended {
            Ended::Stopped => return,
            Ended::Fatal(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
            Ended::Again(asked, _) => {
                // A connection that yielded something was healthy: start the backoff over.
                if last > before {
                    failures = 0;
                }
                let own = crate::backoff(
                    failures,
                    Duration::from_millis(100),
                    Duration::from_secs(10),
                );
                failures = failures.saturating_add(1);
                asked.map_or(own, |a| a.max(own))
            }
        };
        reconnects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// One connection: read events until it ends, advancing `last`.
async fn connect(
    client: &Client,
    opts: &StreamOptions,
    last: &mut u64,
    first: bool,
    tx: &mpsc::Sender<Result<Event, Error>>,
) -> Ended {
    let mut q: Vec<(&str, String)> = vec![("after_sequence", last.to_string())];
    if let Some(s) = &opts.stream {
        q.push(("stream", s.clone()));
    }
    if let Some(s) = &opts.subject {
        q.push(("subject", s.clone()));
    }
    if let Some(s) = &opts.event_type {
        q.push(("type", s.clone()));
    }
    let mut rb = client
        .request(Method::GET, "/v1/events/stream")
        .query(&q)
        .header(reqwest::header::ACCEPT, "text/event-stream");
    if !first {
        // On a reconnect `Last-Event-ID` wins over the query (spec section 7).
        rb = rb.header("last-event-id", last.to_string());
    }
    let resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => return Ended::Again(None, Some(Error::Transport(e))),
    };
    let status = resp.status();
    if !status.is_success() {
        let asked = crate::retry_after(&resp);
        let bytes = resp.bytes().await.unwrap_or_default();
        let err = Error::Api(Box::new(crate::Problem::of(status, &bytes, asked)));
        return if err.is_retryable() || status == reqwest::StatusCode::NOT_FOUND {
            Ended::Again(asked, Some(err))
        } else {
            Ended::Fatal(err)
        };
    }
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut data = String::new();
    loop {
        let Some(Ok(chunk)) = body.next().await else {
            return Ended::Again(None, None);
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                // The end of one message: dispatch its data.
                if data.is_empty() {
                    continue;
                }
                let ev: Event = match serde_json::from_str(&data) {
                    Ok(e) => e,
                    Err(e) => {
                        return Ended::Fatal(Error::Decode(format!("a stream message: {e}")));
                    }
                };
                data.clear();
                // Each seq once, in order: what a reconnect sends again is passed over.
                if ev.seq <= *last {
                    continue;
                }
                *last = ev.seq;
                if tx.send(Ok(ev)).await.is_err() {
                    return Ended::Stopped;
                }
            } else if let Some(v) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
            // `id:`, `event:`, `retry:` and comments (keep-alives): the envelope in `data`
            // carries the seq and the type.
        }
    }
}
