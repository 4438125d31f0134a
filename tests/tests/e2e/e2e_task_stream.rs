//! Read-then-stream (I6 through the tasks read model): a client reads `GET /v1/tasks/{id}`,
//! then follows `GET /v1/tasks/{id}/stream?after_sequence=<latest_event_seq>`, while other
//! clients keep appending lifecycle and free-form events about the same tasks. The model's
//! `latest_event_seq` must cover every event acknowledged before the read, the model must be
//! the fold of exactly the events up to it, and the stream must continue right after it: the
//! events up to `latest_event_seq` plus the streamed ones are the task's events, with no gap
//! and no duplicate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, SseNext, assert_problem_for, encode_path};

use crate::common::{TaskOracle, append_ok, get_task, id_of, receipts, seq_of, task_ev};

const TASKS: usize = 4;
const BATCHES_PER_APPENDER: u32 = 120;

fn task_name(i: usize) -> String {
    format!("race-{i}")
}

fn created_payload(i: usize) -> Value {
    json!({"project_id": "race", "review_required": i % 2 == 1})
}

/// Highest acknowledged seq per task (only raised by appenders).
type Acked = Arc<Mutex<HashMap<String, u64>>>;

fn note_acks(acked: &Acked, batch: &[Value], body: &Value) {
    let mut a = acked.lock().expect("lock");
    for ((_, seq, _), e) in receipts(body).into_iter().zip(batch) {
        let task = e["subject"].as_str().expect("subject").to_owned();
        let m = a.entry(task).or_default();
        *m = (*m).max(seq);
    }
}

/// Lifecycle scripts: each appender owns some tasks and walks their runs through every kind
/// of ending; a third appender sprinkles free-form events on all tasks.
async fn lifecycle_appender(api: Api, owned: Vec<String>, seed: u64, acked: Acked) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut step: HashMap<String, u64> = HashMap::new();
    for _ in 0..BATCHES_PER_APPENDER {
        let size = rng.random_range(1..=3);
        let batch: Vec<Value> = (0..size)
            .map(|_| {
                let task = owned[rng.random_range(0..owned.len())].clone();
                let n = step.entry(task.clone()).or_default();
                *n += 1;
                let run = format!("r{}", *n / 5);
                let (ty, payload) = match *n % 5 {
                    0 => ("task.run_started", json!({"run_id": run})),
                    1 if rng.random_bool(0.4) => {
                        ("task.run_review_requested", json!({"run_id": run}))
                    }
                    1 | 2 => (
                        ["task.run_completed", "task.run_failed", "task.run_canceled"]
                            [rng.random_range(0..3)],
                        json!({"run_id": run, "error": "e"}),
                    ),
                    3 => (
                        "task.run_review_rejected",
                        json!({"run_id": run, "continuation": rng.random_bool(0.5)}),
                    ),
                    _ => ("task.run_review_approved", json!({"run_id": run})),
                };
                task_ev(&task, ty, payload)
            })
            .collect();
        let (st, body) = api.append(&json!({ "events": batch })).await;
        assert_eq!(st, StatusCode::CREATED, "lifecycle append: {body}");
        note_acks(&acked, &batch, &body);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..8))).await;
    }
}

async fn chatter_appender(api: Api, seed: u64, acked: Acked) {
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..BATCHES_PER_APPENDER {
        let size = rng.random_range(1..=4);
        let batch: Vec<Value> = (0..size)
            .map(|k| {
                let idx = rng.random_range(0..TASKS);
                let task = task_name(idx);
                let stream = ["comments", "artifacts", "task_events"][rng.random_range(0..3)];
                if stream == "task_events" {
                    // A lifecycle event that changes no status: the creation again.
                    task_ev(&task, "task.created", created_payload(idx))
                } else {
                    json!({"stream": stream, "subject": task, "type": "note.added",
                           "payload": {"i": i, "k": k}})
                }
            })
            .collect();
        let (st, body) = api.append(&json!({ "events": batch })).await;
        assert_eq!(st, StatusCode::CREATED, "free-form append: {body}");
        note_acks(&acked, &batch, &body);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..8))).await;
    }
}

/// One read-then-stream of a task.
#[derive(Debug)]
struct Look {
    /// Highest seq acknowledged for the task before the GET was sent.
    acked_before: u64,
    latest: u64,
    status: String,
    /// Seqs of the task's events that `GET /v1/events?subject=` showed right after the GET.
    read_upto_latest: Vec<u64>,
    streamed: Vec<(u64, String)>,
    by_header: bool,
}

