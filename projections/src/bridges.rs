//! Bridge subscriptions and the terminal-notification decision table (spec section 6).
//!
//! A subscription targets one task and one bridge; its cursor is
//! `(bridge_task_subscription:<subscription_id>, task_events, <task_id>)`. Deleting one keeps
//! the cursor; creating the same id again resumes from it.

use crate::ids::{BridgeId, SubscriptionId, TaskId};
use serde::{Deserialize, Serialize};
use tidemark_log::StorageError;
use tidemark_log::{Event, EventRef};

use crate::endpoints::{Endpoint, EndpointChange};
use crate::framework::{Fold, Store};
use crate::names::{BridgeMode, EventType, ReviewState, Stream, TaskStatus, ids};
use crate::tasks::Task;

pub const NAME: &str = "bridges";
pub const ROWS: &str = "rows";
/// `task_id ‖ 0 ‖ subscription_id` of active subscriptions.
pub const BY_TASK: &str = "by_task";
/// `bridge_id ‖ 0 ‖ subscription_id` of active subscriptions.
pub const BY_BRIDGE: &str = "by_bridge";
/// `subscription_id` of active subscriptions (the notifier's work list).
pub const ACTIVE: &str = "active";
/// `subscription_id` → the [`Endpoint`] of a webhook subscription (section 17): its POSTs'
/// outcomes, folded from its cursor's `cursor.advanced` (a confirmed POST) and `cursor.failed`
/// (a failed one), and its circuit and switch from the `endpoints` stream (subject
/// [`ids::bridge_endpoint`]).
pub const ENDPOINTS: &str = "endpoints";

/// Where a subscription's events go: pulled by its bridge, or POSTed to a webhook with the
/// HMAC `secret` (never served: read models and event pages redact it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StoredSink", into = "StoredSink")]
pub enum BridgeSink {
    Pull,
    Webhook { url: String, secret: Option<String> },
}

impl BridgeSink {
    /// `pull` or `webhook`, as recorded.
    pub fn kind(&self) -> &'static str {
        match self {
            BridgeSink::Pull => "pull",
            BridgeSink::Webhook { .. } => "webhook",
        }
    }

    pub fn is_webhook(&self) -> bool {
        matches!(self, BridgeSink::Webhook { .. })
    }

    pub fn url(&self) -> Option<&str> {
        match self {
            BridgeSink::Webhook { url, .. } => Some(url),
            BridgeSink::Pull => None,
        }
    }

    pub fn secret(&self) -> Option<&str> {
        match self {
            BridgeSink::Webhook { secret, .. } => secret.as_deref(),
            BridgeSink::Pull => None,
        }
    }
}

/// A [`BridgeSink`] as `bridge.subscribed` records it and the row stores it (postcard is not
/// self-describing: the same three fields in the same order, so the bytes do not change).
#[derive(Clone, Serialize, Deserialize)]
struct StoredSink {
    kind: String,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    secret: Option<String>,
}

impl TryFrom<StoredSink> for BridgeSink {
    type Error = String;

    fn try_from(s: StoredSink) -> Result<Self, String> {
        match (s.kind.as_str(), s.url) {
            ("pull", _) => Ok(BridgeSink::Pull),
            ("webhook", Some(url)) => Ok(BridgeSink::Webhook {
                url,
                secret: s.secret,
            }),
            ("webhook", None) => Err("a webhook sink without a url".into()),
            (other, _) => Err(format!("{other:?} is not a bridge sink (pull, webhook)")),
        }
    }
}

impl From<BridgeSink> for StoredSink {
    fn from(s: BridgeSink) -> StoredSink {
        match s {
            BridgeSink::Pull => StoredSink {
                kind: "pull".into(),
                url: None,
                secret: None,
            },
            BridgeSink::Webhook { url, secret } => StoredSink {
                kind: "webhook".into(),
                url: Some(url),
                secret,
            },
        }
    }
}

