//! I7 on a real log: random sequences of claim / complete / fail / extend / expire / retry /
//! discard commands (with a simulated clock, so leases expire when the test says), run by the
//! log's writer exactly as the server runs them. After every step:
//! - the `deliveries` stream replayed through the state machine of spec section 5, written
//!   here independently of the product's code, contains only legal transitions, each by the
//!   lease owner where one is needed;
//! - a rejected command appended nothing;
//! - attempts never exceed max_attempts;
//!
//! and at the end the live deliveries model equals a rebuild of it (I3).

use std::collections::HashMap;

use proptest::prelude::*;
use serde_json::{Value, json};
use tidemark_log::{CommandError, Event, Log, LogConfig, NewEvent, ReadQuery};
use tidemark_projections::outbox::{self, Failure};
use tidemark_projections::{read, rebuild};

const MAX_ATTEMPTS: u32 = 3;
const OWNERS: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
enum Op {
    /// An urgent notification (routed to the app sink), maybe for a suppressed recipient.
    Notify {
        recipient: u8,
    },
    Claim {
        owner: u8,
        limit: u8,
        lease_s: u8,
    },
    Complete {
        owner: u8,
        pick: u8,
    },
    Fail {
        owner: u8,
        pick: u8,
        retryable: bool,
        retry_after: bool,
    },
    Extend {
        owner: u8,
        pick: u8,
    },
    /// Advance the clock by this many seconds and run the expiry tick.
    Tick {
        secs: u8,
    },
    Retry {
        pick: u8,
    },
    Discard {
        pick: u8,
    },
    Suppress {
        recipient: u8,
        on: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3).prop_map(|recipient| Op::Notify { recipient }),
        3 => (0u8..3, 1u8..4, 1u8..10).prop_map(|(owner, limit, lease_s)| Op::Claim { owner, limit, lease_s }),
        3 => (0u8..3, any::<u8>()).prop_map(|(owner, pick)| Op::Complete { owner, pick }),
        3 => (0u8..3, any::<u8>(), any::<bool>(), any::<bool>())
            .prop_map(|(owner, pick, retryable, retry_after)| Op::Fail { owner, pick, retryable, retry_after }),
        1 => (0u8..3, any::<u8>()).prop_map(|(owner, pick)| Op::Extend { owner, pick }),
        2 => (0u8..20).prop_map(|secs| Op::Tick { secs }),
        1 => any::<u8>().prop_map(|pick| Op::Retry { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Discard { pick }),
        1 => (0u8..3, any::<bool>()).prop_map(|(recipient, on)| Op::Suppress { recipient, on }),
    ]
}

/// The state machine of spec section 5, independent of the product's `allowed`.
#[derive(Debug, Clone, PartialEq)]
struct Model {
    status: String,
    owner: Option<String>,
    attempts: u32,
}

