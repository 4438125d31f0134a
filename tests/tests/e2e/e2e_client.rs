//! The Rust client library (`clients/rust`, spec section 19) against the real server: an
//! append whose answer is lost is sent again and answered as a duplicate; a 429 is waited
//! out; a stream survives a `kill -9` of the server with every seq once and in order; a
//! consumer killed between its handler and its advance resumes from the stored cursor; a
//! worker's heartbeat keeps a lease past its length, its failures reach the row and its
//! shutdown hands unstarted rows back; tidemark's own webhook POSTs verify, under both keys
//! during a rotation.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_client::{
    Client, ConsumerOptions, Error, Failure, NewEvent, Outcome, StreamOptions, WorkerOptions,
    webhooks,
};
use tidemark_tests::{Server, ServerOpts, random_token, sha256_hex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::common::{append_ok, notif_ev, serve_local, wait_for, wait_hit, webhook_id};

/// A port free now, for a server restarted on the same address.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ev(stream: &str, subject: &str, i: u64) -> NewEvent {
    NewEvent::new(stream, subject, "client.test", json!({ "i": i }))
}

/// A TCP relay in front of the server that, for its first connection, passes the request on
/// and drops the connection when the answer starts to come back: the append lands, its
/// answer is lost. Later connections are relayed whole.
async fn answer_losing_relay(upstream: SocketAddr) -> (u16, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let lost = Arc::new(AtomicU32::new(0));
    let l2 = lost.clone();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut client, _)) = listener.accept().await {
            let mut server = tokio::net::TcpStream::connect(upstream).await.unwrap();
            if first {
                first = false;
                let lost = l2.clone();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.split();
                    let (mut sr, mut sw) = server.split();
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut answer = [0u8; 1];
                    tokio::select! {
                        _ = async {
                            loop {
                                let n = cr.read(&mut buf).await.unwrap_or(0);
                                if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        } => {}
                        _ = sr.read(&mut answer) => {}
                    }
                    lost.fetch_add(1, Ordering::SeqCst);
                    let _ = cw.shutdown().await;
                });
            } else {
                tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        }
    });
    (port, lost)
}

/// `append` gives events ids, and sends a batch whose answer was lost again with the same
/// ids: the retry is answered as duplicates with the seqs of the first send, and the log
/// holds the batch once.
#[tokio::test]
async fn an_append_whose_answer_is_lost_is_resent_and_answered_as_a_duplicate() {
    let s = Server::start(ServerOpts::default()).await;
    let (port, lost) = answer_losing_relay(s.addr()).await;
    let client = Client::new(format!("http://127.0.0.1:{port}"), None).unwrap();
    let r = client
        .append((0..3).map(|i| ev("cl-append", "a", i)))
        .await
        .unwrap();
    assert_eq!(
        lost.load(Ordering::SeqCst),
        1,
        "the first answer was dropped"
    );
    assert_eq!(r.events.len(), 3);
    assert!(r.events.iter().all(|e| e.duplicate), "{r:?}");
    assert!(
        r.events
            .iter()
            .all(|e| uuid::Uuid::parse_str(&e.event_id).is_ok()),
        "{r:?}"
    );
    // The log holds each once, at the seqs the retry named.
    let page = client
        .events(0, Some("cl-append"), None, 100)
        .await
        .unwrap();
    let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
    let named: Vec<u64> = r.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, named);
    // A mistake of the caller's is answered at once, typed by its code.
    let bad = client
        .append([NewEvent::new("cl-append", "a", "", json!({}))])
        .await
        .unwrap_err();
    assert_eq!(bad.status(), Some(StatusCode::BAD_REQUEST), "{bad}");
    assert_eq!(bad.code(), Some("invalid_field"), "{bad}");
    assert!(!bad.is_retryable());
}

/// A token past its rate gets `429` with `Retry-After`; the client waits it out and the
/// append lands.
#[tokio::test]
async fn an_append_waits_out_a_429() {
    let token = random_token(32);
    let config = format!(
        "[[auth.tokens]]\nname = \"limited\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\nrate = \"60/m\"\n",
        sha256_hex(&token)
    );
    let s = Server::start(ServerOpts::default().config(config)).await;
    let client = Client::new(s.base(), Some(token.clone())).unwrap();
    // Spend the bucket.
    let raw = reqwest::Client::new();
    let mut refused = false;
    for _ in 0..200 {
        let r = raw
            .get(s.url("/v1/events?after_sequence=0"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(r.headers().get("retry-after").is_some());
            refused = true;
            break;
        }
    }
    assert!(refused, "the rate limit never refused");
    let r = client.append([ev("cl-rate", "a", 0)]).await.unwrap();
    assert_eq!(r.events.len(), 1);
    assert!(!r.events[0].duplicate);
}

/// A stream resumes across a `kill -9` of the server and its restart on the same address:
/// the caller sees every seq of its stream once, in order, the ones appended while it was
/// away included.
#[tokio::test]
async fn a_stream_resumes_across_a_kill_9_with_each_seq_once_in_order() {
    let port = free_port();
    let mut s = Server::start(ServerOpts::default().listen(format!("127.0.0.1:{port}"))).await;
    let client = Client::new(s.base(), None).unwrap();
    client
        .append((0..50).map(|i| ev("cl-stream", "a", i)))
        .await
        .unwrap();
    let mut stream = client.stream(StreamOptions::after(0).stream("cl-stream"));
    let mut seen: Vec<u64> = Vec::new();
    while seen.len() < 50 {
        seen.push(next_event(&mut stream).await.seq);
    }
    s.kill9();
    s.restart().await;
    assert_eq!(s.addr().port(), port);
    let after = Client::new(s.base(), None).unwrap();
    for i in 50..80 {
        after.append([ev("cl-stream", "a", i)]).await.unwrap();
    }
    while seen.len() < 80 {
        let e = next_event(&mut stream).await;
        assert_eq!(e.payload["i"], seen.len() as u64, "{e:?}");
        seen.push(e.seq);
    }
    assert!(stream.reconnects() >= 1);
    let log: Vec<u64> = after
        .events(0, Some("cl-stream"), None, 1000)
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seen, log, "each seq once, in order, none skipped");
    stream.close();
}

