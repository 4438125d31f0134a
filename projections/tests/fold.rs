//! I3 on a real log: for random traffic of every event family the projections fold — task
//! lifecycle and reviews (with duplicates and out-of-order events), notifications, settings,
//! recipients, delivery transitions (legal or not: the fold must be deterministic whatever the
//! log holds), cursor advances / resets / failures, bridge subscriptions and mismatches — the
//! live projections and a from-scratch rebuild have the same digests, every projection that
//! was sent events recorded changes (no model compares empty with empty), and the tasks and
//! cursors models match references written here from the spec's rules.

mod common;

use std::collections::HashMap;
use tidemark_log::EventLog;

use proptest::prelude::*;
use serde_json::json;
use tidemark_log::{LogConfig, NewEvent};
use tidemark_projections::bridges::{BridgeEvent, BridgeSink, Target};
use tidemark_projections::cursors::CursorEvent;
use tidemark_projections::deliveries::{Change, Created, Joined};
use tidemark_projections::names::BridgeMode;
use tidemark_projections::{cursors, models, rebuild, tasks};

#[derive(Debug, Clone)]
enum Op {
    Created {
        task: u8,
        review: bool,
    },
    Started {
        task: u8,
        run: u8,
    },
    Ended {
        task: u8,
        run: u8,
        kind: u8,
    },
    ReviewRequested {
        task: u8,
        run: u8,
    },
    Approved {
        task: u8,
        run: u8,
    },
    Rejected {
        task: u8,
        run: u8,
        continuation: bool,
    },
    Canceled {
        task: u8,
    },
    Notify {
        id: u8,
        prio: u8,
    },
    /// Re-send an earlier op's exact event (same event_id): a duplicate.
    Repeat(usize),
    /// `settings.updated` with one of a few retry / routing variants.
    Settings {
        variant: u8,
    },
    Recipient {
        r: u8,
        suppress: bool,
    },
    /// A delivery transition of kind `kind` (see `DELIVERY_KINDS`) on delivery `d`.
    Delivery {
        d: u8,
        kind: u8,
    },
    /// A cursor event: advanced, reset or failed, on one of a few keys.
    Cursor {
        key: u8,
        kind: u8,
        seq: u8,
    },
    Bridge {
        sub: u8,
        task: u8,
        on: bool,
    },
    Mismatch {
        sub: u8,
        task: u8,
    },
    Other {
        task: u8,
    },
    /// A `retention.purged` naming some deliveries, notifications and tasks (bits of `mask`),
    /// decided at seq `through` (some named rows changed after it, and stay).
    Purge {
        mask: u16,
        through: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let t = 0u8..4;
    let r = 0u8..3;
    prop_oneof![
        (t.clone(), any::<bool>()).prop_map(|(task, review)| Op::Created { task, review }),
        (t.clone(), r.clone()).prop_map(|(task, run)| Op::Started { task, run }),
        (t.clone(), r.clone(), 0u8..3).prop_map(|(task, run, kind)| Op::Ended { task, run, kind }),
        (t.clone(), r.clone()).prop_map(|(task, run)| Op::ReviewRequested { task, run }),
        (t.clone(), r.clone()).prop_map(|(task, run)| Op::Approved { task, run }),
        (t.clone(), r.clone(), any::<bool>()).prop_map(|(task, run, continuation)| Op::Rejected {
            task,
            run,
            continuation
        }),
        t.clone().prop_map(|task| Op::Canceled { task }),
        (0u8..5, 0u8..4).prop_map(|(id, prio)| Op::Notify { id, prio }),
        (0usize..50).prop_map(Op::Repeat),
        t.clone().prop_map(|task| Op::Other { task }),
        (0u8..3).prop_map(|variant| Op::Settings { variant }),
        (0u8..2, any::<bool>()).prop_map(|(r, suppress)| Op::Recipient { r, suppress }),
        (0u8..3, 0u8..DELIVERY_KINDS.len() as u8).prop_map(|(d, kind)| Op::Delivery { d, kind }),
        (0u8..3, 0u8..3, 0u8..20).prop_map(|(key, kind, seq)| Op::Cursor { key, kind, seq }),
        (0u8..3, t.clone(), any::<bool>()).prop_map(|(sub, task, on)| Op::Bridge { sub, task, on }),
        (0u8..3, t).prop_map(|(sub, task)| Op::Mismatch { sub, task }),
        (any::<u16>(), any::<u8>()).prop_map(|(mask, through)| Op::Purge { mask, through }),
    ]
}

/// Delivery event kinds the fold knows (created first, so most sequences start with one).
const DELIVERY_KINDS: [&str; 12] = [
    "created",
    "leased",
    "sent",
    "attempt_failed",
    "lease_expired",
    "lease_extended",
    "retried",
    "discarded",
    "skipped",
    "joined",
    "cancelled",
    "deferred",
];

const CURSOR_KEYS: [(&str, &str, &str); 3] = [
    ("c1", "orders", ""),
    ("c1", "orders", "o-1"),
    ("bridge_task_subscription:s0", "task_events", "task-0"),
];

fn delivery_payload(d: u8, kind: &str, i: usize) -> serde_json::Value {
    let at = 1_700_000_000_000_000i64 + i as i64 * 1_000_000;
    match kind {
        "created" => serde_json::to_value(Created {
            recipient: Some(format!("r{}", d % 2)),
            sound: true,
            task_id: Some(format!("task-{d}")),
            max_attempts: 2,
            source_site: (d % 2 == 1).then(|| format!("site-{}", d % 3)),
            redacted: d == 2,
            // Some ordered (section 4): their key's order is folded too.
            order_key: d.is_multiple_of(3).then(|| "endpoint".into()),
            order_skips_parked: d.is_multiple_of(2),
            ..common::created(format!("dlv:n{d}:desktop"), format!("n{d}"), i as u64, at)
        })
        .unwrap(),
        // Joins past `max_items` are counted (`more_items`), the title is the command's.
        "joined" => serde_json::to_value(Joined {
            notification_id: format!("j{i}"),
            notification_seq: i as u64,
            source_seq: i as u64,
            title: "j".into(),
            body: None,
            at_us: at,
            digest_title: i.is_multiple_of(3).then(|| format!("{i} new")),
            max_items: (i % 3 != 2).then_some(2),
            count: (i % 4 == 1).then_some(3),
        })
        .unwrap(),
        _ => serde_json::to_value(Change {
            at_us: at,
            owner: Some(["a", "b"][i % 2].into()),
            attempt: Some((i % 3) as u32),
            lease_expires_at_us: Some(at + 30_000_000),
            next_attempt_at_us: Some(at + 1_000_000),
            error_code: (kind == "attempt_failed").then(|| "boom".into()),
            parked: Some(i.is_multiple_of(2)),
            // A notification cancel: one item of a digest leaves, or a leased row waits.
            notification_id: (kind == "cancelled" && i % 4 == 1).then(|| format!("j{}", i - 1)),
            at_lease_end: (kind == "cancelled" && i % 4 == 3).then_some(true),
            ..Change::default()
        })
        .unwrap(),
    }
}

fn to_event(i: usize, op: &Op) -> Option<NewEvent> {
    let id = Some(format!("e{i}"));
    let te = |task: &u8, ty: &str, p: serde_json::Value| {
        NewEvent::new(id.clone(), "task_events", format!("task-{task}"), ty, &p).unwrap()
    };
    Some(match op {
        Op::Created { task, review } => te(
            task,
            "task.created",
            json!({"project_id": "p", "review_required": review}),
        ),
        Op::Started { task, run } => te(
            task,
            "task.run_started",
            json!({"run_id": format!("r{run}")}),
        ),
        Op::Ended { task, run, kind } => {
            let ty = ["task.run_completed", "task.run_failed", "task.run_canceled"][*kind as usize];
            te(
                task,
                ty,
                json!({"run_id": format!("r{run}"), "error": "boom"}),
            )
        }
        Op::ReviewRequested { task, run } => te(
            task,
            "task.run_review_requested",
            json!({"run_id": format!("r{run}")}),
        ),
        Op::Approved { task, run } => te(
            task,
            "task.run_review_approved",
            json!({"run_id": format!("r{run}"), "reviewer": "rv"}),
        ),
        Op::Rejected {
            task,
            run,
            continuation,
        } => te(
            task,
            "task.run_review_rejected",
            json!({"run_id": format!("r{run}"), "continuation": continuation}),
        ),
        Op::Canceled { task } => te(task, "task.canceled", json!({"reason": "no"})),
        Op::Notify { id, prio } => {
            let nid = format!("n{id}");
            let p = ["urgent", "action", "warning", "info"][*prio as usize];
            NewEvent::new(
                Some(nid.clone()),
                "notifications",
                nid,
                "notification.requested",
                &json!({"priority": p, "title": "t"}),
            )
            .unwrap()
        }
        Op::Other { task } => NewEvent::new(
            id,
            "comments",
            format!("task-{task}"),
            "comment.added",
            &json!({}),
        )
        .unwrap(),
        Op::Repeat(_) => return None,
        Op::Settings { variant } => {
            let p = match variant {
                0 => json!({"retry": {"max_attempts": 2}}),
                1 => json!({"routing": {"urgent": ["dashboard"]}}),
                _ => {
                    json!({"routes": {"desktop": {"quiet_hours": {"from": "22:00", "to": "07:00"}}}})
                }
            };
            NewEvent::new(id, "settings", "", "settings.updated", &p).unwrap()
        }
        Op::Recipient { r, suppress } => {
            let ty = if *suppress {
                "recipient.suppressed"
            } else {
                "recipient.unsuppressed"
            };
            NewEvent::new(
                id,
                "recipients",
                format!("r{r}"),
                ty,
                &json!({"reason": "test"}),
            )
            .unwrap()
        }
        Op::Delivery { d, kind } => {
            let kind = DELIVERY_KINDS[*kind as usize];
            NewEvent::new(
                id,
                "deliveries",
                format!("dlv:n{d}:desktop"),
                format!("delivery.{kind}"),
                &delivery_payload(*d, kind, i),
            )
            .unwrap()
        }
        Op::Cursor { key, kind, seq } => {
            let (c, st, subject) = CURSOR_KEYS[*key as usize];
            let mut e = CursorEvent {
                stream_name: st.into(),
                subject_id: subject.into(),
                at_us: 1_700_000_000_000_000 + i as i64,
                ..CursorEvent::default()
            };
            let ty = match kind {
                0 => {
                    e.last_sequence = Some(u64::from(*seq));
                    e.delivery_id = Some(format!("d{seq}"));
                    "cursor.advanced"
                }
                1 => {
                    e.from = Some(0);
                    e.to = Some(u64::from(*seq));
                    e.reason = Some("replay".into());
                    "cursor.reset"
                }
                _ => {
                    e.error = Some("webhook answered 500".into());
                    "cursor.failed"
                }
            };
            NewEvent::new(id, "cursors", c, ty, &serde_json::to_value(&e).unwrap()).unwrap()
        }
        Op::Bridge { sub, task, on } => {
            let target = Target {
                task_id: format!("task-{task}").into(),
                bridge_id: "b1".into(),
                scope: None,
                workspace_id: None,
                thread_id: None,
                mode: BridgeMode::Reply,
                sink: BridgeSink::Pull,
            };
            let b = BridgeEvent {
                target: on.then_some(target),
                at_us: 1_700_000_000_000_000 + i as i64,
            };
            let ty = if *on {
                "bridge.subscribed"
            } else {
                "bridge.unsubscribed"
            };
            NewEvent::new(
                id,
                "bridges",
                format!("s{sub}"),
                ty,
                &serde_json::to_value(&b).unwrap(),
            )
            .unwrap()
        }
        Op::Purge { mask, through } => {
            let pick = |n: u16, shift: u16, f: &dyn Fn(u16) -> String| -> Vec<String> {
                (0..n)
                    .filter(|k| mask >> (shift + k) & 1 == 1)
                    .map(f)
                    .collect()
            };
            NewEvent::new(
                id,
                "retention",
                "",
                "retention.purged",
                &json!({
                    "before": "2026-01-01T00:00:00Z",
                    "through_seq": (i as u64).saturating_sub(u64::from(*through) % 8),
                    "deliveries": pick(3, 0, &|k| format!("dlv:n{k}:desktop")),
                    "notifications": pick(5, 3, &|k| format!("n{k}")),
                    "tasks": pick(4, 8, &|k| format!("task-{k}")),
                }),
            )
            .unwrap()
        }
        Op::Mismatch { sub, task } => NewEvent::new(
            id,
            "task_events",
            format!("task-{task}"),
            "notification.terminal_state_mismatch",
            &json!({"subscription_id": format!("s{sub}"), "seq": i, "detail": "task is running"}),
        )
        .unwrap(),
    })
}

/// The cursors reference: the fold records what the (already checked) events say; the last
/// advance or reset of a key is its position.
fn cursor_reference(events: &[(u64, NewEvent)]) -> HashMap<(String, String, String), u64> {
    let mut m = HashMap::new();
    for (_, e) in events.iter().filter(|(_, e)| e.stream == "cursors") {
        let p: serde_json::Value = serde_json::from_slice(e.payload_bytes()).unwrap();
        let k = (
            e.subject.clone(),
            p["stream_name"].as_str().unwrap().to_owned(),
            p["subject_id"].as_str().unwrap().to_owned(),
        );
        match e.event_type.as_str() {
            "cursor.advanced" => {
                m.insert(k, p["last_sequence"].as_u64().unwrap());
            }
            "cursor.reset" => {
                m.insert(k, p["to"].as_u64().unwrap());
            }
            _ => {
                m.entry(k).or_insert(0);
            }
        }
    }
    m
}

/// The reference: status rules of the spec, written plainly.
#[derive(Debug, Default, Clone, PartialEq)]
struct RefTask {
    status: String,
    current: Option<String>,
    review_required: bool,
    canceled: bool,
    runs: HashMap<String, (String, String, bool, bool)>, // outcome, review state, requested, required
    /// Runs with a `task.run_started` seen: an end or approval of another is a mismatch
    /// (spec section 6) and leaves the task's status as it was.
    started: std::collections::HashSet<String>,
    latest: u64,
}

fn reference(events: &[(u64, NewEvent)]) -> HashMap<String, RefTask> {
    let mut m: HashMap<String, RefTask> = HashMap::new();
    for (seq, e) in events {
        // A purge removes the tasks it names that did not change after its decision.
        if e.event_type == "retention.purged" {
            let p: serde_json::Value = serde_json::from_slice(e.payload_bytes()).unwrap();
            let through = p["through_seq"].as_u64().unwrap_or(0);
            for id in p["tasks"].as_array().into_iter().flatten() {
                let id = id.as_str().unwrap_or("");
                if m.get(id).is_some_and(|t| t.latest <= through) {
                    m.remove(id);
                }
            }
            continue;
        }
        // Only lifecycle events (`task.*` in task_events) make a task; any other event about
        // an existing task moves its latest seq, except the delivery runtime's own streams,
        // whose subjects name deliveries and consumers.
        if e.stream != "task_events" || !e.event_type.starts_with("task.") {
            if !matches!(e.stream.as_str(), "deliveries" | "cursors")
                && let Some(t) = m.get_mut(&e.subject)
            {
                t.latest = *seq;
            }
            continue;
        }
        let t = m.entry(e.subject.clone()).or_insert_with(|| RefTask {
            status: "open".into(),
            ..Default::default()
        });
        t.latest = *seq;
        let p: serde_json::Value = serde_json::from_slice(e.payload_bytes()).unwrap();
        let run = p["run_id"].as_str().unwrap_or("").to_owned();
        let req = t.review_required;
        let ensure = |t: &mut RefTask| {
            if !t.runs.contains_key(&run) {
                t.runs
                    .insert(run.clone(), ("running".into(), "none".into(), false, req));
                if t.current.is_none() {
                    t.current = Some(run.clone());
                }
            }
        };
        let set = |t: &mut RefTask, s: &str| {
            if !t.canceled {
                t.status = s.into();
            }
        };
        match e.event_type.as_str() {
            "task.created" => t.review_required = p["review_required"].as_bool().unwrap_or(false),
            "task.run_started" => {
                ensure(t);
                t.started.insert(run.clone());
                t.current = Some(run.clone());
                set(t, "running");
            }
            ty @ ("task.run_completed" | "task.run_failed" | "task.run_canceled") => {
                ensure(t);
                let started = t.started.contains(&run);
                let outcome = match ty {
                    "task.run_completed" => "completed",
                    "task.run_failed" => "failed",
                    _ => "canceled",
                };
                let r = t.runs.get_mut(&run).unwrap();
                r.0 = outcome.into();
                let gated = t.review_required || r.3 || r.2;
                let awaiting = outcome == "completed" && gated && r.1 != "approved";
                if started && t.current.as_deref() == Some(&run) {
                    set(t, if awaiting { "awaiting_review" } else { outcome });
                }
            }
            "task.run_review_requested" => {
                ensure(t);
                let r = t.runs.get_mut(&run).unwrap();
                r.2 = true;
                r.1 = "pending".into();
                if t.current.as_deref() == Some(&run) {
                    set(t, "awaiting_review");
                }
            }
            "task.run_review_approved" => {
                ensure(t);
                t.runs.get_mut(&run).unwrap().1 = "approved".into();
                if t.started.contains(&run) && t.current.as_deref() == Some(&run) {
                    set(t, "completed");
                }
            }
            "task.run_review_rejected" => {
                ensure(t);
                let c = p["continuation"].as_bool().unwrap_or(false);
                let r = t.runs.get_mut(&run).unwrap();
                r.1 = "rejected".into();
                if c {
                    r.0 = "running".into();
                }
                if t.current.as_deref() == Some(&run) {
                    set(t, if c { "running" } else { "open" });
                }
            }
            "task.canceled" => {
                set(t, "canceled");
                t.canceled = true;
            }
            _ => {}
        }
    }
    m
}

/// A log in `dir` with a small cache and frequent index merges (so lookups and conditions go
/// through the merged indexes too), its models folded.
fn small_log(dir: &tempfile::TempDir) -> common::Folded {
    let mut cfg = LogConfig::new(dir.path().join("log.redb"));
    cfg.cache_bytes = 4 << 20;
    cfg.merge_threshold = 7;
    common::Folded::open(&cfg).0
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn live_equals_rebuild_and_reference(ops in proptest::collection::vec(op(), 1..80), chunked in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let rt = rt();
        let log = small_log(&dir);
        let mut sent: Vec<NewEvent> = Vec::new();
        let mut stored: Vec<(u64, NewEvent)> = Vec::new();
        let mut pending: Vec<NewEvent> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let ev = match op {
                Op::Repeat(k) if !sent.is_empty() => sent[k % sent.len()].clone(),
                Op::Repeat(_) => continue,
                other => match to_event(i, other) { Some(e) => e, None => continue },
            };
            sent.push(ev.clone());
            pending.push(ev);
            // Flush in small batches, or one by one.
            if !chunked || pending.len() >= 3 {
                let batch = std::mem::take(&mut pending);
                match rt.block_on(log.append(batch.clone())) {
                    Ok(r) => {
                        for (e, a) in batch.into_iter().zip(r.events) {
                            if !a.duplicate { stored.push((a.seq, e)); }
                        }
                    }
                    // A batch repeating a notification id with other content conflicts: fine.
                    Err(tidemark_log::AppendError::Conflict { .. }) => {}
                    Err(e) => prop_assert!(false, "append failed: {e}"),
                }
            }
        }
        if !pending.is_empty() {
            let batch = std::mem::take(&mut pending);
            if let Ok(r) = rt.block_on(log.append(batch.clone())) {
                for (e, a) in batch.into_iter().zip(r.events) {
                    if !a.duplicate { stored.push((a.seq, e)); }
                }
            }
        }
        stored.sort_by_key(|(s, _)| *s);
        // The tasks model against the reference.
        let want = reference(&stored);
        for (id, rt_) in &want {
            let got = tasks::View::new(&log.db().snapshot().unwrap()).unwrap().row(id.as_str()).unwrap().expect("task row");
            prop_assert_eq!(got.status.as_str(), rt_.status.as_str(), "status of {}", id);
            prop_assert_eq!(&got.current_run_id, &rt_.current);
            prop_assert_eq!(got.latest_event_seq, rt_.latest);
            prop_assert_eq!(got.runs.len(), rt_.runs.len());
            for r in &got.runs {
                let w = &rt_.runs[&r.run_id];
                prop_assert_eq!(&r.outcome, &w.0);
                prop_assert_eq!(r.review.state.as_str(), w.1.as_str());
            }
        }
        // The cursors model against its reference.
        for ((c, st, subject), want) in cursor_reference(&stored) {
            let snapshot = log.db().snapshot().unwrap();
            let got = cursors::View::new(&snapshot).unwrap().get(&c, &st, &subject).unwrap();
            prop_assert_eq!(got.last_sequence, want, "cursor {} {} {}", c, st, subject);
        }
        // Every projection that was sent an event that must change it recorded changes.
        let sent = |ty: &str| stored.iter().any(|(_, e)| e.event_type == ty);
        let infos = models::projections(&log.db(), log.head()).unwrap();
        for (proj, ty) in [
            ("deliveries", "delivery.created"),
            ("deliveries", "recipient.suppressed"),
            ("cursors", "cursor.advanced"),
            ("cursors", "cursor.failed"),
            ("bridges", "bridge.subscribed"),
            ("settings", "settings.updated"),
        ] {
            let info = infos.iter().find(|i| i.name == proj).unwrap();
            if sent(ty) {
                prop_assert!(info.changes > 0, "{} folded none of its events ({})", proj, ty);
            }
        }
        // Every projection: verify (no swap) and rebuild (swap) are identical to live.
        let head = log.head();
        for p in tidemark_projections::all() {
            let before = models::projections(&log.db(), head).unwrap().into_iter().find(|i| i.name == p.name()).unwrap();
            prop_assert_eq!(before.checkpoint, head);
            let v = (rebuild::rebuild(&log.models, &log.log, p, false, |_, _| {})).unwrap();
            prop_assert!(v.identical, "verify of {} diverged at {:?}", p.name(), v.first_divergent_seq);
            prop_assert_eq!(&v.digest, &before.digest);
            let r = (rebuild::rebuild(&log.models, &log.log, p, true, |_, _| {})).unwrap();
            prop_assert!(r.identical);
            prop_assert_eq!(r.events_replayed, head);
            let after = models::projections(&log.db(), head).unwrap().into_iter().find(|i| i.name == p.name()).unwrap();
            prop_assert_eq!(&after.digest, &before.digest);
            prop_assert_eq!(after.generation, before.generation + 1);
        }
        // All of them in one pass over the log: the same digests, verify and rebuild.
        let before = models::projections(&log.db(), head).unwrap();
        for swap in [false, true] {
            let reports = (rebuild::rebuild_many(&log.models, &log.log, tidemark_projections::all(), swap, |_, _| {})).unwrap();
            prop_assert_eq!(reports.len(), before.len());
            for (r, b) in reports.iter().zip(&before) {
                prop_assert_eq!(&r.name, &b.name);
                prop_assert!(r.identical, "one-pass {} of {} diverged at {:?}", if swap { "rebuild" } else { "verify" }, r.name, r.first_divergent_seq);
                prop_assert_eq!(&r.digest, &b.digest);
                prop_assert_eq!(r.events_replayed, head);
            }
        }
        let after = models::projections(&log.db(), head).unwrap();
        for (a, b) in after.iter().zip(&before) {
            prop_assert_eq!(&a.digest, &b.digest);
            prop_assert_eq!(a.generation, b.generation + 1);
        }
        // After the swap the read model still answers the same.
        for (id, rt_) in &want {
            let got = tasks::View::new(&log.db().snapshot().unwrap()).unwrap().row(id.as_str()).unwrap().expect("task row after rebuild");
            prop_assert_eq!(got.status.as_str(), rt_.status.as_str());
        }
        rt.block_on(log.close());
    }
}

