//! The JetStream backend (spec section 16): the log is one JetStream stream on a NATS cluster;
//! its stream sequence is `event_seq`.
//!
//! # Shape
//! - **Appends** go to the cluster: one atomic batch publish per append (`Nats-Batch-Id`,
//!   `-Sequence`, `-Commit`; at most [`crate::limits::BATCH_MAX_EVENTS`] = the server's 1,000), each
//!   event a message on a NATS subject derived from its stream and subject
//!   (`<prefix>.s<hex stream>.j<hex subject>`), its body the event's id, names and payload.
//!   Acknowledged means the commit's publish acknowledgement: stored on a quorum (and synced
//!   where the servers run `sync_interval: always`).
//! - **Reads** are served by a local replica: an embedded [`Log`] that follows the stream (an
//!   ordered consumer from its head on) and appends each message at exactly its stream
//!   sequence with the stream's time ([`Log::replicate`]). Pages, lookups by id, filters,
//!   chunks for the folds and the commit notifier are the embedded log's. An append is
//!   answered once the replica holds it (read-your-writes on this node).
//! - **Idempotency stays exact forever (I2).** Before it publishes, an append catches the
//!   replica up to the stream's last sequence and looks its ids up there: an id already in the
//!   log is answered as a duplicate with its original seq (or refused as a conflict), whatever
//!   its age. Every message also carries `Nats-Msg-Id` = its event id, so two nodes publishing
//!   the same id at once are told apart by the server's window; a batch that meets a duplicate
//!   fails whole and is decided again against the caught-up replica.
//! - **Conditions.** The head condition is `Nats-Expected-Last-Sequence` on the first message;
//!   a subject the batch writes is checked by `Nats-Expected-Last-Subject-Sequence` on its first
//!   message. A subject the batch only reads is checked on the caught-up replica and then held
//!   by `Nats-Expected-Last-Sequence` = the replica's head (nothing appended since the check).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::{oneshot, watch};

use crate::condition::Condition;
use crate::embedded::{Log, LogConfig};
use crate::envelope::{Event, NewEvent};
use crate::error::{AppendError, OpenError, ReadError, StorageError};
mod follow;

use crate::{AppendReceipt, Appended, Compacted, EventChunk, EventLog, ReadPage, ReadQuery};

/// The oldest server with what this backend needs: atomic batches with message ids inside
/// them, and the fixes of 2.12.1–2.12.3.
pub const MIN_SERVER: (u64, u64, u64) = (2, 12, 3);

/// Atomic batches one node has in flight at once. The server keeps at most 50 open batches per
/// stream and refuses more ("atomic publish batch is incomplete"); a burst above this waits
/// here instead (three nodes stay under the server's bound).
pub const BATCHES_IN_FLIGHT: usize = 16;

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
        }
    }
}

/// A log on a JetStream stream. Cheap to clone.
#[derive(Clone)]
pub struct JetStreamLog {
    inner: Arc<Inner>,
}

struct Inner {
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
    /// Bounds the atomic batches in flight ([`BATCHES_IN_FLIGHT`]).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Runs the connection's and the follower's tasks.
    handle: tokio::runtime::Handle,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// This node's leases on once-per-cluster work, and what stops their keeper.
    leases: crate::Leases,
    leases_stop: watch::Sender<bool>,
}

