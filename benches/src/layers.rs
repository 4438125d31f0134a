//! Where the server's CPU goes, layer by layer (issue 31): `perf record` with call graphs on
//! every thread of the server during a separate pass of the cell's shape (never during the
//! timed cell: the profiler costs CPU), each sample given to the innermost layer on its stack,
//! and each layer's share of the samples times the cell's CPU per event.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::measure::Proc;

/// One layer's part of the server's CPU in a cell.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Layer {
    pub name: String,
    /// Of the server's samples.
    pub share: f64,
    /// `share` × the timed cell's CPU per event.
    pub us_per_event: f64,
}

/// The layers and the frames that are theirs. A sample belongs to the layer of the frame
/// nearest its leaf that any layer claims (a frame two layers claim goes to the first listed),
/// so allocation, copies, locks and the kernel count in the layer that called them: the table
/// says who spends, not which primitive. Only frames of code that belongs to one layer are
/// claimed (not serde_json or `tokio::sync`, which every layer calls).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "group commit (on the appender's thread): staging, journal write, fsync",
        &[
            "tidemark_log::embedded::commit",
            "tidemark_log::embedded::journal",
        ],
    ),
    (
        "log indexer (after the reply): redb events, merges, checkpoints",
        &["tidemark_log::embedded::indexer"],
    ),
    (
        "JetStream: publish, acknowledgement, follower, replica feed (async-nats)",
        &["tidemark_log::jetstream", "async_nats::"],
    ),
    (
        "decider and models: folds, conditions, redb",
        &[
            "tidemark_engine::decider",
            "tidemark_projections::framework",
        ],
    ),
    (
        "reactors and streams: bridge notifier, router, SSE hub",
        &["tidemark_consumers::", "tidemark_engine::queries"],
    ),
    (
        "append body: parse, check, canonical payload",
        &[
            "tidemark_api::routes::events::parse_append_body",
            "tidemark_api::routes::events::parse_once",
            "tidemark_log::envelope::NewEvent",
            "tidemark_log::canonical",
        ],
    ),
    (
        "engine and log append: queue to the writer, wait, receipt",
        &[
            "tidemark_engine::Engine",
            "tidemark_log::embedded::Log",
            "tidemark_log::any::",
        ],
    ),
    (
        "handlers: extractors, answer encoding, handler metrics",
        &[
            "tidemark_api::routes::",
            "tidemark_api::request",
            "tidemark_api::error",
        ],
    ),
    (
        "front checks: request id, rate limit, unknown parameters, scope, request metrics",
        &[
            "tidemark_api::front",
            "tidemark_api::auth",
            "tidemark_api::params",
        ],
    ),
    (
        "axum routing and tower layers (trace, catch-panic, body limit)",
        &[
            "axum::",
            "tower::",
            "tower_http::",
            "tracing::",
            "tracing_core::",
        ],
    ),
    (
        "HTTP/1: read, parse, encode, write (hyper and the socket calls)",
        &[
            "hyper::",
            "hyper_util::",
            "tokio::net::tcp",
            "__GI___writev",
            "__libc_recv",
            "__libc_send",
            "__GI___libc_write",
            "__GI___libc_read",
        ],
    ),
    (
        "tokio: scheduler, timers, epoll, wake-ups",
        &[
            "tokio::runtime::scheduler",
            "tokio::runtime::io",
            "tokio::runtime::time",
            "tokio::runtime::blocking",
            "tokio::runtime::task",
            "epoll_wait",
            "mio::",
        ],
    ),
    (
        "NATS servers (the cluster's three processes, tidemark-jetstream only)",
        &[],
    ),
];

/// Threads whose samples are their layer's whatever the frames (their stacks may not unwind).
/// (A thread name's prefix, the start of its layer's name.)
const THREADS: &[(&str, &str)] = &[
    ("tidemark-log-in", "log indexer"),
    ("tidemark-decide", "decider and models"),
    ("nats-server", "NATS servers"),
];

/// How long the profiled pass runs at most.
const PASS: Duration = Duration::from_secs(4);

/// `perf record` attached to every thread of a process tree until [`Profile::finish`].
pub struct Profile {
    child: std::process::Child,
    out: tempfile::NamedTempFile,
}