/// What a subscription targets (what `bridge.subscribed` records). Stored with postcard,
/// which is not self-describing: no `skip_serializing_if` here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub task_id: TaskId,
    pub bridge_id: BridgeId,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub workspace_id: Option<String>,
    #[serde(default)]
    pub thread_id: Option<String>,
    pub mode: BridgeMode,
    pub sink: BridgeSink,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    pub subscription_id: SubscriptionId,
    pub target: Target,
    pub active: bool,
    pub created_at_us: i64,
    pub updated_at_us: i64,
}

crate::framework::txn_view! {
    /// The bridge subscriptions model inside a models transaction (commands decide on it at the
    /// head).
    NAME
}

impl View<'_> {
    /// Subscription `id`.
    pub fn row(&self, id: &str) -> Result<Option<Subscription>, StorageError> {
        self.t.get_val(ROWS, id.as_bytes())
    }

    /// The health and circuit of webhook subscription `id` (`None`: no POST or switch yet).
    pub fn endpoint(&self, id: &str) -> Result<Option<Endpoint>, StorageError> {
        self.t.get_val(ENDPOINTS, id.as_bytes())
    }

    /// Whether an active subscription follows task `task_id`.
    pub fn follows_task(&self, task_id: &str) -> Result<bool, StorageError> {
        Ok(!self.t.suffixes(BY_TASK, task_id)?.is_empty())
    }

    /// The active subscriptions of these tasks (the bridge notifier asks for every task of a
    /// commit at once).
    pub fn of_tasks(&self, task_ids: &[&str]) -> Result<Vec<Subscription>, StorageError> {
        let mut ids = Vec::new();
        for t in task_ids {
            ids.extend(self.t.suffixes(BY_TASK, t)?);
        }
        self.rows(ids)
    }

    /// The active subscriptions of bridge `bridge_id`.
    pub fn of_bridge(&self, bridge_id: &str) -> Result<Vec<Subscription>, StorageError> {
        let ids = self.t.suffixes(BY_BRIDGE, bridge_id)?;
        self.rows(ids)
    }

    /// Every active subscription, by id.
    pub fn active(&self) -> Result<Vec<Subscription>, StorageError> {
        let mut ids = Vec::new();
        for row in self.t.table(ACTIVE)?.iter()? {
            let (k, _) = row.map_err(StorageError::of)?;
            ids.push(String::from_utf8_lossy(k.value()).into_owned());
        }
        self.rows(ids)
    }

    /// Every active webhook subscription's endpoint (a record with no POST for one without),
    /// by subscription id.
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, StorageError> {
        let mut out = Vec::new();
        for s in self.active()? {
            if !s.target.sink.is_webhook() {
                continue;
            }
            let id = s.subscription_id.as_str();
            out.push(self.endpoint(id)?.unwrap_or_else(|| {
                Endpoint::new(&ids::bridge_endpoint(id), Some(crate::names::Sink::Webhook))
            }));
        }
        out.sort_by(|a, b| a.route.cmp(&b.route));
        Ok(out)
    }

    fn rows(&self, ids: Vec<String>) -> Result<Vec<Subscription>, StorageError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.extend(self.row(&id)?);
        }
        Ok(out)
    }
}

/// Payload of `bridge.subscribed` / `bridge.unsubscribed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BridgeEvent {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub target: Option<Target>,
    pub at_us: i64,
}

fn cat(a: &str, b: &str) -> Vec<u8> {
    let mut k = a.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(b.as_bytes());
    k
}

pub struct Bridges;