/// A consumer aborted at random moments (between its handler and its advance included) and
/// run again, while the server is killed once under it, handles every event in seq order;
/// what it handles twice is only the page it was killed on.
#[tokio::test]
async fn a_consumer_resumes_from_its_cursor_after_a_crash_and_a_server_kill() {
    let port = free_port();
    let mut s = Server::start(ServerOpts::default().listen(format!("127.0.0.1:{port}"))).await;
    let client = Client::new(s.base(), None).unwrap();
    for chunk in 0..10u64 {
        client
            .append((0..20).map(|i| ev("cl-consumer", "b", chunk * 20 + i)))
            .await
            .unwrap();
    }
    let handled: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(Vec::new()));
    let opts = {
        let mut o = ConsumerOptions::new("bridge-cl", "cl-consumer");
        o.page = 7;
        o
    };
    let run = |client: Client| {
        let handled = handled.clone();
        let opts = opts.clone();
        tokio::spawn(async move {
            client
                .consumer(opts)
                .run(
                    |page| {
                        let handled = handled.clone();
                        async move {
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            handled
                                .lock()
                                .unwrap()
                                .extend(page.iter().map(|e| e.payload["i"].as_u64().unwrap()));
                            Ok::<(), ()>(())
                        }
                    },
                    CancellationToken::new(),
                )
                .await
        })
    };
    // Three crashes of the consumer, then one of the server under a running consumer.
    for wait_ms in [15, 40, 25] {
        let t = run(client.clone());
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        t.abort();
        let _ = t.await;
    }
    let t = run(client.clone());
    tokio::time::sleep(Duration::from_millis(30)).await;
    s.kill9();
    s.restart().await;
    wait_for(Duration::from_secs(60), "every event handled", || async {
        let h = handled.lock().unwrap();
        (h.iter()
            .copied()
            .collect::<std::collections::BTreeSet<u64>>()
            .len()
            == 200)
            .then_some(())
    })
    .await;
    t.abort();
    let h = handled.lock().unwrap().clone();
    // In order, with repeats only as a re-handled tail: each value follows the one before
    // it, or goes back to repeat what was handled but not advanced past.
    let mut top: Option<u64> = None;
    let mut repeats = 0;
    for &i in &h {
        match top {
            Some(t) if i <= t => repeats += 1,
            Some(t) => assert_eq!(i, t + 1, "skipped after {t}: {h:?}"),
            None => assert_eq!(i, 0, "{h:?}"),
        }
        top = Some(top.map_or(i, |t| t.max(i)));
    }
    assert_eq!(top, Some(199));
    // At most a page per crash is handled again.
    assert!(repeats <= 4 * 7, "{repeats} repeats: {h:?}");
    let c = client.cursor("bridge-cl", "cl-consumer", "").await.unwrap();
    let last = client
        .events(0, Some("cl-consumer"), None, 1000)
        .await
        .unwrap()
        .events
        .last()
        .unwrap()
        .seq;
    assert_eq!(c.last_sequence, last);
}

fn urgent(id: &str) -> Value {
    notif_ev(
        id,
        json!({"priority": "urgent", "title": format!("title of {id}")}),
    )
}

/// Request the urgent notifications `ids` and wait until `client` sees each one's delivery.
async fn urgent_deliveries(api: &tidemark_tests::Api, client: &Client, ids: &[String]) {
    for id in ids {
        append_ok(api, &urgent(id)).await;
    }
    for id in ids {
        let d = format!("dlv:{id}:desktop");
        wait_for(Duration::from_secs(30), "the delivery", || async {
            client.delivery(&d).await.ok()
        })
        .await;
    }
}

/// The next event of `stream`, within a minute (a bound against a hang).
async fn next_event(stream: &mut tidemark_client::EventStream) -> tidemark_client::Event {
    tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .expect("an event within a minute")
        .expect("the stream goes on")
        .unwrap()
}

