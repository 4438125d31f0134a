//! The outbox's policies, end to end (spec sections 2, 4, 5 and 14): digests that collapse into
//! one delivery with templated, localized titles; `notification.canceled`; quiet hours that
//! hold at every due time (a retry, a lease expiry), with the time zone in force then;
//! provenance with per-site KPIs and filters, and routes restricted to types; zero-PII
//! (redacted) routes, searched for the content everywhere a delivery shows up.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Server, ServerOpts, StartError, assert_problem, encode_path};

use crate::common::{append_ok, ev, notif_ev, wait_for};
use crate::e2e_bridge_sinks::hmac_hex;
use crate::e2e_deliveries::{act, claim, claim_some, get_dlv, timeline, us, wait_status};

const WAIT: Duration = Duration::from_secs(30);

fn note(id: &str, recipient: &str, group: Option<&str>, extra: Value) -> Value {
    let mut p = json!({"priority": "urgent", "title": format!("title of {id}"),
                       "recipient": recipient});
    if let Some(g) = group {
        p["group_key"] = json!(g);
    }
    if let (Some(p), Some(x)) = (p.as_object_mut(), extra.as_object()) {
        for (k, v) in x {
            p.insert(k.clone(), v.clone());
        }
    }
    notif_ev(id, p)
}

fn cancel(id: &str) -> Value {
    ev(
        &format!("cancel-{id}"),
        "notifications",
        id,
        "notification.canceled",
        json!({"reason": "withdrawn"}),
    )
}

fn recipient(who: &str, payload: Value) -> Value {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ev(
        &format!("r-{who}-{n}"),
        "recipients",
        who,
        "recipient.updated",
        payload,
    )
}

fn dlv(nid: &str) -> String {
    format!("dlv:{nid}:desktop")
}

/// The delivery once `check` holds for it.
async fn wait_dlv(api: &Api, id: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    wait_for(WAIT, &format!("{id}: {what}"), || {
        let api = api.clone();
        let id = id.to_owned();
        let ok = &check;
        async move {
            let r = api
                .get(&format!("/v1/deliveries/{}", encode_path(&id)))
                .await;
            (r.status == StatusCode::OK && ok(&r.json)).then_some(r.json)
        }
    })
    .await
}

fn count(d: &Value) -> usize {
    d["items"].as_array().map_or(0, Vec::len) + d["more"].as_u64().unwrap_or(0) as usize
}

async fn status_of(api: &Api, nid: &str) -> Value {
    let r = api
        .get(&format!("/v1/notifications/{}", encode_path(nid)))
        .await;
    assert_eq!(r.status, StatusCode::OK, "status of {nid}: {}", r.text);
    r.json
}

const CFG_DIGEST: &str = r#"
[notifications.routes.desktop]
digest = { window = "10m", max_items = 5, summary_after = 5 }
templates = { many = "{count} updates since {first_title}", summary = "You have {count} new updates" }
[notifications.templates.de]
many = "{count} neue Meldungen, zuletzt {title}"
summary = "Sie haben {count} neue Meldungen"
"#;