fn check_transition(m: &mut Model, ev: &Event) -> Result<(), String> {
    let kind = &ev.event_type["delivery.".len()..];
    let p: Value = ev.payload_value();
    let owner = p.get("owner").and_then(Value::as_str).map(str::to_owned);
    let parked = p.get("parked").and_then(Value::as_bool).unwrap_or(false);
    let s = m.status.as_str();
    let next: &str = match (s, kind) {
        ("queued" | "retry_wait", "leased") => {
            m.attempts += 1;
            m.owner = owner;
            "leased"
        }
        ("queued" | "retry_wait", "skipped") => "skipped",
        ("queued" | "retry_wait", "cancelled") => "cancelled",
        ("leased", "lease_extended") if owner == m.owner => "leased",
        ("leased", "sent") if owner == m.owner => "sent",
        ("leased", "attempt_failed") if owner == m.owner => {
            if parked {
                "parked"
            } else {
                "retry_wait"
            }
        }
        ("leased", "lease_expired") => {
            if parked {
                "parked"
            } else {
                "queued"
            }
        }
        ("parked", "retried") => {
            m.attempts = 0;
            "queued"
        }
        ("parked", "discarded") => "discarded",
        _ => {
            return Err(format!(
                "illegal transition {kind} from {s} (owner {owner:?}, lease owner {:?}) at seq {}",
                m.owner, ev.seq
            ));
        }
    };
    // Parking happens exactly when the attempts are used up or the failure is permanent.
    if kind == "attempt_failed" {
        let retryable = p.get("retryable").and_then(Value::as_bool).unwrap_or(true);
        if parked != (!retryable || m.attempts >= MAX_ATTEMPTS) {
            return Err(format!("wrong parking decision at seq {}", ev.seq));
        }
    }
    if kind == "lease_expired" && parked != (m.attempts >= MAX_ATTEMPTS) {
        return Err(format!(
            "wrong parking decision on expiry at seq {}",
            ev.seq
        ));
    }
    if m.attempts > MAX_ATTEMPTS {
        return Err(format!(
            "attempts {} above the maximum at seq {}",
            m.attempts, ev.seq
        ));
    }
    m.status = next.to_owned();
    Ok(())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn all_events(log: &Log, after: u64) -> Vec<Event> {
    let mut out = Vec::new();
    let mut after = after;
    loop {
        let page = log
            .read(&ReadQuery {
                after,
                limit: 1000,
                ..ReadQuery::default()
            })
            .unwrap();
        if page.events.is_empty() {
            return out;
        }
        after = page.next_after;
        out.extend(page.events);
    }
}

struct Harness {
    rt: tokio::runtime::Runtime,
    log: Log,
    now: i64,
    models: HashMap<String, Model>,
    checked: u64,
    routed: u64,
}

impl Harness {
    fn append(&mut self, ev: NewEvent) {
        self.rt.block_on(self.log.append(vec![ev])).unwrap();
        self.route();
    }

    /// What the scheduler does: hand the new notifications to the routing command.
    fn route(&mut self) {
        let source = all_events(&self.log, self.routed);
        self.routed = self.log.head();
        self.rt
            .block_on(
                self.log
                    .command(true, move |txn, _| Ok(((), outbox::route(txn, &source)?))),
            )
            .unwrap();
    }

    /// Run a command; a rejection must leave the log as it was.
    fn run<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(
            &tidemark_log::redb::WriteTransaction,
        ) -> Result<(R, Vec<NewEvent>), CommandError>
        + Send
        + 'static,
    ) -> Result<R, String> {
        let head = self.log.head();
        match self
            .rt
            .block_on(self.log.command(true, move |txn, _| f(txn)))
        {
            Ok((r, _)) => Ok(r),
            Err(CommandError::Rejected { code, .. }) => {
                if self.log.head() != head {
                    return Err(format!("rejected command ({code}) appended events"));
                }
                Err(REJECTED.into())
            }
            Err(e) => Err(format!("command failed: {e}")),
        }
    }

    /// Replay new deliveries events through the reference state machine.
    fn check(&mut self) -> Result<(), String> {
        for ev in all_events(&self.log, self.checked) {
            self.checked = ev.seq;
            if ev.stream != "deliveries" {
                continue;
            }
            if ev.event_type == "delivery.created" {
                let status = ev.payload_value()["status"].as_str().unwrap().to_owned();
                self.models.insert(
                    ev.subject.clone(),
                    Model {
                        status,
                        owner: None,
                        attempts: 0,
                    },
                );
                continue;
            }
            let m = self
                .models
                .get_mut(&ev.subject)
                .ok_or_else(|| format!("event for unknown delivery at seq {}", ev.seq))?;
            check_transition(m, &ev)?;
        }
        // The read model agrees with the reference.
        for (id, m) in &self.models {
            let (row, _) = read::delivery(self.log.db(), id).unwrap().expect("row");
            if row.status != m.status || row.attempts != m.attempts {
                return Err(format!(
                    "{id}: model says {m:?}, read model {} attempts {}",
                    row.status, row.attempts
                ));
            }
            if row.attempts > row.max_attempts {
                return Err(format!("{id}: attempts above max"));
            }
        }
        Ok(())
    }

    fn pick(&self, pick: u8) -> Option<String> {
        let mut ids: Vec<&String> = self.models.keys().collect();
        ids.sort();
        (!ids.is_empty()).then(|| ids[pick as usize % ids.len()].clone())
    }
}