/// A rebuild that differs from the live model names where they part: the live digests are
/// recorded every `DIGEST_EVERY` seqs (section 10), the first differing boundary bounds the
/// range, and the first event of that range that changes the model is named. The live model is
/// tampered with by rewriting one recorded digest, as a fold that once did something else
/// would have left it; a second rebuild after a swap is identical again.
#[test]
fn divergence_is_located() {
    use redb::ReadableTable;
    use tidemark_projections::framework::DIGEST_EVERY;
    let (dir, rt, cfg, log) = fresh();
    let n = 2 * DIGEST_EVERY + DIGEST_EVERY / 2;
    for chunk in 0..n / 100 {
        let batch = (0..100)
            .map(|i| task_created(format!("t{}", chunk * 100 + i)))
            .collect();
        rt.block_on(log.append(batch)).unwrap();
    }
    let v = rebuild_tasks(&rt, &log, false);
    assert!(v.identical, "untampered: {v:?}");
    rt.block_on(log.close());
    drop(log);
    // Tamper: rewrite the live digest recorded at the second boundary directly in the file.
    common::edit_models(dir.path(), |txn| {
        let def: redb::TableDefinition<u64, &[u8]> =
            redb::TableDefinition::new("p.tasks.digests.g0");
        let mut t = txn.open_table(def).unwrap();
        let rows: Vec<u64> = t.iter().unwrap().map(|r| r.unwrap().0.value()).collect();
        assert_eq!(
            rows,
            vec![DIGEST_EVERY, 2 * DIGEST_EVERY],
            "a row at each boundary"
        );
        t.insert(2 * DIGEST_EVERY, [7u8; 32].as_slice()).unwrap();
    });
    let (log, _) = common::Folded::open(&cfg);
    let v = rebuild_tasks(&rt, &log, false);
    assert!(!v.identical);
    assert_eq!(v.first_divergent_seq, Some(DIGEST_EVERY + 1));
    // The swap replaces the tampered rows; the next verify is identical.
    let r = rebuild_tasks(&rt, &log, true);
    assert_eq!(r.first_divergent_seq, Some(DIGEST_EVERY + 1));
    let v = rebuild_tasks(&rt, &log, false);
    assert!(v.identical, "after the swap: {v:?}");
    rt.block_on(log.close());
}

