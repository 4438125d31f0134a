//! Durable appends at N clients × batches of B, generic over [`Target`]: the rig that drives a
//! target's clients and the append cell measured with it (read-back and growth over a filled
//! log are in [`crate::filled`]).
//!
//! An append cell's clients are driven one of two ways ([`Driver`]): [`ClosedLoop`], each client
//! awaiting one request's durable reply before it sends the next (every system), or
//! [`Windowed`], each client keeping up to a window of requests in flight (systems that can
//! pipeline, [`Pipelined`]: NATS's asynchronous publish).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::events::EventGen;
use crate::measure::{
    BlockDevice, Counters, Pauses, Percentiles, Proc, SyscallCount, clock_ticks, micros,
    new_histogram, round1, round3,
};
use crate::targets::{Pipelined, Target};

/// A target with its open connections and the next unused event index (ids never repeat on
/// one target, so every append is new work).
pub struct Rig<T: Target> {
    pub target: Arc<T>,
    pub conns: Vec<T::Conn>,
    pub evgen: EventGen,
    /// The next unused event index (a cut-off run leaves indexes unused, never reused).
    pub next_event: u64,
    /// Events the target has acknowledged so far.
    pub appended: u64,
}

/// What one client task ends with: its connection, its latencies, the events it appended and
/// its first error.
type ClientDone<C> = (C, hdrhistogram::Histogram<u64>, u64, Option<String>);

impl<T: Target> Rig<T> {
    /// The clients' connections back, and what they did: their latencies, events and first
    /// error, over the time since `started`.
    async fn collect(
        &mut self,
        mut tasks: tokio::task::JoinSet<ClientDone<T::Conn>>,
        started: Instant,
        pauses: &Pauses,
    ) -> Driven {
        let mut out = Driven {
            hist: new_histogram(),
            events: 0,
            seconds: 0.0,
            longest_pause: Duration::ZERO,
            error: None,
        };
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((conn, h, done, err)) => {
                    self.conns.push(conn);
                    let _ = out.hist.add(&h);
                    out.events += done;
                    if out.error.is_none() {
                        out.error = err;
                    }
                }
                Err(e) => out.error = Some(format!("client task failed: {e}")),
            }
        }
        out.seconds = started.elapsed().as_secs_f64();
        out.longest_pause = pauses.longest();
        self.appended += out.events;
        out
    }
    pub fn new(target: T, seed: u64) -> Self {
        Rig {
            target: Arc::new(target),
            conns: Vec::new(),
            evgen: EventGen::new(seed),
            next_event: 0,
            appended: 0,
        }
    }

    /// Open connections until there are `n`.
    pub async fn ensure_conns(&mut self, n: usize) -> Result<(), String> {
        while self.conns.len() < n {
            self.conns.push(self.target.connect().await?);
        }
        Ok(())
    }

    /// A run of `events` events in batches of `batch` begins: its batches (of events no run
    /// has appended), and `clients` connections (opened if need be), or why they could not be.
    async fn begin(
        &mut self,
        clients: usize,
        batch: usize,
        events: u64,
    ) -> Result<(Batches, Vec<T::Conn>), String> {
        self.ensure_conns(clients).await?;
        let batch = batch.max(1) as u64;
        let count = events.div_ceil(batch);
        let batches = Batches {
            next: Arc::new(AtomicU64::new(0)),
            count,
            batch,
            base: self.next_event,
            evgen: self.evgen,
        };
        self.next_event += count * batch;
        Ok((batches, self.conns.drain(..clients).collect()))
    }

    /// Drop every connection, then stop the target.
    pub async fn stop(self) {
        let Rig { target, conns, .. } = self;
        drop(conns);
        if let Ok(t) = Arc::try_unwrap(target) {
            t.stop().await;
        }
    }

    /// `clients` concurrent clients, each appending one batch of `batch` at a time and awaiting
    /// its durable reply, until `events` events are appended or `deadline` passes.
    pub async fn run(
        &mut self,
        clients: usize,
        batch: usize,
        events: u64,
        deadline: Option<Instant>,
    ) -> Driven {
        let (batches, conns) = match self.begin(clients, batch, events).await {
            Ok(begun) => begun,
            Err(e) => return Driven::failed(e),
        };
        let batch = batches.batch;
        let pauses = Arc::new(Pauses::default());
        let mut tasks = tokio::task::JoinSet::new();
        let started = Instant::now();
        for mut conn in conns {
            let (target, batches) = (self.target.clone(), batches.clone());
            let pauses = pauses.clone();
            tasks.spawn(async move {
                let mut h = new_histogram();
                let mut done = 0u64;
                let mut err = None;
                loop {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break;
                    }
                    let Some(b) = batches.take(&*target) else {
                        break;
                    };
                    pauses.sent();
                    let t0 = Instant::now();
                    let r = target.append(&mut conn, b).await;
                    pauses.done(r.is_ok());
                    match r {
                        Ok(()) => {
                            h.saturating_record(micros(t0.elapsed()));
                            done += batch;
                        }
                        Err(e) => {
                            err = Some(e);
                            // Stop the other clients too: the cell has failed.
                            batches.end();
                            break;
                        }
                    }
                }
                (conn, h, done, err)
            });
        }
        self.collect(tasks, started, &pauses).await
    }
}

