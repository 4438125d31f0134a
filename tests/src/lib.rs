//! Harness of the end-to-end tests: the real `tidemark` binary, started on port 0 with its own
//! data directory, driven over HTTP, SSE and its CLI.
//!
//! # Layout
//! - [`ServerOpts`]: how to start a server (listen address, config file text, environment).
//! - [`Server`]: one child process and its temp dir. Start, `kill -9`, SIGTERM, restart on the
//!   same data (optionally with another environment or config file), memory of the process,
//!   and the log head seen when the process came up ([`Server::start_head`]: a fresh server's
//!   log is not empty, it starts with the `settings.updated` event the server records).
//!   Dropping it kills the child, so a failing test never leaks a server. It derefs to [`Api`].
//! - [`Api`]: a cheap, cloneable HTTP handle for tasks (append, reads, paging, SSE).
//! - [`SseStream`]: an SSE reader over `reqwest::Response::bytes_stream`, with bounded waits.
//! - [`run_cli`]: runs a CLI subcommand with stdin and a bounded wait; [`cli_command`] builds
//!   one (or a shell pipeline around it) for a test that drives its pipes itself.
//!
//! Every wait here is bounded: a server that does not come up, does not exit or stops sending
//! fails the test with a message instead of hanging it. No wait is an assertion on speed.

#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::StatusCode;
use serde_json::Value;

/// How long a server may take to print its `listening on` line: a node on a JetStream cluster
/// that was just restarted may wait out an election (up to 25 s for its stream, then catching
/// up) on a machine busy with the rest of the suite.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound of one ordinary HTTP request (never asserted, only to avoid hanging).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How to start a server.
#[derive(Debug, Clone)]
pub struct ServerOpts {
    /// `--listen`; `127.0.0.1:0` unless changed.
    pub listen: String,
    /// Text of a TOML config file passed with `--config`, when set.
    pub config: Option<String>,
    /// Extra environment of the child. `TIDEMARK_*` and `RUST_LOG` of the test process are not
    /// inherited, so a developer's shell cannot change what a test runs against.
    pub env: Vec<(String, String)>,
    /// A data directory to start from: copied into the server's own before the first start
    /// (the original is never written).
    pub seed_data: Option<PathBuf>,
    /// The data directory to use instead of one in the server's temp dir (a test that puts it
    /// on a filesystem of its own).
    pub data_dir: Option<PathBuf>,
}

impl Default for ServerOpts {
    fn default() -> Self {
        ServerOpts {
            listen: "127.0.0.1:0".to_owned(),
            config: None,
            env: Vec::new(),
            seed_data: None,
            data_dir: None,
        }
    }
}

impl ServerOpts {
    #[must_use]
    pub fn config(mut self, toml: impl Into<String>) -> Self {
        self.config = Some(toml.into());
        self
    }

    #[must_use]
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }

    #[must_use]
    pub fn seed_data(mut self, dir: impl Into<PathBuf>) -> Self {
        self.seed_data = Some(dir.into());
        self
    }

    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// Why a server did not come up.
#[derive(Debug)]
pub enum StartError {
    /// The process exited before printing its address.
    Exited { status: ExitStatus, stderr: String },
    /// The first stdout line was not `listening on http://<addr>`.
    BadFirstLine { line: String, stderr: String },
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Exited { status, stderr } => {
                write!(
                    f,
                    "the server exited at start with {status}; stderr:\n{stderr}"
                )
            }
            StartError::BadFirstLine { line, stderr } => write!(
                f,
                "the first stdout line of the server was {line:?}, not \
                 \"listening on http://<addr>\"; stderr:\n{stderr}"
            ),
        }
    }
}

/// The `tidemark` binary of this workspace: `target/debug/tidemark`, found by walking up from
/// the test executable (`target/debug/deps/e2e-<hash>`). Refuses a binary older than any source
/// file of the crates it is built from, so a test never passes against a stale build.
/// `TIDEMARK_E2E_BINARY` names another build (`.ci/run` runs the client libraries' tests
/// against the release binary with it), refused the same way when stale.
pub fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("TIDEMARK_E2E_BINARY") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "TIDEMARK_E2E_BINARY={} is no file",
            bin.display()
        );
        assert_current(&bin);
        return bin;
    }
    let exe = std::env::current_exe().expect("current_exe");
    for dir in exe.ancestors().skip(1) {
        let candidate = dir.join("tidemark");
        if candidate.is_file() {
            assert_current(&candidate);
            return candidate;
        }
        if dir.file_name().is_some_and(|n| n == "target") {
            break;
        }
    }
    panic!(
        "the tidemark binary was not found next to {} (looked for target/debug/tidemark); \
         run `cargo build --workspace --bins` first",
        exe.display()
    );
}

