//! Each target of `tidemark bench` appends, reads back and reports a well-formed result on a
//! tiny run, against the real servers (started by the benchmark on loopback, stopped by PID).
//! A peer that is not installed is skipped with the reason printed; with
//! `TIDEMARK_BENCH_REQUIRE_PEERS=1` (set by `.ci/run`, which installs them) a skip fails.
//! Nothing here is timed: figures are checked for shape (present, positive, consistent), never
//! against a speed.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const BENCH: &str = env!("CARGO_BIN_EXE_tidemark-bench");

/// `<target>/<profile>/tidemark`, built by the README's test command (`cargo build --workspace
/// --bins`) before the tests run.
fn tidemark_bin() -> PathBuf {
    let p = PathBuf::from(BENCH).with_file_name("tidemark");
    assert!(
        p.is_file(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        p.display()
    );
    p
}

fn require_peers() -> bool {
    std::env::var("TIDEMARK_BENCH_REQUIRE_PEERS").is_ok_and(|v| v == "1")
}

/// Run `program` (`name`) with `args`, then a fresh `--work-dir` and a `--json-out` in it; it
/// must succeed. The JSON document it wrote, and its output.
fn run_json(program: impl AsRef<OsStr>, name: &str, args: &[impl AsRef<OsStr>]) -> (Value, Output) {
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("work dir");
    let json = work.path().join("result.json");
    let out = Command::new(program)
        .args(args)
        .arg("--work-dir")
        .arg(work.path())
        .arg("--json-out")
        .arg(&json)
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name} failed: {stderr}");
    let doc: Value = serde_json::from_slice(&std::fs::read(&json).expect("json written"))
        .expect("the JSON document parses");
    (doc, out)
}

/// [`run_json`] of the benchmark binary with `args` and the tidemark binary.
fn run_bench(args: &[&str]) -> (Value, Output) {
    let mut args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    args.extend(["--tidemark-bin".into(), tidemark_bin().into()]);
    run_json(BENCH, "tidemark-bench", &args)
}

/// The reason the benchmark gave for skipping `system`, if it did (said on stdout; a skip
/// fails with `TIDEMARK_BENCH_REQUIRE_PEERS=1`).
fn skip(doc: &Value, system: &str) -> Option<String> {
    let reason = skipped(doc, system)?;
    assert!(
        !require_peers(),
        "{system} was skipped but TIDEMARK_BENCH_REQUIRE_PEERS=1: {reason}"
    );
    println!("SKIPPED {system}: {reason}");
    Some(reason)
}

