//! The CLI against a running server: `tidemark append`, `tail` and `deliveries`, the other
//! section 9 commands, and what the CLI tells its operator (issue 26): `-o` honoured by every
//! command that prints records, errors in words (or the problem under `-o json`), the line of
//! the file at fault, quiet on a closed pipe, a `--url` without a scheme.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, cli_command, random_token, run_cli, sha256_hex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use crate::common::{CLI_LIMIT as LIMIT, cli_at, cli_ok, cli_records};

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
    let receipts = cli_records(cli_ok(&out, "tidemark append").as_bytes());
    assert_eq!(receipts.len(), 3, "one receipt per event: {receipts:?}");
    for (i, r) in receipts.iter().enumerate() {
        assert_eq!(r["event_id"], format!("cli-{}", i + 1).as_str(), "{r}");
        assert_eq!(r["seq"], base + i as u64 + 1, "{r}");
        assert_eq!(r["duplicate"], false, "{r}");
    }
    assert_eq!(s.head().await, base + 3);

    let out = cli_at(s.base(), &format!("tail --after {} --count 3", after(0))).await;
    let envelopes = cli_records(cli_ok(&out, "tidemark tail").as_bytes());
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
    let tail = format!("tail --after {} --subject a --count 1", after(1));
    let out = cli_at(s.base(), &tail).await;
    let envelopes = cli_records(cli_ok(&out, &tail).as_bytes());
    assert_eq!(envelopes.len(), 1);
    assert_eq!(envelopes[0]["event_id"], "cli-3");

    // Appending the same lines again: duplicates with the original seqs.
    let out = run_cli(&["append", "--url", s.base()], &stdin, LIMIT).await;
    let again = cli_records(cli_ok(&out, "tidemark append again").as_bytes());
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
    let out = cli_at(s.base(), "deliveries list --status parked").await;
    let parked = cli_records(cli_ok(&out, "deliveries list --status parked").as_bytes());
    let mut ids: Vec<&str> = parked.iter().map(|d| d["id"].as_str().unwrap()).collect();
    ids.sort();
    let mut want: Vec<&str> = claimed[..2].iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(ids, want);
    let all = cli_records(&cli_at(s.base(), "deliveries list").await.stdout);
    assert_eq!(all.len(), 3, "{all:?}");

    let retry = format!("deliveries retry {} --reason fixed", claimed[0]);
    let out = cli_at(s.base(), &retry).await;
    let row: Value = serde_json::from_str(&cli_ok(&out, &retry)).unwrap();
    assert_eq!(row["status"], "queued");
    assert_eq!(row["attempts"], 0);
    let discard = format!("deliveries discard {}", claimed[1]);
    let out = cli_at(s.base(), &discard).await;
    let row: Value = serde_json::from_str(&cli_ok(&out, &discard)).unwrap();
    assert_eq!(row["status"], "discarded");
    // Retrying what is not parked fails with the server's reason, and changes nothing.
    let head = s.head().await;
    let out = cli_at(s.base(), &format!("deliveries retry {}", claimed[2])).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("illegal_transition"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s.head().await, head);
}