/// Panic when a source file of the server is newer than `bin`.
fn assert_current(bin: &Path) {
    let built = std::fs::metadata(bin)
        .and_then(|m| m.modified())
        .expect("mtime of the tidemark binary");
    if let Some((path, _)) = newest_source().filter(|(_, t)| *t > built) {
        panic!(
            "{} is older than {}: it is stale; run `cargo build --workspace --bins`",
            bin.display(),
            path.display()
        );
    }
}

/// The most recently modified source of the binary: `.rs` and `.toml` files under the crates
/// it is built from, the console's files it embeds, and the lock file.
pub fn newest_source() -> Option<(PathBuf, std::time::SystemTime)> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()?
        .to_path_buf();
    let mut newest: Option<(PathBuf, std::time::SystemTime)> = None;
    let mut stack: Vec<PathBuf> = [
        "api",
        "log",
        "projections",
        "engine",
        "consumers",
        // The CLI's client (its examples are not built into the binary).
        "clients/rust/src",
        "clients/rust/Cargo.toml",
    ]
    .iter()
    .map(|c| ws.join(c))
    .collect();
    stack.push(ws.join("Cargo.lock"));
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            // A crate's own tests are not built into the binary.
            if p.file_name().is_some_and(|n| n == "tests") {
                continue;
            }
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
            continue;
        }
        let source = p.extension().is_some_and(|e| {
            ["rs", "toml", "lock", "html", "js", "css"]
                .iter()
                .any(|x| e == *x)
        });
        if let (true, Ok(t)) = (source, meta.modified())
            && newest.as_ref().is_none_or(|(_, n)| t > *n)
        {
            newest = Some((p, t));
        }
    }
    newest
}

/// Copy a directory tree (files and directories only).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// A running (or stopped) `tidemark serve` child with its own temp dir.
pub struct Server {
    api: Api,
    /// Owns the data dir, the config file and the stderr logs; removed on drop.
    dir: tempfile::TempDir,
    data: PathBuf,
    config: Option<PathBuf>,
    opts: ServerOpts,
    /// `None` once the process has been waited for.
    child: Option<Child>,
    pid: u32,
    addr: SocketAddr,
    /// How many times the process was started; names the stderr file of each run.
    runs: u32,
    /// The log head reported by `/healthz` right after the current process came up.
    start_head: u64,
}

