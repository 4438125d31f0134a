//! Shards (spec section 20, issue 58) through the real server: `[log] shards = N` spreads the
//! tenants over N logs, each with its own dense `event_seq`; a tenant is placed when it is
//! created (the fewest live tenants, the default tenant in shard 0) and the placement is in
//! the directory; each shard's files live in `shards/<n>/` of the data directory; a `kill -9`
//! loses nothing of any shard, and a start with fewer shards than a placement is refused.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, SseNext};

async fn create(api: &Api, name: &str) -> Value {
    let r = api
        .send(
            api.request(Method::POST, "/v1/tenants")
                .json(&json!({"name": name, "reason": "shards test"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    r.json
}

async fn append(api: &Api, ids: &[&str]) -> Vec<u64> {
    let events: Vec<Value> = ids
        .iter()
        .map(|id| json!({"event_id": id, "stream": "orders", "subject": id, "type": "order.placed", "payload": {}}))
        .collect();
    let (st, body) = api.append(&json!({"events": events})).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

fn seqs(events: &[Value]) -> Vec<u64> {
    events.iter().map(|e| e["seq"].as_u64().unwrap()).collect()
}

#[tokio::test]
async fn tenants_live_in_shards_each_with_its_own_log() {
    let mut s = Server::start(ServerOpts::default().config("[log]\nshards = 3\n")).await;
    let api = s.api();
    // Placement: the fewest live tenants, the default tenant counting in shard 0.
    let mut placed = Vec::new();
    for name in ["acme", "beta", "gamma", "delta"] {
        placed.push(create(&api, name).await["shard"].as_u64().unwrap());
    }
    assert_eq!(placed, [1, 2, 0, 1]);
    let (_, dir) = api.get_json("/v1/tenants").await;
    let listed: Vec<(String, u64)> = dir["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["shard"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(listed.contains(&("delta".to_owned(), 1)), "{dir}");
    for n in ["1", "2"] {
        let shard = s.data_dir().join("shards").join(n);
        for f in ["log.redb", "models.redb"] {
            assert!(shard.join(f).exists(), "{} has no {f}", shard.display());
        }
    }
    assert!(!s.data_dir().join("shards").join("3").exists());
    // The deployment's shards, each answering for itself.
    let (st, page) = api.get_json("/v1/shards").await;
    assert_eq!(st, StatusCode::OK, "{page}");
    let tenants: Vec<Vec<&str>> = page["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["tenants"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(
        tenants,
        [
            vec!["default", "gamma"],
            vec!["acme", "delta"],
            vec!["beta"]
        ],
        "{page}"
    );
    assert_eq!(page["shards"][1]["head"], 0, "{page}");

    // Each shard numbers its own events from 1: acme's first events are 1, 2, 3 and delta's,
    // in the same shard, follow them; beta's shard is its own again.
    let acme = api.under("/tenants/acme", None);
    let beta = api.under("/tenants/beta", None);
    let delta = api.under("/tenants/delta", None);
    assert_eq!(append(&acme, &["a-1", "a-2", "a-3"]).await, [1, 2, 3]);
    assert_eq!(append(&delta, &["d-1"]).await, [4]);
    assert_eq!(append(&beta, &["b-1", "b-2"]).await, [1, 2]);
    let (_, page) = api.get_json("/v1/shards").await;
    let heads: Vec<u64> = page["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["head"].as_u64().unwrap())
        .collect();
    assert_eq!(heads[1..], [4, 2], "{page}");
    // Within a tenant every promise holds: its reads, its positions, its resends.
    assert_eq!(seqs(&acme.read_all("").await), [1, 2, 3]);
    assert_eq!(seqs(&delta.read_all("").await), [4]);
    let (_, page) = acme.get_json("/v1/events?after_sequence=1").await;
    assert_eq!(seqs(page["events"].as_array().unwrap()), [2, 3], "{page}");
    assert_eq!(page["latest_event_seq"], 4, "the shard's head: {page}");
    assert_eq!(
        append(&acme, &["a-2"]).await,
        [2],
        "a resend is its duplicate"
    );
    let mut sse = acme.sse("", Some("1")).await.expect("acme's stream");
    for want in [2, 3] {
        match sse.next(Duration::from_secs(30)).await {
            SseNext::Event(e) => assert_eq!(e.data["seq"], want, "{}", e.data),
            other => panic!("acme's stream: {other:?}"),
        }
    }
    // The default tenant's log is shard 0's: none of the others' events.
    let mine = api.read_all("stream=orders").await;
    assert!(mine.is_empty(), "{mine:?}");
    // A notification of acme's is routed and delivered by its shard's reactors.
    let r = acme
        .send(
            acme.request(Method::PUT, "/v1/routes/app-1")
                .json(&json!({"route": {"sink": "app"}, "reason": "setup"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let (st, body) = acme
        .append(
            &json!({"events": [{"event_id": "n-1", "stream": "notifications", "subject": "n-1",
            "type": "notification.requested", "payload": {"priority": "urgent", "title": "t",
            "recipient": "ops@example.org"}}]}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let claimed =
        crate::common::wait_for(Duration::from_secs(30), "acme's delivery", || {
            let acme = acme.clone();
            async move {
                let r = acme
                    .send(acme.request(Method::POST, "/v1/deliveries/claim").json(
                        &json!({"sink": "app", "owner": "w", "limit": 10, "lease_ms": 60_000}),
                    ))
                    .await;
                r.json["deliveries"]
                    .as_array()
                    .filter(|d| !d.is_empty())
                    .map(|d| d[0]["id"].as_str().unwrap().to_owned())
            }
        })
        .await;
    let r = acme
        .send(
            acme.request(
                Method::POST,
                &format!("/v1/deliveries/{}/complete", urlencoding(&claimed)),
            )
            .json(&json!({"owner": "w"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // kill -9: every shard keeps what it acknowledged, and goes on from it.
    let before: Vec<Vec<u64>> = futures::future::join_all(
        [&acme, &beta, &delta].map(|t| async move { seqs(&t.read_all("").await) }),
    )
    .await;
    s.kill9();
    s.restart().await;
    let api = s.api();
    let (acme, beta, delta) = (
        api.under("/tenants/acme", None),
        api.under("/tenants/beta", None),
        api.under("/tenants/delta", None),
    );
    let after: Vec<Vec<u64>> = futures::future::join_all(
        [&acme, &beta, &delta].map(|t| async move { seqs(&t.read_all("").await) }),
    )
    .await;
    assert_eq!(before, after);
    let next = append(&acme, &["a-4"]).await[0];
    assert_eq!(next, *before[0].iter().chain(&before[2]).max().unwrap() + 1);
    let (_, d) = acme
        .get_json(&format!("/v1/deliveries/{}", urlencoding(&claimed)))
        .await;
    assert_eq!(d["status"], "sent", "{d}");

    // Fewer shards than the directory places tenants in: refused at start, nothing changed.
    s.kill9();
    let data = s.data_dir().to_path_buf();
    let refused = Server::try_start(
        ServerOpts {
            data_dir: Some(data.clone()),
            ..ServerOpts::default()
        }
        .config("[log]\nshards = 2\n"),
    )
    .await
    .err()
    .expect("a start with fewer shards than a placement");
    let text = refused.to_string();
    assert!(
        text.contains("log.shards = 2") && text.contains("beta (shard 2)"),
        "{text}"
    );
    s.restart().await;
    assert_eq!(
        seqs(&s.api().under("/tenants/beta", None).read_all("").await),
        [1, 2]
    );
}

fn urlencoding(s: &str) -> String {
    s.replace(':', "%3A")
}

/// `[log] shards` is refused out of its bounds.
#[tokio::test]
async fn shards_out_of_bounds_are_refused_at_start() {
    for (config, says) in [
        ("[log]\nshards = 0\n", "log.shards must be between 1 and 64"),
        (
            "[log]\nshards = 65\n",
            "log.shards must be between 1 and 64",
        ),
    ] {
        let e = Server::try_start(ServerOpts::default().config(config))
            .await
            .err()
            .unwrap_or_else(|| panic!("{config} started"));
        assert!(e.to_string().contains(says), "{config}: {e}");
    }
}

/// `kill -9` while three tenants in three shards append at once: every acknowledged event is
/// in its tenant's log afterwards at the seq it was acknowledged at, each shard's seqs are
/// dense (no gap, no double), and the batches in flight at the kill, sent again, are each
/// either a duplicate of what the shard kept or new: never both, never twice. Three rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_appends_of_every_shard_survive_kill_9() {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let mut s = Server::start(ServerOpts::default().config("[log]\nshards = 3\n")).await;
    for name in ["acme", "beta"] {
        create(&s.api(), name).await;
    }
    let prefixes = ["", "/tenants/acme", "/tenants/beta"];
    // Per tenant: event id → acknowledged seq; batches in flight at the kill.
    type Acked = Arc<Mutex<BTreeMap<String, u64>>>;
    let acked: Vec<Acked> = prefixes.iter().map(|_| Acked::default()).collect();
    let mut next_id = 0u64;
    for round in 0..3 {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for (t, prefix) in prefixes.iter().enumerate() {
            for w in 0..3 {
                let api = s.api().under(prefix, None);
                let (acked, stop) = (acked[t].clone(), stop.clone());
                let first = next_id;
                next_id += 1_000_000;
                tasks.push(tokio::spawn(async move {
                    let mut unsure: Vec<Vec<Value>> = Vec::new();
                    for n in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let batch: Vec<Value> = (0..(1 + (n + w) % 4))
                            .map(|k| {
                                let id = format!("r{round}-e{}", first + n * 10 + k);
                                json!({"event_id": id, "stream": "orders", "subject": id,
                                       "type": "order.placed", "payload": {"w": w}})
                            })
                            .collect();
                        match api.try_append(&json!({"events": batch})).await {
                            Ok((StatusCode::CREATED, body)) => {
                                let mut a = acked.lock().unwrap();
                                for e in body["events"].as_array().unwrap() {
                                    let id = e["event_id"].as_str().unwrap().to_owned();
                                    assert!(a.insert(id, e["seq"].as_u64().unwrap()).is_none());
                                }
                            }
                            _ => {
                                unsure.push(batch);
                                break;
                            }
                        }
                    }
                    unsure
                }));
            }
        }
        tokio::time::sleep(Duration::from_millis(300 + 200 * round)).await;
        assert!(!s.kill9().success());
        stop.store(true, Ordering::Relaxed);
        let mut unsure: Vec<(usize, Vec<Value>)> = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            let got = tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("an appender stopped")
                .expect("an appender panicked");
            unsure.extend(got.into_iter().map(|b| (i / 3, b)));
        }
        s.restart().await;
        // Each tenant's log holds every acknowledged event at its seq.
        for (t, prefix) in prefixes.iter().enumerate() {
            let api = s.api().under(prefix, None);
            let held: BTreeMap<String, u64> = api
                .read_all("stream=orders")
                .await
                .iter()
                .map(|e| {
                    (
                        e["event_id"].as_str().unwrap().to_owned(),
                        e["seq"].as_u64().unwrap(),
                    )
                })
                .collect();
            for (id, seq) in acked[t].lock().unwrap().iter() {
                assert_eq!(
                    held.get(id),
                    Some(seq),
                    "{prefix}: acknowledged {id} at {seq}"
                );
            }
        }
        // What was in flight, sent again: each event once.
        for (t, batch) in unsure {
            let api = s.api().under(prefixes[t], None);
            let (st, body) = api.append(&json!({"events": batch})).await;
            assert_eq!(st, StatusCode::CREATED, "{body}");
            let mut a = acked[t].lock().unwrap();
            for e in body["events"].as_array().unwrap() {
                a.insert(
                    e["event_id"].as_str().unwrap().to_owned(),
                    e["seq"].as_u64().unwrap(),
                );
            }
        }
    }
    // Every shard's log is dense, and holds each event once.
    for (t, prefix) in prefixes.iter().enumerate() {
        let api = s.api().under(prefix, None);
        let all = seqs(&api.read_all("").await);
        let dense: Vec<u64> = (1..=all.len() as u64).collect();
        // Each tenant has a shard of its own here (acme 1, beta 2, the default tenant 0): its
        // events are its shard's log, from seq 1.
        assert_eq!(all, dense, "{prefix}: gaps or doubles");
        let orders = api.read_all("stream=orders").await;
        assert_eq!(
            orders.len(),
            acked[t].lock().unwrap().len(),
            "{prefix}: an event twice, or one lost"
        );
    }
}

/// A deployment's backup copies every shard (spec section 20): on the server (`POST
/// /v1/admin/backup`, shard n in `shards/<n>/` of it, each as of its own head; an increment is
/// refused, each log having its own seqs), streamed to the CLI's machine (`tidemark backup
/// --to`, a shard per stream: a stream that names none is `400 shard_required`), and offline
/// from the stopped directory; each restores (`tidemark restore`) into a directory a server of
/// two shards opens with every tenant's events at their seqs.
#[tokio::test]
async fn a_deployments_backup_copies_every_shard_and_restores() {
    let mut s = Server::start(ServerOpts::default().config("[log]\nshards = 2\n")).await;
    let api = s.api();
    assert_eq!(create(&api, "acme").await["shard"], 1);
    assert_eq!(create(&api, "beta").await["shard"], 0);
    let acme = api.under("/tenants/acme", None);
    let beta = api.under("/tenants/beta", None);
    append(&api, &["d-1", "d-2"]).await;
    assert_eq!(append(&acme, &["a-1", "a-2", "a-3"]).await, [1, 2, 3]);
    append(&beta, &["b-1", "b-2"]).await;
    let events = |api: &tidemark_tests::Api| {
        let api = api.clone();
        async move {
            api.read_all("stream=orders")
                .await
                .iter()
                .map(|e| {
                    (
                        e["event_id"].as_str().unwrap().to_owned(),
                        e["seq"].as_u64().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let want = [events(&api).await, events(&acme).await, events(&beta).await];
    assert_eq!(want[1].len(), 3);

    let backup = |body: Value| {
        let api = api.clone();
        async move {
            api.send(api.request(Method::POST, "/v1/admin/backup").json(&body))
                .await
        }
    };
    let r = backup(json!({"to": "inc", "after": 1})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(!s.data_dir().join("backups").join("inc").exists());
    let r = backup(json!({"to": "b-1"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["shards"][0]["shard"], 1, "{}", r.text);
    assert_eq!(r.json["shards"][0]["through_seq"], 3, "{}", r.text);
    assert_eq!(r.json["shards"][0]["events"], 3, "{}", r.text);
    let on_server = s.data_dir().join("backups").join("b-1");
    assert!(
        on_server
            .join("shards")
            .join("1")
            .join("manifest.json")
            .exists()
    );
    // Streamed: one shard per stream.
    let r = api.get("/v1/admin/backup/stream?after=0").await;
    assert_eq!(
        (r.status, r.json["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("shard_required")),
        "{}",
        r.text
    );
    let r = api.get("/v1/admin/backup/stream?after=0&shard=1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.text.lines().count(), 3, "{}", r.text);
    let r = api.get("/v1/admin/backup/stream?after=0&shard=2").await;
    assert_eq!(r.json["code"], "shard_not_found", "{}", r.text);
    let work = tempfile::tempdir().expect("tempdir");
    let streamed = work.path().join("streamed");
    let url = api.url("");
    // `tidemark <args> -o json`: its answer, or its error when it fails.
    let cli = |args: Vec<String>| async move {
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["-o", "json"]);
        let out = tidemark_tests::run_cli(&args, "", Duration::from_secs(120)).await;
        match out.status.success() {
            true => Ok(serde_json::from_slice::<Value>(&out.stdout).expect("JSON")),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    };
    let p = |p: &std::path::Path| p.display().to_string();
    let out = cli(vec![
        "backup".into(),
        "--url".into(),
        url,
        "--to".into(),
        p(&streamed),
    ])
    .await
    .expect("the streamed backup");
    assert_eq!(out["shards"][0]["through_seq"], 3, "{out}");
    // Offline, from the stopped directory.
    s.kill9();
    let offline = work.path().join("offline");
    let data = p(s.data_dir());
    let out = cli(vec![
        "backup".into(),
        "--data".into(),
        data,
        "--to".into(),
        p(&offline),
    ])
    .await
    .expect("the offline backup");
    assert_eq!(out["shards"][0]["events"], 3, "{out}");
    // Each restores into a deployment of two shards, every tenant's events at their seqs.
    for (i, from) in [on_server, streamed, offline].iter().enumerate() {
        let data = work.path().join(format!("restored-{i}"));
        let restore = |from: &std::path::Path| {
            vec![
                "restore".into(),
                "--from".into(),
                p(from),
                "--data".into(),
                p(&data),
            ]
        };
        // Without its list of shards (written last) it is a backup cut short: refused.
        let list = from.join("shards.json");
        let kept = std::fs::read(&list).expect("the list of shards");
        std::fs::remove_file(&list).unwrap();
        let e = cli(restore(from))
            .await
            .expect_err("a backup without its list");
        assert!(e.contains("did not finish"), "{e}");
        assert!(!data.join("log.redb").exists());
        std::fs::write(&list, kept).unwrap();
        let out = cli(restore(from)).await.expect("the restore");
        assert_eq!(out["shards"][0]["through_seq"], 3, "{out}");
        let r = Server::start(
            ServerOpts::default()
                .config("[log]\nshards = 2\n")
                .seed_data(&data),
        )
        .await;
        let api = r.api();
        let got = [
            events(&api).await,
            events(&api.under("/tenants/acme", None)).await,
            events(&api.under("/tenants/beta", None)).await,
        ];
        assert_eq!(got, want, "restored from {}", from.display());
    }
}

/// Give `acme` work to see: a claim route `app-1` and three urgent notifications for it (three
/// queued deliveries no one claims), and a cursor `c-1` on `orders` one event behind; the seq
/// of acme's last event.
async fn acme_with_work(acme: &Api) -> u64 {
    let r = acme
        .send(
            acme.request(Method::PUT, "/v1/routes/app-1")
                .json(&json!({"route": {"sink": "app"}, "reason": "setup"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let events: Vec<Value> = (0..3)
        .map(|i| {
            crate::common::notif_ev(
                &format!("n-{i}"),
                json!({"priority": "urgent", "title": "t", "recipient": "ops@example.org"}),
            )
        })
        .collect();
    let (st, body) = acme.append(&json!({ "events": events })).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let first = append(acme, &["o-1"]).await[0];
    let r = acme
        .send(
            acme.request(Method::POST, "/v1/cursors/advance")
                .json(&json!({
            "consumer_id": "c-1", "stream_name": "orders", "last_sequence": first,
            "delivery_id": "d-1"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    append(acme, &["o-2"]).await[0]
}

/// `/metrics` judges every shard and tenant (spec section 20): a shard beyond the home one
/// has its head, storage state and read models' lag with `shard`, a tenant other than the
/// default one its outbox and consumers with `tenant`; the default tenant's and the
/// home shard's series are as before.
#[tokio::test]
async fn metrics_judge_every_shard_and_tenant() {
    let s = Server::start(ServerOpts::default().config("[log]\nshards = 2\n")).await;
    let api = s.api();
    assert_eq!(create(&api, "acme").await["shard"], 1);
    let acme = api.under("/tenants/acme", None);
    acme_with_work(&acme).await;
    let text = crate::common::wait_for(Duration::from_secs(30), "acme's deliveries", || {
        let api = api.clone();
        async move {
            let text = api.get("/metrics").await.text;
            // `/metrics` never waits for the models: until they have folded all of it.
            (text.contains("tidemark_outbox_queue_depth{sink=\"app\",tenant=\"acme\"} 3")
                && text.contains("tidemark_consumer_cursors_behind{tenant=\"acme\"} 1"))
            .then_some(text)
        }
    })
    .await;
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix}… in:\n{text}"))
            .to_owned()
    };
    let head = s.api().get_json("/v1/shards").await.1["shards"][1]["head"].clone();
    assert_eq!(
        line("tidemark_log_head{shard=\"1\"}"),
        format!("tidemark_log_head{{shard=\"1\"}} {head}")
    );
    line("tidemark_storage_state{shard=\"1\",state=\"ok\"} 1");
    line("tidemark_projection_lag_events{projection=\"tasks\",shard=\"1\"}");
    line("tidemark_consumer_cursors_behind{tenant=\"acme\"} 1");
    // The default tenant's and the home shard's, without the labels.
    line("tidemark_log_head ");
    line("tidemark_consumer_cursors ");
}

/// Rebuild and verify act on the shard `?shard=` names: a tenant's models in shard 1 verify as
/// its own, and a shard beyond the deployment's is `404 shard_not_found`.
#[tokio::test]
async fn each_shard_is_verified_and_rebuilt_on_its_own() {
    let s = Server::start(ServerOpts::default().config("[log]\nshards = 2\n")).await;
    let api = s.api();
    assert_eq!(create(&api, "acme").await["shard"], 1);
    let acme = api.under("/tenants/acme", None);
    let (st, body) = acme
        .append(
            &json!({"events": [{"event_id": "t-1", "stream": "task_events", "subject": "t-1",
            "type": "task.created", "payload": {"project_id": "p", "title": "one"}}]}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    // The list does not wait for the models: until they have folded acme's event.
    let list = crate::common::wait_for(Duration::from_secs(30), "shard 1 folded", || {
        let api = api.clone();
        async move {
            let (_, list) = api.get_json("/v1/admin/projections?shard=1").await;
            (list["projections"][0]["lag"] == 0).then_some(list)
        }
    })
    .await;
    let tasks_of = |page: &Value| page["projections"][0].clone();
    let tasks = tasks_of(&list);
    let (_, home) = api.get_json("/v1/admin/projections").await;
    let home_tasks = tasks_of(&home);
    assert_eq!(
        (tasks["name"].as_str(), home_tasks["name"].as_str()),
        (Some("tasks"), Some("tasks"))
    );
    // Shard 1's log holds acme's one event; the home shard's, the directory's and settings.
    assert_eq!(tasks["checkpoint"], 1, "{list}");
    assert_ne!(tasks["checkpoint"], home_tasks["checkpoint"], "{home}");
    for op in ["verify", "rebuild"] {
        let r = api
            .send(api.request(
                Method::POST,
                &format!("/v1/admin/projections/tasks/{op}?shard=1"),
            ))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{op}: {}", r.text);
        assert_eq!(r.json["identical"], true, "{op}: {}", r.text);
        assert_eq!(r.json["events_replayed"], 1, "{op}: {}", r.text);
        assert_eq!(r.json["digest"], tasks["digest"], "{op}: {}", r.text);
    }
    // The task is still acme's after the rebuild.
    let (_, t) = acme.get_json("/v1/tasks/t-1").await;
    assert_eq!(t["title"], "one", "{t}");
    let r = api
        .send(api.request(Method::POST, "/v1/admin/projections/tasks/verify?shard=2"))
        .await;
    assert_eq!(
        (r.status, r.json["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("shard_not_found")),
        "{}",
        r.text
    );
}

/// A sink's `concurrency` is the node's, not each shard's: two tenants in two shards pushing to
/// a slow webhook receiver never have more than `sinks.webhook.concurrency` POSTs open at once,
/// and every notification arrives.
#[tokio::test]
async fn a_sinks_concurrency_is_the_nodes_across_shards() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (now, most, seen) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (n, m, k) = (now.clone(), most.clone(), seen.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let (n, m, k) = (n.clone(), m.clone(), k.clone());
            async move {
                let open = n.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(open, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(150)).await;
                n.fetch_sub(1, Ordering::SeqCst);
                k.fetch_add(1, Ordering::SeqCst);
                StatusCode::OK
            }
        }),
    );
    let port = crate::common::serve_local(app).await.port();
    let s = Server::start(
        ServerOpts::default().config("[log]\nshards = 2\n[sinks.webhook]\nconcurrency = 2\n"),
    )
    .await;
    let api = s.api();
    assert_eq!(create(&api, "acme").await["shard"], 1);
    const EACH: usize = 12;
    for prefix in ["", "/tenants/acme"] {
        let t = api.under(prefix, None);
        let r = t
            .send(t.request(Method::PUT, "/v1/routes/hook").json(&json!({
                "route": {"sink": "webhook", "url": format!("http://127.0.0.1:{port}/hook"),
                          "priorities": ["urgent"]},
                "reason": "concurrency test"})))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{prefix}: {}", r.text);
        let events: Vec<Value> = (0..EACH)
            .map(|i| {
                json!({"event_id": format!("n-{i}"), "stream": "notifications",
                       "subject": format!("n-{i}"), "type": "notification.requested",
                       "payload": {"priority": "urgent", "title": "t", "recipient": "ops"}})
            })
            .collect();
        let (st, body) = t.append(&json!({"events": events})).await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen.load(Ordering::SeqCst) < 2 * EACH {
        if std::time::Instant::now() > deadline {
            let (_, d0) = api.get_json("/v1/deliveries?limit=100").await;
            let (_, d1) = api
                .under("/tenants/acme", None)
                .get_json("/v1/deliveries?limit=100")
                .await;
            panic!(
                "{} POSTs of {}: {d0} {d1}",
                seen.load(Ordering::SeqCst),
                2 * EACH
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&most),
        "{most} POSTs open at once, concurrency 2"
    );
}

/// The deployment's overview (`GET /v1/admin/overview`) fans out over every tenant in its
/// shard: each row is read from its own shard with that shard's `as_of_seq` (never past its
/// head), the totals cover every tenant whatever the page, `attention` keeps the tenants that
/// need an operator, pages go by name, a tenant's token is refused, and bad input is a 400.
#[tokio::test]
async fn the_overview_fans_out_over_every_tenant_in_its_shard() {
    let (mut s, t) = crate::e2e_tenants::start_with(
        "[log]\nshards = 2\n[notifications.outbox]\nstuck_after = \"1s\"\n",
    )
    .await;
    s.set_token(Some(&t.op));
    let api = s.api();
    assert_eq!(create(&api, "acme").await["shard"], 1);
    assert_eq!(create(&api, "beta").await["shard"], 0);
    assert_eq!(create(&api, "gamma").await["shard"], 1);
    let acme = api.under("/tenants/acme", Some(&t.op));
    let beta = api.under("/tenants/beta", Some(&t.op));

    // acme: three deliveries for a claim sink no one claims (stuck after 1 s), and a cursor
    // one event behind.
    let acme_last = acme_with_work(&acme).await;
    let put = |who: &Api, name: &str, route: Value| {
        let (who, name) = (who.clone(), name.to_owned());
        async move {
            let r = who
                .send(
                    who.request(Method::PUT, &format!("/v1/routes/{name}"))
                        .json(&json!({"route": route, "reason": "setup"})),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        }
    };
    // beta: a webhook endpoint an operator disabled.
    put(
        &beta,
        "hook",
        json!({"sink": "webhook", "url": "http://127.0.0.1:9/never"}),
    )
    .await;
    let r = beta
        .send(
            beta.request(Method::POST, "/v1/outbox/endpoints/hook/disable")
                .json(&json!({"reason": "maintenance"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let page = crate::common::wait_for(Duration::from_secs(30), "acme's deliveries stuck", || {
        let api = api.clone();
        async move {
            let (st, page) = api.get_json("/v1/admin/overview").await;
            assert_eq!(st, StatusCode::OK, "{page}");
            (page["tenants"][0]["outbox"]["stuck"] == 3).then_some(page)
        }
    })
    .await;
    let (_, shards) = api.get_json("/v1/shards").await;
    let names: Vec<&str> = page["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme", "beta", "default", "gamma"], "{page}");
    for row in page["tenants"].as_array().unwrap() {
        let shard = row["shard"].as_u64().unwrap() as usize;
        let head = shards["shards"][shard]["head"].as_u64().unwrap();
        assert!(
            row["as_of_seq"].as_u64().unwrap() <= head,
            "{row} past {head}"
        );
    }
    let acme_row = &page["tenants"][0];
    assert_eq!(acme_row["shard"], 1);
    assert!(
        acme_row["as_of_seq"].as_u64().unwrap() >= acme_last,
        "{acme_row}"
    );
    assert_eq!(acme_row["outbox"]["queue_depth"], 3, "{acme_row}");
    assert_eq!(acme_row["consumers"]["total"], 1, "{acme_row}");
    assert_eq!(acme_row["consumers"]["max_lag_events"], 1, "{acme_row}");
    assert_eq!(acme_row["attention"], true, "{acme_row}");
    let beta_row = &page["tenants"][1];
    assert_eq!(beta_row["shard"], 0);
    assert_eq!(beta_row["endpoints"]["disabled"], 1, "{beta_row}");
    assert_eq!(
        beta_row["endpoints_attention"][0]["route"], "hook",
        "{beta_row}"
    );
    assert_eq!(beta_row["endpoints_attention"][0]["state"], "disabled");
    assert_eq!(beta_row["attention"], true);
    for quiet in [&page["tenants"][2], &page["tenants"][3]] {
        assert_eq!(quiet["attention"], false, "{quiet}");
        assert_eq!(quiet["outbox"]["queue_depth"], 0, "{quiet}");
    }
    // Nothing crosses: beta's endpoint is not acme's, acme's deliveries are not beta's.
    assert_eq!(acme_row["endpoints"]["total"], 0, "{acme_row}");
    assert_eq!(beta_row["outbox"]["queue_depth"], 0, "{beta_row}");
    assert_eq!(page["shards"].as_array().unwrap().len(), 2);
    assert_eq!(page["shards"][1]["tenants"], 2, "{page}");
    assert_eq!(
        page["shards"][1]["as_of_seq"].as_u64(),
        page["tenants"][0]["as_of_seq"]
            .as_u64()
            .min(page["tenants"][3]["as_of_seq"].as_u64()),
        "{page}"
    );
    let totals = &page["totals"];
    assert_eq!(totals["tenants"], 4);
    assert_eq!(totals["attention"], 2);
    assert_eq!(totals["outbox"]["queue_depth"], 3);
    assert_eq!(totals["endpoints"]["disabled"], 1);
    assert_eq!(page["next_after"], Value::Null);

    // The tenants that need an operator; a page by name, the totals whole on every page.
    let (_, only) = api.get_json("/v1/admin/overview?attention=true").await;
    let names: Vec<&str> = only["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme", "beta"], "{only}");
    let (_, first_page) = api.get_json("/v1/admin/overview?limit=3").await;
    assert_eq!(first_page["tenants"].as_array().unwrap().len(), 3);
    assert_eq!(first_page["next_after"], "default", "{first_page}");
    assert_eq!(first_page["totals"]["tenants"], 4);
    let (_, second) = api
        .get_json("/v1/admin/overview?limit=3&after=default")
        .await;
    assert_eq!(second["tenants"][0]["tenant"], "gamma", "{second}");
    assert_eq!(second["tenants"].as_array().unwrap().len(), 1);
    assert_eq!(second["next_after"], Value::Null);
    // Any text orders against the names.
    let (st, any) = api.get_json("/v1/admin/overview?after=0000").await;
    assert_eq!(st, StatusCode::OK, "{any}");
    assert_eq!(any["tenants"].as_array().unwrap().len(), 4, "{any}");

    // A tenant's token reads its own tenant, not the deployment.
    let r = api
        .under("", Some(&t.acme))
        .send(
            api.under("", Some(&t.acme))
                .request(Method::GET, "/v1/admin/overview"),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert_eq!(r.json["code"], "tenant_forbidden");
    for (q, code) in [
        ("limit=0", "invalid_query"),
        ("limit=1001", "invalid_query"),
        ("attention=yes", "invalid_query"),
        ("interval_s=0", "invalid_query"),
        ("after=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "invalid_query"),
        ("shard=1", "unknown_parameter"),
    ] {
        let (st, body) = api.get_json(&format!("/v1/admin/overview?{q}")).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{q}: {body}");
        assert_eq!(body["code"], code, "{q}: {body}");
    }
}

/// `tidemark log export|import --shard` (spec section 20): each shard's log goes out and back
/// on its own, at its own seqs; an export of a directory of several shards names one; an
/// import is refused into a shard the configuration does not open, and the default tenant's
/// events (shard 0's alone) are refused by another shard, leaving it as it was; a server on
/// the imported directory serves every tenant's events at their seqs.
#[tokio::test]
async fn each_shards_log_is_exported_and_imported_on_its_own() {
    let mut s = Server::start(ServerOpts::default().config("[log]\nshards = 2\n")).await;
    let api = s.api();
    assert_eq!(create(&api, "acme").await["shard"], 1);
    assert_eq!(create(&api, "beta").await["shard"], 0);
    let acme = api.under("/tenants/acme", None);
    let beta = api.under("/tenants/beta", None);
    append(&api, &["d-1"]).await;
    assert_eq!(append(&acme, &["a-1", "a-2"]).await, [1, 2]);
    append(&beta, &["b-1"]).await;
    let events = |api: &Api| {
        let api = api.clone();
        async move {
            api.read_all("stream=orders")
                .await
                .iter()
                .map(|e| (e["event_id"].clone(), e["seq"].clone()))
                .collect::<Vec<_>>()
        }
    };
    let want = [events(&api).await, events(&acme).await, events(&beta).await];
    s.kill9();

    let work = tempfile::tempdir().expect("tempdir");
    let p = |p: &std::path::Path| p.display().to_string();
    let data = p(s.data_dir());
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = tidemark_tests::run_cli(&args, "", Duration::from_secs(120)).await;
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match out.status.success() {
            true => Ok(text(&out.stdout)),
            false => Err(text(&out.stderr)),
        }
    };
    let export = |shard: Option<&str>| {
        let mut a: Vec<String> = vec!["log".into(), "export".into(), "--data".into(), data.clone()];
        if let Some(n) = shard {
            a.extend(["--shard".into(), n.into()]);
        }
        run(a)
    };
    let e = export(None)
        .await
        .expect_err("an export of two shards that names none");
    assert!(e.contains("--shard"), "{e}");
    let e = export(Some("2"))
        .await
        .expect_err("a shard it does not hold");
    assert!(e.contains("no shard 2"), "{e}");
    let shard1 = export(Some("1")).await.expect("shard 1's export");
    let lines: Vec<Value> = shard1
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Shard 1 is acme's alone (its two events), dense from 1.
    assert_eq!(
        lines.iter().map(|l| l["seq"].clone()).collect::<Vec<_>>(),
        [json!(1), json!(2)],
        "{shard1}"
    );
    assert!(lines.iter().all(|l| l["tenant"] == "acme"), "{shard1}");
    let shard0 = export(Some("0")).await.expect("shard 0's export");
    assert!(
        shard0.contains("\"d-1\"") && shard0.contains("\"b-1\""),
        "{shard0}"
    );
    assert!(!shard0.contains("\"a-1\""), "{shard0}");
    let f0 = work.path().join("shard0.jsonl");
    let f1 = work.path().join("shard1.jsonl");
    std::fs::write(&f0, &shard0).unwrap();
    std::fs::write(&f1, &shard1).unwrap();

    let config = work.path().join("two.toml");
    std::fs::write(&config, "[log]\nshards = 2\n").unwrap();
    let new = work.path().join("new");
    let import = |shard: &str, file: &std::path::Path, config: Option<&std::path::Path>| {
        let mut a: Vec<String> = vec![
            "log".into(),
            "import".into(),
            "--data".into(),
            p(&new),
            "--shard".into(),
            shard.into(),
            p(file),
            "-o".into(),
            "json".into(),
        ];
        if let Some(c) = config {
            a.extend(["--config".into(), p(c)]);
        }
        run(a)
    };
    let e = import("1", &f1, None)
        .await
        .expect_err("a shard beyond the configuration's");
    assert!(e.contains("beyond"), "{e}");
    let e = import("1", &f0, Some(&config))
        .await
        .expect_err("shard 0's events into shard 1");
    assert!(e.contains("default tenant"), "{e}");
    // Nothing was there: nothing is left, not even the directories the import made.
    assert!(!new.exists(), "{}", new.display());
    let out = import("1", &f1, Some(&config)).await.expect("shard 1");
    let out: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (out["shard"].clone(), out["head"].clone()),
        (json!(1), json!(2)),
        "{out}"
    );
    import("0", &f0, Some(&config)).await.expect("shard 0");

    let r = Server::start(
        ServerOpts::default()
            .config("[log]\nshards = 2\n")
            .seed_data(&new),
    )
    .await;
    let api = r.api();
    let got = [
        events(&api).await,
        events(&api.under("/tenants/acme", None)).await,
        events(&api.under("/tenants/beta", None)).await,
    ];
    assert_eq!(got, want);
    let (_, shards) = api.get_json("/v1/shards").await;
    assert_eq!(shards["shards"][1]["tenants"], json!(["acme"]), "{shards}");
}

/// `compact_log` with several shards (spec sections 13 and 20): each shard's log drops its
/// own prefix, pinned by the cursors of the tenants the directory places in it — acme's live
/// cursor in shard 1 keeps what it still needs (the shard's own models know no directory: its
/// cut once saw no cursor at all). `POST /v1/admin/retention/run` runs every shard and says
/// what each dropped; a position before a shard's first event is `410 compacted` to its
/// tenant; the models still verify.
#[tokio::test]
async fn each_shard_compacts_its_own_log_pinned_by_its_tenants_cursors() {
    let s = Server::start(ServerOpts::default().config(
        "[log]\nshards = 2\nmerge_threshold = 8\n\
         [retention]\nwindow = \"2s\"\nrun_every = \"1h\"\ncompact_log = true\n",
    ))
    .await;
    let api = s.api();
    assert_eq!(create(&api, "acme").await["shard"], 1);
    let acme = api.under("/tenants/acme", None);
    let old = append(&acme, &["a-1", "a-2", "a-3"]).await;
    append(&api, &["d-1", "d-2"]).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // A live consumer of acme's `orders` at a-1 still needs a-2 and a-3.
    let r = acme
        .send(
            acme.request(Method::POST, "/v1/cursors/advance")
                .json(&json!({
            "consumer_id": "c-1", "stream_name": "orders", "subject_id": "",
            "last_sequence": old[0], "delivery_id": "d-1"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Enough later events for each shard's in-memory index to be merged past the cut.
    let fill: Vec<String> = (0..10).map(|i| format!("f-{i}")).collect();
    let fill: Vec<&str> = fill.iter().map(String::as_str).collect();
    for ids in fill.chunks(1) {
        append(&acme, ids).await;
        append(&api, ids).await;
    }
    let r = api
        .send(api.request(Method::POST, "/v1/admin/retention/run"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let shard1 = &r.json["shards"][0];
    assert_eq!(shard1["shard"], 1, "{}", r.text);
    assert_eq!(
        shard1["compacted_through_seq"], old[0],
        "shard 1 cut just before what acme's live cursor needs: {}",
        r.text
    );
    assert!(
        r.json["compacted_through_seq"].as_u64().unwrap_or(0) >= 2,
        "the home shard dropped its own old prefix: {}",
        r.text
    );
    let r = acme.get("/v1/events?after_sequence=0").await;
    assert_eq!(r.status.as_u16(), 410, "{}", r.text);
    assert_eq!(r.json["code"], "compacted");
    let r = acme
        .get(&format!(
            "/v1/events?after_sequence={}&stream=orders",
            old[0]
        ))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["events"][0]["event_id"], "a-2", "{}", r.text);
    let (_, list) = api.get_json("/v1/admin/projections?shard=1").await;
    assert!(
        list["projections"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "{list}"
    );
    for name in ["tasks", "deliveries", "cursors"] {
        let r = api
            .send(api.request(
                Method::POST,
                &format!("/v1/admin/projections/{name}/verify?shard=1"),
            ))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{name}: {}", r.text);
        assert_eq!(r.json["identical"], true, "{name}: {}", r.text);
    }
}

/// A retention run that fails on one shard (spec section 20;
/// `TIDEMARK_FAULT_RETENTION_FAIL_SHARD`) still runs every other shard and says what each
/// did: the failed one in `failed` with the code its own request would have had, the others'
/// reports as usual (a failure on shard 1 used to discard shard 2's, though it had purged).
#[tokio::test]
async fn a_retention_run_failing_on_one_shard_still_reports_the_others() {
    let s = Server::start(
        ServerOpts::default()
            .config("[log]\nshards = 3\n[retention]\nwindow = \"1s\"\nrun_every = \"1h\"\n")
            .env("TIDEMARK_FAULT_RETENTION_FAIL_SHARD", "1"),
    )
    .await;
    let api = s.api();
    assert_eq!(create(&api, "acme").await["shard"], 1);
    assert_eq!(create(&api, "beta").await["shard"], 2);
    let r = api
        .send(api.request(Method::POST, "/v1/admin/retention/run"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let failed = r.json["failed"].as_array().expect("failed");
    assert_eq!(failed.len(), 1, "{}", r.text);
    assert_eq!(failed[0]["shard"], 1, "{}", r.text);
    assert!(failed[0]["code"].as_str().is_some_and(|c| !c.is_empty()));
    let shards: Vec<u64> = r.json["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|s| s["shard"].as_u64().unwrap())
        .collect();
    assert_eq!(shards, [2], "shard 2 ran and says so: {}", r.text);
    assert!(
        r.json["through_seq"].as_u64().is_some(),
        "the home shard's: {}",
        r.text
    );
}
