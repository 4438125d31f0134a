//! The results document (written as the run goes) and its markdown tables: one per workload,
//! and the ratios tidemark ÷ each peer from the same run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::cluster_reads::{ClusterReads, ReadPhase};
use crate::filled::{GrowthResult, ReadbackResult};
use crate::machine::{FsyncResult, Machine};
use crate::sse::SseResult;
use crate::workloads::AppendCell;

#[derive(Serialize, Clone)]
pub struct Skipped {
    pub system: String,
    pub reason: String,
}

#[derive(Serialize, Clone)]
pub struct Ratio {
    pub tidemark: String,
    pub peer: String,
    pub clients: usize,
    pub batch: usize,
    /// tidemark events/s ÷ peer events/s (above 1: tidemark faster).
    pub throughput: f64,
    /// tidemark p99 ÷ peer p99 (below 1: tidemark faster).
    pub p99: f64,
    /// tidemark CPU per event ÷ peer CPU per event (below 1: tidemark cheaper).
    pub cpu_per_event: Option<f64>,
    /// Bytes the device wrote per event, side by side; None unless both were counted.
    pub device_bytes_per_event: Option<Pair>,
    /// Context switches per event, side by side (an in-process system's include its clients').
    pub ctx_switches_per_event: Pair,
}

/// One measure of tidemark and of the peer side by side.
#[derive(Serialize, Clone, Copy)]
pub struct Pair {
    pub tidemark: f64,
    pub peer: f64,
    /// tidemark ÷ peer (below 1: tidemark less); None when the peer's is 0.
    pub ratio: Option<f64>,
}

impl Pair {
    fn new(tidemark: f64, peer: f64) -> Pair {
        Pair {
            tidemark,
            peer,
            ratio: (peer > 0.0).then(|| r2(tidemark / peer)),
        }
    }

    /// `tidemark / peer (ratio×)`.
    fn cell(&self) -> String {
        match self.ratio {
            Some(r) => format!("{} / {} ({r}×)", self.tidemark, self.peer),
            None => format!("{} / {}", self.tidemark, self.peer),
        }
    }
}