impl Fold for Bridges {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[ROWS, BY_TASK, BY_BRIDGE, ACTIVE, ENDPOINTS];
    /// 2: the endpoints of the webhook subscriptions (`endpoints`, section 17); 3: an
    /// endpoint's `unresolved` field (always empty for a subscription, whose URL is given).
    const VERSION: u32 = 3;

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        if Stream::parse(ev.stream) == Some(Stream::Cursors) {
            return fold_attempt(st, ev);
        }
        if Stream::parse(ev.stream) == Some(Stream::Endpoints) {
            return fold_endpoint(st, ev);
        }
        if Stream::parse(ev.stream) != Some(Stream::Bridges) {
            return Ok(());
        }
        let ty = EventType::parse(ev.event_type);
        let b: BridgeEvent = match ty {
            Some(EventType::BridgeSubscribed | EventType::BridgeUnsubscribed) => {
                serde_json::from_str(ev.payload).map_err(|e| {
                    StorageError::new(format!("{} at seq {}", ev.event_type, ev.seq), e)
                })?
            }
            _ => return Ok(()),
        };
        let id = ev.subject;
        let old: Option<Subscription> = st.get_val(ROWS, id.as_bytes())?;
        if let Some(o) = old.as_ref().filter(|o| o.active) {
            st.delete(BY_TASK, &cat(o.target.task_id.as_str(), id))?;
            st.delete(BY_BRIDGE, &cat(o.target.bridge_id.as_str(), id))?;
            st.delete(ACTIVE, id.as_bytes())?;
        }
        let row = match (ty, b.target, old) {
            (Some(EventType::BridgeSubscribed), Some(target), old) => Subscription {
                subscription_id: SubscriptionId::new(id),
                target,
                active: true,
                created_at_us: old.map(|o| o.created_at_us).unwrap_or(b.at_us),
                updated_at_us: b.at_us,
            },
            (Some(EventType::BridgeUnsubscribed), _, Some(mut o)) => {
                o.active = false;
                o.updated_at_us = b.at_us;
                o
            }
            _ => return Ok(()),
        };
        if row.active {
            st.put(BY_TASK, &cat(row.target.task_id.as_str(), id), &[])?;
            st.put(BY_BRIDGE, &cat(row.target.bridge_id.as_str(), id), &[])?;
            st.put(ACTIVE, id.as_bytes(), &[])?;
        }
        st.put_val(ROWS, id.as_bytes(), &row)
    }
}

/// A webhook subscription's POST came to an outcome: its cursor advanced (confirmed) or
/// failed (`cursor.failed`, written by the notifier for a failed POST). Other cursors' events
/// are passed over without parsing them.
fn fold_attempt(st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
    let failed = match EventType::parse(ev.event_type) {
        Some(EventType::CursorAdvanced) => false,
        Some(EventType::CursorFailed) => true,
        _ => return Ok(()),
    };
    let consumer = if ids::subscription_of_consumer(ev.subject).is_some() {
        std::borrow::Cow::Borrowed(ev.subject)
    } else if ev.payload.contains("\"consumer_id\"") {
        match serde_json::from_str::<crate::cursors::CursorEvent>(ev.payload) {
            Ok(c) => match c.consumer_id {
                Some(id) => std::borrow::Cow::Owned(id),
                None => return Ok(()),
            },
            Err(_) => return Ok(()),
        }
    } else {
        return Ok(());
    };
    let Some(id) = ids::subscription_of_consumer(&consumer) else {
        return Ok(());
    };
    let Some(sub) = st.get_val::<Subscription>(ROWS, id.as_bytes())? else {
        return Ok(());
    };
    if !sub.target.sink.is_webhook() {
        return Ok(());
    }
    let c: crate::cursors::CursorEvent = serde_json::from_str(ev.payload)
        .map_err(|e| StorageError::new(format!("{} at seq {}", ev.event_type, ev.seq), e))?;
    let mut e = st
        .get_val::<Endpoint>(ENDPOINTS, id.as_bytes())?
        .unwrap_or_else(|| {
            Endpoint::new(&ids::bridge_endpoint(id), Some(crate::names::Sink::Webhook))
        });
    let code = c.error_code.or_else(|| failed.then(|| "failed".to_owned()));
    e.attempted(crate::names::Sink::Webhook, c.at_us, code.as_deref());
    st.put_val(ENDPOINTS, id.as_bytes(), &e)
}

