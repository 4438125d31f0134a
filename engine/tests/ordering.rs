//! A route's order (spec section 4) on a real log, against random sequences of notifications
//! over a few keys, claims, completions, failures (retryable or not), lease expiries and
//! operator retries and discards, on a simulated clock. After every step:
//! - at most one delivery of a key is leased;
//! - a claim leases only the first delivery of its key (by notification seq) among those that
//!   hold the key (pending, or parked where parked ones hold);
//! - a delivery that waits says whom it waits for, and that one is the first of its key;
//!
//! and at the end every delivery that is not parked or discarded is sent by claiming and
//! completing until nothing is due, each key's deliveries sent in seq order when parked ones
//! hold, and the live model equals a rebuild (I3).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use common::{
    app_claim, deliveries_rebuild_identically, engine_a_day_ahead, events_after, requested, rt,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use tidemark_engine::commands::OperatorAction;
use tidemark_engine::commands::outbox::{Complete, ExpireLeases, Fail, Operator, Route};
use tidemark_engine::commands::{Completed, Failure};
use tidemark_engine::{Command, CommandError, Engine};
use tidemark_log::{EventLog, NewEvent};
use tidemark_projections::deliveries::Delivery;
use tidemark_projections::names::DeliveryStatus as S;

const SEC: i64 = 1_000_000;
const KEYS: u8 = 3;

#[derive(Debug, Clone)]
enum Op {
    /// A notification to recipient `r<key>`, or to none (`None`: not ordered).
    Notify {
        key: Option<u8>,
    },
    Claim {
        limit: u8,
    },
    Complete {
        pick: u8,
    },
    Fail {
        pick: u8,
        retryable: bool,
    },
    /// Advance the clock and run the expiry tick.
    Tick {
        secs: u8,
    },
    Retry {
        pick: u8,
    },
    Discard {
        pick: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::option::weighted(0.9, 0..KEYS).prop_map(|key| Op::Notify { key }),
        3 => (1u8..5).prop_map(|limit| Op::Claim { limit }),
        3 => any::<u8>().prop_map(|pick| Op::Complete { pick }),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(pick, retryable)| Op::Fail { pick, retryable }),
        2 => (0u8..40).prop_map(|secs| Op::Tick { secs }),
        1 => any::<u8>().prop_map(|pick| Op::Retry { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Discard { pick }),
    ]
}

struct Harness {
    rt: tokio::runtime::Runtime,
    engine: Engine,
    clock: Arc<AtomicI64>,
    routed: u64,
    /// Notification number → its key.
    keys: Vec<Option<u8>>,
    /// Parked deliveries hold their key.
    hold: bool,
    /// Per key, the notification numbers in the order they were sent.
    sent: BTreeMap<u8, Vec<usize>>,
    /// Each notification's place in its key: when it was made, or when it came back to the
    /// key (a retry after a park that did not hold it): behind those already there.
    place: Vec<u64>,
    next_place: u64,
}

impl Harness {
    fn new(dir: &std::path::Path, hold: bool) -> Harness {
        let (engine, clock) = engine_a_day_ahead(dir);
        let mut h = Harness {
            rt: rt(),
            engine,
            clock,
            routed: 0,
            keys: Vec::new(),
            hold,
            sent: BTreeMap::new(),
            place: Vec::new(),
            next_place: 0,
        };
        let on_park = if hold { "hold" } else { "skip" };
        let s = json!({
            "retry": {"max_attempts": 2, "base_delay": "1s", "max_delay": "4s", "jitter": 0.0},
            "routes": {"desktop": {"ordering": {"key": "recipient", "on_park": on_park}}},
        });
        h.append(NewEvent::new(None, "settings", "", "settings.updated", &s).unwrap());
        h
    }

    fn append(&mut self, ev: NewEvent) {
        self.rt
            .block_on(self.engine.log().append(vec![ev]))
            .unwrap();
        let source = events_after(&self.engine, self.routed);
        self.routed = self.engine.head();
        self.rt
            .block_on(self.engine.execute(Route { source }))
            .unwrap();
    }