/// Section 9's other commands: a task's bridge subscriptions, a notification's status,
/// `-o table|json|jsonl`, `config show` with secrets masked, and shell completions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_status_output_formats_config_and_completions() {
    let s = Server::start(ServerOpts::default()).await;
    let url = s.base().to_owned();
    task_and_notification(&s, "cli-task", "cli-n1", "info").await;

    let subscribe = "tasks notifications subscribe cli-task --subscription-id cli-sub \
                     --bridge-id cli-bridge --scope team-ops --workspace ws-1 --thread th-9 \
                     --mode post -o json";
    let out = cli_at(&url, subscribe).await;
    let sub: Value = serde_json::from_str(&cli_ok(&out, "subscribe")).unwrap();
    assert_eq!(sub["subscription_id"], "cli-sub", "{sub}");
    // The bridge's routing flags reach the subscription.
    assert_eq!(
        (
            &sub["scope"],
            &sub["workspace_id"],
            &sub["thread_id"],
            &sub["mode"]
        ),
        (
            &json!("team-ops"),
            &json!("ws-1"),
            &json!("th-9"),
            &json!("post")
        ),
        "{sub}"
    );
    let out = cli_at(&url, "tasks notifications list cli-task -o jsonl").await;
    let subs = cli_records(cli_ok(&out, "list").as_bytes());
    assert_eq!(subs.len(), 1, "{subs:?}");
    assert_eq!(subs[0]["subscription_id"], "cli-sub");
    let out = cli_at(&url, "tasks notifications list cli-task -o table").await;
    let table = cli_ok(&out, "list -o table");
    let mut rows = table.lines();
    assert!(
        rows.next().unwrap_or("").starts_with("SUBSCRIPTION_ID"),
        "{table}"
    );
    assert!(rows.next().unwrap_or("").starts_with("cli-sub"), "{table}");
    let out = cli_at(&url, "tasks notifications show cli-task cli-sub").await;
    let shown: Value = serde_json::from_str(&cli_ok(&out, "show")).unwrap();
    assert_eq!(shown["subscription_id"], "cli-sub", "{shown}");
    let out = cli_at(&url, "tasks notifications delete cli-task cli-sub").await;
    cli_ok(&out, "delete");

    let out = cli_at(&url, "notifications status cli-n1").await;
    let status: Value = serde_json::from_str(&cli_ok(&out, "status")).unwrap();
    assert_eq!(status["status"], "dashboard_only", "{status}");
    let out = cli_at(&url, "notifications status cli-n1 -o table").await;
    let table = cli_ok(&out, "status -o table");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("status") && l.ends_with("dashboard_only")),
        "{table}"
    );
    let out = cli_at(&url, "notifications status nope").await;
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
    let text = cli_ok(&out, "config show");
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
    let v: Value = serde_json::from_str(&cli_ok(&out, "config show -o json")).unwrap();
    assert_eq!(v["auth"]["tokens"][0]["name"], "ops", "{v}");
    assert_eq!(v["auth"]["tokens"][0]["sha256"], "***", "{v}");

    // A secret the service's environment holds and this shell does not: masked and named, not
    // a refusal (the server itself refuses to start without it, naming it).
    let with_env = dir.path().join("with-env.toml");
    std::fs::write(
        &with_env,
        "[privacy]\nhmac_key = \"env:TM_TEST_UNSET_KEY\"\n\
         [notifications.routes.hook]\nsink = \"webhook\"\nurl = \"env:TM_TEST_UNSET_URL\"\n",
    )
    .unwrap();
    let with_env = with_env.to_string_lossy().into_owned();
    let out = run_cli(&["config", "show", "--config", &with_env], "", LIMIT).await;
    let text = cli_ok(&out, "config show with unset env secrets");
    assert!(text.contains("hmac_key = \"***\""), "{text}");
    let err = stderr(&out);
    assert!(
        err.contains("TM_TEST_UNSET_KEY, TM_TEST_UNSET_URL"),
        "the unset variables are named: {err}"
    );
    let out = run_cli(
        &[
            "serve",
            "--config",
            &with_env,
            "--listen",
            "127.0.0.1:0",
            "--data",
            &dir.path().join("d").to_string_lossy(),
        ],
        "",
        LIMIT,
    )
    .await;
    assert!(refused(&out, "serve without its secret").contains("TM_TEST_UNSET_KEY"));
    // Messages in the file's terms: what a duration is, the key as written (no internal
    // `default.` prefix) with its table's keys.
    for (toml, want) in [
        (
            "[notifications.outbox]\nstuck_after = \"5 minutes\"\n",
            "notifications.outbox.stuck_after must be a duration: a whole number and a unit",
        ),
        (
            "[server]\nlistn = \"127.0.0.1:1\"\n",
            "server.listn is not a known key of [server] (known: listen,",
        ),
        (
            "[server]\nkeepalive_secs = \"ten\"\n",
            "server.keepalive_secs is string \"ten\": it must be a whole number",
        ),
    ] {
        let f = dir.path().join("bad.toml");
        std::fs::write(&f, toml).unwrap();
        let out = run_cli(
            &["config", "show", "--config", &f.to_string_lossy()],
            "",
            LIMIT,
        )
        .await;
        let err = refused(&out, toml);
        assert!(err.contains(want), "{want:?} in {err}");
        assert!(!err.contains("default."), "{err}");
    }

    for shell in ["bash", "zsh", "fish"] {
        let out = run_cli(&["completions", shell], "", LIMIT).await;
        let script = cli_ok(&out, "completions");
        assert!(
            script.contains("deliveries") && script.contains("notifications"),
            "{shell}"
        );
    }
}

/// Append task `task` (`task.created`) and the notification `nid` of `priority`, titled "Hi".
async fn task_and_notification(api: &Api, task: &str, nid: &str, priority: &str) {
    let (st, body) = api
        .append(&json!({"events": [
            {"stream": "task_events", "subject": task, "type": "task.created",
             "payload": {"project_id": "p"}},
            {"event_id": nid, "stream": "notifications", "subject": nid,
             "type": "notification.requested", "payload": {"priority": priority, "title": "Hi"}},
        ]}))
        .await;
    assert_eq!(st, reqwest::StatusCode::CREATED, "{body}");
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A refused command: non-zero exit, nothing on stdout; its stderr.
fn refused(out: &std::process::Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        out.stdout.is_empty(),
        "{what}: a refusal prints nothing on stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr(out)
}

/// What a command prints: a list of records or one record.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Shape {
    List,
    One,
}