/// An `endpoint.*` event of a webhook subscription (subject [`ids::bridge_endpoint`]).
fn fold_endpoint(st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
    let (Some(ty), Some(id)) = (
        EventType::parse(ev.event_type),
        ids::subscription_of_endpoint(ev.subject),
    ) else {
        return Ok(());
    };
    let c: EndpointChange = serde_json::from_str(ev.payload)
        .map_err(|e| StorageError::new(format!("{} at seq {}", ev.event_type, ev.seq), e))?;
    let mut e = st
        .get_val::<Endpoint>(ENDPOINTS, id.as_bytes())?
        .unwrap_or_else(|| Endpoint::new(ev.subject, c.sink));
    if e.apply(ty, &c) {
        st.put_val(ENDPOINTS, id.as_bytes(), &e)?;
    }
    Ok(())
}

/// The decision for one event past a subscription's cursor (spec section 6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Deliver,
    Defer,
    Mismatch,
    /// Not a terminal event: scanned past.
    Skip,
}

/// Event types the notifier considers.
pub const TERMINAL_TYPES: [EventType; 5] = [
    EventType::TaskRunCompleted,
    EventType::TaskRunFailed,
    EventType::TaskRunCanceled,
    EventType::TaskRunReviewApproved,
    EventType::TaskCanceled,
];

/// The reason code of a mismatch for a run that never started (spec section 6): its reason
/// text starts with it.
pub const RUN_NOT_STARTED: &str = "run_not_started";

/// Decide for `ev` (an event of `task`'s `task_events`) against the task's current state,
/// with the reason in words.
pub fn decide(task: Option<&Task>, ev: &Event) -> (Decision, String) {
    use Decision::*;
    let Some(ty) = EventType::parse(&ev.event_type).filter(|t| {
        Stream::parse(&ev.stream) == Some(Stream::TaskEvents) && TERMINAL_TYPES.contains(t)
    }) else {
        return (Skip, format!("{} is not a terminal event", ev.event_type));
    };
    let Some(task) = task else {
        return (Mismatch, "the task does not exist".into());
    };
    let p = ev.payload_value();
    let run_id = p.get("run_id").and_then(|v| v.as_str()).unwrap_or("");
    let run = task.run(run_id);
    // A run's outcome or approval before (or without) its start: the task reads as running
    // another run, or not at all, so a bridge must not post "done" (section 6's last row).
    if ty != EventType::TaskCanceled
        && task
            .run_started_seq(run_id)
            .is_none_or(|started| started >= ev.seq)
    {
        return (
            Mismatch,
            format!(
                "{RUN_NOT_STARTED}: {ty} of run {run_id}, which {} before seq {}",
                if run.is_some() {
                    "had not started"
                } else {
                    "the task never started"
                },
                ev.seq
            ),
        );
    }
    match ty {
        EventType::TaskCanceled => {
            if task.canceled {
                (Deliver, "the task is canceled".into())
            } else {
                (
                    Mismatch,
                    "task.canceled but the task is not canceled".into(),
                )
            }
        }
        EventType::TaskRunReviewApproved => match run {
            Some(r) if r.review.state == ReviewState::Approved => {
                (Deliver, format!("the review of run {run_id} is approved"))
            }
            Some(r) => (
                Mismatch,
                format!(
                    "approval of run {run_id} but its review is {}",
                    if r.review.state == ReviewState::None {
                        "not requested"
                    } else {
                        r.review.state.as_str()
                    }
                ),
            ),
            None => (Mismatch, format!("approval of unknown run {run_id}")),
        },
        ty => {
            let outcome = match ty {
                EventType::TaskRunCompleted => TaskStatus::Completed,
                EventType::TaskRunFailed => TaskStatus::Failed,
                _ => TaskStatus::Canceled,
            };
            let Some(r) = run else {
                return (Mismatch, format!("{ty} of unknown run {run_id}"));
            };
            if r.review.gated(task.review_required) {
                return (
                    Defer,
                    format!("run {run_id} is review-gated: its approval is the final event"),
                );
            }
            if TaskStatus::parse(&r.outcome) == Some(outcome) {
                (Deliver, format!("run {run_id} is {outcome}"))
            } else {
                (Mismatch, format!("{ty} but run {run_id} is {}", r.outcome))
            }
        }
    }
}

