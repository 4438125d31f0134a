//! The deliveries read model (spec section 5): one row per delivery with its attempt timeline,
//! and the indexes the delivery runtime decides from (claimable rows by due time, leases by
//! expiry, pending rows by age, counts per sink and status), plus the routing inputs folded
//! from the log: settings in force at each seq, recipients (time zone, suppression) and
//! canceled tasks.
//!
//! Every field comes from an event: commands read the clock and draw random numbers, write the
//! result into the event, and this fold only copies it (I3).

use serde::{Deserialize, Serialize};
use tidemark_log::Event;
use tidemark_log::StorageError;

use crate::framework::{Projection, Store, be_u64};
use crate::names::{DeliveryStatus, EventType, Stream};

pub const NAME: &str = "deliveries";
pub const ROWS: &str = "rows";
pub const TIMELINE: &str = "timeline";
/// `sink ‖ 0 ‖ due_us ‖ id` for claimable rows: queued and retry_wait by their next attempt,
/// leased by their lease expiry.
pub const DUE: &str = "due";
/// `lease_expires_us ‖ id` for leased rows.
pub const LEASES: &str = "leases";
/// `sink ‖ 0 ‖ created_us ‖ id` for pending rows (queued, leased, retry_wait).
pub const PENDING: &str = "pending";
/// `sink ‖ 0 ‖ delivered_us ‖ id` for sent rows.
pub const SENT: &str = "sent";
/// `sink ‖ 0 ‖ status` → count (u64 BE).
pub const COUNTS: &str = "counts";
/// `status ‖ 0 ‖ id`.
pub const BY_STATUS: &str = "by_status";
/// `task_id ‖ 0 ‖ id`.
pub const BY_TASK: &str = "by_task";
/// `route ‖ 0 ‖ recipient ‖ 0 ‖ group_key` → the open digest [`Group`].
pub const GROUPS: &str = "groups";
/// seq (BE) → payload of the `settings.updated` at that seq.
pub const SETTINGS: &str = "settings";
/// recipient → [`Recipient`].
pub const RECIPIENTS: &str = "recipients";
/// task_id → seq of its first `task.canceled` (BE).
pub const CANCELED: &str = "canceled";
/// `routed` → seq of the last notification or task cancellation the routing command has
/// handled (BE): routing resumes after it.
pub const STATE: &str = "state";
pub const ROUTED_KEY: &[u8] = b"routed";

/// One notification inside a (digest) delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub notification_id: String,
    pub notification_seq: u64,
    pub title: String,
    pub body: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: String,
    pub notification_id: String,
    pub notification_seq: u64,
    /// The log position the delivery stands for: the lifecycle event a routed notification
    /// comes from, else the notification itself. A task cancellation at a later seq cancels it.
    pub source_seq: u64,
    pub route: String,
    pub sink: String,
    pub recipient: Option<String>,
    pub priority: String,
    pub title: String,
    pub body: Option<String>,
    /// The sink should play a sound (priority in `desktop.sound_priorities`).
    pub sound: bool,
    pub task_id: Option<String>,
    pub group_key: Option<String>,
    /// One of [`DeliveryStatus`].
    pub status: String,
    /// Why it was skipped, cancelled or parked.
    pub reason: Option<String>,
    /// Leases taken (attempts started) since creation or the last operator retry.
    pub attempts: u32,
    pub max_attempts: u32,
    pub next_attempt_at_us: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at_us: Option<i64>,
    pub last_error_code: Option<String>,
    pub last_error: Option<String>,
    pub external_id: Option<String>,
    pub created_at_us: i64,
    pub updated_at_us: i64,
    pub delivered_at_us: Option<i64>,
    /// The notifications it carries: one, or several for a digest.
    pub items: Vec<Item>,
    /// Notifications of the same recipient and group may join until then (digest policy).
    pub digest_until_us: Option<i64>,
    /// Seq of the last event that changed it.
    pub last_seq: u64,
}

impl Delivery {
    pub fn is_pending(&self) -> bool {
        DeliveryStatus::parse(&self.status).is_some_and(DeliveryStatus::is_pending)
    }

