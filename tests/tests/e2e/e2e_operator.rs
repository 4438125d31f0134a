//! Nothing an operator does silently harms a receiver (issue 53), against the built binary and
//! real receivers on loopback: a route edited without its secret keeps signing (API and CLI;
//! the console's Edit is driven by the browser test), removing signing is explicit and warned
//! of; a webhook URL's path (a credential for chat incoming webhooks) reaches no answer, event
//! read, stream or log line, for a read-only token or an admin; a claim row has each key once;
//! endpoint trouble reaches the server's log (a WARN per failed attempt, rate-limited per
//! endpoint; an ERROR per park; INFO per circuit change; the 5xx access line's cause); an
//! `env:` unset on the answering node is refused where it is set, and one unset at start holds
//! its route's deliveries (`unresolved`) without spending attempts; a resumed cron source
//! polls at its next scheduled time (`e2e_sources`); a missing reason or field is one error
//! everywhere. And seed 000's last partial: a delivery carries its notification's project,
//! session, destination key and request.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Sha256;
use tidemark_tests::{Server, ServerOpts, random_token, run_cli, sha256_hex};

use crate::common::{
    append_ok, cli_ok, cli_with, notif_ev, post_json, serve_local, wait_for, wait_hit, webhook_id,
};
use crate::e2e_deliveries::wait_status;
use crate::e2e_dispatch::delivery;

/// One POST a receiver got: its headers and its raw body.
type Hit = (HeaderMap, Vec<u8>);

/// A receiver on loopback that answers each POST with the status `answer` holds and keeps what
/// it got; its `/hook/<path>` paths all reach it.
async fn receiver(answer: Arc<std::sync::atomic::AtomicU16>) -> (Arc<Mutex<Vec<Hit>>>, u16) {
    let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
    let h = hits.clone();
    let app = axum::Router::new().fallback(axum::routing::post(
        move |uri: axum::http::Uri, mut headers: HeaderMap, body: axum::body::Bytes| {
            let (h, answer) = (h.clone(), answer.clone());
            async move {
                // The path it was POSTed to, kept beside the headers.
                headers.insert("x-test-path", uri.path().parse().unwrap());
                h.lock().unwrap().push((headers, body.to_vec()));
                StatusCode::from_u16(answer.load(std::sync::atomic::Ordering::SeqCst))
                    .unwrap_or(StatusCode::OK)
            }
        },
    ));
    let port = serve_local(app).await.port();
    (hits, port)
}

fn ok_receiver() -> Arc<std::sync::atomic::AtomicU16> {
    Arc::new(std::sync::atomic::AtomicU16::new(200))
}

/// Whether `hit` carries a Standard Webhooks signature under `secret` (its UTF-8 bytes as the
/// key) that verifies, as a receiver that checks every request does.
fn verifies(hit: &Hit, secret: &str) -> bool {
    let (h, body) = hit;
    let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{}.{}.", get("webhook-id"), get("webhook-timestamp")).as_bytes());
    mac.update(body);
    let want = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    get("webhook-signature")
        .split(' ')
        .any(|s| s.strip_prefix("v1,") == Some(want.as_str()))
}

/// The POST of delivery `id`, waited for.
async fn posted(hits: &Arc<Mutex<Vec<Hit>>>, id: &str) -> Hit {
    wait_hit(hits, &format!("the POST of {id}"), |(h, _)| {
        webhook_id(h) == id
    })
    .await
}

fn urgent(id: &str) -> Value {
    notif_ev(
        id,
        json!({"priority": "urgent", "title": format!("title of {id}"), "recipient": "ops@example.org"}),
    )
}

async fn put(s: &Server, name: &str, body: &Value) -> tidemark_tests::Reply {
    s.send(
        s.request(reqwest::Method::PUT, &format!("/v1/routes/{name}"))
            .json(body),
    )
    .await
}

