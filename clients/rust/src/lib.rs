//! The tidemark client (spec section 19): typed calls over HTTP, and the loops every program
//! that talks to tidemark otherwise writes by hand.
//!
//! - [`Client::append`] gives events ids when the caller did not and retries what is safe to
//!   retry (5xx, `429`/`503` with `Retry-After`, a connection lost before the answer) with the
//!   same ids: a retry of an append that did land is answered as a duplicate with its seq.
//! - [`Client::stream`]: a live stream that resumes with `Last-Event-ID` after any failure,
//!   each seq yielded once and in order.
//! - [`Consumer`]: a bridge's cursor loop, at-least-once and in seq order.
//! - [`Worker`]: a sink's claim loop: claim, extend while the handler runs, complete or fail.
//! - [`webhooks::verify`]: the Standard Webhooks signatures of tidemark's webhook POSTs.
//!
//! ```no_run
//! # async fn run() -> Result<(), tidemark_client::Error> {
//! use futures::StreamExt;
//! let client = tidemark_client::Client::new("http://127.0.0.1:7700", None)?;
//! let mut events = client.stream(tidemark_client::StreamOptions::after(0));
//! while let Some(ev) = events.next().await {
//!     let ev = ev?;
//!     println!("{} {} {}", ev.seq, ev.event_type, ev.subject);
//! }
//! # Ok(()) }
//! ```

mod append;
mod consumer;
mod error;
pub mod models;
mod operations;
mod stream;
mod types;
pub mod webhooks;
mod worker;

use std::time::Duration;

use reqwest::RequestBuilder;
use serde::de::DeserializeOwned;

pub use append::Retry;
pub use consumer::{Consumer, ConsumerOptions};
pub use error::{Error, Problem};
pub use operations::{Answers, AsJson, Ops, Typed};
pub use reqwest::Method;
pub use reqwest::StatusCode;
pub use stream::{EventStream, StreamOptions};
pub use types::{
    AppendReceipt, Appended, CompleteResult, Cursor, Delivery, Event, EventsPage, NewEvent,
};
pub use webhooks::verify as verify_webhook;
pub use worker::{Failure, Outcome, Worker, WorkerOptions, WorkerReport};

/// A tidemark server: its base URL (`http://host:port`, no `/v1`) and a bearer token when the
/// server has tokens configured.
#[derive(Clone, Debug)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
    retry: Retry,
}

