//! Small helpers shared by the e2e modules.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tidemark_tests::{Api, Reply, encode_path, tail};

/// An event body for `POST /v1/events`.
pub fn ev(id: &str, stream: &str, subject: &str, ty: &str, payload: Value) -> Value {
    json!({"event_id": id, "stream": stream, "subject": subject, "type": ty, "payload": payload})
}

/// The `events` of a 201 receipt as `(event_id, seq, duplicate)`.
#[track_caller]
pub fn receipts(body: &Value) -> Vec<(String, u64, bool)> {
    body["events"]
        .as_array()
        .unwrap_or_else(|| panic!("receipt without an `events` array: {body}"))
        .iter()
        .map(|r| {
            (
                r["event_id"]
                    .as_str()
                    .unwrap_or_else(|| panic!("receipt without event_id: {r}"))
                    .to_owned(),
                r["seq"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("receipt without seq: {r}")),
                r["duplicate"]
                    .as_bool()
                    .unwrap_or_else(|| panic!("receipt without duplicate: {r}")),
            )
        })
        .collect()
}

pub fn seq_of(e: &Value) -> u64 {
    e["seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("envelope without seq: {e}"))
}

pub fn id_of(e: &Value) -> &str {
    e["event_id"]
        .as_str()
        .unwrap_or_else(|| panic!("envelope without event_id: {e}"))
}

/// The whole log must be seqs `1..=head`, dense, with no event_id twice (I1, I2).
#[track_caller]
pub fn assert_dense_unique(all: &[Value], head: u64) {
    let len = u64::try_from(all.len()).expect("len");
    assert_eq!(
        len, head,
        "the log holds {len} events but latest_event_seq is {head}"
    );
    let mut ids = HashSet::new();
    for (i, e) in all.iter().enumerate() {
        let want = u64::try_from(i).expect("index") + 1;
        assert_eq!(seq_of(e), want, "the log is not dense at position {i}: {e}");
        assert!(
            ids.insert(id_of(e).to_owned()),
            "event_id {} appears twice in the log",
            id_of(e)
        );
    }
}

/// `YYYY-MM-DDTHH:MM:SS.ffffff` then `Z` or `+00:00`: RFC 3339, UTC, six fractional digits.
/// Returns the part before the offset, which sorts as time.
#[track_caller]
pub fn check_time(t: &str) -> &str {
    let (stamp, offset) = t.split_at(t.len().min(26));
    assert!(
        offset == "Z" || offset == "+00:00",
        "time {t:?} is not UTC (`Z`)"
    );
    let b = stamp.as_bytes();
    assert_eq!(b.len(), 26, "time {t:?} is not YYYY-MM-DDTHH:MM:SS.ffffff");
    for (i, c) in b.iter().enumerate() {
        let ok = match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            _ => c.is_ascii_digit(),
        };
        assert!(ok, "time {t:?} is not RFC 3339 with six fractional digits");
    }
    let num = |r: std::ops::Range<usize>| stamp[r].parse::<u32>().expect("digits");
    assert!((1..=12).contains(&num(5..7)), "month of {t:?}");
    assert!((1..=31).contains(&num(8..10)), "day of {t:?}");
    assert!(
        num(11..13) < 24 && num(14..16) < 60 && num(17..19) < 61,
        "clock of {t:?}"
    );
    stamp
}

/// Microseconds since the Unix epoch, now (the test's clock: the same machine's as the server).
pub fn now_us() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(d.as_micros()).expect("fits")
}

/// Microseconds since the Unix epoch of the UTC time `(year, month, day)`, `(hour, minute,
/// second)` and `micros` (days from civil, proleptic Gregorian).
pub fn civil_micros(date: (i64, i64, i64), clock: (i64, i64, i64), micros: i64) -> i64 {
    let ((y, m, d), (h, mi, s)) = (date, clock);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    (days * 86_400 + h * 3_600 + mi * 60 + s) * 1_000_000 + micros
}

/// A lifecycle event of `task` on stream `task_events` (server-made event_id).
pub fn task_ev(task: &str, ty: &str, payload: Value) -> Value {
    json!({"stream": "task_events", "subject": task, "type": ty, "payload": payload})
}

