//! The dispatcher (spec section 17) against the built binary, a real SMTP server
//! (`tests/smtp/server.py`: aiosmtpd on loopback, scripted by the recipient's local part:
//! `tempfail<N>-` answers 451 N times, `permfail-` 550, `hang-` never answers DATA, `hang1-`
//! only the first time) and a real HTTP receiver. tidemark delivers the `email` and `webhook`
//! routes itself: one message per delivery with a `Message-ID` derived from the delivery id
//! (the same on a retry), `resolved_targets` on the sent delivery, SMTP 4xx and timeouts
//! retried, 5xx parked with the SMTP code; a hanging SMTP server holds only the email sink; a
//! dispatcher killed mid-send sends after its restart; webhook URLs and secrets stay out of
//! the log and the answers.

use std::path::Path;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Server, ServerOpts, encode_path};

use crate::common::{append_ok, notif_ev, serve_local, wait_for};
use crate::e2e_deliveries::{claim, wait_status};

/// The SMTP server of `tests/smtp/server.py` under a directory of its own; killed when
/// dropped (and it exits by itself when this test process ends).
struct Smtp {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
}

impl Smtp {
    fn start() -> Smtp {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/smtp/server.py");
        let child = Command::new("python3")
            .arg(script)
            .arg(dir.path())
            .arg(std::process::id().to_string())
            .spawn()
            .expect("python3 tests/smtp/server.py (pip install -r tests/smtp/requirements.txt)");
        let port_file = dir.path().join("port");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file)
                && let Ok(p) = p.trim().parse()
            {
                break p;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the SMTP server did not start (is aiosmtpd installed? tests/smtp/requirements.txt)"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        Smtp { dir, child, port }
    }

    /// Every message it accepted, in order.
    fn messages(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("messages.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    fn to(&self, address: &str) -> Vec<Value> {
        self.messages()
            .into_iter()
            .filter(|m| {
                m["rcpt_tos"]
                    .as_array()
                    .is_some_and(|r| r.contains(&json!(address)))
            })
            .collect()
    }
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP receiver recording each POST's headers and body; answers 200.
pub(crate) async fn receiver() -> (Arc<Mutex<Vec<(axum::http::HeaderMap, Value)>>>, u16) {
    let hits: Arc<Mutex<Vec<(axum::http::HeaderMap, Value)>>> = Arc::default();
    let h = hits.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let h = h.clone();
                async move {
                    let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    h.lock().unwrap().push((headers, v));
                    StatusCode::OK
                }
            },
        ),
    );
    let port = serve_local(app).await.port();
    (hits, port)
}

/// What tidemark's outgoing requests and mail name themselves.
pub(crate) const USER_AGENT: &str = concat!("tidemark/", env!("CARGO_PKG_VERSION"));

const HOOK_SECRET: &str = "whsec-dispatch-test-7c1d";

fn config(smtp: u16, hook: u16, extra: &str) -> String {
    format!(
        r#"
[notifications.routing]
urgent = ["dashboard", "desktop", "email", "hook"]
action = ["dashboard", "desktop"]
[notifications.retry]
lease_ttl = "3s"
[notifications.routes.email]
sink = "email"
[notifications.routes.email.retry]
strategy = "fixed"
base_delay = "200ms"
max_attempts = 5
jitter = 0.0
[notifications.routes.hook]
sink = "webhook"
url = "http://127.0.0.1:{hook}/hook"
secret = "env:TEST_HOOK_SECRET"
[sinks.email]
url = "smtp://127.0.0.1:{smtp}"
from = "tidemark <noreply@example.org>"
timeout = "2s"
concurrency = 1
{extra}
"#
    )
}

async fn start(smtp: &Smtp, hook: u16) -> Server {
    Server::start(
        ServerOpts::default()
            .config(config(smtp.port, hook, ""))
            .env("TEST_HOOK_SECRET", HOOK_SECRET),
    )
    .await
}

fn urgent(id: &str, recipient: &str) -> Value {
    notif_ev(
        id,
        json!({"priority": "urgent", "title": format!("title of {id}"), "body": "the body",
               "recipient": recipient}),
    )
}

/// `GET /v1/deliveries/{id}` (null while the router has not made it yet).
pub(crate) async fn delivery(s: &Server, id: &str) -> Value {
    let r = s.get(&format!("/v1/deliveries/{}", encode_path(id))).await;
    if r.status == StatusCode::NOT_FOUND {
        return Value::Null;
    }
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json
}