impl Deref for Server {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Server {
    /// Start a server, or panic with its stderr.
    pub async fn start(opts: ServerOpts) -> Server {
        match Server::try_start(opts).await {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    /// Start a server; a process that exits at start is an `Err` with its stderr.
    pub async fn try_start(opts: ServerOpts) -> Result<Server, StartError> {
        let dir = tempfile::Builder::new()
            .prefix("tidemark-e2e-")
            .tempdir()
            .expect("create a temp dir");
        let data = opts
            .data_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("data"));
        if let Some(src) = &opts.seed_data {
            copy_tree(src, &data).unwrap_or_else(|e| {
                panic!("cannot copy {} into {}: {e}", src.display(), data.display())
            });
        }
        let config = opts.config.as_ref().map(|text| {
            let p = dir.path().join("config.toml");
            std::fs::write(&p, text).expect("write the config file");
            p
        });
        let stderr_path = dir.path().join("stderr-1.log");
        let spawn = Spawn {
            data: data.clone(),
            config: config.clone(),
            opts: opts.clone(),
            stderr_path,
        };
        let (child, addr) = tokio::task::spawn_blocking(move || spawn.run())
            .await
            .expect("spawn task")?;
        let mut server = Server {
            api: Api::new(addr, None),
            start_head: 0,
            pid: child.id(),
            child: Some(child),
            dir,
            data,
            config,
            opts,
            addr,
            runs: 1,
        };
        // Read through the Server, so that a panic here still kills the child (Drop).
        server.start_head = server.api.health_head().await;
        Ok(server)
    }

    /// Start the process again on the same data dir and config, on a new port. The previous
    /// process must have exited (after [`Server::kill9`] or [`Server::sigterm`] +
    /// [`Server::wait_exit`]).
    pub async fn restart(&mut self) {
        if let Some(child) = self.child.as_mut() {
            match child.try_wait() {
                Ok(Some(_)) => self.child = None,
                _ => panic!(
                    "restart() called while the server (pid {}) still runs",
                    self.pid
                ),
            }
        }
        self.runs += 1;
        let spawn = Spawn {
            data: self.data.clone(),
            config: self.config.clone(),
            opts: self.opts.clone(),
            stderr_path: self.stderr_path(),
        };
        let (child, addr) = match tokio::task::spawn_blocking(move || spawn.run())
            .await
            .expect("spawn task")
        {
            Ok(x) => x,
            Err(e) => panic!("restart #{}: {e}", self.runs - 1),
        };
        self.pid = child.id();
        self.child = Some(child);
        self.addr = addr;
        self.api = Api::new(addr, self.api.token.clone());
        self.start_head = self.api.health_head().await;
    }

    /// The log head `/healthz` reported right after the current process came up: the baseline
    /// of a test that counts seqs. A fresh server has already recorded its notification
    /// settings (`settings.updated`), so this is 1 for a new data dir. After a restart,
    /// reactors may append more events right after this was read.
    pub fn start_head(&self) -> u64 {
        self.start_head
    }

    /// Set (`Some`) or remove (`None`) an environment variable of the child for the next
    /// [`Server::restart`].
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.opts.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.opts.env.push((key.to_owned(), v.to_owned()));
        }
    }

    /// Replace the config file (`None`: start without `--config`) for the next
    /// [`Server::restart`].
    pub fn set_config(&mut self, toml: Option<&str>) {
        self.opts.config = toml.map(str::to_owned);
        self.config = toml.map(|text| {
            let p = self.dir.path().join("config.toml");
            std::fs::write(&p, text).expect("write the config file");
            p
        });
    }

    /// A cloneable HTTP handle of the current process (it changes on restart).
    pub fn api(&self) -> Api {
        self.api.clone()
    }

    /// Bearer token used by every request of [`Server::api`] from now on.
    pub fn set_token(&mut self, token: Option<&str>) {
        self.api.token = token.map(secret);
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The stderr file of the current (or last) run.
    pub fn stderr_path(&self) -> PathBuf {
        self.dir.path().join(format!("stderr-{}.log", self.runs))
    }

    /// The stderr of the current (or last) run.
    pub fn stderr(&self) -> String {
        read_lossy(&self.stderr_path())
    }

    /// The stderr of every run, in order.
    pub fn all_stderr(&self) -> String {
        (1..=self.runs)
            .map(|n| read_lossy(&self.dir.path().join(format!("stderr-{n}.log"))))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `kill -9` the process and reap it.
    pub fn kill9(&mut self) -> ExitStatus {
        let mut child = self
            .child
            .take()
            .expect("kill9(): the server is not running");
        signal(self.pid, nix::sys::signal::Signal::SIGKILL);
        child.wait().expect("wait for the killed server")
    }

    /// Send SIGTERM; follow with [`Server::wait_exit`].
    pub fn sigterm(&self) {
        assert!(self.child.is_some(), "sigterm(): the server is not running");
        signal(self.pid, nix::sys::signal::Signal::SIGTERM);
    }

    /// Wait for the process to exit, at most `limit` (then panic with its stderr).
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut().expect("wait_exit(): no process");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            if Instant::now() > deadline {
                panic!(
                    "the server (pid {}) did not exit within {limit:?}; stderr:\n{}",
                    self.pid,
                    tail(&self.stderr(), 8000)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Resident memory of the process, KiB (`VmRSS`).
    pub fn rss_kb(&self) -> u64 {
        proc_status_kb(self.pid, "VmRSS:")
    }

    /// Peak resident memory of the process so far, KiB (`VmHWM`).
    pub fn peak_rss_kb(&self) -> u64 {
        proc_status_kb(self.pid, "VmHWM:")
    }
}

/// The log filter of the suite's servers: every level of tidemark's own crates and of its HTTP
/// layer, debug for the rest, info for the transport crates underneath (their output is about
/// bytes, not about requests).
pub const DEBUG_LOG: &str = "debug,tidemark_api=trace,tidemark_engine=trace,\
    tidemark_consumers=trace,tidemark_log=trace,tidemark_projections=trace,tower_http=trace,\
    hyper=info,hyper_util=info,h2=info,rustls=info,reqwest=info,tower=info,mio=info";

static SECRETS: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::new(BTreeSet::new());

/// Register `s` as a secret (a token, a webhook secret, a source header, the privacy key) and
/// return it: no server of the suite may write it to its log (checked when the server is
/// dropped, spec section 8 and I9 of issue 17).
pub fn secret(s: impl Into<String>) -> String {
    let s = s.into();
    if s.len() >= 8 {
        SECRETS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(s.clone());
    }
    s
}

/// The registered secrets that occur in `log`, masked.
pub fn leaked_secrets(log: &str) -> Vec<String> {
    SECRETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|s| log.contains(s.as_str()))
        .map(|s| format!("{}… ({} chars)", &s[..4], s.len()))
        .collect()
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                signal(self.pid, nix::sys::signal::Signal::SIGKILL);
            }
            let _ = child.wait();
        }
        if !std::thread::panicking() {
            let leaked = leaked_secrets(&self.all_stderr());
            assert!(
                leaked.is_empty(),
                "secrets in the server log ({}): {leaked:?}",
                self.stderr_path().display()
            );
        }
        if std::thread::panicking() {
            eprintln!(
                "---- stderr of the tidemark server (last run, {}) ----\n{}\n---- end ----",
                self.stderr_path().display(),
                tail(&self.stderr(), 8000)
            );
        }
    }
}