/// Check the three `-o` formats of one command: `json` is ONE document (an array for a list,
/// the object for one record), `jsonl` one object per line (as many as the array holds),
/// `table` a header of upper-case column names and a row per record (or `key  value` lines).
async fn check_formats(args: &[&str], stdin: &str, shape: Shape, url: &str) {
    let run = |o: &'static str| {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["-o", o, "--url", url]);
        let what = a.join(" ");
        async move { (cli_ok(&run_cli(&a, stdin, LIMIT).await, &what), what) }
    };
    let (json, what) = run("json").await;
    let doc: Value = serde_json::from_str(json.trim())
        .unwrap_or_else(|e| panic!("`{what}` must print one JSON document ({e}):\n{json}"));
    let n = match (shape, &doc) {
        (Shape::List, Value::Array(a)) => a.len(),
        (Shape::One, Value::Object(_)) => 1,
        _ => panic!("`{what}` printed the wrong kind of document for a {shape:?}: {doc}"),
    };
    let (jsonl, what) = run("jsonl").await;
    let lines: Vec<&str> = jsonl.lines().filter(|l| !l.trim().is_empty()).collect();
    for l in &lines {
        let v: Value = serde_json::from_str(l)
            .unwrap_or_else(|e| panic!("`{what}`: not a JSON line ({e}): {l:?}"));
        assert!(v.is_object(), "`{what}`: each line is one record: {l}");
    }
    assert_eq!(lines.len(), n, "`{what}`: a line per record:\n{jsonl}");
    let (table, what) = run("table").await;
    let rows: Vec<&str> = table.lines().collect();
    match shape {
        Shape::List => {
            let head = rows.first().copied().unwrap_or_default();
            assert!(
                !head.is_empty()
                    && head
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || "_. ".contains(c)),
                "`{what}`: the first line names the columns:\n{table}"
            );
            assert_eq!(rows.len(), n + 1, "`{what}`: a row per record:\n{table}");
        }
        Shape::One => {
            let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
            assert_eq!(
                rows.len(),
                keys.len(),
                "`{what}`: a line per field:\n{table}"
            );
            for (row, k) in rows.iter().zip(keys) {
                assert!(
                    row.starts_with(k.as_str()),
                    "`{what}`: {row:?} is the {k} line"
                );
            }
        }
    }
}

