//! The delivery path beside the work queues users build (spec section 11, the `queue`
//! workload): N items enqueued (not timed), then W workers each claiming up to B items with a
//! lease and reporting them done, every claim and every completion durable before its answer,
//! until the N are done:
//!
//! - tidemark over HTTP: `notification.requested` (urgent: one `app` delivery each), then
//!   `POST /v1/deliveries/claim` and `POST /v1/deliveries/{id}/complete` (B = 1) or the batch
//!   `POST /v1/deliveries/complete`;
//! - Redis Streams consumer groups: `XADD`, then `XREADGROUP … COUNT B` and one `XACK` of the
//!   batch (AOF `appendfsync always`);
//! - PostgreSQL 15: `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED) RETURNING`, then
//!   one done `UPDATE` of the batch (`synchronous_commit = on`);
//! - NATS JetStream: a work-queue stream, a durable pull consumer with explicit acks, a fetch
//!   of B and an acknowledged ack (`double_ack`) of each, all in flight at once (sync always:
//!   the fetch itself is not synced, only the ack).
//!
//! Per cell: items/s, per item the time from its claim's start to its completion's answer
//! (p50/p99), the server's CPU, the block device's bytes and the context switches of the
//! server's threads per item. Beside it, tidemark alone: `route` and `deliver`
//! ([`crate::deliver`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};

use crate::http::{get_json, notification_requested, post_ok, send};
use crate::measure::{
    BlockDevice, Counters, Percentiles, Proc, clock_ticks, new_histogram, round1, round3,
};
use crate::targets::StartOpts;
use crate::targets::nats::Nats;
use crate::targets::postgres::Postgres;
use crate::targets::redis::Redis;
use crate::targets::tidemark::{TidemarkHttp, http_client};

/// The configuration the tidemark server of the queue cells runs with: the outbox bound above
/// any cell, leases longer than a cell.
pub(crate) const TIDEMARK_CONFIG: &str = "[notifications.outbox]\nmax_pending = 10000000\n\
    [notifications.retry]\nlease_ttl = \"10m\"\n";

/// How long a claim's lease lasts in every system (longer than a cell).
const LEASE: Duration = Duration::from_secs(600);

/// One cell of the queue workload.
#[derive(Serialize, Clone, serde::Deserialize, Debug)]
pub struct QueueCell {
    pub system: String,
    pub workers: usize,
    pub batch: usize,
    /// Items enqueued before the cell, and how long the enqueue took (not timed in the cell).
    pub enqueued: u64,
    pub enqueue_seconds: f64,
    /// Items claimed and completed in the timed run.
    pub items: u64,
    pub seconds: f64,
    pub items_per_sec: f64,
    /// Per item: its claim's start to its completion's answer.
    pub latency_us: Percentiles,
    pub cpu_us_per_item: f64,
    pub device_bytes_per_item: Option<f64>,
    pub device: String,
    pub ctx_switches_per_item: f64,
    pub error: Option<String>,
}

/// One system's queue, as the workers use it.
pub trait Queue: Send + Sync + 'static {
    type Conn: Send + 'static;
    type Item: Send + 'static;

    fn name(&self) -> &'static str;
    fn proc(&self) -> Proc;
    fn data_dir(&self) -> Option<&Path>;
    fn connect(&self) -> impl Future<Output = Result<Self::Conn, String>> + Send;
    /// A fresh queue of `n` items for cell `cell`, each claimable when this returns.
    fn enqueue(&self, cell: usize, n: u64) -> impl Future<Output = Result<(), String>> + Send;
    /// Lease up to `max` items of cell `cell` to `worker`, durably; empty when none is left.
    fn claim(
        &self,
        c: &mut Self::Conn,
        cell: usize,
        worker: &str,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Self::Item>, String>> + Send;
    /// Report the items done, durably.
    fn complete(
        &self,
        c: &mut Self::Conn,
        cell: usize,
        worker: &str,
        items: Vec<Self::Item>,
    ) -> impl Future<Output = Result<(), String>> + Send;
    fn stop(self) -> impl Future<Output = ()> + Send;
}