/// A divergence after the last boundary (the live model's current digest differs) is located
/// in the range from that boundary to the head.
#[test]
fn divergence_after_the_last_boundary_is_located() {
    let (dir, rt, cfg, log) = fresh();
    append_one_by_one(&rt, &log, 5);
    rt.block_on(log.close());
    drop(log);
    common::edit_models(dir.path(), |txn| {
        common::edit_meta(txn, "tasks", |meta| meta.digest = [7; 32]);
    });
    let (log, _) = common::Folded::open(&cfg);
    let v = rebuild_tasks(&rt, &log, false);
    assert!(!v.identical);
    assert_eq!(v.first_divergent_seq, Some(1));
    rt.block_on(log.close());
}

/// A `task.created` of task `subject`.
fn task_created(subject: String) -> NewEvent {
    NewEvent::new(
        None,
        "task_events",
        subject,
        "task.created",
        &json!({"project_id": "p"}),
    )
    .unwrap()
}

/// A fresh log with its models store in a temporary directory, the runtime that drives it, and
/// its config (to open it again).
fn fresh() -> (
    tempfile::TempDir,
    tokio::runtime::Runtime,
    LogConfig,
    common::Folded,
) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig::new(dir.path().join("log.redb"));
    let (log, _) = common::Folded::open(&cfg);
    (dir, rt(), cfg, log)
}