/// Wait (bounded) until `GET path` lists at least `n` items under `key`.
async fn wait_for(s: &Server, path: &str, key: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = s.get_json(path).await;
        if let Some(items) = v[key].as_array().filter(|a| a.len() >= n) {
            return items.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{path} never listed {n} {key}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 26: `append` and `tail` printed JSON lines whatever `-o` said, and `projections verify
/// -o json` printed a line per projection where `--help` promised one document. Every command
/// that prints records now prints exactly what `-o` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_that_prints_records_honours_o() {
    let s = Server::start(ServerOpts::default()).await;
    let url = s.base().to_owned();
    let base = s.start_head().to_string();
    task_and_notification(&s, "o-task", "o-n1", "urgent").await;
    let r = s
        .send(
            s.request(
                reqwest::Method::POST,
                "/v1/tasks/o-task/notifications/bridges",
            )
            .json(&json!({"subscription_id": "o-sub", "bridge_id": "o-bridge",
                          "sink": {"kind": "pull"}})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    wait_for(&s, "/v1/deliveries", "deliveries", 1).await;

    let events = "{\"event_id\": \"o-1\", \"stream\": \"o\", \"type\": \"o.t\"}\n\n\
                  {\"event_id\": \"o-2\", \"stream\": \"o\", \"type\": \"o.t\"}\n";
    check_formats(&["append"], events, Shape::List, &url).await;
    check_formats(
        &["tail", "--after", &base, "--count", "3"],
        "",
        Shape::List,
        &url,
    )
    .await;
    check_formats(&["projections", "list"], "", Shape::List, &url).await;
    check_formats(&["projections", "verify"], "", Shape::List, &url).await;
    check_formats(&["projections", "verify", "tasks"], "", Shape::One, &url).await;
    check_formats(&["deliveries", "list"], "", Shape::List, &url).await;
    check_formats(&["cursors", "show", "--lag"], "", Shape::List, &url).await;
    check_formats(
        &["cursors", "show", "--consumer", "o-c", "--stream", "o"],
        "",
        Shape::List,
        &url,
    )
    .await;
    check_formats(&["sources", "list"], "", Shape::List, &url).await;
    check_formats(
        &["tasks", "notifications", "list", "o-task"],
        "",
        Shape::List,
        &url,
    )
    .await;
    check_formats(
        &["tasks", "notifications", "show", "o-task", "o-sub"],
        "",
        Shape::One,
        &url,
    )
    .await;

    // Off a terminal, a list is one JSON document by default, receipts included.
    let out = run_cli(&["append", "--url", &url], events, LIMIT).await;
    let receipts: Value = serde_json::from_str(cli_ok(&out, "append").trim()).unwrap();
    assert_eq!(receipts.as_array().map(Vec::len), Some(2), "{receipts}");
    assert_eq!(receipts[0]["event_id"], "o-1");
    assert_eq!(receipts[1]["duplicate"], true);
    let out = run_cli(&["projections", "verify", "--url", &url], "", LIMIT).await;
    let reports: Value = serde_json::from_str(cli_ok(&out, "projections verify").trim()).unwrap();
    assert!(
        reports
            .as_array()
            .is_some_and(|a| a.len() > 1 && a.iter().all(|r| r["identical"] == true)),
        "{reports}"
    );
    // The same records whatever the format: the tail of the same events, three ways.
    let tail = |o: &'static str| {
        let url = url.clone();
        let base = base.clone();
        async move {
            let a = [
                "tail", "--after", &base, "--count", "3", "-o", o, "--url", &url,
            ];
            cli_ok(&run_cli(&a, "", LIMIT).await, "tail")
        }
    };
    let as_json: Vec<Value> = serde_json::from_str(tail("json").await.trim()).unwrap();
    assert_eq!(cli_records(tail("jsonl").await.as_bytes()), as_json);
    let table = tail("table").await;
    for (row, e) in table.lines().skip(1).zip(&as_json) {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[0], e["seq"].to_string(), "{table}");
        assert!(row.contains(e["type"].as_str().unwrap()), "{table}");
    }
}

/// `tail` without `--count` follows the log for ever: off a terminal it prints a JSON line per
/// event as it comes (one document would never end, so `-o json` asks for `--count`). And once
/// its reader goes away (`| head -1`) it ends quietly, also when no more events come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follows_as_json_lines_and_ends_quietly_when_its_reader_goes() {
    let s = Server::start(ServerOpts::default()).await;
    let url = s.base().to_owned();
    let base = s.start_head().to_string();
    for i in 0..3 {
        let (st, body) = s
            .append(&json!({"event_id": format!("f-{i}"), "stream": "f", "type": "f.t"}))
            .await;
        assert_eq!(st, reqwest::StatusCode::CREATED, "{body}");
    }
    let out = run_cli(&["tail", "-o", "json", "--url", &url], "", LIMIT).await;
    let err = refused(&out, "tail -o json without --count");
    assert!(err.contains("--count") && err.contains("jsonl"), "{err}");

    let mut child = cli_command(None, &["tail", "--after", &base, "--url", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tail");
    let mut reader = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    for i in 0..2 {
        let line = tokio::time::timeout(LIMIT, reader.next_line())
            .await
            .expect("tail printed an event")
            .unwrap()
            .expect("a line");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v["event_id"],
            format!("f-{i}"),
            "one event per line: {line}"
        );
    }
    // The reader goes away, as `head -2` would; no event comes after.
    drop(reader);
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .expect("tail ends once nobody reads it")
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    assert!(status.success(), "{status}: {err}");
    assert_eq!(err, "", "nothing on stderr");
}

/// Issue 26: `tidemark tail ... | head -1` and `tidemark deliveries list | head -1` printed
/// `Broken pipe` (or panicked). A closed stdout now ends a command quietly: exit 0, nothing on
/// stderr. `append` still appends what it read: its receipts are only the echo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_a_command_quietly() {
    let s = Server::start(ServerOpts::default()).await;
    let url = s.base().to_owned();
    for i in 0..3 {
        let (st, body) = s
            .append(
                &json!({"event_id": format!("p-{i}"), "stream": "notifications",
                            "subject": format!("p-{i}"), "type": "notification.requested",
                            "payload": {"priority": "urgent", "title": "T"}}),
            )
            .await;
        assert_eq!(st, reqwest::StatusCode::CREATED, "{body}");
    }
    wait_for(&s, "/v1/deliveries", "deliveries", 3).await;

    // The operator's own pipelines, through a shell.
    let bin = tidemark_tests::binary();
    let bin = bin.to_string_lossy();
    for cmd in [
        "\"$0\" tail --after 0 --url \"$1\" | head -1",
        "\"$0\" deliveries list --url \"$1\" | head -1",
        "\"$0\" deliveries list -o jsonl --url \"$1\" | head -1",
        "\"$0\" deliveries list -o table --url \"$1\" | head -1",
    ] {
        let out = tokio::time::timeout(
            LIMIT,
            cli_command(Some("sh"), &["-c", cmd, &bin, &url])
                .stdin(Stdio::null())
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("`{cmd}` did not end"))
        .unwrap();
        assert!(out.status.success(), "{cmd}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{cmd}: nothing on stderr");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).lines().count(),
            1,
            "{cmd}"
        );
    }

    // A stdout whose reader is gone before the first write: every write fails (EPIPE).
    let head = s.head().await;
    for (args, stdin) in [
        (vec!["deliveries", "list"], ""),
        (vec!["deliveries", "list", "-o", "jsonl"], ""),
        (vec!["deliveries", "list", "-o", "table"], ""),
        (vec!["tail", "--after", "0", "--count", "2"], ""),
        (vec!["tail", "--after", "0", "-o", "table"], ""),
        (vec!["projections", "list"], ""),
        (vec!["cursors", "show", "--lag", "-o", "jsonl"], ""),
        (
            vec!["append"],
            "{\"event_id\": \"p-new\", \"stream\": \"p\", \"type\": \"p.t\"}\n",
        ),
        (vec!["completions", "bash"], ""),
        (vec!["config", "show"], ""),
    ] {
        let what = args.join(" ");
        let mut a = args.clone();
        if !matches!(args[0], "completions" | "config") {
            a.extend(["--url", &url]);
        }
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut child = cli_command(None, &a)
            .stdin(Stdio::piped())
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use tokio::io::AsyncWriteExt;
            let mut input = child.stdin.take().unwrap();
            input.write_all(stdin.as_bytes()).await.unwrap();
        }
        let out = tokio::time::timeout(LIMIT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("`{what}` into a closed pipe did not end"))
            .unwrap();
        let err = stderr(&out);
        assert!(out.status.success(), "{what}: {}: {err}", out.status);
        let err: Vec<&str> = err
            .lines()
            .filter(|l| !l.starts_with("appended "))
            .collect();
        assert!(err.is_empty(), "{what}: nothing on stderr: {err:?}");
    }
    assert_eq!(
        s.head().await,
        head + 1,
        "append appended into a closed pipe"
    );
}