    fn exec<C: Command>(&mut self, cmd: C) -> Option<C::Answer> {
        match self.rt.block_on(self.engine.execute(cmd)) {
            Ok((o, _)) => Some(o),
            Err(CommandError::Rejected { .. }) => None,
            Err(e) => panic!("command failed: {e}"),
        }
    }

    fn id(i: usize) -> String {
        format!("dlv:n{i}:desktop")
    }

    fn row(&self, i: usize) -> Delivery {
        self.engine
            .read()
            .delivery(&Self::id(i).as_str().into())
            .unwrap()
            .expect("row")
            .0
    }

    fn rows(&self) -> Vec<Delivery> {
        (0..self.keys.len()).map(|i| self.row(i)).collect()
    }

    /// Whether `d` holds its key now.
    fn holds(&self, d: &Delivery) -> bool {
        d.status.is_pending() || (d.status == S::Parked && self.hold)
    }

    /// The first notification of `key` that holds it (by its place).
    fn first_of(&self, rows: &[Delivery], key: u8) -> Option<usize> {
        (0..rows.len())
            .filter(|i| self.keys[*i] == Some(key) && self.holds(&rows[*i]))
            .min_by_key(|i| self.place[*i])
    }

    fn picked(&self, rows: &[Delivery], pick: u8, status: S) -> Option<usize> {
        let of: Vec<usize> = (0..rows.len())
            .filter(|i| rows[*i].status == status)
            .collect();
        (!of.is_empty()).then(|| of[pick as usize % of.len()])
    }

    fn claim(&mut self, limit: usize) -> Result<usize, String> {
        let before = self.rows();
        let got = self
            .exec(app_claim("a", limit, 10_000, tidemark_log::Share::ALL))
            .unwrap_or_default();
        for d in &got {
            let i = self.number(d);
            if let Some(k) = self.keys[i] {
                // Leasing an expired lease again is the same delivery: the first of its key.
                let first = self.first_of(&before, k);
                if first != Some(i) {
                    return Err(format!(
                        "claimed n{i} of key {k} while n{first:?} is first in it"
                    ));
                }
            }
        }
        Ok(got.len())
    }

    fn number(&self, d: &Delivery) -> usize {
        d.notification_id[1..].parse().unwrap()
    }

