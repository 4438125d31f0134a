//! Reads grow with nodes (spec section 16: "tidemark nodes add read capacity"): the log filled
//! through one `tidemark serve` on the three-node cluster, then read back from that node alone
//! and from it and a second node at once (same `[log] backend = "jetstream"` configuration, its
//! own data directory, started before the fill and following the stream), two ways, each phase
//! for `--reads-seconds`:
//! - **pages**: `--reads-clients` readers per node take the node's pages of 1000 in turn
//!   (`GET /v1/events?after_sequence=…&limit=1000`), round the log again and again;
//! - **SSE**: `--reads-sse-clients` streams per node, each receiving the whole log from
//!   `after_sequence=0` (`GET /v1/events/stream`) up to the head, then opening another.
//!
//! Then a third node joins cold, its replica built from the whole stream, and its time to
//! ready (or why it could not start) is recorded beside the reads.
//!
//! A phase is timed, not sized, so a fast one still lasts long enough for /proc's CPU ticks
//! (10 ms) to measure it. Each reports events/s in total and per node, and the CPU of each
//! node, of the three NATS servers and of this process alone (the readers), in cores and µs per
//! event, so one can say what limits it: a node at a whole core, or the machine's cores all
//! busy.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;

use crate::measure::{
    Counters, Percentiles, Proc, clock_ticks, micros, new_histogram, round1, round3,
};
use crate::targets::Target;
use crate::targets::cluster::TidemarkJetStream;
use crate::targets::tidemark::{TidemarkHttp, get_ok};
use crate::workloads::Rig;

/// What the workload does (`--readback-events`, `--reads-clients`, `--reads-sse-clients`,
/// `--reads-seconds`).
pub struct ReadsPlan {
    /// Events in the log.
    pub events: u64,
    /// Page readers per node.
    pub clients: usize,
    /// SSE streams per node.
    pub sse_clients: usize,
    /// Each phase's length.
    pub seconds: f64,
}

#[derive(Serialize, Clone, Default)]
pub struct ClusterReads {
    /// Events in the log (what was asked, rounded up to whole batches of 1000).
    pub events: u64,
    /// Filling it through the first node: 8 clients × batches of 1000 over HTTP.
    pub fill_events_per_sec: f64,
    /// From the fill's end until the second node, started before the fill and following the
    /// stream since, held the whole log in its replica.
    pub second_node_behind_seconds: f64,
    /// A third node started after the fill, its replica built from the whole stream: from its
    /// start until it answered ready holding the head, and at what rate, or why it did not
    /// (`tidemark serve` opens only once its replica holds the stream's head, within the log's
    /// timeout). Not an error of the reads: they ran on the first two nodes.
    pub cold_join_seconds: Option<f64>,
    pub cold_join_events_per_sec: Option<f64>,
    pub cold_join_error: Option<String>,
    /// Pages, one node then two.
    pub pages: Vec<ReadPhase>,
    /// SSE, one node then two.
    pub sse: Vec<ReadPhase>,
    /// Events/s of two nodes ÷ one, pages.
    pub pages_two_over_one: Option<f64>,
    /// Events/s of two nodes ÷ one, SSE.
    pub sse_two_over_one: Option<f64>,
    pub error: Option<String>,
}

#[derive(Serialize, Clone, Default)]
pub struct ReadPhase {
    /// `pages` or `sse`.
    pub kind: &'static str,
    pub nodes: usize,
    pub clients_per_node: usize,
    /// Events received, all nodes.
    pub events: u64,
    pub seconds: f64,
    pub events_per_sec: f64,
    /// Per page (pages) or per 1000 events received on one stream (SSE).
    pub latency_us: Percentiles,
    pub per_node: Vec<NodeUse>,
    /// The three NATS servers' CPU, in cores (reads are served from each node's replica, so
    /// about none).
    pub nats_cores: f64,
    /// This process's CPU (the readers, parsing what they receive), in cores.
    pub client_cores: f64,
    /// Nodes + NATS + readers, in cores: near the machine's count, the machine is the limit.
    pub busy_cores: f64,
    pub error: Option<String>,
}

#[derive(Serialize, Clone, Default)]
pub struct NodeUse {
    pub events: u64,
    pub events_per_sec: f64,
    /// The node's CPU (user + system) over the phase, in cores.
    pub cores: f64,
    pub cpu_us_per_event: f64,
}

