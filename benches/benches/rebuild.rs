//! Projection benchmark of tidemark (issue "Projections"): append throughput with the
//! projections following the log (through the engine, the clock stopped once they have
//! folded the head) versus the log alone, and the rebuild rate of every projection
//! over a log of realistic task traffic, with peak memory at two log lengths.
//!
//! ```text
//! cargo bench -p tidemark-benches --bench rebuild -- [--events 5000000] [--small 1000000]
//! ```
//!
//! Each measured phase runs in a child process (this executable, hidden subcommands) so that
//! its peak RSS (VmHWM) is its own. The JSON document goes to stdout, tables to stderr.

/// mimalloc instead of glibc malloc: the folds and the writer allocate many small, short-lived
/// buffers, and glibc spent a fifth of a rebuild consolidating and unlinking them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use tidemark_log::{EventLog, Log, LogConfig, NewEvent};

#[derive(Parser)]
#[command(name = "rebuild", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Events of the large log.
    #[arg(long, default_value_t = 5_000_000)]
    events: u64,
    /// Events of the small log (memory comparison).
    #[arg(long, default_value_t = 1_000_000)]
    small: u64,
    /// Events of the append comparison (projections vs log only).
    #[arg(long, default_value_t = 300_000)]
    append_events: u64,
    /// Working directory (default: a temp dir under target/).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Append realistic traffic until the log holds `to` events.
    #[command(hide = true)]
    Fill {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        to: u64,
        #[arg(long)]
        projections: bool,
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        #[arg(long, default_value_t = 4)]
        appenders: usize,
    },
    /// Open the log and rebuild every projection.
    #[command(hide = true)]
    Rebuild {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Append latency of 16 appenders × 1 event, alone and while a rebuild of every
    /// projection runs (the rebuild folds on the models' side: appends should not wait).
    #[command(hide = true)]
    AppendDuringRebuild {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
}

/// Event `i` of a realistic stream: tasks are created, run, reviewed and notified about;
/// one event in eight is free-form.
fn traffic(i: u64) -> NewEvent {
    let task = i / 8;
    let t = format!("task-{task}");
    let run = format!("r{}", task % 3);
    let (stream, subject, ty, payload) = match i % 8 {
        0 => (
            "task_events",
            t,
            "task.created",
            json!({"project_id": format!("p{}", task % 50), "title": "bench task", "review_required": task.is_multiple_of(4)}),
        ),
        1 => ("task_events", t, "task.run_started", json!({"run_id": run})),
        2 => (
            "comments",
            t,
            "comment.added",
            json!({"text": "x".repeat(120)}),
        ),
        3 => (
            "task_events",
            t,
            if task.is_multiple_of(5) {
                "task.run_failed"
            } else {
                "task.run_completed"
            },
            json!({"run_id": run, "error": "exit 1"}),
        ),
        4 => (
            "task_events",
            t,
            "task.run_review_requested",
            json!({"run_id": run}),
        ),
        5 => (
            "task_events",
            t,
            "task.run_review_approved",
            json!({"run_id": run, "reviewer": "rv"}),
        ),
        6 => {
            let id = format!("n-{i}");
            let priority = ["urgent", "action", "warning", "info"][(i % 4) as usize];
            (
                "notifications",
                id,
                "notification.requested",
                json!({"priority": priority, "title": "bench", "recipient": format!("u{}", i % 100)}),
            )
        }
        _ => (
            "task_events",
            t,
            "task.run_started",
            json!({"run_id": format!("r{}", task % 3 + 1)}),
        ),
    };
    let id = if stream == "notifications" {
        Some(subject.clone())
    } else {
        Some(format!("b-{i}"))
    };
    NewEvent::new(id, stream, subject, ty, &payload).expect("valid bench event")
}

fn vm_hwm_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn cfg(dir: &Path) -> LogConfig {
    let mut c = LogConfig::new(dir.join("log.redb"));
    c.cache_bytes = 256 << 20;
    c
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Append up to `to` events: to the log alone, or through the engine as the server runs it
/// (the projections follow the log; the clock stops once they have folded the head).
fn fill(dir: &Path, to: u64, projections: bool, batch: usize, appenders: usize) -> Value {
    let (engine, log, from) = if projections {
        let (engine, rep) = tidemark_engine::Engine::open(&cfg(dir)).expect("open");
        (Some(engine), None, rep.head)
    } else {
        let (log, rep) = Log::open(&cfg(dir)).expect("open");
        (None, Some(log), rep.head)
    };
    let started = Instant::now();
    let mut caught_up_ms = 0u64;
    rt().block_on(async {
        let mut tasks = Vec::new();
        let chunk = (to - from).div_ceil(appenders as u64);
        for a in 0..appenders as u64 {
            let (engine, log) = (engine.clone(), log.clone());
            let lo = from + a * chunk;
            let hi = (lo + chunk).min(to);
            tasks.push(tokio::spawn(async move {
                let mut i = lo;
                while i < hi {
                    let n = (batch as u64).min(hi - i);
                    let evs: Vec<NewEvent> = (i..i + n).map(traffic).collect();
                    match (&engine, &log) {
                        (Some(e), _) => e.log().append(evs).await.map(drop),
                        (_, Some(l)) => l.append(evs).await.map(drop),
                        _ => unreachable!("one of them"),
                    }
                    .expect("append");
                    i += n;
                }
            }));
        }
        for t in tasks {
            t.await.expect("appender");
        }
        if let Some(e) = &engine {
            // Projections current: wait until every model has folded the head.
            let appended = Instant::now();
            loop {
                let e2 = e.clone();
                let r = tokio::task::spawn_blocking(move || e2.read().floor(0))
                    .await
                    .expect("join");
                if r.is_ok() {
                    break;
                }
            }
            caught_up_ms = appended.elapsed().as_millis() as u64;
            e.close().await;
        }
        if let Some(l) = &log {
            l.close().await;
        }
    });
    let secs = started.elapsed().as_secs_f64();
    json!({"from": from, "to": to, "projections": projections, "batch": batch, "appenders": appenders,
           "seconds": secs, "events_per_sec": (to - from) as f64 / secs, "caught_up_ms": caught_up_ms,
           "peak_rss_kb": vm_hwm_kb()})
}

fn rebuild(dir: &Path) -> Value {
    let rss_before = vm_hwm_kb();
    let (log, rep) = Log::open(&cfg(dir)).expect("open");
    let models = tidemark_projections::Models::open(&tidemark_engine::models_config(&cfg(dir)))
        .expect("models");
    models
        .follow(&log, tidemark_engine::FOLLOW_BATCH)
        .expect("follow");
    let rt = rt();
    // Every projection in one pass over the log, as an operator's rebuild of all runs it.
    let reports = tidemark_projections::rebuild::rebuild_many(
        &models,
        &log,
        tidemark_projections::all(),
        true,
        |_, _| {},
    )
    .expect("rebuild");
    let total_ms = reports.first().map_or(0, |r| r.duration_ms);
    let mut per = Vec::new();
    for r in &reports {
        eprintln!(
            "  rebuilt {:<14} {:>10} events  identical={}",
            r.name, r.events_replayed, r.identical
        );
        per.push(json!({"name": r.name, "events": r.events_replayed, "identical": r.identical}));
    }
    rt.block_on(log.close());
    json!({"head": rep.head, "projections": per, "all_ms": total_ms,
           "all_events_per_sec": rep.head as f64 / (total_ms.max(1) as f64 / 1000.0),
           "rss_before_open_kb": rss_before, "peak_rss_kb": vm_hwm_kb()})
}

/// 16 appenders × 1 event for `seconds`: per-append latency (µs) and how many.
async fn appenders(engine: &tidemark_engine::Engine, seconds: u64, tag: &str) -> Value {
    let stop = Instant::now() + std::time::Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for a in 0..16u64 {
        let engine = engine.clone();
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
            let mut i = 0u64;
            while Instant::now() < stop {
                let e = NewEvent::new(
                    Some(format!("adr-{tag}-{a}-{i}")),
                    "task_events",
                    format!("adr-{a}"),
                    "bench.appended",
                    &json!({"n": i}),
                )
                .expect("event");
                let t = Instant::now();
                engine.log().append(vec![e]).await.expect("append");
                h.record(t.elapsed().as_micros() as u64).expect("record");
                i += 1;
            }
            h
        }));
    }
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for t in tasks {
        h.add(t.await.expect("appender")).expect("add");
    }
    json!({"appends": h.len(), "per_sec": h.len() as f64 / seconds as f64,
           "p50_us": h.value_at_quantile(0.5), "p99_us": h.value_at_quantile(0.99),
           "max_us": h.max()})
}

