//! I10, a full disk, as an operator meets it: the data directory on a small real filesystem (a
//! tmpfs the test mounts; the suite runs as root), `[log] min_free` above what is left once a
//! filler file takes the rest. Appends and commands are refused with `507
//! insufficient_storage` and `Retry-After`, nothing refused is in the log, reads keep working,
//! `/healthz` and `/readyz` answer 503; once the filler is gone, appends succeed again without
//! a restart, within 5 s (asserted with 5× slack).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use tidemark_tests::{Server, ServerOpts};

use crate::common::{append_ok, ev, task_ev, wait_for};

/// A tmpfs mounted for the test, unmounted when dropped (before its temp dir goes).
pub(crate) struct Mount(
    PathBuf,
    #[expect(dead_code, reason = "held to keep the mount's directory")] tempfile::TempDir,
);

impl Mount {
    pub(crate) fn tmpfs(size: &str) -> Mount {
        let dir = tempfile::Builder::new()
            .prefix("tidemark-full-")
            .tempdir()
            .expect("a temp dir");
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).expect("the mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs failed (this test needs root, as in CI): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mount(path, dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn available(&self) -> u64 {
        let s = nix::sys::statvfs::statvfs(&self.0).expect("statvfs");
        s.blocks_available() * s.fragment_size()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_507_and_recovers_without_a_restart() {
    let fs = Mount::tmpfs("48m");
    let mut s = Server::try_start(ServerOpts {
        data_dir: Some(fs.path().join("data")),
        config: Some("[log]\ncache_mb = 8\nmin_free = \"16MiB\"\n".into()),
        ..ServerOpts::default()
    })
    .await
    .expect("the server starts on the small filesystem");
    let api = s.api();
    for i in 0..20 {
        append_ok(
            &api,
            &task_ev(
                &format!("full-{i}"),
                "task.created",
                json!({"project_id": "p"}),
            ),
        )
        .await;
    }
    let head = api.head().await;

    // Fill the filesystem until 8 MiB are left: under the 16 MiB reserve.
    let filler = fs.path().join("filler");
    let fill = fs.available().saturating_sub(8 << 20);
    std::fs::write(&filler, vec![0u8; fill as usize]).expect("write the filler");
    assert!(
        fs.available() < 16 << 20,
        "{} bytes free after filling",
        fs.available()
    );

    let (st, body) = api
        .append(&task_ev(
            "refused",
            "task.created",
            json!({"project_id": "p"}),
        ))
        .await;
    assert_eq!(st, StatusCode::INSUFFICIENT_STORAGE, "{body}");
    assert_eq!(body["code"], "insufficient_storage", "{body}");
    let r = api
        .send(
            api.request(reqwest::Method::POST, "/v1/events")
                .json(&task_ev(
                    "refused-2",
                    "task.created",
                    json!({"project_id": "p"}),
                )),
        )
        .await;
    assert_eq!(r.status, StatusCode::INSUFFICIENT_STORAGE);
    let retry: u64 = r.headers[reqwest::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds");
    assert!(retry >= 1, "Retry-After {retry}");
    // A command is refused the same way.
    let adv = api
        .send(api.request(reqwest::Method::POST, "/v1/cursors/advance").json(&json!({
            "consumer_id": "c", "stream_name": "task_events", "last_sequence": 1, "delivery_id": "d1"
        })))
        .await;
    assert_eq!(adv.status, StatusCode::INSUFFICIENT_STORAGE, "{}", adv.text);
    // Reads keep working; nothing refused is in the log; the health checks say why.
    assert_eq!(api.head().await, head);
    assert_eq!(api.read_all_with("", 1000).await.len() as u64, head);
    for path in ["/healthz", "/readyz"] {
        let r = api.get(path).await;
        assert_eq!(
            r.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{path}: {}",
            r.text
        );
        assert_eq!(r.json["code"], "insufficient_storage", "{path}: {}", r.text);
        assert_eq!(
            r.json["status"], 503,
            "the body's status is the answer's: {}",
            r.text
        );
    }
    // Liveness is not storage (section 18): a restart cannot free the disk.
    let r = api.get("/livez").await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "/livez on a full disk: {}",
        r.text
    );

    // Space returns: appends succeed again, without a restart.
    std::fs::remove_file(&filler).expect("remove the filler");
    let freed = Instant::now();
    let after = loop {
        let (st, body) = api
            .append(&task_ev(
                "after",
                "task.created",
                json!({"project_id": "p"}),
            ))
            .await;
        if st == StatusCode::CREATED {
            break body;
        }
        assert_eq!(st, StatusCode::INSUFFICIENT_STORAGE, "{body}");
        assert!(
            freed.elapsed() < Duration::from_secs(25),
            "appends still refused 25 s after space returned"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "appends accepted {:?} after space returned",
        freed.elapsed()
    );
    assert_eq!(after["last_seq"], head + 1, "{after}");
    assert_eq!(api.get("/healthz").await.status, StatusCode::OK);
    s.sigterm();
    s.wait_exit(Duration::from_secs(30)).await;
}

/// I10 when the reserve is not enough: `min_free = 0` and the filesystem filled to the last
/// byte, so redb itself meets ENOSPC when a checkpoint writes the file (redb then refuses every
/// call until reopened). Appends are refused with 507 (a group whose commit failed may be
/// answered 503: its outcome is unknown, and it is wholly in the log or not at all), the log is
/// not poisoned, `/healthz` answers 503; once space returns the server reopens the log in
/// process by itself, within 5 s (asserted with 5× slack), and every acknowledged event is
/// there — also after a `kill -9` and a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_full_inside_the_log_file_is_recovered_in_process() {
    let fs = Mount::tmpfs("48m");
    let mut s = Server::try_start(ServerOpts {
        data_dir: Some(fs.path().join("data")),
        config: Some("[log]\ncache_mb = 4\nmin_free = \"0\"\n".into()),
        ..ServerOpts::default()
    })
    .await
    .expect("the server starts on the small filesystem");
    let api = s.api();
    append_ok(
        &api,
        &ev(
            "before",
            "task_events",
            "before",
            "task.created",
            json!({"project_id": "p"}),
        ),
    )
    .await;
    let filler = fs.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).expect("the filler");
        let chunk = vec![0u8; 1 << 20];
        while f.write_all(&chunk).is_ok() {}
        let small = vec![0u8; 4096];
        while f.write_all(&small).is_ok() {}
    }
    let mut acked: Vec<String> = vec!["before".into()];
    let mut unknown: Vec<String> = Vec::new();
    let pad = "x".repeat(4000);
    let mut refused = None;
    for b in 0..400 {
        let ids: Vec<String> = (0..50).map(|k| format!("fill-{b}-{k}")).collect();
        let body = json!({"events": ids.iter().map(|id| json!({
            "event_id": id, "stream": "task_events", "subject": id, "type": "task.created",
            "payload": {"project_id": "p", "pad": pad}
        })).collect::<Vec<_>>()});
        let (st, reply) = api.append(&body).await;
        match st {
            StatusCode::CREATED => acked.extend(ids),
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(reply["code"], "log_unavailable", "{reply}");
                unknown.extend(ids);
            }
            StatusCode::INSUFFICIENT_STORAGE => {
                refused = Some(reply);
                break;
            }
            other => panic!("append answered {other}: {reply}"),
        }
    }
    let refused = refused.expect("a full filesystem refuses appends with 507");
    assert_eq!(refused["code"], "insufficient_storage", "{refused}");
    eprintln!(
        "the disk filled inside the log after {} acknowledged events ({} of unknown outcome)",
        acked.len(),
        unknown.len()
    );
    let r = api.get("/healthz").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_eq!(r.json["code"], "insufficient_storage", "{}", r.text);
    // Reads go on from redb's cache (a read that would need the file before the reopen is
    // answered 503 `log_unavailable`) — never a 500.
    for path in [
        "/v1/events?limit=5",
        "/v1/tasks?limit=5",
        "/v1/tasks/before",
    ] {
        let r = api.get(path).await;
        eprintln!("{path} while the log file is full: {}", r.status);
        assert!(
            r.status == StatusCode::OK
                || (r.status == StatusCode::SERVICE_UNAVAILABLE
                    && r.json["code"] == "log_unavailable"),
            "{path}: {} {}",
            r.status,
            r.text
        );
    }

    std::fs::remove_file(&filler).expect("remove the filler");
    let freed = Instant::now();
    // No request is needed: the server reopens the log by itself.
    loop {
        if api.get("/healthz").await.status == StatusCode::OK {
            break;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(25),
            "/healthz still 503 25 s after space returned: {}",
            api.get("/healthz").await.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("healthy again {:?} after space returned", freed.elapsed());
    append_ok(
        &api,
        &ev(
            "after",
            "task_events",
            "after",
            "task.created",
            json!({"project_id": "p"}),
        ),
    )
    .await;
    acked.push("after".into());
    let check = |events: Vec<serde_json::Value>| {
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "dense");
        let got: Vec<String> = events
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            // The server's own events (its settings at start) aside.
            .filter(|id| id.starts_with("fill-") || id == "before" || id == "after")
            .filter(|id| !unknown.contains(id))
            .collect();
        assert_eq!(
            got, acked,
            "every acknowledged event, in order, nothing refused"
        );
    };
    check(api.read_all_with("", 1000).await);
    s.kill9();
    s.restart().await;
    check(s.api().read_all_with("", 1000).await);
    s.sigterm();
    s.wait_exit(Duration::from_secs(30)).await;
}