/// `task.created` of tasks `t0` to `t<n - 1>`, one append each.
fn append_one_by_one(rt: &tokio::runtime::Runtime, log: &common::Folded, n: usize) {
    for i in 0..n {
        rt.block_on(log.append(vec![task_created(format!("t{i}"))]))
            .unwrap();
    }
}

/// Verify (`swap` false) or rebuild the tasks model of `log`, from within the runtime.
fn rebuild_tasks(
    rt: &tokio::runtime::Runtime,
    log: &common::Folded,
    swap: bool,
) -> rebuild::RebuildReport {
    let p = tidemark_projections::by_name("tasks").unwrap();
    rt.block_on(async { rebuild::rebuild(&log.models, &log.log, p, swap, |_, _| {}) })
        .unwrap()
}

/// How many tasks the tasks model holds, folded up to the head.
fn tasks_in(log: &common::Folded) -> u64 {
    let filter = tasks::read::TaskFilter {
        limit: 1_000_000,
        ..Default::default()
    };
    tasks::View::new(&log.db().snapshot().unwrap())
        .unwrap()
        .page(&filter)
        .unwrap()
        .0
        .len() as u64
}

/// The story: a rebuild chunk used to read the log through its own read transaction, while
/// the writer had grouped it with appends that were staged but not committed. Those events
/// were skipped, the checkpoint still moved past them, and after the swap the model lacked
/// acknowledged writes. Rebuilds now read through the writer's transaction; this test runs
/// rebuilds and verifies while appenders keep the writer's groups full.
#[test]
fn rebuild_under_concurrent_appends_misses_nothing() {
    let (_dir, rt, _cfg, log) = fresh();
    rt.block_on(async {
        use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        // Appends each rebuild round allows (and more per chunk it folds): the appenders race
        // every round, unpaced, while the log stays small enough to rebuild twelve times (a
        // rebuild outpaced by appends is the next test's).
        let budget = std::sync::Arc::new(AtomicI64::new(0));
        let mut appenders = Vec::new();
        for a in 0..8 {
            let log = log.clone();
            let stop = stop.clone();
            let budget = budget.clone();
            appenders.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if budget.fetch_sub(1, Ordering::Relaxed) <= 0 {
                        budget.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                        continue;
                    }
                    log.append(vec![task_created(format!("t{a}-{n}"))])
                        .await
                        .unwrap();
                    n += 1;
                }
                n
            }));
        }
        let p = tidemark_projections::by_name("tasks").unwrap();
        for i in 0..12 {
            let (m, l) = (log.models.clone(), log.log.clone());
            budget.fetch_add(2_500, Ordering::Relaxed);
            // The round starts while the appenders are at work.
            while budget.load(Ordering::Relaxed) > 1_500 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            let budget = budget.clone();
            let r = tokio::task::spawn_blocking(move || {
                rebuild::rebuild(&m, &l, p, i % 2 == 0, |_, _| {
                    budget.fetch_add(250, Ordering::Relaxed);
                })
            })
            .await
            .unwrap()
            .unwrap();
            assert!(
                r.identical,
                "round {i}: diverged at {:?}",
                r.first_divergent_seq
            );
        }
        stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        for a in appenders {
            total += a.await.unwrap();
        }
        assert_eq!(
            tasks_in(&log),
            total,
            "every acknowledged task.created is in the model"
        );
        let info = models::projections(&log.db(), log.head()).unwrap();
        assert!(info.iter().all(|i| i.lag == 0));
        log.close().await;
    });
}