/// Append latency alone, then while every projection is rebuilt (again and again until the
/// window ends), over the log in `dir`.
fn append_during_rebuild(dir: &Path, seconds: u64) -> Value {
    let (engine, rep) = tidemark_engine::Engine::open(&cfg(dir)).expect("open");
    let rt = rt();
    rt.block_on(async {
        // The models current first.
        let e2 = engine.clone();
        tokio::task::spawn_blocking(move || e2.read().floor(0))
            .await
            .expect("join")
            .ok();
        let alone = appenders(&engine, seconds, "alone").await;
        let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let rebuilds = {
            let (engine, busy) = (engine.clone(), busy.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while busy.load(std::sync::atomic::Ordering::SeqCst) {
                    for p in tidemark_projections::all() {
                        engine
                            .rebuild(p.name(), true, |_, _| {})
                            .await
                            .expect("projection")
                            .expect("rebuild");
                    }
                    n += 1;
                }
                n
            })
        };
        // Let the first rebuild get going.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let during = appenders(&engine, seconds, "during").await;
        busy.store(false, std::sync::atomic::Ordering::SeqCst);
        let passes = rebuilds.await.expect("rebuilds");
        engine.close().await;
        let ratio = during["p99_us"].as_f64().unwrap_or(0.0)
            / alone["p99_us"].as_f64().unwrap_or(1.0).max(1.0);
        json!({"head": rep.head, "alone": alone, "during_rebuild": during,
               "rebuild_passes": passes, "p99_ratio": ratio})
    })
}