/// One queue cell: enqueue `items`, then `workers` workers claim batches of `batch` until every
/// item is done or `seconds` pass.
pub async fn queue_cell<Q: Queue>(
    q: &Arc<Q>,
    cell: usize,
    workers: usize,
    batch: usize,
    items: u64,
    seconds: f64,
) -> QueueCell {
    let mut out = QueueCell {
        system: q.name().to_owned(),
        workers,
        batch,
        enqueued: items,
        enqueue_seconds: 0.0,
        items: 0,
        seconds: 0.0,
        items_per_sec: 0.0,
        latency_us: Percentiles::default(),
        cpu_us_per_item: 0.0,
        device_bytes_per_item: None,
        device: String::new(),
        ctx_switches_per_item: 0.0,
        error: None,
    };
    let started = Instant::now();
    if let Err(e) = q.enqueue(cell, items).await {
        out.error = Some(format!("enqueue: {e}"));
        return out;
    }
    out.enqueue_seconds = round3(started.elapsed().as_secs_f64());
    let mut conns = Vec::with_capacity(workers);
    for _ in 0..workers {
        match q.connect().await {
            Ok(c) => conns.push(c),
            Err(e) => {
                out.error = Some(format!("connect: {e}"));
                return out;
            }
        }
    }
    let proc = q.proc();
    let device = match q.data_dir() {
        Some(dir) => BlockDevice::of(dir),
        None => Err("no data directory".to_owned()),
    };
    out.device = match &device {
        Ok(d) => d.name.clone(),
        Err(why) => format!("n/a: {why}"),
    };
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let before: Counters = proc.counters();
    let dev_before = device.as_ref().ok().and_then(BlockDevice::written_bytes);
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(workers);
    for (w, mut conn) in conns.into_iter().enumerate() {
        let (q, done) = (q.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            let mut hist = new_histogram();
            loop {
                if Instant::now() >= deadline || done.load(Ordering::Relaxed) >= items {
                    return Ok::<_, String>(hist);
                }
                let sent = Instant::now();
                let claimed = q.claim(&mut conn, cell, &worker, batch).await?;
                if claimed.is_empty() {
                    return Ok(hist);
                }
                let n = claimed.len() as u64;
                q.complete(&mut conn, cell, &worker, claimed).await?;
                let took = crate::measure::micros(sent.elapsed());
                for _ in 0..n {
                    let _ = hist.record(took.max(1));
                }
                done.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    let mut hist: Histogram<u64> = new_histogram();
    for t in tasks {
        match t.await {
            Ok(Ok(h)) => {
                let _ = hist.add(h);
            }
            Ok(Err(e)) => out.error = Some(e),
            Err(e) => out.error = Some(format!("worker: {e}")),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let used = proc.counters().since(before);
    let dev_after = device.as_ref().ok().and_then(BlockDevice::written_bytes);
    let n = done.load(Ordering::Relaxed);
    let per = n.max(1) as f64;
    out.items = n;
    out.seconds = round3(secs);
    out.items_per_sec = (n as f64 / secs.max(1e-9)).round();
    out.latency_us = Percentiles::from(&hist);
    out.cpu_us_per_item = round1(used.cpu_ticks as f64 / clock_ticks() * 1e6 / per);
    if let (Some(a), Some(b)) = (dev_before, dev_after) {
        out.device_bytes_per_item = Some((b.saturating_sub(a) as f64 / per).round());
    }
    out.ctx_switches_per_item = round3(used.ctx_switches as f64 / per);
    out
}

// ---------------------------------------------------------------------------------------------
// tidemark

/// tidemark's outbox over HTTP. With `--shards` above 1, the queue is spread over the
/// default tenant and a tenant in each other shard (each with a route to the `app` sink of its
/// own), and worker i claims and completes its tenant's (the i-th, round).
pub struct TidemarkQueue {
    server: TidemarkHttp,
    tenants: Vec<String>,
    workers: AtomicU64,
    /// On `tidemark-jetstream`: the three NATS servers the node's log is on.
    cluster: Option<crate::targets::cluster::NatsCluster>,
}

impl TidemarkQueue {
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        let shards = o.shards.max(1);
        let config = format!("{TIDEMARK_CONFIG}[log]\nshards = {shards}\n");
        let server = TidemarkHttp::start_with(o, "tidemark-http", Some(config)).await?;
        Self::on(server, None, shards).await
    }

    /// The same queue on a node of a three-server NATS cluster (a stream per shard).
    pub async fn start_jetstream(o: &StartOpts) -> Result<Self, String> {
        let cluster = crate::targets::cluster::NatsCluster::start(o).await?;
        let config = format!(
            "{TIDEMARK_CONFIG}{}",
            crate::targets::cluster::jetstream_config(&cluster, o.shards)
        );
        let server = TidemarkHttp::start_with(o, "tidemark-jetstream", Some(config)).await?;
        Self::on(server, Some(cluster), o.shards.max(1)).await
    }

    async fn on(
        server: TidemarkHttp,
        cluster: Option<crate::targets::cluster::NatsCluster>,
        shards: u32,
    ) -> Result<Self, String> {
        let mut tenants = vec![String::new()];
        for n in 1..shards {
            let (base, client) = (server.base(), server.client());
            let name = format!("s{n}");
            post_ok(
                client,
                &format!("{base}/v1/tenants"),
                &json!({"name": name, "reason": "benchmark"}),
                "create a tenant",
            )
            .await?;
            let prefix = format!("/tenants/{name}");
            let r = client
                .put(format!("{base}{prefix}/v1/routes/app"))
                .json(&json!({"route": {"sink": "app"}, "reason": "benchmark"}))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !r.status().is_success() {
                return Err(format!("the route of {name}: {}", r.status()));
            }
            tenants.push(prefix);
        }
        Ok(TidemarkQueue {
            server,
            tenants,
            workers: AtomicU64::new(0),
            cluster,
        })
    }

    fn base_of(&self, tenant: usize) -> String {
        format!("{}{}", self.server.base(), self.tenants[tenant])
    }
}

/// `n` urgent notifications of cell `cell` (`q<cell>-<i>`), appended by 4 clients in batches
/// of 500; returns once the server answered every append.
pub(crate) async fn append_notifications(
    base: &str,
    client: &reqwest::Client,
    prefix: &str,
    n: u64,
    payload: impl Fn(u64) -> Value + Send + Sync + 'static,
) -> Result<(), String> {
    let payload = Arc::new(payload);
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (next, client, url, prefix, payload) = (
            next.clone(),
            client.clone(),
            format!("{base}/v1/events"),
            prefix.to_owned(),
            payload.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                // 500 a batch: on a cluster a batch of notifications holds at most 999.
                let from = next.fetch_add(500, Ordering::Relaxed);
                if from >= n {
                    return Ok::<(), String>(());
                }
                let events: Vec<Value> = (from..(from + 500).min(n))
                    .map(|i| notification_requested(&format!("{prefix}-{i}"), payload(i)))
                    .collect();
                post_ok(&client, &url, &json!({ "events": events }), "append").await?;
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Waits (at most `limit`) until the `app` sink has at least `n` queued deliveries.
pub(crate) async fn wait_queued(
    base: &str,
    client: &reqwest::Client,
    n: u64,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let v = get_json(client, &format!("{base}/v1/outbox/kpis")).await?;
        let queued = v["by_sink"]["app"]["queued"].as_u64().unwrap_or(0);
        if queued >= n {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{queued} of {n} deliveries queued after {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Queue for TidemarkQueue {
    type Conn = (reqwest::Client, usize);
    type Item = String;

    fn name(&self) -> &'static str {
        match self.cluster {
            None => "tidemark-http",
            Some(_) => "tidemark-jetstream",
        }
    }

    /// The server's, and on a cluster the three NATS servers' with it.
    fn proc(&self) -> Proc {
        match &self.cluster {
            None => Proc::Tree(self.server.pid()),
            Some(c) => {
                let [a, b, n] = c.pids();
                Proc::Trees([self.server.pid(), a, b, n])
            }
        }
    }

    fn data_dir(&self) -> Option<&Path> {
        crate::targets::Target::data_dir(&self.server)
    }

    async fn connect(&self) -> Result<(reqwest::Client, usize), String> {
        let i = self.workers.fetch_add(1, Ordering::Relaxed) as usize;
        Ok((http_client()?, i % self.tenants.len()))
    }

    async fn enqueue(&self, cell: usize, n: u64) -> Result<(), String> {
        // Each tenant its share of the items (the first ones one more when they do not split).
        let t = self.tenants.len() as u64;
        for k in 0..t {
            let share = n / t + u64::from(k < n % t);
            let (base, client) = (self.base_of(k as usize), self.server.client());
            append_notifications(
                &base,
                client,
                &format!("q{cell}"),
                share,
                |i| json!({"priority": "urgent", "title": format!("item {i}")}),
            )
            .await?;
            wait_queued(&base, client, share, Duration::from_secs(300)).await?;
        }
        Ok(())
    }

    async fn claim(
        &self,
        (c, tenant): &mut (reqwest::Client, usize),
        _cell: usize,
        worker: &str,
        max: usize,
    ) -> Result<Vec<String>, String> {
        let url = format!("{}/v1/deliveries/claim", self.base_of(*tenant));
        let body = json!({"sink": "app", "owner": worker, "limit": max,
                          "lease_ms": LEASE.as_millis() as u64});
        let r = send(c.post(url).json(&body), "claim").await?;
        let status = r.status();
        let v: Value = r.json().await.map_err(|e| format!("claim: {e}"))?;
        if !status.is_success() {
            return Err(format!("claim: {status} {v}"));
        }
        Ok(v["deliveries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["id"].as_str().map(str::to_owned))
            .collect())
    }

    async fn complete(
        &self,
        (c, tenant): &mut (reqwest::Client, usize),
        _cell: usize,
        worker: &str,
        items: Vec<String>,
    ) -> Result<(), String> {
        let base = self.base_of(*tenant);
        let (url, body) = if let [one] = items.as_slice() {
            let url = format!("{base}/v1/deliveries/{}/complete", one.replace(':', "%3A"));
            (url, json!({ "owner": worker }))
        } else {
            let ds: Vec<Value> = items.iter().map(|id| json!({ "id": id })).collect();
            let url = format!("{base}/v1/deliveries/complete");
            (url, json!({ "owner": worker, "deliveries": ds }))
        };
        post_ok(c, &url, &body, "complete").await
    }

    async fn stop(self) {
        crate::targets::Target::stop(self.server).await;
        if let Some(mut c) = self.cluster {
            c.stop();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Redis Streams consumer groups

pub struct RedisQueue {
    redis: Redis,
}

impl RedisQueue {
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        Ok(RedisQueue {
            redis: Redis::start(o).await?,
        })
    }
}

fn redis_key(cell: usize) -> String {
    format!("queue{cell}")
}

impl Queue for RedisQueue {
    type Conn = redis::aio::MultiplexedConnection;
    type Item = String;

    fn name(&self) -> &'static str {
        "redis"
    }

    fn proc(&self) -> Proc {
        crate::targets::Target::proc(&self.redis)
    }

    fn data_dir(&self) -> Option<&Path> {
        crate::targets::Target::data_dir(&self.redis)
    }

    async fn connect(&self) -> Result<Self::Conn, String> {
        crate::targets::Target::connect(&self.redis).await
    }

    async fn enqueue(&self, cell: usize, n: u64) -> Result<(), String> {
        let mut con = self.connect().await?;
        let key = redis_key(cell);
        let mut i = 0;
        while i < n {
            let mut p = redis::pipe();
            for j in i..(i + 1000).min(n) {
                p.cmd("XADD")
                    .arg(&key)
                    .arg("*")
                    .arg("body")
                    .arg(format!("item {j}"))
                    .ignore();
            }
            p.query_async::<()>(&mut con)
                .await
                .map_err(|e| format!("XADD: {e}"))?;
            i += 1000;
        }
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg("workers")
            .arg("0")
            .query_async::<String>(&mut con)
            .await
            .map_err(|e| format!("XGROUP CREATE: {e}"))?;
        Ok(())
    }

    async fn claim(
        &self,
        c: &mut Self::Conn,
        cell: usize,
        worker: &str,
        max: usize,
    ) -> Result<Vec<String>, String> {
        let v: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("workers")
            .arg(worker)
            .arg("COUNT")
            .arg(max)
            .arg("STREAMS")
            .arg(redis_key(cell))
            .arg(">")
            .query_async(c)
            .await
            .map_err(|e| format!("XREADGROUP: {e}"))?;
        // [[key, [[id, [field, value]] …]]] (RESP2), or nil when nothing is left.
        let mut ids = Vec::new();
        if let redis::Value::Array(streams) = v {
            for s in streams {
                let redis::Value::Array(kv) = s else { continue };
                let Some(redis::Value::Array(entries)) = kv.into_iter().nth(1) else {
                    continue;
                };
                for e in entries {
                    let redis::Value::Array(parts) = e else {
                        continue;
                    };
                    if let Some(redis::Value::BulkString(id)) = parts.into_iter().next() {
                        ids.push(String::from_utf8_lossy(&id).into_owned());
                    }
                }
            }
        }
        Ok(ids)
    }

    async fn complete(
        &self,
        c: &mut Self::Conn,
        cell: usize,
        _worker: &str,
        items: Vec<String>,
    ) -> Result<(), String> {
        let mut cmd = redis::cmd("XACK");
        cmd.arg(redis_key(cell)).arg("workers");
        for id in &items {
            cmd.arg(id);
        }
        let acked: u64 = cmd.query_async(c).await.map_err(|e| format!("XACK: {e}"))?;
        if acked != items.len() as u64 {
            return Err(format!("XACK acknowledged {acked} of {}", items.len()));
        }
        Ok(())
    }

    async fn stop(self) {
        crate::targets::Target::stop(self.redis).await;
    }
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL: SKIP LOCKED

pub struct PostgresQueue {
    pg: Postgres,
}

impl PostgresQueue {
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        let pg = Postgres::start(o).await?;
        pg.client()
            .await?
            .batch_execute(
                "CREATE TABLE queue (id bigserial PRIMARY KEY, cell int NOT NULL, body text NOT NULL,
                   status smallint NOT NULL DEFAULT 0, owner text, lease_until timestamptz);
                 CREATE INDEX queue_ready ON queue (cell, id) WHERE status = 0;",
            )
            .await
            .map_err(|e| format!("queue schema: {e}"))?;
        Ok(PostgresQueue { pg })
    }
}

/// A worker's connection with its two statements prepared.
pub struct PgWorker {
    client: tokio_postgres::Client,
    claim: tokio_postgres::Statement,
    done: tokio_postgres::Statement,
}

impl Queue for PostgresQueue {
    type Conn = PgWorker;
    type Item = i64;

    fn name(&self) -> &'static str {
        "postgres"
    }

    fn proc(&self) -> Proc {
        crate::targets::Target::proc(&self.pg)
    }

    fn data_dir(&self) -> Option<&Path> {
        crate::targets::Target::data_dir(&self.pg)
    }

    async fn connect(&self) -> Result<PgWorker, String> {
        let client = self.pg.client().await?;
        let claim = client
            .prepare(
                "UPDATE queue SET status = 1, owner = $1,
                   lease_until = now() + interval '600 seconds'
                 WHERE id IN (SELECT id FROM queue WHERE cell = $2 AND status = 0 ORDER BY id
                              LIMIT $3 FOR UPDATE SKIP LOCKED)
                 RETURNING id",
            )
            .await
            .map_err(|e| e.to_string())?;
        let done = client
            .prepare("UPDATE queue SET status = 2 WHERE id = ANY($1) AND owner = $2")
            .await
            .map_err(|e| e.to_string())?;
        Ok(PgWorker {
            client,
            claim,
            done,
        })
    }

    async fn enqueue(&self, cell: usize, n: u64) -> Result<(), String> {
        let c = self.pg.client().await?;
        c.execute(
            "INSERT INTO queue (cell, body) SELECT $1, 'item ' || g FROM generate_series(1, $2) g",
            &[&(cell as i32), &(n as i32)],
        )
        .await
        .map_err(|e| format!("enqueue: {e}"))?;
        c.batch_execute("ANALYZE queue")
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    async fn claim(
        &self,
        c: &mut PgWorker,
        cell: usize,
        worker: &str,
        max: usize,
    ) -> Result<Vec<i64>, String> {
        let rows = c
            .client
            .query(&c.claim, &[&worker, &(cell as i32), &(max as i64)])
            .await
            .map_err(|e| format!("claim: {e}"))?;
        Ok(rows.iter().map(|r| r.get::<_, i64>(0)).collect())
    }

    async fn complete(
        &self,
        c: &mut PgWorker,
        _cell: usize,
        worker: &str,
        items: Vec<i64>,
    ) -> Result<(), String> {
        let n = c
            .client
            .execute(&c.done, &[&items, &worker])
            .await
            .map_err(|e| format!("done: {e}"))?;
        if n != items.len() as u64 {
            return Err(format!("done updated {n} of {}", items.len()));
        }
        Ok(())
    }

    async fn stop(self) {
        crate::targets::Target::stop(self.pg).await;
    }
}

// ---------------------------------------------------------------------------------------------
// NATS JetStream: a work-queue stream and a durable pull consumer

pub struct NatsQueue {
    nats: Nats,
}

impl NatsQueue {
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        Ok(NatsQueue {
            nats: Nats::start(o).await?,
        })
    }
}

/// A worker's connection and the cell's consumer.
pub struct NatsWorker {
    js: jetstream::Context,
    consumer: Option<(usize, consumer::Consumer<consumer::pull::Config>)>,
}

fn nats_stream(cell: usize) -> String {
    format!("QUEUE{cell}")
}

impl Queue for NatsQueue {
    type Conn = NatsWorker;
    type Item = jetstream::Message;

    fn name(&self) -> &'static str {
        "nats"
    }

    fn proc(&self) -> Proc {
        crate::targets::Target::proc(&self.nats)
    }

    fn data_dir(&self) -> Option<&Path> {
        crate::targets::Target::data_dir(&self.nats)
    }

    async fn connect(&self) -> Result<NatsWorker, String> {
        let client = async_nats::connect(self.nats.url())
            .await
            .map_err(|e| format!("nats connect: {e}"))?;
        Ok(NatsWorker {
            js: jetstream::ContextBuilder::new()
                .timeout(Duration::from_secs(120))
                .build(client),
            consumer: None,
        })
    }

    async fn enqueue(&self, cell: usize, n: u64) -> Result<(), String> {
        let w = self.connect().await?;
        let name = nats_stream(cell);
        let subject = format!("queue.{cell}");
        w.js.create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create stream: {e}"))?;
        let mut acks = Vec::new();
        for i in 0..n {
            acks.push(
                w.js.publish(subject.clone(), format!("item {i}").into())
                    .await
                    .map_err(|e| format!("publish: {e}"))?,
            );
            if acks.len() >= 1000 {
                for a in acks.drain(..) {
                    a.await.map_err(|e| format!("publish ack: {e}"))?;
                }
            }
        }
        for a in acks {
            a.await.map_err(|e| format!("publish ack: {e}"))?;
        }
        let s =
            w.js.get_stream(&name)
                .await
                .map_err(|e| format!("get stream: {e}"))?;
        s.create_consumer(consumer::pull::Config {
            durable_name: Some("workers".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: LEASE,
            max_ack_pending: 1_000_000,
            max_batch: 1000,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create consumer: {e}"))?;
        Ok(())
    }

    async fn claim(
        &self,
        c: &mut NatsWorker,
        cell: usize,
        _worker: &str,
        max: usize,
    ) -> Result<Vec<jetstream::Message>, String> {
        use futures::StreamExt as _;
        if c.consumer.as_ref().is_none_or(|(at, _)| *at != cell) {
            let s =
                c.js.get_stream(nats_stream(cell))
                    .await
                    .map_err(|e| format!("get stream: {e}"))?;
            let consumer = s
                .get_consumer("workers")
                .await
                .map_err(|e| format!("get consumer: {e}"))?;
            c.consumer = Some((cell, consumer));
        }
        let (_, consumer) = c.consumer.as_ref().expect("set above");
        let mut batch = consumer
            .fetch()
            .max_messages(max)
            .messages()
            .await
            .map_err(|e| format!("fetch: {e}"))?;
        let mut out = Vec::with_capacity(max);
        while let Some(m) = batch.next().await {
            out.push(m.map_err(|e| format!("fetch: {e}"))?);
        }
        Ok(out)
    }

    async fn complete(
        &self,
        _c: &mut NatsWorker,
        _cell: usize,
        _worker: &str,
        items: Vec<jetstream::Message>,
    ) -> Result<(), String> {
        let acks = items.iter().map(|m| m.double_ack());
        for r in futures::future::join_all(acks).await {
            r.map_err(|e| format!("ack: {e}"))?;
        }
        Ok(())
    }

    async fn stop(self) {
        crate::targets::Target::stop(self.nats).await;
    }
}

// ---------------------------------------------------------------------------------------------