impl<T: Pipelined> Rig<T> {
    /// `clients` concurrent clients, each keeping up to `window` batches of `batch` sent and
    /// unacknowledged, until `events` events are sent or `deadline` passes; then every batch in
    /// flight is awaited. A batch's latency runs from its send to its acknowledgement, and only
    /// acknowledged events count. The target's [`Pipelined::open_limit`], if any, bounds the
    /// requests open across all clients: a permit is taken before each send and given back at
    /// its acknowledgement. Each acknowledgement is awaited by a task of its own, which gives
    /// both permits back the moment it resolves, so a client waiting for a permit never waits
    /// on itself.
    pub async fn run_windowed(
        &mut self,
        clients: usize,
        batch: usize,
        events: u64,
        deadline: Option<Instant>,
        window: usize,
    ) -> Driven {
        let (batches, conns) = match self.begin(clients, batch, events).await {
            Ok(begun) => begun,
            Err(e) => return Driven::failed(e),
        };
        let open = self.target.open_limit(batch.max(1));
        let batch = batches.batch;
        let stop = Arc::new(AtomicBool::new(false));
        let pauses = Arc::new(Pauses::default());
        let mut tasks = tokio::task::JoinSet::new();
        let started = Instant::now();
        for mut conn in conns {
            let (target, batches, stop) = (self.target.clone(), batches.clone(), stop.clone());
            let (pauses, open) = (pauses.clone(), open.clone());
            let slots = Arc::new(tokio::sync::Semaphore::new(window.max(1)));
            tasks.spawn(async move {
                let mut acks = tokio::task::JoinSet::new();
                let mut tally = Tally::default();
                loop {
                    if deadline.is_some_and(|d| Instant::now() >= d) || stop.load(Ordering::Relaxed)
                    {
                        break;
                    }
                    let Some(b) = batches.take(&*target) else {
                        break;
                    };
                    let Ok(slot) = slots.clone().acquire_owned().await else {
                        break;
                    };
                    let shared = match &open {
                        Some(sem) => match sem.clone().acquire_owned().await {
                            Ok(p) => Some(p),
                            Err(_) => break,
                        },
                        None => None,
                    };
                    // The wait for a slot may have outlasted the cell.
                    if deadline.is_some_and(|d| Instant::now() >= d) || stop.load(Ordering::Relaxed)
                    {
                        break;
                    }
                    pauses.sent();
                    let t0 = Instant::now();
                    match target.send(&mut conn, b).await {
                        Ok(ack) => {
                            let pauses = pauses.clone();
                            acks.spawn(async move {
                                let r = ack.await;
                                let took = t0.elapsed();
                                pauses.done(r.is_ok());
                                drop((slot, shared));
                                (took, r)
                            });
                        }
                        Err(e) => {
                            pauses.done(false);
                            tally.fail(e, &stop);
                            break;
                        }
                    }
                    while let Some(j) = acks.try_join_next() {
                        tally.ack(j, batch, &stop);
                    }
                }
                while let Some(j) = acks.join_next().await {
                    tally.ack(j, batch, &stop);
                }
                (conn, tally.hist, tally.done, tally.err)
            });
        }
        self.collect(tasks, started, &pauses).await
    }
}