/// The body of a message: the event as appended.
#[derive(Serialize, Deserialize)]
struct Body<'a> {
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
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tidemark-jetstream")
            .enable_all()
            .build()
            .map_err(|e| OpenError::Storage(StorageError::of(e)))?;
        let handle = rt.handle().clone();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tidemark-jetstream".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(|e| OpenError::Storage(StorageError::of(e)))?;
        let opened = handle.block_on(Self::connect(cfg));
        let (client, js, stream, window) = match opened {
            Ok(c) => c,
            Err(e) => {
                let _ = stop_tx.send(());
                let _ = thread.join();
                return Err(e);
            }
        };
        let bucket = match handle.block_on(Self::lease_bucket(&js, cfg)) {
            Ok(b) => b,
            Err(e) => {
                let _ = stop_tx.send(());
                let _ = thread.join();
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
        let inner = Arc::new(Inner {
            client: client.clone(),
            js,
            stream: cfg.stream.clone(),
            prefix: subject_prefix(&cfg.stream),
            replica: replica.clone(),
            timeout: cfg.timeout,
            caught_up: Mutex::new(None),
            catch_up_every: (window / 10).min(Duration::from_secs(10)),
            in_flight: Arc::new(tokio::sync::Semaphore::new(BATCHES_IN_FLIGHT)),
            handle: handle.clone(),
            stop: Mutex::new(Some(stop_tx)),
            thread: Mutex::new(Some(thread)),
            leases,
            leases_stop,
        });
        handle.spawn(follow::follow(stream, client, replica));
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

    /// The first part of `condition` that does not hold on the replica, as the embedded log
    /// reports it: the head, then each subject in order.
    /// The condition judged at one point of the replica: the head it was judged at, and the
    /// part that failed there, if any. The head is what the publish then holds (a batch the
    /// replica took in after the judgment must not pass as judged).
    fn judge(&self, condition: &Condition) -> Result<(u64, Option<AppendError>), AppendError> {
        let replica = &self.inner.replica;
        // One point of the replica: the head, and each subject as of that head (a batch
        // replicated between the reads is not half seen).
        let head = replica.head();
        let failed = crate::condition::first_failed(condition, head, |stream, subject| {
            replica
                .last_of(stream, subject, head)
                .map_err(AppendError::Storage)
        })?;
        Ok((head, failed))
    }

    /// What a batch the server refused means: a condition that no longer holds (judged again
    /// on the caught-up replica, for the exact answer), a duplicate being published elsewhere
    /// or a condition that holds again (decide again), or a fault.
    async fn refused(&self, e: ApiError, condition: &Condition) -> Attempt {
        let d = e.description.to_ascii_lowercase();
        if d.contains("duplicate") {
            return Attempt::Again;
        }
        if d.contains("wrong last") {
            if let Err(e) = self.catch_up(true).await {
                return Attempt::Final(e);
            }
            return match self.judge(condition) {
                Ok((_, Some(failed))) => Attempt::Final(failed),
                Ok((_, None)) => Attempt::Again,
                Err(e) => Attempt::Final(e),
            };
        }
        Attempt::storage(cluster_err(
            "the batch was refused",
            format!("{} (code {})", e.description, e.err_code),
        ))
    }

    /// The local replica (an embedded log following the stream).
    pub fn replica(&self) -> &Log {
        &self.inner.replica
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
        match self
            .inner
            .handle
            .spawn(tokio::time::timeout(timeout, f))
            .await
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(AppendError::Storage(cluster_err(
                "the cluster",
                format!("no answer within {timeout:?} (no quorum?)"),
            ))),
            Err(e) => Err(AppendError::Storage(StorageError::of(e))),
        }
    }

    /// Wait until the replica holds `seq`.
    async fn replica_at(&self, seq: u64) -> Result<(), AppendError> {
        let mut rx = self.inner.replica.subscribe();
        let wait = rx.wait_for(|h| *h >= seq);
        match tokio::time::timeout(self.inner.timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(AppendError::Closed),
            Err(_) => Err(AppendError::Storage(cluster_err(
                "the local replica",
                format!("did not reach seq {seq} in {:?}", self.inner.timeout),
            ))),
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
        self.replica_at(last).await?;
        *self
            .inner
            .caught_up
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(started);
        Ok(())
    }

    async fn append_once(
        &self,
        events: &[NewEvent],
        condition: &Condition,
        force: bool,
        at_us: Option<i64>,
    ) -> Result<AppendReceipt, Attempt> {
        // Everything committed before the last catch-up is in the replica: its ids are known
        // exactly; anything published since is within the server's window.
        self.catch_up(force).await?;
        let replica = &self.inner.replica;
        let mut results: Vec<Option<Appended>> = Vec::with_capacity(events.len());
        let mut fresh: Vec<&NewEvent> = Vec::new();
        let mut in_batch: HashMap<&str, usize> = HashMap::new();
        for ev in events {
            let id = ev.event_id.as_deref().unwrap_or_default();
            if let Some(&i) = in_batch.get(id) {
                if !fresh[i].same_as(ev) {
                    return Err(Attempt::Final(AppendError::Conflict {
                        event_id: id.to_owned(),
                        seq: 0,
                    }));
                }
                results.push(None);
                continue;
            }
            match replica.get_by_id(id).map_err(read_err)? {
                Some(orig) if ev.same_content(&orig) => results.push(Some(Appended {
                    event_id: id.to_owned(),
                    seq: orig.seq,
                    duplicate: true,
                })),
                Some(orig) => {
                    return Err(Attempt::Final(AppendError::Conflict {
                        event_id: id.to_owned(),
                        seq: orig.seq,
                    }));
                }
                None => {
                    in_batch.insert(id, fresh.len());
                    fresh.push(ev);
                    results.push(None);
                }
            }
        }
        if fresh.is_empty() {
            // A resend of an append that succeeded: its duplicates, whatever the condition.
            return Ok(AppendReceipt {
                events: results.into_iter().flatten().collect(),
                last_seq: replica.head(),
            });
        }
        // The condition judged on the caught-up replica, as the embedded log judges it (the
        // exact refusal); the headers below hold it against whatever lands meanwhile.
        let (head, failed) = self.judge(condition)?;
        if let Some(failed) = failed {
            // A replica caught up a while ago may be behind: judge again on a fresh one
            // before refusing.
            return Err(if force {
                Attempt::Final(failed)
            } else {
                Attempt::Again
            });
        }
        let subject_of: Vec<String> = fresh
            .iter()
            .map(|e| nats_subject(&self.inner.prefix, &e.stream, &e.subject))
            .collect();
        let mut checks: Vec<Option<u64>> = vec![None; fresh.len()];
        let mut hold_head = condition.head;
        for c in &condition.subjects {
            let want = nats_subject(&self.inner.prefix, &c.stream, &c.subject);
            match subject_of.iter().position(|s| *s == want) {
                Some(i) => checks[i] = Some(c.last_seq),
                // Only read: judged above, held by the head.
                None => hold_head = Some(head),
            }
        }
        let batch_id = uuid::Uuid::now_v7().simple().to_string();
        let n = fresh.len();
        let mut msgs = Vec::with_capacity(n);
        for (i, ev) in fresh.iter().enumerate() {
            let mut h = HeaderMap::new();
            h.insert("Nats-Batch-Id", batch_id.as_str());
            h.insert("Nats-Batch-Sequence", (i + 1).to_string().as_str());
            h.insert("Nats-Msg-Id", ev.event_id.as_deref().unwrap_or_default());
            if i == 0
                && let Some(s) = hold_head
            {
                h.insert("Nats-Expected-Last-Sequence", s.to_string().as_str());
            }
            if let Some(last) = checks[i] {
                h.insert(
                    "Nats-Expected-Last-Subject-Sequence",
                    last.to_string().as_str(),
                );
            }
            if i + 1 == n {
                h.insert("Nats-Batch-Commit", "1");
            }
            let body = serde_json::to_vec(&Body {
                id: ev.event_id.as_deref().unwrap_or_default(),
                stream: &ev.stream,
                subject: &ev.subject,
                event_type: &ev.event_type,
                payload: ev.payload_raw(),
                at_us,
            })
            .map_err(|e| Attempt::storage(StorageError::of(e)))?;
            msgs.push((subject_of[i].clone(), h, body));
        }
        let client = self.inner.client.clone();
        // A slot among the node's batches in flight, waited for outside the request's timeout
        // (a burst queues here; each batch then has the whole timeout).
        let _slot = self
            .inner
            .in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| Attempt::storage(StorageError::of(e)))?;
        let answer = self
            .run(async move {
                let mut msgs = msgs.into_iter();
                let Some(mut cur) = msgs.next() else {
                    return Err("an empty batch".to_string());
                };
                for next in msgs {
                    client
                        .publish_with_headers(cur.0, cur.1, cur.2.into())
                        .await
                        .map_err(|e| e.to_string())?;
                    cur = next;
                }
                let reply = client
                    .request_with_headers(cur.0, cur.1, cur.2.into())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(reply.payload)
            })
            .await?
            .map_err(|e| {
                if e.contains("no responders") {
                    // The stream has no leader this moment (just made, or electing): nothing
                    // of the batch was stored; try again with a new batch.
                    Attempt::Again
                } else {
                    Attempt::Final(AppendError::Storage(cluster_err("publishing", e)))
                }
            })?;
        let ack: PubAck = serde_json::from_slice(&answer)
            .map_err(|e| Attempt::storage(cluster_err("the publish acknowledgement", e)))?;
        if let Some(err) = ack.error {
            return Err(self.refused(err, condition).await);
        }
        let last = ack.seq;
        if ack.count != Some(n as u64) || last < n as u64 {
            return Err(Attempt::storage(cluster_err(
                "the publish acknowledgement",
                format!(
                    "{n} events acknowledged as {:?} ending at {last}",
                    ack.count
                ),
            )));
        }
        let first = last + 1 - n as u64;
        self.replica_at(last).await?;
        let mut k = 0;
        let out = events
            .iter()
            .zip(results)
            .map(|(ev, r)| {
                r.unwrap_or_else(|| {
                    let id = ev.event_id.clone().unwrap_or_default();
                    let i = in_batch[id.as_str()];
                    let dup = i < k;
                    k = k.max(i + 1);
                    Appended {
                        event_id: id,
                        seq: first + i as u64,
                        duplicate: dup,
                    }
                })
            })
            .collect();
        Ok(AppendReceipt {
            events: out,
            last_seq: last,
        })
    }
}