/// An email and a webhook route delivered by tidemark: one message with the delivery's
/// `Message-ID`, one signed POST, `resolved_targets` on both; 451 then success is retried and
/// sent with the same `Message-ID`; 550 parks with the SMTP code; an address that is not one
/// parks `invalid_recipient`; the webhook URL and secret are nowhere in the log or answers.
#[tokio::test]
async fn email_and_webhook_routes_are_delivered_by_tidemark() {
    let smtp = Smtp::start();
    let (hits, hook) = receiver().await;
    let s = start(&smtp, hook).await;
    append_ok(
        &s,
        &json!({"events": [
            urgent("d-ok", "ana@example.org"),
            urgent("d-temp", "tempfail1-bo@example.org"),
            urgent("d-perm", "permfail-cy@example.org"),
            urgent("d-bad", "not an address"),
        ]}),
    )
    .await;
    // Sent, to whom, with which Message-ID.
    let d = wait_status(&s, "dlv:d-ok:email", "sent").await;
    assert_eq!(d["resolved_targets"], json!(["ana@example.org"]), "{d}");
    let m = smtp.to("ana@example.org");
    assert_eq!(m.len(), 1, "one message: {m:?}");
    assert_eq!(m[0]["message_id"], "<dlv=3Ad-ok=3Aemail@tidemark>");
    assert_eq!(m[0]["subject"], "title of d-ok");
    assert_eq!(m[0]["mail_from"], "noreply@example.org");
    // The mailer names itself and its release, as the webhook's User-Agent does.
    assert_eq!(m[0]["x_mailer"], json!(USER_AGENT), "{m:?}");
    let data = m[0]["data"].as_str().unwrap();
    assert!(
        data.contains("text/plain") && data.contains("text/html"),
        "{data}"
    );
    assert!(data.contains("the body"), "{data}");
    // The plain-text part says what the HTML part says: the title first (a notification
    // without a body is not an empty message), then the body.
    let plain = data
        .split("text/plain")
        .nth(1)
        .and_then(|p| p.split("text/html").next())
        .unwrap_or_default();
    assert!(
        plain.contains("title of d-ok") && plain.contains("the body"),
        "the plain-text part: {plain}"
    );
    // A 451 first: retried, then sent (two attempts), the message as the first would be.
    let d = wait_status(&s, "dlv:d-temp:email", "sent").await;
    assert_eq!(d["attempts"], 2, "{d}");
    let full = delivery(&s, "dlv:d-temp:email").await;
    let codes: Vec<Value> = full["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["error_code"].clone())
        .collect();
    assert!(codes.contains(&json!("smtp_451")), "{full}");
    let m = smtp.to("tempfail1-bo@example.org");
    assert_eq!(m.len(), 1);
    assert_eq!(m[0]["message_id"], "<dlv=3Ad-temp=3Aemail@tidemark>");
    // A 550: parked with the SMTP code; an address that is not one: parked too.
    let d = wait_status(&s, "dlv:d-perm:email", "parked").await;
    assert_eq!(d["last_error_code"], "smtp_550", "{d}");
    let d = wait_status(&s, "dlv:d-bad:email", "parked").await;
    assert_eq!(d["last_error_code"], "invalid_recipient", "{d}");
    // The webhook: one signed POST per delivery, its endpoint as the resolved target.
    let d = wait_status(&s, "dlv:d-ok:hook", "sent").await;
    assert_eq!(
        d["resolved_targets"],
        json!([format!("http://127.0.0.1:{hook}")]),
        "{d}"
    );
    for id in ["d-temp", "d-perm", "d-bad"] {
        wait_status(&s, &format!("dlv:{id}:hook"), "sent").await;
    }
    {
        let hits = hits.lock().unwrap();
        let (headers, body) = hits
            .iter()
            .find(|(h, _)| h.get("webhook-id").is_some_and(|v| v == "dlv:d-ok:hook"))
            .expect("the POST of dlv:d-ok:hook");
        assert_eq!(body["delivery_id"], "dlv:d-ok:hook");
        assert_eq!(body["title"], "title of d-ok");
        assert_eq!(headers["user-agent"], USER_AGENT, "{headers:?}");
        let ts: u64 = headers["webhook-timestamp"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let body_bytes = serde_json::to_vec(body).unwrap();
        let _ = body_bytes;
        assert!(
            headers["webhook-signature"]
                .to_str()
                .unwrap()
                .starts_with("v1,")
        );
        assert!(ts > 0);
        let ids: Vec<&str> = hits
            .iter()
            .filter_map(|(h, _)| h.get("webhook-id").and_then(|v| v.to_str().ok()))
            .collect();
        let unique: std::collections::HashSet<&&str> = ids.iter().collect();
        assert_eq!(
            unique.len(),
            ids.len(),
            "a webhook delivery POSTed twice: {ids:?}"
        );
    }
    // Each route's endpoint (section 17) counts its attempts from the log: the email route
    // five (one retried), two sent; the webhook four, all sent. Neither circuit opened.
    let eps = wait_for(Duration::from_secs(30), "the endpoints counted", || async {
        let r = s.get("/v1/outbox/endpoints").await;
        let eps = r.json["endpoints"].as_array().cloned().unwrap_or_default();
        let of = |route: &str| eps.iter().find(|e| e["route"] == route).cloned();
        match (of("email"), of("hook")) {
            (Some(e), Some(h)) if e["attempts"] == 5 && h["attempts"] == 4 => Some((e, h)),
            _ => None,
        }
    })
    .await;
    let (email, hook_ep) = eps;
    assert_eq!(
        (email["sink"].as_str(), email["successes"].as_u64()),
        (Some("email"), Some(2)),
        "{email}"
    );
    assert!(
        ["smtp_451", "smtp_550", "invalid_recipient"]
            .contains(&email["last_failure_code"].as_str().unwrap_or("")),
        "{email}"
    );
    assert!(
        ["ok", "failing"].contains(&email["state"].as_str().unwrap_or("")),
        "{email}"
    );
    assert_eq!(
        (hook_ep["state"].as_str(), hook_ep["successes"].as_u64()),
        (Some("ok"), Some(4)),
        "{hook_ep}"
    );
    assert!(
        s.read_all("stream=endpoints").await.is_empty(),
        "no circuit moved"
    );
    // The app sink is untouched: its desktop deliveries wait for an app.
    let rows = claim(&s, "app-1", 10, 60_000).await;
    assert_eq!(rows.len(), 4, "the desktop deliveries are the app's");
    // No secret in the log or the answers.
    let all = s.read_all("").await;
    let text = serde_json::to_string(&all).unwrap();
    assert!(
        !text.contains(HOOK_SECRET),
        "the webhook secret is in the log"
    );
    assert!(
        !text.contains(&format!("127.0.0.1:{hook}/hook")),
        "the webhook URL is in the log"
    );
    let r = s.get("/v1/deliveries?limit=100").await;
    assert!(
        !r.text.contains(HOOK_SECRET) && !r.text.contains("/hook\""),
        "{}",
        r.text
    );
}

/// The lines of the server's log that contain `what`.
fn log_lines(s: &Server, what: &str) -> Vec<String> {
    s.stderr()
        .lines()
        .filter(|l| l.contains(what))
        .map(str::to_owned)
        .collect()
}

/// A failed email attempt reaches the server's log as a failed webhook's does (spec section
/// 17, issue 53): the first of the SMTP server's a WARN with its route, endpoint (scheme,
/// host and port), delivery, code and the server's own words; the next within the minute
/// counted into one line when it answers again; a 5xx an ERROR `delivery parked`.
#[tokio::test]
async fn a_failed_email_attempt_is_logged_with_its_cause() {
    let smtp = Smtp::start();
    let (_hits, hook) = receiver().await;
    let s = start(&smtp, hook).await;
    append_ok(&s, &urgent("ew-1", "tempfail2-ew@example.org")).await;
    let d = wait_status(&s, "dlv:ew-1:email", "sent").await;
    assert_eq!(d["attempts"], 3, "two 451s, then sent: {d}");
    append_ok(&s, &urgent("ew-2", "permfail-ew@example.org")).await;
    wait_status(&s, "dlv:ew-2:email", "parked").await;
    let parked = wait_for(Duration::from_secs(10), "the park's line", || async {
        let l = log_lines(&s, "delivery parked");
        (!l.is_empty()).then_some(l)
    })
    .await;
    let failed: Vec<String> = log_lines(&s, "delivery attempt failed")
        .into_iter()
        .filter(|l| l.contains("sink=email"))
        .collect();
    let first = failed
        .iter()
        .find(|l| l.contains("dlv:ew-1:email"))
        .unwrap_or_else(|| panic!("no WARN for the first 451: {failed:#?}"));
    for part in [
        "WARN",
        "route=email",
        &format!("endpoint=smtp://127.0.0.1:{}", smtp.port),
        "delivery=dlv:ew-1:email",
        "code=smtp_451",
        "kind=\"transient\"",
        "try again later (scripted)",
    ] {
        assert!(first.contains(part), "{part:?} missing: {first}");
    }
    assert_eq!(
        failed.iter().filter(|l| l.contains("dlv:ew-1")).count(),
        1,
        "the second 451 is counted, not logged: {failed:#?}"
    );
    let summary = log_lines(
        &s,
        "more failed attempts before this endpoint answered again",
    );
    assert!(
        summary
            .iter()
            .any(|l| l.contains("route=email") && l.contains("failures=1")),
        "{summary:#?}"
    );
    assert!(
        parked.iter().any(|l| l.contains("ERROR")
            && l.contains("dlv:ew-2:email")
            && l.contains("smtp_550")
            && l.contains("no such user (scripted)")),
        "{parked:#?}"
    );
}

/// A notification without a body is not an empty email (issue 53): the plain-text part says
/// its title, as the HTML part does.
#[tokio::test]
async fn an_email_without_a_body_has_its_title_as_text() {
    let smtp = Smtp::start();
    let (_hits, hook) = receiver().await;
    let s = start(&smtp, hook).await;
    append_ok(
        &s,
        &notif_ev(
            "nb-1",
            json!({"priority": "urgent", "title": "title of nb-1", "recipient": "nb@example.org"}),
        ),
    )
    .await;
    wait_status(&s, "dlv:nb-1:email", "sent").await;
    let m = smtp.to("nb@example.org");
    assert_eq!(m.len(), 1, "{m:?}");
    let data = m[0]["data"].as_str().unwrap();
    // The text/plain part's content: after its headers, up to the next boundary.
    let plain = data
        .split("text/plain")
        .nth(1)
        .and_then(|p| p.split_once("\r\n\r\n"))
        .map(|(_, body)| body.split("\r\n--").next().unwrap_or_default().trim())
        .unwrap_or_else(|| panic!("no text/plain part: {data}"));
    assert!(!plain.is_empty(), "an empty plain-text part: {data}");
    assert!(
        plain.contains("title of nb-1"),
        "the plain-text part: {plain:?}"
    );
}

/// Context switches (voluntary and not) of each thread of process `pid` so far, by thread id
/// and name.
fn switches(pid: u32) -> std::collections::BTreeMap<(String, String), u64> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc") {
        let task = task.unwrap().path();
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        let mut n = 0;
        let mut name = String::new();
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("Name:") {
                name = v.trim().to_owned();
            }
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n += v.trim().parse::<u64>().unwrap();
            }
        }
        let tid = task.file_name().unwrap().to_string_lossy().into_owned();
        out.insert((tid, name), n);
    }
    out
}

