//! NATS JetStream: a file-storage stream with `sync_interval: always` (the server fsyncs before
//! it acknowledges a publish); one message per event on `ev.<stream>.<subject>` with
//! `Nats-Msg-Id` = event_id (JetStream's duplicate window); a batch of more than one event is
//! one atomic batch publish (ADR-50, server 2.12+): intermediate messages carry the batch id and
//! sequence, the last one `Nats-Batch-Commit`, and its acknowledgement covers the batch.
//! Reading back uses an ordered consumer.
//!
//! The server keeps at most [`MAX_OPEN_BATCHES`] atomic batches open per stream and refuses more
//! ("atomic publish batch is incomplete"), so every client of one target shares one semaphore of
//! that many permits, held from a batch's first message to its acknowledgement. A client either
//! awaits each publish's acknowledgement before the next ([`Target::append`], the closed loop) or
//! keeps a window of them in flight ([`Pipelined::send`], as NATS users publish asynchronously).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use tokio::sync::Semaphore;

use super::tidemark::temp_dir_in;
use super::{Page, Pipelined, StartOpts, Target};
use crate::events::{BenchEvent, EVENT_TYPE, STREAM};
use crate::measure::Proc;
use crate::peers::{ChildServer, free_port, wait_until};

const STREAM_NAME: &str = "TIDEMARK";

/// Atomic batches the server keeps open per stream (`max_batch_inflight_per_stream`, 50 by
/// default); one more is refused, and the batch with it.
pub const MAX_OPEN_BATCHES: usize = 50;

/// The largest window of publishes in flight per client (`--nats-window`): the JetStream
/// context of each connection is built to hold this many acknowledgements pending, so its own
/// bound never throttles the window.
pub const MAX_WINDOW: usize = 4096;

pub struct Nats {
    /// The server this target started (none on a cluster started by the caller).
    server: Option<ChildServer>,
    url: String,
    batch_ids: AtomicU64,
    /// Permits for atomic batches open at once, shared by every client ([`MAX_OPEN_BATCHES`]).
    open_batches: Arc<Semaphore>,
}

pub struct NatsConn {
    client: async_nats::Client,
    js: jetstream::Context,
    /// The ordered consumer of the current read-back, and the seq it has read up to.
    reader: Option<(u64, consumer::pull::Ordered)>,
}