struct Spawn {
    data: PathBuf,
    config: Option<PathBuf>,
    opts: ServerOpts,
    stderr_path: PathBuf,
}

impl Spawn {
    /// Blocking: spawn the child and wait (bounded) for its `listening on` line.
    fn run(self) -> Result<(Child, SocketAddr), StartError> {
        let stderr = File::create(&self.stderr_path).expect("create the stderr file");
        let mut cmd = Command::new(binary());
        cmd.arg("serve")
            .arg("--data")
            .arg(&self.data)
            .arg("--listen")
            .arg(&self.opts.listen);
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        scrub_env(&mut cmd);
        // Every server of the suite logs at debug level, so the check in `Drop` that no
        // secret reaches the log covers every level the code logs at.
        cmd.env("RUST_LOG", DEBUG_LOG);
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        let mut child = cmd.spawn().expect("spawn the tidemark binary");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut first = String::new();
            let _ = r.read_line(&mut first);
            let _ = tx.send(first);
            // Keep draining, so that a chatty server never blocks on a full pipe.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let deadline = Instant::now() + START_TIMEOUT;
        let line = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(line) if !line.is_empty() => break line,
                Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed without a line: the process is exiting.
                    let status = wait_bounded(&mut child, Duration::from_secs(10));
                    return Err(StartError::Exited {
                        status,
                        stderr: read_lossy(&self.stderr_path),
                    });
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(StartError::Exited {
                            status,
                            stderr: read_lossy(&self.stderr_path),
                        });
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!(
                            "the server printed no `listening on` line within {START_TIMEOUT:?}; \
                             stderr:\n{}",
                            tail(&read_lossy(&self.stderr_path), 8000)
                        );
                    }
                }
            }
        };
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .and_then(|a| a.trim_end_matches('/').parse::<SocketAddr>().ok());
        match addr {
            Some(mut addr) => {
                if addr.ip().is_unspecified() {
                    addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                Ok((child, addr))
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(StartError::BadFirstLine {
                    line,
                    stderr: read_lossy(&self.stderr_path),
                })
            }
        }
    }
}

fn scrub_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k_str = k.to_string_lossy();
        if k_str.starts_with("TIDEMARK_") || k_str == "RUST_LOG" {
            cmd.env_remove(&k);
        }
    }
}

fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Send `sig` to `pid` (a child the test started).
pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits in i32"));
    // ESRCH (already gone) is fine: the caller reaps the child anyway.
    let _ = nix::sys::signal::kill(pid, sig);
}

