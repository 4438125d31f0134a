//! I7 on a real log, as a full outcome model: random sequences of notifications, suppressions,
//! claims, completions (single and batched), failures, extensions, clock ticks with lease
//! expiry, and operator retries / discards, executed through the engine's one entry point
//! (`Engine::execute`) with a simulated clock. The model below is spec section 5 written here,
//! independently of the product's code; for every command it predicts
//! - the result: which deliveries a claim leases and in what order, every refusal code
//!   (`delivery_not_found`, `illegal_transition`, `not_lease_owner`, `lease_expired`), how many
//!   leases an expiry tick releases;
//! - the rows after it: status, owner, attempts, lease expiry (exact) and the next attempt
//!   (exact after an expiry or a retry; within the backoff's jitter bounds after a failure);
//!
//! and after every step it checks that a refusal appended nothing, that the read model equals
//! the model, and that the `deliveries` stream replayed through an independent transition
//! checker holds only legal transitions by the lease owner. At the end the live model equals a
//! rebuild of it (I3).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use tidemark_engine::CommandError;
use tidemark_log::Lookups;

use common::{
    app_claim, deliveries_rebuild_identically, engine_a_day_ahead, events_after, requested, rt,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use tidemark_engine::Command;
use tidemark_engine::Engine;
use tidemark_engine::commands::outbox::{Complete, ExpireLeases, Extend, Fail, Operator, Route};
use tidemark_engine::commands::{Completed, Failure, OperatorAction};
use tidemark_log::{Event, EventLog, NewEvent};
use tidemark_projections::deliveries::Delivery;

const MAX_ATTEMPTS: u32 = 2;
const BASE_MS: u64 = 1_000;
const MAX_DELAY_MS: u64 = 8_000;
const JITTER: f64 = 0.2;
const RETRY_AFTER_MS: u64 = 1_500;
const EXTEND_MS: u64 = 5_000;
const OWNERS: [&str; 3] = ["a", "b", "c"];
const SEC: i64 = 1_000_000;

#[derive(Debug, Clone)]
enum Op {
    /// An urgent notification (routed to the app sink) for recipient `r<recipient>`.
    Notify {
        recipient: u8,
    },
    Suppress {
        recipient: u8,
        on: bool,
    },
    Claim {
        owner: u8,
        limit: u8,
        lease_s: u8,
    },
    /// Complete 1–3 picked deliveries in one command (repeats allowed).
    Complete {
        owner: u8,
        picks: Vec<u8>,
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
    /// Advance the clock without the tick (the real tick runs once a second: between two,
    /// leases end unrecorded).
    Wait {
        secs: u8,
    },
    Retry {
        pick: u8,
    },
    Discard {
        pick: u8,
    },
    /// An operator sends a sent delivery again.
    Resend {
        pick: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3).prop_map(|recipient| Op::Notify { recipient }),
        1 => (0u8..3, any::<bool>()).prop_map(|(recipient, on)| Op::Suppress { recipient, on }),
        3 => (0u8..3, 1u8..4, 1u8..10).prop_map(|(owner, limit, lease_s)| Op::Claim { owner, limit, lease_s }),
        3 => (0u8..3, proptest::collection::vec(any::<u8>(), 1..4)).prop_map(|(owner, picks)| Op::Complete { owner, picks }),
        3 => (0u8..3, any::<u8>(), any::<bool>(), any::<bool>())
            .prop_map(|(owner, pick, retryable, retry_after)| Op::Fail { owner, pick, retryable, retry_after }),
        1 => (0u8..3, any::<u8>()).prop_map(|(owner, pick)| Op::Extend { owner, pick }),
        2 => (0u8..12).prop_map(|secs| Op::Tick { secs }),
        2 => (0u8..6).prop_map(|secs| Op::Wait { secs }),
        1 => any::<u8>().prop_map(|pick| Op::Retry { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Discard { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Resend { pick }),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Queued,
    Leased,
    RetryWait,
    Sent,
    Parked,
    Skipped,
    Discarded,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Leased => "leased",
            Status::RetryWait => "retry_wait",
            Status::Sent => "sent",
            Status::Parked => "parked",
            Status::Skipped => "skipped",
            Status::Discarded => "discarded",
        }
    }
}

/// One delivery as the model sees it.
#[derive(Debug, Clone)]
struct Row {
    recipient: u8,
    status: Status,
    owner: Option<String>,
    attempts: u32,
    lease_until: Option<i64>,
    /// When it can next be claimed: queued / retry_wait rows.
    due: Option<i64>,
    /// After a failure with backoff: the bounds the due time must fall in (the product draws
    /// the jitter; the model learns the value once it checked it is within them).
    due_bounds: Option<(i64, i64)>,
    /// The last failure's code (`lease_expired` after an expiry).
    last_error_code: Option<String>,
}

/// The outbox of spec section 5, one sink, one route.
#[derive(Default)]
struct Model {
    rows: BTreeMap<String, Row>,
    suppressed: BTreeSet<u8>,
}

type Refusal = &'static str;

impl Model {
    fn row(&mut self, id: &str) -> Result<&mut Row, Refusal> {
        self.rows.get_mut(id).ok_or("delivery_not_found")
    }

    /// The checks every lease-holder report passes: leased, by this owner, not expired.
    fn owned(&mut self, id: &str, owner: &str, now: i64) -> Result<&mut Row, Refusal> {
        let r = self.row(id)?;
        if r.status != Status::Leased {
            return Err("illegal_transition");
        }
        if r.owner.as_deref() != Some(owner) {
            return Err("not_lease_owner");
        }
        if r.lease_until.is_some_and(|u| u <= now) {
            return Err("lease_expired");
        }
        Ok(r)
    }

    fn expire(r: &mut Row, now: i64) {
        r.owner = None;
        r.lease_until = None;
        r.last_error_code = Some("lease_expired".into());
        if r.attempts >= MAX_ATTEMPTS {
            r.status = Status::Parked;
            r.due = None;
        } else {
            r.status = Status::Queued;
            r.due = Some(now);
        }
        r.due_bounds = None;
    }

    fn notify(&mut self, id: String, recipient: u8, time_us: i64) {
        let suppressed = self.suppressed.contains(&recipient);
        self.rows.insert(
            id,
            Row {
                recipient,
                status: if suppressed {
                    Status::Skipped
                } else {
                    Status::Queued
                },
                owner: None,
                attempts: 0,
                lease_until: None,
                due: (!suppressed).then_some(time_us),
                due_bounds: None,
                last_error_code: None,
            },
        );
    }

    /// Due rows oldest due first (ties by id): queued and retry_wait past their next attempt,
    /// leased past their lease; a leased one is released first (parked when out of attempts),
    /// a suppressed recipient's is skipped; the first `limit` others are leased.
    fn claim(&mut self, owner: &str, limit: usize, lease_ms: u64, now: i64) -> Vec<String> {
        let mut due: Vec<(i64, String)> = self
            .rows
            .iter()
            .filter_map(|(id, r)| {
                let at = match r.status {
                    Status::Queued | Status::RetryWait => r.due,
                    Status::Leased => r.lease_until,
                    _ => None,
                }?;
                (at <= now).then(|| (at, id.clone()))
            })
            .collect();
        due.sort();
        let mut leased = Vec::new();
        for (_, id) in due {
            if leased.len() >= limit {
                break;
            }
            let suppressed = self.suppressed.contains(&self.rows[&id].recipient);
            let r = self.rows.get_mut(&id).expect("row");
            if r.status == Status::Leased {
                Model::expire(r, now);
                if r.status == Status::Parked {
                    continue;
                }
            }
            if suppressed {
                r.status = Status::Skipped;
                r.due = None;
                continue;
            }
            r.status = Status::Leased;
            r.owner = Some(owner.to_owned());
            r.attempts += 1;
            r.lease_until = Some(now + lease_ms as i64 * 1_000);
            r.due = None;
            r.due_bounds = None;
            leased.push(id);
        }
        leased
    }

    fn complete(&mut self, id: &str, owner: &str, now: i64) -> Result<(), Refusal> {
        let r = self.row(id)?;
        if r.status == Status::Sent && r.owner.as_deref() == Some(owner) {
            return Ok(());
        }
        let r = self.owned(id, owner, now)?;
        r.status = Status::Sent;
        r.lease_until = None;
        Ok(())
    }

    fn fail(
        &mut self,
        id: &str,
        owner: &str,
        retryable: bool,
        retry_after: bool,
        now: i64,
    ) -> Result<(), Refusal> {
        let r = self.owned(id, owner, now)?;
        r.owner = None;
        r.lease_until = None;
        r.last_error_code = Some("boom".into());
        if !retryable || r.attempts >= MAX_ATTEMPTS {
            r.status = Status::Parked;
            r.due = None;
            return Ok(());
        }
        r.status = Status::RetryWait;
        if retry_after {
            r.due = Some(now + RETRY_AFTER_MS as i64 * 1_000);
            r.due_bounds = None;
        } else {
            // min(max, base · 2^(attempt−1)) within ±jitter, capped at max.
            let raw = (BASE_MS << (r.attempts.max(1) - 1).min(20)).min(MAX_DELAY_MS) as f64;
            let lo = ((raw * (1.0 - JITTER)).floor() as u64).min(MAX_DELAY_MS);
            let hi = ((raw * (1.0 + JITTER)).ceil() as u64).min(MAX_DELAY_MS);
            r.due = None;
            r.due_bounds = Some((now + lo as i64 * 1_000, now + hi as i64 * 1_000));
        }
        Ok(())
    }

    fn extend(&mut self, id: &str, owner: &str, now: i64) -> Result<(), Refusal> {
        let r = self.row(id)?;
        if r.status != Status::Leased && r.last_error_code.as_deref() == Some("lease_expired") {
            return Err("lease_expired");
        }
        let r = self.owned(id, owner, now)?;
        r.lease_until = Some(now + EXTEND_MS as i64 * 1_000);
        Ok(())
    }

    fn tick(&mut self, now: i64) -> usize {
        let mut n = 0;
        for r in self.rows.values_mut() {
            if r.status == Status::Leased && r.lease_until.is_some_and(|u| u <= now) {
                Model::expire(r, now);
                n += 1;
            }
        }
        n
    }

    fn operator(&mut self, id: &str, action: OperatorAction, now: i64) -> Result<(), Refusal> {
        let r = self.row(id)?;
        let from = if action == OperatorAction::Resend {
            Status::Sent
        } else {
            Status::Parked
        };
        if r.status != from {
            return Err("illegal_transition");
        }
        match action {
            OperatorAction::Retry | OperatorAction::Resend => {
                r.status = Status::Queued;
                r.attempts = 0;
                r.due = Some(now);
            }
            OperatorAction::Discard => {
                r.status = Status::Discarded;
                r.due = None;
            }
        }
        Ok(())
    }

    /// The product's row agrees with the model's; a due time within bounds is learned.
    fn agree(&mut self, id: &str, got: &Delivery) -> Result<(), String> {
        let r = self
            .rows
            .get_mut(id)
            .ok_or_else(|| format!("{id}: not in the model"))?;
        let ctx = || format!("{id}: model {r:?}, product {got:?}");
        if got.status.as_str() != r.status.name() || got.attempts != r.attempts {
            return Err(ctx());
        }
        if r.status == Status::Leased
            && (got.lease_owner != r.owner || got.lease_expires_at_us != r.lease_until)
        {
            return Err(ctx());
        }
        if matches!(r.status, Status::Queued | Status::RetryWait) {
            let at = got.next_attempt_at_us.or(Some(got.created_at_us));
            match (r.due, r.due_bounds) {
                (Some(d), _) if at != Some(d) => return Err(ctx()),
                (None, Some((lo, hi))) => match at {
                    Some(a) if a >= lo && a <= hi => {
                        r.due = Some(a);
                        r.due_bounds = None;
                    }
                    _ => {
                        return Err(format!(
                            "{}: next attempt outside the backoff bounds",
                            ctx()
                        ));
                    }
                },
                (None, None) => return Err(ctx()),
                _ => {}
            }
        }
        if got.attempts > got.max_attempts {
            return Err(format!("{id}: attempts above max"));
        }
        Ok(())
    }
}

/// The transitions of spec section 5, replayed from the events alone.
#[derive(Debug, Clone, PartialEq)]
struct Replayed {
    status: String,
    owner: Option<String>,
    attempts: u32,
}

fn check_transition(m: &mut Replayed, ev: &Event) -> Result<(), String> {
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
        ("parked", "retried") | ("sent", "resent") => {
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

struct Harness {
    rt: tokio::runtime::Runtime,
    engine: Engine,
    clock: Arc<AtomicI64>,
    model: Model,
    replayed: BTreeMap<String, Replayed>,
    checked: u64,
    routed: u64,
}

impl Harness {
    fn new(dir: &std::path::Path, settings: Option<Value>) -> Harness {
        let (engine, clock) = engine_a_day_ahead(dir);
        let mut h = Harness {
            rt: rt(),
            engine,
            clock,
            model: Model::default(),
            replayed: BTreeMap::new(),
            checked: 0,
            routed: 0,
        };
        if let Some(s) = settings {
            h.append(NewEvent::new(None, "settings", "", "settings.updated", &s).unwrap());
        }
        h
    }

    fn now(&self) -> i64 {
        self.clock.load(Ordering::SeqCst)
    }

    fn advance(&self, us: i64) {
        self.clock.fetch_add(us, Ordering::SeqCst);
    }

    /// Append, then do what the scheduler does: route what is new.
    fn append(&mut self, ev: NewEvent) -> Event {
        let r = self
            .rt
            .block_on(self.engine.log().append(vec![ev]))
            .unwrap();
        let got = self.engine.log().get(r.last_seq).unwrap().unwrap();
        self.route();
        got
    }

    fn route(&mut self) {
        let source = events_after(&self.engine, self.routed);
        self.routed = self.engine.head();
        self.rt
            .block_on(self.engine.execute(Route { source }))
            .unwrap();
    }

    /// Execute; a refusal must leave the log as it was and is answered by its code.
    fn exec<C: Command>(&mut self, cmd: C) -> Result<C::Answer, Refusal> {
        let head = self.engine.head();
        match self.rt.block_on(self.engine.execute(cmd)) {
            Ok((o, _)) => Ok(o),
            Err(CommandError::Rejected { code, .. }) => {
                assert_eq!(
                    self.engine.head(),
                    head,
                    "refused command ({code}) appended events"
                );
                Err(code.code())
            }
            Err(e) => panic!("command failed: {e}"),
        }
    }

    fn row(&self, id: &str) -> Delivery {
        self.engine
            .read()
            .delivery(&id.into())
            .unwrap()
            .expect("row")
            .0
    }

    /// The model and the read model agree on every row; the stream replays legally.
    fn check(&mut self) -> Result<(), String> {
        for ev in events_after(&self.engine, self.checked) {
            self.checked = ev.seq;
            if ev.stream != "deliveries" {
                continue;
            }
            if ev.event_type == "delivery.created" {
                let status = ev.payload_value()["status"].as_str().unwrap().to_owned();
                self.replayed.insert(
                    ev.subject.clone(),
                    Replayed {
                        status,
                        owner: None,
                        attempts: 0,
                    },
                );
                continue;
            }
            let m = self
                .replayed
                .get_mut(&ev.subject)
                .ok_or_else(|| format!("event for unknown delivery at seq {}", ev.seq))?;
            check_transition(m, &ev)?;
        }
        let ids: Vec<String> = self.model.rows.keys().cloned().collect();
        if ids.len() != self.replayed.len() {
            return Err(format!(
                "model has {} deliveries, the log {}",
                ids.len(),
                self.replayed.len()
            ));
        }
        for id in ids {
            let got = self.row(&id);
            self.model.agree(&id, &got)?;
        }
        Ok(())
    }

    /// A delivery to act on: an even pick chooses among the leased ones (where reports by a
    /// lease holder are decided), an odd one among all.
    fn pick(&self, pick: u8) -> Option<String> {
        let leased: Vec<&String> = self
            .model
            .rows
            .iter()
            .filter(|(_, r)| r.status == Status::Leased)
            .map(|(id, _)| id)
            .collect();
        let ids: Vec<&String> = if pick.is_multiple_of(2) && !leased.is_empty() {
            leased
        } else {
            self.model.rows.keys().collect()
        };
        (!ids.is_empty()).then(|| ids[(pick / 2) as usize % ids.len()].clone())
    }

    /// Run one op against the product and the model; `Err` when they disagree.
    fn step(&mut self, op: &Op, n: &mut usize) -> Result<(), String> {
        // Time moves only by ticks, in whole seconds like the leases, so lease ends and due
        // times are hit exactly as often as they are passed.
        let now = self.now();
        match op.clone() {
            Op::Notify { recipient } => {
                *n += 1;
                let id = format!("n{n:03}");
                let p = json!({"priority": "urgent", "title": "t", "recipient": format!("r{recipient}")});
                let ev = self.append(requested(&id, &p));
                self.model
                    .notify(format!("dlv:{id}:desktop"), recipient, ev.time_us);
            }
            Op::Suppress { recipient, on } => {
                let ty = if on {
                    "recipient.suppressed"
                } else {
                    "recipient.unsuppressed"
                };
                self.append(
                    NewEvent::new(None, "recipients", format!("r{recipient}"), ty, &json!({}))
                        .unwrap(),
                );
                if on {
                    self.model.suppressed.insert(recipient);
                } else {
                    self.model.suppressed.remove(&recipient);
                }
            }
            Op::Claim {
                owner,
                limit,
                lease_s,
            } => {
                let o = OWNERS[owner as usize];
                let got = self
                    .exec(app_claim(
                        o,
                        limit as usize,
                        u64::from(lease_s) * 1000,
                        tidemark_log::Share::ALL,
                    ))
                    .map_err(|c| format!("claim refused: {c}"))?;
                let want = self
                    .model
                    .claim(o, limit as usize, u64::from(lease_s) * 1000, now);
                let ids: Vec<String> = got.iter().map(|d| d.id.to_string()).collect();
                if ids != want {
                    return Err(format!("claim leased {ids:?}, the model {want:?}"));
                }
                for d in &got {
                    self.model.agree(d.id.as_str(), d)?;
                }
            }
            Op::Complete { owner, picks } => {
                let o = OWNERS[owner as usize];
                let ids: Vec<String> = picks.iter().filter_map(|p| self.pick(*p)).collect();
                if ids.is_empty() {
                    return Ok(());
                }
                let items = ids.iter().map(|id| (id.as_str().into(), None)).collect();
                let got = self
                    .exec(Complete {
                        owner: o.into(),
                        items,
                        resolved_targets: Vec::new(),
                    })
                    .map_err(|c| format!("batch complete refused as a whole: {c}"))?;
                if got.len() != ids.len() {
                    return Err("complete answered another number of items".into());
                }
                for (id, r) in ids.iter().zip(got) {
                    let want = self.model.complete(id, o, now);
                    match (want, r) {
                        (Ok(()), Completed::Sent(row)) => self.model.agree(id, &row)?,
                        (Err(code), Completed::Refused { code: got, .. }) if code == got.code() => {
                        }
                        (want, got) => {
                            return Err(format!("complete {id}: model {want:?}, product {got:?}"));
                        }
                    }
                }
            }
            Op::Fail {
                owner,
                pick,
                retryable,
                retry_after,
            } => {
                let Some(id) = self.pick(pick) else {
                    return Ok(());
                };
                let o = OWNERS[owner as usize];
                let failure = Failure {
                    error_code: "boom".into(),
                    error: "it broke".into(),
                    retryable,
                    retry_after_ms: retry_after.then_some(RETRY_AFTER_MS),
                };
                let got = self.exec(Fail {
                    id: id.as_str().into(),
                    owner: o.into(),
                    failure,
                });
                let want = self.model.fail(&id, o, retryable, retry_after, now);
                self.compare_one(&id, want, got)?;
            }
            Op::Extend { owner, pick } => {
                let Some(id) = self.pick(pick) else {
                    return Ok(());
                };
                let o = OWNERS[owner as usize];
                let got = self.exec(Extend {
                    id: id.as_str().into(),
                    owner: o.into(),
                    lease_ms: EXTEND_MS,
                });
                let want = self.model.extend(&id, o, now);
                self.compare_one(&id, want, got)?;
            }
            Op::Tick { secs } => {
                self.advance(i64::from(secs) * SEC);
                let now = self.now();
                let got = self
                    .exec(ExpireLeases { max: 1000 })
                    .map_err(|c| format!("expiry refused: {c}"))?;
                let want = self.model.tick(now);
                if got != want {
                    return Err(format!("expiry released {got}, the model {want}"));
                }
            }
            Op::Wait { secs } => self.advance(i64::from(secs) * SEC),
            Op::Retry { pick } | Op::Discard { pick } | Op::Resend { pick } => {
                let Some(id) = self.pick(pick) else {
                    return Ok(());
                };
                let action = match op {
                    Op::Retry { .. } => OperatorAction::Retry,
                    Op::Discard { .. } => OperatorAction::Discard,
                    _ => OperatorAction::Resend,
                };
                let got = self.exec(Operator {
                    id: id.as_str().into(),
                    action,
                    by: Some("op".into()),
                    reason: None,
                });
                let want = self.model.operator(&id, action, now);
                self.compare_one(&id, want, got)?;
            }
        }
        Ok(())
    }

    fn compare_one(
        &mut self,
        id: &str,
        want: Result<(), Refusal>,
        got: Result<Delivery, Refusal>,
    ) -> Result<(), String> {
        match (want, got) {
            (Ok(()), Ok(row)) => self.model.agree(id, &row),
            (Err(w), Err(g)) if w == g => Ok(()),
            (w, g) => Err(format!("{id}: model {w:?}, product {:?}", g.map(|_| "ok"))),
        }
    }
}

fn settings() -> Value {
    json!({"retry": {"max_attempts": MAX_ATTEMPTS, "base_delay": "1s", "max_delay": "8s", "jitter": JITTER}})
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_outcome_is_the_models(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Harness::new(dir.path(), Some(settings()));
        let mut n = 0;
        for op in &ops {
            if let Err(e) = h.step(op, &mut n) {
                prop_assert!(false, "{op:?}: {e}");
            }
            if let Err(e) = h.check() {
                prop_assert!(false, "after {op:?}: {e}");
            }
        }
        prop_assert_eq!(h.model.rows.len(), n, "every notification got exactly one delivery");
        // I3: the live model equals a rebuild.
        deliveries_rebuild_identically(&h.rt, &h.engine).map_err(TestCaseError::fail)?;
        h.check().map_err(TestCaseError::fail)?;
        h.rt.block_on(h.engine.close());
    }
}

/// A worked sequence: before its lease ends a delivery cannot be claimed; after, the claim
/// releases and re-leases it, and the former owner's complete is refused (`not_lease_owner`).
#[test]
fn expired_lease_is_released_and_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::new(dir.path(), None);
    h.append(requested("x", &json!({"priority": "action", "title": "t"})));
    let claim = |owner: &str| app_claim(owner, 10, 1_000, tidemark_log::Share::ALL);
    let got = h.exec(claim("a")).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, "dlv:x:desktop");
    h.advance(500_000);
    assert!(h.exec(claim("b")).unwrap().is_empty());
    h.advance(500_001);
    let got = h.exec(claim("b")).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].lease_owner.as_deref(), Some("b"));
    assert_eq!(got[0].attempts, 2);
    h.advance(100_000);
    let r = h
        .exec(Complete {
            owner: "a".into(),
            items: vec![("dlv:x:desktop".into(), None)],
            resolved_targets: Vec::new(),
        })
        .unwrap();
    assert!(
        matches!(
            &r[0],
            Completed::Refused {
                code: tidemark_engine::Rejection::NotLeaseOwner,
                ..
            }
        ),
        "{r:?}"
    );
    let (_, steps) = h
        .engine
        .read()
        .delivery(&"dlv:x:desktop".into())
        .unwrap()
        .unwrap();
    let kinds: Vec<&str> = steps.iter().map(|s| s.event.as_str()).collect();
    assert_eq!(kinds, ["created", "leased", "lease_expired", "leased"]);
    h.rt.block_on(h.engine.close());
}