impl Nats {
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        let dir = temp_dir_in(&o.work, "nats-")?;
        let port = free_port()?;
        let conf = dir.path().join("nats.conf");
        let store = dir.path().join("js");
        std::fs::write(
            &conf,
            format!(
                "listen: 127.0.0.1:{port}\nmax_payload: 8MB\nmax_connections: {}\n\
                 jetstream {{\n  store_dir: {:?}\n  sync_interval: always\n}}\n",
                o.max_clients + 64,
                store.display().to_string()
            ),
        )
        .map_err(|e| e.to_string())?;
        let mut cmd = Command::new("nats-server");
        cmd.arg("-c").arg(&conf);
        let mut server = ChildServer::spawn("nats", cmd, dir, Signal::SIGTERM)?;
        let url = format!("nats://127.0.0.1:{port}");
        let client = wait_until(&mut server, Duration::from_secs(30), || {
            let u = url.clone();
            async move {
                async_nats::connect(&u)
                    .await
                    .map_err(|e| format!("nats connect: {e}"))
            }
        })
        .await?;
        let mut nats = Nats::on_client(client, url, 1).await?;
        nats.server = Some(server);
        Ok(nats)
    }

    /// The target on servers started elsewhere (a cluster): a stream of `replicas`.
    pub async fn on(url: String, replicas: usize) -> Result<Self, String> {
        let client = async_nats::connect(&url)
            .await
            .map_err(|e| format!("nats connect: {e}"))?;
        Nats::on_client(client, url, replicas).await
    }

    async fn on_client(
        client: async_nats::Client,
        url: String,
        replicas: usize,
    ) -> Result<Self, String> {
        let js = jetstream::new(client);
        js.create_stream(stream::Config {
            name: STREAM_NAME.into(),
            subjects: vec!["ev.>".into()],
            storage: stream::StorageType::File,
            allow_atomic_publish: true,
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create stream: {e}"))?;
        Ok(Nats {
            server: None,
            url,
            batch_ids: AtomicU64::new(0),
            open_batches: Arc::new(Semaphore::new(MAX_OPEN_BATCHES)),
        })
    }
}

pub struct NatsBatch {
    /// (subject, headers, payload) per event.
    msgs: Vec<(String, HeaderMap, Bytes)>,
}

impl Nats {
    /// The server's URL (the queue workload opens its own connections).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Publish a batch and return its acknowledgement unawaited. Intermediate messages of an
    /// atomic batch go without a reply subject; the commit message's acknowledgement says
    /// whether the whole batch was stored.
    async fn publish(&self, c: &mut NatsConn, b: NatsBatch) -> Result<PublishAckFuture, String> {
        let mut msgs = b.msgs;
        let (subject, headers, payload) = msgs.pop().ok_or("an empty batch")?;
        for (s, h, p) in msgs {
            c.client
                .publish_with_headers(s, h, p)
                .await
                .map_err(|e| format!("publish: {e}"))?;
        }
        c.js.publish_with_headers(subject, headers, payload)
            .await
            .map_err(|e| format!("publish: {e}"))
    }
}

/// A publish's acknowledgement, a duplicate refused as an error.
async fn acknowledged(ack: PublishAckFuture) -> Result<(), String> {
    let ack = ack.await.map_err(|e| format!("publish ack: {e}"))?;
    if ack.duplicate {
        return Err("JetStream reported a duplicate Nats-Msg-Id".into());
    }
    Ok(())
}

impl Target for Nats {
    type Conn = NatsConn;
    type Batch = NatsBatch;
    /// The last stream sequence read.
    type Pos = u64;

    fn name(&self) -> &'static str {
        "nats"
    }

    fn proc(&self) -> Proc {
        Proc::Tree(self.server.as_ref().map_or(0, |s| s.pid))
    }

    fn data_dir(&self) -> Option<&std::path::Path> {
        self.server.as_ref().and_then(ChildServer::data_dir)
    }

    async fn connect(&self) -> Result<NatsConn, String> {
        let client = async_nats::connect(&self.url)
            .await
            .map_err(|e| format!("nats connect: {e}"))?;
        Ok(NatsConn {
            // The default 5 s acknowledgement timeout fails cells where hundreds of batches
            // queue at the server; wait as long as the other clients do (the HTTP client's
            // 120 s), so the cell measures instead of erroring.
            js: jetstream::ContextBuilder::new()
                .timeout(Duration::from_secs(120))
                .max_ack_inflight(MAX_WINDOW)
                .build(client.clone()),
            client,
            reader: None,
        })
    }

    fn prepare(&self, events: &[BenchEvent]) -> NatsBatch {
        let batch_id = (events.len() > 1).then(|| {
            format!(
                "b{}-{}",
                std::process::id(),
                self.batch_ids.fetch_add(1, Ordering::Relaxed)
            )
        });
        let msgs = events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut h = HeaderMap::new();
                h.insert("Nats-Msg-Id", e.event_id.as_str());
                h.insert("Tidemark-Type", EVENT_TYPE);
                if let Some(id) = &batch_id {
                    h.insert("Nats-Batch-Id", id.as_str());
                    h.insert("Nats-Batch-Sequence", (i + 1).to_string().as_str());
                    if i + 1 == events.len() {
                        h.insert("Nats-Batch-Commit", "1");
                    }
                }
                (
                    format!("ev.{STREAM}.{}", e.subject),
                    h,
                    Bytes::from(e.payload.clone().into_bytes()),
                )
            })
            .collect();
        NatsBatch { msgs }
    }

    async fn append(&self, c: &mut NatsConn, b: NatsBatch) -> Result<(), String> {
        // One client holds at most one permit, so waiting for one never blocks its own.
        let _open = match b.msgs.len() {
            0 => return Ok(()),
            1 => None,
            _ => Some(
                self.open_batches
                    .acquire()
                    .await
                    .map_err(|e| format!("open batches: {e}"))?,
            ),
        };
        acknowledged(self.publish(c, b).await?).await
    }

    async fn read_from(
        &self,
        c: &mut NatsConn,
        pos: &u64,
        limit: usize,
    ) -> Result<Page<u64>, String> {
        let reader = match c.reader.take() {
            Some((at, r)) if at == *pos => r,
            _ => {
                let stream =
                    c.js.get_stream(STREAM_NAME)
                        .await
                        .map_err(|e| format!("get stream: {e}"))?;
                stream
                    .create_consumer(consumer::pull::OrderedConfig {
                        deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                            start_sequence: pos + 1,
                        },
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| format!("ordered consumer: {e}"))?
                    .messages()
                    .await
                    .map_err(|e| format!("ordered consumer: {e}"))?
            }
        };
        let mut reader = reader;
        let (mut events, mut bytes, mut next) = (0, 0, *pos);
        while events < limit {
            // The end of the stream: nothing more for a while (the read-back asks only for
            // events it appended, so this is an error path, not the normal end).
            let Ok(item) = tokio::time::timeout(Duration::from_secs(10), reader.next()).await
            else {
                break;
            };
            let Some(msg) = item else { break };
            let msg = msg.map_err(|e| format!("ordered consumer: {e}"))?;
            next = msg
                .info()
                .map_err(|e| format!("message info: {e}"))?
                .stream_sequence;
            bytes += msg.payload.len();
            events += 1;
        }
        c.reader = Some((next, reader));
        Ok(Page {
            events,
            bytes,
            next,
        })
    }

    async fn stop(mut self) {
        if let Some(s) = &mut self.server {
            s.stop();
        }
    }
}

impl Pipelined for Nats {
    type Ack = BoxFuture<'static, Result<(), String>>;

    async fn send(&self, c: &mut NatsConn, b: NatsBatch) -> Result<Self::Ack, String> {
        let ack = self.publish(c, b).await?;
        Ok(Box::pin(acknowledged(ack)))
    }

    fn open_limit(&self, batch: usize) -> Option<Arc<Semaphore>> {
        (batch > 1).then(|| self.open_batches.clone())
    }
}