/// Issue 26: errors printed the raw problem JSON. They are words now, with the code and what
/// to do; `-o json` (for scripts) prints the problem document itself on stderr. A server that
/// does not answer is named with its URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_what_went_wrong_and_what_to_do() {
    let token = random_token(32);
    let admin = random_token(32);
    let mut s = Server::start(ServerOpts::default().config(format!(
        "[[auth.tokens]]\nname = \"reader\"\nsha256 = \"{}\"\nscopes = [\"read\"]\n\
         [[auth.tokens]]\nname = \"admin\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
        sha256_hex(&token),
        sha256_hex(&admin)
    )))
    .await;
    s.set_token(Some(&admin));
    let url = s.base().to_owned();
    let run = |args: &[&str]| {
        let mut a: Vec<String> = args.iter().map(|x| (*x).to_owned()).collect();
        a.extend(["--url".to_owned(), url.clone()]);
        async move {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            run_cli(&a, "", LIMIT).await
        }
    };
    let head = s.head().await;

    // No token: what is wrong, and how to pass one.
    let err = refused(&run(&["deliveries", "list"]).await, "no token");
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines[0].starts_with("error: unauthorized (401 unauthorized): "),
        "{err}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("hint: ")
            && l.contains("--token")
            && l.contains("TIDEMARK_TOKEN")),
        "{err}"
    );
    assert!(
        !err.contains("\"type\""),
        "words, not the problem JSON: {err}"
    );

    // A token without the scope.
    let err = refused(
        &run(&["deliveries", "retry", "dlv:x", "--token", &token]).await,
        "retry with a read token",
    );
    assert!(
        err.starts_with("error: forbidden (403 forbidden_scope): "),
        "{err}"
    );
    assert!(err.contains("\nhint: ") && err.contains("scope"), "{err}");
    assert!(!err.contains(&token), "the token is never printed: {err}");

    // An unknown id.
    let unknown = ["deliveries", "retry", "dlv:nope", "--token", &admin];
    let err = refused(&run(&unknown).await, "retry of an unknown delivery");
    assert!(
        err.starts_with("error: not found (404 delivery_not_found): "),
        "{err}"
    );
    assert!(err.contains("\nhint: check the id"), "{err}");

    // A reset without a reason.
    let err = refused(
        &run(&[
            "cursors",
            "reset",
            "--consumer",
            "c",
            "--stream",
            "s",
            "--to",
            "0",
            "--reason",
            "",
            "--token",
            &admin,
        ])
        .await,
        "reset without a reason",
    );
    assert!(err.contains("(422 reason_required)"), "{err}");
    assert!(err.contains("\nhint: say why with --reason"), "{err}");

    // Under -o json (and jsonl), stderr is the server's problem document.
    for o in ["json", "jsonl"] {
        let out = run(&[
            "deliveries",
            "retry",
            "dlv:nope",
            "--token",
            &admin,
            "-o",
            o,
        ])
        .await;
        let err = refused(&out, "retry -o json");
        let p: Value = serde_json::from_str(err.trim())
            .unwrap_or_else(|e| panic!("-o {o}: stderr is one JSON document ({e}): {err}"));
        assert_eq!(p["code"], "delivery_not_found", "{p}");
        assert_eq!(p["status"], 404, "{p}");
        assert!(p["detail"].is_string() && p["title"].is_string(), "{p}");
    }
    let out = run(&[
        "projections",
        "verify",
        "nope",
        "--token",
        &admin,
        "-o",
        "json",
    ])
    .await;
    let p: Value = serde_json::from_str(refused(&out, "verify nope").trim()).unwrap();
    assert_eq!(p["code"], "not_found", "{p}");
    assert_eq!(s.head().await, head, "no refusal appended anything");

    // Nothing listens: the URL is named and the server said not to run there.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let nowhere = format!("127.0.0.1:{port}");
    for args in [
        vec!["deliveries", "list"],
        vec!["tail", "--after", "0"],
        vec!["append"],
    ] {
        let mut a = args.clone();
        a.extend(["--url", &nowhere]);
        let out = run_cli(&a, "{\"stream\": \"s\", \"type\": \"t.t\"}\n", LIMIT).await;
        let err = refused(&out, &a.join(" "));
        assert!(
            err.starts_with(&format!(
                "error: cannot reach the server at http://{nowhere}"
            )),
            "{args:?}: {err}"
        );
        assert!(err.contains("not running"), "{args:?}: {err}");
    }
}

