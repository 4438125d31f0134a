//! I6 (exact resume) and I9 (a slow reader is served from the log, not buffered).
//!
//! SSE clients read a while, drop the connection, and reconnect the way an `EventSource` does
//! (same URL, `Last-Event-ID` of the last event) or with `after_sequence` only, while an
//! appender keeps writing. Each must end up with exactly the matching events, in order, once.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, SseNext};
use tokio::sync::watch;

use crate::common::{id_of, metric_sum, seq_of};

const TOTAL: u64 = 3000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reconnect {
    /// Same URL (`after_sequence=0`), `Last-Event-ID: <last id>`: the header must win.
    LastEventId,
    /// No header, `after_sequence=<last seq>` in the query.
    AfterSequence,
}

#[derive(Debug, Clone, Copy)]
struct Spec {
    name: &'static str,
    filters: &'static str,
    subject: Option<&'static str>,
    ty: Option<&'static str>,
    reconnect: Reconnect,
}

struct Received {
    spec: Spec,
    events: Vec<(u64, String)>,
    sessions: u32,
}

async fn appender(api: Api, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut i = 0u64;
    while i < TOTAL {
        let n = rng.random_range(1..=10).min(TOTAL - i);
        let batch: Vec<Value> = (i..i + n)
            .map(|k| {
                json!({
                    "event_id": format!("r-{k}"),
                    "stream": "res",
                    "subject": if rng.random_bool(0.5) { "alpha" } else { "beta" },
                    "type": if rng.random_bool(0.3) { "res.tock" } else { "res.tick" },
                    "payload": {"k": k},
                })
            })
            .collect();
        let (st, body) = api.append(&json!({ "events": batch })).await;
        assert_eq!(st, StatusCode::CREATED, "append: {body}");
        i += n;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn client(api: Api, spec: Spec, seed: u64, target: watch::Receiver<Option<u64>>) -> Received {
    let mut rng = StdRng::seed_from_u64(seed);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut events: Vec<(u64, String)> = Vec::new();
    let mut last: Option<String> = None;
    let mut sessions = 0u32;
    let sep = if spec.filters.is_empty() { "" } else { "&" };
    let done = |last: &Option<String>| {
        let t = *target.borrow();
        t.is_some_and(|t| {
            last.as_deref()
                .and_then(|l| l.parse::<u64>().ok())
                .unwrap_or(0)
                >= t
        })
    };
    loop {
        let (query, header) = match (spec.reconnect, &last) {
            (_, None) => (format!("after_sequence=0{sep}{}", spec.filters), None),
            (Reconnect::LastEventId, Some(id)) => (
                format!("after_sequence=0{sep}{}", spec.filters),
                Some(id.clone()),
            ),
            (Reconnect::AfterSequence, Some(id)) => {
                (format!("after_sequence={id}{sep}{}", spec.filters), None)
            }
        };
        sessions += 1;
        let mut stream = match api.sse(&query, header.as_deref()).await {
            Ok(s) => s,
            Err(r) => panic!(
                "{}: opening the stream failed: {} {}",
                spec.name, r.status, r.text
            ),
        };
        assert!(
            stream.content_type.starts_with("text/event-stream"),
            "{}: SSE content type is {:?}",
            spec.name,
            stream.content_type
        );
        let quota = rng.random_range(30..300);
        let mut read = 0;
        while read < quota {
            match stream.next(Duration::from_millis(500)).await {
                SseNext::Event(e) => {
                    let seq = e.seq();
                    assert_eq!(
                        e.id,
                        seq.to_string(),
                        "{}: SSE id must be the seq",
                        spec.name
                    );
                    assert_eq!(
                        e.event,
                        e.data["type"].as_str().unwrap_or_default(),
                        "{}: SSE event name must be the type",
                        spec.name
                    );
                    if let Some(s) = spec.subject {
                        assert_eq!(
                            e.data["subject"], s,
                            "{}: filter broken: {}",
                            spec.name, e.data
                        );
                    }
                    if let Some(t) = spec.ty {
                        assert_eq!(
                            e.data["type"], t,
                            "{}: filter broken: {}",
                            spec.name, e.data
                        );
                    }
                    events.push((seq, id_of(&e.data).to_owned()));
                    last = Some(e.id);
                    read += 1;
                }
                SseNext::Timeout => {
                    if done(&last) {
                        return Received {
                            spec,
                            events,
                            sessions,
                        };
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{}: no complete stream within 90 s (last id {last:?}, target {:?})",
                        spec.name,
                        *target.borrow()
                    );
                }
                other => panic!("{}: the stream stopped: {other:?}", spec.name),
            }
        }
        drop(stream);
        if done(&last) {
            return Received {
                spec,
                events,
                sessions,
            };
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..30))).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_clients_get_every_matching_event_once_in_order() {
    let seed: u64 = rand::random();
    eprintln!("resume test seed: {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let s = Server::start(ServerOpts::default()).await;
    let specs = [
        Spec {
            name: "all/last-event-id",
            filters: "",
            subject: None,
            ty: None,
            reconnect: Reconnect::LastEventId,
        },
        Spec {
            name: "all/after_sequence",
            filters: "",
            subject: None,
            ty: None,
            reconnect: Reconnect::AfterSequence,
        },
        Spec {
            name: "alpha/last-event-id",
            filters: "subject=alpha",
            subject: Some("alpha"),
            ty: None,
            reconnect: Reconnect::LastEventId,
        },
        Spec {
            name: "beta/after_sequence",
            filters: "subject=beta",
            subject: Some("beta"),
            ty: None,
            reconnect: Reconnect::AfterSequence,
        },
        Spec {
            name: "tock/last-event-id",
            filters: "stream=res&type=res.tock",
            subject: None,
            ty: Some("res.tock"),
            reconnect: Reconnect::LastEventId,
        },
    ];
    // Each client stops once it has the last event matching its filter, known after the
    // appender is done.
    let mut targets = Vec::new();
    let clients: Vec<_> = specs
        .iter()
        .map(|spec| {
            let (tx, rx) = watch::channel(None);
            targets.push(tx);
            tokio::spawn(client(s.api(), *spec, rng.random(), rx))
        })
        .collect();
    tokio::time::timeout(
        Duration::from_secs(90),
        tokio::spawn(appender(s.api(), rng.random())),
    )
    .await
    .expect("the appender did not finish within 90 s")
    .expect("appender panicked");
    assert_eq!(s.head().await, s.start_head() + TOTAL);

    let mut expected = Vec::new();
    for (spec, target) in specs.iter().zip(&targets) {
        let want: Vec<(u64, String)> = s
            .read_all(spec.filters)
            .await
            .iter()
            .map(|e| (seq_of(e), id_of(e).to_owned()))
            .collect();
        assert!(!want.is_empty(), "{}: no matching events at all", spec.name);
        target
            .send(Some(want.last().map_or(0, |x| x.0)))
            .expect("client alive");
        expected.push(want);
    }
    for (c, want) in clients.into_iter().zip(&expected) {
        let got = tokio::time::timeout(Duration::from_secs(120), c)
            .await
            .expect("an SSE client did not finish within 120 s")
            .expect("SSE client panicked");
        let name = got.spec.name;
        if got.events != *want {
            let first_bad = got
                .events
                .iter()
                .zip(want)
                .position(|(g, w)| g != w)
                .unwrap_or(got.events.len().min(want.len()));
            panic!(
                "{name}: received {} events, expected {}; first difference at #{first_bad}: \
                 got {:?}, want {:?}",
                got.events.len(),
                want.len(),
                got.events.get(first_bad),
                want.get(first_bad)
            );
        }
        eprintln!(
            "{name}: {} events over {} connections",
            got.events.len(),
            got.sessions
        );
        assert!(
            got.sessions >= 3,
            "{name}: only {} connections; the test did not exercise reconnects",
            got.sessions
        );
    }
}

#[tokio::test]
async fn last_event_id_wins_over_after_sequence_even_when_zero() {
    let s = Server::start(ServerOpts::default()).await;
    // The log starts with the server's own events (seq 1..=base); ours follow.
    let base = s.start_head();
    assert!(base >= 1, "the server records its settings at start");
    let batch: Vec<Value> = (1..=10)
        .map(|i| json!({"event_id": format!("z-{i}"), "stream": "z", "type": "z.t"}))
        .collect();
    let (st, body) = s.append(&json!({ "events": batch })).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let wait = Duration::from_secs(30);

    let q = |n: u64| format!("after_sequence={}", base + n);
    let mut st = s.sse(&q(5), Some("0")).await.expect("stream");
    for want in 1..=base + 10 {
        let e = st.expect_event(wait).await;
        assert_eq!(
            e.seq(),
            want,
            "Last-Event-ID: 0 with after_sequence={} must start at seq 1",
            base + 5
        );
    }
    drop(st);

    let mut st = s.sse(&q(5), None).await.expect("stream");
    let e = st.expect_event(wait).await;
    assert_eq!(e.seq(), base + 6, "after_sequence=N starts at N + 1");
    assert_eq!(e.data["event_id"], "z-6");
    drop(st);

    let id = (base + 7).to_string();
    let mut st = s.sse(&q(2), Some(&id)).await.expect("stream");
    let e = st.expect_event(wait).await;
    assert_eq!(
        e.seq(),
        base + 8,
        "Last-Event-ID: {id} with after_sequence={} starts at {}",
        base + 2,
        base + 8
    );
    assert_eq!(e.data["event_id"], "z-8");
    drop(st);

    // Past the head: the stream follows the live tail.
    let mut st = s.sse(&q(10), None).await.expect("stream");
    let (code, body) = s
        .append(&json!({"event_id": "z-11", "stream": "z", "type": "z.t"}))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let e = st.expect_event(wait).await;
    assert_eq!(e.seq(), base + 11);
    assert_eq!(e.id, (base + 11).to_string());
    assert_eq!(e.event, "z.t");
    assert_eq!(e.data["event_id"], "z-11");
}

/// I9: a reader that does not read must not make the server buffer its backlog. With a 16 MiB
/// page cache, ~120 MB appended past a stalled SSE client must not show up in the server's
/// resident memory; afterwards the client reads everything, in order, from the log. What the
/// server's resident memory gains is bounded whatever the backlog (the page cache, the ring of
/// groups redb does not have yet, the allocator's slack: 33-38 MiB measured with a backlog of
/// 61 MB and of 122 MB alike), so the bound is half the backlog: a server that buffered it would
/// grow by all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_is_served_from_the_log_not_buffered() {
    const BATCHES: u64 = 300;
    const PER_BATCH: u64 = 50;
    const PAD: usize = 8 * 1024;
    let s = Server::start(ServerOpts::default().config("[log]\ncache_mb = 16\n")).await;
    let base = s.start_head();
    let mut stalled = s
        .sse(&format!("after_sequence={base}"), None)
        .await
        .expect("stream");

    let pad = |i: u64| -> String {
        let c = char::from(b'a' + u8::try_from(i % 26).expect("small"));
        std::iter::repeat_n(c, PAD).collect()
    };
    let batch = |b: u64| -> Value {
        let events: Vec<Value> = (b * PER_BATCH..(b + 1) * PER_BATCH)
            .map(|i| {
                json!({"event_id": format!("big-{i}"), "stream": "bulk", "subject": "s",
                            "type": "bulk.blob", "payload": {"i": i, "pad": pad(i)}})
            })
            .collect();
        json!({ "events": events })
    };
    // Warm up the append path once, so its steady-state allocations are in the baseline.
    let (st, body) = s.append(&batch(0)).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_before = s.rss_kb();
    let mut rss_max = rss_before;
    for b in 1..BATCHES {
        let (st, body) = s.append(&batch(b)).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
        rss_max = rss_max.max(s.rss_kb());
    }
    let head = s.head().await;
    assert_eq!(head, base + BATCHES * PER_BATCH);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_after = s.rss_kb();
    let peak = s.peak_rss_kb();
    rss_max = rss_max.max(rss_after);
    let backlog_mb = (BATCHES * PER_BATCH) * (PAD as u64) / 1_000_000;
    eprintln!(
        "stalled reader: backlog ~{backlog_mb} MB; server RSS before {rss_before} kB, \
         after {rss_after} kB, max sampled {rss_max} kB, peak (VmHWM) {peak} kB"
    );
    let growth_mb = rss_max.saturating_sub(rss_before) / 1024;
    let peak_growth_mb = peak.saturating_sub(rss_before) / 1024;
    let bound_mb = backlog_mb / 2;
    assert!(
        growth_mb < bound_mb,
        "server RSS grew by {growth_mb} MiB while a stalled SSE client fell ~{backlog_mb} MB \
         behind: the backlog is being buffered (I9)"
    );
    assert!(
        peak_growth_mb < bound_mb,
        "server peak RSS (VmHWM) reached {peak_growth_mb} MiB above the baseline while a \
         stalled SSE client fell ~{backlog_mb} MB behind (I9)"
    );

    // Now read everything: complete, in order, intact.
    for want in base + 1..=head {
        let e = stalled.expect_event(Duration::from_secs(30)).await;
        assert_eq!(
            e.seq(),
            want,
            "the stalled stream skipped or repeated events"
        );
        let i = want - base - 1;
        assert_eq!(e.data["payload"]["i"], i);
        assert_eq!(
            e.data["payload"]["pad"].as_str().map(str::len),
            Some(PAD),
            "payload of seq {want} is truncated"
        );
        assert_eq!(
            e.data["payload"]["pad"].as_str().map(|p| &p[..1]),
            Some(&pad(i)[..1])
        );
    }
}

/// A caught-up stream is woken only by a commit holding an event it shows (issue 27: no wake-up
/// per commit for a stream with nothing to do): 150 commits on another subject wake no stream
/// filtered on a quiet one, and the one event on its subject reaches it.
#[tokio::test]
async fn a_filtered_stream_is_woken_only_by_its_own_events() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    let mut quiet = s
        .sse(&format!("subject=quiet&after_sequence={base}"), None)
        .await
        .expect("stream");
    // A stream of everything sees every commit: once it has the first event, both streams are
    // registered and caught up.
    let mut all = s
        .sse(&format!("after_sequence={base}"), None)
        .await
        .expect("stream");
    let wait = Duration::from_secs(30);
    let (code, body) = s
        .append(&json!({"event_id": "busy-0", "stream": "z", "subject": "busy", "type": "z.t"}))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(all.expect_event(wait).await.seq(), base + 1);
    let wakeups = |text: &str| metric_sum(text, "tidemark_sse_wakeups_total").unwrap_or(0.0);
    let before = wakeups(&s.get("/metrics").await.text);
    for i in 1..=150 {
        let (code, body) = s
            .append(&json!({"event_id": format!("busy-{i}"), "stream": "z", "subject": "busy", "type": "z.t"}))
            .await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
    }
    let (code, body) = s
        .append(&json!({"event_id": "quiet-1", "stream": "z", "subject": "quiet", "type": "z.t"}))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let e = quiet.expect_event(wait).await;
    assert_eq!(e.data["event_id"], "quiet-1");
    for want in base + 2..=base + 152 {
        assert_eq!(all.expect_event(wait).await.seq(), want);
    }
    let woken = wakeups(&s.get("/metrics").await.text) - before;
    // The stream of everything is woken by some of the 151 commits (it may find several at a
    // wake-up); the quiet one once. Every commit waking both would be 302.
    assert!(
        woken <= 151.0 + 3.0,
        "{woken} wake-ups for 151 commits: the quiet stream was woken by other subjects' commits"
    );
}

/// A caught-up stream takes its events from the page the follower read, so a commit is read
/// once for every caught-up stream (issue 27): 60 commits, each awaited by the streams before
/// the next, reach a stream of everything and a filtered one in order with no log read of their
/// own (the same run read the log once per wake-up before: about 90 reads); a webhook secret in
/// a page is redacted as it is in a read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caught_up_streams_take_their_events_from_the_followers_page() {
    let s = Server::start(ServerOpts::default()).await;
    let base = s.start_head();
    let mut all = s
        .sse(&format!("after_sequence={base}"), None)
        .await
        .expect("stream");
    let mut one = s
        .sse(&format!("subject=one&after_sequence={base}"), None)
        .await
        .expect("stream");
    let wait = Duration::from_secs(30);
    let append = |i: u64, subject: &'static str| json!({"event_id": format!("{subject}-{i}"), "stream": "z", "subject": subject, "type": "z.t"});
    let (code, body) = s.append(&append(0, "one")).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(all.expect_event(wait).await.seq(), base + 1);
    assert_eq!(one.expect_event(wait).await.data["event_id"], "one-0");
    let reads = |text: &str| metric_sum(text, "tidemark_sse_log_reads_total").unwrap_or(0.0);
    // The reactors' follower: its own reads of the log, and the events it took from the
    // decider's read of them.
    let own = |text: &str| metric_sum(text, "tidemark_follower_events_read_total").unwrap_or(0.0);
    let shared =
        |text: &str| metric_sum(text, "tidemark_follower_events_shared_total").unwrap_or(0.0);
    let m = s.get("/metrics").await.text;
    let (before, own_before, shared_before) = (reads(&m), own(&m), shared(&m));
    for i in 1..=60u64 {
        let subject = if i % 2 == 0 { "one" } else { "other" };
        let (code, body) = s.append(&append(i, subject)).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        assert_eq!(all.expect_event(wait).await.seq(), base + 1 + i);
        if subject == "one" {
            assert_eq!(
                one.expect_event(wait).await.data["event_id"],
                format!("one-{i}")
            );
        }
    }
    let m = s.get("/metrics").await.text;
    let read = reads(&m) - before;
    assert!(
        read <= 5.0,
        "{read} log reads by two caught-up streams for 60 commits: they did not take the \
         follower's pages"
    );
    // Each commit read once between the models and the reactors: the follower took the
    // decider's read (a few own reads allowed: it reads itself when the decider's read is
    // late, on a loaded machine).
    let (own, shared) = (own(&m) - own_before, shared(&m) - shared_before);
    assert!(
        own <= 10.0 && shared >= 50.0,
        "of 60 commits the reactors' follower read {own} events itself and took {shared} from \
         the decider's read"
    );
    // A webhook subscription's secret reaches the stream redacted.
    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/tasks/t-sse/notifications/bridges")
                .json(&json!({"subscription_id": "sub-sse", "bridge_id": "b-sse",
                    "sink": {"kind": "webhook", "url": "http://127.0.0.1:9/hook", "secret": "s3cret-value"}})),
        )
        .await;
    assert!(r.status.is_success(), "{} {}", r.status, r.text);
    let e = loop {
        let e = all.expect_event(wait).await;
        if e.data["type"] == "bridge.subscribed" {
            break e;
        }
    };
    let text = e.data.to_string();
    assert!(
        !text.contains("s3cret-value"),
        "a secret was streamed: {text}"
    );
    assert!(text.contains("[redacted]"), "{text}");
}
