//! Moving a tenant to another shard (spec section 20, issue 58) through the real server:
//! `POST /v1/tenants/{name}/move` copies the tenant's events into an empty shard at the same
//! seqs, fences its changes, copies the rest, verifies and switches — while two clients of
//! the tenant and another tenant of the same shard append. Every acknowledged event is in the
//! tenant's log once, at its seq; a live stream ends at the switch and resumes in the new
//! shard with its `Last-Event-ID`; a cursor and a delivery routed before the move go on after
//! it; a `kill -9` mid-copy leaves the tenant where it was and an inert copy, which the move
//! run again verifies and resumes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, SseNext, assert_problem};

use crate::common::{notif_ev, wait_for};

pub(crate) async fn create(api: &Api, name: &str) -> u64 {
    let r = api
        .send(
            api.request(Method::POST, "/v1/tenants")
                .json(&json!({"name": name, "reason": "moves test"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    r.json["shard"].as_u64().unwrap()
}

pub(crate) async fn move_to(api: &Api, tenant: &str, shard: u32) -> tidemark_tests::Reply {
    api.send(
        api.request(Method::POST, &format!("/v1/tenants/{tenant}/move"))
            .timeout(Duration::from_secs(120))
            .json(&json!({"shard": shard, "reason": "rebalancing"})),
    )
    .await
}

pub(crate) async fn shard_of(api: &Api, tenant: &str) -> u64 {
    let (st, t) = api.get_json(&format!("/v1/tenants/{tenant}")).await;
    assert_eq!(st, StatusCode::OK, "{t}");
    t["shard"].as_u64().unwrap()
}

pub(crate) async fn heads(api: &Api) -> Vec<u64> {
    let (_, page) = api.get_json("/v1/shards").await;
    page["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["head"].as_u64().unwrap())
        .collect()
}

/// Event id → seq of a tenant's `orders`.
pub(crate) async fn held(api: &Api) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for e in api.read_all("stream=orders").await {
        let id = e["event_id"].as_str().unwrap().to_owned();
        assert!(
            out.insert(id.clone(), e["seq"].as_u64().unwrap()).is_none(),
            "{id} twice"
        );
    }
    out
}

pub(crate) type Acked = Arc<Mutex<BTreeMap<String, u64>>>;

/// A client appending batches of `orders` to `api` until `stop`, each batch sent again (the
/// same ids) while it is answered `503 tenant_moving` (on a cluster, a move's fence: nothing
/// was done), any other answer but `201` failing the test; `notify`: one notification a batch,
/// to be routed, instead of orders. Answers how many batches, and how many refusals it met.
pub(crate) fn appender(
    api: Api,
    name: &'static str,
    acked: Acked,
    stop: Arc<AtomicBool>,
    notify: bool,
) -> tokio::task::JoinHandle<(u64, u64)> {
    tokio::spawn(async move {
        let (mut n, mut refused) = (0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let batch: Vec<Value> = if notify {
                vec![notif_ev(
                    &format!("{name}-{n}"),
                    json!({"priority": "urgent", "title": "t", "recipient": "ops@example.org"}),
                )]
            } else {
                (0..1 + n % 3)
                    .map(|k| {
                        let id = format!("{name}-{n}-{k}");
                        json!({"event_id": id, "stream": "orders", "subject": id,
                               "type": "order.placed", "payload": {"n": n}})
                    })
                    .collect()
            };
            let body = loop {
                let (st, body) = api
                    .try_append(&json!({ "events": batch }))
                    .await
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                if st == StatusCode::CREATED {
                    break body;
                }
                assert_eq!(
                    (st, body["code"].as_str()),
                    (StatusCode::SERVICE_UNAVAILABLE, Some("tenant_moving")),
                    "{name}: {body}"
                );
                refused += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let mut a = acked.lock().unwrap();
            for e in body["events"].as_array().unwrap() {
                let id = e["event_id"].as_str().unwrap().to_owned();
                assert!(
                    a.insert(id.clone(), e["seq"].as_u64().unwrap()).is_none(),
                    "{name}: {id} acknowledged twice"
                );
            }
            n += 1;
        }
        (n, refused)
    })
}

/// `node`'s `orders` of the tenant (event id → seq): every event of `before` and `acked` at
/// its seq, and nothing else; and the tenant's whole log in order, each seq once. Answers the
/// orders and the whole log.
pub(crate) async fn holds_once(
    node: &Api,
    before: &BTreeMap<String, u64>,
    acked: &BTreeMap<String, u64>,
) -> (BTreeMap<String, u64>, Vec<Value>) {
    let now = held(node).await;
    for (id, seq) in before.iter().chain(acked.iter()) {
        assert_eq!(now.get(id), Some(seq), "the tenant's {id} at {seq}");
    }
    assert_eq!(now.len(), before.len() + acked.len(), "the tenant's orders");
    let all = node.read_all("").await;
    let all_seqs: Vec<u64> = all.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    let mut sorted = all_seqs.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, all_seqs, "the tenant's log in order, each seq once");
    (now, all)
}

/// Notifications `n-0`..`n-2` of `tenant` (with route `app-1`), routed into deliveries of sink
/// `app` before the move.
pub(crate) async fn three_routed(tenant: &Api) {
    let events: Vec<Value> = (0..3)
        .map(|i| {
            notif_ev(
                &format!("n-{i}"),
                json!({"priority": "urgent", "title": "t", "recipient": "ops@example.org"}),
            )
        })
        .collect();
    let (st, body) = tenant.append(&json!({ "events": events })).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    wait_for(
        Duration::from_secs(30),
        "the tenant's deliveries",
        || async {
            let (_, page) = tenant.get_json("/v1/deliveries?sink=app").await;
            (page["deliveries"].as_array().map(Vec::len) == Some(3)).then_some(())
        },
    )
    .await;
}

/// A notification `id` of `tenant` appended now is routed into one delivery (its shard's
/// reactors are not stuck on a moved tenant's work).
pub(crate) async fn routes_one(tenant: &Api, id: &str) {
    let (st, body) = tenant
        .append(&json!({"events": [notif_ev(id,
            json!({"priority": "urgent", "title": "t", "recipient": "ops@example.org"}))]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    wait_for(
        Duration::from_secs(30),
        "the notification's delivery",
        || async {
            let (_, page) = tenant
                .get_json(&format!("/v1/deliveries?notification_id={id}"))
                .await;
            (page["deliveries"].as_array().map(Vec::len) == Some(1)).then_some(())
        },
    )
    .await;
}

/// A stream of `tenant`'s `orders` resumed with `Last-Event-ID: last` shows the rest of
/// `now` (event id → seq), once, in order.
pub(crate) async fn resumes_after(tenant: &Api, last: u64, now: &BTreeMap<String, u64>) {
    let mut sse = tenant
        .sse("stream=orders", Some(&last.to_string()))
        .await
        .expect("the resumed stream");
    let mut expect: Vec<u64> = now.values().copied().filter(|&q| q > last).collect();
    expect.sort();
    let mut resumed = Vec::new();
    while resumed.len() < expect.len() {
        resumed.push(sse.expect_event(Duration::from_secs(30)).await.seq());
    }
    assert_eq!(resumed, expect);
}

/// acme (shard 1) with a route, three notifications routed into deliveries of sink `app`,
/// a cursor; delta in shard 1 too, beta in shard 0; then the deployment grows to 3 shards.
async fn deployment(extra_env: Option<(&str, &str)>) -> Server {
    let mut s = Server::start(ServerOpts::default().config("[log]\nshards = 2\n")).await;
    let api = s.api();
    assert_eq!(create(&api, "acme").await, 1);
    assert_eq!(create(&api, "beta").await, 0);
    assert_eq!(create(&api, "delta").await, 1);
    let acme = api.under("/tenants/acme", None);
    for t in [&acme, &api.under("/tenants/delta", None)] {
        let r = t
            .send(
                t.request(Method::PUT, "/v1/routes/app-1")
                    .json(&json!({"route": {"sink": "app"}, "reason": "setup"})),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    three_routed(&acme).await;
    let (st, body) = acme
        .append(
            &json!({"events": [{"event_id": "o-0", "stream": "orders", "subject": "o-0",
            "type": "order.placed", "payload": {}}]}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let r = acme
        .send(
            acme.request(Method::POST, "/v1/cursors/advance")
                .json(&json!({
            "consumer_id": "c-1", "stream_name": "orders",
            "last_sequence": body["events"][0]["seq"], "delivery_id": "d-1"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    s.sigterm();
    assert!(s.wait_exit(Duration::from_secs(30)).await.success());
    s.set_config(Some("[log]\nshards = 3\n"));
    if let Some((k, v)) = extra_env {
        s.set_env(k, Some(v));
    }
    s.restart().await;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_moves_to_an_empty_shard_under_appends_with_nothing_lost_or_doubled() {
    let s = deployment(None).await;
    let api = s.api();
    let acme = api.under("/tenants/acme", None);
    let delta = api.under("/tenants/delta", None);

    // Refusals, each changing nothing.
    assert_problem(&move_to(&api, "default", 2).await, 409, "not_movable");
    assert_problem(&move_to(&api, "acme", 1).await, 409, "not_movable");
    assert_problem(&move_to(&api, "acme", 7).await, 404, "shard_not_found");
    assert_problem(&move_to(&api, "acme", 0).await, 409, "shard_not_empty");
    assert_problem(&move_to(&api, "nobody", 2).await, 404, "tenant_not_found");
    let r = api
        .send(
            api.request(Method::POST, "/v1/tenants/acme/move")
                .json(&json!({"shard": 2, "reason": " "})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let r = acme
        .send(
            acme.request(Method::POST, "/v1/tenants/acme/move")
                .json(&json!({"shard": 2, "reason": "mine"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert_eq!(shard_of(&api, "acme").await, 1);
    assert_eq!(heads(&api).await[2], 0);

    // A live stream of acme's orders from the start, read while the move runs.
    let mut sse = acme
        .sse("after_sequence=0&stream=orders", None)
        .await
        .expect("stream");
    let before_move = held(&acme).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (acked_acme, acked_delta, notified) =
        (Acked::default(), Acked::default(), Acked::default());
    let writers = vec![
        appender(acme.clone(), "a1", acked_acme.clone(), stop.clone(), false),
        appender(acme.clone(), "a2", acked_acme.clone(), stop.clone(), false),
        appender(acme.clone(), "nm", notified.clone(), stop.clone(), true),
        appender(
            delta.clone(),
            "d1",
            acked_delta.clone(),
            stop.clone(),
            false,
        ),
    ];
    let reader = tokio::spawn(async move {
        let mut seen: Vec<(u64, String)> = Vec::new();
        loop {
            match sse.next(Duration::from_secs(60)).await {
                SseNext::Event(e) => {
                    seen.push((e.seq(), e.data["event_id"].as_str().unwrap().to_owned()));
                }
                SseNext::End => return (seen, true),
                other => panic!("acme's stream: {other:?}"),
            }
        }
    });
    // A bridge's long poll of acme in flight (it waits up to 30 s for a delivery that never
    // comes) does not hold the fence: it is answered when the move wants it. And requests
    // that read the tenant twice (a source's operations) go on during the move.
    let long_poll = {
        let acme = acme.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = acme
                .get("/v1/bridges/no-bridge/deliveries?wait_ms=30000")
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            started.elapsed()
        })
    };
    let twice = {
        let (acme, stop) = (acme.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = acme
                    .send(
                        acme.request(Method::POST, "/v1/sources/nope/pause")
                            .json(&json!({})),
                    )
                    .await;
                assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
                n += 1;
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = move_to(&api, "acme", 2).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let moved = r.json;
    assert_eq!(
        (moved["from_shard"].as_u64(), moved["to_shard"].as_u64()),
        (Some(1), Some(2)),
        "{moved}"
    );
    assert_eq!(moved["tenant"]["shard"], 2, "{moved}");
    assert_eq!(moved["resumed_after"], 0, "{moved}");
    let through = moved["through_seq"].as_u64().unwrap();
    // The clients go on appending, now into shard 2.
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.store(true, Ordering::Relaxed);
    let mut batches = 0;
    for w in writers {
        let (n, refused) = w.await.expect("an appender failed");
        assert_eq!(
            refused, 0,
            "on one node a request waits at the fence, never refused"
        );
        batches += n;
    }
    assert!(batches > 10, "the clients appended {batches} batches");
    assert!(twice.await.unwrap() > 0);
    let waited = long_poll.await.unwrap();
    assert!(
        waited < Duration::from_secs(25),
        "the long poll was answered after {waited:?}, not at the fence"
    );

    // The stream ended at the switch, having shown everything through it once.
    let (seen, ended) = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the stream did not end at the switch")
        .unwrap();
    assert!(ended);
    let mut seqs: Vec<u64> = seen.iter().map(|(s, _)| *s).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), seen.len(), "the stream showed an event twice");
    let last = seen.last().map_or(0, |(s, _)| *s);
    assert!(
        last <= through,
        "the source's stream showed {last} past the switch at {through}"
    );

    // Every acknowledged event of acme, from before and during the move, once at its seq.
    assert_eq!(shard_of(&api, "acme").await, 2);
    let now = held(&acme).await;
    let acked = acked_acme.lock().unwrap().clone();
    let after_switch = acked.values().filter(|&&q| q > through).count();
    eprintln!(
        "moved through seq {through}: {} of acme's events acknowledged, {after_switch} after the \
         switch; the stream showed {} before it ended; {batches} batches",
        acked.len(),
        seen.len()
    );
    assert!(
        after_switch > 0,
        "no append landed after the switch: {acked:?}"
    );
    assert!(
        acked.values().any(|&q| q <= through),
        "no append before the switch"
    );
    // acme's seqs stay dense and its own: every event of acme through the switch at the seq
    // it had, and its later ones after it in shard 2's log.
    let (_, all) = holds_once(&acme, &before_move, &acked).await;
    assert!(
        all.iter()
            .all(|e| e.get("tenant").is_none_or(|t| t == "acme")),
        "only acme's"
    );
    // delta, in the source, lost nothing either; its log is as it was.
    let d = held(&delta).await;
    for (id, seq) in acked_delta.lock().unwrap().iter() {
        assert_eq!(d.get(id), Some(seq), "delta's {id}");
    }
    assert_eq!(d.len(), acked_delta.lock().unwrap().len());
    // The source shard's reactors go on for delta (none is stuck on acme's work refused at
    // the fence): its notification is routed.
    routes_one(&delta, "dn-1").await;
    let (_, shards) = api.get_json("/v1/shards").await;
    assert_eq!(shards["shards"][2]["tenants"], json!(["acme"]), "{shards}");
    assert_eq!(shards["shards"][1]["tenants"], json!(["delta"]), "{shards}");

    // The stream resumes in shard 2 with the Last-Event-ID it had: the rest, once.
    resumes_after(&acme, last, &now).await;

    // The cursor advanced before the move goes on from where it was.
    let (_, c) = acme.get_json("/v1/cursors?consumer_id=c-1").await;
    let at = c["cursors"][0]["last_sequence"].as_u64().unwrap();
    let latest = *now.values().max().unwrap();
    let r = acme
        .send(
            acme.request(Method::POST, "/v1/cursors/advance")
                .json(&json!({
            "consumer_id": "c-1", "stream_name": "orders", "last_sequence": latest,
            "delivery_id": "d-2"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let (_, c) = acme.get_json("/v1/cursors?consumer_id=c-1").await;
    assert_eq!(c["cursors"][0]["last_sequence"], latest, "from {at}: {c}");

    // The deliveries routed before the move are claimed and completed after it, in shard 2,
    // and a notification appended now is routed there.
    let (st, body) = acme
        .append(&json!({"events": [notif_ev("n-after",
            json!({"priority": "urgent", "title": "t", "recipient": "ops@example.org"}))]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    // Every notification acknowledged while the move ran is routed once, wherever it was
    // appended (those the source had not routed at the fence are routed in shard 2).
    let mut want: Vec<String> = notified.lock().unwrap().keys().cloned().collect();
    want.extend(["n-0", "n-1", "n-2", "n-after"].map(String::from));
    want.sort();
    let done: Arc<Mutex<Vec<String>>> = Arc::default();
    let total = want.len();
    wait_for(Duration::from_secs(60), "acme's deliveries", || {
        let (acme, done) = (acme.clone(), done.clone());
        async move {
            let r = acme
                .send(
                    acme.request(Method::POST, "/v1/deliveries/claim").json(
                        &json!({"sink": "app", "owner": "w", "limit": 100, "lease_ms": 60_000}),
                    ),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            for d in r.json["deliveries"].as_array().unwrap() {
                let id = d["id"].as_str().unwrap();
                let r = acme
                    .send(
                        acme.request(Method::POST, &format!("/v1/deliveries/{id}/complete"))
                            .json(&json!({"owner": "w"})),
                    )
                    .await;
                assert_eq!(r.status, StatusCode::OK, "complete {id}: {}", r.text);
                let mut done = done.lock().unwrap();
                done.push(d["notification_id"].as_str().unwrap().to_owned());
            }
            (done.lock().unwrap().len() >= total).then_some(())
        }
    })
    .await;
    let mut done = done.lock().unwrap().clone();
    done.sort();
    assert_eq!(done, want, "each notification's delivery claimed once");
    assert!(want.len() > 20, "{} notifications", want.len());

    // Shard 2's models verify against its log, and a move back is refused: shard 1 holds
    // delta.
    for name in ["tasks", "deliveries", "cursors", "notifications"] {
        let r = api
            .send(api.request(
                Method::POST,
                &format!("/v1/admin/projections/{name}/verify?shard=2"),
            ))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{name}: {}", r.text);
        assert_eq!(r.json["identical"], true, "{name}: {}", r.text);
    }
    assert_problem(&move_to(&api, "acme", 1).await, 409, "shard_not_empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_mid_copy_leaves_an_inert_copy_the_next_move_resumes() {
    let mut s = deployment(Some(("TIDEMARK_FAULT_MOVE_DELAY_MS", "100"))).await;
    let api = s.api();
    let acme = api.under("/tenants/acme", None);
    // Enough of acme's events for a copy of ten events a page to take seconds: notifications,
    // each routed after it, so that the copy's prefix holds notifications whose routing it
    // does not (shard 2's routing would route them there if it acted on the copy).
    for b in 0..4 {
        let batch: Vec<Value> = (0..50)
            .map(|k| {
                notif_ev(
                    &format!("bulk-{b}-{k}"),
                    json!({"priority": "urgent", "title": "t", "recipient": "ops@example.org"}),
                )
            })
            .collect();
        let (st, body) = acme.append(&json!({"events": batch})).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
        let (st, body) = acme
            .append(
                &json!({"events": [{"event_id": format!("ob-{b}"), "stream": "orders",
                "subject": "o", "type": "order.placed", "payload": {}}]}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
    }
    wait_for(Duration::from_secs(30), "acme's deliveries routed", || {
        let acme = acme.clone();
        async move {
            let (_, page) = acme.get_json("/v1/deliveries?sink=app&limit=500").await;
            (page["deliveries"].as_array().map(Vec::len) == Some(203)).then_some(())
        }
    })
    .await;
    let before = held(&acme).await;
    let source_head = heads(&api).await[1];
    let mover = {
        let api = api.clone();
        tokio::spawn(async move {
            api.try_send(
                api.request(Method::POST, "/v1/tenants/acme/move")
                    .json(&json!({"shard": 2, "reason": "rebalancing"})),
            )
            .await
        })
    };
    wait_for(Duration::from_secs(30), "the copy under way", || {
        let api = api.clone();
        async move { (heads(&api).await[2] >= 30).then_some(()) }
    })
    .await;
    assert!(!s.kill9().success());
    assert!(
        mover.await.unwrap().is_err(),
        "the move answered before the kill"
    );
    s.set_env("TIDEMARK_FAULT_MOVE_DELAY_MS", None);
    s.restart().await;
    let api = s.api();
    let acme = api.under("/tenants/acme", None);

    // acme still lives in shard 1 with every event; shard 2 holds an inert prefix of the
    // copy: no reactor there acts on it (its head does not move), no read of acme serves it.
    assert_eq!(shard_of(&api, "acme").await, 1);
    assert_eq!(held(&acme).await, before);
    let partial = heads(&api).await[2];
    assert!(
        partial > 0 && partial < source_head,
        "copied {partial} of {source_head}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        heads(&api).await[2],
        partial,
        "shard 2's reactors acted on the copy"
    );
    // Appends to acme in shard 1 meanwhile.
    let (st, body) = acme
        .append(
            &json!({"events": [{"event_id": "late", "stream": "orders", "subject": "late",
            "type": "order.placed", "payload": {}}]}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let late = body["events"][0]["seq"].as_u64().unwrap();

    // The move again, as an operator runs it (`tidemark tenants move`): it verifies the
    // prefix and resumes from it.
    let url = api.url("");
    let out = tidemark_tests::run_cli(
        &[
            "tenants",
            "move",
            "acme",
            "--shard",
            "2",
            "--reason",
            "rebalancing",
            "--url",
            &url,
            "-o",
            "json",
        ],
        "",
        Duration::from_secs(120),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let moved: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(moved["resumed_after"], partial, "{moved}");
    assert_eq!(moved["tenant"]["shard"], 2, "{moved}");
    let out = tidemark_tests::run_cli(
        &["tenants", "shards", "--url", &url, "-o", "json"],
        "",
        Duration::from_secs(60),
    )
    .await;
    let shards: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(shards[2]["tenants"], json!(["acme"]), "{shards}");
    let now = held(&acme).await;
    assert_eq!(now.len(), before.len() + 1);
    let mut want = before.clone();
    want.insert("late".to_owned(), late);
    for (id, seq) in &want {
        assert_eq!(now.get(id), Some(seq), "acme's {id}");
    }
    // Its deliveries routed in shard 1 are claimable in shard 2.
    wait_for(
        Duration::from_secs(30),
        "acme's deliveries in shard 2",
        || {
            let acme = acme.clone();
            async move {
                let (_, page) = acme.get_json("/v1/deliveries?sink=app&limit=500").await;
                (page["deliveries"].as_array().map(Vec::len) == Some(203)).then_some(())
            }
        },
    )
    .await;
    // And after a restart it still lives there, with the same events.
    s.sigterm();
    assert!(s.wait_exit(Duration::from_secs(30)).await.success());
    s.restart().await;
    let api = s.api();
    assert_eq!(shard_of(&api, "acme").await, 2);
    assert_eq!(held(&api.under("/tenants/acme", None)).await, now);
}