/// Fill the log, start a second node, then run the four phases.
pub async fn cluster_reads(t: TidemarkJetStream, plan: &ReadsPlan) -> ClusterReads {
    let mut r = ClusterReads {
        events: plan.events,
        ..ClusterReads::default()
    };
    let mut rig = Rig::new(t, 0x7ead);
    let target = rig.target.clone();
    // Started before the fill, as a node of a deployment runs: it follows the stream as the
    // log grows.
    let second = match target.another_node(Duration::from_secs(60)).await {
        Ok(n) => n,
        Err(e) => {
            r.error = Some(format!("second node: {e}"));
            drop(target);
            rig.stop().await;
            return r;
        }
    };
    eprintln!(
        "  cluster-reads: filling {} events through one node (a second node following)",
        plan.events
    );
    let d = rig.run(8, 1000, plan.events, None).await;
    r.fill_events_per_sec = (d.events as f64 / d.seconds.max(1e-9)).round();
    eprintln!("  filled at {} events/s", r.fill_events_per_sec);
    // Whole batches: the log may hold a little more than asked.
    let head = rig.appended;
    r.events = head;
    let filled = Instant::now();
    let ready = match d.error {
        Some(e) => Err(format!("fill: {e}")),
        None => caught_up(&second, head, Duration::from_secs(300)).await,
    };
    match ready {
        Ok(()) => {
            r.second_node_behind_seconds = round3(filled.elapsed().as_secs_f64());
            eprintln!(
                "  the second node held all {head} events {} s after the fill",
                r.second_node_behind_seconds
            );
            let nodes = [target.node(), &second];
            let nats = target.nats_proc();
            for kind in [Kind::Pages, Kind::Sse] {
                for n in [1, 2] {
                    let p = phase(kind, &nodes[..n], nats, head, plan).await;
                    report_phase(&p);
                    let failed = p.error.clone();
                    match kind {
                        Kind::Pages => r.pages.push(p),
                        Kind::Sse => r.sse.push(p),
                    }
                    if let Some(e) = failed {
                        r.error.get_or_insert(e);
                    }
                }
            }
            r.pages_two_over_one = two_over_one(&r.pages);
            r.sse_two_over_one = two_over_one(&r.sse);
            cold_join(&target, head, &mut r).await;
        }
        Err(e) => r.error = Some(e),
    }
    second.stop().await;
    drop(target);
    rig.stop().await;
    r
}

/// Start a third node on the full stream and time it until it holds the head.
async fn cold_join(target: &TidemarkJetStream, head: u64, r: &mut ClusterReads) {
    let started = Instant::now();
    // A replica rebuilds at tens of thousands of events a second: 15 minutes is 10 M events
    // at 11,000/s.
    let joined = match target.another_node(Duration::from_secs(900)).await {
        Ok(node) => {
            let held = caught_up(&node, head, Duration::from_secs(900)).await;
            node.stop().await;
            held
        }
        Err(e) => Err(e),
    };
    match joined {
        Ok(()) => {
            let s = started.elapsed().as_secs_f64();
            r.cold_join_seconds = Some(round3(s));
            r.cold_join_events_per_sec = Some((head as f64 / s).round());
            eprintln!("  a new node joined holding {head} events in {s:.1} s");
        }
        Err(e) => {
            eprintln!("  a new node could not join: {e}");
            r.cold_join_error = Some(e);
        }
    }
}

fn two_over_one(phases: &[ReadPhase]) -> Option<f64> {
    match phases {
        [one, two, ..]
            if one.events_per_sec > 0.0 && one.error.is_none() && two.error.is_none() =>
        {
            Some((two.events_per_sec / one.events_per_sec * 100.0).round() / 100.0)
        }
        _ => None,
    }
}

fn report_phase(p: &ReadPhase) {
    let nodes: Vec<String> = p
        .per_node
        .iter()
        .map(|n| format!("{} ev/s at {:.2} cores", n.events_per_sec, n.cores))
        .collect();
    eprintln!(
        "  {:<5} {} node(s) × {:>2} clients  {:>9} events {:>9} events/s  [{}]  nats {:.2} cores  \
         readers {:.2} cores  busy {:.2}{}",
        p.kind,
        p.nodes,
        p.clients_per_node,
        p.events,
        p.events_per_sec,
        nodes.join("; "),
        p.nats_cores,
        p.client_cores,
        p.busy_cores,
        crate::report::error_note(p.error.as_deref(), "  ")
    );
}

