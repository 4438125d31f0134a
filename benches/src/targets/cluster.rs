//! A three-node NATS JetStream cluster on loopback for the benchmark (spec section 16): each
//! server a child of the benchmark with `sync_interval: always`, ports chosen free; and the two
//! systems measured on it, NATS's own publish to a three-replica stream (`nats-cluster`) and
//! `tidemark serve` with `[log] backend = "jetstream"` (`tidemark-jetstream`).

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::nats::Nats;
use super::tidemark::{TidemarkHttp, temp_dir_in};
use super::{Page, Pipelined, StartOpts, Target};
use crate::events::BenchEvent;
use crate::measure::Proc;
use crate::peers::{ChildServer, free_port, wait_until};

/// Three `nats-server` processes in one cluster.
pub struct NatsCluster {
    pub servers: Vec<ChildServer>,
    pub urls: Vec<String>,
}

impl NatsCluster {
    pub async fn start(o: &StartOpts) -> Result<NatsCluster, String> {
        let ports: Vec<(u16, u16)> = (0..3)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_, String>>()?;
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, r)| format!("nats-route://127.0.0.1:{r}"))
            .collect();
        let mut servers = Vec::new();
        let mut urls = Vec::new();
        for (n, (client, route)) in ports.iter().enumerate() {
            let dir = temp_dir_in(&o.work, "nats-cluster-")?;
            let conf = dir.path().join("nats.conf");
            std::fs::write(
                &conf,
                format!(
                    "server_name: n{n}\nlisten: 127.0.0.1:{client}\nmax_payload: 8MB\n\
                     max_connections: {}\njetstream {{\n  store_dir: {:?}\n  \
                     sync_interval: always\n}}\ncluster {{\n  name: bench\n  \
                     listen: 127.0.0.1:{route}\n  routes: [{}]\n}}\n",
                    o.max_clients + 64,
                    dir.path().join("js").display().to_string(),
                    routes.join(", ")
                ),
            )
            .map_err(|e| e.to_string())?;
            let mut cmd = Command::new("nats-server");
            cmd.arg("-c").arg(&conf);
            servers.push(ChildServer::spawn("nats", cmd, dir, Signal::SIGTERM)?);
            urls.push(format!("nats://127.0.0.1:{client}"));
        }
        // Ready once a three-replica stream can be made (the cluster has a meta leader).
        let probe_url = urls[0].clone();
        wait_until(&mut servers[0], Duration::from_secs(60), || {
            let u = probe_url.clone();
            async move {
                let c = async_nats::connect(&u).await.map_err(|e| e.to_string())?;
                let js = async_nats::jetstream::new(c);
                js.get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: "READY".into(),
                    subjects: vec!["ready.>".into()],
                    num_replicas: 3,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
                js.delete_stream("READY").await.map_err(|e| e.to_string())?;
                Ok(())
            }
        })
        .await?;
        Ok(NatsCluster { servers, urls })
    }

    pub fn pids(&self) -> [u32; 3] {
        [
            self.servers[0].pid,
            self.servers[1].pid,
            self.servers[2].pid,
        ]
    }

    pub fn stop(&mut self) {
        for s in &mut self.servers {
            s.stop();
        }
    }
}

/// The `[log]` of a node on `cluster`: the stream `BENCH` (and `BENCH_s<n>` for each further
/// shard), three replicas.
pub fn jetstream_config(cluster: &NatsCluster, shards: u32) -> String {
    let servers: Vec<String> = cluster.urls.iter().map(|u| format!("{u:?}")).collect();
    format!(
        "[log]\nbackend = \"jetstream\"\nservers = [{}]\nstream = \"BENCH\"\nreplicas = 3\n\
         shards = {}\n",
        servers.join(", "),
        shards.max(1)
    )
}

/// `tidemark serve` on the cluster: the HTTP target, its CPU counted with the cluster's.
pub struct TidemarkJetStream {
    http: TidemarkHttp,
    cluster: NatsCluster,
    /// The node's configuration file, which another node on the same stream shares.
    config: String,
    start: StartOpts,
}