/// The envelope sent to a bridge for a delivered terminal event.
pub fn envelope(sub: &Subscription, ev: &Event) -> serde_json::Value {
    let p = ev.payload_value();
    let mut meta = serde_json::json!({"terminal_event_type": ev.event_type});
    if let Some(r) = p.get("run_id") {
        meta["run_id"] = r.clone();
    }
    serde_json::json!({
        "delivery_id": ids::bridge_delivery(sub.subscription_id.as_str(), ev.seq),
        "subscription_id": sub.subscription_id,
        "task_id": sub.target.task_id,
        "bridge_id": sub.target.bridge_id,
        "thread_id": sub.target.thread_id,
        "mode": sub.target.mode,
        "event_type": "final",
        "final": true,
        "seq": ev.seq,
        "metadata": meta,
    })
}

/// One test per row of the decision table of spec section 6 (and the two guards before it),
/// against task states built with the tasks model's own fold.
#[cfg(test)]
mod decision_table {
    use serde_json::{Value, json};
    use tidemark_log::Event;

    use super::{Decision, RUN_NOT_STARTED, decide};
    use crate::tasks::{Task, fold_task};

    fn event(seq: u64, ty: &str, payload: Value) -> Event {
        Event {
            seq,
            tenant: None,
            event_id: format!("e-{seq}"),
            stream: "task_events".into(),
            subject: "t".into(),
            event_type: ty.into(),
            time_us: seq as i64,
            payload: serde_json::value::RawValue::from_string(payload.to_string()).unwrap(),
        }
    }

    /// The task after `events` (type, payload), numbered from seq 1.
    fn task(review_required: bool, events: &[(&str, Value)]) -> Task {
        let mut t = Task::new("t");
        fold_task(
            &mut t,
            &event(
                1,
                "task.created",
                json!({"project_id": "p", "review_required": review_required}),
            )
            .as_ref(),
        );
        for (i, (ty, p)) in events.iter().enumerate() {
            fold_task(&mut t, &event(i as u64 + 2, ty, p.clone()).as_ref());
        }
        t
    }

    fn r1() -> Value {
        json!({"run_id": "r1"})
    }

    fn decision(t: &Task, ty: &str, p: Value) -> Decision {
        decide(Some(t), &event(99, ty, p)).0
    }

    #[test]
    fn outcome_of_an_ungated_run_that_has_it_is_delivered() {
        for (ty, outcome_ev) in [
            ("task.run_completed", "task.run_completed"),
            ("task.run_failed", "task.run_failed"),
            ("task.run_canceled", "task.run_canceled"),
        ] {
            let t = task(false, &[("task.run_started", r1()), (outcome_ev, r1())]);
            assert_eq!(decision(&t, ty, r1()), Decision::Deliver, "{ty}");
        }
    }

    #[test]
    fn outcome_of_an_ungated_run_that_has_another_is_a_mismatch() {
        // The run's current outcome is `failed`: a `run_completed` of it contradicts the state.
        let t = task(
            false,
            &[("task.run_started", r1()), ("task.run_failed", r1())],
        );
        assert_eq!(decision(&t, "task.run_completed", r1()), Decision::Mismatch);
        assert_eq!(decision(&t, "task.run_canceled", r1()), Decision::Mismatch);
        // Still running: any outcome event contradicts it.
        let t = task(false, &[("task.run_started", r1())]);
        assert_eq!(decision(&t, "task.run_failed", r1()), Decision::Mismatch);
    }