/// Digests of 1, 3 and 8 items: one delivery each (never split), titled single, many or
/// summary, from the recipient's locale when one is set; a canceled item leaves its digest
/// (count and title recomputed) and a digest with none left is cancelled.
#[tokio::test]
async fn digests_of_1_3_and_8_items_are_one_delivery_each_with_localized_titles() {
    let s = Server::start(ServerOpts::default().config(CFG_DIGEST)).await;
    append_ok(&s, &recipient("jan", json!({"locale": "de-AT"}))).await;
    let mut events = Vec::new();
    for (who, group, n) in [
        ("ann", "g1", 1),
        ("ann", "g3", 3),
        ("ann", "g8", 8),
        ("jan", "g3", 3),
        ("jan", "g8", 8),
    ] {
        for k in 1..=n {
            events.push(note(
                &format!("{who}-{group}-{k}"),
                who,
                Some(group),
                json!({}),
            ));
        }
    }
    append_ok(&s, &json!({ "events": events })).await;
    let want = |d: &Value, n: usize| count(d) == n;
    let a1 = wait_dlv(&s, &dlv("ann-g1-1"), "1 item", |d| want(d, 1)).await;
    let a3 = wait_dlv(&s, &dlv("ann-g3-1"), "3 items", |d| want(d, 3)).await;
    let a8 = wait_dlv(&s, &dlv("ann-g8-1"), "8 items", |d| want(d, 8)).await;
    let j3 = wait_dlv(&s, &dlv("jan-g3-1"), "3 items", |d| want(d, 3)).await;
    let j8 = wait_dlv(&s, &dlv("jan-g8-1"), "8 items", |d| want(d, 8)).await;
    assert_eq!(
        a1["title"], "title of ann-g1-1",
        "one item keeps its title: {a1}"
    );
    assert_eq!(a3["title"], "3 updates since title of ann-g3-1", "{a3}");
    assert_eq!(a8["title"], "You have 8 new updates", "{a8}");
    assert_eq!(
        j3["title"], "3 neue Meldungen, zuletzt title of jan-g3-3",
        "{j3}"
    );
    assert_eq!(j8["title"], "Sie haben 8 neue Meldungen", "{j8}");
    for d in [&a8, &j8] {
        assert_eq!(
            d["items"].as_array().map(Vec::len),
            Some(5),
            "max_items listed: {d}"
        );
        assert_eq!(d["more"], 3, "the rest counted: {d}");
    }
    // One delivery per digest, nothing else: 5 in all.
    let all = s.get("/v1/deliveries?limit=100").await;
    assert_eq!(
        all.json["deliveries"].as_array().map(Vec::len),
        Some(5),
        "{}",
        all.text
    );
    // Every item's status record shows its digest, listed or counted.
    for nid in ["ann-g8-2", "ann-g8-7", "jan-g3-3"] {
        let st = status_of(&s, nid).await;
        assert_eq!(st["status"], "pending", "{st}");
        let group = &nid[..nid.len() - 2];
        assert_eq!(
            st["deliveries"][0]["id"],
            dlv(&format!("{group}-1")),
            "{st}"
        );
    }

    // Cancels: a middle item of a digest, a counted one, and a single-item digest.
    append_ok(
        &s,
        &json!({"events": [cancel("ann-g3-2"), cancel("ann-g8-8"), cancel("ann-g1-1")]}),
    )
    .await;
    let a3 = wait_dlv(&s, &dlv("ann-g3-1"), "2 items", |d| want(d, 2)).await;
    assert_eq!(a3["title"], "2 updates since title of ann-g3-1", "{a3}");
    assert_eq!(a3["status"], "queued", "{a3}");
    let ids: Vec<&str> = a3["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["notification_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ann-g3-1", "ann-g3-3"], "{a3}");
    let a8 = wait_dlv(&s, &dlv("ann-g8-1"), "7 items", |d| want(d, 7)).await;
    assert_eq!(a8["more"], 2, "{a8}");
    assert_eq!(a8["title"], "You have 7 new updates", "{a8}");
    let a1 = wait_status(&s, &dlv("ann-g1-1"), "cancelled").await;
    assert_eq!(a1["reason"], "notification_canceled", "{a1}");
    assert_eq!(status_of(&s, "ann-g1-1").await["status"], "cancelled");
    let gone = status_of(&s, "ann-g3-2").await;
    assert_eq!(gone["status"], "cancelled", "left its digest: {gone}");
    assert_eq!(gone["deliveries"], json!([]), "{gone}");
}

/// `notification.canceled` (section 4): queued and parked deliveries are cancelled; a leased
/// one when its lease ends (by failure or expiry), and its owner's complete is refused with
/// `409 illegal_transition`; a cancel routed before its notification cancels it at creation.
#[tokio::test]
async fn a_canceled_notification_cancels_its_deliveries_and_a_leased_one_at_lease_end() {
    let s =
        Server::start(ServerOpts::default().config(
            "[notifications.retry]\nmax_attempts = 1\nbase_delay = \"100ms\"\njitter = 0.0\n",
        ))
        .await;
    // Parked first: one attempt, failed.
    append_ok(&s, &note("c-park", "pat", None, json!({}))).await;
    let got = claim_some(&s, "w").await;
    assert_eq!(got[0]["id"], dlv("c-park"));
    let r = act(
        &s,
        &dlv("c-park"),
        "fail",
        &json!({"owner": "w", "error_code": "x"}),
    )
    .await;
    assert_eq!(r.json["status"], "parked", "{}", r.text);
    // Queued, leased (held), leased (short) and parked notifications.
    append_ok(&s, &note("c-held", "pat", None, json!({}))).await;
    wait_status(&s, &dlv("c-held"), "queued").await;
    let got = claim(&s, "w", 10, 60_000).await;
    assert_eq!(got[0]["id"], dlv("c-held"));
    append_ok(&s, &note("c-short", "pat", None, json!({}))).await;
    wait_status(&s, &dlv("c-short"), "queued").await;
    let got = claim(&s, "w", 10, 1_500).await;
    assert_eq!(got[0]["id"], dlv("c-short"));
    append_ok(&s, &note("c-queued", "pat", None, json!({}))).await;
    wait_status(&s, &dlv("c-queued"), "queued").await;
    append_ok(
        &s,
        &json!({"events": [cancel("c-park"), cancel("c-held"), cancel("c-short"),
                           cancel("c-queued"),
                           note("c-early", "pat", None, json!({})), cancel("c-early")]}),
    )
    .await;
    for id in ["c-park", "c-queued", "c-early"] {
        let d = wait_status(&s, &dlv(id), "cancelled").await;
        assert_eq!(d["reason"], "notification_canceled", "{d}");
    }
    // The held lease: still leased; complete refused; fail ends it cancelled.
    let held = get_dlv(&s, &dlv("c-held")).await;
    assert_eq!(held["status"], "leased", "{held}");
    let r = act(&s, &dlv("c-held"), "complete", &json!({"owner": "w"})).await;
    assert_problem(&r, 409, "illegal_transition");
    let r = act(
        &s,
        &dlv("c-held"),
        "fail",
        &json!({"owner": "w", "error_code": "x"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "cancelled", "{}", r.text);
    // The short lease: cancelled when it expires (the expiry tick).
    let short = wait_status(&s, &dlv("c-short"), "cancelled").await;
    let names: Vec<String> = timeline(&short)
        .iter()
        .map(|t| t["event"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "created",
            "leased",
            "cancelled",
            "lease_expired",
            "cancelled"
        ],
        "{short}"
    );
    let r = act(&s, &dlv("c-short"), "complete", &json!({"owner": "w"})).await;
    assert_problem(&r, 409, "illegal_transition");
    for id in ["c-park", "c-held", "c-short", "c-queued", "c-early"] {
        assert_eq!(status_of(&s, id).await["status"], "cancelled", "{id}");
    }
}

/// Minutes after midnight, "HH:MM".
pub(crate) fn clock(min: i64) -> String {
    let m = min.rem_euclid(1440);
    format!("{:02}:{:02}", m / 60, m % 60)
}

/// The desktop route with a two-hour quiet window around now in UTC+5 (UTC now is four to
/// six hours before it), and retries 100 ms apart without jitter.
fn quiet_in_utc5() -> String {
    let now_min = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60) as i64;
    let (from, to) = (now_min + 300 - 60, now_min + 300 + 60);
    format!(
        "[notifications.routes.desktop]\nquiet_hours = [\"{}\", \"{}\"]\n\
         [notifications.retry]\nbase_delay = \"100ms\"\njitter = 0.0\n",
        clock(from),
        clock(to)
    )
}

/// Quiet hours hold after a retry and after a lease expiry (section 4), judged with the
/// recipient's time zone as it is then: routed under UTC (outside the window), the recipient
/// moves to UTC+5 (inside it), and both due times move to the window's end with a
/// `delivery.deferred` (reason `quiet_hours`).
#[tokio::test]
async fn quiet_hours_hold_after_a_retry_and_after_a_lease_expiry() {
    let cfg = quiet_in_utc5();
    let s = Server::start(ServerOpts::default().config(cfg)).await;
    append_ok(&s, &recipient("quinn", json!({"tz_offset_minutes": 0}))).await;
    append_ok(&s, &note("q-retry", "quinn", None, json!({}))).await;
    let first = claim_some(&s, "w").await;
    assert_eq!(first[0]["id"], dlv("q-retry"), "routed outside the window");
    append_ok(&s, &note("q-expire", "quinn", None, json!({}))).await;
    wait_status(&s, &dlv("q-expire"), "queued").await;
    let got = claim(&s, "w", 10, 1_000).await;
    assert_eq!(got[0]["id"], dlv("q-expire"));
    append_ok(&s, &recipient("quinn", json!({"tz_offset_minutes": 300}))).await;

    let r = act(
        &s,
        &dlv("q-retry"),
        "fail",
        &json!({"owner": "w", "error_code": "x"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "retry_wait", "{}", r.text);
    let expired = wait_dlv(&s, &dlv("q-expire"), "released", |d| {
        d["status"] == "queued"
    })
    .await;
    for (d, released_by) in [
        (get_dlv(&s, &dlv("q-retry")).await, "attempt_failed"),
        (expired, "lease_expired"),
    ] {
        let tl = timeline(&d);
        let n = tl.len();
        assert!(n >= 2, "{d}");
        assert_eq!(tl[n - 2]["event"], released_by, "{d}");
        let deferred = &tl[n - 1];
        assert_eq!(deferred["event"], "deferred", "{d}");
        assert_eq!(deferred["reason"], "quiet_hours", "{d}");
        // The window's end in UTC+5 is about an hour from now (a minute boundary).
        let at = us(&deferred["at"]);
        let end = us(&d["next_attempt_at"]);
        assert_eq!(us(&deferred["next_attempt_at"]), end, "{d}");
        assert_eq!(end % 60_000_000, 0, "the window's end is on a minute: {d}");
        assert!(
            end > at + 58 * 60_000_000 && end <= at + 61 * 60_000_000,
            "moved to the end of the UTC+5 window, about an hour on: {d}"
        );
        // Not claimable before then.
        assert!(claim(&s, "w2", 10, 60_000).await.is_empty());
    }
}

/// A command decides on everything acknowledged before it was sent, even when it reaches the
/// decider while the models fold an older commit (the fault knob makes every fold take 300
/// ms): the recipient's move into the quiet window, acknowledged before the `fail`, defers
/// the retry. (CI once saw this `fail` decided on the recipient as it was before.)
#[tokio::test]
async fn a_command_sent_during_a_slow_fold_decides_on_the_writes_before_it() {
    let cfg = quiet_in_utc5();
    let s = Server::start(
        ServerOpts::default()
            .config(cfg)
            .env("TIDEMARK_FAULT_FOLD_DELAY_MS", "300"),
    )
    .await;
    append_ok(&s, &recipient("quinn", json!({"tz_offset_minutes": 0}))).await;
    append_ok(&s, &note("q-slow", "quinn", None, json!({}))).await;
    let first = claim_some(&s, "w").await;
    assert_eq!(first[0]["id"], dlv("q-slow"));
    // Any commit starts a fold; once it is under way (past its 5 ms gathering), the
    // recipient moves and the failure is sent, both well inside the fold's 300 ms.
    append_ok(&s, &recipient("someone-else", json!({"locale": "de"}))).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    append_ok(&s, &recipient("quinn", json!({"tz_offset_minutes": 300}))).await;
    let r = act(
        &s,
        &dlv("q-slow"),
        "fail",
        &json!({"owner": "w", "error_code": "x"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let d = get_dlv(&s, &dlv("q-slow")).await;
    let tl = timeline(&d);
    let last = &tl[tl.len() - 1];
    assert_eq!(last["event"], "deferred", "{d}");
    assert_eq!(last["reason"], "quiet_hours", "{d}");
}

const SOURCE_A: &str = "plant-a";

fn sourced(id: &str, site: Option<&str>, ty: Option<&str>) -> Value {
    let mut extra = json!({});
    if let Some(site) = site {
        extra["source"] = json!({"site_id": site, "node": "n-7", "instance_id": "inst-1",
                                 "script": "alarm.py", "enqueued_at": "2026-11-01T08:00:00Z"});
    }
    if let Some(t) = ty {
        extra["type"] = json!(t);
        extra["type_data"] = json!({"channel": "ops", "n": [1, 2]});
    }
    note(id, "ops", None, extra)
}

/// Provenance (section 2): `type`, `type_data` and `source` are served on the notification,
/// its status record (whose `enqueued_at` is the origin's) and its deliveries; KPIs break down
/// by source site, `/v1/deliveries` filters by `source_site` and `notification_id`; a route
/// restricted to `types` takes only those; malformed provenance is refused.
#[tokio::test]
async fn provenance_is_served_counted_by_site_and_filtered() {
    let s = Server::start(
        ServerOpts::default().config("[notifications.routes.desktop]\ntypes = [\"app\"]\n"),
    )
    .await;
    append_ok(
        &s,
        &json!({"events": [
            sourced("pa-1", Some(SOURCE_A), Some("app")),
            sourced("pa-2", Some(SOURCE_A), Some("app")),
            sourced("pa-3", Some(SOURCE_A), Some("app")),
            sourced("pb-1", Some("plant-b"), Some("app")),
            sourced("pb-2", Some("plant-b"), Some("app")),
            sourced("px-1", None, Some("app")),
            // Not of the route's types: dashboard only.
            sourced("pe-1", Some(SOURCE_A), Some("email")),
            sourced("pn-1", Some(SOURCE_A), None),
        ]}),
    )
    .await;
    for id in ["pa-1", "pa-2", "pa-3", "pb-1", "pb-2", "px-1"] {
        wait_status(&s, &dlv(id), "queued").await;
    }
    let got = claim(&s, "w", 1, 60_000).await;
    let first = got[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(first, dlv("pa-1"), "oldest first");
    let r = act(&s, &first, "complete", &json!({"owner": "w"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let k = s.get("/v1/outbox/kpis").await;
    let by_site = &k.json["by_source_site"];
    assert_eq!(by_site[SOURCE_A]["queued"], 2, "{}", k.text);
    assert_eq!(by_site[SOURCE_A]["queue_depth"], 2, "{}", k.text);
    assert_eq!(by_site[SOURCE_A]["sent_last_interval"], 1, "{}", k.text);
    assert_eq!(by_site["plant-b"]["queued"], 2, "{}", k.text);
    assert_eq!(
        by_site.as_object().map(|m| m.len()),
        Some(2),
        "no site, no entry: {}",
        k.text
    );
    assert_eq!(k.json["queue_depth"], 5, "{}", k.text);

    let ids = |v: &Value| -> Vec<String> {
        v["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let r = s.get("/v1/deliveries?source_site=plant-a").await;
    assert_eq!(
        ids(&r.json),
        [dlv("pa-1"), dlv("pa-2"), dlv("pa-3")],
        "{}",
        r.text
    );
    let r = s
        .get("/v1/deliveries?source_site=plant-b&status=queued&limit=1")
        .await;
    assert_eq!(ids(&r.json), [dlv("pb-1")], "{}", r.text);
    let r = s.get("/v1/deliveries?source_site=nowhere").await;
    assert!(ids(&r.json).is_empty(), "{}", r.text);
    let r = s.get("/v1/deliveries?notification_id=pb-2").await;
    assert_eq!(ids(&r.json), [dlv("pb-2")], "{}", r.text);

    let d = get_dlv(&s, &dlv("pa-2")).await;
    assert_eq!(d["type"], "app", "{d}");
    assert_eq!(
        d["type_data"],
        json!({"channel": "ops", "n": [1, 2]}),
        "{d}"
    );
    assert_eq!(d["source"]["site_id"], SOURCE_A, "{d}");
    assert_eq!(d["source"]["script"], "alarm.py", "{d}");
    let st = status_of(&s, "pa-2").await;
    assert_eq!(st["notification"]["type"], "app", "{st}");
    assert_eq!(st["notification"]["source"]["node"], "n-7", "{st}");
    assert_eq!(st["enqueued_at"], "2026-11-01T08:00:00.000000Z", "{st}");
    assert_ne!(st["created_at"], st["enqueued_at"], "{st}");
    for nid in ["pe-1", "pn-1"] {
        let st = status_of(&s, nid).await;
        assert_eq!(
            st["status"], "dashboard_only",
            "not of the route's types: {st}"
        );
    }
    let list = s.get("/v1/notifications?limit=50").await;
    let row = list.json["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["notification_id"] == "pe-1")
        .cloned()
        .unwrap();
    assert_eq!(row["type"], "email", "{row}");

    let head = s.head().await;
    for bad in [
        json!({"priority": "info", "title": "t", "type": "no spaces"}),
        json!({"priority": "info", "title": "t", "type_data": [1]}),
        json!({"priority": "info", "title": "t", "source": {"site_id": 7}}),
        json!({"priority": "info", "title": "t", "source": {"enqueued_at": "yesterday"}}),
        json!({"priority": "info", "title": "t", "source": {"planet": "mars"}}),
    ] {
        let r = s
            .send(
                s.request(reqwest::Method::POST, "/v1/events")
                    .json(&notif_ev("bad-prov", bad.clone())),
            )
            .await;
        assert_problem(&r, 422, "schema_violation");
    }
    assert_eq!(s.head().await, head, "refused provenance appends nothing");
}

/// A worker delivers from its claim alone. The claim's rows once carried the notification's
/// `type` but not its `type_data` or `source`, so a worker had to read each delivery again to
/// learn where and how to deliver it.
#[tokio::test]
async fn a_claimed_delivery_carries_its_type_data_and_source() {
    let s = Server::start(ServerOpts::default()).await;
    append_ok(
        &s,
        &json!({"events": [
            sourced("cl-1", Some(SOURCE_A), Some("app")),
            sourced("cl-2", None, None),
        ]}),
    )
    .await;
    for id in ["cl-1", "cl-2"] {
        wait_status(&s, &dlv(id), "queued").await;
    }
    let got = claim(&s, "w", 10, 60_000).await;
    assert_eq!(got.len(), 2, "{got:?}");
    let (with, without) = (&got[0], &got[1]);
    assert_eq!(with["id"], dlv("cl-1"), "oldest first: {got:?}");
    assert_eq!(with["type"], "app", "{with}");
    assert_eq!(
        with["type_data"],
        json!({"channel": "ops", "n": [1, 2]}),
        "{with}"
    );
    assert_eq!(
        with["source"],
        json!({"site_id": SOURCE_A, "node": "n-7", "instance_id": "inst-1",
               "script": "alarm.py", "enqueued_at": "2026-11-01T08:00:00Z"}),
        "{with}"
    );
    // As the delivery itself serves it.
    let d = get_dlv(&s, &dlv("cl-1")).await;
    assert_eq!(d["type_data"], with["type_data"], "{d}");
    assert_eq!(d["source"], with["source"], "{d}");
    assert_eq!(without["id"], dlv("cl-2"), "{got:?}");
    for k in ["type", "type_data", "source"] {
        assert!(
            without.get(k).is_none(),
            "none given, none served: {without}"
        );
    }
}

const KEY: &str = "a-key-for-the-test-only";
const SECRETS: [&str; 6] = [
    "Zoe Quartermaine",
    "TITLE-OF-A-CRISIS",
    "BODY-OF-A-CRISIS",
    "pii-intent-one",
    "pii-intent-two",
    "pii-intent-three",
];

fn redact_cfg(with_key: bool) -> String {
    let mut c = String::from(
        "[notifications.routes.desktop]\nredact = true\ngeneric_title = \"You have a message\"\n\
         digest = { window = \"10m\", max_items = 5 }\n",
    );
    if with_key {
        c.push_str("[privacy]\nhmac_key = \"env:TM_TEST_PRIVACY_KEY\"\n");
    }
    c
}

#[track_caller]
fn assert_clean(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{what} carries {secret:?} of a redacted route: {text}"
        );
    }
}

/// Zero-PII routes (section 14): a redacted delivery, its events, its claim, its reads, the
/// status record's delivery summaries, the metrics and the server log carry no title, body,
/// recipient or notification id; the notification's own row and status keep them; lookups by
/// notification id and recipient find the redacted deliveries through the keyed hashes; the
/// server refuses to start without the key.
#[tokio::test]
async fn a_redacted_route_carries_no_content_anywhere() {
    let intent = |nid: &str| hmac_hex(KEY, nid.as_bytes());
    let s = Server::start(
        ServerOpts::default()
            .config(redact_cfg(true))
            .env("TM_TEST_PRIVACY_KEY", tidemark_tests::secret(KEY)),
    )
    .await;
    let crisis = |nid: &str, group: Option<&str>| {
        note(
            nid,
            SECRETS[0],
            group,
            json!({"title": SECRETS[1], "body": SECRETS[2]}),
        )
    };
    append_ok(
        &s,
        &json!({"events": [crisis(SECRETS[3], None), crisis(SECRETS[4], Some("gz")),
                           crisis(SECRETS[5], Some("gz"))]}),
    )
    .await;
    let one = format!("dlv:{}:desktop", intent(SECRETS[3]));
    let digest = format!("dlv:{}:desktop", intent(SECRETS[4]));
    wait_status(&s, &one, "queued").await;
    let dg = wait_dlv(&s, &digest, "2 items", |d| count(d) == 2).await;
    assert_eq!(dg["title"], "You have a message", "{dg}");
    let items: Vec<&str> = dg["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["notification_id"].as_str().unwrap())
        .collect();
    assert_eq!(items, [intent(SECRETS[4]), intent(SECRETS[5])], "{dg}");

    let r = s
        .send(
            s.request(reqwest::Method::POST, "/v1/deliveries/claim")
                .json(&json!({"sink": "app", "owner": "w", "limit": 10})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["deliveries"][0]["id"], one, "{}", r.text);
    let claimed = &r.json["deliveries"][0];
    assert_eq!(claimed["title"], "You have a message", "{claimed}");
    assert_eq!(
        claimed["recipient_hash"],
        hmac_hex(KEY, SECRETS[0].as_bytes()),
        "{claimed}"
    );
    assert!(
        claimed.get("recipient").is_none_or(Value::is_null),
        "{claimed}"
    );
    // The intent key is a field of its own, not only inside the id.
    assert_eq!(
        claimed["intent_key"],
        json!(intent(SECRETS[3])),
        "{claimed}"
    );
    assert_eq!(dg["intent_key"], json!(intent(SECRETS[4])), "{dg}");
    assert_clean("the claim", &r.text);
    let r = act(
        &s,
        &one,
        "fail",
        &json!({"owner": "w", "error_code": "x", "retryable": true}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_clean("a failure report's answer", &r.text);

    // Lookups by the clear values find the redacted rows.
    let r = s
        .get(&format!("/v1/deliveries?notification_id={}", SECRETS[3]))
        .await;
    assert_eq!(r.json["deliveries"][0]["id"], one, "{}", r.text);
    assert_clean("?notification_id=", &r.text);
    let r = s
        .get(&format!(
            "/v1/deliveries?recipient={}",
            encode_path(SECRETS[0])
        ))
        .await;
    assert_eq!(
        r.json["deliveries"].as_array().map(Vec::len),
        Some(2),
        "{}",
        r.text
    );
    assert_clean("?recipient=", &r.text);
    // The status record keeps the notification's content, its delivery summaries do not.
    let st = status_of(&s, SECRETS[5]).await;
    assert_eq!(st["notification"]["title"], SECRETS[1], "{st}");
    assert_eq!(st["deliveries"][0]["id"], digest, "{st}");
    assert_clean(
        "the status record's deliveries",
        &st["deliveries"].to_string(),
    );

    // Every delivery read, every event of the deliveries stream, the metrics, the log.
    assert_clean(
        "GET /v1/deliveries",
        &s.get("/v1/deliveries?limit=100").await.text,
    );
    for id in [&one, &digest] {
        assert_clean(
            "GET /v1/deliveries/{id}",
            &get_dlv(&s, id).await.to_string(),
        );
    }
    let events = s.read_all_with("stream=deliveries", 1000).await;
    assert!(events.len() >= 5, "{events:?}");
    assert_clean("the deliveries stream", &Value::from(events).to_string());
    assert_clean("/metrics", &s.get("/metrics").await.text);
    assert_clean("the server log", &s.all_stderr());

    // No key, or a key variable that is not set: the server does not start.
    for opts in [
        ServerOpts::default().config(redact_cfg(false)),
        ServerOpts::default().config(redact_cfg(true)),
    ] {
        match Server::try_start(opts).await {
            Err(StartError::Exited { stderr, .. }) => {
                assert!(
                    stderr.contains("hmac_key") || stderr.contains("key"),
                    "{stderr}"
                );
                assert!(!stderr.contains(KEY));
            }
            Err(e) => panic!("refused for another reason: {e:?}"),
            Ok(_) => panic!("started with a redacting route and no key"),
        }
    }
}

/// A recipient's IANA time zone (`recipient.updated {tz}`) sets its quiet hours' clock (with
/// daylight saving; the engine's unit tests cross a change) and wins over
/// `tz_offset_minutes`; a name that is not a zone is refused, naming the field.
#[tokio::test]
async fn quiet_hours_read_the_recipients_iana_time_zone() {
    let now_min = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60) as i64;
    // Tokyo is UTC+9 all year: a two-hour window around its local now.
    let (from, to) = (now_min + 540 - 60, now_min + 540 + 60);
    let cfg = format!(
        "[notifications.routes.desktop]\nquiet_hours = [\"{}\", \"{}\"]\n",
        clock(from),
        clock(to)
    );
    let s = Server::start(ServerOpts::default().config(cfg)).await;
    append_ok(
        &s,
        &recipient("kenji", json!({"tz_offset_minutes": 0, "tz": "Asia/Tokyo"})),
    )
    .await;
    append_ok(&s, &note("tz-1", "kenji", None, json!({}))).await;
    let d = wait_status(&s, &dlv("tz-1"), "queued").await;
    let wait = us(&d["next_attempt_at"]) - us(&d["created_at"]);
    assert!(
        wait > 55 * 60_000_000 && wait <= 61 * 60_000_000,
        "held to the end of the Tokyo window, about an hour on: {d}"
    );
    let (st, body) = s
        .append(&recipient("kenji", json!({"tz": "Mars/Olympus"})))
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["detail"].as_str().unwrap_or("").contains("payload.tz"),
        "{body}"
    );
}