fn proc_status_kb(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

fn read_lossy(path: &Path) -> String {
    let mut buf = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut buf);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// The last `max` bytes of `s` (on a char boundary).
pub fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// An HTTP answer, read to the end.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: Option<String>,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
    /// The body parsed as JSON, or `Value::Null` when it is not JSON.
    pub json: Value,
}

impl Reply {
    pub async fn read(resp: reqwest::Response) -> Result<Reply, reqwest::Error> {
        let status = resp.status();
        let headers = resp.headers().clone();
        let content_type = headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = resp.text().await?;
        let json = match strict_json(&text) {
            Ok(v) => v,
            Err(e) if e.contains(DUPLICATE_KEY) => panic!("{e}: {}", tail(&text, 500)),
            Err(_) => Value::Null,
        };
        Ok(Reply {
            status,
            content_type,
            headers,
            text,
            json,
        })
    }

    /// The problem's `code`, when the body is a problem document.
    pub fn code(&self) -> Option<&str> {
        self.json.get("code").and_then(Value::as_str)
    }
}

const DUPLICATE_KEY: &str = "duplicate key";

/// JSON as a strict reader takes it: an object that names a key twice is refused (serde_json,
/// like most lenient readers, keeps the last; a Rust struct with `deny_unknown_fields`,
/// Python's `object_pairs_hook` check or Go's strict decoder refuse the whole answer). Every
/// answer and SSE event the suite reads goes through it, so no duplicate key can come back.
pub fn strict_json(text: &str) -> Result<Value, String> {
    use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};

    struct Strict;
    impl<'de> DeserializeSeed<'de> for Strict {
        type Value = Value;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Strict {
        type Value = Value;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(v.into())
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(v.into())
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(Strict)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
            let mut out = Vec::new();
            while let Some(v) = a.next_element_seed(Strict)? {
                out.push(v);
            }
            Ok(Value::Array(out))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
            let mut out = serde_json::Map::new();
            while let Some(k) = a.next_key::<String>()? {
                let v = a.next_value_seed(Strict)?;
                if out.insert(k.clone(), v).is_some() {
                    return Err(A::Error::custom(format!("{DUPLICATE_KEY} {k:?}")));
                }
            }
            Ok(Value::Object(out))
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Strict.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(v)
}

/// Cloneable HTTP handle of one server process.
#[derive(Clone)]
pub struct Api {
    base: String,
    /// For ordinary requests: each is bounded by [`REQUEST_TIMEOUT`].
    pub client: reqwest::Client,
    /// For SSE: no total timeout (a stream is read for as long as the test wants).
    sse_client: reqwest::Client,
    token: Option<String>,
}

/// One page of `GET /v1/events`.
#[derive(Debug, Clone)]
pub struct Page {
    pub events: Vec<Value>,
    pub next_after_sequence: u64,
    pub latest_event_seq: u64,
}

impl Api {
    fn new(addr: SocketAddr, token: Option<String>) -> Api {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("http client");
        let sse_client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("sse client");
        Api {
            base: format!("http://{addr}"),
            client,
            sse_client,
            token,
        }
    }

    /// `http://<addr>` of the server (with the prefix of [`Api::under`]).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The same handle with `prefix` before every path (`/tenants/acme`: a tenant's client,
    /// spec section 20) and `token` (`None`: none).
    pub fn under(&self, prefix: &str, token: Option<&str>) -> Api {
        Api {
            base: format!("{}{prefix}", self.base),
            token: token.map(secret),
            ..self.clone()
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// A request with the handle's token (if any).
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.client.request(method, self.url(path));
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Send and read the whole answer; transport errors panic.
    pub async fn send(&self, rb: reqwest::RequestBuilder) -> Reply {
        let resp = rb
            .send()
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}"));
        Reply::read(resp)
            .await
            .unwrap_or_else(|e| panic!("reading the answer failed: {e}"))
    }

    /// Send and read the whole answer; transport errors (a server killed under the request)
    /// are returned.
    pub async fn try_send(&self, rb: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
        Reply::read(rb.send().await?).await
    }

    /// `POST /v1/events` with a JSON body; transport errors are returned.
    pub async fn try_append(&self, body: &Value) -> Result<(StatusCode, Value), reqwest::Error> {
        let resp = self
            .request(reqwest::Method::POST, "/v1/events")
            .json(body)
            .send()
            .await?;
        let r = Reply::read(resp).await?;
        Ok((r.status, r.json))
    }

    /// `POST /v1/events` with a JSON body.
    pub async fn append(&self, body: &Value) -> (StatusCode, Value) {
        self.try_append(body)
            .await
            .unwrap_or_else(|e| panic!("POST /v1/events failed: {e}"))
    }

    /// `POST /v1/events` with raw bytes as `application/json`.
    pub async fn post_raw(&self, body: impl Into<reqwest::Body>) -> Reply {
        self.send(
            self.request(reqwest::Method::POST, "/v1/events")
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body),
        )
        .await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    pub async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let r = self.get(path).await;
        (r.status, r.json)
    }

    /// One page of `GET /v1/events?<query>`; panics unless 200.
    pub async fn page(&self, query: &str) -> Page {
        let r = self.get(&format!("/v1/events?{query}")).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "GET /v1/events?{query}: {}",
            r.text
        );
        let num = |k: &str| {
            r.json[k]
                .as_u64()
                .unwrap_or_else(|| panic!("GET /v1/events: `{k}` is not a number in {}", r.text))
        };
        Page {
            events: r.json["events"]
                .as_array()
                .unwrap_or_else(|| panic!("GET /v1/events: no `events` array in {}", r.text))
                .clone(),
            next_after_sequence: num("next_after_sequence"),
            latest_event_seq: num("latest_event_seq"),
        }
    }

    /// The log head (`latest_event_seq`), read past the end (a position after the head is
    /// always readable, also when the log's prefix was compacted).
    pub async fn head(&self) -> u64 {
        self.page("after_sequence=9007199254740991&limit=1")
            .await
            .latest_event_seq
    }

    /// The `head` of `GET /livez` (open, needs no token, answers whatever the storage's
    /// state); panics unless it is a number.
    pub async fn health_head(&self) -> u64 {
        let r = self.get("/livez").await;
        assert_eq!(r.status, StatusCode::OK, "GET /livez: {}", r.text);
        r.json["head"]
            .as_u64()
            .unwrap_or_else(|| panic!("GET /healthz has no numeric `head`: {}", r.text))
    }

    /// Every event matching `filters` (e.g. `stream=s&subject=a`, or empty), paging with
    /// `limit` per page as the contract says: until `next_after_sequence >= latest_event_seq`.
    pub async fn read_all_with(&self, filters: &str, limit: u32) -> Vec<Value> {
        self.read_all_after(0, filters, limit).await
    }

    /// Every event with `seq > after` matching `filters`, paging with `limit` per page.
    pub async fn read_all_after(&self, after: u64, filters: &str, limit: u32) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = after;
        loop {
            let sep = if filters.is_empty() { "" } else { "&" };
            let page = self
                .page(&format!(
                    "after_sequence={after}&limit={limit}{sep}{filters}"
                ))
                .await;
            for ev in &page.events {
                let seq = ev["seq"].as_u64().expect("seq");
                assert!(seq > after, "page after {after} holds seq {seq}");
            }
            out.extend(page.events);
            if page.next_after_sequence >= page.latest_event_seq {
                return out;
            }
            assert!(
                page.next_after_sequence > after,
                "paging made no progress: after_sequence={after} answered \
                 next_after_sequence={}",
                page.next_after_sequence
            );
            after = page.next_after_sequence;
        }
    }

    /// Every event matching `filters`, 1000 per page.
    pub async fn read_all(&self, filters: &str) -> Vec<Value> {
        self.read_all_with(filters, 1000).await
    }

    /// Open `GET /v1/events/stream?<query>` with an optional `Last-Event-ID`. A non-200 answer
    /// is returned as `Err` with its body.
    pub async fn sse(&self, query: &str, last_event_id: Option<&str>) -> Result<SseStream, Reply> {
        self.sse_with_token(query, last_event_id, self.token.as_deref())
            .await
    }

    pub async fn sse_with_token(
        &self,
        query: &str,
        last_event_id: Option<&str>,
        token: Option<&str>,
    ) -> Result<SseStream, Reply> {
        self.sse_at(&format!("/v1/events/stream?{query}"), last_event_id, token)
            .await
    }

    /// Open `GET /v1/tasks/{task_id}/stream?<query>` (the id is percent-encoded here).
    pub async fn task_sse(
        &self,
        task_id: &str,
        query: &str,
        last_event_id: Option<&str>,
    ) -> Result<SseStream, Reply> {
        let path = format!("/v1/tasks/{}/stream?{query}", encode_path(task_id));
        self.sse_at(&path, last_event_id, self.token.as_deref())
            .await
    }

    /// Open an SSE stream at `path_and_query`. A non-200 answer is returned as `Err`.
    pub async fn sse_at(
        &self,
        path_and_query: &str,
        last_event_id: Option<&str>,
        token: Option<&str>,
    ) -> Result<SseStream, Reply> {
        let mut rb = self
            .sse_client
            .get(self.url(path_and_query))
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            rb = rb.header("Last-Event-ID", id);
        }
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        let resp = tokio::time::timeout(Duration::from_secs(30), rb.send())
            .await
            .expect("the SSE response headers did not arrive within 30 s")
            .unwrap_or_else(|e| panic!("SSE request failed: {e}"));
        if resp.status() != StatusCode::OK {
            return Err(Reply::read(resp).await.expect("read the SSE error body"));
        }
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        Ok(SseStream {
            content_type,
            inner: Box::pin(resp.bytes_stream().eventsource()),
        })
    }
}