impl TidemarkJetStream {
    /// With `--shards` above 1, the node's `[log] shards` (a stream per shard) and a tenant
    /// in each shard, appends spread over them as on one node.
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        let cluster = NatsCluster::start(o).await?;
        let config = jetstream_config(&cluster, o.shards);
        let mut http =
            TidemarkHttp::start_with(o, "tidemark-jetstream", Some(config.clone())).await?;
        if o.shards > 1 {
            http.tenant_per_shard(o.shards).await?;
        }
        Ok(TidemarkJetStream {
            http,
            cluster,
            config,
            start: o.clone(),
        })
    }

    /// The first node, started with the target.
    pub fn node(&self) -> &TidemarkHttp {
        &self.http
    }

    /// Another `tidemark serve` on the same cluster and stream, with a data directory of its
    /// own: its replica is built from the stream, and it answers ready once that holds the
    /// head, which it is given `ready_within` to do. The caller stops it.
    pub async fn another_node(&self, ready_within: Duration) -> Result<TidemarkHttp, String> {
        TidemarkHttp::start_within(
            &self.start,
            "tidemark-jetstream-node",
            Some(self.config.clone()),
            ready_within,
        )
        .await
    }

    /// The three NATS servers' counters.
    pub fn nats_proc(&self) -> Proc {
        let [a, b, c] = self.cluster.pids();
        Proc::Trees([a, b, c, 0])
    }
}

impl Target for TidemarkJetStream {
    type Conn = usize;
    type Batch = Vec<u8>;
    type Pos = u64;

    fn name(&self) -> &'static str {
        "tidemark-jetstream"
    }

    fn proc(&self) -> Proc {
        let [a, b, c] = self.cluster.pids();
        Proc::Trees([self.http.pid(), a, b, c])
    }

    /// The HTTP node's; the cluster's directories are beside it, in the same work directory.
    fn data_dir(&self) -> Option<&std::path::Path> {
        self.http.data_dir()
    }

    async fn connect(&self) -> Result<usize, String> {
        self.http.connect().await
    }

    fn prepare(&self, events: &[BenchEvent]) -> Vec<u8> {
        self.http.prepare(events)
    }

    async fn append(&self, c: &mut usize, body: Vec<u8>) -> Result<(), String> {
        self.http.append(c, body).await
    }

    async fn read_from(&self, c: &mut usize, pos: &u64, limit: usize) -> Result<Page<u64>, String> {
        self.http.read_from(c, pos, limit).await
    }

    async fn stop(mut self) {
        self.http.stop().await;
        self.cluster.stop();
    }
}

/// NATS's own publish on the cluster: the `nats` target on a three-replica stream.
pub struct NatsOnCluster {
    nats: Nats,
    cluster: NatsCluster,
}

impl NatsOnCluster {
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        let cluster = NatsCluster::start(o).await?;
        let nats = Nats::on(cluster.urls[0].clone(), 3).await?;
        Ok(NatsOnCluster { nats, cluster })
    }
}

impl Target for NatsOnCluster {
    type Conn = <Nats as Target>::Conn;
    type Batch = <Nats as Target>::Batch;
    type Pos = u64;

    fn name(&self) -> &'static str {
        "nats-cluster"
    }

    fn proc(&self) -> Proc {
        let [a, b, c] = self.cluster.pids();
        Proc::Trees([a, b, c, 0])
    }

    /// The first server's; the others' are beside it, in the same work directory.
    fn data_dir(&self) -> Option<&std::path::Path> {
        self.cluster.servers.first().and_then(|s| s.data_dir())
    }

    async fn connect(&self) -> Result<Self::Conn, String> {
        self.nats.connect().await
    }

    fn prepare(&self, events: &[BenchEvent]) -> Self::Batch {
        self.nats.prepare(events)
    }

    async fn append(&self, c: &mut Self::Conn, b: Self::Batch) -> Result<(), String> {
        self.nats.append(c, b).await
    }

    async fn read_from(
        &self,
        c: &mut Self::Conn,
        pos: &u64,
        limit: usize,
    ) -> Result<Page<u64>, String> {
        self.nats.read_from(c, pos, limit).await
    }

    async fn stop(mut self) {
        self.cluster.stop();
    }
}

impl Pipelined for NatsOnCluster {
    type Ack = <Nats as Pipelined>::Ack;

    async fn send(&self, c: &mut Self::Conn, b: Self::Batch) -> Result<Self::Ack, String> {
        self.nats.send(c, b).await
    }

    fn open_limit(&self, batch: usize) -> Option<std::sync::Arc<tokio::sync::Semaphore>> {
        self.nats.open_limit(batch)
    }
}