/// The batches of a run, handed out to its clients in turn: the `k`-th of `count` holds
/// events `base + k * batch` up to the next batch's.
#[derive(Clone)]
struct Batches {
    next: Arc<AtomicU64>,
    count: u64,
    batch: u64,
    base: u64,
    evgen: EventGen,
}

impl Batches {
    /// The next batch, prepared for `target`; `None` once every batch has been handed out.
    fn take<T: Target>(&self, target: &T) -> Option<T::Batch> {
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        if k >= self.count {
            return None;
        }
        let lo = self.base + k * self.batch;
        Some(target.prepare(&self.evgen.batch(lo..lo + self.batch)))
    }

    /// Hand out no more batches (the run has failed).
    fn end(&self) {
        self.next.store(u64::MAX / 2, Ordering::Relaxed);
    }
}

/// One windowed client's acknowledgements so far.
struct Tally {
    hist: hdrhistogram::Histogram<u64>,
    /// Events acknowledged.
    done: u64,
    /// The first failure; it stops every client of the cell.
    err: Option<String>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            hist: new_histogram(),
            done: 0,
            err: None,
        }
    }
}

impl Tally {
    fn fail(&mut self, e: String, stop: &AtomicBool) {
        stop.store(true, Ordering::Relaxed);
        self.err.get_or_insert(e);
    }

    fn ack(
        &mut self,
        joined: Result<(Duration, Result<(), String>), tokio::task::JoinError>,
        batch: u64,
        stop: &AtomicBool,
    ) {
        match joined {
            Ok((took, Ok(()))) => {
                self.hist.saturating_record(micros(took));
                self.done += batch;
            }
            Ok((_, Err(e))) => self.fail(e, stop),
            Err(e) => self.fail(format!("acknowledgement task failed: {e}"), stop),
        }
    }
}

/// How an append cell's clients send: [`ClosedLoop`] or [`Windowed`].
pub trait Driver<T: Target> {
    /// Requests each client keeps in flight, when more than one at a time.
    fn window(&self) -> Option<usize>;

    /// The cell's clients appending its batches until `pass` ends.
    fn drive(&self, rig: &mut Rig<T>, pass: Pass) -> impl Future<Output = Driven>;
}

/// One pass of a cell: its `clients` appending batches of `batch` until `events` events or
/// `deadline`.
pub struct Pass {
    pub clients: usize,
    pub batch: usize,
    pub events: u64,
    pub deadline: Option<Instant>,
}

/// Each client sends one request and awaits its durable reply before the next ([`Rig::run`]).
pub struct ClosedLoop;

impl<T: Target> Driver<T> for ClosedLoop {
    fn window(&self) -> Option<usize> {
        None
    }

    async fn drive(&self, rig: &mut Rig<T>, p: Pass) -> Driven {
        rig.run(p.clients, p.batch, p.events, p.deadline).await
    }
}

/// Each client keeps up to this many requests in flight ([`Rig::run_windowed`]).
pub struct Windowed(pub usize);

impl<T: Pipelined> Driver<T> for Windowed {
    fn window(&self) -> Option<usize> {
        Some(self.0)
    }

    async fn drive(&self, rig: &mut Rig<T>, p: Pass) -> Driven {
        rig.run_windowed(p.clients, p.batch, p.events, p.deadline, self.0)
            .await
    }
}