/// What [`Harness::run`] answers for a command that was refused, as commands may be.
const REJECTED: &str = "rejected";

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn commands_only_make_legal_transitions(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = LogConfig::new(dir.path().join("log.redb"));
        cfg.cache_bytes = 4 << 20;
        let (log, _) = Log::open_with(&cfg, vec![tidemark_projections::projector()]).unwrap();
        let mut h = Harness { rt: rt(), log, now: 1_800_000_000_000_000, models: HashMap::new(), checked: 0, routed: 0 };
        let settings = json!({"retry": {"max_attempts": MAX_ATTEMPTS, "base_delay": "1s", "max_delay": "8s", "jitter": 0.2}});
        h.append(NewEvent::new(None, "settings", "", "settings.updated", &settings).unwrap());
        let mut n = 0;
        for op in &ops {
            h.now += 100_000;
            let now = h.now;
            let result = match op.clone() {
                Op::Notify { recipient } => {
                    n += 1;
                    let id = format!("n{n}");
                    let p = json!({"priority": "urgent", "title": "t", "recipient": format!("r{recipient}")});
                    h.append(NewEvent::new(Some(id.clone()), "notifications", id, "notification.requested", &p).unwrap());
                    Ok(())
                }
                Op::Suppress { recipient, on } => {
                    let ty = if on { "recipient.suppressed" } else { "recipient.unsuppressed" };
                    h.append(NewEvent::new(None, "recipients", format!("r{recipient}"), ty, &json!({})).unwrap());
                    Ok(())
                }
                Op::Claim { owner, limit, lease_s } => {
                    let o = OWNERS[owner as usize];
                    h.run(move |txn| outbox::claim(txn, now, "app", o, limit as usize, lease_s as u64 * 1000)).map(drop)
                }
                Op::Complete { owner, pick } => match h.pick(pick) {
                    Some(id) => {
                        let o = OWNERS[owner as usize];
                        h.run(move |txn| outbox::complete(txn, now, &id, o, None)).map(drop)
                    }
                    None => Ok(()),
                },
                Op::Fail { owner, pick, retryable, retry_after } => match h.pick(pick) {
                    Some(id) => {
                        let o = OWNERS[owner as usize];
                        let f = Failure { error_code: "boom".into(), error: "it broke".into(), retryable, retry_after_ms: retry_after.then_some(1_500) };
                        h.run(move |txn| outbox::fail(txn, now, &id, o, f)).map(drop)
                    }
                    None => Ok(()),
                },
                Op::Extend { owner, pick } => match h.pick(pick) {
                    Some(id) => {
                        let o = OWNERS[owner as usize];
                        h.run(move |txn| outbox::extend(txn, now, &id, o, 5_000)).map(drop)
                    }
                    None => Ok(()),
                },
                Op::Tick { secs } => {
                    h.now += secs as i64 * 1_000_000;
                    let now = h.now;
                    h.run(move |txn| outbox::expire_leases(txn, now, 1000)).map(drop)
                }
                Op::Retry { pick } | Op::Discard { pick } => match h.pick(pick) {
                    Some(id) => {
                        let kind = if matches!(op, Op::Retry { .. }) { "retried" } else { "discarded" };
                        h.run(move |txn| outbox::operator(txn, now, &id, kind, "op", None)).map(drop)
                    }
                    None => Ok(()),
                },
            };
            if let Err(e) = result && e != REJECTED {
                prop_assert!(false, "{op:?}: {e}");
            }
            if let Err(e) = h.check() {
                prop_assert!(false, "after {op:?}: {e}");
            }
        }
        // Every notification got exactly one delivery.
        prop_assert_eq!(h.models.len(), n);
        // I3: the live model equals a rebuild.
        let p = tidemark_projections::by_name("deliveries").unwrap();
        let v = h.rt.block_on(rebuild::rebuild(&h.log, p, false, |_, _| {})).unwrap();
        prop_assert!(v.identical, "deliveries verify diverged at {:?}", v.first_divergent_seq);
        let r = h.rt.block_on(rebuild::rebuild(&h.log, p, true, |_, _| {})).unwrap();
        prop_assert!(r.identical);
        h.check().map_err(TestCaseError::fail)?;
        h.rt.block_on(h.log.close());
    }
}