    /// When it can next be claimed, if it can be claimed at all.
    pub fn due_us(&self) -> Option<i64> {
        match self.status.as_str() {
            "queued" | "retry_wait" => Some(self.next_attempt_at_us.unwrap_or(self.created_at_us)),
            "leased" => self.lease_expires_at_us,
            _ => None,
        }
    }
}

/// One entry of a delivery's attempt timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub seq: u64,
    /// The event type without `delivery.`: created, leased, sent, ...
    pub event: String,
    pub at_us: i64,
    pub owner: Option<String>,
    pub attempt: Option<u32>,
    pub error_code: Option<String>,
    pub error: Option<String>,
    pub reason: Option<String>,
    pub next_attempt_at_us: Option<i64>,
    pub lease_expires_at_us: Option<i64>,
}

/// An open digest: later notifications of the same route, recipient and group join
/// `delivery_id` while it is queued, before `until_us` and below the item limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub delivery_id: String,
    pub until_us: i64,
    pub max_items: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipient {
    pub tz_offset_minutes: Option<i32>,
    pub suppressed: bool,
    pub suppressed_until_us: Option<i64>,
    pub suppress_reason: Option<String>,
}

impl Recipient {
    /// Suppressed at time `at_us` (a suppression with `until` ends then).
    pub fn suppressed_at(&self, at_us: i64) -> bool {
        self.suppressed && self.suppressed_until_us.is_none_or(|u| at_us < u)
    }
}

/// Payload of `delivery.created`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Created {
    pub delivery_id: String,
    pub notification_id: String,
    pub notification_seq: u64,
    /// The log position this routing decision stands for (the notification's source event
    /// for routed notifications, else the notification itself).
    pub source_seq: u64,
    pub route: String,
    pub sink: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub recipient: Option<String>,
    pub priority: String,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub body: Option<String>,
    pub sound: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub task_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub group_key: Option<String>,
    /// queued, skipped or cancelled.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    pub max_attempts: u32,
    pub created_at_us: i64,
    pub next_attempt_at_us: i64,
    /// How the due time was chosen, for the timeline: the drawn delay, quiet-hours move.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub delay_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quiet_hours_until_us: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub digest_until_us: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub digest_max_items: Option<u32>,
}

/// Payload of `delivery.joined` (subject: the digest delivery joined).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Joined {
    pub notification_id: String,
    pub notification_seq: u64,
    pub source_seq: u64,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub body: Option<String>,
    pub at_us: i64,
}

/// Payload of every other delivery transition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub at_us: i64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lease_expires_at_us: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_attempt_at_us: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub retryable: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub retry_after_ms: Option<u64>,
    /// The transition parks the delivery (failure or expiry at `max_attempts`, permanent
    /// failure).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parked: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub external_id: Option<String>,
    /// For cancellations: the seq of the `task.canceled` that caused it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cancel_seq: Option<u64>,
}

/// The transitions of spec section 5: `kind` (event type without `delivery.`) may be applied
/// to a delivery in `status`.
pub fn allowed(status: &str, kind: &str) -> bool {
    matches!(
        (status, kind),
        ("queued" | "retry_wait", "leased" | "skipped" | "cancelled")
            | (
                "leased",
                "lease_extended" | "sent" | "attempt_failed" | "lease_expired"
            )
            | ("parked", "retried" | "discarded")
    )
}

