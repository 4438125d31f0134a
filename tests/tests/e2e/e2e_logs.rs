//! Logs and process metrics (spec section 18): JSON log lines (`TIDEMARK_LOG_FORMAT=json`), one
//! access-log line per request with method, route template, status, duration and request id
//! (never the query string or a path id), every 5xx an error line with its method and route;
//! `/metrics` has the process's figures, the free bytes of the log's disk, the storage state and
//! the build's commit.

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts};

use crate::common::metric_sum;

/// Stop `s` with SIGTERM (a clean exit) and take everything it logged.
async fn stopped_stderr(s: &mut Server) -> String {
    s.sigterm();
    assert!(
        s.wait_exit(std::time::Duration::from_secs(60))
            .await
            .success()
    );
    s.stderr()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_with_an_access_line_per_request_and_no_query_or_ids() {
    // A backup into a directory under a regular file fails on the server's side (500).
    let dir = tempfile::tempdir().expect("tempdir");
    let backups = dir.path().join("backups");
    std::fs::create_dir_all(&backups).expect("mkdir");
    std::fs::write(backups.join("a-file"), "not a directory").expect("write");
    let mut s = Server::start(
        ServerOpts::default()
            .env("TIDEMARK_LOG_FORMAT", "json")
            .config(format!(
                "[server]\nbackup_dir = {:?}\n",
                backups.display().to_string()
            )),
    )
    .await;
    let (code, body) = s
        .append(&json!({"stream": "task_events", "subject": "task-secret-id-77", "type": "task.created", "payload": {"project_id": "p"}}))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let r = s.get("/v1/tasks/task-secret-id-77").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.get("/v1/deliveries?q=private-query-text&limit=5").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s
        .send(
            s.request(reqwest::Method::GET, "/v1/tasks?limit=1")
                .header("x-request-id", "req-logs-0001"),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/admin/backup")
                .json(&json!({"to": "a-file/b1"})),
        )
        .await;
    assert_eq!(r.status.as_u16(), 500, "{}", r.text);
    let metrics = s.get("/metrics").await.text;
    let stderr = stopped_stderr(&mut s).await;

    let lines: Vec<Value> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    assert!(lines.len() > 5, "{stderr}");
    for l in &lines {
        assert!(
            l["timestamp"].is_string() && l["level"].is_string() && l["message"].is_string(),
            "{l}"
        );
    }
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "tidemark::access")
        .collect();
    let find = |method: &str, route: &str| {
        access
            .iter()
            .find(|l| l["method"] == method && l["route"] == route)
            .unwrap_or_else(|| panic!("no access line for {method} {route}: {stderr}"))
    };
    let get_task = find("GET", "/v1/tasks/{id}");
    assert_eq!(get_task["status"], 200);
    assert!(get_task["duration_ms"].as_f64().is_some(), "{get_task}");
    assert!(
        get_task["request_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
    assert_eq!(find("POST", "/v1/events")["status"], 201);
    assert!(
        access
            .iter()
            .any(|l| l["route"] == "/v1/tasks" && l["request_id"] == "req-logs-0001"),
        "the caller's request id: {stderr}"
    );
    let failed = find("POST", "/v1/admin/backup");
    assert_eq!(failed["status"], 500);
    assert_eq!(failed["level"], "ERROR", "a 5xx is an error line: {failed}");
    // One ERROR line per 5xx: the access line carries the code and the server-side cause (it
    // was logged a second time, without its route, where the error was made).
    let errors: Vec<&Value> = lines.iter().filter(|l| l["level"] == "ERROR").collect();
    assert_eq!(errors.len(), 1, "one ERROR line for the one 5xx: {stderr}");
    assert_eq!(failed["code"], "internal", "{failed}");
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("backup") && e.len() > 10),
        "the cause is on the line: {failed}"
    );
    for secret in ["task-secret-id-77", "private-query-text", "q="] {
        assert!(
            !stderr.contains(secret),
            "{secret} reached the log:\n{stderr}"
        );
    }

    // Process metrics, the log's disk, the storage state, the build.
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_threads",
        "process_max_fds",
        "process_start_time_seconds",
        "tidemark_log_disk_free_bytes",
    ] {
        let v = metric_sum(&metrics, name).unwrap_or_else(|| panic!("no {name}:\n{metrics}"));
        assert!(v > 0.0, "{name} = {v}");
    }
    assert!(metric_sum(&metrics, "process_cpu_seconds_total").is_some());
    // A counter in Prometheus's sense (it was typed gauge).
    assert!(
        metrics.contains("# TYPE process_cpu_seconds_total counter\n"),
        "{metrics}"
    );
    assert_eq!(
        metric_sum(&metrics, "tidemark_storage_state{state=\"ok\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric_sum(&metrics, "tidemark_storage_state{state=\"full\"}"),
        Some(0.0)
    );
    assert_eq!(metric_sum(&metrics, "tidemark_models_poisoned"), Some(0.0));
    let build = metrics
        .lines()
        .find(|l| l.starts_with("tidemark_build_info{"))
        .unwrap_or_else(|| panic!("no build info:\n{metrics}"));
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match commit {
        // The binary is built from this tree (the harness refuses a stale one); a commit made
        // since the build would also move HEAD, and the build script rebuilds on that.
        Some(c) => assert!(build.contains(&format!("commit=\"{c}\"")), "{build} vs {c}"),
        None => assert!(build.contains("commit=\""), "{build}"),
    }
}

/// A failing probe is an ERROR line when its answer changes, not at every probe: a full disk
/// (here `min_free` above any disk) under a load balancer asking `/healthz` each second wrote two
/// ERROR lines a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_probe_logs_its_change_once() {
    let mut s = Server::start(
        ServerOpts::default()
            .env("TIDEMARK_LOG_FORMAT", "json")
            .config("[log]\nmin_free = \"1000000GB\"\n"),
    )
    .await;
    for _ in 0..5 {
        let r = s.get("/healthz").await;
        assert_eq!(r.status.as_u16(), 503, "{}", r.text);
        assert!(r.text.contains("insufficient_storage"), "{}", r.text);
    }
    for _ in 0..3 {
        assert_eq!(s.get("/readyz").await.status.as_u16(), 503);
    }
    let stderr = stopped_stderr(&mut s).await;
    let lines: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let probe_errors = |route: &str| {
        lines
            .iter()
            .filter(|l| l["level"] == "ERROR" && l["route"] == route)
            .count()
    };
    assert_eq!(probe_errors("/healthz"), 1, "{stderr}");
    assert_eq!(probe_errors("/readyz"), 1, "{stderr}");
    let probes = lines
        .iter()
        .filter(|l| l["target"] == "tidemark::access" && l["route"] == "/healthz")
        .count();
    assert_eq!(probes, 5, "each probe still has its access line: {stderr}");
}
