//! Redis Streams: `redis-server` with AOF `appendfsync always` (it fsyncs the AOF before it
//! replies), one `XADD` per event on one stream key, a batch as one `MULTI … EXEC`.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use redis::aio::MultiplexedConnection;

use super::tidemark::temp_dir_in;
use super::{Page, StartOpts, Target};
use crate::events::{BenchEvent, EVENT_TYPE, STREAM};
use crate::measure::Proc;
use crate::peers::{ChildServer, free_port, wait_until};

const KEY: &str = "events";

pub struct Redis {
    server: ChildServer,
    client: redis::Client,
}

impl Redis {
    /// A client of the server (the queue workload's own commands).
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        let dir = temp_dir_in(&o.work, "redis-")?;
        let port = free_port()?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .arg("--dir")
            .arg(dir.path())
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
                "--maxclients",
                &(o.max_clients + 64).to_string(),
            ]);
        let mut server = ChildServer::spawn("redis", cmd, dir, Signal::SIGTERM)?;
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
        wait_until(&mut server, Duration::from_secs(30), || {
            let c = client.clone();
            async move {
                let mut con = c
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                redis::cmd("PING")
                    .query_async::<String>(&mut con)
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .await?;
        Ok(Redis { server, client })
    }
}

fn xadd(cmd: &mut redis::Cmd, e: &BenchEvent) {
    cmd.arg("XADD")
        .arg(KEY)
        .arg("*")
        .arg("event_id")
        .arg(&e.event_id)
        .arg("stream")
        .arg(STREAM)
        .arg("subject")
        .arg(&e.subject)
        .arg("type")
        .arg(EVENT_TYPE)
        .arg("payload")
        .arg(&e.payload);
}

pub enum RedisBatch {
    One(redis::Cmd),
    Many(redis::Pipeline),
}

impl Target for Redis {
    type Conn = MultiplexedConnection;
    type Batch = RedisBatch;
    /// The last stream entry id read ("0-0" at the start).
    type Pos = String;

    fn name(&self) -> &'static str {
        "redis"
    }

    fn proc(&self) -> Proc {
        Proc::Tree(self.server.pid)
    }

    fn data_dir(&self) -> Option<&std::path::Path> {
        self.server.data_dir()
    }

    async fn connect(&self) -> Result<MultiplexedConnection, String> {
        // The crate's default response timeout (500 ms) fails requests that queue behind
        // hundreds of clients; wait as long as the other clients do.
        let cfg = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(Duration::from_secs(120)));
        self.client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(|e| format!("redis connect: {e}"))
    }

    fn prepare(&self, events: &[BenchEvent]) -> RedisBatch {
        if let [one] = events {
            let mut c = redis::Cmd::new();
            xadd(&mut c, one);
            return RedisBatch::One(c);
        }
        let mut p = redis::pipe();
        p.atomic();
        for e in events {
            let mut c = redis::Cmd::new();
            xadd(&mut c, e);
            p.add_command(c);
        }
        RedisBatch::Many(p)
    }

    async fn append(&self, con: &mut MultiplexedConnection, b: RedisBatch) -> Result<(), String> {
        match b {
            RedisBatch::One(c) => c.query_async::<String>(con).await.map(|_| ()),
            RedisBatch::Many(p) => p.query_async::<Vec<String>>(con).await.map(|_| ()),
        }
        .map_err(|e| format!("XADD: {e}"))
    }

    async fn read_from(
        &self,
        con: &mut MultiplexedConnection,
        pos: &String,
        limit: usize,
    ) -> Result<Page<String>, String> {
        let start = if pos.is_empty() {
            "-".to_owned()
        } else {
            format!("({pos}")
        };
        let entries: Vec<(String, Vec<redis::Value>)> = redis::cmd("XRANGE")
            .arg(KEY)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(limit)
            .query_async(con)
            .await
            .map_err(|e| format!("XRANGE: {e}"))?;
        let bytes = entries
            .iter()
            .flat_map(|(_, f)| f.iter())
            .map(|v| match v {
                redis::Value::BulkString(b) => b.len(),
                _ => 0,
            })
            .sum();
        Ok(Page {
            events: entries.len(),
            bytes,
            next: entries
                .last()
                .map(|(id, _)| id.clone())
                .unwrap_or_else(|| pos.clone()),
        })
    }

    async fn stop(mut self) {
        self.server.stop();
    }
}