/// What [`Rig::run`] did.
pub struct Driven {
    pub hist: hdrhistogram::Histogram<u64>,
    pub events: u64,
    pub seconds: f64,
    /// The longest time with a request in flight and none completing, over all clients
    /// ([`Pauses`]).
    pub longest_pause: Duration,
    pub error: Option<String>,
}

impl Driven {
    fn failed(e: String) -> Self {
        Driven {
            hist: new_histogram(),
            events: 0,
            seconds: 0.0,
            longest_pause: Duration::ZERO,
            error: Some(e),
        }
    }
}

/// One cell of the append workload.
#[derive(Serialize, Clone, serde::Deserialize)]
pub struct AppendCell {
    /// The system's name; a windowed cell's ends in `-window`.
    pub system: String,
    pub clients: usize,
    pub batch: usize,
    /// Requests each client kept in flight (windowed cells: NATS's asynchronous publish); None:
    /// one at a time, each awaited before the next.
    #[serde(default)]
    pub window: Option<usize>,
    /// Server processes whose CPU, context switches and sync calls the cell sums: 1 for one
    /// server, 3 for a NATS cluster, 4 for a tidemark node on one.
    #[serde(default)]
    pub processes: usize,
    pub events: u64,
    pub seconds: f64,
    pub events_per_sec: f64,
    /// Per request (one batch), from send to durable reply (windowed: to its acknowledgement).
    pub latency_us: Percentiles,
    /// Server CPU (user + system, whole process tree) per event; in-process targets: this
    /// process's, clients included.
    pub cpu_us_per_event: f64,
    /// Bytes passed to write calls, per event (`wchar` of /proc/<pid>/io).
    pub wchar_per_event: f64,
    /// Page cache dirtied, per event (`write_bytes` of /proc/<pid>/io: counted when a page is
    /// dirtied, so it over-counts partial page rewrites; not what the device wrote, for which
    /// see `device_bytes_per_event`).
    pub write_bytes_per_event: f64,
    /// Bytes the block device under the data directory wrote, per event: its sectors written
    /// (`/sys/dev/block/<major>:<minor>/stat`, field 7) × 512 over the timed run, so what
    /// reached the disk, filesystem journal and metadata included. The count is the whole
    /// device's: anything else writing to it during the cell counts too, and writeback of pages
    /// dirtied before the cell may land in it. None when the data directory is on no block
    /// device (overlay, tmpfs) or its counters cannot be read; `device` says why.
    #[serde(default)]
    pub device_bytes_per_event: Option<f64>,
    /// The block device counted, e.g. `vda (254:0)`, or why none was.
    #[serde(default)]
    pub device: String,
    /// Context switches per event, voluntary + involuntary, summed over the threads of the
    /// server's process tree (`/proc/<pid>/task/*/status`). In-process targets (`in_process`):
    /// every thread of this process, the clients' included. Threads that exit during the cell
    /// take their counts with them (not counted).
    #[serde(default)]
    pub ctx_switches_per_event: f64,
    /// The system runs in the benchmark process: CPU and context switches are this process's,
    /// the clients' included.
    #[serde(default)]
    pub in_process: bool,
    /// The longest time, in µs, during which at least one request was in flight and no append
    /// completed, over all the cell's clients together (a stall of the whole system, not of one
    /// request). With one client it is about the slowest request.
    #[serde(default)]
    pub longest_pause_us: u64,
    /// PostgreSQL: WAL bytes per event (`pg_current_wal_lsn()`).
    pub wal_bytes_per_event: Option<f64>,
    /// Sync calls (fsync, fdatasync, …) per event, from a separate pass of the same shape
    /// under `strace -f -c` (never during the timed cell), summed over every process of
    /// `processes`: a three-replica NATS stream's cell counts all three servers' calls.
    pub fsyncs_per_event: Option<f64>,
    /// The sync calls and events of that pass.
    pub fsync_calls: u64,
    pub fsync_pass_events: u64,
    /// tidemark in process: the read models' lag at the cell's end and its catch-up time.
    pub follow: Option<crate::targets::FollowLag>,
    pub error: Option<String>,
    /// tidemark over HTTP with `--layers`: the server's CPU per event by layer, from a profiled
    /// pass of the same shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<crate::layers::Layer>,
}