/// A client `notification.requested` with id `id` (event_id = subject = id).
pub fn notif_ev(id: &str, payload: Value) -> Value {
    json!({"event_id": id, "stream": "notifications", "subject": id,
           "type": "notification.requested", "payload": payload})
}

/// The lifecycle types the router turns into a `notification.created`, with the priority.
pub const ROUTED: [(&str, &str); 7] = [
    ("task.run_failed", "urgent"),
    ("task.run_review_requested", "action"),
    ("task.run_review_rejected", "warning"),
    ("task.run_canceled", "warning"),
    ("task.canceled", "warning"),
    ("task.run_completed", "info"),
    ("task.run_review_approved", "info"),
];

/// The priority of the notification routed from a lifecycle event of type `ty`, if any.
pub fn routed_priority(ty: &str) -> Option<&'static str> {
    ROUTED.iter().find(|(t, _)| *t == ty).map(|(_, p)| *p)
}

/// Append and return the receipts; panics unless 201.
pub async fn append_ok(api: &Api, body: &Value) -> Vec<(String, u64, bool)> {
    let (st, reply) = api.append(body).await;
    assert_eq!(
        st,
        StatusCode::CREATED,
        "append of {}: {reply}",
        tail(&body.to_string(), 500)
    );
    receipts(&reply)
}

/// `GET /v1/tasks/{id}`; panics unless 200.
pub async fn get_task(api: &Api, id: &str) -> Value {
    let r = api.get(&format!("/v1/tasks/{}", encode_path(id))).await;
    assert_eq!(r.status, StatusCode::OK, "GET /v1/tasks/{id}: {}", r.text);
    r.json
}

/// Every task of `GET /v1/tasks?<query>`, paging with `limit` via `after` / `next_after`.
pub async fn list_tasks(api: &Api, query: &str, limit: u32) -> Vec<Value> {
    list_after(api, "/v1/tasks", "tasks", query, limit).await
}

/// Every item (under `key`) of the list `GET {path}?<query>`, paging with `limit` via `after` /
/// `next_after`: no page holds more than `limit` items and `next_after` only moves forward.
pub async fn list_after(api: &Api, path: &str, key: &str, query: &str, limit: u32) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100_000 {
        let mut q = format!("limit={limit}");
        if !query.is_empty() {
            q = format!("{query}&{q}");
        }
        if let Some(a) = &after {
            q = format!("{q}&after={}", encode_path(a));
        }
        let r = api.get(&format!("{path}?{q}")).await;
        assert_eq!(r.status, StatusCode::OK, "GET {path}?{q}: {}", r.text);
        let page = r.json[key]
            .as_array()
            .unwrap_or_else(|| panic!("GET {path}?{q}: no `{key}` array: {}", r.text));
        assert!(
            page.len() <= usize::try_from(limit).expect("small"),
            "GET {path}?{q}: more than `limit` items"
        );
        out.extend(page.iter().cloned());
        match &r.json["next_after"] {
            Value::Null => return out,
            Value::String(next) => {
                assert!(
                    after.as_deref().is_none_or(|a| next.as_str() > a),
                    "GET {path}?{q}: next_after {next:?} does not move forward"
                );
                after = Some(next.clone());
            }
            other => panic!("GET {path}?{q}: next_after is {other}"),
        }
    }
    panic!("GET {path}?{query}: paging did not end");
}

/// Every notification of `GET /v1/notifications?<query>`, newest first, paging with `limit`
/// via `before_seq` / `next_before_seq`.
pub async fn list_notifications(api: &Api, query: &str, limit: u32) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut before: Option<u64> = None;
    for _ in 0..10_000 {
        let mut q = format!("limit={limit}");
        if !query.is_empty() {
            q = format!("{query}&{q}");
        }
        if let Some(b) = before {
            q = format!("{q}&before_seq={b}");
        }
        let r = api.get(&format!("/v1/notifications?{q}")).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "GET /v1/notifications?{q}: {}",
            r.text
        );
        let page = r.json["notifications"].as_array().unwrap_or_else(|| {
            panic!(
                "GET /v1/notifications?{q}: no `notifications` array: {}",
                r.text
            )
        });
        assert!(
            page.len() <= usize::try_from(limit).expect("small"),
            "GET /v1/notifications?{q}: more than `limit` items"
        );
        out.extend(page.iter().cloned());
        match &r.json["next_before_seq"] {
            Value::Null => return out,
            v => {
                let next = v
                    .as_u64()
                    .unwrap_or_else(|| panic!("GET /v1/notifications?{q}: next_before_seq is {v}"));
                assert!(
                    before.is_none_or(|b| next < b),
                    "GET /v1/notifications?{q}: next_before_seq {next} does not move back"
                );
                before = Some(next);
            }
        }
    }
    panic!("GET /v1/notifications?{query}: paging did not end");
}

