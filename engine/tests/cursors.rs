//! I4 on a real log: random sequences of cursor advances (random seq, a delivery id from a
//! small set, an optional `expected_sequence`), replays of earlier advances, and resets (random
//! target, a reason that may be empty or blank), executed through the engine exactly as the server
//! runs them, against a simple model of spec section 6 written here. After every step:
//! - the outcome (advanced, idempotent replay, or the refusal's code) is the model's;
//! - a refused command appended nothing and changed no cursor, an idempotent replay appended
//!   nothing;
//! - `last_sequence` never went down except by a reset, and each accepted command appended
//!   exactly one event recording it;
//!
//! and at the end the log's `cursor.reset` events are exactly the accepted resets (each with a
//! non-empty reason), the cursor events replayed here only go down at resets, and the live
//! `cursors` model equals a rebuild of it (I3).

mod common;

use std::collections::HashMap;
use tidemark_engine::CommandError;

use common::{engine_with_clock, events_after, rt};
use proptest::prelude::*;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tidemark_engine::Command;
use tidemark_engine::Engine;
use tidemark_engine::commands::cursors::{Advance, Reset};
use tidemark_log::Event;
use tidemark_projections::cursors::Cursor;

/// Cursor keys: two scoped to a subject, one unscoped; two of them share a consumer.
const KEYS: [(&str, &str, &str); 3] = [
    ("c1", "orders", ""),
    ("c1", "orders", "o-1"),
    ("bridge_task_subscription:s1", "task_events", "t-1"),
];
const DELIVERIES: [&str; 3] = ["d-a", "d-b", "d-c"];
const REASONS: [&str; 4] = [
    "",
    "   ",
    "replay after the incident",
    "skip a poison event",
];

#[derive(Debug, Clone)]
enum Expected {
    /// The cursor's position at the time of the command (a CAS that holds).
    Current,
    /// A fixed value (may happen to be the current one).
    Fixed(u64),
}

#[derive(Debug, Clone)]
enum Op {
    Advance {
        key: usize,
        seq: u64,
        delivery: usize,
        expected: Option<Expected>,
    },
    /// The same request as an earlier accepted advance (a client retrying).
    Replay {
        pick: usize,
    },
    Reset {
        key: usize,
        to: u64,
        reason: usize,
    },
}

fn expected() -> impl Strategy<Value = Option<Expected>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(Expected::Current)),
        1 => (0u64..24).prop_map(|n| Some(Expected::Fixed(n))),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS.len(), 0u64..24, 0..DELIVERIES.len(), expected())
            .prop_map(|(key, seq, delivery, expected)| Op::Advance { key, seq, delivery, expected }),
        2 => any::<usize>().prop_map(|pick| Op::Replay { pick }),
        2 => (0..KEYS.len(), 0u64..24, 0..REASONS.len())
            .prop_map(|(key, to, reason)| Op::Reset { key, to, reason }),
    ]
}

/// The model of one cursor.
#[derive(Debug, Clone, Default, PartialEq)]
struct Model {
    last_sequence: u64,
    delivery: Option<String>,
}

/// What the model says a command does.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Accepted, one event appended.
    Moved,
    /// Accepted as an idempotent replay, nothing appended.
    Same,
    /// Refused with this code.
    Refused(&'static str),
}

fn model_advance(m: &Model, a: &Advance) -> Outcome {
    if let Some(e) = a.expected_sequence
        && e != m.last_sequence
    {
        return Outcome::Refused("cursor_conflict");
    }
    if a.last_sequence == m.last_sequence && m.delivery.as_deref() == Some(a.delivery_id.as_str()) {
        return Outcome::Same;
    }
    if a.last_sequence <= m.last_sequence {
        return Outcome::Refused("non_monotonic_cursor");
    }
    Outcome::Moved
}

struct Harness {
    rt: tokio::runtime::Runtime,
    engine: Engine,
    clock: Arc<AtomicI64>,
}

impl Harness {
    fn open(dir: &std::path::Path) -> Harness {
        let (engine, clock) = engine_with_clock(dir, 0);
        Harness {
            rt: rt(),
            engine,
            clock,
        }
    }