    #[test]
    fn outcome_of_a_review_gated_run_is_deferred() {
        // Gated by the task's review_required ...
        let t = task(
            true,
            &[("task.run_started", r1()), ("task.run_completed", r1())],
        );
        assert_eq!(decision(&t, "task.run_completed", r1()), Decision::Defer);
        // ... or by a review requested for the run, whatever its state now.
        let t = task(
            false,
            &[
                ("task.run_started", r1()),
                ("task.run_completed", r1()),
                ("task.run_review_requested", r1()),
                (
                    "task.run_review_approved",
                    json!({"run_id": "r1", "reviewer": "ana"}),
                ),
            ],
        );
        assert_eq!(decision(&t, "task.run_completed", r1()), Decision::Defer);
        assert_eq!(decision(&t, "task.run_failed", r1()), Decision::Defer);
    }

    #[test]
    fn approval_of_an_approved_review_is_delivered() {
        let t = task(
            true,
            &[
                ("task.run_started", r1()),
                ("task.run_completed", r1()),
                ("task.run_review_requested", r1()),
                (
                    "task.run_review_approved",
                    json!({"run_id": "r1", "reviewer": "ana"}),
                ),
            ],
        );
        assert_eq!(
            decision(&t, "task.run_review_approved", r1()),
            Decision::Deliver
        );
    }

    #[test]
    fn approval_of_a_review_not_approved_is_a_mismatch() {
        let started = [("task.run_started", r1()), ("task.run_completed", r1())];
        // none (never requested)
        let t = task(true, &started);
        assert_eq!(
            decision(&t, "task.run_review_approved", r1()),
            Decision::Mismatch
        );
        // pending
        let mut evs = started.to_vec();
        evs.push(("task.run_review_requested", r1()));
        let t = task(true, &evs);
        assert_eq!(
            decision(&t, "task.run_review_approved", r1()),
            Decision::Mismatch
        );
        // rejected
        evs.push((
            "task.run_review_rejected",
            json!({"run_id": "r1", "reviewer": "bo", "reason": "no"}),
        ));
        let t = task(true, &evs);
        assert_eq!(
            decision(&t, "task.run_review_approved", r1()),
            Decision::Mismatch
        );
        // unknown run
        assert_eq!(
            decision(&t, "task.run_review_approved", json!({"run_id": "r9"})),
            Decision::Mismatch
        );
    }

    #[test]
    fn cancel_of_a_canceled_task_is_delivered() {
        let t = task(false, &[("task.canceled", json!({"reason": "x"}))]);
        assert_eq!(decision(&t, "task.canceled", json!({})), Decision::Deliver);
    }

    /// A canceled task never un-cancels through the API, so this row is reachable only with a
    /// state that never saw the cancel (a `task.canceled` judged against another task's state,
    /// or a model that lost it): still a mismatch, never a delivery.
    #[test]
    fn cancel_of_a_task_that_is_not_canceled_is_a_mismatch() {
        let t = task(false, &[("task.run_started", r1())]);
        assert_eq!(
            decision(&t, "task.canceled", json!({"reason": "x"})),
            Decision::Mismatch
        );
    }

    #[test]
    fn non_terminal_events_are_skipped_and_unknown_tasks_mismatch() {
        let t = task(false, &[("task.run_started", r1())]);
        assert_eq!(decision(&t, "task.run_started", r1()), Decision::Skip);
        assert_eq!(
            decision(&t, "task.run_review_requested", r1()),
            Decision::Skip
        );
        let (d, _) = decide(None, &event(5, "task.run_completed", r1()));
        assert_eq!(d, Decision::Mismatch);
    }

