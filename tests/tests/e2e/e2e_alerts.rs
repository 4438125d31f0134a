//! Alert rules and the dashboard (spec section 18): `deploy/prometheus/tidemark-alerts.yml`
//! passes `promtool check rules`, and a real Prometheus (Debian's `prometheus`, which `.ci/run`
//! installs) scraping two real servers — one driven into stuck and parked deliveries, an open
//! endpoint circuit, a stopped
//! and a stalled subscription, a stale source and server errors, the other started with its
//! disk "full" and its last backup two days old, and a target where nothing listens — evaluates
//! each of those rules' expressions true for the server in that state (the alert pending or
//! firing, with that server's labels) and every rule false for the servers not in its state.
//! A poisoned log, a panicked decider and models 40,960 events behind are injected with the
//! `TIDEMARK_FAULT_*` test knobs; a disk filling up is a server on a small tmpfs that a filler
//! file takes more of while Prometheus scrapes. The Grafana dashboard's
//! metrics are all in a real scrape (`deploy/grafana/check.py`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts};

use crate::common::{append_ok, notif_ev, wait_for};
use crate::e2e_deliveries::{act, claim};

fn deploy(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("deploy")
        .join(rel)
}

fn tool(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is not installed: .ci/run installs Debian's prometheus package (promtool too)");
}

#[test]
fn the_rules_pass_promtool() {
    let out = std::process::Command::new(tool("promtool"))
        .arg("check")
        .arg("rules")
        .arg(deploy("prometheus/tidemark-alerts.yml"))
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An alert expected active: its name, the server's instance, and a label it must carry.
type Expected<'a> = (&'a str, &'a str, Option<(&'a str, &'a str)>);

/// A port free now, for a process that cannot be told to take port 0 and say which it took.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

struct Prometheus {
    child: tokio::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn prometheus(targets: &[SocketAddr]) -> Prometheus {
    let dir = tempfile::tempdir().expect("tempdir");
    let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {:?}\n\
             scrape_configs:\n  - job_name: tidemark\n    static_configs:\n      - targets: [{}]\n",
            deploy("prometheus/tidemark-alerts.yml")
                .display()
                .to_string(),
            list.join(", ")
        ),
    )
    .expect("config");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let child = tokio::process::Command::new(tool("prometheus"))
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    Prometheus {
        child,
        addr,
        _dir: dir,
    }
}