    fn complete(&mut self, i: usize) {
        let r = self.exec(Complete {
            owner: "a".into(),
            items: vec![(Self::id(i).as_str().into(), None)],
            resolved_targets: Vec::new(),
        });
        if let Some(r) = r
            && matches!(r.first(), Some(Completed::Sent(_)))
            && let Some(k) = self.keys[i]
        {
            self.sent.entry(k).or_default().push(i);
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        let rows = self.rows();
        match *op {
            Op::Notify { key } => {
                let i = self.keys.len();
                let mut p = json!({"priority": "urgent", "title": format!("t{i}")});
                if let Some(k) = key {
                    p["recipient"] = Value::from(format!("r{k}"));
                }
                self.keys.push(key);
                self.place.push(self.next_place);
                self.next_place += 1;
                self.append(requested(&format!("n{i}"), &p));
            }
            Op::Claim { limit } => {
                self.claim(limit as usize)?;
            }
            Op::Complete { pick } => {
                if let Some(i) = self.picked(&rows, pick, S::Leased) {
                    self.complete(i);
                }
            }
            Op::Fail { pick, retryable } => {
                if let Some(i) = self.picked(&rows, pick, S::Leased) {
                    self.exec(Fail {
                        id: Self::id(i).as_str().into(),
                        owner: "a".into(),
                        failure: Failure {
                            error_code: "boom".into(),
                            error: "boom".into(),
                            retryable,
                            retry_after_ms: None,
                        },
                    });
                }
            }
            Op::Tick { secs } => {
                self.clock
                    .fetch_add(i64::from(secs) * SEC, Ordering::SeqCst);
                self.exec(ExpireLeases { max: 1000 });
            }
            Op::Retry { pick } | Op::Discard { pick } => {
                if let Some(i) = self.picked(&rows, pick, S::Parked) {
                    let action = if matches!(op, Op::Retry { .. }) {
                        OperatorAction::Retry
                    } else {
                        OperatorAction::Discard
                    };
                    self.exec(Operator {
                        id: Self::id(i).as_str().into(),
                        action,
                        by: None,
                        reason: Some("test".into()),
                    });
                }
            }
        }
        // A delivery back in its key goes behind those there.
        let after = self.rows();
        for (i, (b, a)) in rows.iter().zip(&after).enumerate() {
            if !self.holds(b) && self.holds(a) {
                self.place[i] = self.next_place;
                self.next_place += 1;
            }
        }
        self.check()
    }

    /// At most one leased per key, and every waiting delivery names the first of its key.
    fn check(&self) -> Result<(), String> {
        let rows = self.rows();
        let read = self.engine.read();
        for k in 0..KEYS {
            let leased: Vec<usize> = (0..rows.len())
                .filter(|i| self.keys[*i] == Some(k) && rows[*i].status == S::Leased)
                .collect();
            if leased.len() > 1 {
                return Err(format!("key {k} has {leased:?} leased at once"));
            }
            let first = self.first_of(&rows, k);
            for (i, row) in rows.iter().enumerate() {
                if self.keys[i] != Some(k) || !row.status.is_pending() {
                    continue;
                }
                let waits = read.order_waits_for(row).map_err(|e| e.to_string())?;
                let want = first.filter(|f| *f != i).map(Self::id);
                if waits != want {
                    return Err(format!("n{i} of key {k} waits for {waits:?}, not {want:?}"));
                }
            }
        }
        Ok(())
    }

    /// Claim and complete until nothing is due (the clock moved past every backoff).
    fn drain(&mut self) -> Result<(), String> {
        for _ in 0..(self.keys.len() * 4 + 8) {
            self.clock.fetch_add(60 * SEC, Ordering::SeqCst);
            self.exec(ExpireLeases { max: 1000 });
            self.claim(1000)?;
            let leased: Vec<usize> = self
                .rows()
                .iter()
                .enumerate()
                .filter(|(_, d)| d.status == S::Leased)
                .map(|(i, _)| i)
                .collect();
            if leased.is_empty() {
                return Ok(());
            }
            for i in leased {
                self.complete(i);
            }
            self.check()?;
        }
        Err("still claiming after every delivery could have been sent".into())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn one_delivery_per_key_goes_at_a_time_in_seq_order(
        ops in proptest::collection::vec(op(), 1..60),
        hold in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Harness::new(dir.path(), hold);
        for op in &ops {
            if let Err(e) = h.step(op) {
                prop_assert!(false, "after {op:?}: {e}");
            }
        }
        if let Err(e) = h.drain() {
            prop_assert!(false, "draining: {e}");
        }
        let rows = h.rows();
        for (i, d) in rows.iter().enumerate() {
            let ended = matches!(d.status, S::Sent | S::Parked | S::Discarded);
            // Or it waits behind a parked delivery that holds its key.
            let behind = h.hold
                && h.keys[i].is_some_and(|k| {
                    h.first_of(&rows, k).is_some_and(|f| rows[f].status == S::Parked)
                });
            prop_assert!(ended || behind, "n{} is {} after the drain", i, d.status);
        }
        if h.hold {
            // A parked delivery holds its key, so every key's deliveries went in seq order
            // (an operator's retry sends the first again; a discard lets the next go).
            for (k, sent) in &h.sent {
                prop_assert!(sent.windows(2).all(|w| w[0] < w[1]), "key {} sent {:?}", k, sent);
            }
        }
        deliveries_rebuild_identically(&h.rt, &h.engine).map_err(TestCaseError::fail)?;
        h.check().map_err(TestCaseError::fail)?;
        h.rt.block_on(h.engine.close());
    }
}