/// Issue 26: an `append` error named the event's index in the batch, which no one can find in
/// a file with blank lines (or past the first batch of 1000). It names the line of the file,
/// and a malformed line is reported before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_errors_name_the_line_of_the_file() {
    let s = Server::start(ServerOpts::default()).await;
    let url = s.base().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let ev = |id: &str| format!("{{\"event_id\": \"{id}\", \"stream\": \"l\", \"type\": \"l.t\"}}");
    let head = s.head().await;

    // The server refuses the 3rd event of the batch, on line 4 (line 2 is blank).
    let bad = format!(
        "{}\n\n{}\n{{\"event_id\": \"l-3\", \"stream\": \"NOT OK\", \"type\": \"l.t\"}}\n",
        ev("l-1"),
        ev("l-2")
    );
    let path = file("bad.jsonl", &bad);
    let out = run_cli(&["append", &path, "--url", &url], "", LIMIT).await;
    let err = refused(&out, "append of a bad event");
    assert!(
        err.starts_with("error: bad request (400 invalid_field): "),
        "{err}"
    );
    assert!(!err.contains("event 2"), "the line, not the index: {err}");
    assert!(err.contains(&format!("\n  at line 4 of {path}\n")), "{err}");
    assert!(err.contains("nothing was appended"), "{err}");
    let out = run_cli(&["append", &path, "-o", "json", "--url", &url], "", LIMIT).await;
    let p: Value = serde_json::from_str(refused(&out, "append -o json").trim()).unwrap();
    assert_eq!(p["code"], "invalid_field", "{p}");
    assert_eq!(p["line"], 4, "{p}");
    assert_eq!(p["file"], path.as_str(), "{p}");
    // The same from stdin.
    let out = run_cli(&["append", "--url", &url], &bad, LIMIT).await;
    assert!(refused(&out, "append from stdin").contains("\n  at line 4 of stdin\n"));
    assert_eq!(s.head().await, head, "a refused batch appends nothing");

    // A line that is not JSON: its number, before anything is sent (also past a batch).
    let mut many: String = (0..1500).map(|i| ev(&format!("m-{i}")) + "\n").collect();
    many.push_str("\n{\"event_id\": \"m-x\", oops}\n");
    let out = run_cli(&["append", "--url", &url], &many, LIMIT).await;
    let err = refused(&out, "append of a malformed line");
    assert!(
        err.starts_with("error: line 1502 of stdin is not a JSON object"),
        "{err}"
    );
    assert!(err.contains("nothing was sent"), "{err}");
    let out = run_cli(
        &["append", &file("many.jsonl", &many), "--url", &url],
        "",
        LIMIT,
    )
    .await;
    assert!(refused(&out, "append of a malformed file").contains("line 1502 of"));
    let out = run_cli(&["append", "--url", &url], "{\"a\": 1}\n[1, 2]\n", LIMIT).await;
    assert!(
        refused(&out, "append of an array")
            .starts_with("error: line 2 of stdin is not a JSON object"),
    );
    assert_eq!(s.head().await, head, "nothing was sent");

    // Refused in the second batch: the first one stays appended, and the error says so.
    let mut two: String = (0..1000).map(|i| ev(&format!("t-{i}")) + "\n").collect();
    two.push_str(&format!(
        "\n{}\n{{\"event_id\": \"t-x\", \"stream\": \"l\", \"type\": \"NOT OK\"}}\n",
        ev("t-1000")
    ));
    let out = run_cli(&["append", "--url", &url], &two, LIMIT).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("\n  at line 1003 of stdin\n"), "{err}");
    assert!(
        err.contains("1000 events up to line 1000 were appended"),
        "{err}"
    );
    let receipts: Value = serde_json::from_slice(&out.stdout).expect("the receipts, one array");
    assert_eq!(receipts.as_array().map(Vec::len), Some(1000));
    assert_eq!(receipts[999]["event_id"], "t-999");
    assert_eq!(s.head().await, head + 1000);
}