/// Run the benchmark binary on a tiny plan; the JSON document it wrote.
fn tiny_run(systems: &str, extra: &[&str]) -> Value {
    let mut args = vec!["--systems", systems, "--workloads", "append,readback"];
    args.extend(["--clients", "1,3", "--batches", "1,10", "--events", "40"]);
    args.extend(["--cell-seconds", "30", "--readback-events", "250"]);
    args.extend(extra);
    let (doc, out) = run_bench(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // stdout holds the same document.
    let printed: Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON document");
    assert_eq!(printed["append"], doc["append"]);
    assert!(
        stderr.contains("### Durable appends"),
        "tables on stderr: {stderr}"
    );
    doc
}

/// The reason the benchmark gave for skipping `system`, if it did.
fn skipped(doc: &Value, system: &str) -> Option<String> {
    doc["skipped"]
        .as_array()?
        .iter()
        .find(|s| s["system"] == system)
        .map(|s| s["reason"].as_str().unwrap_or("").to_owned())
}

fn check_system(system: &str) {
    check_cells(system, &[]);
}

/// The append cells of `system` (and its read-back, unless it is a windowed system, which has
/// none).
fn check_cells(system: &str, extra: &[&str]) {
    let doc = tiny_run(system, extra);
    assert_eq!(doc["complete"], true);
    if let Some(reason) = skip(&doc, system) {
        assert!(
            reason.contains("not installed") || reason.contains("not on PATH"),
            "{system} skipped for another reason than a missing server: {reason}"
        );
        return;
    }
    let traced = Command::new("strace").arg("-V").output().is_ok();
    let cells = doc["append"].as_array().expect("append cells");
    assert_eq!(cells.len(), 4, "1,3 clients × batches 1,10: {cells:?}");
    for c in cells {
        assert_eq!(c["system"], system);
        assert!(c["error"].is_null(), "cell failed: {c}");
        let batch = c["batch"].as_u64().unwrap();
        let events = c["events"].as_u64().unwrap();
        assert!(events >= 40, "every planned event appended: {c}");
        assert_eq!(events % batch, 0, "whole batches only: {c}");
        assert!(c["events_per_sec"].as_f64().unwrap() > 0.0, "{c}");
        let l = &c["latency_us"];
        assert_eq!(
            l["count"].as_u64().unwrap(),
            events / batch,
            "one latency per request: {c}"
        );
        assert!(l["p50"].as_u64().unwrap() > 0 && l["p99"].as_u64() >= l["p50"].as_u64());
        // Every system here writes what it acknowledges; the bytes show in its counters.
        assert!(
            c["wchar_per_event"].as_f64().unwrap() > 0.0,
            "bytes written: {c}"
        );
        assert!(c["cpu_us_per_event"].as_f64().unwrap() >= 0.0);
        if traced {
            // Durable means synced: each system makes sync calls, at most a few per event.
            let f = c["fsyncs_per_event"].as_f64().unwrap_or(-1.0);
            assert!(f > 0.0 && f < 10.0, "sync calls per event: {c}");
        }
        if system.ends_with("-window") {
            assert_eq!(c["window"], 4, "{c}");
        } else {
            assert!(c["window"].is_null(), "{c}");
        }
        let processes = if system.contains("cluster") || system == "tidemark-jetstream" {
            3 + u64::from(system == "tidemark-jetstream")
        } else {
            1
        };
        assert_eq!(c["processes"], processes, "{c}");
        if system == "postgres" {
            assert!(
                c["wal_bytes_per_event"].as_f64().unwrap() > 0.0,
                "WAL bytes: {c}"
            );
        }
    }
    let rb = doc["readback"].as_array().expect("readback");
    if system.ends_with("-window") {
        assert!(
            rb.is_empty(),
            "a windowed system has append cells only: {rb:?}"
        );
        return;
    }
    assert_eq!(rb.len(), 1);
    assert!(rb[0]["error"].is_null(), "readback failed: {}", rb[0]);
    assert_eq!(
        rb[0]["events"], 250,
        "read back exactly what was asked: {}",
        rb[0]
    );
    assert!(rb[0]["mb_per_sec"].as_f64().unwrap() > 0.0);
}

#[test]
fn tidemark_http_appends_and_reads_back() {
    check_system("tidemark-http");
}

#[test]
fn tidemark_inproc_appends_and_reads_back() {
    check_system("tidemark-inproc");
}

#[test]
fn redis_appends_and_reads_back() {
    check_system("redis");
}

#[test]
fn postgres_appends_and_reads_back() {
    check_system("postgres");
}

#[test]
fn sqlite_appends_and_reads_back() {
    check_system("sqlite");
}

#[test]
fn nats_appends_and_reads_back() {
    check_system("nats");
}

/// `tidemark serve` on a three-node JetStream cluster the benchmark starts (spec section 16).
#[test]
fn tidemark_jetstream_appends_and_reads_back() {
    check_system("tidemark-jetstream");
}

/// NATS's own publish to a three-replica stream on such a cluster.
#[test]
fn nats_cluster_appends_and_reads_back() {
    check_system("nats-cluster");
}

/// NATS with a window of asynchronous publishes in flight per client (spec section 11: each
/// peer measured the way its users run it at its best).
#[test]
fn nats_window_appends() {
    check_cells("nats-window", &["--nats-window", "4"]);
}

/// The same on the three-replica stream: atomic batches within the server's 50 open ones.
#[test]
fn nats_cluster_window_appends() {
    check_cells("nats-cluster-window", &["--nats-window", "4"]);
}

/// Reads from one tidemark node on the cluster, then from two at once, as pages and as SSE.
#[test]
fn cluster_reads_from_one_and_two_nodes() {
    let (doc, out) = run_bench(&[
        "--systems",
        "tidemark-jetstream",
        "--workloads",
        "cluster-reads",
        "--readback-events",
        "3000",
        "--reads-clients",
        "2",
        "--reads-sse-clients",
        "2",
        "--reads-seconds",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if skip(&doc, "tidemark-jetstream").is_some() {
        return;
    }
    let r = &doc["cluster_reads"];
    assert!(r["error"].is_null(), "{r}");
    assert_eq!(r["events"], 3000);
    assert!(
        r["second_node_behind_seconds"].as_f64().unwrap() >= 0.0,
        "{r}"
    );
    // A small log: a cold node catches up within the log's open timeout.
    assert!(r["cold_join_error"].is_null(), "{r}");
    assert!(r["cold_join_seconds"].as_f64().unwrap() > 0.0, "{r}");
    for kind in ["pages", "sse"] {
        let phases = r[kind].as_array().unwrap();
        assert_eq!(phases.len(), 2, "one node, then two: {r}");
        for (i, p) in phases.iter().enumerate() {
            let nodes = i as u64 + 1;
            assert_eq!(p["nodes"], nodes);
            assert!(p["error"].is_null(), "{p}");
            let per_node = p["per_node"].as_array().unwrap();
            assert_eq!(per_node.len() as u64, nodes);
            let mut sum = 0;
            for n in per_node {
                let events = n["events"].as_u64().unwrap();
                // Two seconds are time enough to go round a log of 3000 events.
                assert!(events >= 3000, "{kind}: {p}");
                if kind == "pages" {
                    assert_eq!(events % 1000, 0, "whole pages: {p}");
                }
                assert!(n["cores"].as_f64().unwrap() > 0.0, "a node worked: {p}");
                sum += events;
            }
            assert_eq!(p["events"], sum, "{p}");
            assert!(p["busy_cores"].as_f64().unwrap() > 0.0);
        }
        assert!(
            r[format!("{kind}_two_over_one")].as_f64().unwrap() > 0.0,
            "{r}"
        );
    }
    assert!(
        stderr.contains("### Reads from one and two tidemark nodes"),
        "{stderr}"
    );
}

/// `tidemark bench` (the CLI) runs the benchmark binary and the ratio table compares tidemark
/// with a peer of the same run.
#[test]
fn tidemark_bench_subcommand_reports_ratios() {
    let (doc, out) = run_json(
        tidemark_bin(),
        "tidemark bench",
        &[
            "bench",
            "--systems",
            "tidemark-inproc,sqlite",
            "--workloads",
            "fsync,append",
            "--clients",
            "2",
            "--batches",
            "5",
            "--events",
            "50",
            "--fsync-count",
            "5",
            "--no-fsync-count",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ratios = doc["ratios"].as_array().expect("ratios");
    assert_eq!(ratios.len(), 1, "{ratios:?}");
    assert_eq!(ratios[0]["tidemark"], "tidemark-inproc");
    assert_eq!(ratios[0]["peer"], "sqlite");
    assert!(ratios[0]["throughput"].as_f64().unwrap() > 0.0);
    assert_eq!(
        doc["fsync"].as_array().unwrap().len(),
        2,
        "append and overwrite"
    );
    assert!(
        doc["machine"]["uptime"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );
    assert!(stderr.contains("tidemark ÷ peer"), "{stderr}");
}

/// Bad options are refused before anything starts.
#[test]
fn bad_options_are_refused() {
    // The benchmark with `args` fails; what it said on stderr.
    let refused = |args: &[&str]| {
        let out = Command::new(BENCH).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(refused(&["--batches", "1001", "--systems", "sqlite"]).contains("1 to 1000"));
    refused(&["--systems", "oracle"]);
    assert!(
        refused(&["--nats-window", "0", "--systems", "nats-window"]).contains("--nats-window 0")
    );
}