/// A route changed without `secret` keeps its secret and its rotation (spec section 4): a
/// receiver that verifies every signature keeps accepting across edits through the API and
/// the CLI; no `previous_secret_until` is answered, since no secret changed; removing signing
/// is an explicit `"secret": null`, answered with a warning. (At `92ab91a` the first edit
/// turned signing off.)
#[tokio::test]
async fn an_edited_route_keeps_signing_until_signing_is_removed() {
    let (hits, port) = receiver(ok_receiver()).await;
    let s = Server::start(ServerOpts::default()).await;
    let secret = tidemark_tests::secret(random_token(32));
    let url = format!("http://127.0.0.1:{port}/hook");
    let r = put(
        &s,
        "rot2",
        &json!({"route": {"sink": "webhook", "url": url, "secret": secret, "priorities": ["urgent"]},
                "reason": "a signed endpoint"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    append_ok(&s, &urgent("ed-1")).await;
    assert!(verifies(&posted(&hits, "dlv:ed-1:rot2").await, &secret));

    // The console's Edit → Save sends this: the same url, new priorities, no secret.
    let r = put(
        &s,
        "rot2",
        &json!({"route": {"sink": "webhook", "url": url, "priorities": ["urgent", "action"]},
                "reason": "also action"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["route"]["secret"], "***", "{}", r.text);
    assert_eq!(r.json["route"]["priorities"], json!(["urgent", "action"]));
    assert!(
        r.json.get("previous_secret_until").is_none(),
        "no secret changed: {}",
        r.text
    );
    assert!(r.json.get("warnings").is_none(), "{}", r.text);
    append_ok(&s, &urgent("ed-2")).await;
    assert!(
        verifies(&posted(&hits, "dlv:ed-2:rot2").await, &secret),
        "an edit without a secret turned signing off"
    );

    // The CLI sets the keys its flags name and keeps the others.
    let set = "routes set rot2 --priority urgent --type ops -o json";
    let out = cli_with(s.base(), set, &["--reason", "only ops"]).await;
    cli_ok(&out, set);
    let mut typed = urgent("ed-3");
    typed["payload"]["type"] = json!("ops");
    append_ok(&s, &typed).await;
    assert!(verifies(&posted(&hits, "dlv:ed-3:rot2").await, &secret));

    // What `GET` shows, sent back as it is (`"secret": "***"`, the URL by host and port):
    // the route keeps its secret and its URL.
    let shown = s.get("/v1/routes/rot2").await.json["route"].clone();
    assert_eq!(shown["secret"], "***", "{shown}");
    let r = put(
        &s,
        "rot2",
        &json!({"route": shown, "reason": "sent back as read"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    append_ok(&s, &typed_with(&urgent("ed-rt"), "ops")).await;
    let hit = posted(&hits, "dlv:ed-rt:rot2").await;
    assert!(
        verifies(&hit, &secret),
        "a round trip through GET lost the secret"
    );
    assert_eq!(
        hit.0["x-test-path"], "/hook",
        "a round trip through GET lost the URL's path"
    );
    // A secret of "***" for a route that has none is refused: it is how a secret is shown.
    let r = put(
        &s,
        "fresh-hook",
        &json!({"route": {"sink": "webhook", "url": url, "secret": "***"}, "reason": "x"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 422, "{}", r.text);
    assert_eq!(r.json["code"], "invalid_route", "{}", r.text);

    // Removing signing is explicit and warned of; then no signature is sent.
    let r = put(
        &s,
        "rot2",
        &json!({"route": {"secret": null}, "reason": "the receiver no longer verifies"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let warnings = r.json["warnings"].as_array().expect("warnings").clone();
    assert_eq!(warnings.len(), 1, "{}", r.text);
    assert!(
        warnings[0].as_str().unwrap().contains("no longer signs"),
        "{}",
        r.text
    );
    assert!(r.json["route"].get("secret").is_none(), "{}", r.text);
    assert!(r.json.get("previous_secret_until").is_none(), "{}", r.text);
    append_ok(&s, &typed_with(&urgent("ed-4"), "ops")).await;
    let (h, _) = posted(&hits, "dlv:ed-4:rot2").await;
    assert!(h.get("webhook-signature").is_none() && h.get("tidemark-signature").is_none());
    // A key given as null is removed; the route kept the rest.
    let r = s.get("/v1/routes/rot2").await;
    assert_eq!(r.json["route"]["types"], json!(["ops"]), "{}", r.text);
    assert!(
        s.stderr().contains("no longer signs"),
        "the warning is logged"
    );
}

/// An edit made while a rotation overlaps keeps the rotation (spec section 4): both secrets
/// still sign every POST, and the edit's answer names the same `previous_secret_until` as the
/// rotation's (an edit restarts no overlap); the CLI's `--no-signing` removes signing, warns
/// of it on stderr, and ends the rotation too (removing signing is not a rotation).
#[tokio::test]
async fn an_edit_during_a_rotation_keeps_it_and_no_signing_removes_it_with_a_warning() {
    let (hits, port) = receiver(ok_receiver()).await;
    let s = Server::start(ServerOpts::default()).await;
    let (old, new) = (
        tidemark_tests::secret(random_token(32)),
        tidemark_tests::secret(random_token(32)),
    );
    let url = format!("http://127.0.0.1:{port}/hook");
    let r = put(
        &s,
        "rot3",
        &json!({"route": {"sink": "webhook", "url": url, "secret": old, "priorities": ["urgent"]},
                "reason": "a signed endpoint"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = put(
        &s,
        "rot3",
        &json!({"route": {"secret": new}, "reason": "rotate the secret"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let until = r.json["previous_secret_until"].clone();
    assert!(until.is_string(), "a rotation names its end: {}", r.text);
    append_ok(&s, &urgent("rt-1")).await;
    let hit = posted(&hits, "dlv:rt-1:rot3").await;
    assert!(verifies(&hit, &old) && verifies(&hit, &new), "{:?}", hit.0);

    // An edit during the overlap, without a secret: the rotation goes on, as it was.
    let r = put(
        &s,
        "rot3",
        &json!({"route": {"priorities": ["urgent", "action"]}, "reason": "also action"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["route"]["priorities"], json!(["urgent", "action"]));
    assert_eq!(
        r.json["previous_secret_until"], until,
        "an edit restarted or ended the overlap: {}",
        r.text
    );
    assert!(r.json.get("warnings").is_none(), "{}", r.text);
    append_ok(&s, &urgent("rt-2")).await;
    let hit = posted(&hits, "dlv:rt-2:rot3").await;
    assert!(
        verifies(&hit, &old) && verifies(&hit, &new),
        "an edit during the overlap dropped a signature: {:?}",
        hit.0
    );
    let shown = s.get("/v1/routes/rot3").await;
    assert_eq!(shown.json["previous_secret_until"], until, "{}", shown.text);

    // The CLI removes signing only when told to, and warns of it.
    let why = "the receiver no longer verifies";
    let out = cli_with(
        s.base(),
        "routes set rot3 --no-signing -o json",
        &["--reason", why],
    )
    .await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning:") && stderr.contains("no longer signs"),
        "{stderr}"
    );
    let answer = tidemark_tests::strict_json(stdout.trim()).expect("the route as JSON");
    assert!(answer["route"].get("secret").is_none(), "{answer}");
    assert!(answer.get("previous_secret_until").is_none(), "{answer}");
    assert_eq!(answer["route"]["priorities"], json!(["urgent", "action"]));
    append_ok(&s, &urgent("rt-3")).await;
    let (h, _) = posted(&hits, "dlv:rt-3:rot3").await;
    assert!(
        h.get("webhook-signature").is_none() && h.get("tidemark-signature").is_none(),
        "{h:?}"
    );
}

fn typed_with(ev: &Value, ty: &str) -> Value {
    let mut ev = ev.clone();
    ev["payload"]["type"] = json!(ty);
    ev
}

/// A webhook URL is a credential (spec section 17): for Slack-, Teams- and Discord-style
/// incoming webhooks the path is the token. Every answer, event read and stream shows a
/// route's or a bridge subscription's URL by scheme, host and port, for a read-only token and
/// for an admin alike, and no log line carries the path (registered with the log scanner).
/// A route's header values (an API key, a bearer token) are credentials as well: `GET
/// /v1/routes` shows them as `"***"`, and so does every event read and stream of its
/// `route.updated` (they once served them as given).
#[tokio::test]
async fn a_webhook_urls_path_reaches_no_reader() {
    let (_hits, port) = receiver(ok_receiver()).await;
    let (admin, viewer) = (random_token(24), random_token(24));
    let config = format!(
        "[[auth.tokens]]\nname = \"admin\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n\n\
         [[auth.tokens]]\nname = \"viewer\"\nsha256 = \"{}\"\nscopes = [\"read\"]\n",
        sha256_hex(&admin),
        sha256_hex(&viewer)
    );
    let mut s = Server::start(
        ServerOpts::default()
            .config(config)
            .env("TM_HDR_TEAM", "team-a"),
    )
    .await;
    s.set_token(Some(&admin));
    let route_path = tidemark_tests::secret(format!("/services/T000/B000/{}", random_token(24)));
    let sub_path = tidemark_tests::secret(format!("/bridge/{}", random_token(24)));
    let route_url = format!("http://127.0.0.1:{port}{route_path}");
    let header_value = tidemark_tests::secret(format!("Bearer hdr-{}", random_token(24)));
    let r = put(
        &s,
        "chat",
        &json!({"route": {"sink": "webhook", "url": route_url, "priorities": ["urgent"],
                          "headers": {"Authorization": header_value, "X-Team": "env:TM_HDR_TEAM"}},
                "reason": "a chat channel"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(!r.text.contains(header_value.as_str()), "the PUT's answer");
    append_ok(
        &s,
        &json!({"stream": "task_events", "subject": "u-task", "type": "task.created",
                "payload": {"project_id": "p"}}),
    )
    .await;
    let r = post_json(
        &s,
        "/v1/tasks/u-task/notifications/bridges",
        &json!({"subscription_id": "u-sub", "bridge_id": "b", "sink": {"kind": "webhook",
                 "url": format!("http://127.0.0.1:{port}{sub_path}")}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    append_ok(&s, &urgent("u-1")).await;
    wait_status(&s, "dlv:u-1:chat", "sent").await;
    let shown = format!("http://127.0.0.1:{port}");

    for token in [&viewer, &admin] {
        s.set_token(Some(token));
        let mut seen = String::new();
        for path in [
            "/v1/events?after_sequence=0&limit=1000",
            "/v1/events?stream=routes",
            "/v1/events?stream=bridges",
            "/v1/routes",
            "/v1/routes/chat",
            "/v1/tasks/u-task/notifications/bridges",
            "/v1/tasks/u-task/notifications/bridges/u-sub",
            "/v1/deliveries/dlv:u-1:chat",
            "/v1/outbox/endpoints",
        ] {
            let r = s.get(path).await;
            assert_eq!(r.status, StatusCode::OK, "GET {path}: {}", r.text);
            seen.push_str(&r.text);
        }
        let mut sse = s.sse("after_sequence=0", None).await.expect("stream");
        let head = s.head().await;
        loop {
            let ev = sse.expect_event(Duration::from_secs(30)).await;
            seen.push_str(&ev.data.to_string());
            if ev.seq() >= head {
                break;
            }
        }
        for secret in [&route_path, &sub_path] {
            assert!(!seen.contains(secret.as_str()), "a URL's path was served");
        }
        assert!(
            !seen.contains(header_value.as_str()),
            "a route's header value was served"
        );
        assert!(
            seen.contains(&shown),
            "the endpoint is shown by host and port"
        );
    }
    let routes = s.read_all("stream=routes").await;
    assert_eq!(
        routes[0]["payload"]["route"]["url"], shown,
        "{:?}",
        routes[0]
    );
    // Every value masked, an `env:` reference too: the event shows which headers are set.
    assert_eq!(
        routes[0]["payload"]["route"]["headers"],
        json!({"Authorization": "***", "X-Team": "***"}),
        "{:?}",
        routes[0]
    );
}

/// A claimed delivery names each key once, `type` among them (strict JSON readers refuse a
/// duplicate key; the harness's reader is one, so no answer of the suite can have one).
#[tokio::test]
async fn a_claimed_delivery_of_a_typed_notification_names_type_once() {
    let s = Server::start(ServerOpts::default()).await;
    let mut ev = urgent("typed-1");
    ev["payload"]["type"] = json!("email");
    ev["payload"]["type_data"] = json!({"template": "welcome"});
    append_ok(&s, &ev).await;
    let rows = wait_for(Duration::from_secs(30), "a delivery to claim", || async {
        let r = post_json(
            &s,
            "/v1/deliveries/claim",
            &json!({"sink": "app", "owner": "w", "limit": 10, "lease_ms": 60000}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let rows = r.json["deliveries"].as_array().cloned().unwrap_or_default();
        (!rows.is_empty()).then_some((rows, r.text))
    })
    .await;
    let (rows, text) = rows;
    assert_eq!(rows[0]["type"], "email", "{text}");
    assert_eq!(rows[0]["type_data"], json!({"template": "welcome"}));
    assert_eq!(text.matches("\"type\":").count(), 1, "{text}");
    let r = s.get("/v1/deliveries?type=email").await;
    assert_eq!(r.text.matches("\"type\":").count(), 1, "{}", r.text);
}

/// Endpoint trouble reaches the server's log (spec sections 17, 18): the first failed
/// attempt of an endpoint is a WARN with its route, endpoint (scheme, host, port), code and
/// cause, the next ones within the minute are counted into one summary line when it answers
/// again; a circuit's opening, probe and close are INFO lines; a park is an ERROR line with
/// its code; a 5xx access line says why; durations print to the microsecond.
#[tokio::test]
async fn endpoint_trouble_reaches_the_servers_log() {
    let answer = Arc::new(std::sync::atomic::AtomicU16::new(503));
    let (_hits, port) = receiver(answer.clone()).await;
    let s = Server::start(ServerOpts::default().config(
        "[notifications.retry]\nbase_delay = \"50ms\"\nmax_delay = \"50ms\"\nmax_attempts = 20\n",
    ))
    .await;
    let r = put(
        &s,
        "flaky",
        &json!({"route": {"sink": "webhook", "url": format!("http://127.0.0.1:{port}/hook"),
                          "priorities": ["urgent"],
                          "circuit": {"failures": 4, "cool_down": "1s"}},
                "reason": "a flaky endpoint"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    append_ok(&s, &urgent("lg-1")).await;
    let endpoints = || async {
        let r = s.get("/v1/outbox/endpoints").await;
        r.json["endpoints"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["route"] == "flaky").cloned())
    };
    wait_for(Duration::from_secs(30), "the circuit open", || async {
        endpoints().await.filter(|e| e["state"] == "open")
    })
    .await;
    answer.store(200, std::sync::atomic::Ordering::SeqCst);
    wait_status(&s, "dlv:lg-1:flaky", "sent").await;
    wait_for(Duration::from_secs(30), "the circuit closed", || async {
        endpoints().await.filter(|e| e["state"] == "ok")
    })
    .await;
    // A permanent failure parks.
    answer.store(404, std::sync::atomic::Ordering::SeqCst);
    append_ok(&s, &urgent("lg-2")).await;
    wait_status(&s, "dlv:lg-2:flaky", "parked").await;
    let log = wait_for(Duration::from_secs(10), "the log lines", || async {
        let log = s.stderr();
        log.contains("delivery parked").then_some(log)
    })
    .await;
    let lines = |what: &str| {
        log.lines()
            .filter(|l| l.contains(what))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let failed = lines("delivery attempt failed");
    assert!(!failed.is_empty(), "no WARN for a failed attempt");
    let first = &failed[0];
    for part in [
        "WARN",
        "route=flaky",
        &format!("endpoint=http://127.0.0.1:{port}"),
        "code=http_503",
        "cause=",
    ] {
        assert!(first.contains(part), "{part:?} missing: {first}");
    }
    // Four failures opened the circuit, the probe's was a fifth at most: the first is logged,
    // the others summed up when the endpoint answered again.
    let lg1 = failed.iter().filter(|l| l.contains("dlv:lg-1")).count();
    assert_eq!(lg1, 1, "one line per endpoint per minute: {failed:#?}");
    let summary = lines("more failed attempts before this endpoint answered again");
    assert_eq!(summary.len(), 1, "{log}");
    for what in [
        "endpoint circuit opened",
        "endpoint circuit probing",
        "endpoint circuit closed",
    ] {
        let l = lines(what);
        assert!(
            l.iter().any(|l| l.contains("INFO") && l.contains("flaky")),
            "{what}: {l:?}"
        );
    }
    let parked = lines("delivery parked");
    assert!(
        parked
            .iter()
            .any(|l| l.contains("ERROR") && l.contains("dlv:lg-2:flaky") && l.contains("http_404")),
        "{parked:?}"
    );
    // Durations to the microsecond: no float noise in the access log.
    for l in lines("duration_ms=") {
        let ms = l
            .split("duration_ms=")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        let decimals = ms.split('.').nth(1).map_or(0, str::len);
        assert!(decimals <= 3, "{l}");
    }

    // A 507 (the free-space reserve) names its cause on the access line.
    let full =
        Server::start(ServerOpts::default().config("[log]\nmin_free = \"1000000GB\"\n")).await;
    let (code, body) = full.append(&json!({"stream": "s", "type": "t.x"})).await;
    assert_eq!(code.as_u16(), 507, "{body}");
    let line = wait_for(Duration::from_secs(10), "the 507 access line", || async {
        full.stderr()
            .lines()
            .find(|l| l.contains("request failed") && l.contains("status=507"))
            .map(str::to_owned)
    })
    .await;
    assert!(!line.contains("error=\"\""), "{line}");
    assert!(line.contains("free"), "{line}");
}

/// An endpoint that keeps failing and never answers again still has its failures counted in
/// the log: the first in full, the others of the period in one WARN line when the period ends
/// (a minute; `TIDEMARK_FAULT_FAILURE_LOG_PERIOD_MS` shortens it for this test), with the
/// route, endpoint, count and last code. Every failed attempt is in exactly one line.
#[tokio::test]
async fn failures_of_an_endpoint_that_never_recovers_are_summed_up_per_period() {
    let answer = Arc::new(std::sync::atomic::AtomicU16::new(503));
    let (hits, port) = receiver(answer).await;
    let s = Server::start(
        ServerOpts::default()
            .config(
                "[notifications.retry]\nbase_delay = \"50ms\"\nmax_delay = \"50ms\"\n\
                 max_attempts = 5\n",
            )
            .env("TIDEMARK_FAULT_FAILURE_LOG_PERIOD_MS", "3000"),
    )
    .await;
    let r = put(
        &s,
        "down",
        &json!({"route": {"sink": "webhook", "url": format!("http://127.0.0.1:{port}/hook"),
                          "priorities": ["urgent"]},
                "reason": "an endpoint that is down"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    append_ok(&s, &urgent("pd-1")).await;
    wait_status(&s, "dlv:pd-1:down", "parked").await;
    let attempts = hits.lock().unwrap().len() as u64;
    assert!(attempts >= 2, "{attempts} attempts");
    // Parked: nothing fails any more, so the last period's count comes when it ends.
    wait_for(
        Duration::from_secs(30),
        "the summary at the period's end",
        || async {
            s.stderr()
                .contains("more failed attempts in the last")
                .then_some(())
        },
    )
    .await;
    // Give a second summary (had the attempts spanned two periods) the time to show.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let log = s.stderr();
    let full: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("delivery attempt failed") && l.contains("route=down"))
        .collect();
    let summaries: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("more failed attempts in the last"))
        .collect();
    assert!(!full.is_empty() && !summaries.is_empty(), "{log}");
    for l in &summaries {
        for part in [
            "WARN",
            "route=down",
            &format!("endpoint=http://127.0.0.1:{port}"),
            "last_code=http_503",
            "in the last 3s",
        ] {
            assert!(l.contains(part), "{part:?} missing: {l}");
        }
    }
    let counted: u64 = summaries
        .iter()
        .map(|l| {
            l.split("failures=")
                .nth(1)
                .and_then(|f| f.split(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no failures= count: {l}"))
        })
        .sum();
    assert_eq!(
        full.len() as u64 + counted,
        attempts,
        "each attempt in one line: {full:#?} {summaries:#?}"
    );
}

/// An `env:` reference is said where it is set (spec section 4): a `PUT` naming a variable
/// the answering node lacks is `422 env_unset`, naming it; a route stored while it was set
/// and unset at the next start is listed `unresolved` (metric, endpoint view), its deliveries
/// wait with `held_by: endpoint_unresolved` and spend no attempt, and go once a start finds
/// the variable again.
#[tokio::test]
async fn an_unset_env_is_refused_at_the_put_and_held_at_start() {
    let (hits, port) = receiver(ok_receiver()).await;
    let url = format!("http://127.0.0.1:{port}/hook");
    let mut s = Server::start(ServerOpts::default().env("TM_HOOK_URL", &url)).await;
    let r = put(
        &s,
        "nope",
        &json!({"route": {"sink": "webhook", "url": "env:TM_NOT_SET_ANYWHERE",
                          "secret": "env:TM_ALSO_NOT_SET", "priorities": ["urgent"]},
                "reason": "a typo"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 422, "{}", r.text);
    assert_eq!(r.json["code"], "env_unset", "{}", r.text);
    let detail = r.json["detail"].as_str().unwrap();
    assert!(
        detail.contains("env:TM_NOT_SET_ANYWHERE") && detail.contains("env:TM_ALSO_NOT_SET"),
        "{detail}"
    );
    assert_eq!(s.get("/v1/routes/nope").await.status, StatusCode::NOT_FOUND);

    for name in ["envhook", "envgone"] {
        let r = put(
            &s,
            name,
            &json!({"route": {"sink": "webhook", "url": "env:TM_HOOK_URL", "priorities": ["urgent"]},
                    "reason": "from the environment"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    append_ok(&s, &urgent("env-1")).await;
    wait_status(&s, "dlv:env-1:envhook", "sent").await;
    wait_status(&s, "dlv:env-1:envgone", "sent").await;

    // Restarted without the variable: the route is unresolved, its delivery waits.
    s.set_env("TM_HOOK_URL", None);
    s.sigterm();
    s.wait_exit(Duration::from_secs(30)).await;
    s.restart().await;
    let e = wait_for(
        Duration::from_secs(30),
        "the endpoint unresolved",
        || async {
            let r = s.get("/v1/outbox/endpoints").await;
            r.json["endpoints"]
                .as_array()
                .and_then(|a| a.iter().find(|e| e["route"] == "envhook").cloned())
                .filter(|e| e["state"] == "unresolved")
        },
    )
    .await;
    assert!(
        e["unresolved"]["reason"]
            .as_str()
            .unwrap()
            .contains("env:TM_HOOK_URL"),
        "{e}"
    );
    let metrics = s.get("/metrics").await.text;
    assert_eq!(
        crate::common::metric_sum(
            &metrics,
            "tidemark_endpoint_state{route=\"envhook\",state=\"unresolved\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    // A deleted route has nothing left to resolve: its record is not unresolved any more.
    let r = s
        .send(
            s.request(reqwest::Method::DELETE, "/v1/routes/envgone")
                .json(&json!({"reason": "not needed"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    wait_for(
        Duration::from_secs(30),
        "the deleted route resolved",
        || async {
            let r = s.get("/v1/outbox/endpoints").await;
            r.json["endpoints"]
                .as_array()
                .and_then(|a| a.iter().find(|e| e["route"] == "envgone").cloned())
                .filter(|e| e["state"] != "unresolved")
        },
    )
    .await;
    append_ok(&s, &urgent("env-2")).await;
    let d = wait_for(Duration::from_secs(30), "the held delivery", || async {
        let d = delivery(&s, "dlv:env-2:envhook").await;
        (d["held_by"] == "endpoint_unresolved").then_some(d)
    })
    .await;
    assert_eq!(d["attempts"], 0, "{d}");
    assert_eq!(d["status"], "queued", "{d}");
    // Given the variable again, the next start resolves it and the delivery goes.
    s.set_env("TM_HOOK_URL", Some(&url));
    s.sigterm();
    s.wait_exit(Duration::from_secs(30)).await;
    s.restart().await;
    wait_status(&s, "dlv:env-2:envhook", "sent").await;
    let d = delivery(&s, "dlv:env-2:envhook").await;
    assert_eq!(
        d["attempts"], 1,
        "no attempt was spent while it waited: {d}"
    );
    // env-1 on both routes before the restart, then env-2 on the route left.
    assert_eq!(hits.lock().unwrap().len(), 3);
}

/// A missing reason is `422 reason_required` on every action that needs one, a missing field
/// `422 field_required` naming it: one code for one mistake.
#[tokio::test]
async fn a_missing_reason_or_field_is_one_error_everywhere() {
    let s = Server::start(ServerOpts::default()).await;
    let put_r = put(&s, "x", &json!({"route": {"sink": "app"}})).await;
    let del = s
        .send(
            s.request(reqwest::Method::DELETE, "/v1/routes/x")
                .json(&json!({})),
        )
        .await;
    let resend = post_json(&s, "/v1/deliveries/dlv:a:b/resend", &json!({})).await;
    let recover = post_json(
        &s,
        "/v1/deliveries/recover",
        &json!({"route": "x", "since": "2026-01-01T00:00:00Z"}),
    )
    .await;
    let reset = post_json(
        &s,
        "/v1/cursors/reset",
        &json!({"consumer_id": "c", "stream_name": "s", "last_sequence": 0}),
    )
    .await;
    let list = s
        .send(
            s.request(reqwest::Method::PUT, "/v1/lists/ops")
                .json(&json!({"members": ["a@example.org"]})),
        )
        .await;
    for (what, r) in [
        ("PUT route", &put_r),
        ("DELETE route", &del),
        ("resend", &resend),
        ("recover", &recover),
        ("cursor reset", &reset),
        ("PUT list", &list),
    ] {
        assert_eq!(r.status.as_u16(), 422, "{what}: {}", r.text);
        assert_eq!(r.json["code"], "reason_required", "{what}: {}", r.text);
    }
    // A blank one is the same mistake.
    let r = post_json(
        &s,
        "/v1/cursors/reset",
        &json!({"consumer_id": "c", "stream_name": "s", "last_sequence": 0, "reason": " "}),
    )
    .await;
    assert_eq!(r.json["code"], "reason_required", "{}", r.text);
    let r = post_json(
        &s,
        "/v1/deliveries/recover",
        &json!({"route": "x", "reason": "why"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 422, "{}", r.text);
    assert_eq!(r.json["code"], "field_required", "{}", r.text);
    assert_eq!(r.json["field"], "since", "{}", r.text);
    assert!(r.json["detail"].as_str().unwrap().contains("since"));
    let r = post_json(
        &s,
        "/v1/deliveries/claim",
        &json!({"owner": "w", "limit": 1}),
    )
    .await;
    assert_eq!(r.json["code"], "field_required", "{}", r.text);
    assert_eq!(r.json["field"], "sink", "{}", r.text);
    // A body that is not the declared shape is still malformed.
    let r = post_json(&s, "/v1/deliveries/recover", &json!([1])).await;
    assert_eq!(r.json["code"], "malformed_json", "{}", r.text);
}

/// `/console` is where an operator looks first: it serves the console, as `/` does.
#[tokio::test]
async fn console_serves_the_console() {
    let s = Server::start(ServerOpts::default()).await;
    let (root, alias) = (s.get("/").await, s.get("/console").await);
    assert_eq!(alias.status, StatusCode::OK);
    assert_eq!(alias.text, root.text);
    assert!(
        alias
            .content_type
            .as_deref()
            .is_some_and(|c| c.starts_with("text/html")),
        "{:?}",
        alias.content_type
    );
}

/// A resent delivery is queued again with no lease and no delivery time (its earlier send
/// stays on its timeline).
#[tokio::test]
async fn a_resent_delivery_keeps_no_stale_lease_or_delivery_time() {
    let s = Server::start(ServerOpts::default()).await;
    append_ok(&s, &urgent("rs-1")).await;
    let id = "dlv:rs-1:desktop";
    wait_for(Duration::from_secs(30), "the claim", || async {
        let r = post_json(
            &s,
            "/v1/deliveries/claim",
            &json!({"sink": "app", "owner": "w1", "limit": 1, "lease_ms": 60000}),
        )
        .await;
        (r.json["deliveries"]
            .as_array()
            .is_some_and(|a| !a.is_empty()))
        .then_some(())
    })
    .await;
    let r = post_json(
        &s,
        &format!("/v1/deliveries/{id}/complete"),
        &json!({"owner": "w1"}),
    )
    .await;
    assert_eq!(r.json["status"], "sent", "{}", r.text);
    assert!(r.json["delivered_at"].is_string());
    let r = post_json(
        &s,
        &format!("/v1/deliveries/{id}/resend"),
        &json!({"reason": "the receiver lost it"}),
    )
    .await;
    assert_eq!(r.json["status"], "queued", "{}", r.text);
    assert_eq!(r.json["lease_owner"], Value::Null, "{}", r.text);
    assert_eq!(r.json["lease_expires_at"], Value::Null, "{}", r.text);
    assert_eq!(r.json["delivered_at"], Value::Null, "{}", r.text);
    let d = delivery(&s, id).await;
    assert_eq!(d["lease_owner"], Value::Null, "{d}");
    assert_eq!(d["delivered_at"], Value::Null, "{d}");
    let steps: Vec<&str> = d["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["event"].as_str().unwrap())
        .collect();
    assert!(
        steps.contains(&"sent") && steps.contains(&"resent"),
        "{steps:?}"
    );
}

/// Seed 000's delivery row: each delivery carries its notification's `project_id`,
/// `session_id`, `destination_key` and `request_json`, in the claim a desktop app makes and on
/// `GET /v1/deliveries/{id}`, as the status record does; never on a redacted delivery (its
/// claim, read and list row carry none of them); a `request_json` that is not an object is
/// refused.
#[tokio::test]
async fn a_delivery_carries_its_notifications_project_session_and_request() {
    let s = Server::start(ServerOpts::default()).await;
    let mut ev = urgent("s0-1");
    for (k, v) in [
        ("project_id", json!("proj-7")),
        ("session_id", json!("sess-42")),
        ("destination_key", json!("desk:ana-laptop")),
        (
            "request_json",
            json!({"sound": "chime", "actions": ["open"]}),
        ),
    ] {
        ev["payload"][k] = v;
    }
    append_ok(&s, &ev).await;
    let rows = wait_for(Duration::from_secs(30), "the claim", || async {
        let r = post_json(
            &s,
            "/v1/deliveries/claim",
            &json!({"sink": "app", "owner": "desk", "limit": 1, "lease_ms": 60000}),
        )
        .await;
        r.json["deliveries"]
            .as_array()
            .filter(|a| !a.is_empty())
            .cloned()
    })
    .await;
    let want = |d: &Value| {
        assert_eq!(d["project_id"], "proj-7", "{d}");
        assert_eq!(d["session_id"], "sess-42", "{d}");
        assert_eq!(d["destination_key"], "desk:ana-laptop", "{d}");
        assert_eq!(
            d["request_json"],
            json!({"sound": "chime", "actions": ["open"]}),
            "{d}"
        );
    };
    want(&rows[0]);
    want(&delivery(&s, "dlv:s0-1:desktop").await);
    let rec = s.get("/v1/notifications/s0-1").await;
    assert_eq!(
        rec.json["notification"]["session_id"], "sess-42",
        "{}",
        rec.text
    );
    let mut bad = urgent("s0-2");
    bad["payload"]["request_json"] = json!("not an object");
    let (code, body) = s.append(&bad).await;
    assert_eq!(code.as_u16(), 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("request_json"),
        "{body}"
    );

    // A redacted route's delivery carries none of them (spec section 14: no content of the
    // notification), in the claim, the delivery read or the list.
    let key = tidemark_tests::secret(format!("privacy-{}", random_token(16)));
    let r = Server::start(
        ServerOpts::default()
            .config(
                "[notifications.routes.desktop]\nredact = true\n\
                 generic_title = \"You have a message\"\n\
                 [privacy]\nhmac_key = \"env:TM_TEST_PRIVACY_KEY\"\n",
            )
            .env("TM_TEST_PRIVACY_KEY", key),
    )
    .await;
    append_ok(&r, &ev).await;
    let rows = wait_for(Duration::from_secs(30), "the redacted claim", || async {
        let c = post_json(
            &r,
            "/v1/deliveries/claim",
            &json!({"sink": "app", "owner": "desk", "limit": 1, "lease_ms": 60000}),
        )
        .await;
        c.json["deliveries"]
            .as_array()
            .filter(|a| !a.is_empty())
            .cloned()
    })
    .await;
    let id = rows[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(rows[0]["redacted"], true, "{}", rows[0]);
    let list = r.get("/v1/deliveries?limit=100").await.json["deliveries"].clone();
    for d in [rows[0].clone(), delivery(&r, &id).await, list[0].clone()] {
        for k in [
            "project_id",
            "session_id",
            "destination_key",
            "request_json",
        ] {
            assert!(d.get(k).is_none(), "a redacted delivery carries {k}: {d}");
        }
        let text = d.to_string();
        for v in ["proj-7", "sess-42", "desk:ana-laptop", "chime"] {
            assert!(!text.contains(v), "{v} on a redacted delivery: {d}");
        }
    }
}

/// What the help and the reference say is what the binary does (issue 53): `tidemark backup`
/// writes into a directory on the machine that runs it (the server streams it), and a `cron`
/// the poller cannot read says the form it wants.
#[tokio::test]
async fn the_help_and_the_errors_say_what_to_do() {
    let out = run_cli(&["backup", "--help"], "", Duration::from_secs(30)).await;
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("on this machine"), "{help}");
    assert!(
        !help.contains("the directory is on the server's machine"),
        "{help}"
    );
    let toml = "[[sources]]\nname = \"c\"\nurl = \"http://127.0.0.1:9/x\"\ncron = \"every day\"\n\
                [sources.watermark]\nrequest_field = \"a\"\nnext = \"/n\"\nhas_more = \"/m\"\n\
                [sources.items]\npath = \"/d\"\nid = \"/id\"\n";
    let err = crate::common::refused_start(toml, &[]);
    assert!(
        err.contains("sources.c.cron")
            && err.contains("minute hour day-of-month month day-of-week"),
        "{err}"
    );
}