impl Client {
    /// A client of the server at `base_url`; `token` is sent as `Authorization: Bearer`.
    pub fn new(base_url: impl Into<String>, token: Option<String>) -> Result<Client, Error> {
        let base = base_url.into().trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::Config(format!(
                "the base URL must start with http:// or https:// (got {base:?})"
            )));
        }
        if token.as_deref().is_some_and(|t| {
            reqwest::header::HeaderValue::from_str(&format!("Bearer {t}")).is_err()
        }) {
            return Err(Error::Config(
                "the token contains characters not allowed in a header".into(),
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client {
            base,
            token,
            http,
            retry: Retry::default(),
        })
    }

    /// The same client with another retry policy for its appends.
    #[must_use]
    pub fn with_retry(mut self, retry: Retry) -> Client {
        self.retry = retry;
        self
    }

    /// The same client acting for tenant `name` (spec section 20): every call goes under
    /// `/tenants/{name}` of the server, with the same token (a `*` token's, or the tenant's
    /// own). A name is 1 to 32 of `a-z0-9_-`, starting with a letter.
    pub fn tenant(&self, name: &str) -> Result<Client, Error> {
        let ok = name.len() <= 32
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
        if !ok {
            return Err(Error::Config(format!(
                "{name:?} is not a tenant's name (1 to 32 of a-z0-9_-, starting with a letter)"
            )));
        }
        Ok(Client {
            base: format!("{}/tenants/{name}", self.base),
            ..self.clone()
        })
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// A request to `path` (which starts with `/`) with the client's token: for a call the
    /// typed methods do not cover (the CLI's raw commands, a new endpoint), sent with
    /// [`Client::send`].
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let rb = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Send a request made with [`Client::request`]: the answer whatever its status, or
    /// [`Error::Transport`] when none came.
    pub async fn send(&self, rb: RequestBuilder) -> Result<reqwest::Response, Error> {
        rb.send().await.map_err(Error::Transport)
    }

    /// Send, and read a JSON answer or the problem.
    pub(crate) async fn call<T: DeserializeOwned>(&self, rb: RequestBuilder) -> Result<T, Error> {
        let resp = rb.send().await.map_err(Error::Transport)?;
        read(resp).await
    }

    /// A page of the log (`GET /v1/events`): events after `after_sequence` of `stream`
    /// (and `subject`), at most `limit`.
    pub async fn events(
        &self,
        after_sequence: u64,
        stream: Option<&str>,
        subject: Option<&str>,
        limit: u32,
    ) -> Result<EventsPage, Error> {
        let mut q: Vec<(&str, String)> = vec![
            ("after_sequence", after_sequence.to_string()),
            ("limit", limit.to_string()),
        ];
        if let Some(s) = stream {
            q.push(("stream", s.to_owned()));
        }
        if let Some(s) = subject {
            q.push(("subject", s.to_owned()));
        }
        self.call(self.request(Method::GET, "/v1/events").query(&q))
            .await
    }

    /// One cursor (`GET /v1/cursors`); zero when it was never advanced.
    pub async fn cursor(
        &self,
        consumer_id: &str,
        stream_name: &str,
        subject_id: &str,
    ) -> Result<Cursor, Error> {
        #[derive(serde::Deserialize)]
        struct Page {
            cursors: Vec<Cursor>,
        }
        let page: Page = self
            .call(self.request(Method::GET, "/v1/cursors").query(&[
                ("consumer_id", consumer_id),
                ("stream_name", stream_name),
                ("subject_id", subject_id),
            ]))
            .await?;
        page.cursors
            .into_iter()
            .next()
            .ok_or_else(|| Error::Decode("a cursor read answered no cursor".into()))
    }

    /// Advance a cursor to `last_sequence` (`POST /v1/cursors/advance`), only if it stands at
    /// `expected_sequence` when given. Repeating an advance with the same `delivery_id` is an
    /// idempotent replay.
    pub async fn advance_cursor(
        &self,
        consumer_id: &str,
        stream_name: &str,
        subject_id: &str,
        last_sequence: u64,
        delivery_id: &str,
        expected_sequence: Option<u64>,
    ) -> Result<Cursor, Error> {
        let body = serde_json::json!({
            "consumer_id": consumer_id,
            "stream_name": stream_name,
            "subject_id": subject_id,
            "last_sequence": last_sequence,
            "delivery_id": delivery_id,
            "expected_sequence": expected_sequence,
        });
        self.call(
            self.request(Method::POST, "/v1/cursors/advance")
                .json(&body),
        )
        .await
    }

    /// Lease up to `limit` due deliveries of `sink` to `owner` for `lease`.
    pub async fn claim(
        &self,
        sink: &str,
        owner: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<Delivery>, Error> {
        #[derive(serde::Deserialize)]
        struct Page {
            deliveries: Vec<Delivery>,
        }
        let body = serde_json::json!({
            "sink": sink, "owner": owner, "limit": limit, "lease_ms": lease_ms(lease),
        });
        let page: Page = self
            .call(
                self.request(Method::POST, "/v1/deliveries/claim")
                    .json(&body),
            )
            .await?;
        Ok(page.deliveries)
    }

    /// Report deliveries leased by `owner` sent, in one request (`POST
    /// /v1/deliveries/complete`); each answered on its own.
    pub async fn complete(&self, owner: &str, ids: &[&str]) -> Result<Vec<CompleteResult>, Error> {
        #[derive(serde::Deserialize)]
        struct Answer {
            results: Vec<CompleteResult>,
        }
        let items: Vec<_> = ids.iter().map(|id| serde_json::json!({"id": id})).collect();
        let body = serde_json::json!({"owner": owner, "deliveries": items});
        let a: Answer = self
            .call(
                self.request(Method::POST, "/v1/deliveries/complete")
                    .json(&body),
            )
            .await?;
        Ok(a.results)
    }

    /// Report a leased delivery failed.
    pub async fn fail(&self, id: &str, owner: &str, failure: &Failure) -> Result<Delivery, Error> {
        let body = serde_json::json!({
            "owner": owner,
            "error_code": failure.code,
            "error": failure.message,
            "retryable": failure.retryable,
            "retry_after_ms": failure.retry_after.map(|d| d.as_millis() as u64),
        });
        self.call(
            self.request(
                Method::POST,
                &format!("/v1/deliveries/{}/fail", path_segment(id)),
            )
            .json(&body),
        )
        .await
    }

    /// Extend a lease by `lease` from now (a heartbeat).
    pub async fn extend(&self, id: &str, owner: &str, lease: Duration) -> Result<Delivery, Error> {
        let body = serde_json::json!({"owner": owner, "lease_ms": lease_ms(lease)});
        self.call(
            self.request(
                Method::POST,
                &format!("/v1/deliveries/{}/extend", path_segment(id)),
            )
            .json(&body),
        )
        .await
    }

    /// One delivery.
    pub async fn delivery(&self, id: &str) -> Result<Delivery, Error> {
        self.call(self.request(Method::GET, &format!("/v1/deliveries/{}", path_segment(id))))
            .await
    }

    /// Every JSON operation of the API, one call each (generated from the checked-in OpenAPI
    /// document by `clients/codegen.py`), answering the operation's type from [`models`]:
    /// `client.ops().put_route("rot", &body).await?.as_of_seq`.
    pub fn ops(&self) -> Ops<'_> {
        Ops {
            client: self,
            answers: std::marker::PhantomData,
        }
    }

    /// The same calls as [`Client::ops`], answering the JSON the server sent (every field,
    /// those a newer server adds included).
    pub fn ops_json(&self) -> Ops<'_, AsJson> {
        Ops {
            client: self,
            answers: std::marker::PhantomData,
        }
    }

    /// One operation: `query` checked against the names the document gives it, the answer
    /// read as `T` (`null` for an empty answer) or its problem.
    pub(crate) async fn operation<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        allowed: &[&str],
        body: Option<&(impl serde::Serialize + ?Sized)>,
    ) -> Result<T, Error> {
        if let Some((k, _)) = query.iter().find(|(k, _)| !allowed.contains(k)) {
            return Err(Error::Config(format!(
                "{method} {path} takes no query parameter {k:?} (it takes {allowed:?})"
            )));
        }
        let mut rb = self.request(method, path).query(query);
        if let Some(b) = body {
            rb = rb.json(b);
        }
        self.call(rb).await
    }

    /// A running server's backup as it streams it (`GET /v1/admin/backup/stream`): the events
    /// after `after` as JSON lines, read a chunk at a time (the `backup` scope).
    pub async fn backup_stream(&self, after: u64) -> Result<BackupStream, Error> {
        self.backup_stream_of(None, after).await
    }

    /// [`Client::backup_stream`] of one shard's log (spec section 20: a deployment of several
    /// shards streams each one's on its own).
    pub async fn backup_stream_of(
        &self,
        shard: Option<u32>,
        after: u64,
    ) -> Result<BackupStream, Error> {
        let mut query = vec![("after", after.to_string())];
        if let Some(n) = shard {
            query.push(("shard", n.to_string()));
        }
        let resp = self
            .send(
                self.request(Method::GET, "/v1/admin/backup/stream")
                    .query(&query),
            )
            .await?;
        let status = resp.status();
        if !status.is_success() {
            let asked = retry_after(&resp);
            let bytes = resp.bytes().await.map_err(Error::Transport)?;
            return Err(Error::Api(Box::new(Problem::of(status, &bytes, asked))));
        }
        let seq = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| Error::Decode(format!("the backup stream has no {name} header")))
        };
        Ok(BackupStream {
            after_seq: seq("tidemark-after-seq")?,
            through_seq: seq("tidemark-through-seq")?,
            resp,
        })
    }

    /// A live stream of the log after `opts.after_sequence` (see [`EventStream`]).
    pub fn stream(&self, opts: StreamOptions) -> EventStream {
        EventStream::start(self.clone(), opts)
    }

    /// A bridge's cursor loop (see [`Consumer`]).
    pub fn consumer(&self, opts: ConsumerOptions) -> Consumer {
        Consumer::new(self.clone(), opts)
    }

    /// A sink's claim loop (see [`Worker`]).
    pub fn worker(&self, sink: &str, opts: WorkerOptions) -> Worker {
        Worker::new(self.clone(), sink, opts)
    }
}