#[derive(Serialize, Default)]
pub struct Report {
    pub benchmark: &'static str,
    pub machine: Option<Machine>,
    pub options: serde_json::Value,
    pub fsync: Vec<FsyncResult>,
    pub journal_write: Vec<crate::journal_write::JournalWriteResult>,
    pub append: Vec<AppendCell>,
    pub readback: Vec<ReadbackResult>,
    pub growth: Vec<GrowthResult>,
    pub sse: Option<SseResult>,
    pub cluster_reads: Option<ClusterReads>,
    pub reopen: Option<serde_json::Value>,
    /// The delivery path beside the work queues (`queue`), and tidemark's `deliver` and
    /// `route`.
    #[serde(default)]
    pub queue: Vec<crate::queue::QueueCell>,
    #[serde(default)]
    pub deliver: Option<crate::deliver::DeliverResult>,
    #[serde(default)]
    pub route: Option<crate::deliver::RouteResult>,
    /// What tenants that are never used cost (`idle-tenants`).
    #[serde(default)]
    pub idle_tenants: Option<crate::idle::IdleResult>,
    pub skipped: Vec<Skipped>,
    pub ratios: Vec<Ratio>,
    pub uptime_after: Option<String>,
    pub complete: bool,
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl Report {
    pub fn compute_ratios(&mut self) {
        let ok = |c: &&AppendCell| c.error.is_none() && c.events > 0;
        let mut out = Vec::new();
        for tm in self
            .append
            .iter()
            .filter(ok)
            .filter(|c| c.system.starts_with("tidemark"))
        {
            for peer in self
                .append
                .iter()
                .filter(ok)
                .filter(|c| !c.system.starts_with("tidemark"))
                .filter(|c| c.clients == tm.clients && c.batch == tm.batch)
            {
                out.push(Ratio {
                    tidemark: tm.system.clone(),
                    peer: peer.system.clone(),
                    clients: tm.clients,
                    batch: tm.batch,
                    throughput: r2(tm.events_per_sec / peer.events_per_sec.max(1e-9)),
                    p99: r2(tm.latency_us.p99 as f64 / (peer.latency_us.p99.max(1)) as f64),
                    cpu_per_event: (peer.cpu_us_per_event > 0.0)
                        .then(|| r2(tm.cpu_us_per_event / peer.cpu_us_per_event)),
                    device_bytes_per_event: tm
                        .device_bytes_per_event
                        .zip(peer.device_bytes_per_event)
                        .map(|(t, p)| Pair::new(t, p)),
                    ctx_switches_per_event: Pair::new(
                        tm.ctx_switches_per_event,
                        peer.ctx_switches_per_event,
                    ),
                });
            }
        }
        self.ratios = out;
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        if let Some(m) = &self.machine {
            let _ = writeln!(
                s,
                "Machine: {} cpus, {} MiB, kernel {}, data on {} ({}), source {}\n\
                 uptime before: {}\n",
                m.cpus,
                m.mem_total_kb / 1024,
                m.kernel,
                m.work_fs_type,
                m.work_fs_device,
                m.source,
                m.uptime
            );
        }
        self.queue_markdown(&mut s);
        if !self.fsync.is_empty() {
            s.push_str("| fsync (4 KiB write + fdatasync) | count | p50 µs | p99 µs | p99.9 µs | max µs |\n");
            s.push_str("|---|---:|---:|---:|---:|---:|\n");
            for f in &self.fsync {
                let l = f.latency_us;
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    f.mode, l.count, l.p50, l.p99, l.p999, l.max
                );
            }
            s.push('\n');
        }
        if !self.journal_write.is_empty() {
            s.push_str(
                "| journal record made durable | bytes | count | p50 µs | p99 µs | CPU µs | ctx switches | device B |\n",
            );
            s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
            for j in &self.journal_write {
                let l = j.latency_us;
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {:.1} | {:.2} | {} |",
                    j.mode,
                    j.record_bytes,
                    l.count,
                    l.p50,
                    l.p99,
                    j.cpu_us_per_record,
                    j.ctx_switches_per_record,
                    j.device_bytes_per_record
                        .map_or("n/a".into(), |b| format!("{b:.0}"))
                );
            }
            s.push('\n');
        }
        if !self.append.is_empty() {
            s.push_str(
                "### Durable appends\n\n| system | clients | batch | events | events/s | p50 µs | p99 µs \
                 | p99.9 µs | longest pause µs | CPU µs/event | ctx switches/event | wchar B/event \
                 | page cache write_bytes B/event | device B/event | WAL B/event \
                 | fsyncs/event (every server) | error |\n",
            );
            s.push_str(
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
            );
            // † in process: this process's counts, the clients' included.
            let mark = |c: &AppendCell| if c.in_process { " †" } else { "" };
            for c in &self.append {
                let l = c.latency_us;
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} | {}{} | {} | {} | {} | {} \
                     | {} | {} |",
                    c.system,
                    c.clients,
                    c.batch,
                    c.events,
                    c.events_per_sec,
                    l.p50,
                    l.p99,
                    l.p999,
                    c.longest_pause_us,
                    c.cpu_us_per_event,
                    mark(c),
                    c.ctx_switches_per_event,
                    mark(c),
                    c.wchar_per_event,
                    c.write_bytes_per_event,
                    c.device_bytes_per_event
                        .map_or("n/a".into(), |v| v.to_string()),
                    c.wal_bytes_per_event.map_or("".into(), |v| v.to_string()),
                    c.fsyncs_per_event.map_or("".into(), |v| v.to_string()),
                    c.error.as_deref().map(short).unwrap_or_default(),
                );
            }
            s.push_str(
                "\nlongest pause: the longest time with a request in flight and no append \
                 completing, over all the cell's clients. ctx switches: voluntary + involuntary, \
                 the server's threads (threads that exit during the cell are not counted). \
                 page cache write_bytes: bytes dirtied in the page cache (/proc/<pid>/io); \
                 device: sectors written × 512 by the block device under the data directory \
                 (/sys/dev/block/<major>:<minor>/stat), the whole device's, other writers on it \
                 included; n/a when the data is on no block device. fsyncs/event: sync calls \
                 (fsync, fdatasync, sync_file_range, msync, syncfs) per event, counted by \
                 `strace -f` over every thread of the cell's server processes during a separate, \
                 shorter pass of the same shape; for a cluster (nats-cluster, \
                 nats-cluster-window, tidemark-jetstream) that is all three NATS servers' calls \
                 (and the tidemark node's), so a three-replica stream that syncs once per \
                 publish on each server shows 3. CPU and context switches sum the same \
                 processes.\n",
            );
            if let Some(w) = self.append.iter().find_map(|c| c.window) {
                let _ = writeln!(
                    s,
                    "-window: each client keeps up to {w} publishes sent and unacknowledged \
                     (asynchronous publish); latency is from a publish's send to its PubAck and \
                     only acknowledged events count; a batch > 1 is one atomic batch, at most 50 \
                     open per stream across all clients (the server's limit), so with batches of \
                     100 that bound, not the window, is what holds."
                );
            }
            if self.append.iter().any(|c| c.in_process) {
                s.push_str(
                    "† in process: CPU and context switches are the benchmark process's, its \
                     clients' included.\n",
                );
            }
            // Which device each system's cells counted, or why none.
            let mut devices: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
            for c in &self.append {
                devices.entry(&c.device).or_default().insert(&c.system);
            }
            for (device, systems) in devices {
                let systems: Vec<&str> = systems.into_iter().collect();
                let _ = writeln!(s, "device of {}: {}", systems.join(", "), short(device));
            }
            s.push('\n');
            for c in self.append.iter().filter(|c| !c.layers.is_empty()) {
                let _ = writeln!(
                    s,
                    "### {} {} × {}: server CPU per event by layer (perf, a pass of the same shape)\n\n\
                     | layer | µs/event | share |\n|---|---:|---:|",
                    c.system, c.clients, c.batch
                );
                for l in &c.layers {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {:.1} % |",
                        l.name,
                        l.us_per_event,
                        l.share * 100.0
                    );
                }
                let _ = writeln!(s, "| **all** | **{}** | 100 % |\n", c.cpu_us_per_event);
            }
        }
        if !self.ratios.is_empty() {
            s.push_str(
                "### tidemark ÷ peer (same run)\n\n| tidemark | peer | clients | batch \
                 | throughput × | p99 × | CPU/event × | device B/event tidemark / peer \
                 | ctx switches/event tidemark / peer |\n\
                 |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
            );
            for r in &self.ratios {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    r.tidemark,
                    r.peer,
                    r.clients,
                    r.batch,
                    r.throughput,
                    r.p99,
                    r.cpu_per_event.map_or("".into(), |v| v.to_string()),
                    r.device_bytes_per_event
                        .as_ref()
                        .map_or("n/a".into(), Pair::cell),
                    r.ctx_switches_per_event.cell(),
                );
            }
            s.push('\n');
        }
        if !self.readback.is_empty() {
            s.push_str(
                "### Read-back from the start (pages of 1000)\n\n| system | events | events/s | MB/s \
                 | page p50 µs | page p99 µs | error |\n|---|---:|---:|---:|---:|---:|---|\n",
            );
            for r in &self.readback {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    r.system,
                    r.events,
                    r.events_per_sec,
                    r.mb_per_sec,
                    r.latency_us.p50,
                    r.latency_us.p99,
                    r.error.as_deref().map(short).unwrap_or_default()
                );
            }
            s.push('\n');
        }
        if !self.growth.is_empty() {
            s.push_str(
                "### Append rate as the log grows (4 clients × batches of 1000)\n\n\
                 | system | events in the log | events/s | p99 µs | longest pause µs |\n\
                 |---|---:|---:|---:|---:|\n",
            );
            for g in &self.growth {
                for st in &g.steps {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {} |",
                        g.system, st.upto, st.events_per_sec, st.p99_us, st.longest_pause_us
                    );
                }
                let _ = writeln!(
                    s,
                    "| {} | last ÷ first | {} | {} | |",
                    g.system,
                    g.last_over_first,
                    g.error.as_deref().map(short).unwrap_or_default()
                );
            }
            s.push('\n');
        }
        if let Some(x) = &self.sse {
            let _ = writeln!(
                s,
                "### Append → SSE receipt (tidemark, one client)\n\n| | count | p50 µs | p99 µs \
                 | p99.9 µs |\n|---|---:|---:|---:|---:|\n| POST → 201 | {} | {} | {} | {} |\n\
                 | POST → SSE event | {} | {} | {} | {} |\n",
                x.append_us.count,
                x.append_us.p50,
                x.append_us.p99,
                x.append_us.p999,
                x.append_to_receipt_us.count,
                x.append_to_receipt_us.p50,
                x.append_to_receipt_us.p99,
                x.append_to_receipt_us.p999,
            );
            if let Some(e) = &x.error {
                let _ = writeln!(s, "error: {}\n", short(e));
            }
        }
        if let Some(r) = &self.cluster_reads {
            cluster_reads_markdown(&mut s, r);
        }
        for sk in &self.skipped {
            let _ = writeln!(s, "skipped {}: {}", sk.system, sk.reason);
        }
        s
    }
}