/// Apply transition `kind` to a row: the one function the fold and the commands share, so the
/// row a command answers with is the row the fold stores.
pub fn transition(d: &mut Delivery, kind: &str, c: &Change, seq: u64) {
    d.updated_at_us = c.at_us;
    d.last_seq = seq;
    let parked = c.parked.unwrap_or(false);
    match kind {
        "leased" => {
            d.status = "leased".into();
            d.lease_owner = c.owner.clone();
            d.lease_expires_at_us = c.lease_expires_at_us;
            d.attempts = c.attempt.unwrap_or(d.attempts + 1);
        }
        "lease_extended" => d.lease_expires_at_us = c.lease_expires_at_us,
        "sent" => {
            d.status = "sent".into();
            d.delivered_at_us = Some(c.at_us);
            d.lease_expires_at_us = None;
            d.external_id = c.external_id.clone();
        }
        "attempt_failed" | "lease_expired" => {
            if kind == "attempt_failed" {
                d.last_error_code = c.error_code.clone();
                d.last_error = c.error.clone();
            } else {
                d.last_error_code = Some("lease_expired".into());
                d.last_error = Some(format!(
                    "lease of {} expired",
                    d.lease_owner.as_deref().unwrap_or("?")
                ));
            }
            d.lease_owner = None;
            d.lease_expires_at_us = None;
            if parked {
                d.status = "parked".into();
                d.reason = c.reason.clone();
                d.next_attempt_at_us = None;
            } else {
                d.status = if kind == "attempt_failed" {
                    "retry_wait"
                } else {
                    "queued"
                }
                .into();
                d.next_attempt_at_us = Some(c.next_attempt_at_us.unwrap_or(c.at_us));
            }
        }
        "skipped" | "cancelled" | "discarded" => {
            d.status = kind.into();
            d.reason = c.reason.clone();
            d.lease_owner = None;
            d.lease_expires_at_us = None;
            d.next_attempt_at_us = None;
        }
        "retried" => {
            d.status = "queued".into();
            d.attempts = 0;
            d.reason = None;
            d.next_attempt_at_us = Some(c.at_us);
        }
        _ => {}
    }
}

impl Created {
    pub fn row(&self, seq: u64) -> Delivery {
        Delivery {
            id: self.delivery_id.clone(),
            notification_id: self.notification_id.clone(),
            notification_seq: self.notification_seq,
            source_seq: self.source_seq,
            route: self.route.clone(),
            sink: self.sink.clone(),
            recipient: self.recipient.clone(),
            priority: self.priority.clone(),
            title: self.title.clone(),
            body: self.body.clone(),
            sound: self.sound,
            task_id: self.task_id.clone(),
            group_key: self.group_key.clone(),
            status: self.status.clone(),
            reason: self.reason.clone(),
            attempts: 0,
            max_attempts: self.max_attempts,
            next_attempt_at_us: (self.status == "queued").then_some(self.next_attempt_at_us),
            lease_owner: None,
            lease_expires_at_us: None,
            last_error_code: None,
            last_error: None,
            external_id: None,
            created_at_us: self.created_at_us,
            updated_at_us: self.created_at_us,
            delivered_at_us: None,
            items: vec![Item {
                notification_id: self.notification_id.clone(),
                notification_seq: self.notification_seq,
                title: self.title.clone(),
                body: self.body.clone(),
            }],
            digest_until_us: self.digest_until_us,
            last_seq: seq,
        }
    }
}

/// Add a notification to a digest delivery; its title becomes "N new updates".
pub fn join(d: &mut Delivery, j: &Joined, seq: u64) {
    d.items.push(Item {
        notification_id: j.notification_id.clone(),
        notification_seq: j.notification_seq,
        title: j.title.clone(),
        body: j.body.clone(),
    });
    d.title = format!("{} new updates", d.items.len());
    d.body = None;
    d.updated_at_us = j.at_us;
    d.last_seq = seq;
}

// ---- keys ----

pub fn us_key(us: i64) -> [u8; 8] {
    (us.max(0) as u64).to_be_bytes()
}

pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            k.push(0);
        }
        k.extend_from_slice(p);
    }
    k
}

/// `sink ‖ 0 ‖ time ‖ id` (the time is fixed-width, so no separator after it).
pub fn timed_key(sink: &str, us: i64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(sink.len() + 9 + id.len());
    k.extend_from_slice(sink.as_bytes());
    k.push(0);
    k.extend_from_slice(&us_key(us));
    k.extend_from_slice(id.as_bytes());
    k
}

pub fn group_key(route: &str, recipient: &str, group: &str) -> Vec<u8> {
    cat(&[route.as_bytes(), recipient.as_bytes(), group.as_bytes()])
}