/// A rebuild reaches the head even when the log grows faster than it folds: each chunk here is
/// followed by more than a chunk's worth of appends (made from its progress callback, so the
/// race is the same on every machine). With a fixed chunk the rebuild chased the head for ever
/// (a hang seen under load); it must end within a few chunks and be identical.
#[test]
fn a_rebuild_outpaced_by_appends_still_reaches_the_head() {
    let (_dir, rt, _cfg, log) = fresh();
    let batch = |from: u64, n: u64| -> Vec<NewEvent> {
        (from..from + n)
            .map(|i| task_created(format!("t{i}")))
            .collect()
    };
    let append = |from: u64, n: u64| {
        for start in (from..from + n).step_by(1_000) {
            let len = 1_000.min(from + n - start);
            rt.block_on(log.append(batch(start, len))).unwrap();
        }
    };
    let initial = rebuild::CHUNK + rebuild::CHUNK / 2;
    append(0, initial);
    let p = tidemark_projections::by_name("tasks").unwrap();
    let calls = std::cell::Cell::new(0u64);
    let appended = std::cell::Cell::new(initial);
    // More than a chunk after each of the first 12 chunks; then the appends stop, so the old
    // code ends too (after 13 or more chunks) and the count below tells them apart.
    let r = rebuild::rebuild(&log.models, &log.log, p, true, |upto, head| {
        calls.set(calls.get() + 1);
        if calls.get() <= 12 && upto < head {
            let n = rebuild::CHUNK + 1_000;
            append(appended.get(), n);
            appended.set(appended.get() + n);
        }
    })
    .unwrap();
    assert!(r.identical, "diverged at {:?}", r.first_divergent_seq);
    assert!(
        calls.get() <= 4,
        "the rebuild took {} chunks to reach a head that grew by more than a chunk per chunk",
        calls.get()
    );
    assert_eq!(r.events_replayed, log.head());
    assert_eq!(tasks_in(&log), appended.get());
    rt.block_on(log.close());
}

