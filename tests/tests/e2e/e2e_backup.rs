//! Section 18: backups, restores, export and import, end to end with the real binary: a backup
//! taken while 16 clients append restores into a new data directory whose log is a prefix of
//! the original at the reported seq, event for event, and whose models verify identical; an
//! increment adds exactly the events after the backup before it; export → import reproduces
//! seqs, ids and digests; an import into a log holding events, or of an input with a gap, a
//! repeat or a duplicate id, is refused and changes nothing.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts, assert_problem_for, run_cli, sha256_hex};

use crate::common::{
    PROJECTIONS, append_ok, assert_projections_sound, metric_sum, projections, settled, task_ev,
    wait_for,
};

const ADMIN: &str = "backup-admin-token-0123456789";
const CLI: Duration = Duration::from_secs(300);
const WAIT: Duration = Duration::from_secs(60);

fn admin_config() -> String {
    format!(
        "[[auth.tokens]]\nname = \"ops\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
        sha256_hex(ADMIN)
    )
}

/// `tidemark <args> -o json`: its stdout as JSON; panics unless it succeeded.
async fn cli_json(args: &[&str]) -> Value {
    let args = [args, &["-o", "json"]].concat();
    let out = run_cli(&args, "", CLI).await;
    assert!(
        out.status.success(),
        "tidemark {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "tidemark {}: stdout is not JSON ({e}): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `tidemark <args>` with `stdin`: its stderr; panics unless it failed.
async fn cli_refused(args: &[&str], stdin: &str) -> String {
    let out = run_cli(args, stdin, CLI).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "tidemark {} should have been refused; stdout: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// The log of a stopped server's data directory, as the export's JSON lines.
async fn export(data: &Path) -> Vec<String> {
    let d = data.to_str().expect("utf-8 path");
    let out = run_cli(&["log", "export", "--data", d], "", CLI).await;
    assert!(
        out.status.success(),
        "export of {d}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

fn seq(line: &str) -> u64 {
    serde_json::from_str::<Value>(line).expect("a JSON line")["seq"]
        .as_u64()
        .expect("seq")
}

async fn stop(s: &mut Server) {
    s.sigterm();
    assert!(s.wait_exit(WAIT).await.success(), "server exit");
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `restore --from <from>... --data <data>` followed by `more`.
fn restore<'a>(from: &[&'a Path], data: &'a Path, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["restore"];
    for f in from {
        args.extend(["--from", path(f)]);
    }
    args.extend(["--data", path(data)]);
    args.extend(more);
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_a_prefix_whose_models_verify() {
    let mut s = Server::start(ServerOpts::default().config(admin_config())).await;
    s.set_token(Some(ADMIN));
    let url = s.base().to_owned();
    // Models with something in them, and a webhook secret: a read never returns it, but the
    // backup is the log, byte for byte.
    let mut events = Vec::new();
    for i in 0..20 {
        let t = format!("bk-{i:02}");
        let created = json!({"project_id": "p", "title": format!("T{i}")});
        events.push(task_ev(&t, "task.created", created));
        events.push(task_ev(&t, "task.run_started", json!({"run_id": "r1"})));
        if i % 2 == 0 {
            events.push(task_ev(
                &t,
                "task.run_failed",
                json!({"run_id": "r1", "error": "x"}),
            ));
        }
    }
    append_ok(&s, &json!({ "events": events })).await;
    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/tasks/bk-00/notifications/bridges")
                .json(&json!({"subscription_id": "sub-bk", "bridge_id": "b-bk",
                    "sink": {"kind": "webhook", "url": "http://127.0.0.1:9/hook", "secret": "bk-s3cret-value"}})),
        )
        .await;
    assert!(r.status.is_success(), "{} {}", r.status, r.text);

    // 16 clients append one event at a time while the backups are taken.
    let stop_flag = Arc::new(AtomicBool::new(false));
    let appended = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for c in 0..16 {
        let api = s.api();
        let (stop_flag, appended) = (stop_flag.clone(), appended.clone());
        clients.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop_flag.load(Ordering::Relaxed) {
                let (code, body) = api
                    .append(&json!({"stream": "load", "subject": format!("c{c}"), "type": "load.tick", "payload": {"i": i}}))
                    .await;
                assert_eq!(code, StatusCode::CREATED, "{body}");
                appended.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    wait_for(WAIT, "appends under way", || {
        let n = appended.load(Ordering::Relaxed);
        async move { (n >= 200).then_some(()) }
    })
    .await;
    let before = s.head().await;
    let backup = ["backup", "--url", &url, "--token", ADMIN];
    let full = cli_json(&[&backup[..], &["--on-server", "full"]].concat()).await;
    let n1 = full["through_seq"].as_u64().expect("through_seq");
    assert!(
        n1 >= before,
        "the backup is of the head when it began: {full}"
    );
    assert_eq!(full["after_seq"], 0);
    assert_eq!(full["events"], n1, "{full}");
    let seen = appended.load(Ordering::Relaxed);
    wait_for(WAIT, "appends after the first backup", || {
        let n = appended.load(Ordering::Relaxed);
        async move { (n >= seen + 200).then_some(()) }
    })
    .await;
    let n1s = n1.to_string();
    // The increment streamed to the machine running the command (`--to DIR`): the same files
    // and manifest as one the server writes, restored below on top of the server's full one.
    let local = tempfile::tempdir().expect("tempdir");
    let inc_dir = local.path().join("inc");
    let to_inc = [&backup[..], &["--to", path(&inc_dir), "--after", &n1s]].concat();
    let inc = cli_json(&to_inc).await;
    assert_eq!(inc["dir"], path(&inc_dir), "{inc}");
    let n2 = inc["through_seq"].as_u64().expect("through_seq");
    assert_eq!(inc["after_seq"], n1, "{inc}");
    assert!(n2 > n1, "{inc}");
    assert_eq!(inc["events"], n2 - n1, "{inc}");
    // A streamed backup is refused as one on the server is: into a directory that holds one,
    // or after the head; and refused, it writes nothing.
    let e = cli_refused(&to_inc, "").await;
    assert!(e.contains("not empty"), "{e}");
    let later = local.path().join("later");
    let to_later = [&backup[..], &["--to", path(&later), "--after", "999999999"]].concat();
    let e = cli_refused(&to_later, "").await;
    assert!(e.contains("past_head"), "{e}");
    assert!(!later.exists(), "a refused stream made {}", later.display());
    stop_flag.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }
    // Refusals change nothing: an existing backup's name, a path outside backup_dir, `..`,
    // an `after` past the head.
    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/admin/backup")
                .json(&json!({"to": "full"})),
        )
        .await;
    assert_problem_for(&r, 409, "backup_exists", "a second backup into full");
    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/admin/backup")
                .json(&json!({"to": "later", "after": n2 + 1_000_000})),
        )
        .await;
    assert_problem_for(&r, 409, "past_head", "an increment after the head");
    for (body, field) in [
        (json!({"to": "/etc/tidemark-backup"}), "to"),
        (json!({"to": "../escape"}), "to"),
        (json!({"to": "x".repeat(300)}), "to"),
        (json!({"to": "."}), "to"),
    ] {
        let r = s
            .send(
                s.request(reqwest::Method::POST, "/v1/admin/backup")
                    .json(&body),
            )
            .await;
        assert_problem_for(&r, 422, "invalid_field", &body.to_string());
        assert_eq!(r.json["field"], field, "{}", r.text);
    }
    assert!(!Path::new("/etc/tidemark-backup").exists());
    // A symlink inside backup_dir does not lead out of it.
    let outside = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(outside.path(), s.data_dir().join("backups/link")).expect("symlink");
    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/admin/backup")
                .json(&json!({"to": "link/x"})),
        )
        .await;
    assert_problem_for(
        &r,
        422,
        "invalid_field",
        "a backup through a symlink out of backup_dir",
    );
    assert!(!outside.path().join("x").exists());
    assert!(!s.data_dir().join("backups/later").exists());
    // Without the admin scope: refused.
    s.set_token(None);
    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/admin/backup")
                .json(&json!({"to": "x"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    s.set_token(Some(ADMIN));

    // The backups are counted, and the last one's seq is exported.
    let m = s.get("/metrics").await.text;
    assert_eq!(
        metric_sum(&m, "tidemark_backups_total{outcome=\"ok\"}"),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "tidemark_backup_last_through_seq"),
        Some(n2 as f64)
    );
    let head = s.head().await;
    stop(&mut s).await;
    let orig = export(s.data_dir()).await;
    assert_eq!(orig.len() as u64, head, "the whole log exported");
    assert!(
        orig.iter().any(|l| l.contains("bk-s3cret-value")),
        "the export is the log, secrets included"
    );
    let backups = s.data_dir().join("backups");
    let full_dir = backups.join("full");
    // The owner's only: the log holds webhook secrets and personal data.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode(&full_dir), 0o700);
    assert_eq!(mode(&full_dir.join("events.jsonl")), 0o600);
    assert_eq!(mode(&full_dir.join("manifest.json")), 0o600);
    assert_eq!(mode(&inc_dir), 0o700);
    assert_eq!(mode(&inc_dir.join("events.jsonl")), 0o600);
    // The increment holds exactly the events after the first backup.
    let inc_lines: Vec<u64> = std::fs::read_to_string(inc_dir.join("events.jsonl"))
        .expect("the increment's events")
        .lines()
        .map(seq)
        .collect();
    assert_eq!(inc_lines, (n1 + 1..=n2).collect::<Vec<_>>());

    let tmp = tempfile::tempdir().expect("tempdir");
    let r1 = tmp.path().join("r1");
    let done = cli_json(&restore(&[&full_dir], &r1, &[])).await;
    assert_eq!(done["through_seq"], n1, "{done}");
    assert_eq!(
        export(&r1).await,
        orig[..n1 as usize],
        "restored full backup = prefix at n1"
    );
    let r2 = tmp.path().join("r2");
    let done = cli_json(&restore(&[&full_dir, &inc_dir], &r2, &[])).await;
    assert_eq!(done["through_seq"], n2, "{done}");
    assert_eq!(
        export(&r2).await,
        orig[..n2 as usize],
        "full + increment = prefix at n2"
    );

    // Restored as a backup keeps it: directories 0700, files 0600 (they were the umask's 0644,
    // which a restore run as root left unreadable... and unwritable to the service's user).
    let walk = |dir: &Path| {
        let mut all = vec![dir.to_owned()];
        let mut i = 0;
        while i < all.len() {
            if all[i].is_dir() {
                let more: Vec<_> = std::fs::read_dir(&all[i])
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .collect();
                all.extend(more);
            }
            i += 1;
        }
        all
    };
    for p in walk(&r2) {
        assert_eq!(
            mode(&p),
            if p.is_dir() { 0o700 } else { 0o600 },
            "{}",
            p.display()
        );
    }
    // `--owner USER` (run as root, as CI runs the suite): the service's user owns all of it and
    // can open it as the service would (here `log export`, as `nobody`).
    assert!(nix::unistd::getuid().is_root(), "the suite runs as root");
    let r4 = tmp.path().join("r4");
    let no_user = restore(&[&full_dir], &r4, &["--owner", "no-such-user-x"]);
    let e = cli_refused(&no_user, "").await;
    assert!(e.contains("no such user"), "{e}");
    assert!(!r4.exists(), "a refused restore made {}", r4.display());
    let done = cli_json(&restore(&[&full_dir], &r4, &["--owner", "nobody"])).await;
    assert_eq!(done["owner"], "nobody", "{done}");
    for p in walk(&r4) {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(&p).unwrap().uid(),
            65534,
            "{}",
            p.display()
        );
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let as_nobody = tokio::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(tidemark_tests::binary())
        .args(["log", "export", "--data", path(&r4)])
        .env_remove("TIDEMARK_CONFIG")
        .output()
        .await
        .expect("setpriv");
    assert!(
        as_nobody.status.success(),
        "the owner cannot open its restored log: {}",
        String::from_utf8_lossy(&as_nobody.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&as_nobody.stdout).lines().count() as u64,
        n1
    );

    // A gap, a repeat or a damaged backup is refused, and makes no data directory.
    let r3 = tmp.path().join("r3");
    let e = cli_refused(&restore(&[&inc_dir], &r3, &[]), "").await;
    assert!(e.contains("starts from a full backup"), "{e}");
    let gap = restore(&[&full_dir, &inc_dir, &inc_dir], &r3, &[]);
    let e = cli_refused(&gap, "").await;
    assert!(e.contains("gap"), "{e}");
    let damaged = tmp.path().join("damaged");
    std::fs::create_dir_all(&damaged).expect("mkdir");
    for f in ["manifest.json", "events.jsonl"] {
        std::fs::copy(full_dir.join(f), damaged.join(f)).expect("copy");
    }
    let mut text = std::fs::read_to_string(damaged.join("events.jsonl")).expect("read");
    text = text.replacen("load.tick", "load.tock", 1);
    std::fs::write(damaged.join("events.jsonl"), text).expect("write");
    let e = cli_refused(&restore(&[&damaged], &r3, &[]), "").await;
    assert!(e.contains("damaged"), "{e}");
    assert!(!r3.exists(), "a refused restore made {}", r3.display());
    // Into a directory that is not empty: refused, left as it was.
    let e = cli_refused(&restore(&[&full_dir], &r1, &[]), "").await;
    assert!(e.contains("not empty"), "{e}");
    assert_eq!(export(&r1).await, orig[..n1 as usize]);

    // A server on the restored directory rebuilds its models from the log; they verify
    // identical, and the subscription (with its secret, used but never shown) is back.
    let s2 = {
        let mut s2 =
            Server::start(ServerOpts::default().config(admin_config()).seed_data(&r2)).await;
        s2.set_token(Some(ADMIN));
        s2
    };
    assert!(s2.data_dir().join("models.redb").exists());
    assert_projections_sound(&s2, "restored").await;
    let r = s2.get("/v1/tasks/bk-00/notifications/bridges/sub-bk").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(!r.text.contains("bk-s3cret-value"), "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_reproduces_seqs_ids_and_digests() {
    let mut s = Server::start(ServerOpts::default()).await;
    let mut events = Vec::new();
    for i in 0..30 {
        let t = format!("ex-{i:02}");
        events.push(task_ev(
            &t,
            "task.created",
            json!({"project_id": "p", "title": format!("T{i}"), "review_required": i % 3 == 0}),
        ));
        events.push(task_ev(&t, "task.run_started", json!({"run_id": "r1"})));
        match i % 3 {
            0 => events.push(task_ev(
                &t,
                "task.run_review_requested",
                json!({"run_id": "r1"}),
            )),
            1 => events.push(task_ev(&t, "task.run_completed", json!({"run_id": "r1"}))),
            _ => events.push(task_ev(
                &t,
                "task.run_failed",
                json!({"run_id": "r1", "error": "e"}),
            )),
        }
    }
    for chunk in events.chunks(17) {
        append_ok(&s, &json!({ "events": chunk })).await;
    }
    // Routed notifications appended by the reactors, then quiet.
    let head = wait_quiet_head(&s).await;
    settled(&s).await;
    let before_digests = digests(&s).await;
    stop(&mut s).await;
    let lines = export(s.data_dir()).await;
    assert_eq!(lines.len() as u64, head);
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("log.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").expect("write");

    let new = tmp.path().join("new");
    let done = cli_json(&["log", "import", "--data", path(&new), path(&file)]).await;
    assert_eq!(
        (done["events"].as_u64(), done["head"].as_u64()),
        (Some(head), Some(head)),
        "{done}"
    );
    assert_eq!(
        export(&new).await,
        lines,
        "the same seqs, ids, times and payloads"
    );
    let s2 = Server::start(ServerOpts::default().seed_data(&new)).await;
    settled(&s2).await;
    assert_eq!(
        digests(&s2).await,
        before_digests,
        "the models of the imported log"
    );

    // Refusals, each changing nothing.
    let before = export(&new).await;
    let e = cli_refused(&["log", "import", "--data", path(&new), path(&file)], "").await;
    assert!(e.contains("already holds events"), "{e}");
    assert_eq!(
        export(&new).await,
        before,
        "a refused import changed the log"
    );
    let refused = |name: &str| tmp.path().join(name);
    let cases: Vec<(&str, String, &str)> = vec![
        ("gap", drop_line(&lines, 5), "gap"),
        (
            "repeat",
            {
                let mut l = lines.clone();
                l.insert(7, lines[6].clone());
                l.join("\n")
            },
            "gap or a repeat",
        ),
        (
            "dup-id",
            {
                let mut l = lines.clone();
                let id2 =
                    serde_json::from_str::<Value>(&lines[1]).expect("json")["event_id"].clone();
                let mut v: Value = serde_json::from_str(&lines[3]).expect("json");
                v["event_id"] = id2;
                l[3] = v.to_string();
                l.join("\n")
            },
            "appears twice",
        ),
        (
            "not-json",
            {
                let mut l = lines.clone();
                l[2] = "{not json".into();
                l.join("\n")
            },
            "line 3",
        ),
        ("late-start", lines[1..].join("\n"), "from seq 1"),
    ];
    for (name, input, says) in cases {
        let dir = refused(name);
        let e = cli_refused(&["log", "import", "--data", path(&dir)], &input).await;
        assert!(e.contains(says), "{name}: {e}");
        assert!(
            !dir.exists(),
            "{name}: a refused import left {}",
            dir.display()
        );
    }
}

fn drop_line(lines: &[String], i: usize) -> String {
    let mut l = lines.to_vec();
    l.remove(i);
    l.join("\n")
}

/// The head once the reactors have nothing more to append.
async fn wait_quiet_head(s: &Server) -> u64 {
    crate::common::wait_quiet(s).await;
    s.head().await
}

/// Each projection's (checkpoint, digest), once every one has folded the head.
async fn digests(s: &Server) -> Vec<(String, u64, String)> {
    let head = s.head().await;
    let rows = wait_for(WAIT, "models at the head", || async {
        let rows = projections(s).await;
        PROJECTIONS
            .iter()
            .all(|n| rows[*n]["checkpoint"].as_u64() == Some(head))
            .then_some(rows)
    })
    .await;
    PROJECTIONS
        .iter()
        .map(|n| {
            (
                (*n).to_owned(),
                rows[*n]["checkpoint"].as_u64().unwrap_or(0),
                rows[*n]["digest"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}