/// A server at rest is not woken (spec section 3), with tidemark's own sinks configured too:
/// once the deliveries are sent, the dispatcher sleeps until a delivery is due or a page may
/// make one due, instead of asking for due deliveries twice a second. A delivery appended
/// afterwards is still sent at once, and one due later at its due time.
#[tokio::test]
async fn a_server_with_sinks_at_rest_is_not_woken() {
    let smtp = Smtp::start();
    let (_hits, hook) = receiver().await;
    let s = start(&smtp, hook).await;
    append_ok(&s, &urgent("rest-1", "ana@example.org")).await;
    wait_status(&s, "dlv:rest-1:email", "sent").await;
    wait_status(&s, "dlv:rest-1:hook", "sent").await;
    // Settle (the reports of the sends, the lease-expiry loop's last look, the follower's last
    // page: slower on a loaded machine) until a second passes with at most 2 switches, then
    // watch. The dispatcher of before asked each sink every 500 ms: 2 sinks, 6 s, 24 claims
    // at least, each waking a worker and the decider (about 200 switches in 10 s measured).
    let total = |m: &std::collections::BTreeMap<(String, String), u64>| m.values().sum::<u64>();
    for _ in 0..30 {
        let a = total(&switches(s.pid()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        if total(&switches(s.pid())) - a <= 2 {
            break;
        }
    }
    let before = switches(s.pid());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = switches(s.pid());
    let by_thread: Vec<(&(String, String), u64)> = after
        .iter()
        .map(|(t, n)| (t, n - before.get(t).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let woken: u64 = by_thread.iter().map(|(_, n)| n).sum();
    // At rest it measures 2–13 (13 once, under the whole suite on 2 cores: the runtime's own
    // timers); the polling dispatcher made about 120 in 6 s. 30 keeps 4× below that.
    assert!(
        woken <= 30,
        "{woken} context switches in 6 s at rest: {by_thread:?}"
    );
    // Still delivered at once: the follower's page nudges the sinks.
    append_ok(&s, &urgent("rest-2", "bo@example.org")).await;
    wait_status(&s, "dlv:rest-2:email", "sent").await;
    wait_status(&s, "dlv:rest-2:hook", "sent").await;
    // A 451 is retried after the route's fixed 200 ms: at its due time, with no page to nudge.
    append_ok(&s, &urgent("rest-3", "tempfail1-cy@example.org")).await;
    let d = wait_status(&s, "dlv:rest-3:email", "sent").await;
    assert_eq!(d["attempts"], 2, "{d}");
}

/// A hanging SMTP server holds only the email sink: while it hangs, the webhook sink delivers
/// and an app claims; the hang ends in the adapter's timeout and a retry. Then the dispatcher
/// is killed (-9) while a message hangs in DATA: after the restart its lease expires, the
/// delivery is tried again and sent (the server sees the same `Message-ID`), never parked.
#[tokio::test]
async fn a_hanging_sink_delays_nothing_else_and_a_crash_mid_send_loses_nothing() {
    let smtp = Smtp::start();
    let (hits, hook) = receiver().await;
    let mut s = start(&smtp, hook).await;
    append_ok(&s, &urgent("h-hang", "hang-dee@example.org")).await;
    wait_for(
        Duration::from_secs(30),
        "the email attempt to start",
        || async { (delivery(&s, "dlv:h-hang:email").await["status"] == "leased").then_some(()) },
    )
    .await;
    // Its first attempt hangs: the sink is `sending`, not `idle` (no attempt has finished).
    let email = wait_for(
        Duration::from_secs(30),
        "the hanging attempt in flight",
        || async {
            let r = s.get("/v1/outbox/sinks").await;
            let email = r.json["sinks"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["sink"] == "email"))
                .cloned();
            email.filter(|e| e["in_flight"] == 1)
        },
    )
    .await;
    assert_eq!(email["state"], "sending", "{email}");
    // The email sink (concurrency 1) is stuck; the others go on.
    append_ok(&s, &urgent("h-other", "eve@example.org")).await;
    wait_status(&s, "dlv:h-other:hook", "sent").await;
    let rows = claim(&s, "app-1", 10, 60_000).await;
    assert!(
        rows.iter().any(|r| r["id"] == "dlv:h-other:desktop"),
        "the app claims while the SMTP server hangs"
    );
    assert!(hits.lock().unwrap().len() >= 2);
    // The hang ends in the timeout: a transient failure, tried again.
    wait_for(
        Duration::from_secs(30),
        "the timeout to be recorded",
        || async {
            let d = delivery(&s, "dlv:h-hang:email").await;
            (d["last_error_code"] == "smtp_timeout").then_some(())
        },
    )
    .await;
    // Kill -9 while a message hangs in DATA (the first DATA to hang1- hangs).
    append_ok(&s, &urgent("h-crash", "hang1-fay@example.org")).await;
    wait_for(
        Duration::from_secs(60),
        "the crash delivery to be leased",
        || async { (delivery(&s, "dlv:h-crash:email").await["status"] == "leased").then_some(()) },
    )
    .await;
    s.kill9();
    s.restart().await;
    let d = wait_for(
        Duration::from_secs(90),
        "the crash delivery to be sent",
        || async {
            let d = delivery(&s, "dlv:h-crash:email").await;
            assert_ne!(d["status"], "parked", "parked by the crash: {d}");
            (d["status"] == "sent").then_some(d)
        },
    )
    .await;
    assert_eq!(d["resolved_targets"], json!(["hang1-fay@example.org"]));
    let m = smtp.to("hang1-fay@example.org");
    assert!(!m.is_empty(), "the message arrived");
    assert!(
        m.iter()
            .all(|m| m["message_id"] == "<dlv=3Ah-crash=3Aemail@tidemark>")
    );
}

/// A redacting route cannot use the email sink (it needs an address): refused at start,
/// naming the route; so is an email route without `[sinks.email]`.
#[test]
fn an_email_route_that_cannot_work_is_refused_at_start() {
    let run = crate::common::refused_start;
    let redacting = "[privacy]\nhmac_key = \"env:K\"\n[notifications.routes.mail]\nsink = \"email\"\nredact = true\n[sinks.email]\nurl = \"smtp://127.0.0.1:2525\"\nfrom = \"a@example.org\"\n";
    let err = run(redacting, &[("K", "0123456789abcdef0123456789abcdef")]);
    assert!(
        err.contains("notifications.routes.mail") && err.contains("redact"),
        "{err}"
    );
    let err = run("[notifications.routes.mail]\nsink = \"email\"\n", &[]);
    assert!(
        err.contains("notifications.routes.mail") && err.contains("[sinks.email]"),
        "{err}"
    );
    let err = run("[notifications.routes.hook]\nsink = \"webhook\"\n", &[]);
    assert!(
        err.contains("notifications.routes.hook") && err.contains("url"),
        "{err}"
    );
}

/// `PUT /v1/lists/{name}` with a reason; panics unless 200.
async fn put_list(s: &Server, name: &str, members: &[&str]) -> Value {
    let r = s
        .send(
            s.request(reqwest::Method::PUT, &format!("/v1/lists/{name}"))
                .json(&json!({"members": members, "reason": "test"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json
}

/// Notification lists (section 17): a list of three addresses gets one message per member
/// (each its own `Message-ID`, nobody sees the others' addresses) and the delivery names all
/// three as `resolved_targets`; a list changed between routing and delivery reaches the new
/// members; an empty list parks `empty_list`, and once fixed an operator's retry sends it; an
/// unknown list parks `unknown_list`; a route's `list` takes notifications that name nobody.
/// The lists model answers `GET`, and `PUT` needs a reason.
#[tokio::test]
async fn lists_are_resolved_when_a_delivery_is_attempted() {
    let smtp = Smtp::start();
    let (_hits, hook) = receiver().await;
    let s = Server::start(
        ServerOpts::default()
            .config(config(smtp.port, hook, "").replace(
                "[notifications.routes.email]\nsink = \"email\"\n",
                "[notifications.routes.email]\nsink = \"email\"\nlist = \"fallback\"\n",
            ))
            .env("TEST_HOOK_SECRET", HOOK_SECRET),
    )
    .await;
    let ops = ["a@example.org", "b@example.org", "c@example.org"];
    let l = put_list(&s, "ops", &ops).await;
    assert_eq!(l["members"], json!(ops));
    let r = s
        .send(
            s.request(reqwest::Method::PUT, "/v1/lists/x")
                .json(&json!({"members": [], "reason": " "})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(r.json["code"], "reason_required");
    let with_list = |id: &str, list: &str, extra: Value| {
        let mut p = json!({"priority": "urgent", "title": format!("title of {id}"), "list": list});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        notif_ev(id, p)
    };
    append_ok(&s, &with_list("l-ops", "ops", json!({}))).await;
    let d = wait_status(&s, "dlv:l-ops:email", "sent").await;
    assert_eq!(d["resolved_targets"], json!(ops), "{d}");
    for a in ops {
        let m = smtp.to(a);
        assert_eq!(m.len(), 1, "one message to {a}");
        assert_eq!(m[0]["rcpt_tos"], json!([a]), "each message to one member");
        let want = format!("<dlv=3Al-ops=3Aemail=2F{}@tidemark>", a.replace('@', "=40"));
        assert_eq!(m[0]["message_id"], json!(want));
    }
    // The status record names whom it reached, overall and per delivery.
    let st = s.get("/v1/notifications/l-ops").await;
    // (the webhook route's endpoint joins them once that route has sent too)
    let all = st.json["resolved_targets"].as_array().unwrap();
    assert_eq!(all[..3], ops.map(|a| json!(a)), "{}", st.text);
    let email = st.json["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["sink"] == "email")
        .cloned()
        .unwrap_or_default();
    assert_eq!(email["resolved_targets"], json!(ops), "{}", st.text);
    // Changed between routing and delivery: the members at the attempt.
    let later = tidemark_log::time::format_micros(
        (std::time::SystemTime::now() + Duration::from_secs(3))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64,
    );
    put_list(&s, "team", &["old@example.org"]).await;
    append_ok(
        &s,
        &with_list("l-team", "team", json!({"deliver_after": later})),
    )
    .await;
    wait_status(&s, "dlv:l-team:email", "queued").await;
    put_list(&s, "team", &["new1@example.org", "new2@example.org"]).await;
    let d = wait_status(&s, "dlv:l-team:email", "sent").await;
    assert_eq!(
        d["resolved_targets"],
        json!(["new1@example.org", "new2@example.org"])
    );
    assert!(smtp.to("old@example.org").is_empty());
    // Empty, then fixed and retried by an operator.
    put_list(&s, "empty", &[]).await;
    append_ok(&s, &with_list("l-empty", "empty", json!({}))).await;
    let d = wait_status(&s, "dlv:l-empty:email", "parked").await;
    assert_eq!(d["last_error_code"], "empty_list", "{d}");
    put_list(&s, "empty", &["fixed@example.org"]).await;
    let r = crate::e2e_deliveries::act(&s, "dlv:l-empty:email", "retry", &json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let d = wait_status(&s, "dlv:l-empty:email", "sent").await;
    assert_eq!(d["resolved_targets"], json!(["fixed@example.org"]));
    // Unknown; and the route's list for a notification that names nobody.
    append_ok(&s, &with_list("l-none", "nosuch", json!({}))).await;
    let d = wait_status(&s, "dlv:l-none:email", "parked").await;
    assert_eq!(d["last_error_code"], "unknown_list", "{d}");
    put_list(&s, "fallback", &["fb@example.org"]).await;
    append_ok(
        &s,
        &notif_ev(
            "l-fb",
            json!({"priority": "urgent", "title": "nobody named"}),
        ),
    )
    .await;
    let d = wait_status(&s, "dlv:l-fb:email", "sent").await;
    assert_eq!(d["resolved_targets"], json!(["fb@example.org"]));
    // The model, and deleting.
    let r = s.get("/v1/lists").await;
    let names: Vec<&str> = r.json["lists"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["empty", "fallback", "ops", "team"], "{}", r.text);
    let r = s
        .send(
            s.request(reqwest::Method::DELETE, "/v1/lists/team")
                .json(&json!({"reason": "gone"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    assert_eq!(s.get("/v1/lists/team").await.status, StatusCode::NOT_FOUND);
}

/// Every id of `GET /v1/deliveries?{filter}` paged `limit` at a time in id order; each page but
/// the last holds `limit` rows (an indexed filter fills its pages).
async fn page_through(s: &Server, filter: &str, limit: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("/v1/deliveries?{filter}&limit={limit}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={}", encode_path(a)));
        }
        let r = s.get(&path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
        let page: Vec<String> = r.json["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect();
        after = r.json["next_after"].as_str().map(str::to_owned);
        if after.is_some() {
            assert_eq!(
                page.len(),
                limit,
                "{path}: a page that is not the last is full"
            );
        }
        ids.extend(page);
        if after.is_none() {
            return ids;
        }
    }
}

/// `?type=` and `?list=` on `/v1/deliveries` (sections 7 and 17): indexed, so every page but
/// the last is full and paging finds every match, alone, combined with each other and with
/// `sink`, and newest first; the delivery and the claim answer carry `type` and `list`; bad
/// values are 400. `tidemark lists set|list|show|delete` and `tidemark deliveries list --type
/// --list` do the same from the command line.
#[tokio::test]
async fn type_and_list_filters_page_through_every_match_and_the_lists_cli() {
    let s = Server::start(ServerOpts::default()).await;
    let url = s.base().to_owned();
    // `tidemark <args> --url <server> -o json`: what it printed, or its stderr when it failed.
    let cli = |v: &[&str]| {
        let args: Vec<String> = v
            .iter()
            .map(|s| s.to_string())
            .chain(["--url".into(), url.clone(), "-o".into(), "json".into()])
            .collect();
        async move {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = tidemark_tests::run_cli(&a, "", Duration::from_secs(60)).await;
            if out.status.success() {
                Ok(serde_json::from_slice::<Value>(&out.stdout).expect("JSON on stdout"))
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        }
    };
    // The lists CLI: set, show, list.
    let set = ["lists", "set", "ops", "a@example.org", "b@example.org"];
    let v = cli(&[&set[..], &["--reason", "rota"]].concat())
        .await
        .unwrap();
    assert_eq!(
        v["members"],
        json!(["a@example.org", "b@example.org"]),
        "{v}"
    );
    assert_eq!(v["reason"], "rota");
    let v = cli(&["lists", "show", "ops"]).await.unwrap();
    assert_eq!(v["name"], "ops", "{v}");
    let v = cli(&["lists", "list"]).await.unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    assert!(
        cli(&set).await.is_err(),
        "a change without --reason is refused"
    );

    // 30 notifications: type alert / notice / none in turn, every third to list ops.
    let mut want_alert = Vec::new();
    let mut want_ops = Vec::new();
    let mut want_both = Vec::new();
    let mut events = Vec::new();
    for i in 0..30 {
        let id = format!("f-{i:02}");
        let mut p = json!({"priority": "urgent", "title": id, "recipient": "r"});
        let ty = ["alert", "notice", ""][i % 3];
        if !ty.is_empty() {
            p["type"] = json!(ty);
        }
        if i % 4 == 0 {
            p["list"] = json!("ops");
        }
        let d = format!("dlv:{id}:desktop");
        if ty == "alert" {
            want_alert.push(d.clone());
        }
        if i % 4 == 0 {
            want_ops.push(d.clone());
            if ty == "alert" {
                want_both.push(d.clone());
            }
        }
        events.push(notif_ev(&id, p));
    }
    append_ok(&s, &json!({ "events": events })).await;
    wait_for(Duration::from_secs(20), "30 deliveries", || async {
        let r = s.get("/v1/deliveries?limit=1000").await;
        (r.json["deliveries"].as_array().map(Vec::len) == Some(30)).then_some(())
    })
    .await;
    assert_eq!(page_through(&s, "type=alert", 3).await, want_alert);
    assert_eq!(page_through(&s, "list=ops", 2).await, want_ops);
    assert_eq!(page_through(&s, "type=alert&list=ops", 1).await, want_both);
    assert_eq!(page_through(&s, "type=alert&sink=app", 4).await, want_alert);
    assert!(
        page_through(&s, "type=alert&sink=email", 4)
            .await
            .is_empty()
    );
    assert!(page_through(&s, "list=nosuch", 4).await.is_empty());
    // Newest first, the same set in reverse.
    let r = s
        .get("/v1/deliveries?type=alert&order=newest&limit=1000")
        .await;
    let newest: Vec<&str> = r.json["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    let mut rev: Vec<&str> = want_alert.iter().map(String::as_str).collect();
    rev.reverse();
    assert_eq!(newest, rev);
    // The row and the claim carry them.
    let d = s.get("/v1/deliveries/dlv:f-00:desktop").await.json;
    assert_eq!(
        (&d["type"], &d["list"]),
        (&json!("alert"), &json!("ops")),
        "{d}"
    );
    let d = s.get("/v1/deliveries/dlv:f-02:desktop").await.json;
    assert!(d.get("type").is_none() && d.get("list").is_none(), "{d}");
    let c = claim(&s, "filters", 1, 60_000).await;
    assert_eq!(c[0]["id"], "dlv:f-00:desktop");
    assert_eq!(c[0]["type"], "alert", "{}", c[0]);
    // Bad values change nothing and say why.
    for bad in [
        "type=a%01b",
        "list=a%7Fb",
        &format!("type={}", "x".repeat(257)),
    ] {
        let r = s.get(&format!("/v1/deliveries?{bad}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.text);
        assert_eq!(r.json["code"], "invalid_query", "{}", r.text);
    }

    // The CLI's filters, and deleting a list.
    let v = cli(&["deliveries", "list", "--type", "alert", "--order", "id"])
        .await
        .unwrap();
    let ids: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, want_alert);
    let v = cli(&["deliveries", "list", "--list", "ops", "--order", "id"])
        .await
        .unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(want_ops.len()));
    cli(&["lists", "delete", "ops", "--reason", "gone"])
        .await
        .unwrap();
    let err = cli(&["lists", "show", "ops"]).await.unwrap_err();
    let e: Value = serde_json::from_str(&err).unwrap_or(Value::Null);
    assert_eq!(e["code"], "list_not_found", "{err}");
}

/// Section 17: everything else holds for the email sink as for the app sink. A digest is one
/// email listing its items; quiet hours hold an email until the window ends; a suppressed
/// recipient is refused at append (crisis block, nothing sent) and a suppression after
/// routing skips the email at its claim; retention purges sent email deliveries and keeps
/// the pending ones.
#[tokio::test]
async fn the_email_sink_keeps_digests_quiet_hours_crisis_blocks_and_retention() {
    use crate::e2e_deliveries::us;
    use crate::e2e_outbox_policies::clock;
    let smtp = Smtp::start();
    let now_min = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60) as i64;
    let cfg = format!(
        r#"
[notifications.routing]
urgent = ["dashboard", "email", "quiet"]
[notifications.routes.email]
sink = "email"
types = ["alert"]
digest = {{ window = "2s", max_items = 5 }}
[notifications.routes.quiet]
sink = "email"
types = ["night"]
quiet_hours = ["{}", "{}"]
[sinks.email]
url = "smtp://127.0.0.1:{}"
from = "tidemark <noreply@example.org>"
timeout = "5s"
[retention]
window = "2s"
run_every = "1h"
"#,
        clock(now_min - 60),
        clock(now_min + 60),
        smtp.port
    );
    let s = Server::start(ServerOpts::default().config(cfg)).await;
    let note = |id: &str, ty: &str, to: &str, extra: Value| {
        let mut p = json!({"priority": "urgent", "title": format!("title of {id}"),
                           "recipient": to, "type": ty});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        notif_ev(id, p)
    };
    let suppress = |who: &str| {
        json!({"event_id": format!("sup-{}", who.replace('@', "-at-")), "stream": "recipients", "subject": who,
               "type": "recipient.suppressed", "payload": {"reason": "crisis"}})
    };

    // Quiet hours: held until the window's end, an hour away.
    append_ok(&s, &note("q-1", "night", "night@example.org", json!({}))).await;
    let q = wait_status(&s, "dlv:q-1:quiet", "queued").await;
    let due = us(&q["next_attempt_at"]) - us(&q["created_at"]);
    assert!(
        due > 55 * 60_000_000,
        "held to the window's end, about an hour on: {q}"
    );

    // A digest of three: one email listing them.
    let mut batch = Vec::new();
    for i in 1..=3 {
        batch.push(note(
            &format!("dg-{i}"),
            "alert",
            "dg@example.org",
            json!({"group_key": "builds"}),
        ));
    }
    append_ok(&s, &json!({ "events": batch })).await;
    let d = wait_status(&s, "dlv:dg-1:email", "sent").await;
    assert_eq!(d["items"].as_array().map(Vec::len), Some(3), "{d}");
    assert_eq!(d["resolved_targets"], json!(["dg@example.org"]));
    let m = smtp.to("dg@example.org");
    assert_eq!(m.len(), 1, "one email for the digest: {m:?}");
    let data = m[0]["data"].as_str().unwrap_or_default();
    for i in 1..=3 {
        assert!(data.contains(&format!("title of dg-{i}")), "{data}");
    }
    for i in 2..=3 {
        let st = s.get(&format!("/v1/notifications/dg-{i}")).await.json;
        assert_eq!(st["status"], "delivered", "{st}");
        assert_eq!(st["resolved_targets"], json!(["dg@example.org"]), "{st}");
    }

    // Crisis block: refused at append, nothing recorded or sent.
    append_ok(&s, &suppress("blocked@example.org")).await;
    let (st, body) = s
        .append(&note("b-1", "alert", "blocked@example.org", json!({})))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "recipient_blocked", "{body}");
    // Suppressed after routing: the claim skips it.
    let later = tidemark_log::time::format_micros(tidemark_log::time::now_micros() + 2_000_000);
    append_ok(
        &s,
        &note(
            "s-1",
            "alert",
            "later@example.org",
            json!({"deliver_after": later}),
        ),
    )
    .await;
    wait_status(&s, "dlv:s-1:email", "queued").await;
    append_ok(&s, &suppress("later@example.org")).await;
    let d = wait_status(&s, "dlv:s-1:email", "skipped").await;
    assert_eq!(d["reason"], "suppressed", "{d}");
    assert!(smtp.to("blocked@example.org").is_empty());
    assert!(smtp.to("later@example.org").is_empty());
    assert!(
        smtp.to("night@example.org").is_empty(),
        "quiet hours hold it"
    );

    // Retention: past the window, sent and skipped email deliveries go; the held one stays.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let r = crate::common::post_empty(&s, "/v1/admin/retention/run").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for gone in ["dlv:dg-1:email", "dlv:s-1:email"] {
        let r = s.get(&format!("/v1/deliveries/{gone}")).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{gone} purged: {}", r.text);
    }
    assert_eq!(delivery(&s, "dlv:q-1:quiet").await["status"], "queued");
}