/// A projection whose stored format is older than the code (its `version` differs) is rebuilt
/// from the log at open, into a new generation, rather than folded on rows of another shape.
/// The stored version is rewritten in the file to stand in for a release that bumped it.
#[test]
fn an_old_projection_format_is_rebuilt_at_open() {
    let (dir, rt, cfg, log) = fresh();
    append_one_by_one(&rt, &log, 20);
    let before = models::projections(&log.db(), log.head()).unwrap();
    rt.block_on(log.close());
    drop(log);
    common::edit_models(dir.path(), |txn| {
        common::edit_meta(txn, "tasks", |m| m.version = 0);
    });
    let (log, _) = common::Folded::open(&cfg);
    let after = models::projections(&log.db(), log.head()).unwrap();
    let (b, a) = (&before[0], &after[0]);
    assert_eq!(a.name, "tasks");
    assert_eq!(
        a.generation,
        b.generation + 1,
        "rebuilt into a new generation"
    );
    assert_eq!(a.digest, b.digest, "the same log folds to the same model");
    assert_eq!(a.lag, 0);
    assert_eq!(
        tasks::View::new(&log.db().snapshot().unwrap())
            .unwrap()
            .row("t19")
            .unwrap()
            .unwrap()
            .project_id
            .as_deref(),
        Some("p")
    );
    rt.block_on(log.close());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Tenants (spec section 20) fold apart: random traffic spread over three tenants of one
    /// log (an event resent in another tenant is that tenant's own), and each tenant's tasks
    /// and cursors models match the references computed from its events alone, whatever the
    /// others did; verify and rebuild reproduce the digests over every tenant's tables.
    #[test]
    fn tenants_fold_apart(
        ops in proptest::collection::vec((op(), 0..3usize), 1..80),
    ) {
        const TENANTS: [&str; 3] = ["default", "acme", "beta"];
        let dir = tempfile::tempdir().unwrap();
        let rt = rt();
        let log = small_log(&dir);
        let mut sent: Vec<NewEvent> = Vec::new();
        let mut stored: [Vec<(u64, NewEvent)>; 3] = Default::default();
        for (i, (op, t)) in ops.iter().enumerate() {
            let ev = match op {
                Op::Repeat(k) if !sent.is_empty() => sent[k % sent.len()].clone(),
                Op::Repeat(_) => continue,
                other => match to_event(i, other) { Some(e) => e, None => continue },
            };
            sent.push(ev.clone());
            let ev = ev.in_tenant(TENANTS[*t]).unwrap();
            match rt.block_on(log.append(vec![ev.clone()])) {
                Ok(r) if !r.events[0].duplicate => stored[*t].push((r.events[0].seq, ev)),
                Ok(_) | Err(tidemark_log::AppendError::Conflict { .. }) => {}
                Err(e) => prop_assert!(false, "append failed: {e}"),
            }
        }
        let check = |log: &common::Folded| -> Result<(), TestCaseError> {
            for (t, stored) in stored.iter().enumerate() {
                let tenant = tidemark_log::tenant_of(TENANTS[t]);
                let snap = || {
                    let mut s = log.db().snapshot().unwrap();
                    s.enter(tenant);
                    s
                };
                let want = reference(stored);
                for (id, rt_) in &want {
                    let got = tasks::View::new(&snap()).unwrap().row(id.as_str()).unwrap();
                    let got = got.unwrap_or_else(|| panic!("{}'s task {id}", TENANTS[t]));
                    prop_assert_eq!(got.status.as_str(), rt_.status.as_str(), "status of {}", id);
                    prop_assert_eq!(got.latest_event_seq, rt_.latest);
                    prop_assert_eq!(got.runs.len(), rt_.runs.len());
                }
                // No task of another tenant's shows in this one's model.
                let f = tasks::read::TaskFilter { limit: 10_000, ..Default::default() };
                let (page, _) = tasks::View::new(&snap()).unwrap().page(&f).unwrap();
                for task in &page {
                    prop_assert!(want.contains_key(task.task_id.as_str()),
                        "{}'s model holds task {} it was never sent", TENANTS[t], task.task_id);
                }
                prop_assert_eq!(page.len(), want.len());
                for ((c, st, subject), w) in cursor_reference(stored) {
                    let got = cursors::View::new(&snap()).unwrap().get(&c, &st, &subject).unwrap();
                    prop_assert_eq!(got.last_sequence, w, "{} cursor {} {} {}", TENANTS[t], c, st, subject);
                }
            }
            Ok(())
        };
        check(&log)?;
        let head = log.head();
        let before = models::projections(&log.db(), head).unwrap();
        for swap in [false, true] {
            let reports = (rebuild::rebuild_many(&log.models, &log.log, tidemark_projections::all(), swap, |_, _| {})).unwrap();
            for (r, b) in reports.iter().zip(&before) {
                prop_assert!(r.identical, "{} of {} diverged at {:?}", if swap { "rebuild" } else { "verify" }, r.name, r.first_divergent_seq);
                prop_assert_eq!(&r.digest, &b.digest);
            }
        }
        // After the swap (every tenant's tables rebuilt in generation g+1, g dropped) each
        // tenant's models answer the same.
        check(&log)?;
        rt.block_on(log.close());
    }
}