/// I10 at start: a filesystem too small for the journal's 16 MiB preallocation. The server
/// starts read-only — it serves reads and refuses appends with `507` (it exited with "the log
/// file is unreadable … restore it from a backup", then with a message naming the space) —
/// and takes appends once space returns, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_too_full_at_start_starts_read_only_and_recovers() {
    let fs = Mount::tmpfs("8m");
    let s = Server::start(ServerOpts {
        data_dir: Some(fs.path().join("data")),
        config: Some("[log]\ncache_mb = 4\nmin_free = \"0\"\n".into()),
        ..ServerOpts::default()
    })
    .await;
    let r = s.get("/v1/events?after_sequence=0").await;
    assert_eq!(r.status, StatusCode::OK, "reads are served: {}", r.text);
    let (st, body) = s
        .append(&json!({"events": [ev("ro-1", "s", "subj", "x.y", json!({}))]}))
        .await;
    assert_eq!(st, StatusCode::INSUFFICIENT_STORAGE, "{body}");
    assert_eq!(body["code"], "insufficient_storage", "{body}");
    // Not healthy while writes are refused; alive all the same (a restart fixes nothing).
    let h = s.get("/healthz").await;
    assert_eq!(h.status, StatusCode::SERVICE_UNAVAILABLE, "{}", h.text);
    assert_eq!(h.json["status"], 503, "{}", h.text);
    assert_eq!(s.get("/livez").await.status, StatusCode::OK);
    // Space returns: the same append is taken, no restart.
    let out = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(fs.path())
        .output()
        .expect("remount");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(Duration::from_secs(30), "appends taken again", || async {
        let (st, _) = s
            .append(&json!({"events": [ev("ro-1", "s", "subj", "x.y", json!({}))]}))
            .await;
        (st == StatusCode::CREATED).then_some(())
    })
    .await;
    assert_eq!(
        s.read_all("")
            .await
            .iter()
            .filter(|e| e["event_id"] == "ro-1")
            .count(),
        1
    );
    assert_eq!(s.get("/healthz").await.status, StatusCode::OK);
}