    /// The table's last row: an outcome or approval of a run with no `task.run_started` before
    /// it is a mismatch (`run_not_started`) whatever the run's recorded outcome, gated or not,
    /// and a start that comes later does not make the earlier event deliverable.
    #[test]
    fn an_outcome_or_approval_of_a_run_that_never_started_is_a_mismatch() {
        let r9 = || json!({"run_id": "r9"});
        // r1 runs; r9 completes without ever starting (the chat bridge case).
        let t = task(
            false,
            &[("task.run_started", r1()), ("task.run_completed", r9())],
        );
        assert_eq!(t.status, crate::names::TaskStatus::Running);
        let (d, reason) = decide(Some(&t), &event(3, "task.run_completed", r9()));
        assert_eq!(d, Decision::Mismatch);
        assert!(reason.starts_with(RUN_NOT_STARTED), "{reason}");
        for ty in [
            "task.run_failed",
            "task.run_canceled",
            "task.run_review_approved",
        ] {
            let (d, reason) = decide(Some(&t), &event(99, ty, r9()));
            assert_eq!(d, Decision::Mismatch, "{ty}");
            assert!(reason.starts_with(RUN_NOT_STARTED), "{ty}: {reason}");
        }
        // Gated runs too: the deferral is only for runs that started.
        let gated = task(true, &[("task.run_completed", r1())]);
        assert_eq!(
            decision(&gated, "task.run_completed", r1()),
            Decision::Mismatch
        );
        // Started after the completion (seq 3 after seq 2): the completion at seq 2 is still
        // one of a run that had not started; a completion after the start is delivered.
        let late = task(
            false,
            &[("task.run_completed", r1()), ("task.run_started", r1())],
        );
        let (d, reason) = decide(Some(&late), &event(2, "task.run_completed", r1()));
        assert_eq!(d, Decision::Mismatch, "{reason}");
        assert_eq!(late.run_started_seq("r1"), Some(3));
        let done = task(
            false,
            &[
                ("task.run_completed", r1()),
                ("task.run_started", r1()),
                ("task.run_completed", r1()),
            ],
        );
        assert_eq!(
            decision(&done, "task.run_completed", r1()),
            Decision::Deliver
        );
        // A run that started normally keeps no extra state (its row's bytes are unchanged).
        let normal = task(false, &[("task.run_started", r1())]);
        assert!(normal.ext.late_starts.is_empty());
        assert_eq!(normal.run_started_seq("r1"), Some(2));
    }
}

#[cfg(test)]
mod stored_sink {
    use serde::{Deserialize, Serialize};

    use super::BridgeSink;

    /// The struct `BridgeSink` replaced, field for field.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Before {
        kind: String,
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        secret: Option<String>,
    }

    fn before(kind: &str, url: Option<&str>, secret: Option<&str>) -> Before {
        Before {
            kind: kind.into(),
            url: url.map(Into::into),
            secret: secret.map(Into::into),
        }
    }

    #[test]
    fn the_stored_bytes_do_not_change() {
        let cases = [
            (before("pull", None, None), BridgeSink::Pull),
            (
                before("webhook", Some("https://h/p"), Some("s")),
                BridgeSink::Webhook {
                    url: "https://h/p".into(),
                    secret: Some("s".into()),
                },
            ),
            (
                before("webhook", Some("https://h/p"), None),
                BridgeSink::Webhook {
                    url: "https://h/p".into(),
                    secret: None,
                },
            ),
        ];
        for (old, new) in cases {
            let bytes = postcard::to_allocvec(&old).unwrap();
            assert_eq!(postcard::to_allocvec(&new).unwrap(), bytes);
            assert_eq!(postcard::from_bytes::<BridgeSink>(&bytes).unwrap(), new);
            let json = serde_json::to_value(&old).unwrap();
            assert_eq!(serde_json::to_value(&new).unwrap(), json);
            assert_eq!(serde_json::from_value::<BridgeSink>(json).unwrap(), new);
        }
    }

    #[test]
    fn a_sink_that_is_neither_is_an_error_not_a_default() {
        for bad in [before("webhook", None, None), before("email", None, None)] {
            let bytes = postcard::to_allocvec(&bad).unwrap();
            assert!(postcard::from_bytes::<BridgeSink>(&bytes).is_err());
        }
    }
}