/// A worker: a handler that runs past the lease keeps it (the heartbeat), a failure parks the
/// row with the handler's code, and a shutdown hands the rows it had not started back.
#[tokio::test]
async fn a_worker_extends_completes_fails_and_lets_go_on_shutdown() {
    let s = Server::start(ServerOpts::default()).await;
    for id in ["w-slow", "w-bad"] {
        append_ok(&s, &urgent(id)).await;
    }
    let client = Client::new(s.base(), None).unwrap();
    wait_for(Duration::from_secs(30), "two deliveries", || async {
        let n = client.delivery("dlv:w-bad:desktop").await.is_ok()
            && client.delivery("dlv:w-slow:desktop").await.is_ok();
        n.then_some(())
    })
    .await;
    let stop = CancellationToken::new();
    let mut opts = WorkerOptions::new("desk-1");
    opts.lease = Duration::from_millis(600);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let worker = client.worker("app", opts.clone());
    let (stop2, seen2) = (stop.clone(), seen.clone());
    let run = tokio::spawn(async move {
        worker
            .run(
                move |d| {
                    let (stop, seen) = (stop2.clone(), seen2.clone());
                    async move {
                        let n = {
                            let mut s = seen.lock().unwrap();
                            s.push(d.id.clone());
                            s.len()
                        };
                        if n == 2 {
                            stop.cancel();
                        }
                        if d.notification_id == "w-bad" {
                            return Outcome::Failed(Failure::permanent(
                                "receiver_refused",
                                "the desktop refused it",
                            ));
                        }
                        // Past the lease four times over: only the heartbeat keeps it.
                        tokio::time::sleep(Duration::from_millis(2_400)).await;
                        Outcome::Done
                    }
                },
                stop.clone(),
            )
            .await
    });
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.refused, 0, "{report:?}");
    assert_eq!(report.completed + report.failed, 2, "{report:?}");
    let slow = client.delivery("dlv:w-slow:desktop").await.unwrap();
    assert_eq!(slow.status, "sent", "{slow:?}");
    let bad = client.delivery("dlv:w-bad:desktop").await.unwrap();
    assert_eq!(bad.status, "parked", "{bad:?}");
    assert!(
        serde_json::to_string(&bad)
            .unwrap()
            .contains("receiver_refused"),
        "{bad:?}"
    );

    // Shutdown: the first row is handled, the other four are handed back and claimable at
    // once by another worker.
    for i in 0..5 {
        append_ok(&s, &urgent(&format!("w-{i}"))).await;
    }
    wait_for(Duration::from_secs(30), "five deliveries", || async {
        let mut all = true;
        for i in 0..5 {
            all &= client.delivery(&format!("dlv:w-{i}:desktop")).await.is_ok();
        }
        all.then_some(())
    })
    .await;
    let stop = CancellationToken::new();
    let stop2 = stop.clone();
    let mut opts = WorkerOptions::new("desk-2");
    opts.limit = 5;
    let report = client
        .worker("app", opts)
        .run(
            move |_| {
                let stop = stop2.clone();
                async move {
                    stop.cancel();
                    Outcome::Done
                }
            },
            stop,
        )
        .await
        .unwrap();
    assert_eq!((report.completed, report.released), (1, 4), "{report:?}");
    let again = client
        .claim("app", "desk-3", 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again.len(), 4, "{again:?}");
}

/// tidemark's own webhook POSTs verify with `webhooks::verify` under the route's secret, and
/// during a rotation under either key; another key, a changed body or a missing header do
/// not.
#[tokio::test]
async fn tidemarks_webhook_posts_verify_under_both_keys_during_a_rotation() {
    type Hits = Arc<Mutex<Vec<(axum::http::HeaderMap, Vec<u8>)>>>;
    let hits: Hits = Arc::new(Mutex::new(Vec::new()));
    let h2 = hits.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let hits = h2.clone();
                async move {
                    hits.lock().unwrap().push((headers, body.to_vec()));
                    StatusCode::OK
                }
            },
        ),
    );
    let hook = serve_local(app).await.port();
    let s = Server::start(ServerOpts::default()).await;
    let (old, new) = (random_token(32), random_token(32));
    let put = |secret: &str| {
        json!({"route": {"sink": "webhook", "url": format!("http://127.0.0.1:{hook}/hook"),
                         "secret": secret, "rotation_overlap": "1h", "priorities": ["urgent"]},
               "reason": "the client's verification test"})
    };
    let posted = |id: String| {
        let hits = hits.clone();
        async move { wait_hit(&hits, "the POST", |(h, _)| webhook_id(h) == id).await }
    };
    // The route signed with `secret`, a notification, and the POST tidemark made of it.
    let signed_post = |secret: String, id: &'static str| {
        let (s, put, posted) = (&s, &put, &posted);
        async move {
            let r = s
                .send(
                    s.request(reqwest::Method::PUT, "/v1/routes/hook")
                        .json(&put(&secret)),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            append_ok(s, &urgent(id)).await;
            let (headers, body) = posted(format!("dlv:{id}:hook")).await;
            (convert(&headers), body)
        }
    };
    let (h, body) = signed_post(old.clone(), "v-1").await;
    assert_eq!(webhooks::verify(&[&old], &h, &body), Ok(()));
    assert_eq!(
        webhooks::verify(&[&new], &h, &body),
        Err(webhooks::VerifyError::NoMatch)
    );
    let mut changed = body.clone();
    changed.push(b' ');
    assert_eq!(
        webhooks::verify(&[&old], &h, &changed),
        Err(webhooks::VerifyError::NoMatch)
    );
    let mut missing = h.clone();
    missing.remove("webhook-timestamp");
    assert_eq!(
        webhooks::verify(&[&old], &missing, &body),
        Err(webhooks::VerifyError::Missing("webhook-timestamp"))
    );

    // Rotated: both keys sign for the overlap.
    let (h, body) = signed_post(new.clone(), "v-2").await;
    assert_eq!(webhooks::verify(&[&new], &h, &body), Ok(()));
    assert_eq!(webhooks::verify(&[&old], &h, &body), Ok(()));
    assert_eq!(
        webhooks::verify(&[&random_token(32)], &h, &body),
        Err(webhooks::VerifyError::NoMatch)
    );
}