/// One attempt's failure: final, or worth deciding again (a duplicate met in the batch).
enum Attempt {
    Final(AppendError),
    Again,
}

impl Attempt {
    fn storage(e: StorageError) -> Attempt {
        Attempt::Final(AppendError::Storage(e))
    }
}

impl From<AppendError> for Attempt {
    fn from(e: AppendError) -> Self {
        Attempt::Final(e)
    }
}

fn read_err(e: ReadError) -> Attempt {
    Attempt::storage(StorageError::of(e))
}

#[derive(Deserialize)]
struct PubAck {
    #[serde(default)]
    seq: u64,
    #[serde(default)]
    count: Option<u64>,
    #[serde(default)]
    error: Option<ApiError>,
}

#[derive(Deserialize, Debug)]
struct ApiError {
    #[serde(default)]
    err_code: u64,
    #[serde(default)]
    description: String,
}

fn subject_prefix(stream: &str) -> String {
    format!("tidemark.{}", hex::encode(stream))
}

/// The NATS subject of an event: one per (stream, subject), so that the server's per-subject
/// sequence is the condition's "last event of this stream with this subject".
fn nats_subject(prefix: &str, stream: &str, subject: &str) -> String {
    format!(
        "{prefix}.s{}.j{}",
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

    fn get(&self, seq: u64) -> Result<Option<Event>, ReadError> {
        self.inner.replica.get(seq)
    }

    fn get_by_id(&self, event_id: &str) -> Result<Option<Event>, ReadError> {
        self.inner.replica.get_by_id(event_id)
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

    fn first_seq(&self) -> Result<u64, StorageError> {
        self.inner.replica.first_seq()
    }

    fn last_before(&self, before_us: i64) -> Result<u64, StorageError> {
        self.inner.replica.last_before(before_us)
    }

    fn next_of(
        &self,
        stream: &str,
        subject: &str,
        after: u64,
    ) -> Result<Option<u64>, StorageError> {
        self.inner.replica.next_of(stream, subject, after)
    }

    fn check_space(&self) -> Result<(), AppendError> {
        self.inner.replica.check_space()
    }

    fn free_bytes(&self) -> Option<u64> {
        EventLog::free_bytes(&self.inner.replica)
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
        if let Some(tx) = self
            .inner
            .stop
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = tx.send(());
        }
        let t = self
            .inner
            .thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(t) = t {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
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
        assert_eq!(nats_subject(&p, "a", ""), format!("{p}.s61.j"));
        assert_ne!(nats_subject(&p, "a.b", "c"), nats_subject(&p, "a", "b.c"));
    }
}