/// `x` to 4 significant digits (sync calls per event span 2 to 0.0001).
fn sig4(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

pub struct CellPlan {
    pub clients: usize,
    pub batch: usize,
    pub events: u64,
    pub seconds: f64,
    pub count_fsyncs: bool,
    /// Profile a pass of tidemark over HTTP by layer ([`crate::layers`]).
    pub layers: bool,
}

impl CellPlan {
    /// A pass of this cell's shape: up to `events` events, until `deadline`.
    fn pass(&self, events: u64, deadline: Option<Instant>) -> Pass {
        Pass {
            clients: self.clients,
            batch: self.batch,
            events,
            deadline,
        }
    }
}

/// One append cell: a warm-up batch per client, the timed run, then (optionally) the traced
/// pass that counts sync calls, each driven by `driver`.
pub async fn append_cell<T: Target, D: Driver<T>>(
    rig: &mut Rig<T>,
    p: &CellPlan,
    driver: &D,
) -> AppendCell {
    let window = driver.window();
    let name = match window {
        Some(_) => format!("{}-window", rig.target.name()),
        None => rig.target.name().to_owned(),
    };
    let mut cell = AppendCell {
        system: name,
        clients: p.clients,
        batch: p.batch,
        window,
        processes: 0,
        events: 0,
        seconds: 0.0,
        events_per_sec: 0.0,
        latency_us: Percentiles::default(),
        cpu_us_per_event: 0.0,
        wchar_per_event: 0.0,
        write_bytes_per_event: 0.0,
        device_bytes_per_event: None,
        device: String::new(),
        ctx_switches_per_event: 0.0,
        in_process: false,
        longest_pause_us: 0,
        wal_bytes_per_event: None,
        fsyncs_per_event: None,
        fsync_calls: 0,
        fsync_pass_events: 0,
        follow: None,
        error: None,
        layers: Vec::new(),
    };
    // Warm-up: connections open, every client's first request served.
    let warm = driver
        .drive(rig, p.pass((p.clients * p.batch) as u64, None))
        .await;
    if let Some(e) = warm.error {
        cell.error = Some(format!("warm-up: {e}"));
        return cell;
    }
    let proc = rig.target.proc();
    cell.in_process = matches!(proc, Proc::This);
    cell.processes = proc.roots().len();
    let device = match rig.target.data_dir() {
        Some(dir) => BlockDevice::of(dir),
        None => Err("no data directory".to_owned()),
    };
    cell.device = match &device {
        Ok(dev) => dev.name.clone(),
        Err(why) => format!("n/a: {why}"),
    };
    let before: Counters = proc.counters();
    let dev_before = device.as_ref().ok().and_then(BlockDevice::written_bytes);
    let wal_before = rig.target.extra_written().await;
    let deadline = Instant::now() + Duration::from_secs_f64(p.seconds);
    let d = driver.drive(rig, p.pass(p.events, Some(deadline))).await;
    let after = proc.counters();
    let dev_after = device.as_ref().ok().and_then(BlockDevice::written_bytes);
    let wal_after = rig.target.extra_written().await;
    cell.follow = rig.target.follow_lag().await;
    if let Some(f) = cell.follow {
        eprintln!(
            "  read models: {} events behind the head at the cell's end, caught up {} ms later",
            f.lag_events, f.catch_up_ms
        );
    }
    let used = after.since(before);
    let n = d.events.max(1) as f64;
    cell.events = d.events;
    cell.seconds = round3(d.seconds);
    cell.events_per_sec = (d.events as f64 / d.seconds.max(1e-9)).round();
    cell.latency_us = Percentiles::from(&d.hist);
    cell.cpu_us_per_event = round1(used.cpu_ticks as f64 / clock_ticks() * 1e6 / n);
    cell.wchar_per_event = (used.wchar as f64 / n).round();
    cell.write_bytes_per_event = (used.write_bytes as f64 / n).round();
    if let (Some(a), Some(b)) = (dev_before, dev_after) {
        cell.device_bytes_per_event = Some((b.saturating_sub(a) as f64 / n).round());
    } else if device.is_ok() {
        cell.device = format!("n/a: {}: stat unreadable", cell.device);
    }
    cell.ctx_switches_per_event = sig4(used.ctx_switches as f64 / n);
    cell.longest_pause_us = u64::try_from(d.longest_pause.as_micros()).unwrap_or(u64::MAX);
    if let (Some(a), Some(b)) = (wal_before, wal_after) {
        cell.wal_bytes_per_event = Some((b.saturating_sub(a) as f64 / n).round());
    }
    cell.error = d.error;
    if cell.error.is_none()
        && p.layers
        && matches!(cell.system.as_str(), "tidemark-http" | "tidemark-jetstream")
    {
        profile_layers(rig, p, driver, proc, &mut cell).await;
    }
    if cell.error.is_some() || !p.count_fsyncs {
        return cell;
    }
    // The traced pass: a few requests per client (a few windows of them), the same shape.
    let pass_events = trace_pass_events(p.clients, p.batch, window);
    match SyscallCount::attach(proc) {
        Ok(trace) => {
            let deadline = Instant::now() + Duration::from_secs(10);
            let d = driver.drive(rig, p.pass(pass_events, Some(deadline))).await;
            match (trace.finish(), d.error) {
                (Ok(calls), None) if d.events > 0 && calls > 0 => {
                    cell.fsyncs_per_event = Some(sig4(calls as f64 / d.events as f64));
                    cell.fsync_calls = calls;
                    cell.fsync_pass_events = d.events;
                }
                // Every system here syncs what it acknowledges: none seen means strace did not
                // see the pass (it was still attaching), not a free durability.
                (Ok(_), None) => {
                    eprintln!("  (sync calls not counted: strace saw none in the pass)");
                }
                (Err(e), _) | (_, Some(e)) => {
                    eprintln!("  (sync calls not counted: {e})");
                }
            }
        }
        Err(e) => eprintln!("  (sync calls not counted: {e})"),
    }
    cell
}

/// Events of the traced pass: four requests per client, or four windows of them, at least 200
/// and at most 200,000 (its 10 s deadline stops it sooner on a slow system).
fn trace_pass_events(clients: usize, batch: usize, window: Option<usize>) -> u64 {
    let requests = clients * 4 * window.unwrap_or(1);
    ((requests * batch) as u64).clamp(200, 200_000)
}

/// A pass of the cell's shape under `perf record`, shared out by layer.
async fn profile_layers<T: Target, D: Driver<T>>(
    rig: &mut Rig<T>,
    p: &CellPlan,
    driver: &D,
    proc: Proc,
    cell: &mut AppendCell,
) {
    match crate::layers::Profile::attach(proc) {
        Ok(profile) => {
            let deadline = Instant::now() + crate::layers::Profile::pass();
            let d = driver.drive(rig, p.pass(p.events, Some(deadline))).await;
            match (profile.finish(cell.cpu_us_per_event), d.error) {
                (Ok(layers), None) => {
                    for l in &layers {
                        eprintln!(
                            "    {:>6.1} µs/ev {:>5.1} %  {}",
                            l.us_per_event,
                            l.share * 100.0,
                            l.name
                        );
                    }
                    cell.layers = layers;
                }
                (Err(e), _) | (_, Some(e)) => eprintln!("  (layers not profiled: {e})"),
            }
        }
        Err(e) => eprintln!("  (layers not profiled: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::BenchEvent;
    use crate::targets::Page;
    use futures::FutureExt;
    use futures::future::BoxFuture;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;
    use tokio::sync::Semaphore;

    /// Requests in flight now and at most.
    #[derive(Default)]
    struct Gauge {
        now: AtomicUsize,
        max: AtomicUsize,
    }

    impl Gauge {
        fn up(&self) {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.max.fetch_max(n, Ordering::SeqCst);
        }
        fn down(&self) {
            self.now.fetch_sub(1, Ordering::SeqCst);
        }
        fn max(&self) -> usize {
            self.max.load(Ordering::SeqCst)
        }
    }

    /// A system that acknowledges each send `delay` later and counts what is in flight, per
    /// client and across them; the `fail_at`-th send's acknowledgement is a refusal.
    struct Fake {
        delay: Duration,
        open: Option<Arc<Semaphore>>,
        all: Arc<Gauge>,
        clients: Mutex<Vec<Arc<Gauge>>>,
        sends: AtomicU64,
        fail_at: Option<u64>,
    }

    impl Fake {
        fn new(delay_ms: u64, open: Option<usize>, fail_at: Option<u64>) -> Fake {
            Fake {
                delay: Duration::from_millis(delay_ms),
                open: open.map(|n| Arc::new(Semaphore::new(n))),
                all: Arc::default(),
                clients: Mutex::default(),
                sends: AtomicU64::new(0),
                fail_at,
            }
        }

        fn max_per_client(&self) -> usize {
            let clients = self.clients.lock().unwrap();
            clients.iter().map(|g| g.max()).max().unwrap_or(0)
        }
    }

    impl Target for Fake {
        type Conn = Arc<Gauge>;
        type Batch = usize;
        type Pos = u64;

        fn name(&self) -> &'static str {
            "fake"
        }
        fn proc(&self) -> Proc {
            Proc::This
        }
        fn data_dir(&self) -> Option<&std::path::Path> {
            None
        }
        async fn connect(&self) -> Result<Arc<Gauge>, String> {
            let g = Arc::new(Gauge::default());
            self.clients.lock().unwrap().push(g.clone());
            Ok(g)
        }
        fn prepare(&self, events: &[BenchEvent]) -> usize {
            events.len()
        }
        async fn append(&self, c: &mut Arc<Gauge>, b: usize) -> Result<(), String> {
            self.send(c, b).await?.await
        }
        async fn read_from(
            &self,
            _: &mut Arc<Gauge>,
            _: &u64,
            _: usize,
        ) -> Result<Page<u64>, String> {
            Err("the fake keeps nothing".into())
        }
        async fn stop(self) {}
    }

    impl Pipelined for Fake {
        type Ack = BoxFuture<'static, Result<(), String>>;

        async fn send(&self, c: &mut Arc<Gauge>, _: usize) -> Result<Self::Ack, String> {
            let n = self.sends.fetch_add(1, Ordering::SeqCst) + 1;
            let (client, all, delay) = (c.clone(), self.all.clone(), self.delay);
            client.up();
            all.up();
            let refuse = self.fail_at == Some(n);
            Ok(async move {
                tokio::time::sleep(delay).await;
                client.down();
                all.down();
                if refuse {
                    Err("refused".to_owned())
                } else {
                    Ok(())
                }
            }
            .boxed())
        }

        fn open_limit(&self, batch: usize) -> Option<Arc<Semaphore>> {
            self.open.clone().filter(|_| batch > 1)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_window_fills_and_never_overflows() {
        let mut rig = Rig::new(Fake::new(5, None, None), 1);
        let d = rig.run_windowed(1, 1, 200, None, 8).await;
        assert!(d.error.is_none(), "{:?}", d.error);
        assert_eq!(d.events, 200, "every acknowledged event counted");
        assert_eq!(d.hist.len(), 200, "one latency per publish");
        assert_eq!(
            rig.target.max_per_client(),
            8,
            "the window is used, and no more"
        );
        assert_eq!(rig.target.all.now.load(Ordering::SeqCst), 0, "all awaited");
        // Each publish waited about the fake's 5 ms, not 8 × 5 ms: they overlapped.
        assert!(
            d.hist.value_at_quantile(0.5) < 20_000,
            "{}",
            d.hist.value_at_quantile(0.5)
        );
        assert!(
            d.seconds < 200.0 * 0.005 / 2.0,
            "{} s: not pipelined",
            d.seconds
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_batches_are_bounded_across_clients() {
        // Six clients with windows of 32 batches could open 192 at once; the system's bound
        // (NATS: 50 atomic batches per stream) holds them to 50, and is reached.
        let mut rig = Rig::new(Fake::new(3, Some(50), None), 2);
        let events = 6 * 32 * 10 * 3;
        let d = rig.run_windowed(6, 10, events, None, 32).await;
        assert!(d.error.is_none(), "{:?}", d.error);
        assert_eq!(d.events, events);
        assert_eq!(rig.target.all.max(), 50, "at most 50 open, and 50 used");
        assert!(rig.target.max_per_client() <= 32);
        // Single publishes are not batches: the bound does not apply.
        let d = rig.run_windowed(6, 1, 6 * 32 * 3, None, 32).await;
        assert!(d.error.is_none(), "{:?}", d.error);
        assert!(rig.target.all.max() > 50, "{}", rig.target.all.max());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_publish_fails_the_cell_and_stops_every_client() {
        let mut rig = Rig::new(Fake::new(2, None, Some(20)), 3);
        let d = rig.run_windowed(4, 1, 100_000, None, 16).await;
        assert_eq!(d.error.as_deref(), Some("refused"));
        assert!(d.events < 1_000, "{} events: the clients went on", d.events);
        assert_eq!(
            rig.target.all.now.load(Ordering::SeqCst),
            0,
            "in flight awaited"
        );
        assert_eq!(rig.conns.len(), 4, "connections come back");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deadline_stops_sending_and_counts_what_was_acknowledged() {
        let mut rig = Rig::new(Fake::new(2, None, None), 4);
        let deadline = Instant::now() + Duration::from_millis(50);
        let d = rig.run_windowed(2, 5, 10_000_000, Some(deadline), 4).await;
        assert!(d.error.is_none());
        assert!(d.events > 0 && d.events % 5 == 0, "{}", d.events);
        assert_eq!(d.events, d.hist.len() * 5);
        assert!(d.seconds < 1.0, "{}", d.seconds);
        assert_eq!(rig.appended, d.events);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drivers_name_their_cells() {
        let mut rig = Rig::new(Fake::new(1, None, None), 5);
        let p = CellPlan {
            clients: 2,
            batch: 1,
            events: 100,
            seconds: 5.0,
            count_fsyncs: false,
            layers: false,
        };
        let closed = append_cell(&mut rig, &p, &ClosedLoop).await;
        assert_eq!((closed.system.as_str(), closed.window), ("fake", None));
        assert_eq!(rig.target.max_per_client(), 1, "closed loop: one at a time");
        let windowed = append_cell(&mut rig, &p, &Windowed(4)).await;
        assert_eq!(
            (windowed.system.as_str(), windowed.window),
            ("fake-window", Some(4))
        );
        assert_eq!(windowed.events, 100);
        assert_eq!(windowed.processes, 1);
    }

    #[test]
    fn the_traced_pass_has_the_cells_shape() {
        assert_eq!(trace_pass_events(1, 1, None), 200);
        assert_eq!(trace_pass_events(16, 100, None), 6_400);
        assert_eq!(trace_pass_events(1, 1, Some(256)), 1_024, "four windows");
        assert_eq!(trace_pass_events(256, 100, Some(256)), 200_000, "capped");
    }
}
