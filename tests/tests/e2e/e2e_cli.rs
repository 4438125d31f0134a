//! The CLI against a running server: `tidemark append` and `tidemark tail`.

use std::time::Duration;

use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts, run_cli};

const LIMIT: Duration = Duration::from_secs(60);

fn lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}")))
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