/// Poll `check` every 50 ms until it gives `Some`, at most `limit` (then panic naming `what`).
/// A bound against hanging, never an assertion on speed.
pub async fn wait_for<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "gave up waiting for {what} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The items under `key` of `GET path`; panics unless 200 with such an array.
pub async fn get_list(api: &Api, path: &str, key: &str) -> Vec<Value> {
    let r = api.get(path).await;
    assert_eq!(r.status, StatusCode::OK, "GET {path}: {}", r.text);
    r.json[key]
        .as_array()
        .unwrap_or_else(|| panic!("GET {path}: no `{key}` array: {}", r.text))
        .clone()
}

/// Serve `app` on a loopback port of its own, for the rest of the test; answers its address.
pub async fn serve_local(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The `webhook-id` header of a POST a test receiver got (`""` when it has none).
pub fn webhook_id(headers: &axum::http::HeaderMap) -> String {
    headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Wait (bounded, 30 s) for the first of the `hits` a test receiver recorded that `pick`
/// accepts; a copy of it.
pub async fn wait_hit<T: Clone>(
    hits: &std::sync::Mutex<Vec<T>>,
    what: &str,
    pick: impl Fn(&T) -> bool,
) -> T {
    wait_for(Duration::from_secs(30), what, || async {
        hits.lock().unwrap().iter().find(|h| pick(h)).cloned()
    })
    .await
}

/// Run `python3 -c <script>` with `input` on its stdin; its stdout, one JSON document. Panics
/// unless it exits 0, saying `what` failed with its stderr.
pub async fn python_json(script: &str, input: &Value, what: &str) -> Value {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(input.to_string().as_bytes())
        .await
        .expect("write the input");
    drop(stdin);
    let out = child.wait_with_output().await.expect("python3 ends");
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script's output")
}

/// `POST` to `path` with an empty body.
pub async fn post_empty(api: &Api, path: &str) -> Reply {
    api.send(api.request(reqwest::Method::POST, path)).await
}

/// `POST` to `path` with the JSON `body`.
pub async fn post_json(api: &Api, path: &str, body: &Value) -> Reply {
    api.send(api.request(reqwest::Method::POST, path).json(body))
        .await
}

/// `GET /v1/admin/projections` as name → row; panics unless 200 with every projection.
/// Wait (as any client read does) until the read models have folded the log up to the head as
/// of now: a read of a read model answers only then (spec section 7). The admin listing never
/// waits, so a test that compares its digests reads once first.
pub async fn settled(api: &Api) {
    let r = api.get("/v1/tasks?limit=1").await;
    assert_eq!(r.status, StatusCode::OK, "GET /v1/tasks: {}", r.text);
}

pub async fn projections(api: &Api) -> HashMap<String, Value> {
    let r = api.get("/v1/admin/projections").await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "GET /v1/admin/projections: {}",
        r.text
    );
    let rows = r.json["projections"]
        .as_array()
        .unwrap_or_else(|| panic!("no `projections` array: {}", r.text));
    let map: HashMap<String, Value> = rows
        .iter()
        .map(|p| {
            (
                p["name"]
                    .as_str()
                    .unwrap_or_else(|| panic!("projection without name: {p}"))
                    .to_owned(),
                p.clone(),
            )
        })
        .collect();
    for name in PROJECTIONS {
        assert!(map.contains_key(name), "no projection {name}: {}", r.text);
    }
    map
}

pub const PROJECTIONS: [&str; 10] = [
    "tasks",
    "notifications",
    "settings",
    "deliveries",
    "cursors",
    "bridges",
    "sources",
    "lists",
    "routes",
    "tenants",
];

/// `POST /v1/admin/projections/{name}/{action}` (rebuild or verify); panics unless 200.
pub async fn rebuild_or_verify(api: &Api, name: &str, action: &str) -> Value {
    let r = post_empty(api, &format!("/v1/admin/projections/{name}/{action}")).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "POST /v1/admin/projections/{name}/{action}: {}",
        r.text
    );
    r.json
}