type EventItem = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>;

/// An open SSE stream. Dropping it closes the connection.
pub struct SseStream {
    pub content_type: String,
    inner: Pin<Box<dyn Stream<Item = EventItem> + Send>>,
}

/// One SSE event whose `data` is a JSON envelope.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: String,
    pub event: String,
    pub data: Value,
}

impl SseEvent {
    /// The envelope's `seq`.
    pub fn seq(&self) -> u64 {
        self.data["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("SSE data without a numeric seq: {}", self.data))
    }
}

/// What reading the next SSE event gave.
#[derive(Debug)]
pub enum SseNext {
    Event(SseEvent),
    /// The server ended the stream cleanly.
    End,
    /// The connection failed (reset, truncated chunk, bad UTF-8...).
    Error(String),
    /// Nothing within the wait.
    Timeout,
}

impl SseStream {
    /// The next event, waiting at most `wait`. Keep-alive comments are skipped.
    pub async fn next(&mut self, wait: Duration) -> SseNext {
        match tokio::time::timeout(wait, self.inner.next()).await {
            Err(_) => SseNext::Timeout,
            Ok(None) => SseNext::End,
            Ok(Some(Err(e))) => SseNext::Error(e.to_string()),
            Ok(Some(Ok(ev))) => {
                let data = strict_json(&ev.data).unwrap_or_else(|e| {
                    panic!("SSE data is not JSON ({e}): {:?}", tail(&ev.data, 500))
                });
                SseNext::Event(SseEvent {
                    id: ev.id,
                    event: ev.event,
                    data,
                })
            }
        }
    }