fn index_entries(d: &Delivery) -> Vec<(&'static str, Vec<u8>)> {
    let mut out = vec![
        (BY_STATUS, cat(&[d.status.as_bytes(), d.id.as_bytes()])),
        (COUNTS, cat(&[d.sink.as_bytes(), d.status.as_bytes()])),
    ];
    if let Some(t) = &d.task_id {
        out.push((BY_TASK, cat(&[t.as_bytes(), d.id.as_bytes()])));
    }
    if let Some(due) = d.due_us() {
        out.push((DUE, timed_key(&d.sink, due, &d.id)));
    }
    if d.status == "leased"
        && let Some(exp) = d.lease_expires_at_us
    {
        let mut k = us_key(exp).to_vec();
        k.extend_from_slice(d.id.as_bytes());
        out.push((LEASES, k));
    }
    if d.is_pending() {
        out.push((PENDING, timed_key(&d.sink, d.created_at_us, &d.id)));
    }
    if d.status == "sent" {
        out.push((
            SENT,
            timed_key(&d.sink, d.delivered_at_us.unwrap_or(0), &d.id),
        ));
    }
    out
}

fn add_count(st: &mut Store<'_>, key: &[u8], delta: i64) -> Result<(), StorageError> {
    let cur = st.get(COUNTS, key)?.and_then(|b| be_u64(&b)).unwrap_or(0);
    let next = (cur as i64 + delta).max(0) as u64;
    if next == 0 {
        st.delete(COUNTS, key)
    } else {
        st.put(COUNTS, key, &next.to_be_bytes())
    }
}

/// Store `new` in place of `old`, keeping every index and counter in step.
fn store_row(
    st: &mut Store<'_>,
    old: Option<&Delivery>,
    new: &Delivery,
) -> Result<(), StorageError> {
    let before = old.map(index_entries).unwrap_or_default();
    let after = index_entries(new);
    for (t, k) in &before {
        if !after.contains(&(t, k.clone())) {
            if *t == COUNTS {
                add_count(st, k, -1)?;
            } else {
                st.delete(t, k)?;
            }
        }
    }
    for (t, k) in &after {
        if !before.contains(&(t, k.clone())) {
            if *t == COUNTS {
                add_count(st, k, 1)?;
            } else {
                st.put(t, k, &[])?;
            }
        }
    }
    st.put_val(ROWS, new.id.as_bytes(), new)
}

fn step(seq: u64, kind: &str, c: &Change) -> Step {
    Step {
        seq,
        event: kind.to_owned(),
        at_us: c.at_us,
        owner: c.owner.clone(),
        attempt: c.attempt,
        error_code: c.error_code.clone(),
        error: c.error.clone(),
        reason: c.reason.clone(),
        next_attempt_at_us: c.next_attempt_at_us,
        lease_expires_at_us: c.lease_expires_at_us,
    }
}

fn put_step(st: &mut Store<'_>, id: &str, s: &Step) -> Result<(), StorageError> {
    let mut k = id.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(&s.seq.to_be_bytes());
    st.put_val(TIMELINE, &k, s)
}

fn raise_routed(st: &mut Store<'_>, seq: u64) -> Result<(), StorageError> {
    let cur = st
        .get(STATE, ROUTED_KEY)?
        .and_then(|b| be_u64(&b))
        .unwrap_or(0);
    if seq > cur {
        st.put(STATE, ROUTED_KEY, &seq.to_be_bytes())?;
    }
    Ok(())
}

fn parse<T: for<'de> Deserialize<'de>>(ev: &Event) -> Result<T, StorageError> {
    serde_json::from_str(ev.payload.get())
        .map_err(|e| StorageError::new(format!("{} at seq {}", ev.event_type, ev.seq), e))
}

pub struct Deliveries;

impl Projection for Deliveries {
    fn name(&self) -> &'static str {
        NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        &[
            ROWS, TIMELINE, DUE, LEASES, PENDING, SENT, COUNTS, BY_STATUS, BY_TASK, GROUPS,
            SETTINGS, RECIPIENTS, CANCELED, STATE,
        ]
    }

    fn apply(&self, st: &mut Store<'_>, ev: &Event) -> Result<(), StorageError> {
        let Some(ty) = EventType::parse(&ev.event_type).filter(|t| ev.stream == t.stream()) else {
            return Ok(());
        };
        use EventType as T;
        match ty {
            T::SettingsUpdated => {
                st.put(SETTINGS, &ev.seq.to_be_bytes(), ev.payload.get().as_bytes())
            }
            T::RecipientUpdated | T::RecipientSuppressed | T::RecipientUnsuppressed => {
                fold_recipient(st, ty, ev)
            }
            T::TaskCanceled => {
                if st.get(CANCELED, ev.subject.as_bytes())?.is_none() {
                    st.put(CANCELED, ev.subject.as_bytes(), &ev.seq.to_be_bytes())?;
                }
                Ok(())
            }
            t if t.stream() == Stream::Deliveries => fold_delivery(st, ev),
            _ => Ok(()),
        }
    }
}