/// axum's `HeaderMap` (http 1) as reqwest's (the same crate; kept explicit should they part).
fn convert(h: &axum::http::HeaderMap) -> reqwest::header::HeaderMap {
    let mut out = reqwest::header::HeaderMap::new();
    for (k, v) in h {
        out.insert(
            reqwest::header::HeaderName::from_bytes(k.as_str().as_bytes()).unwrap(),
            reqwest::header::HeaderValue::from_bytes(v.as_bytes()).unwrap(),
        );
    }
    out
}

/// A problem's code and status reach the caller typed.
#[tokio::test]
async fn a_problem_reaches_the_caller_typed_by_its_code() {
    let s = Server::start(ServerOpts::default()).await;
    let client = Client::new(s.base(), None).unwrap();
    let e = client.delivery("dlv:nothing:desktop").await.unwrap_err();
    assert_eq!(e.status(), Some(StatusCode::NOT_FOUND), "{e}");
    assert!(
        matches!(&e, Error::Api(p) if !p.code.is_empty() && !p.detail.is_empty()),
        "{e}"
    );
    assert!(!e.is_retryable());
    assert!(Client::new("127.0.0.1:7700", None).is_err());
}

/// The repository's root.
fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn command(program: &str, dir: &std::path::Path) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(program);
    c.current_dir(dir)
        .env("TIDEMARK_BIN", tidemark_tests::binary())
        .env("PYTHONDONTWRITEBYTECODE", "1");
    c
}

/// `clients/python`: packaged as PyPI wants it (a wheel and an sdist), the wheel installed
/// into a directory of its own, and its pytest suite run on that install against the real
/// server (`clients/python/tests`, each test its own server, `kill -9`s included).
#[tokio::test]
async fn the_python_client_is_packaged_and_passes_its_tests_against_the_server() {
    let src = root().join("clients/python");
    let tmp = tempfile::tempdir().unwrap();
    let dist = tmp.path().join("dist");
    let build = tmp.path().join("build");
    // Built from a copy: a build writes `build/` and `*.egg-info` beside the sources.
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        let status = std::process::Command::new("cp")
            .arg("-r")
            .arg(from)
            .arg(to)
            .status()
            .unwrap();
        assert!(status.success());
    };
    copy(&src, &build);
    let mut wheel = command("python3", &build);
    wheel.args([
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-w",
    ]);
    wheel.arg(&dist).arg(".");
    crate::common::run_script(wheel, "pip wheel clients/python").await;
    let mut sdist = command("python3", &build);
    sdist.args([
        "-c",
        "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))",
    ]);
    sdist.arg(&dist);
    crate::common::run_script(sdist, "the sdist of clients/python").await;
    let names: Vec<String> = std::fs::read_dir(&dist)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let whl = names
        .iter()
        .find(|n| n.starts_with("tidemark_client-0.1.0") && n.ends_with(".whl"))
        .unwrap_or_else(|| panic!("no wheel in {names:?}"));
    assert!(
        names
            .iter()
            .any(|n| n.replace('_', "-").starts_with("tidemark-client-0.1.0")
                && n.ends_with(".tar.gz")),
        "no sdist in {names:?}"
    );
    let site = tmp.path().join("site");
    let mut install = command("python3", tmp.path());
    install.args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"]);
    install.arg(&site).arg(dist.join(whl));
    crate::common::run_script(install, "pip install the wheel").await;
    let mut pytest = command("python3", &src);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .env("PYTHONPATH", &site);
    let out = crate::common::run_script(pytest, "the Python client's tests").await;
    assert!(out.contains("12 passed"), "{out}");
}

/// `clients/typescript`: its declarations checked by `tsc`, packed as npm wants it, and its
/// `node --test` suite run against the real server (each test its own server, `kill -9`s
/// included).
#[tokio::test]
async fn the_typescript_client_is_packed_and_passes_its_tests_against_the_server() {
    let src = root().join("clients/typescript");
    let tmp = tempfile::tempdir().unwrap();
    // The declarations are checked by the TypeScript compiler (a dev dependency, pinned by
    // the lock file): a program written against them compiles.
    let mut ci = command("npm", &src);
    ci.args(["ci", "--no-audit", "--no-fund", "--loglevel=error"]);
    crate::common::run_script(ci, "npm ci clients/typescript").await;
    let mut tsc = command("npx", &src);
    tsc.args(["tsc", "-p", "."]);
    crate::common::run_script(tsc, "tsc on the client's declarations").await;
    let mut pack = command("npm", &src);
    pack.args(["pack", "--silent", "--pack-destination"])
        .arg(tmp.path());
    let out = crate::common::run_script(pack, "npm pack clients/typescript").await;
    assert!(
        tmp.path().join("tidemark-client-0.1.0.tgz").exists(),
        "npm pack: {out}"
    );
    let mut test = command("node", &src);
    test.args(["--test", "test/"]);
    let out = crate::common::run_script(test, "the TypeScript client's tests").await;
    assert!(
        out.contains("# pass 9") && out.contains("# fail 0"),
        "{out}"
    );
}