/// Every projection has lag 0 and a verify that finds it identical to a replay of the log.
pub async fn assert_projections_sound(api: &Api, what: &str) {
    settled(api).await;
    // The server's reactors may append meanwhile (a restored log's next derivation, a bridge's
    // cursor): each model catches up with the head, bounded, rather than at one instant.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let rows = loop {
        let rows = projections(api).await;
        let behind: Vec<&str> = PROJECTIONS
            .iter()
            .copied()
            .filter(|n| rows[*n]["lag"] != 0)
            .collect();
        if behind.is_empty() || std::time::Instant::now() >= deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let head = api.head().await;
    for name in PROJECTIONS {
        let p = &rows[name];
        assert_eq!(p["lag"], 0, "{what}: projection {name} lags: {p}");
        assert!(
            p["checkpoint"].as_u64().is_some_and(|c| c <= head),
            "{what}: projection {name} checkpoint past the head {head}: {p}"
        );
        let v = rebuild_or_verify(api, name, "verify").await;
        assert_eq!(v["name"], name, "{what}: {v}");
        assert_eq!(
            v["identical"], true,
            "{what}: verify of {name} is not identical: {v}"
        );
        assert_eq!(v["first_divergent_seq"], Value::Null, "{what}: {v}");
        assert_eq!(v["swapped"], false, "{what}: verify must not switch: {v}");
    }
}

/// A test oracle of the task status rules (spec and issue): what `status` a task must have
/// after the given lifecycle events (`(type, payload)`, in log order).
#[derive(Debug, Clone, Default)]
pub struct TaskOracle {
    pub status: String,
    pub current: Option<String>,
    pub canceled: bool,
    pub review_required: bool,
    /// run_id → (review required at start, review requested, approved)
    runs: HashMap<String, (bool, bool, bool)>,
    /// Runs with a `task.run_started` seen: the end or approval of another is a mismatch
    /// (spec section 6) and leaves the task's status as it was.
    started: std::collections::HashSet<String>,
}

impl TaskOracle {
    pub fn new() -> Self {
        TaskOracle {
            status: "open".into(),
            ..TaskOracle::default()
        }
    }

    fn set(&mut self, s: &str) {
        if !self.canceled {
            self.status = s.to_owned();
        }
    }

    pub fn apply(&mut self, ty: &str, p: &Value) {
        let run = p["run_id"].as_str().unwrap_or_default().to_owned();
        if ty.starts_with("task.run_") && run.is_empty() {
            return;
        }
        if ty.starts_with("task.run_") && !self.runs.contains_key(&run) {
            self.runs
                .insert(run.clone(), (self.review_required, false, false));
            if self.current.is_none() {
                self.current = Some(run.clone());
            }
        }
        let is_current = self.current.as_deref() == Some(run.as_str());
        match ty {
            "task.created" => {
                self.review_required = p["review_required"].as_bool().unwrap_or(false);
            }
            "task.run_started" => {
                self.started.insert(run.clone());
                self.current = Some(run);
                self.set("running");
            }
            "task.run_completed" => {
                let (req, requested, approved) = self.runs[&run];
                let gated = self.review_required || req || requested;
                if is_current && self.started.contains(&run) {
                    self.set(if gated && !approved {
                        "awaiting_review"
                    } else {
                        "completed"
                    });
                }
            }
            "task.run_failed" if is_current && self.started.contains(&run) => self.set("failed"),
            "task.run_canceled" if is_current && self.started.contains(&run) => {
                self.set("canceled");
            }
            "task.run_review_requested" => {
                let r = self.runs.get_mut(&run).expect("run");
                r.1 = true;
                r.2 = false;
                if is_current {
                    self.set("awaiting_review");
                }
            }
            "task.run_review_approved" => {
                self.runs.get_mut(&run).expect("run").2 = true;
                if is_current && self.started.contains(&run) {
                    self.set("completed");
                }
            }
            "task.run_review_rejected" => {
                self.runs.get_mut(&run).expect("run").2 = false;
                if is_current {
                    let cont = p["continuation"].as_bool().unwrap_or(false);
                    self.set(if cont { "running" } else { "open" });
                }
            }
            "task.canceled" => {
                self.set("canceled");
                self.canceled = true;
            }
            _ => {}
        }
    }