async fn look(
    api: &Api,
    task: &str,
    acked: &Acked,
    rng: &mut StdRng,
    until_seq: Option<u64>,
) -> Look {
    let acked_before = acked.lock().expect("lock").get(task).copied().unwrap_or(0);
    let t = get_task(api, task).await;
    let latest = t["latest_event_seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("no latest_event_seq: {t}"));
    let status = t["status"].as_str().expect("status").to_owned();
    let read_upto_latest: Vec<u64> = api
        .read_all(&format!("subject={}", encode_path(task)))
        .await
        .iter()
        .map(seq_of)
        .filter(|s| *s <= latest)
        .collect();
    // Resume as a first connection (`after_sequence`) or as an EventSource reconnect
    // (`Last-Event-ID` wins over the query).
    let by_header = rng.random_bool(0.5);
    let header = latest.to_string();
    let mut stream = if by_header {
        api.task_sse(task, "after_sequence=0", Some(&header)).await
    } else {
        api.task_sse(task, &format!("after_sequence={latest}"), None)
            .await
    }
    .unwrap_or_else(|r| panic!("GET /v1/tasks/{task}/stream: {} {}", r.status, r.text));
    assert!(
        stream.content_type.starts_with("text/event-stream"),
        "content type {:?}",
        stream.content_type
    );
    let quota = rng.random_range(1..25);
    let mut streamed: Vec<(u64, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let caught_up = until_seq.is_some_and(|t| latest >= t);
    if !caught_up {
        loop {
            let idle = if until_seq.is_some() {
                Duration::from_secs(30)
            } else {
                Duration::from_millis(300)
            };
            match stream.next(idle).await {
                SseNext::Event(e) => {
                    assert_eq!(e.id, e.seq().to_string(), "SSE id is the seq");
                    assert_eq!(e.event, e.data["type"].as_str().unwrap_or_default());
                    assert_eq!(
                        e.data["subject"], task,
                        "the task stream of {task} sent another subject: {}",
                        e.data
                    );
                    streamed.push((e.seq(), id_of(&e.data).to_owned()));
                }
                SseNext::Timeout if until_seq.is_none() => break,
                other => panic!("the task stream of {task} stopped: {other:?}"),
            }
            match until_seq {
                Some(target) => {
                    if streamed.last().is_some_and(|x| x.0 >= target) {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{task}: stream never reached {target}"
                    );
                }
                None if streamed.len() >= quota => break,
                None => {}
            }
        }
    }
    Look {
        acked_before,
        latest,
        status,
        read_upto_latest,
        streamed,
        by_header,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_then_stream_misses_nothing_under_concurrent_appends() {
    let seed: u64 = rand::random();
    eprintln!("task stream race seed: {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let s = Server::start(ServerOpts::default()).await;
    let acked: Acked = Arc::default();
    let created: Vec<Value> = (0..TASKS)
        .map(|i| task_ev(&task_name(i), "task.created", created_payload(i)))
        .collect();
    let (st, body) = s.append(&json!({ "events": created.clone() })).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    note_acks(&acked, &created, &body);

    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..TASKS)
        .map(|i| {
            let api = s.api();
            let acked = acked.clone();
            let done = done.clone();
            let seed = rng.random();
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed);
                let task = task_name(i);
                let mut looks = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    looks.push(look(&api, &task, &acked, &mut rng, None).await);
                }
                (task, looks)
            })
        })
        .collect();
    let appenders = vec![
        tokio::spawn(lifecycle_appender(
            s.api(),
            vec![task_name(0), task_name(1)],
            rng.random(),
            acked.clone(),
        )),
        tokio::spawn(lifecycle_appender(
            s.api(),
            vec![task_name(2), task_name(3)],
            rng.random(),
            acked.clone(),
        )),
        tokio::spawn(chatter_appender(s.api(), rng.random(), acked.clone())),
    ];
    for a in appenders {
        tokio::time::timeout(Duration::from_secs(120), a)
            .await
            .expect("an appender did not finish within 120 s")
            .expect("appender panicked");
    }
    done.store(true, Ordering::Relaxed);

    let mut total_looks = 0;
    let mut total_streamed = 0;
    for r in readers {
        let (task, mut looks) = tokio::time::timeout(Duration::from_secs(120), r)
            .await
            .expect("a reader did not finish")
            .expect("reader panicked");
        let all = s.read_all(&format!("subject={}", encode_path(&task))).await;
        let seqs: Vec<u64> = all.iter().map(seq_of).collect();
        let last = *seqs.last().expect("the task has events");
        // A last look after the appends: it must reach the task's last event.
        looks.push(look(&s, &task, &acked, &mut rng, Some(last)).await);
        assert!(looks.len() >= 3, "{task}: only {} looks", looks.len());
        for (n, l) in looks.iter().enumerate() {
            let what = format!(
                "{task} look #{n} (latest_event_seq {}, {})",
                l.latest,
                if l.by_header {
                    "Last-Event-ID"
                } else {
                    "after_sequence"
                }
            );
            assert!(
                l.latest >= l.acked_before,
                "{what}: seq {} was acknowledged before the GET but latest_event_seq is {}",
                l.acked_before,
                l.latest
            );
            let pos = seqs.iter().position(|x| *x == l.latest).unwrap_or_else(|| {
                panic!("{what}: latest_event_seq is not the seq of any event of the task")
            });
            let upto = &all[..=pos];
            assert_eq!(
                l.read_upto_latest,
                seqs[..=pos].to_vec(),
                "{what}: the events up to latest_event_seq, read right after the GET"
            );
            assert_eq!(
                l.status,
                TaskOracle::of(upto).status,
                "{what}: the status is not the fold of the events up to latest_event_seq"
            );
            let after: Vec<(u64, String)> = all[pos + 1..]
                .iter()
                .map(|e| (seq_of(e), id_of(e).to_owned()))
                .collect();
            assert!(
                l.streamed.len() <= after.len() && l.streamed[..] == after[..l.streamed.len()],
                "{what}: the stream is not the task's events right after latest_event_seq: \
                 streamed {:?}, expected a prefix of {:?}",
                &l.streamed[..l.streamed.len().min(10)],
                &after[..after.len().min(10)]
            );
            total_streamed += l.streamed.len();
        }
        let fin = looks.last().expect("final look");
        let mut union: Vec<u64> = fin.read_upto_latest.clone();
        union.extend(fin.streamed.iter().map(|x| x.0));
        assert_eq!(
            union, seqs,
            "{task}: events up to latest_event_seq + streamed events != all the task's events"
        );
        let t = get_task(&s, &task).await;
        assert_eq!(t["latest_event_seq"], last, "{task}: {t}");
        assert_eq!(
            t["status"],
            TaskOracle::of(&all).status.as_str(),
            "{task}: {t}"
        );
        total_looks += looks.len();
    }
    eprintln!("task stream race: {total_looks} looks, {total_streamed} events streamed");
    assert!(
        total_streamed > 0,
        "no look streamed anything: the race was not exercised"
    );
}