/// Wait until `node`'s replica holds `head` events (its `latest_event_seq`).
async fn caught_up(node: &TidemarkHttp, head: u64, limit: Duration) -> Result<(), String> {
    let t0 = Instant::now();
    let url = format!("{}/v1/events?after_sequence=0&limit=1", node.base());
    loop {
        let latest = async {
            let v = crate::http::get_json(node.client(), &url).await?;
            v["latest_event_seq"]
                .as_u64()
                .ok_or_else(|| format!("no latest_event_seq in {v}"))
        }
        .await;
        match latest {
            Ok(l) if l >= head => return Ok(()),
            Err(e) if t0.elapsed() > limit => return Err(format!("second node: {e}")),
            Ok(l) if t0.elapsed() > limit => {
                return Err(format!(
                    "the second node held {l} of {head} events after {limit:?}"
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Pages,
    Sse,
}

/// What one reader received.
struct Received {
    node: usize,
    events: u64,
    hist: hdrhistogram::Histogram<u64>,
    error: Option<String>,
}

/// One phase on `nodes`: every reader at once, the counters read around it.
async fn phase(
    kind: Kind,
    nodes: &[&TidemarkHttp],
    nats: Proc,
    head: u64,
    plan: &ReadsPlan,
) -> ReadPhase {
    let per_node = match kind {
        Kind::Pages => plan.clients,
        Kind::Sse => plan.sse_clients,
    }
    .max(1);
    let mut p = ReadPhase {
        kind: match kind {
            Kind::Pages => "pages",
            Kind::Sse => "sse",
        },
        nodes: nodes.len(),
        clients_per_node: per_node,
        ..ReadPhase::default()
    };
    let ticks = clock_ticks();
    let deadline = Instant::now() + Duration::from_secs_f64(plan.seconds);
    let procs: Vec<Proc> = nodes.iter().map(|n| Proc::Tree(n.pid())).collect();
    let before: Vec<Counters> = procs.iter().map(|p| p.counters()).collect();
    let (nats_before, this_before) = (nats.counters(), Proc::This.counters());
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, node) in nodes.iter().enumerate() {
        let base = node.base().to_owned();
        // The pages of this node, shared by its readers.
        let next_page = Arc::new(AtomicU64::new(0));
        for _ in 0..per_node {
            let base = base.clone();
            let next_page = next_page.clone();
            tasks.spawn(async move {
                let mut r = Received {
                    node: i,
                    events: 0,
                    hist: new_histogram(),
                    error: None,
                };
                let res = match kind {
                    Kind::Pages => read_pages(&base, &next_page, head, deadline, &mut r).await,
                    Kind::Sse => read_stream(&base, head, deadline, &mut r).await,
                };
                r.error = res.err();
                r
            });
        }
    }
    let mut hist = new_histogram();
    let mut events = vec![0u64; nodes.len()];
    while let Some(j) = tasks.join_next().await {
        match j {
            Ok(r) => {
                events[r.node] += r.events;
                let _ = hist.add(&r.hist);
                if p.error.is_none() {
                    p.error = r.error;
                }
            }
            Err(e) => p.error = Some(format!("reader task failed: {e}")),
        }
    }
    let s = t0.elapsed().as_secs_f64().max(1e-9);
    let cores = |c: Counters| c.cpu_ticks as f64 / ticks / s;
    p.seconds = round3(s);
    p.events = events.iter().sum();
    p.events_per_sec = (p.events as f64 / s).round();
    p.latency_us = Percentiles::from(&hist);
    p.per_node = procs
        .iter()
        .zip(&before)
        .zip(&events)
        .map(|((proc, b), &n)| {
            let c = cores(proc.counters().since(*b));
            NodeUse {
                events: n,
                events_per_sec: (n as f64 / s).round(),
                cores: round3(c),
                cpu_us_per_event: round1(c * s * 1e6 / n.max(1) as f64),
            }
        })
        .collect();
    p.nats_cores = round3(cores(nats.counters().since(nats_before)));
    p.client_cores = round3(cores(Proc::This.counters().since(this_before)));
    p.busy_cores =
        round3(p.per_node.iter().map(|n| n.cores).sum::<f64>() + p.nats_cores + p.client_cores);
    p
}

/// Take this node's pages of 1000 in turn, round the log, until the deadline.
async fn read_pages(
    base: &str,
    next_page: &AtomicU64,
    head: u64,
    deadline: Instant,
    r: &mut Received,
) -> Result<(), String> {
    let client = crate::targets::tidemark::http_client()?;
    let pages = head.div_ceil(1000);
    while Instant::now() < deadline {
        let after = next_page.fetch_add(1, Ordering::Relaxed) % pages * 1000;
        let limit = (head - after).min(1000);
        let url = format!("{base}/v1/events?after_sequence={after}&limit={limit}");
        let t = Instant::now();
        let resp = get_ok(&client, &url).await?;
        let body = resp.bytes().await.map_err(|e| e.to_string())?;
        r.hist.saturating_record(micros(t.elapsed()));
        // A whole page ends where asked; found from the end of the body, so the readers do
        // not spend the machine's CPU parsing what the node spent its own on writing.
        let next = next_after_sequence(&body);
        if next != Some(after + limit) {
            return Err(format!(
                "GET {url}: next_after_sequence {next:?}, {} expected",
                after + limit
            ));
        }
        r.events += limit;
    }
    Ok(())
}

/// The `next_after_sequence` of a `GET /v1/events` body: its last occurrence, after the events
/// (whose payloads here never hold the key).
fn next_after_sequence(body: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"next_after_sequence\":";
    let at = body.windows(KEY.len()).rposition(|w| w == KEY)? + KEY.len();
    let digits: Vec<u8> = body[at..]
        .iter()
        .copied()
        .skip_while(u8::is_ascii_whitespace)
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// Follow the node's stream from the start until it has delivered `head`, then again, until
/// the deadline.
async fn read_stream(
    base: &str,
    head: u64,
    deadline: Instant,
    r: &mut Received,
) -> Result<(), String> {
    // No request timeout on a stream.
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    while Instant::now() < deadline {
        r.events += stream_once(&client, base, head, deadline, &mut r.hist).await?;
    }
    Ok(())
}

/// One stream from `after_sequence=0` until `head` or the deadline: the events received.
async fn stream_once(
    client: &reqwest::Client,
    base: &str,
    head: u64,
    deadline: Instant,
    hist: &mut hdrhistogram::Histogram<u64>,
) -> Result<u64, String> {
    let url = format!("{base}/v1/events/stream?after_sequence=0");
    let mut t = Instant::now();
    let resp = get_ok(client, &url).await?;
    let mut body = resp.bytes_stream();
    let mut frames = SseFrames::default();
    let mut mark = 0;
    while frames.last_id < head && Instant::now() < deadline {
        let chunk = tokio::time::timeout(Duration::from_secs(30), body.next())
            .await
            .map_err(|_| format!("{url}: nothing for 30 s at seq {}", frames.last_id))?
            .ok_or_else(|| format!("{url}: the stream ended at seq {}", frames.last_id))?
            .map_err(|e| format!("{url}: {e}"))?;
        frames.feed(&chunk);
        // One latency sample per 1000 events: the time they took to arrive.
        while frames.events >= mark + 1000 {
            mark += 1000;
            hist.saturating_record(micros(t.elapsed()));
            t = Instant::now();
        }
    }
    Ok(frames.events)
}

/// Counts the events of a `text/event-stream` fed in chunks cut anywhere: one per `id:` line,
/// the last id kept.
#[derive(Default)]
pub struct SseFrames {
    /// The unfinished line at the end of the last chunk.
    carry: Vec<u8>,
    pub events: u64,
    pub last_id: u64,
}

impl SseFrames {
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let (line, tail) = rest.split_at(nl);
            rest = &tail[1..];
            if self.carry.is_empty() {
                self.line(line);
            } else {
                let mut whole = std::mem::take(&mut self.carry);
                whole.extend_from_slice(line);
                self.line(&whole);
            }
        }
        self.carry.extend_from_slice(rest);
    }

    fn line(&mut self, line: &[u8]) {
        if let Some(id) = line.strip_prefix(b"id:") {
            self.events += 1;
            if let Some(n) = std::str::from_utf8(id)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
            {
                self.last_id = self.last_id.max(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_frames_are_counted_across_any_cut() {
        let text = b": keep-alive\n\nid: 1\nevent: bench.appended\ndata: {\"id:\":2}\n\n\
                     id:2\nevent: x\ndata: {}\n\nid: 13\ndata: {}\n\n";
        for cut in 0..text.len() {
            let mut f = SseFrames::default();
            f.feed(&text[..cut]);
            f.feed(&text[cut..]);
            assert_eq!((f.events, f.last_id), (3, 13), "cut at {cut}");
        }
        let mut f = SseFrames::default();
        for b in text {
            f.feed(std::slice::from_ref(b));
        }
        assert_eq!((f.events, f.last_id), (3, 13), "a byte at a time");
    }

    #[test]
    fn a_page_says_where_it_ends() {
        let body = br#"{"events":[{"seq":1,"payload":{"n":1}}],"next_after_sequence": 1000,"latest_event_seq":3000}"#;
        assert_eq!(next_after_sequence(body), Some(1000));
        assert_eq!(next_after_sequence(br#"{"events":[]}"#), None);
        assert_eq!(next_after_sequence(br#"{"next_after_sequence":x}"#), None);
    }

    #[test]
    fn two_over_one_needs_both_phases() {
        let phase = |eps: f64, error: Option<&str>| ReadPhase {
            events_per_sec: eps,
            error: error.map(str::to_owned),
            ..ReadPhase::default()
        };
        assert_eq!(
            two_over_one(&[phase(1000.0, None), phase(1500.0, None)]),
            Some(1.5)
        );
        assert_eq!(two_over_one(&[phase(1000.0, None)]), None);
        assert_eq!(
            two_over_one(&[phase(1000.0, None), phase(900.0, Some("x"))]),
            None
        );
    }
}
