//! Graceful shutdown: on SIGTERM in-flight appends finish, SSE streams end, the db is closed
//! cleanly (no repair on the next open) and the process exits 0.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts, SseNext};

use crate::common::{assert_dense_unique, id_of, receipts, seq_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_acknowledged_appends_ends_streams_and_exits_zero() {
    let mut s = Server::start(ServerOpts::default()).await;
    let acked: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let refusals: Arc<Mutex<Vec<String>>> = Arc::default();
    let first_ack = Arc::new(tokio::sync::Notify::new());
    let stop = Arc::new(AtomicBool::new(false));

    let mut stream = s.sse("after_sequence=0", None).await.expect("open stream");
    let reader = tokio::spawn(async move {
        let mut seqs = Vec::new();
        loop {
            match stream.next(Duration::from_secs(60)).await {
                SseNext::Event(e) => seqs.push(e.seq()),
                end => return (seqs, end),
            }
        }
    });

    let appenders: Vec<_> = (0..8)
        .map(|task| {
            let api = s.api();
            let acked = acked.clone();
            let refusals = refusals.clone();
            let first_ack = first_ack.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                for n in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let batch: Vec<Value> = (0..3)
                        .map(|k| {
                            json!({"event_id": format!("sd-{task}-{n}-{k}"), "stream": "sd",
                                        "subject": format!("w{task}"), "type": "sd.t"})
                        })
                        .collect();
                    match api.try_append(&json!({ "events": batch })).await {
                        Ok((StatusCode::CREATED, body)) => {
                            let mut a = acked.lock().expect("lock");
                            for (id, seq, _) in receipts(&body) {
                                a.insert(id, seq);
                            }
                            first_ack.notify_one();
                        }
                        Ok((StatusCode::SERVICE_UNAVAILABLE, body)) => {
                            if body["code"] != "shutting_down" {
                                refusals.lock().expect("lock").push(format!("503 {body}"));
                            }
                            return;
                        }
                        Ok((status, body)) => {
                            refusals
                                .lock()
                                .expect("lock")
                                .push(format!("{status} {body}"));
                            return;
                        }
                        Err(_) => return, // the listener is gone
                    }
                }
            })
        })
        .collect();

    tokio::time::timeout(Duration::from_secs(30), first_ack.notified())
        .await
        .expect("no append was acknowledged within 30 s");
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.sigterm();
    let status = s.wait_exit(Duration::from_secs(30)).await;
    stop.store(true, Ordering::Relaxed);
    for a in appenders {
        tokio::time::timeout(Duration::from_secs(30), a)
            .await
            .expect("an appender hung after shutdown")
            .expect("appender panicked");
    }
    let (seen, end) = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .expect("the SSE stream did not end after the server exited")
        .expect("reader panicked");
    assert!(
        status.success(),
        "after SIGTERM the server must exit 0, it exited with {status}; stderr:\n{}",
        tidemark_tests::tail(&s.stderr(), 4000)
    );
    assert!(
        matches!(end, SseNext::End),
        "the SSE stream must be ended cleanly by the server, got {end:?}"
    );
    let refusals = refusals.lock().expect("lock").clone();
    assert!(
        refusals.is_empty(),
        "unexpected answers during shutdown: {refusals:?}"
    );

    s.restart().await;
    let head = s.head().await;
    let all = s.read_all("").await;
    assert_dense_unique(&all, head);
    let by_id: HashMap<&str, u64> = all.iter().map(|e| (id_of(e), seq_of(e))).collect();
    let acked = acked.lock().expect("lock").clone();
    assert!(!acked.is_empty());
    for (id, seq) in &acked {
        assert_eq!(
            by_id.get(id.as_str()),
            Some(seq),
            "acknowledged event {id} (seq {seq}) is not in the log after a clean shutdown"
        );
    }
    for (i, seq) in seen.iter().enumerate() {
        assert_eq!(
            *seq,
            u64::try_from(i).expect("i") + 1,
            "the SSE stream was not dense"
        );
    }
    assert!(
        u64::try_from(seen.len()).expect("len") <= head,
        "the stream served more events than the log holds"
    );
    let stderr = s.stderr();
    assert!(
        !stderr.contains("repairing"),
        "the reopen after SIGTERM repaired the db, so it was not closed cleanly:\n{stderr}"
    );
    eprintln!(
        "shutdown: {} acknowledged, head {head}, stream saw {}",
        acked.len(),
        seen.len()
    );
}