    /// The next event; panics on end, error or after `wait`.
    pub async fn expect_event(&mut self, wait: Duration) -> SseEvent {
        match self.next(wait).await {
            SseNext::Event(e) => e,
            other => panic!("expected an SSE event within {wait:?}, got {other:?}"),
        }
    }
}

/// `program <args>` without the test process's `TIDEMARK_*` and `RUST_LOG` (a developer's shell
/// cannot change what a test runs), killed when dropped. `program` is the tidemark binary when
/// `None`; e.g. `sh` for a test that runs the CLI in a pipeline.
pub fn cli_command(program: Option<&str>, args: &[&str]) -> tokio::process::Command {
    let mut cmd = match program {
        Some(p) => tokio::process::Command::new(p),
        None => tokio::process::Command::new(binary()),
    };
    cmd.args(args).kill_on_drop(true);
    for (k, _) in std::env::vars_os() {
        let k_str = k.to_string_lossy();
        if k_str.starts_with("TIDEMARK_") || k_str == "RUST_LOG" {
            cmd.env_remove(&k);
        }
    }
    cmd
}

/// Run `tidemark <args>` with `stdin`, killed after `limit`. Returns its output.
pub async fn run_cli(args: &[&str], stdin: &str, limit: Duration) -> std::process::Output {
    use tokio::io::AsyncWriteExt;
    let mut cmd = cli_command(None, args);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the tidemark CLI");
    let mut input = child.stdin.take().expect("piped stdin");
    let text = stdin.to_owned();
    let writer = tokio::spawn(async move {
        let _ = input.write_all(text.as_bytes()).await;
        let _ = input.shutdown().await;
    });
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "`tidemark {}` did not exit within {limit:?}",
                args.join(" ")
            )
        })
        .expect("wait for the CLI");
    let _ = writer.await;
    out
}