fn lease_ms(d: Duration) -> u64 {
    (d.as_millis() as u64).clamp(100, 3_600_000)
}

/// A path segment with the characters a delivery id may hold (`:`) kept and the rest escaped.
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' => {
                out.push(b as char);
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A JSON answer, or the problem it carries.
pub(crate) async fn read<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, Error> {
    let status = resp.status();
    let retry_after = retry_after(&resp);
    let bytes = resp.bytes().await.map_err(Error::Transport)?;
    if status.is_success() {
        // An empty answer (a 204) reads as `null`.
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"null"
        } else {
            &bytes
        };
        return serde_json::from_slice(bytes)
            .map_err(|e| Error::Decode(format!("an answer of status {status}: {e}")));
    }
    Err(Error::Api(Box::new(Problem::of(
        status,
        &bytes,
        retry_after,
    ))))
}

/// `Retry-After` in seconds or as an HTTP date.
pub(crate) fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    let v = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

pub(crate) fn is_retryable_status(s: StatusCode) -> bool {
    s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS || s == StatusCode::REQUEST_TIMEOUT
}

/// A jittered exponential backoff: the `attempt`-th wait (0-based) between `base` and `max`,
/// drawn from its upper half so that clients restarted together spread out.
pub(crate) fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16)).min(max);
    let half = exp / 2;
    half + half.mul_f64(rand::random::<f64>())
}

/// The README's examples, compiled with the crate's doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

/// The answer of [`Client::backup_stream`]: the seqs it spans, and its JSON lines in chunks.
pub struct BackupStream {
    /// The stream holds the events after this seq...
    pub after_seq: u64,
    /// ...through this one, each once, in order.
    pub through_seq: u64,
    resp: reqwest::Response,
}

impl BackupStream {
    /// The next chunk of the stream (`None` at its end); a transport error when it broke.
    pub async fn chunk(&mut self) -> Result<Option<bytes::Bytes>, Error> {
        self.resp.chunk().await.map_err(Error::Transport)
    }
}