/// `<gap>ERROR <error>` after a result's figures when it failed, else nothing.
pub fn error_note(error: Option<&str>, gap: &str) -> String {
    error.map(|e| format!("{gap}ERROR {e}")).unwrap_or_default()
}

fn short(e: &str) -> String {
    let one: String = e.replace('|', "/").replace('\n', " ");
    if one.chars().count() > 120 {
        format!("{}…", one.chars().take(120).collect::<String>())
    } else {
        one
    }
}

/// The reads-grow-with-nodes table.
fn cluster_reads_markdown(s: &mut String, r: &ClusterReads) {
    let _ = writeln!(
        s,
        "### Reads from one and two tidemark nodes on the cluster ({} events)\n\n\
         Filled through one node at {} events/s (8 clients × batches of 1000) while a second \
         node followed the stream; it held the whole log {} s after the fill. A third node \
         joining cold afterwards (its replica built from the whole stream): {}.\n\n\
         | reads | nodes | clients/node | events | events/s | per node events/s | per node \
         CPU cores | per node CPU µs/event | NATS cores | readers' cores | busy cores | \
         p50 µs | p99 µs | error |\n\
         |---|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|",
        r.events,
        r.fill_events_per_sec,
        r.second_node_behind_seconds,
        match (
            &r.cold_join_error,
            r.cold_join_seconds,
            r.cold_join_events_per_sec
        ) {
            (Some(e), _, _) => format!("could not start: {}", short(e)),
            (None, Some(s), Some(eps)) => format!("ready in {s} s ({eps} events/s)"),
            _ => "not tried".to_owned(),
        }
    );
    for p in r.pages.iter().chain(&r.sse) {
        let each = |f: &dyn Fn(&crate::cluster_reads::NodeUse) -> String| {
            p.per_node.iter().map(f).collect::<Vec<_>>().join(" / ")
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.kind,
            p.nodes,
            p.clients_per_node,
            p.events,
            p.events_per_sec,
            each(&|n| n.events_per_sec.to_string()),
            each(&|n| n.cores.to_string()),
            each(&|n| n.cpu_us_per_event.to_string()),
            p.nats_cores,
            p.client_cores,
            p.busy_cores,
            p.latency_us.p50,
            p.latency_us.p99,
            p.error.as_deref().map(short).unwrap_or_default()
        );
    }
    let ratio = |x: Option<f64>| x.map_or("n/a".to_owned(), |v| format!("{v}×"));
    let _ = writeln!(
        s,
        "\ntwo nodes ÷ one: pages {}, SSE {}. each phase lasts --reads-seconds. pages: a node's \
         readers take its pages of 1000 in turn, round the log (latency per page); sse: each \
         stream receives the whole log from after_sequence=0, then another opens (latency per \
         1000 events received). Cores: CPU seconds over the phase's seconds; busy = nodes + \
         NATS + readers (this process alone), all on one machine: near its core count, the \
         machine, not a node, is the limit.{}\n",
        ratio(r.pages_two_over_one),
        ratio(r.sse_two_over_one),
        phase_error(r)
    );
}