/// Issue 26: `--url 127.0.0.1:7861` said "builder error". An address without a scheme is
/// http; a URL that still cannot be used says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_without_a_scheme_is_http() {
    let s = Server::start(ServerOpts::default()).await;
    let port = s.addr().port();
    for url in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let out = run_cli(&["projections", "list", "--url", &url], "", LIMIT).await;
        let list: Value = serde_json::from_str(cli_ok(&out, &url).trim()).unwrap();
        assert!(list.as_array().is_some_and(|a| !a.is_empty()), "{list}");
        let out = run_cli(
            &["tail", "--after", "0", "--count", "1", "--url", &url],
            "",
            LIMIT,
        )
        .await;
        cli_ok(&out, &url);
    }
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        let s6 = Server::start(ServerOpts::default().listen("[::1]:0")).await;
        let url = format!("[::1]:{}", s6.addr().port());
        let out = run_cli(&["projections", "list", "--url", &url], "", LIMIT).await;
        cli_ok(&out, &url);
    } else {
        eprintln!("no IPv6 loopback here: [::1]:PORT not tried");
    }
    for (url, why) in [
        ("ftp://127.0.0.1:1", "http or https"),
        ("127.0.0.1:notaport", "invalid port"),
        ("http://", "empty host"),
    ] {
        let out = run_cli(&["deliveries", "list", "--url", url], "", LIMIT).await;
        let err = refused(&out, url);
        assert!(
            err.starts_with(&format!("error: --url {url:?} cannot be used: ")) && err.contains(why),
            "{url}: {err}"
        );
        assert!(!err.contains("builder error"), "{err}");
    }
}

/// The `--help` texts say what `-o` prints, command by command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_says_what_each_output_prints() {
    let help = |args: &'static [&'static str]| async move {
        let mut a = args.to_vec();
        a.push("--help");
        cli_ok(&run_cli(&a, "", LIMIT).await, &a.join(" "))
    };
    let text = help(&["deliveries", "list"]).await;
    for said in [
        "one JSON document",
        "an array of the records",
        "one JSON record per line",
        "the default on a terminal",
        "problem JSON",
        "host:port",
    ] {
        assert!(text.contains(said), "{said:?} in:\n{text}");
    }
    let text = help(&["tail"]).await;
    assert!(
        text.contains("one JSON line per event") && text.contains("needs an end"),
        "{text}"
    );
    let text = help(&["append"]).await;
    assert!(
        text.contains("before anything is sent") && text.contains("line of the input"),
        "{text}"
    );
    let text = help(&["projections", "verify"]).await;
    assert!(text.contains("one array"), "{text}");
    let text = help(&["sources", "list"]).await;
    assert!(
        text.lines().next() == Some("Every source with its state"),
        "{text}"
    );
}

/// `deliveries list` shows the newest first by default (a large outbox's recent rows are on
/// the first page), `--order id` by id; both page through everything.
#[tokio::test]
async fn deliveries_list_newest_first_by_default() {
    let s = Server::start(ServerOpts::default()).await;
    // Created in the order a, c, b: by id a < b < c, newest first b, c, a.
    for id in ["ord-a", "ord-c", "ord-b"] {
        crate::common::append_ok(
            &s,
            &crate::common::notif_ev(id, json!({"priority": "urgent", "title": id})),
        )
        .await;
        crate::e2e_deliveries::wait_status(&s, &format!("dlv:{id}:desktop"), "queued").await;
    }
    let ids = |out: String| -> Vec<String> {
        let v: Value = serde_json::from_str(&out).expect("one JSON document");
        v.as_array()
            .expect("an array")
            .iter()
            .map(|d| d["id"].as_str().expect("id").to_owned())
            .collect()
    };
    let dl = |id: &str| format!("dlv:{id}:desktop");
    let newest = cli_ok(
        &run_cli(
            &["deliveries", "list", "-o", "json", "--url", s.base()],
            "",
            LIMIT,
        )
        .await,
        "deliveries list",
    );
    assert_eq!(ids(newest), vec![dl("ord-b"), dl("ord-c"), dl("ord-a")]);
    let by_id = cli_ok(
        &run_cli(
            &[
                "deliveries",
                "list",
                "--order",
                "id",
                "-o",
                "json",
                "--url",
                s.base(),
            ],
            "",
            LIMIT,
        )
        .await,
        "deliveries list --order id",
    );
    assert_eq!(ids(by_id), vec![dl("ord-a"), dl("ord-b"), dl("ord-c")]);
}