#[tokio::test]
async fn task_stream_resume_rules() {
    let s = Server::start(ServerOpts::default()).await;
    let t = "stream-rules";
    let mut seqs = Vec::new();
    for i in 0..6 {
        let e = if i % 2 == 0 {
            task_ev(t, "task.created", json!({"project_id": "p"}))
        } else {
            json!({"stream": "comments", "subject": t, "type": "note.added", "payload": {"i": i}})
        };
        seqs.push(append_ok(&s, &e).await[0].1);
        // Another task's events interleave; they are not on this stream.
        append_ok(
            &s,
            &task_ev("stream-other", "task.created", json!({"project_id": "p"})),
        )
        .await;
    }
    let wait = Duration::from_secs(30);
    let mut st = s
        .task_sse(t, &format!("after_sequence={}", seqs[3]), Some("0"))
        .await
        .expect("stream");
    for want in &seqs {
        assert_eq!(
            st.expect_event(wait).await.seq(),
            *want,
            "Last-Event-ID: 0 wins over after_sequence"
        );
    }
    drop(st);
    let mut st = s
        .task_sse(t, &format!("after_sequence={}", seqs[3]), None)
        .await
        .expect("stream");
    assert_eq!(st.expect_event(wait).await.seq(), seqs[4]);
    drop(st);
    let mut st = s
        .task_sse(t, "after_sequence=0", Some(&seqs[1].to_string()))
        .await
        .expect("stream");
    assert_eq!(st.expect_event(wait).await.seq(), seqs[2]);
    // Live tail.
    let mut st = s
        .task_sse(t, &format!("after_sequence={}", seqs[5]), None)
        .await
        .expect("stream");
    append_ok(&s, &task_ev("stream-other", "task.canceled", json!({}))).await;
    let live = append_ok(&s, &task_ev(t, "task.run_started", json!({"run_id": "r1"}))).await;
    let e = st.expect_event(wait).await;
    assert_eq!(e.seq(), live[0].1, "the next event of the task, live");
    assert_eq!(e.event, "task.run_started");
    assert_eq!(e.data["subject"], t);

    for id in ["abc", "-1", "1.5", "0x10", "1 2"] {
        let r = s
            .task_sse(t, "after_sequence=0", Some(id))
            .await
            .err()
            .unwrap_or_else(|| panic!("Last-Event-ID {id:?} opened a stream"));
        assert_problem_for(&r, 400, "invalid_last_event_id", id);
    }
    for q in ["after_sequence=abc", "after_sequence=-1"] {
        let r = s
            .task_sse(t, q, None)
            .await
            .err()
            .unwrap_or_else(|| panic!("{q} opened a stream"));
        assert_problem_for(&r, 400, "invalid_query", q);
    }
}