fn phase_error(r: &ClusterReads) -> String {
    match (
        &r.error,
        r.pages
            .iter()
            .chain(&r.sse)
            .any(|p: &ReadPhase| p.error.is_some()),
    ) {
        (Some(e), false) => format!(" error: {}", short(e)),
        _ => String::new(),
    }
}

impl Report {
    /// The `queue` cells side by side (workers × batch: each system's items/s, CPU per item,
    /// p99), then `deliver` and `route`.
    fn queue_markdown(&self, s: &mut String) {
        if !self.queue.is_empty() {
            let mut systems: Vec<&str> = Vec::new();
            for c in &self.queue {
                if !systems.contains(&c.system.as_str()) {
                    systems.push(&c.system);
                }
            }
            let mut shapes: Vec<(usize, usize)> = Vec::new();
            for c in &self.queue {
                if !shapes.contains(&(c.workers, c.batch)) {
                    shapes.push((c.workers, c.batch));
                }
            }
            let _ = writeln!(
                s,
                "| queue: workers × batch | system | items/s | p50 ms | p99 ms | CPU µs/item | \
                 ctx switches/item | device B/item | ÷ tidemark items/s |"
            );
            s.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
            for (w, b) in shapes {
                let tm = self
                    .queue
                    .iter()
                    .find(|c| c.system.starts_with("tidemark") && c.workers == w && c.batch == b);
                for sys in &systems {
                    let Some(c) = self
                        .queue
                        .iter()
                        .find(|c| c.system == *sys && c.workers == w && c.batch == b)
                    else {
                        continue;
                    };
                    let ratio = tm
                        .filter(|t| c.items_per_sec > 0.0 && t.items_per_sec > 0.0)
                        .map_or("–".to_owned(), |t| {
                            format!("{:.2}", t.items_per_sec / c.items_per_sec)
                        });
                    let _ = writeln!(
                        s,
                        "| {w} × {b} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {ratio} |{}",
                        c.system,
                        c.items_per_sec,
                        c.latency_us.p50 as f64 / 1000.0,
                        c.latency_us.p99 as f64 / 1000.0,
                        c.cpu_us_per_item,
                        c.ctx_switches_per_item,
                        c.device_bytes_per_item
                            .map_or("n/a".to_owned(), |v| format!("{v:.0}")),
                        error_note(c.error.as_deref(), " ")
                    );
                }
            }
            s.push('\n');
            for c in self.queue.iter().filter(|c| c.workers == 1 && c.batch == 1) {
                let _ = writeln!(
                    s,
                    "enqueue of {} items: {} {:.3} s",
                    c.enqueued, c.system, c.enqueue_seconds
                );
            }
            s.push('\n');
        }
        if let Some(d) = &self.deliver {
            let _ = writeln!(
                s,
                "deliver: {} notifications ({} clients × batches of {}) to a webhook receiver: \
                 {} received in {:.3} s, {} notifications/s, append → receipt p50 {:.1} ms p99 \
                 {:.1} ms, server CPU {} µs/notification{}\n",
                d.notifications,
                d.clients,
                d.batch,
                d.received,
                d.seconds,
                d.notifications_per_sec,
                d.latency_us.p50 as f64 / 1000.0,
                d.latency_us.p99 as f64 / 1000.0,
                d.cpu_us_per_notification,
                error_note(d.error.as_deref(), " ")
            );
        }
        if let Some(r) = &self.route {
            let _ = writeln!(
                s,
                "route: {} notification.requested → queued deliveries in {:.3} s (appended in \
                 {:.3} s): {} notifications/s, server CPU {} µs/notification{}\n",
                r.notifications,
                r.seconds,
                r.append_seconds,
                r.notifications_per_sec,
                r.cpu_us_per_notification,
                error_note(r.error.as_deref(), " ")
            );
        }
    }
}