/// `deliveries list` filters as the console does: by notification, source site, creation time
/// and title text (the CLI once had only status, sink, route, recipient, type and list, so an
/// operator in a shell could not narrow a large outbox to one site or one hour). A time that
/// is not RFC 3339 is the server's `400 invalid_query`, said as such.
#[tokio::test]
async fn deliveries_list_takes_the_consoles_filters() {
    let s = Server::start(ServerOpts::default()).await;
    let note = |id: &str, site: Option<&str>, title: &str| {
        let mut p = json!({"priority": "urgent", "title": title});
        if let Some(site) = site {
            p["source"] = json!({"site_id": site});
        }
        crate::common::notif_ev(id, p)
    };
    // One at a time, so their creation times are in this order.
    for (id, site, title) in [
        ("cf-1", Some("plant-a"), "Pump 1 stopped"),
        ("cf-2", Some("plant-b"), "Valve 2 open"),
        ("cf-3", Some("plant-a"), "pump 3 STOPPED"),
        ("cf-4", None, "Door 4 open"),
    ] {
        crate::common::append_ok(&s, &note(id, site, title)).await;
        crate::e2e_deliveries::wait_status(&s, &format!("dlv:{id}:desktop"), "queued").await;
    }
    let dl = |id: &str| format!("dlv:{id}:desktop");
    let list = |args: Vec<String>| {
        let s = &s;
        async move {
            let mut a: Vec<&str> = vec!["deliveries", "list", "--order", "id", "-o", "json"];
            a.extend(args.iter().map(String::as_str));
            a.extend(["--url", s.base()]);
            let out = cli_ok(&run_cli(&a, "", LIMIT).await, &a.join(" "));
            let v: Value = serde_json::from_str(&out).expect("one JSON document");
            v.as_array()
                .expect("an array")
                .iter()
                .map(|d| d["id"].as_str().expect("id").to_owned())
                .collect::<Vec<String>>()
        }
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        list(args(&["--notification-id", "cf-2"])).await,
        [dl("cf-2")]
    );
    assert_eq!(
        list(args(&["--source-site", "plant-a"])).await,
        [dl("cf-1"), dl("cf-3")]
    );
    assert_eq!(
        list(args(&["--search", "pump"])).await,
        [dl("cf-1"), dl("cf-3")]
    );
    assert_eq!(
        list(args(&["--source-site", "plant-a", "--search", "1"])).await,
        [dl("cf-1")]
    );
    // The time range, cut at the third's creation time as the server recorded it.
    let (_, row) = s
        .get_json(&format!(
            "/v1/deliveries/{}",
            tidemark_tests::encode_path(&dl("cf-3"))
        ))
        .await;
    let cut = row["created_at"].as_str().expect("created_at").to_owned();
    assert_eq!(
        list(vec!["--created-after".into(), cut.clone()]).await,
        [dl("cf-3"), dl("cf-4")],
        "at or after {cut}"
    );
    assert_eq!(
        list(vec!["--created-before".into(), cut.clone()]).await,
        [dl("cf-1"), dl("cf-2")],
        "before {cut}"
    );
    // Both ends: the third alone.
    let micros = tidemark_log::time::parse_rfc3339_micros(&cut).expect("RFC 3339");
    assert_eq!(
        list(vec![
            "--created-after".into(),
            cut.clone(),
            "--created-before".into(),
            tidemark_log::time::format_micros(micros + 1),
        ])
        .await,
        [dl("cf-3")]
    );
    // A time that is not one: the server's problem, non-zero exit, nothing on stdout.
    for (fmt, check) in [("json", true), ("table", false)] {
        let out = run_cli(
            &[
                "deliveries",
                "list",
                "--created-after",
                "yesterday",
                "-o",
                fmt,
                "--url",
                s.base(),
            ],
            "",
            LIMIT,
        )
        .await;
        let err = refused(&out, "deliveries list --created-after yesterday");
        assert!(err.contains("created_after"), "{err}");
        if check {
            let p: Value = serde_json::from_str(err.trim()).expect("the problem JSON");
            assert_eq!(p["code"], "invalid_query", "{p}");
            assert_eq!(p["status"], 400, "{p}");
        }
    }
}