    /// Execute a cursor command at `now_us` through the engine; `Err(code)` for a refusal
    /// (any other failure panics).
    fn run(&self, now_us: i64, cmd: impl Command<Answer = Cursor>) -> Result<Cursor, &'static str> {
        self.clock.store(now_us, Ordering::SeqCst);
        match self.rt.block_on(self.engine.execute(cmd)) {
            Ok((c, _)) => Ok(c),
            Err(CommandError::Rejected { code, .. }) => Err(code.code()),
            Err(e) => panic!("a cursor command failed: {e}"),
        }
    }

    fn reset(
        &self,
        now_us: i64,
        key: (&str, &str, &str),
        to: u64,
        reason: &str,
    ) -> Result<Cursor, &'static str> {
        let (c, s, t) = key;
        self.run(
            now_us,
            Reset {
                consumer_id: c.into(),
                stream_name: s.into(),
                subject_id: t.into(),
                to,
                reason: reason.into(),
                by: None,
            },
        )
    }

    fn cursor(&self, key: usize) -> Cursor {
        let (c, s, t) = KEYS[key];
        self.engine.read().cursor(c, s, t).unwrap()
    }

    fn all(&self) -> Vec<Cursor> {
        (0..KEYS.len()).map(|k| self.cursor(k)).collect()
    }
}

/// The fields a command answers and the projection stores alike (`changed_seq` is the
/// projection's own bookkeeping).
fn visible(
    c: &Cursor,
) -> (
    u64,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<i64>,
) {
    (
        c.last_sequence,
        c.last_delivery_id.clone(),
        c.last_delivered_at_us,
        c.last_error.clone(),
        c.updated_at_us,
    )
}

/// One reset as the log must record it.
#[derive(Debug, Clone, PartialEq)]
struct ResetRecord {
    consumer: String,
    stream: String,
    subject: String,
    from: u64,
    to: u64,
    reason: String,
}

