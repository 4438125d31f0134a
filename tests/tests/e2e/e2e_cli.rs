//! The CLI against a running server: `tidemark append`, `tail` and `deliveries`.

use std::time::Duration;

use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts, run_cli};

const LIMIT: Duration = Duration::from_secs(60);

/// Records printed as JSON lines, or as one JSON array (`-o json`, the default off a
/// terminal).
fn lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}")))
        .flat_map(|v: Value| match v {
            Value::Array(a) => a,
            v => vec![v],
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_then_tail() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    let after = |n: u64| (base + n).to_string();
    let input = [
        json!({"event_id": "cli-1", "stream": "cli", "subject": "a", "type": "cli.t", "payload": {"n": 1}}),
        json!({"event_id": "cli-2", "stream": "cli", "subject": "b", "type": "cli.t", "payload": {"n": 2}}),
        json!({"event_id": "cli-3", "stream": "cli", "subject": "a", "type": "cli.u"}),
    ];
    let stdin: String = input.iter().map(|v| format!("{v}\n")).collect();
    let out = run_cli(&["append", "--url", s.base()], &stdin, LIMIT).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tidemark append failed ({}): {stderr}",
        out.status
    );
    let receipts = lines(&out.stdout);
    assert_eq!(receipts.len(), 3, "one receipt per event: {receipts:?}");
    for (i, r) in receipts.iter().enumerate() {
        assert_eq!(r["event_id"], format!("cli-{}", i + 1).as_str(), "{r}");
        assert_eq!(r["seq"], base + i as u64 + 1, "{r}");
        assert_eq!(r["duplicate"], false, "{r}");
    }
    assert_eq!(s.head().await, base + 3);

    let out = run_cli(
        &[
            "tail",
            "--after",
            &after(0),
            "--count",
            "3",
            "--url",
            s.base(),
        ],
        "",
        LIMIT,
    )
    .await;
    assert!(
        out.status.success(),
        "tidemark tail failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let envelopes = lines(&out.stdout);
    assert_eq!(envelopes.len(), 3, "three envelopes: {envelopes:?}");
    for (i, (e, sent)) in envelopes.iter().zip(&input).enumerate() {
        assert_eq!(e["seq"], base + i as u64 + 1, "{e}");
        for k in ["event_id", "stream", "type"] {
            assert_eq!(e[k], sent[k], "{k} of {e}");
        }
        assert_eq!(e["subject"], sent["subject"], "{e}");
        assert_eq!(
            e["payload"],
            sent.get("payload").cloned().unwrap_or(json!({})),
            "{e}"
        );
        assert!(e["time"].is_string(), "{e}");
    }

    // Filters and a later start.
    let out = run_cli(
        &[
            "tail",
            "--after",
            &after(1),
            "--subject",
            "a",
            "--count",
            "1",
            "--url",
            s.base(),
        ],
        "",
        LIMIT,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let envelopes = lines(&out.stdout);
    assert_eq!(envelopes.len(), 1);
    assert_eq!(envelopes[0]["event_id"], "cli-3");

    // Appending the same lines again: duplicates with the original seqs.
    let out = run_cli(&["append", "--url", s.base()], &stdin, LIMIT).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = lines(&out.stdout);
    assert_eq!(again.len(), 3);
    for (i, r) in again.iter().enumerate() {
        assert_eq!(r["seq"], base + i as u64 + 1, "{r}");
        assert_eq!(r["duplicate"], true, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_exits_non_zero_on_a_rejected_event() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    let stdin = "{\"event_id\": \"ok-1\", \"stream\": \"cli\", \"type\": \"cli.t\"}\n\
                 {\"event_id\": \"bad\", \"stream\": \"NOT OK\", \"type\": \"cli.t\"}\n";
    let out = run_cli(&["append", "--url", s.base()], stdin, LIMIT).await;
    assert!(
        !out.status.success(),
        "a rejected event must make `tidemark append` exit non-zero; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = run_cli(&["append", "--url", s.base()], "this is not json\n", LIMIT).await;
    assert!(!out.status.success(), "a line that is not JSON must fail");
    assert!(
        s.head().await <= base + 1,
        "nothing but the valid first line can have been appended"
    );
}

/// `tidemark deliveries list|retry|discard` against a server with parked deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_list_retry_discard() {
    let s = Server::start(ServerOpts::default()).await;
    let api = s.api();
    for id in ["cli-n1", "cli-n2", "cli-n3"] {
        let (st, body) = api
            .append(
                &json!({"event_id": id, "stream": "notifications", "subject": id,
                "type": "notification.requested", "payload": {"priority": "urgent", "title": id}}),
            )
            .await;
        assert_eq!(st, 201, "{body}");
    }
    // Wait for routing (all three rows), then park two of them with a permanent failure.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = api.get_json("/v1/deliveries?status=queued").await;
        if v["deliveries"].as_array().is_some_and(|d| d.len() == 3) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "deliveries never appeared: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let claimed = loop {
        let r = api
            .send(
                api.request(reqwest::Method::POST, "/v1/deliveries/claim")
                    .json(&json!({"sink": "app", "owner": "cli-test", "limit": 10})),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let ids: Vec<String> = r.json["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect();
        if ids.len() == 3 {
            break ids;
        }
        assert!(ids.is_empty(), "claimed only part: {ids:?}");
        assert!(
            std::time::Instant::now() < deadline,
            "deliveries never appeared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for id in &claimed[..2] {
        let r = api
            .send(
                api.request(reqwest::Method::POST, &format!("/v1/deliveries/{id}/fail"))
                    .json(&json!({"owner": "cli-test", "error_code": "gone", "retryable": false})),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["status"], "parked", "{}", r.text);
    }
    let out = run_cli(
        &[
            "deliveries",
            "list",
            "--status",
            "parked",
            "--url",
            s.base(),
        ],
        "",
        LIMIT,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parked = lines(&out.stdout);
    let mut ids: Vec<&str> = parked.iter().map(|d| d["id"].as_str().unwrap()).collect();
    ids.sort();
    let mut want: Vec<&str> = claimed[..2].iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(ids, want);
    let all = lines(
        &run_cli(&["deliveries", "list", "--url", s.base()], "", LIMIT)
            .await
            .stdout,
    );
    assert_eq!(all.len(), 3, "{all:?}");

    let out = run_cli(
        &[
            "deliveries",
            "retry",
            &claimed[0],
            "--reason",
            "fixed",
            "--url",
            s.base(),
        ],
        "",
        LIMIT,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(row["status"], "queued");
    assert_eq!(row["attempts"], 0);
    let out = run_cli(
        &["deliveries", "discard", &claimed[1], "--url", s.base()],
        "",
        LIMIT,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(row["status"], "discarded");
    // Retrying what is not parked fails with the server's reason, and changes nothing.
    let head = s.head().await;
    let out = run_cli(
        &["deliveries", "retry", &claimed[2], "--url", s.base()],
        "",
        LIMIT,
    )
    .await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("illegal_transition"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s.head().await, head);
}

fn ok(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Section 9's other commands: a task's bridge subscriptions, a notification's status,
/// `-o table|json|jsonl`, `config show` with secrets masked, and shell completions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_status_output_formats_config_and_completions() {
    let s = Server::start(ServerOpts::default()).await;
    let url = s.base().to_owned();
    let (st, body) = s
        .append(&json!({"events": [
            {"stream": "task_events", "subject": "cli-task", "type": "task.created",
             "payload": {"project_id": "p"}},
            {"event_id": "cli-n1", "stream": "notifications", "subject": "cli-n1",
             "type": "notification.requested", "payload": {"priority": "info", "title": "Hi"}},
        ]}))
        .await;
    assert_eq!(st, reqwest::StatusCode::CREATED, "{body}");

    let out = run_cli(
        &[
            "tasks",
            "notifications",
            "subscribe",
            "cli-task",
            "--subscription-id",
            "cli-sub",
            "--bridge-id",
            "cli-bridge",
            "-o",
            "json",
            "--url",
            &url,
        ],
        "",
        LIMIT,
    )
    .await;
    let sub: Value = serde_json::from_str(&ok(&out, "subscribe")).unwrap();
    assert_eq!(sub["subscription_id"], "cli-sub", "{sub}");
    let out = run_cli(
        &[
            "tasks",
            "notifications",
            "list",
            "cli-task",
            "-o",
            "jsonl",
            "--url",
            &url,
        ],
        "",
        LIMIT,
    )
    .await;
    let subs = lines(ok(&out, "list").as_bytes());
    assert_eq!(subs.len(), 1, "{subs:?}");
    assert_eq!(subs[0]["subscription_id"], "cli-sub");
    let out = run_cli(
        &[
            "tasks",
            "notifications",
            "list",
            "cli-task",
            "-o",
            "table",
            "--url",
            &url,
        ],
        "",
        LIMIT,
    )
    .await;
    let table = ok(&out, "list -o table");
    let mut rows = table.lines();
    assert!(
        rows.next().unwrap_or("").starts_with("SUBSCRIPTION_ID"),
        "{table}"
    );
    assert!(rows.next().unwrap_or("").starts_with("cli-sub"), "{table}");
    let out = run_cli(
        &[
            "tasks",
            "notifications",
            "show",
            "cli-task",
            "cli-sub",
            "--url",
            &url,
        ],
        "",
        LIMIT,
    )
    .await;
    let shown: Value = serde_json::from_str(&ok(&out, "show")).unwrap();
    assert_eq!(shown["subscription_id"], "cli-sub", "{shown}");
    let out = run_cli(
        &[
            "tasks",
            "notifications",
            "delete",
            "cli-task",
            "cli-sub",
            "--url",
            &url,
        ],
        "",
        LIMIT,
    )
    .await;
    ok(&out, "delete");

    let out = run_cli(
        &["notifications", "status", "cli-n1", "--url", &url],
        "",
        LIMIT,
    )
    .await;
    let status: Value = serde_json::from_str(&ok(&out, "status")).unwrap();
    assert_eq!(status["status"], "dashboard_only", "{status}");
    let out = run_cli(
        &[
            "notifications",
            "status",
            "cli-n1",
            "-o",
            "table",
            "--url",
            &url,
        ],
        "",
        LIMIT,
    )
    .await;
    let table = ok(&out, "status -o table");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("status") && l.ends_with("dashboard_only")),
        "{table}"
    );
    let out = run_cli(
        &["notifications", "status", "nope", "--url", &url],
        "",
        LIMIT,
    )
    .await;
    assert!(!out.status.success());

    // config show: the effective settings, the token hash and source secrets masked.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("t.toml");
    std::fs::write(
        &cfg,
        "[[auth.tokens]]\nname = \"ops\"\nsha256 = \"5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\"\nscopes = [\"read\"]\n\
         [server]\nlisten = \"0.0.0.0:7701\"\n",
    )
    .unwrap();
    let cfg = cfg.to_string_lossy().into_owned();
    let out = run_cli(&["config", "show", "--config", &cfg], "", LIMIT).await;
    let text = ok(&out, "config show");
    assert!(
        text.contains("0.0.0.0:7701") && text.contains("[retention]"),
        "{text}"
    );
    assert!(
        !text.contains("5e884898"),
        "the token hash is masked: {text}"
    );
    let out = run_cli(
        &["config", "show", "--config", &cfg, "-o", "json"],
        "",
        LIMIT,
    )
    .await;
    let v: Value = serde_json::from_str(&ok(&out, "config show -o json")).unwrap();
    assert_eq!(v["auth"]["tokens"][0]["name"], "ops", "{v}");
    assert_eq!(v["auth"]["tokens"][0]["sha256"], "***", "{v}");

    for shell in ["bash", "zsh", "fish"] {
        let out = run_cli(&["completions", shell], "", LIMIT).await;
        let script = ok(&out, "completions");
        assert!(
            script.contains("deliveries") && script.contains("notifications"),
            "{shell}"
        );
    }
}
