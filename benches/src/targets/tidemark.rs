//! tidemark two ways: the `tidemark serve` binary as a child process over HTTP (what a client
//! sees), and the log in this process (what the storage engine alone costs).

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tidemark_log::{EventLog, LogConfig, NewEvent, ReadQuery};

use super::{Page, StartOpts, Target};
use crate::events::{BenchEvent, EVENT_TYPE, STREAM};
use crate::measure::Proc;
use crate::peers::{ChildServer, free_port, wait_until};

/// `tidemark serve` on a loopback port with a fresh data directory.
pub struct TidemarkHttp {
    server: ChildServer,
    base: String,
    client: reqwest::Client,
    /// Where appends go: `""` (the default tenant) and, on a server of several shards, a
    /// tenant of each other shard (`/tenants/s<n>`); connection i appends to the i-th, round.
    prefixes: Vec<String>,
    conns: std::sync::atomic::AtomicUsize,
}

impl TidemarkHttp {
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        if o.shards > 1 {
            return Self::start_sharded(o, o.shards).await;
        }
        Self::start_with(o, "tidemark-http", None).await
    }

    /// `tidemark serve` with `[log] shards = shards`, and a tenant in each shard but the home
    /// one (placed there by the directory: each new tenant goes to the shard with the
    /// fewest): the clients' appends are spread over the default tenant and them.
    pub async fn start_sharded(o: &StartOpts, shards: u32) -> Result<Self, String> {
        let mut t = Self::start_with(
            o,
            "tidemark-http",
            Some(format!("[log]\nshards = {shards}\n")),
        )
        .await?;
        t.tenant_per_shard(shards).await?;
        Ok(t)
    }

    /// A tenant `s<n>` in each shard n but the home one, and appends spread over them and
    /// the default tenant.
    pub async fn tenant_per_shard(&mut self, shards: u32) -> Result<(), String> {
        let t = self;
        for n in 1..shards {
            let name = format!("s{n}");
            let r = t
                .client
                .post(format!("{}/v1/tenants", t.base))
                .json(&serde_json::json!({"name": name, "reason": "benchmark"}))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = r.status();
            let body: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
            if !status.is_success() || body["shard"] != n {
                return Err(format!("creating tenant {name}: {status} {body}"));
            }
            t.prefixes.push(format!("/tenants/{name}"));
        }
        Ok(())
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.server.pid
    }

    /// `tidemark serve` with a configuration file of `config` (TOML), if any.
    pub async fn start_with(
        o: &StartOpts,
        name: &'static str,
        config: Option<String>,
    ) -> Result<Self, String> {
        Self::start_within(o, name, config, Duration::from_secs(60)).await
    }

    /// [`TidemarkHttp::start_with`], waiting up to `ready_within` for `/readyz` (a node
    /// joining a long stream opens once its replica holds the head).
    pub async fn start_within(
        o: &StartOpts,
        name: &'static str,
        config: Option<String>,
        ready_within: Duration,
    ) -> Result<Self, String> {
        let bin = o
            .tidemark_bin
            .clone()
            .ok_or("no tidemark binary (pass --tidemark-bin)")?;
        let dir = temp_dir_in(&o.work, "tidemark-http-")?;
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--data")
            .arg(dir.path().join("data"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TIDEMARK_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("RUST_LOG", "warn");
        if let Some(toml) = config {
            let path = dir.path().join("tidemark.toml");
            std::fs::write(&path, toml).map_err(|e| e.to_string())?;
            cmd.arg("--config").arg(path);
        }
        let mut server = ChildServer::spawn(name, cmd, dir, Signal::SIGTERM)?;
        let client = http_client()?;
        let base = format!("http://127.0.0.1:{port}");
        let ready = format!("{base}/readyz");
        wait_until(&mut server, ready_within, || {
            let (c, u) = (client.clone(), ready.clone());
            async move {
                match c.get(&u).send().await {
                    Ok(r) if r.status().is_success() => Ok(()),
                    Ok(r) => Err(format!("{u}: {}", r.status())),
                    Err(e) => Err(format!("{u}: {e}")),
                }
            }
        })
        .await?;
        Ok(TidemarkHttp {
            server,
            base,
            client,
            prefixes: vec![String::new()],
            conns: Default::default(),
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

pub fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| format!("HTTP client: {e}"))
}

pub fn temp_dir_in(work: &std::path::Path, prefix: &str) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(work)
        .map_err(|e| format!("cannot create a data directory in {}: {e}", work.display()))
}

/// One event as `POST /v1/events` takes it.
fn write_event_json(out: &mut String, e: &BenchEvent) {
    let _ = write!(
        out,
        r#"{{"event_id":"{}","stream":"{STREAM}","subject":"{}","type":"{EVENT_TYPE}","payload":{}}}"#,
        e.event_id, e.subject, e.payload
    );
}

pub fn http_body(events: &[BenchEvent]) -> Vec<u8> {
    let mut s = String::with_capacity(events.len() * 400 + 16);
    if let [one] = events {
        write_event_json(&mut s, one);
    } else {
        s.push_str(r#"{"events":["#);
        for (i, e) in events.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            write_event_json(&mut s, e);
        }
        s.push_str("]}");
    }
    s.into_bytes()
}

#[derive(serde::Deserialize)]
struct Receipt {
    events: Vec<Appended>,
}

#[derive(serde::Deserialize)]
struct Appended {
    duplicate: bool,
}

#[derive(serde::Deserialize)]
struct EventsPage {
    events: Vec<Box<serde_json::value::RawValue>>,
    next_after_sequence: u64,
}

impl Target for TidemarkHttp {
    /// Which of the prefixes the connection appends to.
    type Conn = usize;
    type Batch = Vec<u8>;
    type Pos = u64;

    fn name(&self) -> &'static str {
        "tidemark-http"
    }

    fn proc(&self) -> Proc {
        Proc::Tree(self.server.pid)
    }

    fn data_dir(&self) -> Option<&Path> {
        self.server.data_dir()
    }

    async fn connect(&self) -> Result<usize, String> {
        let i = self
            .conns
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(i % self.prefixes.len())
    }

    fn prepare(&self, events: &[BenchEvent]) -> Vec<u8> {
        http_body(events)
    }

    async fn append(&self, c: &mut usize, body: Vec<u8>) -> Result<(), String> {
        let url = format!("{}{}/v1/events", self.base, self.prefixes[*c]);
        let (status, body) = crate::http::post_json_body(&self.client, &url, body).await?;
        if status != reqwest::StatusCode::CREATED {
            return Err(format!(
                "POST /v1/events answered {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let receipt: Receipt = serde_json::from_slice(&body)
            .map_err(|e| format!("unexpected reply {}: {e}", String::from_utf8_lossy(&body)))?;
        if receipt.events.iter().any(|e| e.duplicate) {
            return Err("the server reported a duplicate event_id".into());
        }
        Ok(())
    }

    async fn read_from(&self, _: &mut usize, pos: &u64, limit: usize) -> Result<Page<u64>, String> {
        let url = format!("{}/v1/events?after_sequence={pos}&limit={limit}", self.base);
        let resp = get_ok(&self.client, &url).await?;
        let body = resp.bytes().await.map_err(|e| e.to_string())?;
        let page: EventsPage = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        Ok(Page {
            events: page.events.len(),
            bytes: body.len(),
            next: page.next_after_sequence,
        })
    }

    async fn stop(mut self) {
        self.server.stop();
    }
}

/// The events as the log takes them.
pub fn to_new_events(events: &[BenchEvent]) -> Vec<NewEvent> {
    events
        .iter()
        .map(|e| {
            let payload: serde_json::Value =
                serde_json::from_str(&e.payload).expect("benchmark payloads are JSON");
            NewEvent::new(
                Some(e.event_id.clone()),
                STREAM,
                e.subject.clone(),
                EVENT_TYPE,
                &payload,
            )
            .expect("benchmark events are valid")
        })
        .collect()
}

/// The engine opened in this process as the server opens it (no HTTP; every projection
/// following the log).
pub struct TidemarkInproc {
    engine: tidemark_engine::Engine,
    dir: Arc<tempfile::TempDir>,
}

impl TidemarkInproc {
    /// The engine as the server opens it: every projection following the log.
    pub async fn start(o: &StartOpts) -> Result<Self, String> {
        let dir = temp_dir_in(&o.work, "tidemark-inproc-")?;
        let cfg = LogConfig::new(dir.path().join("log.redb"));
        let (engine, _) = tidemark_engine::Engine::open(&cfg)
            .map_err(|e| format!("cannot open the engine: {e}"))?;
        Ok(TidemarkInproc {
            engine,
            dir: Arc::new(dir),
        })
    }

    /// The lowest checkpoint of the read models.
    fn folded(&self) -> u64 {
        self.engine
            .read()
            .projections()
            .map(|ps| ps.iter().map(|p| p.checkpoint).min().unwrap_or(0))
            .unwrap_or(0)
    }
}

impl Target for TidemarkInproc {
    type Conn = ();
    type Batch = Vec<NewEvent>;
    type Pos = u64;

    fn name(&self) -> &'static str {
        "tidemark-inproc"
    }

    fn proc(&self) -> Proc {
        Proc::This
    }

    fn data_dir(&self) -> Option<&Path> {
        Some(self.dir.path())
    }

    async fn connect(&self) -> Result<(), String> {
        Ok(())
    }

    fn prepare(&self, events: &[BenchEvent]) -> Vec<NewEvent> {
        to_new_events(events)
    }

    async fn append(&self, _: &mut (), batch: Vec<NewEvent>) -> Result<(), String> {
        let receipt = self
            .engine
            .log()
            .append(batch)
            .await
            .map_err(|e| e.to_string())?;
        if receipt.events.iter().any(|e| e.duplicate) {
            return Err("the log reported a duplicate event_id".into());
        }
        Ok(())
    }

    async fn follow_lag(&self) -> Option<super::FollowLag> {
        let head = self.engine.head();
        let lag_events = head.saturating_sub(self.folded());
        let started = std::time::Instant::now();
        while self.folded() < head && started.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Some(super::FollowLag {
            lag_events,
            catch_up_ms: started.elapsed().as_millis() as u64,
        })
    }

    async fn read_from(&self, _: &mut (), pos: &u64, limit: usize) -> Result<Page<u64>, String> {
        let log = self.engine.log().clone();
        let q = ReadQuery {
            after: *pos,
            limit,
            ..ReadQuery::default()
        };
        let page = tokio::task::spawn_blocking(move || log.read(&q))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(Page {
            events: page.events.len(),
            bytes: page.events.iter().map(|e| e.payload.get().len()).sum(),
            next: page.next_after,
        })
    }

    async fn stop(self) {
        self.engine.close().await;
    }
}

/// `GET url`, its answer when it is a success; an error naming the URL otherwise.
pub(crate) async fn get_ok(
    client: &reqwest::Client,
    url: &str,
) -> Result<reqwest::Response, String> {
    let resp = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("GET {url}: {}", resp.status()));
    }
    Ok(resp)
}