fn check_step(
    h: &Harness,
    key: usize,
    before: &[Cursor],
    head: u64,
    outcome: &Outcome,
    result: &Result<Cursor, &'static str>,
) -> Result<Option<Event>, String> {
    let after = h.all();
    let new = events_after(&h.engine, head);
    match (outcome, result) {
        (Outcome::Refused(code), Err(got)) => {
            if code != got {
                return Err(format!("refused with {got}, the model says {code}"));
            }
            if !new.is_empty() {
                return Err(format!("a refused command appended {} events", new.len()));
            }
            if after != before {
                return Err(format!(
                    "a refused command changed the cursors: {before:?} → {after:?}"
                ));
            }
            Ok(None)
        }
        (Outcome::Same, Ok(c)) => {
            if !new.is_empty() {
                return Err(format!(
                    "an idempotent replay appended {} events",
                    new.len()
                ));
            }
            if after != before {
                return Err("an idempotent replay changed the cursors".into());
            }
            if visible(c) != visible(&before[key]) {
                return Err(format!(
                    "a replay answered {c:?}, the cursor is {:?}",
                    before[key]
                ));
            }
            Ok(None)
        }
        (Outcome::Moved, Ok(c)) => {
            if new.len() != 1 {
                return Err(format!(
                    "an accepted command appended {} events, not one",
                    new.len()
                ));
            }
            let ev = new.into_iter().next().expect("one");
            let (consumer, stream, subject) = KEYS[key];
            if ev.stream != "cursors" || ev.subject != consumer {
                return Err(format!(
                    "cursor event on {}/{} for consumer {consumer}",
                    ev.stream, ev.subject
                ));
            }
            let p = ev.payload_value();
            if p["stream_name"] != stream || p["subject_id"] != subject {
                return Err(format!("cursor event for another key: {p}"));
            }
            if visible(c) != visible(&after[key]) {
                return Err(format!(
                    "the command answered {c:?}, the projection stores {:?}",
                    after[key]
                ));
            }
            if after[key].changed_seq != ev.seq {
                return Err(format!(
                    "changed_seq {} is not the event's seq {}",
                    after[key].changed_seq, ev.seq
                ));
            }
            for k in 0..KEYS.len() {
                if k != key && after[k] != before[k] {
                    return Err(format!("a command on key {key} changed key {k}"));
                }
            }
            Ok(Some(ev))
        }
        (want, got) => Err(format!("the model says {want:?}, the command gave {got:?}")),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn cursors_only_go_down_by_a_recorded_reset(ops in proptest::collection::vec(op(), 1..80)) {
        let dir = tempfile::tempdir().unwrap();
        let h = Harness::open(dir.path());
        let mut models: Vec<Model> = vec![Model::default(); KEYS.len()];
        let mut accepted: Vec<Advance> = Vec::new();
        let mut resets: Vec<ResetRecord> = Vec::new();
        let mut advances = 0usize;
        let mut now: i64 = 1_800_000_000_000_000;

        for op in &ops {
            now += 1_000;
            let before = h.all();
            let head = h.engine.head();
            match op.clone() {
                Op::Advance { .. } | Op::Replay { .. } => {
                    let a = match op.clone() {
                        Op::Advance { key, seq, delivery, expected } => {
                            let (c, s, t) = KEYS[key];
                            Advance {
                                consumer_id: c.into(),
                                stream_name: s.into(),
                                subject_id: t.into(),
                                last_sequence: seq,
                                delivery_id: DELIVERIES[delivery].into(),
                                expected_sequence: expected.map(|e| match e {
                                    Expected::Current => models[key].last_sequence,
                                    Expected::Fixed(n) => n,
                                }),
                            }
                        }
                        Op::Replay { pick } => {
                            if accepted.is_empty() {
                                continue;
                            }
                            accepted[pick % accepted.len()].clone()
                        }
                        Op::Reset { .. } => unreachable!(),
                    };
                    let key = KEYS
                        .iter()
                        .position(|(c, s, t)| *c == a.consumer_id && *s == a.stream_name && *t == a.subject_id)
                        .expect("a known key");
                    let outcome = model_advance(&models[key], &a);
                    let a2 = a.clone();
                    let result = h.run(now, a2);
                    let ev = check_step(&h, key, &before, head, &outcome, &result)
                        .map_err(|e| TestCaseError::fail(format!("{op:?} ({a:?}): {e}")))?;
                    let after = h.cursor(key);
                    prop_assert!(
                        after.last_sequence >= before[key].last_sequence,
                        "{:?}: an advance moved the cursor down ({} → {})",
                        op, before[key].last_sequence, after.last_sequence
                    );
                    if let Some(ev) = ev {
                        prop_assert_eq!(ev.event_type.as_str(), "cursor.advanced");
                        let p = ev.payload_value();
                        prop_assert_eq!(&p["last_sequence"], &Value::from(a.last_sequence));
                        prop_assert_eq!(&p["delivery_id"], &Value::from(a.delivery_id.as_str()));
                        prop_assert!(after.last_sequence > before[key].last_sequence);
                        prop_assert_eq!(after.last_sequence, a.last_sequence);
                        prop_assert_eq!(after.last_delivery_id.as_deref(), Some(a.delivery_id.as_str()));
                        prop_assert_eq!(after.last_delivered_at_us, Some(now));
                        prop_assert_eq!(after.last_error, None);
                        models[key] = Model {
                            last_sequence: a.last_sequence,
                            delivery: Some(a.delivery_id.clone()),
                        };
                        accepted.push(a);
                        advances += 1;
                    }
                }
                Op::Reset { key, to, reason } => {
                    let (c, s, t) = KEYS[key];
                    let reason = REASONS[reason];
                    let outcome = if reason.trim().is_empty() {
                        Outcome::Refused("reason_required")
                    } else {
                        Outcome::Moved
                    };
                    let result = h.reset(now, (c, s, t), to, reason);
                    let ev = check_step(&h, key, &before, head, &outcome, &result)
                        .map_err(|e| TestCaseError::fail(format!("{op:?}: {e}")))?;
                    if let Some(ev) = ev {
                        prop_assert_eq!(ev.event_type.as_str(), "cursor.reset");
                        let p = ev.payload_value();
                        prop_assert_eq!(&p["from"], &Value::from(models[key].last_sequence));
                        prop_assert_eq!(&p["to"], &Value::from(to));
                        prop_assert_eq!(&p["reason"], &Value::from(reason));
                        let after = h.cursor(key);
                        prop_assert_eq!(after.last_sequence, to);
                        prop_assert_eq!(after.last_error, None);
                        // The spec does not say what a reset does to last_delivery_id: it may
                        // keep it or clear it, never invent one.
                        prop_assert!(
                            after.last_delivery_id.is_none()
                                || after.last_delivery_id == models[key].delivery,
                            "a reset set last_delivery_id to {:?}", after.last_delivery_id
                        );
                        resets.push(ResetRecord {
                            consumer: c.into(),
                            stream: s.into(),
                            subject: t.into(),
                            from: models[key].last_sequence,
                            to,
                            reason: reason.into(),
                        });
                        models[key] = Model { last_sequence: to, delivery: after.last_delivery_id };
                    }
                }
            }
            for (k, m) in models.iter().enumerate() {
                let c = h.cursor(k);
                prop_assert_eq!(c.last_sequence, m.last_sequence, "key {} after {:?}", k, op);
                prop_assert_eq!(&c.last_delivery_id, &m.delivery, "key {} after {:?}", k, op);
            }
        }

        // The log records exactly the accepted commands: every reset with its reason, and the
        // cursor events, replayed per key, only go down at a reset.
        let all = events_after(&h.engine, 0);
        let logged: Vec<ResetRecord> = all
            .iter()
            .filter(|e| e.event_type == "cursor.reset")
            .map(|e| {
                let p = e.payload_value();
                ResetRecord {
                    consumer: e.subject.clone(),
                    stream: p["stream_name"].as_str().unwrap_or_default().into(),
                    subject: p["subject_id"].as_str().unwrap_or_default().into(),
                    from: p["from"].as_u64().unwrap_or(u64::MAX),
                    to: p["to"].as_u64().unwrap_or(u64::MAX),
                    reason: p["reason"].as_str().unwrap_or_default().into(),
                }
            })
            .collect();
        prop_assert_eq!(&logged, &resets);
        prop_assert!(logged.iter().all(|r| !r.reason.trim().is_empty()));
        prop_assert_eq!(
            all.iter().filter(|e| e.event_type == "cursor.advanced").count(),
            advances
        );
        let mut replayed: HashMap<(String, String, String), u64> = HashMap::new();
        for e in all.iter().filter(|e| e.stream == "cursors") {
            let p = e.payload_value();
            let k = (
                e.subject.clone(),
                p["stream_name"].as_str().unwrap_or_default().to_owned(),
                p["subject_id"].as_str().unwrap_or_default().to_owned(),
            );
            let cur = replayed.entry(k).or_default();
            match e.event_type.as_str() {
                "cursor.advanced" => {
                    let n = p["last_sequence"].as_u64().unwrap_or(0);
                    prop_assert!(n > *cur, "cursor.advanced at seq {} goes from {} to {}", e.seq, cur, n);
                    *cur = n;
                }
                "cursor.reset" => *cur = p["to"].as_u64().unwrap_or(0),
                other => prop_assert!(false, "unexpected cursor event {}", other),
            }
        }
        for (k, (c, s, t)) in KEYS.iter().enumerate() {
            let want = replayed.get(&((*c).to_owned(), (*s).to_owned(), (*t).to_owned())).copied().unwrap_or(0);
            prop_assert_eq!(h.cursor(k).last_sequence, want, "replay of key {}", k);
        }

        // I3: the live cursors model equals a rebuild of it, and swapping it in changes nothing.
        let live = h.all();
        let v = h.rt.block_on(h.engine.rebuild("cursors", false, |_, _| {})).unwrap().unwrap();
        prop_assert!(v.identical, "cursors verify diverged at {:?}", v.first_divergent_seq);
        let r = h.rt.block_on(h.engine.rebuild("cursors", true, |_, _| {})).unwrap().unwrap();
        prop_assert!(r.identical, "cursors rebuild diverged at {:?}", r.first_divergent_seq);
        prop_assert_eq!(h.all(), live);
        h.rt.block_on(h.engine.close());
    }
}

/// A worked sequence of the rules, so a failure of the property has a readable neighbour.
#[test]
fn advance_replay_conflicts_and_reset() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path());
    let adv = |seq: u64, d: &str, expected: Option<u64>| Advance {
        consumer_id: "c".into(),
        stream_name: "s".into(),
        subject_id: String::new(),
        last_sequence: seq,
        delivery_id: d.into(),
        expected_sequence: expected,
    };
    let zero = h.engine.read().cursor("c", "s", "");
    assert_eq!(zero.unwrap(), Cursor::zero("c", "s", ""));

    let a = adv(5, "d5", None);
    let c = h.run(1, a).unwrap();
    assert_eq!(c.last_sequence, 5);
    let head = h.engine.head();
    let a = adv(5, "d5", Some(5));
    assert!(h.run(2, a).is_ok());
    assert_eq!(h.engine.head(), head, "a replay appended");
    for (a, code) in [
        (adv(5, "other", None), "non_monotonic_cursor"),
        (adv(4, "d4", None), "non_monotonic_cursor"),
        (adv(9, "d9", Some(3)), "cursor_conflict"),
    ] {
        assert_eq!(h.run(3, a), Err(code));
        assert_eq!(h.engine.head(), head, "a refusal appended");
    }
    assert_eq!(h.reset(4, ("c", "s", ""), 1, " "), Err("reason_required"));
    assert_eq!(h.engine.head(), head);
    let c = h.reset(5, ("c", "s", ""), 1, "because").unwrap();
    assert_eq!(c.last_sequence, 1);
    assert_eq!(h.engine.head(), head + 1);
    assert_eq!(
        h.engine.read().cursor("c", "s", "").unwrap().last_sequence,
        1
    );
    h.rt.block_on(h.engine.close());
}
