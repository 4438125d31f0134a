//! The JetStream backend (spec section 16): the log is one JetStream stream on a NATS cluster;
//! its stream sequence is `event_seq`.
//!
//! # Shape
//! - **Appends** go to the cluster ([`append`]): one plain publish for a single event, one
//!   atomic batch publish (`Nats-Batch-Id`, `-Sequence`, `-Commit`; at most
//!   [`crate::limits::BATCH_MAX_EVENTS`] = the server's 1,000) for several; each event a message
//!   on a NATS subject derived from its stream and subject (`<prefix>.s<hex stream>.j<hex
//!   subject>`), its body the event's id, names, payload and the batch's time. Acknowledged
//!   means the publish acknowledgement (the PubAck): stored on a quorum and synced where the
//!   servers run `sync_interval: always`. A node keeps a bounded window of publishes in flight
//!   ([`PUBLISH_WINDOW`], then 429).
//! - **Reads** are served by a local replica: an embedded [`Log`] that takes each batch at
//!   exactly its stream sequences and the batch's time ([`Log::replicate`]), through
//!   [`feed`]: a batch this node published is handed over on its PubAck, as built (nothing is
//!   parsed again); what other nodes published comes from an ordered consumer ([`follow`]),
//!   which skips what the replica holds. Pages, lookups by id, filters, chunks for the folds and
//!   the commit notifier are the embedded log's. An append is answered once the replica holds
//!   its batch (read-your-writes on this node): at once when nothing of another node's lies
//!   before it.
//! - **Idempotency stays exact forever (I2).** Before it publishes, an append catches the
//!   replica up to the stream's last sequence (at most once per tenth of the de-duplication
//!   window) and looks its ids up there: an id already in the log is answered as a duplicate
//!   with its original seq (or refused as a conflict), whatever its age. Every message also
//!   carries `Nats-Msg-Id` = its event id, so two publishes of one id inside the server's window
//!   are told apart there: a plain publish is answered with the original's seq (compared on the
//!   replica), an atomic batch fails whole and is decided again against the caught-up replica.
//! - **Conditions.** The head condition is `Nats-Expected-Last-Sequence` on the first message;
//!   a subject the batch writes is checked by `Nats-Expected-Last-Subject-Sequence` on its first
//!   message. A subject the batch only reads is checked on the caught-up replica and then held
//!   by `Nats-Expected-Last-Sequence` = the replica's head (nothing appended since the check).
//!   Conditional appends naming one subject take turns on a node; the rest flow.

use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::{oneshot, watch};

use crate::condition::Condition;
use crate::embedded::{Log, LogConfig};
use crate::envelope::{Event, NewEvent};
use crate::error::{AppendError, OpenError, ReadError, StorageError};
mod append;
mod feed;
mod follow;

use append::{Attempt, Pipeline};
pub use append::{BATCHES_IN_FLIGHT, PUBLISH_WINDOW};

use crate::{AppendReceipt, Compacted, EventChunk, EventLog, ReadPage, ReadQuery};

/// The oldest server with what this backend needs: atomic batches with message ids inside
/// them, and the fixes of 2.12.1–2.12.3.
pub const MIN_SERVER: (u64, u64, u64) = (2, 12, 3);

/// The first server whose replicated streams sync once per Raft append under
/// `sync_interval: always` (nats-server PR #8447) rather than once more per message, still
/// acknowledging only what a quorum synced: older ones work, slower (a warning at open).
pub const ONE_SYNC_PER_APPEND: (u64, u64, u64) = (2, 15, 0);

/// How to reach the stream, and where the local replica lives.
#[derive(Debug, Clone)]
pub struct JetStreamConfig {
    /// `nats://host:port` of one or more servers of the cluster.
    pub servers: Vec<String>,
    /// The stream's name (created if absent).
    pub stream: String,
    /// Replicas of a stream this backend creates.
    pub replicas: usize,
    /// The local replica (an embedded log; disposable: rebuilt from the stream if deleted).
    pub replica: LogConfig,
    /// How long a request to the cluster may take before the append is refused.
    pub timeout: Duration,
    /// How long a lease on once-per-cluster work outlives its node's last renewal
    /// ([`crate::lease`]): the bound on a handover after a node dies.
    pub lease_ttl: Duration,
    /// This node's id among the cluster's nodes (unique per process).
    pub node: String,
    /// Publishes this node keeps in flight at once; an append beyond them is refused with
    /// `Overloaded` (a 429) rather than queued without bound.
    pub publish_window: usize,
}