/// The active (pending or firing) alerts: (alertname, instance, the other labels).
async fn active(p: &Prometheus) -> Option<Vec<Value>> {
    let r = reqwest::get(format!("http://{}/api/v1/alerts", p.addr))
        .await
        .ok()?;
    let v: Value = r.json().await.ok()?;
    v["data"]["alerts"].as_array().cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_alert_is_true_for_a_server_in_its_state() {
    // Server A: work that nobody does, a dead source, server errors.
    let dir = tempfile::tempdir().expect("tempdir");
    let backups = dir.path().join("backups");
    // A source whose upstream refuses every connection: stale after three 1 s intervals.
    let dead_source = crate::e2e_sources::source_toml(
        "dead-upstream",
        "127.0.0.1:9".parse().expect("addr"),
        "every = \"1s\"",
    );
    let mut a = Server::start(
        ServerOpts::default()
            .env("TEST_SOURCE_TOKEN", "unused")
            .env("AL_HOOK_URL", "http://127.0.0.1:9/unresolved")
            .config(format!(
                "[server]\nbackup_dir = {:?}\n[notifications.outbox]\nstuck_after = \"1s\"\n{dead_source}",
                backups.display().to_string()
            )),
    )
    .await;
    // A webhook route whose URL is an `env:` variable, which A no longer has after a
    // restart: unresolved (its deliveries wait).
    let r = a
        .send(
            a.request(reqwest::Method::PUT, "/v1/routes/al-env")
                .json(&json!({
                "route": {"sink": "webhook", "url": "env:AL_HOOK_URL", "priorities": ["urgent"]},
                "reason": "a URL from the environment"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    a.set_env("AL_HOOK_URL", None);
    a.sigterm();
    a.wait_exit(Duration::from_secs(30)).await;
    a.restart().await;
    // Server B: its disk short of the space it keeps in reserve, and its last backup two days
    // old (read from the newest manifest under its backup_dir at start).
    let b_backups = dir.path().join("b-backups");
    std::fs::create_dir_all(b_backups.join("old")).expect("mkdir");
    let manifest = b_backups.join("old/manifest.json");
    std::fs::write(
        &manifest,
        json!({"format": "tidemark-backup/1", "after_seq": 0, "through_seq": 1, "events": 1,
               "bytes": 0, "blake3": "", "version": "0.1.0"})
        .to_string(),
    )
    .expect("write");
    std::fs::File::options()
        .write(true)
        .open(&manifest)
        .and_then(|f| {
            f.set_modified(std::time::SystemTime::now() - Duration::from_secs(2 * 24 * 3600))
        })
        .expect("date the manifest");
    let b = Server::start(ServerOpts::default().config(format!(
        "[server]\nbackup_dir = {:?}\n[log]\nmin_free = \"1000000GB\"\n",
        b_backups.display().to_string()
    )))
    .await;

    // An endpoint whose receiver refuses every connection: its circuit opens at the first
    // failure (and its delivery waits a day for the probe).
    let r = a
        .send(
            a.request(reqwest::Method::PUT, "/v1/routes/al-hook")
                .json(&json!({
                "route": {"sink": "webhook", "url": "http://127.0.0.1:9/hook",
                          "priorities": ["urgent"],
                          "circuit": {"failures": 1, "cool_down": "24h"}},
                "reason": "an endpoint that never answers"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Stuck (two urgent notifications nobody claims) and parked (one failed for good).
    for i in 0..3 {
        append_ok(
            &a,
            &notif_ev(
                &format!("al-{i}"),
                json!({"priority": "urgent", "title": format!("t{i}")}),
            ),
        )
        .await;
    }
    let got = wait_for(Duration::from_secs(60), "a delivery to claim", || async {
        let rows = claim(&a, "alerts", 1, 60_000).await;
        (!rows.is_empty()).then_some(rows)
    })
    .await;
    let id = got[0]["id"].as_str().expect("id").to_owned();
    let r = act(
        &a,
        &id,
        "fail",
        &json!({"owner": "alerts", "error_code": "gone", "error": "for good", "retryable": false}),
    )
    .await;
    assert_eq!(r.json["status"], "parked", "{}", r.text);
    // A subscription stopped at a mismatch, and one with a terminal notification nobody pulls.
    let task = |t: &str, ty: &str, p: Value| json!({"stream": "task_events", "subject": t, "type": ty, "payload": p});
    for (t, sub) in [("al-stop", "al-stop-sub"), ("al-stall", "al-stall-sub")] {
        append_ok(
            &a,
            &json!({"events": [
                task(t, "task.created", json!({"project_id": "p"})),
                task(t, "task.run_started", json!({"run_id": "r1"})),
            ]}),
        )
        .await;
        let r = a
            .send(
                a.request(reqwest::Method::POST, &format!("/v1/tasks/{t}/notifications/bridges"))
                    .json(&json!({"subscription_id": sub, "bridge_id": "al-bridge", "sink": {"kind": "pull"}})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    append_ok(
        &a,
        &json!({"events": [
            task("al-stop", "task.run_completed", json!({"run_id": "r1"})),
            task("al-stop", "task.run_failed", json!({"run_id": "r1", "error": "late"})),
            task("al-stall", "task.run_completed", json!({"run_id": "r1"})),
        ]}),
    )
    .await;
    // One backup that succeeds (its metrics are on the dashboard), then server errors: backups
    // that cannot be written (their directory would be under a file).
    let r = a
        .send(
            a.request(reqwest::Method::POST, "/v1/admin/backup")
                .json(&json!({"to": "ok"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // A refusal (the name is taken) is counted apart from failures.
    let r = a
        .send(
            a.request(reqwest::Method::POST, "/v1/admin/backup")
                .json(&json!({"to": "ok"})),
        )
        .await;
    assert_eq!(r.json["code"], "backup_exists", "{}", r.text);
    std::fs::write(backups.join("blocker"), "not a directory").expect("write");
    for _ in 0..40 {
        let r = a
            .send(
                a.request(reqwest::Method::POST, "/v1/admin/backup")
                    .json(&json!({"to": "blocker/b"})),
            )
            .await;
        assert_eq!(r.status.as_u16(), 500, "{}", r.text);
    }
    // B refuses appends: its disk is "full".
    let (code, body) = b.append(&json!({"stream": "s", "type": "t.x"})).await;
    assert_eq!(code.as_u16(), 507, "{body}");

    // A third target where nothing listens: down.
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    // Faults no test can cause for real here, injected (the TIDEMARK_FAULT_* test knobs): C's
    // log fails a write after its first event (a storage failure poisons it), D's decider
    // panics at its first command, E's models fold each batch three seconds late.
    let c =
        Server::start(ServerOpts::default().env("TIDEMARK_FAULT_LOG_POISON_AFTER_SEQ", "1")).await;
    let (code, body) = c.append(&json!({"stream": "s", "type": "t.x"})).await;
    assert_eq!(code.as_u16(), 503, "{body}");
    assert_eq!(body["code"], "log_unavailable", "{body}");
    let d = Server::start(ServerOpts::default().env("TIDEMARK_FAULT_DECIDER_PANIC", "1")).await;
    let r = crate::e2e_deliveries::post(
        &d,
        "/v1/deliveries/claim",
        &json!({"sink": "app", "owner": "o", "limit": 1, "lease_ms": 1000}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text);
    let e = Server::start(ServerOpts::default().env("TIDEMARK_FAULT_FOLD_DELAY_MS", "3000")).await;
    for i in 0..60 {
        let events: Vec<Value> = (0..1000)
            .map(
                |j| json!({"event_id": format!("lag-{i}-{j}"), "stream": "bulk", "type": "bulk.x"}),
            )
            .collect();
        let (code, body) = e.append(&json!({ "events": events })).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
    }
    // F: its data directory on a small filesystem (a tmpfs; the suite runs as root) that a
    // filler file takes more of while Prometheus scrapes: under 1 GiB free and falling.
    let fs = crate::e2e_disk_full::Mount::tmpfs("256m");
    let f = Server::try_start(ServerOpts {
        data_dir: Some(fs.path().join("data")),
        config: Some("[log]\ncache_mb = 8\nmin_free = \"1MiB\"\n".into()),
        ..ServerOpts::default()
    })
    .await
    .expect("a server on the small filesystem");
    let p = prometheus(&[
        a.addr(),
        b.addr(),
        dead,
        c.addr(),
        d.addr(),
        e.addr(),
        f.addr(),
    ])
    .await;
    let filling = {
        let filler = fs.path().join("filler");
        tokio::spawn(async move {
            use std::io::Write;
            let mut file = std::fs::File::create(&filler).expect("filler");
            for _ in 0..40 {
                file.write_all(&vec![7u8; 4 << 20]).expect("fill");
                file.sync_all().expect("sync");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    // Server errors go on while Prometheus scrapes (a rate needs them between two scrapes).
    let errors = {
        let api = a.api();
        tokio::spawn(async move {
            loop {
                let r = api
                    .send(
                        api.request(reqwest::Method::POST, "/v1/admin/backup")
                            .json(&json!({"to": "blocker/b"})),
                    )
                    .await;
                assert_eq!(r.status.as_u16(), 500, "{}", r.text);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let (ia, ib, id) = (a.addr().to_string(), b.addr().to_string(), dead.to_string());
    let (ic, idd, ie) = (
        c.addr().to_string(),
        d.addr().to_string(),
        e.addr().to_string(),
    );
    let iff = f.addr().to_string();
    let expected: Vec<Expected> = vec![
        ("TidemarkDeliveriesStuck", &ia, Some(("sink", "app"))),
        ("TidemarkDeliveriesParked", &ia, Some(("sink", "app"))),
        (
            "TidemarkEndpointCircuitOpen",
            &ia,
            Some(("route", "al-hook")),
        ),
        ("TidemarkEndpointUnresolved", &ia, Some(("route", "al-env"))),
        ("TidemarkConsumersStopped", &ia, None),
        ("TidemarkConsumersStalled", &ia, None),
        (
            "TidemarkSourceStale",
            &ia,
            Some(("source", "dead-upstream")),
        ),
        ("TidemarkServerErrors", &ia, None),
        ("TidemarkStorageFull", &ib, None),
        ("TidemarkBackupOld", &ib, None),
        // Never backed up (the gauge is 0 from the start; an absent series fired nothing).
        ("TidemarkBackupOld", &ic, None),
        ("TidemarkBackupOld", &idd, None),
        ("TidemarkBackupOld", &ie, None),
        ("TidemarkBackupOld", &iff, None),
        ("TidemarkDown", &id, None),
        ("TidemarkStoragePoisoned", &ic, None),
        ("TidemarkModelsPoisoned", &idd, None),
        ("TidemarkModelsLagging", &ie, None),
        ("TidemarkDiskFillingUp", &iff, None),
    ];
    let deadline = Instant::now() + Duration::from_secs(120);
    let alerts = loop {
        let alerts = active(&p).await.unwrap_or_default();
        let has = |name: &str, inst: &str, label: Option<(&str, &str)>| {
            alerts.iter().any(|al| {
                al["labels"]["alertname"] == name
                    && al["labels"]["instance"] == inst
                    && label.is_none_or(|(k, v)| al["labels"][k] == v)
            })
        };
        let missing: Vec<&str> = expected
            .iter()
            .filter(|(n, i, l)| !has(n, i, *l))
            .map(|(n, _, _)| *n)
            .collect();
        if missing.is_empty() {
            break alerts;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never evaluated {missing:?} true; active alerts: {alerts:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    errors.abort();
    filling.abort();
    // And nothing else: the other rules are false for both servers (B is only full; A is not).
    for al in &alerts {
        let name = al["labels"]["alertname"].as_str().unwrap_or("");
        let inst = al["labels"]["instance"].as_str().unwrap_or("");
        assert!(
            expected.iter().any(|(n, i, _)| *n == name && *i == inst),
            "{name} is active for {inst}, which is not in that state: {al}"
        );
    }

    // The dashboard's metrics are all in a scrape of A.
    let scrape = a.get("/metrics").await.text;
    let backups_of = |outcome: &str| {
        crate::common::metric_sum(
            &scrape,
            &format!("tidemark_backups_total{{outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(backups_of("ok"), Some(1.0), "{scrape}");
    assert_eq!(backups_of("refused"), Some(1.0), "{scrape}");
    assert!(backups_of("failed").is_some_and(|n| n >= 40.0), "{scrape}");
    // A server never backed up has every backup series, at 0.
    let never = f.get("/metrics").await.text;
    for series in [
        "tidemark_backup_last_success_timestamp_seconds",
        "tidemark_backup_last_through_seq",
        "tidemark_backups_total{outcome=\"ok\"}",
        "tidemark_backups_total{outcome=\"refused\"}",
        "tidemark_backups_total{outcome=\"failed\"}",
    ] {
        assert_eq!(
            crate::common::metric_sum(&never, series),
            Some(0.0),
            "{series}: {never}"
        );
    }
    let file = dir.path().join("scrape.txt");
    std::fs::write(&file, &scrape).expect("write");
    let out = std::process::Command::new("python3")
        .arg(deploy("grafana/check.py"))
        .arg(&file)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "dashboard check: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