    /// Fold the lifecycle events (stream `task_events`) among `events` (envelopes).
    pub fn of(events: &[Value]) -> TaskOracle {
        let mut o = TaskOracle::new();
        for e in events {
            if e["stream"] == "task_events" {
                o.apply(e["type"].as_str().unwrap_or_default(), &e["payload"]);
            }
        }
        o
    }
}

/// The routed lifecycle events of the log (stream `task_events`, a routed type), by seq.
///
/// A `task.run_completed` of a run with no `task.run_started` before it is a mismatch
/// (`run_not_started`, section 6) and routes nothing.
pub async fn routed_sources(api: &Api) -> BTreeMap<u64, Value> {
    let mut started: HashSet<(String, String)> = HashSet::new();
    let mut out = BTreeMap::new();
    for e in api.read_all("stream=task_events").await {
        let ty = e["type"].as_str().unwrap_or_default();
        let key = || {
            (
                e["subject"].as_str().unwrap_or_default().to_owned(),
                e["payload"]["run_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        };
        if ty == "task.run_started" {
            started.insert(key());
        }
        if ty == "task.run_completed" && !started.contains(&key()) {
            continue;
        }
        if routed_priority(ty).is_some() {
            out.insert(seq_of(&e), e);
        }
    }
    out
}

/// Every `notification.created` of the log (read as the whole `notifications` stream).
pub async fn created_notifications(api: &Api) -> Vec<Value> {
    api.read_all("stream=notifications")
        .await
        .into_iter()
        .filter(|e| e["type"] == "notification.created")
        .collect()
}

/// Wait (bounded) until every routed lifecycle event of the log has a `notification.created`;
/// returns the sources and the `notification.created` events read last.
/// Every event of the log and its head, read once the log is quiet: the reactors may still be
/// appending what routing derives (deliveries of the notifications just created), so the head
/// is read before and after the whole log until the two agree.
pub async fn whole_quiet_log(api: &Api, limit: Duration) -> (Vec<Value>, u64) {
    let deadline = Instant::now() + limit;
    loop {
        let before = api.head().await;
        let all = api.read_all("").await;
        let after = api.head().await;
        if before == after {
            return (all, after);
        }
        assert!(
            Instant::now() < deadline,
            "the log was still growing after {limit:?} ({before} then {after})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn wait_routed(api: &Api, limit: Duration) -> (BTreeMap<u64, Value>, Vec<Value>) {
    let mut last_missing = Vec::new();
    let deadline = Instant::now() + limit;
    loop {
        let sources = routed_sources(api).await;
        let created = created_notifications(api).await;
        let have: HashSet<u64> = created
            .iter()
            .filter_map(|e| e["payload"]["source_seq"].as_u64())
            .collect();
        let missing: Vec<u64> = sources
            .keys()
            .filter(|s| !have.contains(s))
            .copied()
            .collect();
        if missing.is_empty() {
            return (sources, created);
        }
        assert!(
            Instant::now() < deadline,
            "after {limit:?} {} routed lifecycle events still have no notification.created \
             (first: {:?}; {} of the sources, previous check missed {})",
            missing.len(),
            &missing[..missing.len().min(10)],
            sources.len(),
            last_missing.len()
        );
        last_missing = missing;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Exactly one `notification.created` per routed source: id `ntf:<source_seq>` as event_id and
/// subject, the priority of its type, the task as `task_id`, after its source; and none that
/// does not come from a routed source.
#[track_caller]
pub fn assert_routed_exactly_once(sources: &BTreeMap<u64, Value>, created: &[Value]) {
    let mut count: HashMap<u64, usize> = HashMap::new();
    for n in created {
        let src = n["payload"]["source_seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("notification.created without a numeric source_seq: {n}"));
        let want_id = format!("ntf:{src}");
        assert_eq!(id_of(n), want_id, "event_id of {n}");
        assert_eq!(n["subject"], want_id.as_str(), "subject of {n}");
        assert_eq!(n["stream"], "notifications", "{n}");
        let source = sources.get(&src).unwrap_or_else(|| {
            panic!("notification.created for seq {src}, which is no routed lifecycle event: {n}")
        });
        let ty = source["type"].as_str().unwrap_or_default();
        assert_eq!(
            n["payload"]["priority"],
            routed_priority(ty).unwrap_or_default(),
            "priority of the notification routed from {ty}: {n}"
        );
        assert_eq!(n["payload"]["task_id"], source["subject"], "task_id of {n}");
        assert!(seq_of(n) > src, "a notification before its source: {n}");
        *count.entry(src).or_default() += 1;
    }
    let twice: Vec<(&u64, &usize)> = count.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        twice.is_empty(),
        "lifecycle events with more than one notification.created (source seq, count): {twice:?}"
    );
    let missing: Vec<&u64> = sources.keys().filter(|s| !count.contains_key(s)).collect();
    assert!(
        missing.is_empty(),
        "lifecycle events without a notification.created: {missing:?}"
    );
}

/// Wait until the server has nothing more to derive: the log head stays the same for 500 ms
/// (the router, the delivery scheduler and the bridge notifier append asynchronously after a
/// commit, within milliseconds). A bound against hanging, not a speed assertion.
pub async fn wait_quiet(api: &Api) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = api.head().await;
    let mut still = 0;
    while still < 5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = api.head().await;
        if now == last {
            still += 1;
        } else {
            still = 0;
            last = now;
        }
        assert!(Instant::now() < deadline, "the log never went quiet");
    }
}

/// Run an outside tool's test script (the browser test, the API fuzz run) to its end, bounded
/// by 10 minutes against a hang (never a speed check); answers its stdout, panicking with both
/// outputs unless it exits 0.
pub async fn run_script(mut cmd: tokio::process::Command, what: &str) -> String {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start it: {e}"));
    let out = tokio::time::timeout(Duration::from_secs(600), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what} hung for 10 minutes"))
        .unwrap_or_else(|e| panic!("{what}: wait: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Its error output first: what went wrong, ahead of the log of what went right.
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stderr}\n---- its output ----\n{stdout}",
        out.status
    );
    stdout
}

/// Start the built binary with `toml` as its config (and `env`), expecting it to refuse:
/// answers its stderr. Panics if it started.
pub fn refused_start(toml: &str, env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("c.toml");
    std::fs::write(&f, toml).expect("write the config");
    let out = std::process::Command::new(tidemark_tests::binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&f)
        .arg("--data")
        .arg(dir.path().join("data"))
        .envs(env.iter().copied())
        .output()
        .expect("run the binary");
    assert!(!out.status.success(), "started with {toml}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The bound of one CLI run, against a hang (never a speed check).
pub const CLI_LIMIT: Duration = Duration::from_secs(60);

/// `tidemark <cmd> --url <url>` with no input: `cmd` is split at white space (none of its words
/// holds a space).
pub async fn cli_at(url: &str, cmd: &str) -> std::process::Output {
    cli_with(url, cmd, &[]).await
}

/// [`cli_at`] with the words `more` (which may hold spaces) after those of `cmd`.
pub async fn cli_with(url: &str, cmd: &str, more: &[&str]) -> std::process::Output {
    let mut args: Vec<&str> = cmd.split_whitespace().collect();
    args.extend(more);
    args.extend(["--url", url]);
    tidemark_tests::run_cli(&args, "", CLI_LIMIT).await
}

/// The stdout of a CLI run that must have exited 0 (else a panic naming `what`, with its
/// stderr).
#[track_caller]
pub fn cli_ok(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The records a CLI command printed: JSON lines, or one JSON array (`-o json`, the default
/// off a terminal).
pub fn cli_records(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}")))
        .flat_map(|v: Value| match v {
            Value::Array(a) => a,
            v => vec![v],
        })
        .collect()
}

/// The sum of the samples of a metric (all label sets) in Prometheus text.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        let value = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = value {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}