fn child(args: &[String]) -> Value {
    let exe = std::env::current_exe().expect("exe");
    let out = Command::new(exe)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("spawn child");
    assert!(out.status.success(), "child {args:?} failed");
    serde_json::from_slice(&out.stdout).expect("child json")
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Fill {
            dir,
            to,
            projections,
            batch,
            appenders,
        }) => {
            println!("{}", fill(&dir, to, projections, batch, appenders));
            return ExitCode::SUCCESS;
        }
        Some(Cmd::Rebuild { dir }) => {
            println!("{}", rebuild(&dir));
            return ExitCode::SUCCESS;
        }
        Some(Cmd::AppendDuringRebuild { dir, seconds }) => {
            println!("{}", append_during_rebuild(&dir, seconds));
            return ExitCode::SUCCESS;
        }
        None => {}
    }
    let base = cli.dir.clone().unwrap_or_else(|| {
        let t = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-rebuild");
        let _ = std::fs::remove_dir_all(&t);
        t
    });
    std::fs::create_dir_all(&base).expect("dir");
    let d = |n: &str| base.join(n).display().to_string();
    let mut report = serde_json::Map::new();

    eprintln!(
        "== append: log only vs projections current ({} events, batches of 100, 16 appenders)",
        cli.append_events
    );
    let log_only = child(&[
        s("fill"),
        s("--dir"),
        d("append-log"),
        s("--to"),
        s(cli.append_events),
        s("--batch"),
        s(100),
        s("--appenders"),
        s(16),
    ]);
    let with_proj = child(&[
        s("fill"),
        s("--dir"),
        d("append-proj"),
        s("--to"),
        s(cli.append_events),
        s("--projections"),
        s("--batch"),
        s(100),
        s("--appenders"),
        s(16),
    ]);
    let a = log_only["events_per_sec"].as_f64().unwrap_or(0.0);
    let b = with_proj["events_per_sec"].as_f64().unwrap_or(0.0);
    eprintln!(
        "  log only: {a:>10.0} events/s   projections current: {b:>10.0} events/s   ratio {:.2}",
        b / a.max(1.0)
    );
    report.insert("append_log_only".into(), log_only);
    report.insert("append_with_projections".into(), with_proj);
    report.insert("append_ratio".into(), json!(b / a.max(1.0)));

    for (label, n) in [("small", cli.small), ("large", cli.events)] {
        eprintln!("== fill {n} events (projections current)");
        let f = child(&[
            s("fill"),
            s("--dir"),
            d("rebuild"),
            s("--to"),
            s(n),
            s("--projections"),
        ]);
        eprintln!(
            "  {:.0} events/s",
            f["events_per_sec"].as_f64().unwrap_or(0.0)
        );
        eprintln!("== rebuild all projections over {n} events");
        let r = child(&[s("rebuild"), s("--dir"), d("rebuild")]);
        eprintln!(
            "  all projections: {:.0} events/s; peak RSS {} MiB",
            r["all_events_per_sec"].as_f64().unwrap_or(0.0),
            r["peak_rss_kb"].as_u64().unwrap_or(0) / 1024
        );
        report.insert(format!("fill_{label}"), f);
        report.insert(format!("rebuild_{label}"), r);
    }
    // Last: it appends to the large log.
    eprintln!("== append 16 × 1 alone and during a rebuild of every projection");
    let a = child(&[s("append-during-rebuild"), s("--dir"), d("rebuild")]);
    eprintln!(
        "  p99 alone {} µs, during a rebuild {} µs (ratio {:.2}); {} rebuild passes",
        a["alone"]["p99_us"],
        a["during_rebuild"]["p99_us"],
        a["p99_ratio"].as_f64().unwrap_or(0.0),
        a["rebuild_passes"]
    );
    report.insert("append_during_rebuild".into(), a);
    println!(
        "{}",
        serde_json::to_string_pretty(&Value::Object(report)).unwrap_or_default()
    );
    ExitCode::SUCCESS
}