impl JetStreamConfig {
    /// The replica is not synced per group ([`LogConfig::sync`]): the stream is the durable
    /// copy, and a replica that lost its tail in a crash follows it again.
    pub fn new(servers: Vec<String>, stream: impl Into<String>, mut replica: LogConfig) -> Self {
        replica.sync = false;
        JetStreamConfig {
            servers,
            stream: stream.into(),
            replicas: 3,
            replica,
            timeout: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(6),
            node: crate::lease::node_id(),
            publish_window: PUBLISH_WINDOW,
        }
    }
}

/// A log on a JetStream stream. Cheap to clone.
#[derive(Clone)]
pub struct JetStreamLog {
    inner: Arc<Inner>,
}

struct Inner {
    /// The node's one connection: appends publish on it, the follower follows on it. (Four
    /// connections, publishes taken in turn, measured slower: 3.5–3.7 k single appends/s from
    /// 16 clients against 4.2–4.3 k on one, the same for batches.)
    client: async_nats::Client,
    js: jetstream::Context,
    stream: String,
    prefix: String,
    replica: Log,
    timeout: Duration,
    /// When the replica last held everything the stream held at that moment (an append that
    /// finds this recent enough skips asking the stream for its head: any id published since
    /// is within the server's de-duplication window, which refuses it in the batch).
    caught_up: Mutex<Option<std::time::Instant>>,
    /// How recent that must be: a tenth of the stream's de-duplication window, at most 10 s.
    catch_up_every: Duration,
    /// The publish window, the batch slots and the per-subject turns ([`append`]).
    pipeline: Pipeline,
    /// What the replica takes, from this node's publishes and from the follower.
    feed: Arc<feed::Feed>,
    /// The time of this node's last batch (its batches' times never go back).
    last_at: AtomicI64,
    /// Runs the connection's and the follower's tasks: the runtime that opened the log when
    /// it has worker threads (a server's: an append then publishes from its own task, with no
    /// hop to another thread), else one of its own.
    handle: tokio::runtime::Handle,
    /// That runtime of its own, if any: what stops it, and its thread.
    own: Mutex<Option<OwnRuntime>>,
    /// Whether the log runs one of its own (a request then runs there, where the connection
    /// lives); fixed at open.
    runs_own: bool,
    /// The follower's task (stopped at close).
    follower: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// This node's leases on once-per-cluster work, and what stops their keeper.
    leases: crate::Leases,
    leases_stop: watch::Sender<bool>,
}

/// A runtime the log runs for itself when it was opened outside one with worker threads (the
/// CLI, tests): one worker thread.
struct OwnRuntime {
    handle: tokio::runtime::Handle,
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl OwnRuntime {
    fn start() -> Result<OwnRuntime, OpenError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tidemark-jetstream")
            .enable_all()
            .build()
            .map_err(|e| OpenError::Storage(StorageError::of(e)))?;
        let handle = rt.handle().clone();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tidemark-jetstream".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(|e| OpenError::Storage(StorageError::of(e)))?;
        Ok(OwnRuntime {
            handle,
            stop,
            thread,
        })
    }

    /// Stop the runtime and wait for its thread (blocking).
    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// The body of a message: the event as appended.
#[derive(Serialize, Deserialize)]
struct Body<'a> {
    /// Absent: the default tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<&'a str>,
    id: &'a str,
    stream: &'a str,
    subject: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    #[serde(borrow)]
    payload: &'a RawValue,
    /// The event's time when it is not the message's (an imported log keeps its times); the
    /// same on every message of a batch. Absent: the stream's time of the batch's commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at_us: Option<i64>,
}

/// Whether `s` is a server address the client takes (`nats://host:port`, `host:port`).
pub fn is_server_address(s: &str) -> bool {
    s.parse::<async_nats::ServerAddr>().is_ok()
}

fn cluster_err(what: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::from(format!("jetstream: {what}: {e}"))
}

fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim_start_matches('v').split(['-', '+']).next()?;
    let mut it = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((it.next()??, it.next()??, it.next()??))
}