/// Percent-encode every byte of `s` outside `A-Za-z0-9-._~`, for a path segment or a query
/// value.
pub fn encode_path(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Hex SHA-256 of a token text, as the config stores it.
pub fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    // What the suite hashes is a token's text: a secret no server may log.
    secret(text);
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// A string of random letters and digits, registered as a [`secret`] (the suite makes tokens
/// and webhook secrets of them).
pub fn random_token(len: usize) -> String {
    use rand::Rng;
    use rand::distr::Alphanumeric;
    secret(
        rand::rng()
            .sample_iter(Alphanumeric)
            .take(len)
            .map(char::from)
            .collect::<String>(),
    )
}

/// Assert that `r` is a problem+json answer with this status and `code`.
#[track_caller]
pub fn assert_problem(r: &Reply, status: u16, code: &str) {
    assert_problem_for(r, status, code, "");
}

/// [`assert_problem`], naming the case (`what`) in the failure messages.
#[track_caller]
pub fn assert_problem_for(r: &Reply, status: u16, code: &str, what: &str) {
    let what = if what.is_empty() {
        String::new()
    } else {
        format!("[{what}] ")
    };
    assert_eq!(
        r.status.as_u16(),
        status,
        "{what}expected {status} {code}, got {}: {}",
        r.status,
        tail(&r.text, 2000)
    );
    let ct = r.content_type.as_deref().unwrap_or("");
    assert!(
        ct.starts_with("application/problem+json"),
        "{what}expected Content-Type application/problem+json for {status} {code}, got {ct:?}"
    );
    assert_eq!(
        r.code(),
        Some(code),
        "{what}wrong problem code (status {}): {}",
        r.status,
        tail(&r.text, 2000)
    );
    assert_eq!(
        r.json["status"].as_u64(),
        Some(u64::from(status)),
        "{what}the problem's `status` member must equal the HTTP status: {}",
        tail(&r.text, 2000)
    );
    for member in ["type", "title"] {
        assert!(
            r.json.get(member).is_some_and(Value::is_string),
            "{what}the problem has no string `{member}`: {}",
            tail(&r.text, 2000)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::strict_json;
    use serde_json::json;

    /// The harness's reader refuses an object that names a key twice, at any depth (the claim
    /// row of issue 53 had `"type"` twice), and reads everything else as serde_json does.
    #[test]
    fn strict_json_refuses_a_duplicate_key_at_any_depth() {
        for text in [
            r#"{"type":"email","type":"email"}"#,
            r#"{"deliveries":[{"id":"d","type":"a","sink":"app","type":"b"}]}"#,
            r#"[1,{"a":{"b":1,"b":1}}]"#,
        ] {
            let err = strict_json(text).expect_err(text);
            assert!(err.contains("duplicate key"), "{text}: {err}");
        }
        let err = strict_json(r#"{"a":{"type":1,"type":2}}"#).unwrap_err();
        assert!(err.contains("\"type\""), "names the key: {err}");
        // The same key in sibling objects, or nested under itself, is no duplicate.
        let text = r#"{"a":{"a":1},"b":[{"a":1},{"a":2.5}],"c":null,"d":true,"e":"x"}"#;
        assert_eq!(
            strict_json(text).unwrap(),
            serde_json::from_str::<serde_json::Value>(text).unwrap()
        );
        assert_eq!(strict_json(" [] ").unwrap(), json!([]));
        // Not JSON, or JSON followed by more, is refused as serde_json refuses it.
        assert!(strict_json("{} {}").is_err());
        assert!(strict_json("{\"a\":").is_err());
    }
}
