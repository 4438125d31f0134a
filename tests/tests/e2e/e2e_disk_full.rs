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

use crate::common::{append_ok, task_ev};

/// A tmpfs mounted for the test, unmounted when dropped (before its temp dir goes).
struct Mount(PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl Mount {
    fn tmpfs(size: &str) -> Mount {
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

    fn path(&self) -> &Path {
        &self.0
    }

    fn available(&self) -> u64 {
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
    }

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