/// The OpenAPI document the client libraries are written against is checked in
/// (`clients/openapi.json`, keys sorted, two-space indent) and is the server's: a change of
/// the API fails here until the file is brought up to date (`TIDEMARK_UPDATE_OPENAPI=1 cargo
/// test -p tidemark-tests --test e2e e2e_client::the_checked_in` writes it) and the
/// libraries are looked at against the diff. (The libraries have no generated part: each
/// is written against the API's JSON, so this file is what they are reviewed against.)
#[tokio::test]
async fn the_checked_in_openapi_document_is_the_servers() {
    let s = Server::start(ServerOpts::default()).await;
    let (status, doc) = s.get_json("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let served = serde_json::to_string_pretty(&doc).unwrap() + "\n";
    let path = root().join("clients/openapi.json");
    if std::env::var_os("TIDEMARK_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &served).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != served {
        let first = checked_in
            .lines()
            .zip(served.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map_or_else(
                || "one is a prefix of the other".to_owned(),
                |(i, (a, b))| format!("line {}: checked in {a:?}, served {b:?}", i + 1),
            );
        panic!(
            "clients/openapi.json differs from the server's /openapi.json ({first}); \
             update it with TIDEMARK_UPDATE_OPENAPI=1 and look at the client libraries \
             against the diff"
        );
    }
}

/// Start an example and wait until it has printed `want` lines starting with `prefix`.
async fn start_example(
    mut cmd: tokio::process::Command,
    what: &str,
    prefix: &str,
    want: usize,
) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start it: {e}"));
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(120), async {
        while got
            .iter()
            .filter(|l: &&String| l.starts_with(prefix))
            .count()
            < want
        {
            match lines.next_line().await.unwrap() {
                Some(l) => got.push(l),
                None => break,
            }
        }
    })
    .await;
    if read.is_err() || got.iter().filter(|l| l.starts_with(prefix)).count() < want {
        child.start_kill().ok();
        let out = child.wait_with_output().await.unwrap();
        panic!(
            "{what} printed {got:?}; stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The rest of its output is not read: keep the pipe drained.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

/// Stop an example with SIGINT (the examples' Ctrl-C) and expect a clean exit.
async fn stop_example(child: tokio::process::Child, what: &str) {
    let pid = child.id().expect("the example runs");
    tidemark_tests::signal(pid, nix::sys::signal::Signal::SIGINT);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not stop on SIGINT"))
        .unwrap();
    assert!(
        out.status.success(),
        "{what} exited {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each client's README opens with the designs' own uses (a bridge on its cursor, a resumed
/// dashboard stream, a desktop claimer); each example (Rust `examples/*.rs`, Python,
/// JavaScript) is in the README verbatim, and runs as written against a server with
/// notifications in it: the bridge posts them, the dashboard shows them, the desktop claimer
/// shows its deliveries and they are sent.
#[tokio::test]
async fn the_client_readme_examples_run_as_written() {
    let s = Server::start(ServerOpts::default()).await;
    let client = Client::new(s.base(), None).unwrap();
    for lang in ["rust", "python", "typescript"] {
        let dir = root().join("clients").join(lang);
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        let ext = match lang {
            "rust" => "rs",
            "python" => "py",
            _ => "js",
        };
        let ids: Vec<String> = (0..3).map(|i| format!("ex-{lang}-{i}")).collect();
        urgent_deliveries(&s, &client, &ids).await;
        for (name, prefix, want) in [
            ("bridge", "posted", ids.len()),
            ("dashboard", "shown", ids.len()),
            ("desktop", "shown on desktop", ids.len()),
        ] {
            let file = dir.join("examples").join(format!("{name}.{ext}"));
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                readme.contains(&text),
                "clients/{lang}/README.md does not show examples/{name}.{ext} as it is"
            );
            let mut cmd = match lang {
                "rust" => {
                    // Built by `cargo test --workspace` (the README's test command builds every
                    // member's examples) beside this test's own executable (`…/deps/e2e-*`).
                    let exe = std::env::current_exe().unwrap();
                    let bin = exe
                        .parent()
                        .unwrap()
                        .parent()
                        .unwrap()
                        .join("examples")
                        .join(name);
                    assert!(
                        bin.exists(),
                        "{} is not built: run the README's test command, or `cargo build -p \
                         tidemark-client --examples`",
                        bin.display()
                    );
                    command(bin.to_str().unwrap(), &dir)
                }
                "python" => {
                    let mut c = command("python3", &dir);
                    c.arg(&file).env("PYTHONPATH", dir.join("src"));
                    c
                }
                _ => {
                    let mut c = command("node", &dir);
                    c.arg(&file);
                    c
                }
            };
            cmd.env("TIDEMARK_URL", s.base());
            let what = format!("{lang} {name}");
            let child = start_example(cmd, &what, prefix, want).await;
            if name == "desktop" {
                // What it showed is reported done: each delivery is sent.
                for id in &ids {
                    let d = format!("dlv:{id}:desktop");
                    wait_for(Duration::from_secs(30), "the delivery sent", || async {
                        client
                            .delivery(&d)
                            .await
                            .ok()
                            .filter(|d| d.status == "sent")
                    })
                    .await;
                }
            }
            stop_example(child, &what).await;
        }
    }
}

/// Every JSON operation of the checked-in document is a call (`client.ops()`, generated by
/// `clients/codegen.py`); the generated parts of the three libraries are up to date; a call
/// answers the server's JSON, a refusal its typed problem, and a query parameter the
/// operation does not take is refused before anything is sent.
#[tokio::test]
async fn every_operation_is_a_generated_call_and_the_generated_parts_are_current() {
    let mut check = command("python3", &root());
    check.args(["clients/codegen.py", "--check"]);
    let out = crate::common::run_script(check, "clients/codegen.py --check").await;
    assert!(out.contains("up to date"), "{out}");

    let s = Server::start(ServerOpts::default()).await;
    let c = Client::new(s.base(), None).unwrap();
    let who = c.ops().get_whoami().await.unwrap();
    assert!(who.open, "{who:?}");
    let body = json!({"route": {"sink": "app", "priorities": ["urgent"]},
                      "reason": "the client's generated calls"});
    let put = c.ops().put_route("ops-route", &body).await.unwrap();
    assert_eq!(put.name, "ops-route", "{put:?}");
    let got = c.ops_json().get_route("ops-route", &[]).await.unwrap();
    assert_eq!(got["route"]["sink"], "app", "{got}");
    let missing = c
        .ops()
        .get_delivery("dlv:none:desktop", &[])
        .await
        .unwrap_err();
    assert_eq!(missing.status(), Some(StatusCode::NOT_FOUND), "{missing}");
    let bad = c.ops().list_routes(&[("no_such", "1")]).await.unwrap_err();
    assert!(matches!(bad, Error::Config(_)), "{bad}");
}

/// A worker keeps working across a `kill -9` of the server and its restart: every delivery
/// is handled and ends sent; a delivery is handled twice only when its lease ran out while
/// the server was away (at-least-once, counted), never one skipped.
#[tokio::test]
async fn a_worker_survives_a_kill_9_of_the_server_and_every_delivery_is_sent() {
    let port = free_port();
    let mut s = Server::start(ServerOpts::default().listen(format!("127.0.0.1:{port}"))).await;
    let client = Client::new(s.base(), None).unwrap();
    let ids: Vec<String> = (0..30).map(|i| format!("wk-{i}")).collect();
    urgent_deliveries(&s, &client, &ids).await;
    let handled: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let mut opts = WorkerOptions::new("desk-kill");
    opts.limit = 5;
    opts.lease = Duration::from_secs(2);
    let (h2, stop2) = (handled.clone(), stop.clone());
    let worker = client.worker("app", opts);
    let run = tokio::spawn(async move {
        worker
            .run(
                move |d| {
                    let h = h2.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        h.lock().unwrap().push(d.notification_id.clone());
                        Outcome::Done
                    }
                },
                stop2,
            )
            .await
    });
    wait_for(Duration::from_secs(60), "a few handled", || async {
        (handled.lock().unwrap().len() >= 8).then_some(())
    })
    .await;
    s.kill9();
    s.restart().await;
    let after = Client::new(s.base(), None).unwrap();
    for id in &ids {
        let d = format!("dlv:{id}:desktop");
        wait_for(Duration::from_secs(120), "every delivery sent", || async {
            after.delivery(&d).await.ok().filter(|d| d.status == "sent")
        })
        .await;
    }
    stop.cancel();
    let report = run.await.unwrap().unwrap();
    let h = handled.lock().unwrap().clone();
    let distinct: std::collections::BTreeSet<&String> = h.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "every delivery handled: {h:?}");
    let twice = h.len() - distinct.len();
    // Only what was in hand when the server went: at most one claim's worth.
    assert!(twice <= 5, "{twice} handled twice: {h:?}; {report:?}");
    assert_eq!(
        report.completed as usize + report.refused as usize,
        h.len(),
        "{report:?}"
    );
}

/// The libraries are versioned with the server (spec section 19).
#[test]
fn the_client_libraries_carry_the_servers_version() {
    let version = env!("CARGO_PKG_VERSION");
    let py = std::fs::read_to_string(root().join("clients/python/pyproject.toml")).unwrap();
    assert!(
        py.contains(&format!("version = \"{version}\"")),
        "clients/python/pyproject.toml is not at {version}"
    );
    let ts: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("clients/typescript/package.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(ts["version"], version, "clients/typescript/package.json");
    let rs = std::fs::read_to_string(root().join("clients/rust/Cargo.toml")).unwrap();
    assert!(
        rs.contains("version.workspace = true"),
        "clients/rust/Cargo.toml"
    );
}

/// A typed answer, or the server's refusal; never an answer the document's type cannot read
/// (`Error::Decode`), which would mean the document and the server disagree.
fn typed<T>(what: &str, r: Result<T, Error>) -> Option<T> {
    match r {
        Ok(t) => Some(t),
        Err(Error::Api(p)) => {
            eprintln!("{what}: refused: {} {}", p.status, p.code);
            None
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// A typed answer that must come.
fn ok<T>(what: &str, r: Result<T, Error>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The JSON without its `null` members (a typed answer written back leaves them out).
fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        v => v.clone(),
    }
}

/// The type holds everything the server sent: the JSON answer read as `T` (the type of the
/// typed call's answer, `_typed`) and written back is the same JSON (both less their
/// `null`s), so the document names every field of it with the type it has.
fn same<T: serde::Serialize + serde::de::DeserializeOwned>(what: &str, _typed: &T, json: &Value) {
    let read: T = serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("{what}: the JSON answer does not read as its type: {e}"));
    let back = serde_json::to_value(&read).unwrap();
    assert_eq!(
        without_nulls(&back),
        without_nulls(json),
        "{what}: the typed answer differs from the JSON"
    );
}

/// Every generated call answers the type the document gives it, read from what the server
/// really sends: each operation is called on a server with tasks, notifications, deliveries
/// in every state, a webhook route and its endpoint, a list, cursors and a bridge
/// subscription, and the typed answers of the reads are compared with their JSON, field by
/// field. Bodies go typed too (the generated body structs leave out what is `None`).
#[tokio::test]
async fn every_operation_answers_the_type_the_document_gives_it() {
    use tidemark_client::models::*;
    let s = Server::start(ServerOpts::default()).await;
    let c = Client::new(s.base(), None).unwrap();
    let (o, j) = (c.ops(), c.ops_json());
    // A read called both ways, typed (`o`) and as JSON (`j`): the answers agree (`same`).
    macro_rules! both {
        ($name:literal, $what:literal, $call:ident($($arg:expr),*)) => {{
            let typed = ok($what, o.$call($($arg),*).await);
            let json = ok($what, j.$call($($arg),*).await);
            same($name, &typed, &json);
        }};
    }

    ok("health", o.get_health().await);
    ok("liveness", o.get_liveness().await);
    ok("readiness", o.get_readiness().await);
    assert!(ok("whoami", o.get_whoami().await).open);

    // A task, four notifications of it, and their app deliveries.
    let task = "ops-task";
    let mut events = vec![
        crate::common::task_ev(task, "task.created", json!({"project_id": "ops"})),
        crate::common::task_ev(task, "task.run_started", json!({"run_id": "r1"})),
    ];
    for i in 0..4 {
        events.push(notif_ev(
            &format!("ops-n{i}"),
            json!({"priority": "urgent", "title": format!("n{i}"), "task_id": task,
                   "type": "build.done", "type_data": {"n": i}}),
        ));
    }
    let appended = ok(
        "append",
        o.append_events(&json!({ "events": events })).await,
    );
    assert_eq!(appended.events.len(), 6);
    let ids: Vec<String> = (0..4).map(|i| format!("dlv:ops-n{i}:desktop")).collect();
    for id in &ids {
        wait_for(Duration::from_secs(30), "a delivery", || async {
            typed("getDelivery", o.get_delivery(id, &[]).await)
        })
        .await;
    }
    let claimed = ok(
        "claim",
        o.claim_deliveries(&ClaimBody {
            sink: "app".into(),
            owner: "w".into(),
            limit: Some(4),
            lease_ms: Some(60_000),
        })
        .await,
    );
    assert_eq!(claimed.deliveries.len(), 4, "{claimed:?}");
    assert_eq!(claimed.deliveries[0].r#type.as_deref(), Some("build.done"));
    let owner = |id: &str| CompleteBody {
        owner: "w".into(),
        external_id: Some(format!("x-{id}")),
    };
    let done = ok(
        "complete",
        o.complete_delivery(&ids[0], &owner(&ids[0])).await,
    );
    assert_eq!(done.status, "sent", "{done:?}");
    let failed = FailBody {
        owner: "w".into(),
        error_code: "ops_refused".into(),
        retryable: Some(false),
        ..FailBody::default()
    };
    let parked = ok("fail", o.fail_delivery(&ids[1], &failed).await);
    assert_eq!(parked.status, "parked", "{parked:?}");
    let extend = ExtendBody {
        owner: "w".into(),
        lease_ms: Some(120_000),
    };
    ok("extend", o.extend_delivery_lease(&ids[2], &extend).await);
    let many = ok(
        "complete many",
        o.complete_deliveries(&CompleteManyBody {
            owner: "w".into(),
            deliveries: vec![CompleteItem {
                id: ids[3].clone(),
                external_id: None,
            }],
        })
        .await,
    );
    assert_eq!(many.results[0].status, 200, "{many:?}");
    let by = OperatorBody {
        by: Some("ops".into()),
        reason: Some("the typed calls".into()),
    };
    let discarded = ok("discard", o.discard_delivery(&ids[1], &by).await);
    assert_eq!(discarded.status, "discarded", "{discarded:?}");
    let parked = ok("fail", o.fail_delivery(&ids[2], &failed).await);
    assert_eq!(parked.status, "parked", "{parked:?}");
    let retried = ok("retry", o.retry_delivery(&ids[2], &by).await);
    assert_eq!(retried.status, "queued", "{retried:?}");
    let resend = ResendBody {
        reason: "again".into(),
    };
    ok("resend", o.resend_delivery(&ids[0], &resend).await);
    for id in &ids {
        let t = ok("getDelivery", o.get_delivery(id, &[]).await);
        same(
            "getDelivery",
            &t,
            &ok("getDelivery", j.get_delivery(id, &[]).await),
        );
    }
    let q = [("sink", "app")];
    both!("listDeliveries", "listDeliveries", list_deliveries(&q));
    let recover = RecoverBody {
        route: "desktop".into(),
        since: "2020-01-01T00:00:00Z".into(),
        reason: "the typed calls".into(),
    };
    typed("recover", o.recover_deliveries(&recover).await);

    // Notifications, tasks, events.
    let n = "ops-n0";
    both!(
        "getNotificationStatus",
        "status",
        get_notification_status(n, &[])
    );
    both!(
        "listNotifications",
        "notifications",
        list_notifications(&[])
    );
    both!("getTask", "task", get_task(task, &[]));
    both!("listTasks", "tasks", list_tasks(&[]));
    both!("listEvents", "events", list_events(&[]));

    // Cursors.
    let advance = AdvanceBody {
        consumer_id: "ops-consumer".into(),
        stream_name: "notifications".into(),
        last_sequence: 3,
        delivery_id: "ops-d3".into(),
        ..AdvanceBody::default()
    };
    ok("advance", o.advance_cursor(&advance).await);
    let reset = ResetBody {
        consumer_id: "ops-consumer".into(),
        stream_name: "notifications".into(),
        last_sequence: 1,
        reason: "the typed calls".into(),
        subject_id: None,
    };
    ok("reset", o.reset_cursor(&reset).await);
    let q = [("consumer_id", "ops-consumer")];
    both!("getCursors", "cursors", get_cursors(&q));

    // A webhook route, its endpoint, a list.
    let mut route = serde_json::Map::new();
    route.insert("sink".into(), json!("webhook"));
    route.insert("url".into(), json!("http://127.0.0.1:9/hook"));
    route.insert("priorities".into(), json!(["urgent"]));
    let put = RouteBody {
        route,
        reason: "the typed calls".into(),
    };
    ok("putRoute", o.put_route("ops-hook", &put).await);
    both!("getRoute", "getRoute", get_route("ops-hook", &[]));
    both!("listRoutes", "listRoutes", list_routes(&[]));
    let switch = SwitchBody {
        reason: "the typed calls".into(),
    };
    ok("disable", o.disable_endpoint("ops-hook", &switch).await);
    ok("enable", o.enable_endpoint("ops-hook", &switch).await);
    both!("listEndpoints", "listEndpoints", list_endpoints(&[]));
    let gone = RouteDeleteBody {
        reason: "the typed calls".into(),
    };
    ok("deleteRoute", o.delete_route("ops-hook", &gone).await);
    let list = ListBody {
        members: vec!["a@example.com".into(), "b@example.com".into()],
        reason: "the typed calls".into(),
    };
    ok("putList", o.put_list("ops-list", &list).await);
    both!("getList", "getList", get_list("ops-list"));
    both!("listLists", "listLists", list_lists());
    let gone = ListDeleteBody {
        reason: "the typed calls".into(),
    };
    ok("deleteList", o.delete_list("ops-list", &gone).await);

    // A bridge subscription on the task: its pull page, an ack and a nack.
    let sub = SubscribeBody {
        subscription_id: "ops-sub".into(),
        bridge_id: "ops-bridge".into(),
        sink: json!({"kind": "pull"}),
        ..SubscribeBody::default()
    };
    ok("subscribe", o.create_bridge_subscription(task, &sub).await);
    append_ok(
        &s,
        &crate::common::task_ev(task, "task.run_completed", json!({"run_id": "r1"})),
    )
    .await;
    let pulled = wait_for(Duration::from_secs(30), "a bridge delivery", || async {
        let p = typed("pull", o.pull_bridge_deliveries("ops-bridge", &[]).await)?;
        (!p.deliveries.is_empty()).then_some(p)
    })
    .await;
    let pulled_json = ok("pull", j.pull_bridge_deliveries("ops-bridge", &[]).await);
    same("pullBridgeDeliveries", &pulled, &pulled_json);
    let first = pulled.deliveries[0]["delivery_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let nack = NackBody {
        error: "not yet".into(),
    };
    typed(
        "nack",
        o.nack_bridge_delivery("ops-bridge", &first, &nack).await,
    );
    typed("ack", o.ack_bridge_delivery("ops-bridge", &first).await);
    let ack_many = AckManyBody {
        delivery_ids: vec![first.clone()],
    };
    typed(
        "ackMany",
        o.ack_bridge_deliveries("ops-bridge", &ack_many).await,
    );
    both!(
        "getBridgeSubscription",
        "sub",
        get_bridge_subscription(task, "ops-sub", &[])
    );
    both!(
        "listBridgeSubscriptions",
        "subs",
        list_bridge_subscriptions(task, &[])
    );
    both!(
        "explainBridgeSubscription",
        "explain",
        explain_bridge_subscription(task, "ops-sub", &[])
    );
    ok(
        "unsubscribe",
        o.delete_bridge_subscription(task, "ops-sub").await,
    );

    // The operator's views.
    both!("getOutboxKpis", "kpis", get_outbox_kpis(&[]));
    both!("getSinkHealth", "sinks", get_sink_health());
    both!("getConsumerLag", "lag", get_consumer_lag());
    let projections = ok("projections", o.list_projections(&[]).await);
    let name = projections.projections[0].name.clone();
    ok("verify", o.verify_projection(&name, &[]).await);
    both!("listSources", "sources", list_sources(&[]));
    let missing = o.get_source("no-such-source", &[]).await.unwrap_err();
    assert_eq!(missing.status(), Some(StatusCode::NOT_FOUND), "{missing}");
    typed("cluster", o.get_cluster().await);
    typed("retention", o.run_retention().await);
}

/// A stream told to give up (`give_up_after`, as the CLI's `tail` is) ends with the failure
/// as its last item: at once when the server was never there, and after that many failed
/// reconnects when it went away (`kill -9`) and does not come back; before that, every event.
#[tokio::test]
async fn a_stream_that_gives_up_ends_with_the_failure() {
    let nowhere = Client::new(format!("http://127.0.0.1:{}", free_port()), None).unwrap();
    let mut st = nowhere.stream(StreamOptions::after(0).give_up_after(3));
    let first = st.next().await;
    assert!(matches!(first, Some(Err(Error::Transport(_)))), "{first:?}");
    assert!(st.next().await.is_none(), "the failure is the last item");

    let mut s = Server::start(ServerOpts::default()).await;
    let c = Client::new(s.base(), None).unwrap();
    c.append(vec![ev("give-up", "a", 1), ev("give-up", "a", 2)])
        .await
        .unwrap();
    let mut st = c.stream(StreamOptions::after(0).stream("give-up").give_up_after(2));
    for _ in 0..2 {
        let e = st.next().await.unwrap().unwrap();
        assert_eq!(e.stream, "give-up");
    }
    s.kill9();
    let last = tokio::time::timeout(Duration::from_secs(60), st.next())
        .await
        .expect("gave up within a minute");
    assert!(matches!(last, Some(Err(Error::Transport(_)))), "{last:?}");
    assert!(st.next().await.is_none());
    assert!(st.reconnects() >= 2, "{}", st.reconnects());
}