impl Profile {
    pub fn attach(proc: Proc) -> Result<Profile, String> {
        let out = tempfile::NamedTempFile::new().map_err(|e| format!("perf output: {e}"))?;
        let pids: Vec<String> = proc.pids().iter().map(u32::to_string).collect();
        let child = Command::new("perf")
            .args([
                "record",
                "-q",
                "-F",
                "299",
                "--call-graph",
                "dwarf,16384",
                "-o",
            ])
            .arg(out.path())
            .args(["-p", &pids.join(",")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run perf: {e}"))?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(Profile { child, out })
    }

    pub fn pass() -> Duration {
        PASS
    }

    /// Stop recording and share the samples out among the layers.
    pub fn finish(mut self, cpu_us_per_event: f64) -> Result<Vec<Layer>, String> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        // perf ends on the signal (its status says so) after writing what it recorded.
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if std::fs::metadata(self.out.path()).map_or(0, |m| m.len()) == 0 {
            return Err(format!("perf record wrote nothing ({status})"));
        }
        let script = Command::new("perf")
            .args(["script", "-F", "comm,ip,sym", "-i"])
            .arg(self.out.path())
            .stderr(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run perf script: {e}"))?;
        let text = String::from_utf8_lossy(&script.stdout);
        if text.trim().is_empty() {
            return Err("perf script read no samples".into());
        }
        Ok(share_out(&text, cpu_us_per_event))
    }
}

/// Each sample of `perf script` output (a header line, then one frame per line, a blank line
/// after) to its layer; the layers with their shares, largest first, then "other".
pub fn share_out(script: &str, cpu_us_per_event: f64) -> Vec<Layer> {
    let mut counts: BTreeMap<usize, u64> = BTreeMap::new();
    let mut total = 0u64;
    for sample in script.split("\n\n") {
        let mut lines = sample.lines().filter(|l| !l.trim().is_empty());
        let Some(header) = lines.next() else { continue };
        total += 1;
        let comm = header.trim();
        let frames: Vec<&str> = lines.collect();
        let by_thread = THREADS
            .iter()
            .find(|(t, _)| comm.starts_with(t))
            .and_then(|(_, layer)| LAYERS.iter().position(|(n, _)| n.starts_with(layer)));
        let layer = by_thread
            .or_else(|| {
                frames.iter().find_map(|f| {
                    LAYERS
                        .iter()
                        .position(|(_, pats)| pats.iter().any(|p| f.contains(p)))
                })
            })
            .unwrap_or(LAYERS.len());
        *counts.entry(layer).or_default() += 1;
    }
    let total = total.max(1) as f64;
    let mut out: Vec<Layer> = counts
        .into_iter()
        .map(|(i, n)| {
            let share = n as f64 / total;
            Layer {
                name: LAYERS
                    .get(i)
                    .map_or(
                        "other (threads' own loops, the kernel outside these)",
                        |l| l.0,
                    )
                    .to_owned(),
                share: crate::measure::round3(share),
                us_per_event: crate::measure::round1(share * cpu_us_per_event),
            }
        })
        .collect();
    out.sort_by(|a, b| b.share.total_cmp(&a.share));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_goes_to_the_innermost_layer_on_its_stack() {
        let script = "tokio-rt-worker\n\t1 mi_malloc\n\t2 tidemark_api::routes::events::parse_append_body\n\t3 tidemark_api::front::FrontService\n\t4 tokio::runtime::task\n\n\
                      tokio-rt-worker\n\t1 fdatasync\n\t2 tidemark_log::embedded::commit::lead\n\n\
                      tokio-rt-worker\n\t1 epoll_wait\n\t2 tokio::runtime::io::driver\n\n\
                      tokio-rt-worker\n\t1 __GI___writev\n\t2 hyper::proto::h1::dispatch\n\t3 tokio::runtime::task\n\n\
                      tokio-rt-worker\n\t1 mi_free\n\t2 tower_http::trace::ResponseFuture\n\t3 tidemark_api::front::FrontService\n\t4 hyper::proto\n";
        let layers = share_out(script, 50.0);
        let find = |p: &str| {
            layers
                .iter()
                .find(|l| l.name.starts_with(p))
                .unwrap()
                .us_per_event
        };
        assert_eq!(find("append body"), 10.0);
        assert_eq!(find("group commit"), 10.0);
        assert_eq!(find("tokio"), 10.0);
        assert_eq!(find("HTTP/1"), 10.0);
        // Deeper than the front's frame: the tower layer's, not the front's.
        assert_eq!(find("axum routing"), 10.0);
        assert!(layers.iter().all(|l| !l.name.starts_with("front")));
    }
}