/// A worked sequence: the claim of an expired lease releases it first, and the former owner
/// can no longer complete.
#[test]
fn expired_lease_is_released_and_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig::new(dir.path().join("log.redb"));
    let (log, _) = Log::open_with(&cfg, vec![tidemark_projections::projector()]).unwrap();
    let mut h = Harness {
        rt: rt(),
        log,
        now: 1_800_000_000_000_000,
        models: HashMap::new(),
        checked: 0,
        routed: 0,
    };
    let p = json!({"priority": "action", "title": "t"});
    h.append(
        NewEvent::new(
            Some("x".into()),
            "notifications",
            "x",
            "notification.requested",
            &p,
        )
        .unwrap(),
    );
    let now = h.now;
    let got = h
        .run(move |txn| outbox::claim(txn, now, "app", "a", 10, 1_000))
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, "dlv:x:desktop");
    // Before expiry b gets nothing; after it, b gets the row.
    let got = h
        .run(move |txn| outbox::claim(txn, now + 500_000, "app", "b", 10, 1_000))
        .unwrap();
    assert!(got.is_empty());
    let got = h
        .run(move |txn| outbox::claim(txn, now + 1_000_001, "app", "b", 10, 1_000))
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].lease_owner.as_deref(), Some("b"));
    assert_eq!(got[0].attempts, 2);
    let r = h.run(move |txn| outbox::complete(txn, now + 1_100_000, "dlv:x:desktop", "a", None));
    assert_eq!(r.unwrap_err(), REJECTED);
    h.check().unwrap();
    let (_, steps) = read::delivery(h.log.db(), "dlv:x:desktop")
        .unwrap()
        .unwrap();
    let kinds: Vec<&str> = steps.iter().map(|s| s.event.as_str()).collect();
    assert_eq!(kinds, ["created", "leased", "lease_expired", "leased"]);
    h.rt.block_on(h.log.close());
}

/// Routing handed the same notifications again (a restart re-reading its last page) appends
/// nothing: no second delivery, and a digest member never joins twice.
#[test]
fn routing_twice_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig::new(dir.path().join("log.redb"));
    let (log, _) = Log::open_with(&cfg, vec![tidemark_projections::projector()]).unwrap();
    let mut h = Harness {
        rt: rt(),
        log,
        now: 1_800_000_000_000_000,
        models: HashMap::new(),
        checked: 0,
        routed: 0,
    };
    let settings = json!({"routes": {"desktop": {"digest": {"window": "10m", "max_items": 5}}}});
    h.append(NewEvent::new(None, "settings", "", "settings.updated", &settings).unwrap());
    for i in 0..3 {
        let id = format!("d{i}");
        let p = json!({"priority": "action", "title": format!("t{i}"), "recipient": "r", "group_key": "g"});
        h.append(
            NewEvent::new(
                Some(id.clone()),
                "notifications",
                id,
                "notification.requested",
                &p,
            )
            .unwrap(),
        );
    }
    let (row, _) = read::delivery(h.log.db(), "dlv:d0:desktop")
        .unwrap()
        .unwrap();
    assert_eq!(row.items.len(), 3);
    assert_eq!(row.title, "3 new updates");
    let head = h.log.head();
    let everything = all_events(&h.log, 0);
    h.rt.block_on(h.log.command(true, move |txn, _| {
        Ok(((), outbox::route(txn, &everything)?))
    }))
    .unwrap();
    assert_eq!(h.log.head(), head, "routing again appended events");
    let (row, _) = read::delivery(h.log.db(), "dlv:d0:desktop")
        .unwrap()
        .unwrap();
    assert_eq!(row.items.len(), 3);
    // The checkpoint is the last notification (the join after it is at the head).
    assert_eq!(read::routing_checkpoint(h.log.db()).unwrap(), head - 1);
    h.rt.block_on(h.log.close());
}