fn fold_recipient(st: &mut Store<'_>, ty: EventType, ev: &Event) -> Result<(), StorageError> {
    let p = ev.payload_value();
    let mut r: Recipient = st
        .get_val(RECIPIENTS, ev.subject.as_bytes())?
        .unwrap_or_default();
    match ty {
        EventType::RecipientUpdated => {
            if let Some(m) = p.get("tz_offset_minutes").and_then(|v| v.as_i64()) {
                r.tz_offset_minutes = Some(m.clamp(-840, 840) as i32);
            }
        }
        EventType::RecipientSuppressed => {
            r.suppressed = true;
            r.suppressed_until_us = p
                .get("until")
                .and_then(|v| v.as_str())
                .and_then(tidemark_log::time::parse_rfc3339_micros);
            r.suppress_reason = p.get("reason").and_then(|v| v.as_str()).map(str::to_owned);
        }
        EventType::RecipientUnsuppressed => {
            r.suppressed = false;
            r.suppressed_until_us = None;
            r.suppress_reason = None;
        }
        _ => return Ok(()),
    }
    st.put_val(RECIPIENTS, ev.subject.as_bytes(), &r)
}

fn fold_delivery(st: &mut Store<'_>, ev: &Event) -> Result<(), StorageError> {
    let kind = &ev.event_type["delivery.".len()..];
    let id = ev.subject.as_bytes();
    let old: Option<Delivery> = st.get_val(ROWS, id)?;
    match kind {
        "created" => {
            let c: Created = parse(ev)?;
            raise_routed(st, c.notification_seq)?;
            if old.is_some() {
                return Ok(());
            }
            let row = c.row(ev.seq);
            if let (Some(until), Some(max), Some(g)) =
                (c.digest_until_us, c.digest_max_items, &c.group_key)
            {
                let key = group_key(&c.route, c.recipient.as_deref().unwrap_or(""), g);
                st.put_val(
                    GROUPS,
                    &key,
                    &Group {
                        delivery_id: row.id.clone(),
                        until_us: until,
                        max_items: max,
                    },
                )?;
            }
            store_row(st, None, &row)?;
            let s = Step {
                seq: ev.seq,
                event: "created".into(),
                at_us: c.created_at_us,
                owner: None,
                attempt: None,
                error_code: None,
                error: None,
                reason: c.reason.clone(),
                next_attempt_at_us: row.next_attempt_at_us,
                lease_expires_at_us: None,
            };
            put_step(st, &row.id, &s)
        }
        "joined" => {
            let j: Joined = parse(ev)?;
            raise_routed(st, j.notification_seq)?;
            let Some(old) = old else { return Ok(()) };
            let mut row = old.clone();
            join(&mut row, &j, ev.seq);
            store_row(st, Some(&old), &row)?;
            let s = Step {
                seq: ev.seq,
                event: "joined".into(),
                at_us: j.at_us,
                owner: None,
                attempt: None,
                error_code: None,
                error: None,
                reason: Some(format!("notification {}", j.notification_id)),
                next_attempt_at_us: None,
                lease_expires_at_us: None,
            };
            put_step(st, &row.id, &s)
        }
        _ => {
            let c: Change = parse(ev)?;
            if let Some(cs) = c.cancel_seq {
                raise_routed(st, cs)?;
            }
            let Some(old) = old else { return Ok(()) };
            let mut row = old.clone();
            transition(&mut row, kind, &c, ev.seq);
            store_row(st, Some(&old), &row)?;
            put_step(st, &row.id, &step(ev.seq, kind, &c))
        }
    }
}