impl JetStreamLog {
    /// Connect, check the server and the stream, open the replica and start following. Not
    /// from inside an async context (use `spawn_blocking`): it runs a runtime of its own.
    pub fn open(cfg: &JetStreamConfig) -> Result<JetStreamLog, OpenError> {
        let (handle, own) = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => (h, None),
            _ => {
                let own = OwnRuntime::start()?;
                (own.handle.clone(), Some(own))
            }
        };
        let opened = handle.block_on(async {
            let (client, js, stream, window) = Self::connect(cfg).await?;
            let bucket = Self::lease_bucket(&js, cfg).await?;
            Ok::<_, OpenError>((client, js, stream, window, bucket))
        });
        let (client, js, stream, window, bucket) = match opened {
            Ok(c) => c,
            Err(e) => {
                if let Some(own) = own {
                    own.stop();
                }
                return Err(e);
            }
        };
        let (leases_stop, stop_keeper) = watch::channel(false);
        let leases = crate::Leases::cluster(
            bucket,
            cfg.node.clone(),
            cfg.lease_ttl,
            &handle,
            stop_keeper,
        );
        let (replica, _) = Log::open(&cfg.replica)?;
        let feed = Arc::new(feed::Feed::new(replica.clone()));
        let inner = Arc::new(Inner {
            client: client.clone(),
            js,
            stream: cfg.stream.clone(),
            prefix: subject_prefix(&cfg.stream),
            replica: replica.clone(),
            timeout: cfg.timeout,
            caught_up: Mutex::new(None),
            catch_up_every: (window / 10).min(Duration::from_secs(10)),
            pipeline: Pipeline::new(cfg.publish_window),
            feed: feed.clone(),
            last_at: AtomicI64::new(0),
            handle: handle.clone(),
            runs_own: own.is_some(),
            own: Mutex::new(own),
            follower: Mutex::new(None),
            leases,
            leases_stop,
        });
        let follower = handle.spawn(follow::follow(stream, client, feed));
        *inner.follower.lock().unwrap_or_else(|p| p.into_inner()) = Some(follower);
        let log = JetStreamLog { inner };
        // Opened means every event the stream holds now is readable here.
        handle
            .block_on(async {
                // A request met during an election may go unanswered: ask up to three times.
                let mut r = log.catch_up(true).await;
                for _ in 0..2 {
                    if r.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    r = log.catch_up(true).await;
                }
                r
            })
            .map_err(|e| OpenError::Storage(cluster_err("catching up with the stream", e)))?;
        Ok(log)
    }

    async fn connect(
        cfg: &JetStreamConfig,
    ) -> Result<
        (
            async_nats::Client,
            jetstream::Context,
            stream::Stream,
            Duration,
        ),
        OpenError,
    > {
        let open = |what: &str, e: &dyn std::fmt::Display| OpenError::Storage(cluster_err(what, e));
        let addrs: Vec<async_nats::ServerAddr> = cfg
            .servers
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| open("a server address", &e))?;
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(cfg.timeout)
            .request_timeout(Some(cfg.timeout))
            .retry_on_initial_connect()
            .connect(addrs)
            .await
            .map_err(|e| open("connecting", &e))?;
        // The server's version is known once connected.
        let deadline = tokio::time::Instant::now() + cfg.timeout;
        while client.server_info().version.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let version = client.server_info().version;
        if version.is_empty() {
            return Err(OpenError::Storage(cluster_err(
                "connecting",
                format!(
                    "no server of {:?} answered within {:?}",
                    cfg.servers, cfg.timeout
                ),
            )));
        }
        match parse_version(&version) {
            Some(v) if v >= MIN_SERVER => {}
            _ => {
                return Err(OpenError::Storage(cluster_err(
                    "the server",
                    format!(
                        "nats-server {version:?} is too old: atomic batches with message ids \
                         need {}.{}.{} or newer",
                        MIN_SERVER.0, MIN_SERVER.1, MIN_SERVER.2
                    ),
                )));
            }
        }
        if parse_version(&version).is_some_and(|v| v < ONE_SYNC_PER_APPEND) {
            tracing::warn!(
                server = %version,
                "nats-server older than 2.15.0 syncs every message of a replicated stream once \
                 more besides its Raft log under sync_interval: always; 2.15.0 or newer is as \
                 durable and several times faster"
            );
        }
        let js = jetstream::ContextBuilder::new()
            .timeout(cfg.timeout)
            .build(client.clone());
        // Making a replicated stream and electing its leader can take longer than one request
        // may, and a request met during an election can go unanswered (a cluster just started
        // or just lost a node, a loaded machine): the open asks again, each time with the
        // request timeout, for up to 25 s.
        let open_wait = Duration::from_secs(25);
        let open_deadline = tokio::time::Instant::now() + open_wait;
        let stream = loop {
            let made = match js.get_stream(&cfg.stream).await {
                Ok(s) => Ok(s),
                Err(_) => js
                    .create_stream(stream::Config {
                        name: cfg.stream.clone(),
                        subjects: vec![format!("{}.>", subject_prefix(&cfg.stream))],
                        storage: stream::StorageType::File,
                        num_replicas: cfg.replicas,
                        allow_atomic_publish: true,
                        allow_direct: true,
                        duplicate_window: Duration::from_secs(120),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| e.to_string()),
            };
            match made {
                Ok(s) => break s,
                Err(e) if tokio::time::Instant::now() >= open_deadline => {
                    return Err(open(
                        &format!(
                            "opening stream {:?} with {} replicas (is there a quorum?)",
                            cfg.stream, cfg.replicas
                        ),
                        &e,
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        // A stream just made (or electing) has no leader yet: wait for one.
        let mut stream = stream;
        loop {
            let has_leader = match stream.info().await {
                Ok(i) => i.cluster.as_ref().is_none_or(|c| c.leader.is_some()),
                Err(_) => false,
            };
            if has_leader {
                break;
            }
            if tokio::time::Instant::now() >= open_deadline {
                return Err(OpenError::Storage(cluster_err(
                    "the stream",
                    format!("stream {:?} has no leader (no quorum?)", cfg.stream),
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !stream.cached_info().config.allow_atomic_publish {
            return Err(OpenError::Storage(cluster_err(
                "the stream",
                format!(
                    "stream {:?} does not allow atomic batch publish (allow_atomic): tidemark \
                     needs it for atomic batches",
                    cfg.stream
                ),
            )));
        }
        let window = stream.cached_info().config.duplicate_window;
        Ok((client, js, stream, window))
    }

    /// The leases bucket of the stream (`<stream>_leases`, entries expiring after the lease
    /// time), made if absent; asked again during an election, as the stream is.
    async fn lease_bucket(
        js: &jetstream::Context,
        cfg: &JetStreamConfig,
    ) -> Result<jetstream::kv::Store, OpenError> {
        let name = format!("{}_leases", cfg.stream);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(25);
        loop {
            let made = match js.get_key_value(&name).await {
                Ok(kv) => Ok(kv),
                Err(_) => js
                    .create_key_value(jetstream::kv::Config {
                        bucket: name.clone(),
                        history: 1,
                        max_age: cfg.lease_ttl,
                        storage: stream::StorageType::File,
                        num_replicas: cfg.replicas,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| e.to_string()),
            };
            match made {
                Ok(kv) => return Ok(kv),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(OpenError::Storage(cluster_err(
                        &format!("opening the leases bucket {name:?}"),
                        e,
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// This node's leases on once-per-cluster work.
    pub fn leases(&self) -> &crate::Leases {
        &self.inner.leases
    }

    /// The local replica (an embedded log following the stream).
    pub fn replica(&self) -> &Log {
        &self.inner.replica
    }

    /// The seq of `tenant`'s fence in this stream as the replica holds it (0: none), spec
    /// section 20: the tenant's events the stream ordered after it are void here.
    pub fn fence_of(&self, tenant: &str) -> Result<u64, StorageError> {
        let replica = &self.inner.replica;
        let seq = replica.last_of(
            None,
            crate::MOVE_FENCE_STREAM,
            &crate::fence_subject(tenant),
            replica.head(),
        )?;
        if seq == 0 {
            return Ok(0);
        }
        // The server's own event alone (its append is conditioned on the subject holding
        // nothing, so it is the subject's only event, and clients write no event on stream
        // `tenants`).
        let ev = crate::Lookups::get(replica, seq).map_err(StorageError::of)?;
        Ok(ev
            .filter(|e| e.tenant.is_none() && e.event_type == crate::MOVE_FENCE_TYPE)
            .map_or(0, |e| e.seq))
    }

    /// [`JetStreamLog::fence_of`] once the replica holds the stream's head as of now.
    pub async fn fence_now(&self, tenant: &str) -> Result<u64, AppendError> {
        self.catch_up(true).await?;
        self.fence_of(tenant).map_err(AppendError::Storage)
    }

    /// The stream's last sequence, asked of the cluster.
    async fn stream_last(&self) -> Result<u64, AppendError> {
        let inner = self.inner.clone();
        let r = self
            .run(async move {
                // Getting the stream is one info request: its answer holds the head.
                let s = inner.js.get_stream(&inner.stream).await?;
                Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(
                    s.cached_info().state.last_sequence,
                )
            })
            .await;
        match r {
            Ok(Ok(last)) => Ok(last),
            Ok(Err(e)) => Err(AppendError::Storage(cluster_err(
                "reading the stream's head",
                e,
            ))),
            Err(e) => Err(e),
        }
    }

    /// Run `f` on the backend's runtime, within the timeout.
    async fn run<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, AppendError> {
        let timeout = self.inner.timeout;
        let answer = if self.inner.runs_own {
            // The connection lives on the log's own runtime: the request runs there.
            match self
                .inner
                .handle
                .spawn(tokio::time::timeout(timeout, f))
                .await
            {
                Ok(r) => r,
                Err(e) => return Err(AppendError::Storage(StorageError::of(e))),
            }
        } else {
            tokio::time::timeout(timeout, f).await
        };
        answer.map_err(|_| {
            AppendError::Storage(cluster_err(
                "the cluster",
                format!("no answer within {timeout:?} (no quorum?)"),
            ))
        })
    }

    /// Wait until the replica holds `seq`.
    async fn replica_at(&self, seq: u64) -> Result<(), AppendError> {
        self.replica_reaches(seq, false).await
    }

    /// Wait until the replica holds `seq`: within the timeout, or while `progressing`, for as
    /// long as each timeout sees it advance (a node that joins a long stream follows it for
    /// minutes; one that stops advancing is an error).
    async fn replica_reaches(&self, seq: u64, progressing: bool) -> Result<(), AppendError> {
        let mut rx = self.inner.replica.subscribe();
        loop {
            let before = *rx.borrow();
            let waited = tokio::time::timeout(self.inner.timeout, rx.wait_for(|h| *h >= seq))
                .await
                .map(|r| r.is_ok());
            match waited {
                Ok(true) => return Ok(()),
                Ok(false) => return Err(AppendError::Closed),
                Err(_) if progressing && *rx.borrow() > before => continue,
                Err(_) => {
                    return Err(AppendError::Storage(cluster_err(
                        "the local replica",
                        format!(
                            "did not reach seq {seq} in {:?} (it holds {})",
                            self.inner.timeout,
                            *rx.borrow()
                        ),
                    )));
                }
            }
        }
    }

    /// Bring the replica up to the stream's head as of now, unless it was recently enough
    /// (and `force` is not set).
    async fn catch_up(&self, force: bool) -> Result<(), AppendError> {
        let recent = self
            .inner
            .caught_up
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() < self.inner.catch_up_every);
        if recent && !force {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let last = self.stream_last().await?;
        let behind = last.saturating_sub(self.inner.replica.head());
        if behind > 100_000 {
            tracing::info!(behind, stream_head = last, "the replica follows the stream");
        }
        self.replica_reaches(last, true).await?;
        *self
            .inner
            .caught_up
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(started);
        Ok(())
    }
}

fn subject_prefix(stream: &str) -> String {
    format!("tidemark.{}", hex::encode(stream))
}

/// The NATS subject of an event: one per (tenant, stream, subject), so that the server's
/// per-subject sequence is the condition's "last event of this stream with this subject".
/// The default tenant's have no tenant token (the subjects of a stream written before
/// tenants).
fn nats_subject(prefix: &str, tenant: Option<&str>, stream: &str, subject: &str) -> String {
    let tenant = tenant.map(|t| format!(".t{}", hex::encode(t)));
    format!(
        "{prefix}{}.s{}.j{}",
        tenant.unwrap_or_default(),
        hex::encode(stream),
        hex::encode(subject)
    )
}

impl JetStreamLog {
    /// An append, its events recorded at `at_us` when given (an import keeping its times)
    /// rather than at the stream's time of the commit.
    async fn append_at(
        &self,
        mut events: Vec<NewEvent>,
        condition: Condition,
        at_us: Option<i64>,
    ) -> Result<AppendReceipt, AppendError> {
        crate::envelope::prepare_batch(&mut events)?;
        // Conditional appends on one subject go one at a time on this node; others flow.
        let _turn = if condition.subjects.is_empty() {
            None
        } else {
            let tenant = events.first().and_then(|e| e.tenant.as_deref());
            let subjects = self.condition_subjects(tenant, &condition);
            Some(self.inner.pipeline.subjects_turn(subjects).await)
        };
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let mut pause = Duration::from_millis(10);
        for attempt in 0..64 {
            match self
                .append_once(&events, &condition, attempt > 0, at_us)
                .await
            {
                Ok(r) => return Ok(r),
                Err(Attempt::Final(e)) => return Err(e),
                Err(Attempt::Again) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(Attempt::Again) => break,
            }
        }
        Err(AppendError::Storage(cluster_err(
            "appending",
            "the batch could not be stored: the stream had no leader, or its events kept \
             meeting duplicates being published by another node",
        )))
    }
}

/// An import into the stream at exactly `first_seq..`, recorded at `at_us` (the source's
/// time; every node's replica records it so): what `tidemark log import` does on a cluster.
/// Anything else — a gap, an id already in the stream — is an error.
impl crate::transfer::ImportTarget for JetStreamLog {
    async fn import_batch(
        &self,
        events: Vec<NewEvent>,
        first_seq: u64,
        at_us: i64,
    ) -> Result<AppendReceipt, AppendError> {
        let n = events.len() as u64;
        let r = self
            .append_at(events, Condition::head(first_seq - 1), Some(at_us))
            .await?;
        crate::envelope::check_exact(r, first_seq, n, "the import")
    }
}

crate::lookups_through!(JetStreamLog, |j| &j.inner.replica);

impl EventLog for JetStreamLog {
    async fn append(&self, events: Vec<NewEvent>) -> Result<AppendReceipt, AppendError> {
        self.append_if(events, Condition::none()).await
    }

    async fn append_if(
        &self,
        events: Vec<NewEvent>,
        condition: Condition,
    ) -> Result<AppendReceipt, AppendError> {
        self.append_at(events, condition, None).await
    }

    fn read(&self, q: &ReadQuery) -> Result<ReadPage, ReadError> {
        self.inner.replica.read(q)
    }

    fn get_by_id(&self, tenant: Option<&str>, event_id: &str) -> Result<Option<Event>, ReadError> {
        self.inner.replica.get_by_id(tenant, event_id)
    }

    fn head(&self) -> u64 {
        self.inner.replica.head()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.replica.subscribe()
    }

    fn read_chunk(&self, after: u64, upto: u64, out: &mut EventChunk) -> Result<(), ReadError> {
        EventLog::read_chunk(&self.inner.replica, after, upto, out)
    }

    fn check_space(&self) -> Result<(), AppendError> {
        self.inner.replica.check_space()
    }

    fn free_bytes(&self) -> Option<u64> {
        EventLog::free_bytes(&self.inner.replica)
    }

    fn space(&self) -> Option<tokio::sync::watch::Receiver<crate::SpaceState>> {
        EventLog::space(&self.inner.replica)
    }

    fn is_poisoned(&self) -> bool {
        EventLog::is_poisoned(&self.inner.replica)
    }

    async fn compact(&self, _through: u64) -> Result<Compacted, AppendError> {
        Err(AppendError::Storage(
            "compaction of a JetStream log is not supported yet".into(),
        ))
    }

    async fn close(&self) {
        // Hand the leases over at once: stop renewing, then delete them.
        if !self.inner.leases_stop.send_replace(true) {
            let leases = self.inner.leases.clone();
            let _ = self
                .inner
                .handle
                .spawn(async move { leases.release().await })
                .await;
        }
        if let Some(f) = self
            .inner
            .follower
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            f.abort();
        }
        let own = self
            .inner
            .own
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(own) = own {
            let _ = tokio::task::spawn_blocking(move || own.stop()).await;
        }
        self.inner.replica.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_subjects() {
        assert_eq!(parse_version("2.12.8"), Some((2, 12, 8)));
        assert_eq!(parse_version("v2.12.3-beta.1"), Some((2, 12, 3)));
        assert!(parse_version("2.12.2").unwrap() < MIN_SERVER);
        assert!(parse_version("2.15.1").unwrap() >= MIN_SERVER);
        let p = subject_prefix("TIDEMARK");
        assert_eq!(nats_subject(&p, None, "a", ""), format!("{p}.s61.j"));
        assert_ne!(
            nats_subject(&p, None, "a.b", "c"),
            nats_subject(&p, None, "a", "b.c")
        );
        assert_eq!(
            nats_subject(&p, Some("b"), "a", ""),
            format!("{p}.t62.s61.j")
        );
    }
}