/// A claim with a node's share (spec section 16) takes the due deliveries of its share first
/// and another share's only when its own run short; two shares of two split everything.
#[test]
fn claims_take_their_share_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::new(dir.path(), None);
    let p = json!({"priority": "action", "title": "t"});
    for i in 0..40 {
        h.append(requested(&format!("n{i}"), &p));
    }
    let share = |index| tidemark_log::Share { index, of: 2 };
    let claim = |owner: &str, index, limit| app_claim(owner, limit, 60_000, share(index));
    let a = h.exec(claim("a", 0, 5)).unwrap();
    let b = h.exec(claim("b", 1, 5)).unwrap();
    assert_eq!((a.len(), b.len()), (5, 5));
    assert!(
        a.iter().all(|d| share(0).owns(d.id.as_str())),
        "a took its share"
    );
    assert!(
        b.iter().all(|d| share(1).owns(d.id.as_str())),
        "b took its share"
    );
    // Everything else: a's share first, then b's.
    let rest = h.exec(claim("a", 0, 1000)).unwrap();
    assert_eq!(rest.len(), 30);
    let first_other = rest
        .iter()
        .position(|d| !share(0).owns(d.id.as_str()))
        .unwrap_or(rest.len());
    assert!(
        rest[first_other..]
            .iter()
            .all(|d| !share(0).owns(d.id.as_str())),
        "a's own share came before b's"
    );
    assert!(
        first_other > 0 && first_other < rest.len(),
        "both shares left some"
    );
    h.rt.block_on(h.engine.close());
}

/// Routing handed the same notifications again (a restart re-reading its last page) appends
/// nothing: no second delivery, and a digest member never joins twice.
#[test]
fn routing_twice_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let settings = json!({"routes": {"desktop": {"digest": {"window": "10m", "max_items": 5}}}});
    let mut h = Harness::new(dir.path(), Some(settings));
    for i in 0..3 {
        let p = json!({"priority": "action", "title": format!("t{i}"), "recipient": "r", "group_key": "g"});
        h.append(requested(&format!("d{i}"), &p));
    }
    let row = h.row("dlv:d0:desktop");
    assert_eq!(row.items.len(), 3);
    assert_eq!(row.title, "3 new updates");
    let head = h.engine.head();
    let everything = events_after(&h.engine, 0);
    h.rt.block_on(h.engine.execute(Route { source: everything }))
        .unwrap();
    assert_eq!(h.engine.head(), head, "routing again appended events");
    assert_eq!(h.row("dlv:d0:desktop").items.len(), 3);
    // The checkpoint is the last notification (the join after it is at the head).
    assert_eq!(h.engine.read().routing_checkpoint().unwrap(), head - 1);
    h.rt.block_on(h.engine.close());
}
