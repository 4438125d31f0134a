//! The delivery runtime's decisions (spec sections 4 and 5), as commands run by the log's
//! writer inside its transaction (`Log::command`): each reads the deliveries model as left by
//! every event before it, checks the transition, and returns the events that record it. Two
//! concurrent claims are two commands in sequence, so a row is never leased twice.
//!
//! The clock and random draws are read here, never in the fold: `now_us` is passed in and the
//! chosen times are written into the events.

use serde_json::Value;
use tidemark_log::redb::{ReadableTable, WriteTransaction};
use tidemark_log::{CommandError, Event, NewEvent, RejectKind};

use crate::deliveries::{
    self as d, Change, Created, Delivery, Group, Joined, Recipient, allowed, transition,
};
use crate::framework::{TxnTables, be_u64};
use crate::routing::{RouteOutcome, RoutingSettings, backoff_ms, resolve_routes};

fn storage(e: String) -> CommandError {
    CommandError::Storage(e)
}

/// The deliveries model seen from inside the writer's transaction.
pub struct State<'t> {
    t: TxnTables<'t>,
}

impl<'t> State<'t> {
    pub fn new(txn: &'t WriteTransaction) -> Result<Self, CommandError> {
        Ok(State {
            t: TxnTables::new(txn, d::NAME).map_err(storage)?,
        })
    }

    pub fn row(&mut self, id: &str) -> Result<Option<Delivery>, CommandError> {
        self.t.get_val(d::ROWS, id.as_bytes()).map_err(storage)
    }

    fn recipient(&mut self, r: Option<&str>) -> Result<Recipient, CommandError> {
        let Some(r) = r else {
            return Ok(Recipient::default());
        };
        Ok(self
            .t
            .get_val(d::RECIPIENTS, r.as_bytes())
            .map_err(storage)?
            .unwrap_or_default())
    }

    fn u64_at(&mut self, table: &'static str, key: &[u8]) -> Result<Option<u64>, CommandError> {
        Ok(self
            .t
            .get(table, key)
            .map_err(storage)?
            .and_then(|b| be_u64(&b)))
    }

    /// Seq of the last notification or cancellation routing has handled.
    pub fn routed(&mut self) -> Result<u64, CommandError> {
        Ok(self.u64_at(d::STATE, d::ROUTED_KEY)?.unwrap_or(0))
    }

    /// The settings in force at `seq` (the last `settings.updated` at or before it).
    pub fn settings_at(&mut self, seq: u64) -> Result<RoutingSettings, CommandError> {
        let t = self.t.table(d::SETTINGS).map_err(storage)?;
        let mut range = t
            .range(..=seq.to_be_bytes().as_slice())
            .map_err(|e| storage(e.to_string()))?;
        let Some(row) = range.next_back() else {
            return Ok(RoutingSettings::default());
        };
        let (_, v) = row.map_err(|e| storage(e.to_string()))?;
        let json: Value = serde_json::from_slice(v.value()).map_err(|e| storage(e.to_string()))?;
        // The server validated the settings before recording them.
        Ok(RoutingSettings::from_json(&json).unwrap_or_default())
    }

    /// Keys of `table` in `[from, to)`, at most `max`.
    fn keys(
        &mut self,
        table: &'static str,
        from: &[u8],
        to: &[u8],
        max: usize,
    ) -> Result<Vec<Vec<u8>>, CommandError> {
        let t = self.t.table(table).map_err(storage)?;
        let mut out = Vec::new();
        for row in t.range(from..to).map_err(|e| storage(e.to_string()))? {
            let (k, _) = row.map_err(|e| storage(e.to_string()))?;
            out.push(k.value().to_vec());
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }
}

fn event(kind: &str, id: &str, payload: &impl serde::Serialize) -> Result<NewEvent, CommandError> {
    let v = serde_json::to_value(payload).map_err(|e| storage(e.to_string()))?;
    NewEvent::new(None, "deliveries", id, format!("delivery.{kind}"), &v)
        .map_err(|e| storage(e.to_string()))
}

/// A number in [0, 1) drawn from `seed`: the draws of routing are a function of the delivery
/// id, so a replayed routing decision is the same decision.
fn draw(seed: &[&[u8]]) -> f64 {
    let mut h = blake3::Hasher::new();
    for s in seed {
        h.update(&(s.len() as u32).to_le_bytes());
        h.update(s);
    }
    let b = h.finalize();
    let x = u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes"));
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Delivery id `dlv:<notification_id>:<route>`; when that is longer than a subject may be
/// (128), the notification id is replaced by a hash of it.
pub fn delivery_id(notification_id: &str, route: &str) -> String {
    let id = format!("dlv:{notification_id}:{route}");
    if id.chars().count() <= 128 {
        return id;
    }
    let h = blake3::hash(notification_id.as_bytes()).to_hex();
    format!("dlv:~{}:{route}", &h[..32])
}

const MINUTE_US: i64 = 60_000_000;
const DAY_US: i64 = 1_440 * MINUTE_US;

/// Move `due_us` out of a recipient-local quiet window `[from, to)` (minutes after local
/// midnight; the window may wrap past midnight): a due time inside it moves to its end.
pub fn quiet_hours_end(due_us: i64, tz_offset_minutes: i32, from: u32, to: u32) -> Option<i64> {
    if from == to {
        return None;
    }
    let local = due_us + tz_offset_minutes as i64 * MINUTE_US;
    let minute = local.rem_euclid(DAY_US) / MINUTE_US;
    let (from, to) = (from as i64, to as i64);
    let inside = if from < to {
        minute >= from && minute < to
    } else {
        minute >= from || minute < to
    };
    if !inside {
        return None;
    }
    let midnight = local - local.rem_euclid(DAY_US);
    let mut end = midnight + to * MINUTE_US;
    if end <= local {
        end += DAY_US;
    }
    Some(end - tz_offset_minutes as i64 * MINUTE_US)
}

/// What the notification fields of a notification event say.
struct Notice {
    id: String,
    seq: u64,
    source_seq: u64,
    time_us: i64,
    priority: String,
    title: String,
    body: Option<String>,
    recipient: Option<String>,
    group_key: Option<String>,
    task_id: Option<String>,
    deliver_after_us: Option<i64>,
}

fn notice(ev: &Event) -> Option<Notice> {
    let id = match ev.event_type.as_str() {
        "notification.requested" => ev.event_id.clone(),
        "notification.created" => ev.subject.clone(),
        _ => return None,
    };
    let p = ev.payload_value();
    let s = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_owned);
    Some(Notice {
        id,
        seq: ev.seq,
        source_seq: p
            .get("source_seq")
            .and_then(Value::as_u64)
            .unwrap_or(ev.seq),
        time_us: ev.time_us,
        priority: s("priority").unwrap_or_else(|| "info".into()),
        title: s("title").unwrap_or_default(),
        body: s("body"),
        recipient: s("recipient"),
        group_key: s("group_key"),
        task_id: s("task_id"),
        deliver_after_us: s("deliver_after")
            .as_deref()
            .and_then(tidemark_log::time::parse_rfc3339_micros),
    })
}

/// Rows created or changed earlier in the same routing command.
#[derive(Default)]
struct Overlay {
    rows: std::collections::HashMap<String, Delivery>,
    groups: std::collections::HashMap<Vec<u8>, Group>,
}

impl Overlay {
    fn row(&self, st: &mut State<'_>, id: &str) -> Result<Option<Delivery>, CommandError> {
        match self.rows.get(id) {
            Some(r) => Ok(Some(r.clone())),
            None => st.row(id),
        }
    }
}

/// Route notifications and apply task cancellations, for the events of `source` (in seq
/// order) past the routing checkpoint. The checkpoint advances in the same transaction as the
/// events, so every notification is routed exactly once, across crashes.
pub fn route(txn: &WriteTransaction, source: &[Event]) -> Result<Vec<NewEvent>, CommandError> {
    let mut st = State::new(txn)?;
    let routed = st.routed()?;
    let mut out = Vec::new();
    let mut ov = Overlay::default();
    for ev in source.iter().filter(|e| e.seq > routed) {
        match (ev.stream.as_str(), ev.event_type.as_str()) {
            ("notifications", _) => {
                if let Some(n) = notice(ev) {
                    route_one(&mut st, &mut ov, &n, &mut out)?;
                }
            }
            ("task_events", "task.canceled") => {
                cancel_task(&mut st, &mut ov, &ev.subject, ev.seq, ev.time_us, &mut out)?
            }
            _ => {}
        }
    }
    Ok(out)
}

fn route_one(
    st: &mut State<'_>,
    ov: &mut Overlay,
    n: &Notice,
    out: &mut Vec<NewEvent>,
) -> Result<(), CommandError> {
    let s = st.settings_at(n.seq)?;
    for outcome in resolve_routes(&s, &n.priority) {
        let (route, sink, skip) = match outcome {
            RouteOutcome::Deliver { route, sink } => (route, sink, None),
            RouteOutcome::Skipped { route, reason } => (route, "none".to_owned(), Some(reason)),
        };
        let id = delivery_id(&n.id, &route);
        if ov.row(st, &id)?.is_some() {
            continue;
        }
        let at = n.time_us.max(n.deliver_after_us.unwrap_or(i64::MIN));
        let policy = s.routes.get(&route).cloned().unwrap_or_default();
        let mut c = Created {
            delivery_id: id.clone(),
            notification_id: n.id.clone(),
            notification_seq: n.seq,
            source_seq: n.source_seq,
            route: route.clone(),
            sink,
            recipient: n.recipient.clone(),
            priority: n.priority.clone(),
            title: n.title.clone(),
            body: n.body.clone(),
            sound: s.sound_priorities.contains(&n.priority),
            task_id: n.task_id.clone(),
            group_key: n.group_key.clone(),
            status: "queued".into(),
            reason: None,
            max_attempts: s.retry.max_attempts,
            created_at_us: n.time_us,
            next_attempt_at_us: at,
            delay_ms: None,
            quiet_hours_until_us: None,
            digest_until_us: None,
            digest_max_items: None,
        };
        let canceled_at = match &n.task_id {
            Some(t) => st.u64_at(d::CANCELED, t.as_bytes())?,
            None => None,
        };
        let recipient = st.recipient(n.recipient.as_deref())?;
        if let Some(reason) = skip {
            c.status = "skipped".into();
            c.reason = Some(reason.into());
        } else if canceled_at.is_some_and(|cs| n.source_seq < cs) {
            c.status = "cancelled".into();
            c.reason = Some("task_canceled".into());
        } else if recipient.suppressed_at(n.time_us) {
            c.status = "skipped".into();
            c.reason = Some("suppressed".into());
        } else {
            // Digest: join the open delivery of this recipient and group, if any.
            if let (Some(dg), Some(g)) = (&policy.digest, &n.group_key) {
                let key = d::group_key(&route, n.recipient.as_deref().unwrap_or(""), g);
                let open = match ov.groups.get(&key) {
                    Some(g) => Some(g.clone()),
                    None => st.t.get_val::<Group>(d::GROUPS, &key).map_err(storage)?,
                };
                if let Some(grp) = open
                    && at < grp.until_us
                    && let Some(mut target) = ov.row(st, &grp.delivery_id)?
                    && target.status == "queued"
                    && (target.items.len() as u32) < grp.max_items
                {
                    let j = Joined {
                        notification_id: n.id.clone(),
                        notification_seq: n.seq,
                        source_seq: n.source_seq,
                        title: n.title.clone(),
                        body: n.body.clone(),
                        at_us: n.time_us,
                    };
                    d::join(&mut target, &j, 0);
                    out.push(event("joined", &target.id, &j)?);
                    ov.rows.insert(target.id.clone(), target);
                    continue;
                }
                let until = at.saturating_add(dg.window_ms as i64 * 1_000);
                c.digest_until_us = Some(until);
                c.digest_max_items = Some(dg.max_items);
                ov.groups.insert(
                    key,
                    Group {
                        delivery_id: id.clone(),
                        until_us: until,
                        max_items: dg.max_items,
                    },
                );
            }
            let mut due = at;
            if let Some((lo, hi)) = policy.delay_ms {
                let u = draw(&[id.as_bytes(), b"delay"]);
                let ms = lo + ((hi - lo) as f64 * u) as u64;
                c.delay_ms = Some(ms);
                due = due.saturating_add(ms as i64 * 1_000);
            }
            if let Some(until) = c.digest_until_us {
                due = due.max(until);
            }
            if let Some((from, to)) = policy.quiet_hours
                && !policy.quiet_hours_bypass.contains(&n.priority)
                && let Some(end) =
                    quiet_hours_end(due, recipient.tz_offset_minutes.unwrap_or(0), from, to)
            {
                c.quiet_hours_until_us = Some(end);
                due = end;
            }
            c.next_attempt_at_us = due;
        }
        ov.rows.insert(id.clone(), c.row(0));
        out.push(event("created", &id, &c)?);
    }
    Ok(())
}

fn cancel_task(
    st: &mut State<'_>,
    ov: &mut Overlay,
    task: &str,
    cancel_seq: u64,
    at_us: i64,
    out: &mut Vec<NewEvent>,
) -> Result<(), CommandError> {
    let mut from = task.as_bytes().to_vec();
    from.push(0);
    let mut to = task.as_bytes().to_vec();
    to.push(1);
    let mut ids: Vec<String> = st
        .keys(d::BY_TASK, &from, &to, usize::MAX)?
        .into_iter()
        .map(|k| String::from_utf8_lossy(&k[from.len()..]).into_owned())
        .collect();
    for r in ov.rows.values() {
        if r.task_id.as_deref() == Some(task) && !ids.contains(&r.id) {
            ids.push(r.id.clone());
        }
    }
    ids.sort();
    for id in ids {
        let Some(mut row) = ov.row(st, &id)? else {
            continue;
        };
        if row.source_seq >= cancel_seq || !allowed(&row.status, "cancelled") {
            continue;
        }
        let c = Change {
            at_us,
            reason: Some("task_canceled".into()),
            cancel_seq: Some(cancel_seq),
            ..Change::default()
        };
        transition(&mut row, "cancelled", &c, 0);
        out.push(event("cancelled", &id, &c)?);
        ov.rows.insert(id, row);
    }
    Ok(())
}

fn not_found(id: &str) -> CommandError {
    CommandError::rejected(
        RejectKind::NotFound,
        "delivery_not_found",
        format!("no delivery {id:?}"),
    )
}

fn illegal(row: &Delivery, action: &str) -> CommandError {
    CommandError::rejected(
        RejectKind::Conflict,
        "illegal_transition",
        format!(
            "delivery {:?} is {}: {action} is not allowed from that state",
            row.id, row.status
        ),
    )
}

/// The row, leased by `owner` and not expired at `now_us`: once a lease has passed its
/// `lease_expires_at` the delivery is due again (spec section 5), whether or not the expiry
/// tick has recorded it yet, so the old owner's complete, fail or extend is refused the same
/// way every time.
fn owned_lease(
    row: Option<Delivery>,
    now_us: i64,
    id: &str,
    owner: &str,
    action: &str,
) -> Result<Delivery, CommandError> {
    let row = row.ok_or_else(|| not_found(id))?;
    if row.status != "leased" {
        return Err(illegal(&row, action));
    }
    if row.lease_owner.as_deref() != Some(owner) {
        return Err(CommandError::rejected(
            RejectKind::Conflict,
            "not_lease_owner",
            format!("delivery {id:?} is leased by another owner"),
        ));
    }
    if row.lease_expires_at_us.is_some_and(|e| e <= now_us) {
        return Err(CommandError::rejected(
            RejectKind::Conflict,
            "lease_expired",
            format!("the lease on {id:?} has expired; claim it again"),
        ));
    }
    Ok(row)
}

/// Claim due deliveries of `sink`, oldest due first: queued, retry_wait past its next attempt,
/// leased past its lease (released first). Suppression is re-checked: a delivery to a
/// recipient suppressed now is skipped instead. Answers the leased rows.
pub fn claim(
    txn: &WriteTransaction,
    now_us: i64,
    sink: &str,
    owner: &str,
    limit: usize,
    lease_ms: u64,
) -> Result<(Vec<Delivery>, Vec<NewEvent>), CommandError> {
    let mut st = State::new(txn)?;
    let mut from = sink.as_bytes().to_vec();
    from.push(0);
    let mut to = from.clone();
    to.extend_from_slice(&d::us_key(now_us.saturating_add(1)));
    let mut leased = Vec::new();
    let mut events = Vec::new();
    let mut after = from.clone();
    while leased.len() < limit {
        let keys = st.keys(d::DUE, &after, &to, limit - leased.len())?;
        if keys.is_empty() {
            break;
        }
        for k in &keys {
            let id = String::from_utf8_lossy(&k[from.len() + 8..]).into_owned();
            let Some(mut row) = st.row(&id)? else {
                continue;
            };
            if row.status == "leased" {
                let c = expiry(&row, now_us);
                transition(&mut row, "lease_expired", &c, 0);
                events.push(event("lease_expired", &id, &c)?);
                if row.status == "parked" {
                    continue;
                }
            }
            if st
                .recipient(row.recipient.as_deref())?
                .suppressed_at(now_us)
            {
                let c = Change {
                    at_us: now_us,
                    reason: Some("suppressed".into()),
                    ..Change::default()
                };
                events.push(event("skipped", &id, &c)?);
                continue;
            }
            let c = Change {
                at_us: now_us,
                owner: Some(owner.to_owned()),
                attempt: Some(row.attempts + 1),
                lease_expires_at_us: Some(now_us.saturating_add(lease_ms as i64 * 1_000)),
                ..Change::default()
            };
            transition(&mut row, "leased", &c, 0);
            events.push(event("leased", &id, &c)?);
            leased.push(row);
        }
        after = keys.last().expect("not empty").clone();
        after.push(0);
    }
    Ok((leased, events))
}

/// A lease's expiry: back to queued, or parked when it used the last attempt.
fn expiry(row: &Delivery, now_us: i64) -> Change {
    let parked = row.attempts >= row.max_attempts;
    Change {
        at_us: now_us,
        owner: row.lease_owner.clone(),
        attempt: Some(row.attempts),
        next_attempt_at_us: (!parked).then_some(now_us),
        parked: Some(parked),
        reason: parked.then(|| "max_attempts".into()),
        ..Change::default()
    }
}

/// Release leases that expired by `now_us` (at most `max`): the periodic tick and the one at
/// start-up. Answers how many.
pub fn expire_leases(
    txn: &WriteTransaction,
    now_us: i64,
    max: usize,
) -> Result<(usize, Vec<NewEvent>), CommandError> {
    let mut st = State::new(txn)?;
    let to = d::us_key(now_us.saturating_add(1));
    let keys = st.keys(d::LEASES, &[], &to, max)?;
    let mut events = Vec::new();
    for k in &keys {
        let id = String::from_utf8_lossy(&k[8..]).into_owned();
        let Some(row) = st.row(&id)? else { continue };
        if row.status != "leased" {
            continue;
        }
        events.push(event("lease_expired", &id, &expiry(&row, now_us))?);
    }
    Ok((events.len(), events))
}

/// The lease owner reports the delivery sent. Completing again by the same owner is answered
/// with the row and changes nothing.
pub fn complete(
    txn: &WriteTransaction,
    now_us: i64,
    id: &str,
    owner: &str,
    external_id: Option<String>,
) -> Result<(Delivery, Vec<NewEvent>), CommandError> {
    let (mut out, events) = complete_many(txn, now_us, owner, &[(id.to_owned(), external_id)])?;
    match out.pop() {
        Some(Completed::Sent(row)) => Ok((*row, events)),
        Some(Completed::Refused {
            code,
            detail,
            not_found,
        }) => Err(CommandError::rejected(
            if not_found {
                RejectKind::NotFound
            } else {
                RejectKind::Conflict
            },
            code,
            detail,
        )),
        None => Err(CommandError::Storage("complete answered nothing".into())),
    }
}

/// One item of a batch completion: the row it left, or why it was refused.
#[derive(Debug, Clone)]
pub enum Completed {
    Sent(Box<Delivery>),
    Refused {
        code: &'static str,
        detail: String,
        not_found: bool,
    },
}

/// Complete many deliveries leased by `owner` in one command (one transaction, one fold of
/// the read models): each item is checked as [`complete`] checks it, and refused items change
/// nothing while the others are recorded.
pub fn complete_many(
    txn: &WriteTransaction,
    now_us: i64,
    owner: &str,
    items: &[(String, Option<String>)],
) -> Result<(Vec<Completed>, Vec<NewEvent>), CommandError> {
    let mut st = State::new(txn)?;
    let mut out = Vec::with_capacity(items.len());
    let mut events = Vec::new();
    let mut done: std::collections::HashMap<&str, Delivery> = Default::default();
    for (id, external_id) in items {
        let current = match done.get(id.as_str()) {
            Some(r) => Some(r.clone()),
            None => st.row(id)?,
        };
        let result = match current {
            None => Err(not_found(id)),
            Some(row) if row.status == "sent" && row.lease_owner.as_deref() == Some(owner) => {
                out.push(Completed::Sent(Box::new(row)));
                continue;
            }
            row => match owned_lease(row, now_us, id, owner, "complete") {
                Err(e) => Err(e),
                Ok(mut row) => {
                    let c = Change {
                        at_us: now_us,
                        owner: Some(owner.to_owned()),
                        attempt: Some(row.attempts),
                        external_id: external_id.clone(),
                        ..Change::default()
                    };
                    transition(&mut row, "sent", &c, 0);
                    events.push(event("sent", id, &c)?);
                    done.insert(id.as_str(), row.clone());
                    Ok(row)
                }
            },
        };
        out.push(match result {
            Ok(row) => Completed::Sent(Box::new(row)),
            Err(CommandError::Rejected { kind, code, detail }) => Completed::Refused {
                code,
                detail,
                not_found: kind == RejectKind::NotFound,
            },
            Err(e) => return Err(e),
        });
    }
    Ok((out, events))
}

/// What a failure report says.
#[derive(Debug, Clone)]
pub struct Failure {
    pub error_code: String,
    pub error: String,
    pub retryable: bool,
    pub retry_after_ms: Option<u64>,
}

/// The lease owner reports a failed attempt: retry_wait with backoff, or parked when it is
/// permanent or the last attempt.
pub fn fail(
    txn: &WriteTransaction,
    now_us: i64,
    id: &str,
    owner: &str,
    f: Failure,
) -> Result<(Delivery, Vec<NewEvent>), CommandError> {
    let mut st = State::new(txn)?;
    let mut row = owned_lease(st.row(id)?, now_us, id, owner, "fail")?;
    let parked = !f.retryable || row.attempts >= row.max_attempts;
    let next = if parked {
        None
    } else {
        let retry = st.settings_at(u64::MAX)?.retry;
        let u = rand::random::<f64>();
        let ms = backoff_ms(&retry, row.attempts.max(1), u, f.retry_after_ms);
        Some(now_us.saturating_add(ms as i64 * 1_000))
    };
    let c = Change {
        at_us: now_us,
        owner: Some(owner.to_owned()),
        attempt: Some(row.attempts),
        next_attempt_at_us: next,
        error_code: Some(f.error_code),
        error: Some(f.error),
        retryable: Some(f.retryable),
        retry_after_ms: f.retry_after_ms,
        parked: Some(parked),
        reason: parked.then(|| {
            if f.retryable {
                "max_attempts"
            } else {
                "permanent_failure"
            }
            .into()
        }),
        ..Change::default()
    };
    transition(&mut row, "attempt_failed", &c, 0);
    Ok((row, vec![event("attempt_failed", id, &c)?]))
}

/// The lease owner extends its lease (heartbeat); an expired lease cannot be extended.
pub fn extend(
    txn: &WriteTransaction,
    now_us: i64,
    id: &str,
    owner: &str,
    lease_ms: u64,
) -> Result<(Delivery, Vec<NewEvent>), CommandError> {
    let mut st = State::new(txn)?;
    if let Some(row) = st.row(id)?
        && row.status != "leased"
        && row.last_error_code.as_deref() == Some("lease_expired")
    {
        // Released by the expiry tick before this heartbeat arrived.
        return Err(CommandError::rejected(
            RejectKind::Conflict,
            "lease_expired",
            format!("the lease on {id:?} has expired; claim it again"),
        ));
    }
    let mut row = owned_lease(st.row(id)?, now_us, id, owner, "extend")?;
    let c = Change {
        at_us: now_us,
        owner: Some(owner.to_owned()),
        attempt: Some(row.attempts),
        lease_expires_at_us: Some(now_us.saturating_add(lease_ms as i64 * 1_000)),
        ..Change::default()
    };
    transition(&mut row, "lease_extended", &c, 0);
    Ok((row, vec![event("lease_extended", id, &c)?]))
}

/// Operator action on a parked delivery: `retried` (back to queued with attempts 0) or
/// `discarded`.
pub fn operator(
    txn: &WriteTransaction,
    now_us: i64,
    id: &str,
    kind: &str,
    by: &str,
    reason: Option<String>,
) -> Result<(Delivery, Vec<NewEvent>), CommandError> {
    let mut st = State::new(txn)?;
    let mut row = st.row(id)?.ok_or_else(|| not_found(id))?;
    if !allowed(&row.status, kind) {
        let action = if kind == "retried" {
            "retry"
        } else {
            "discard"
        };
        return Err(illegal(&row, action));
    }
    let c = Change {
        at_us: now_us,
        owner: Some(by.to_owned()),
        reason,
        ..Change::default()
    };
    transition(&mut row, kind, &c, 0);
    Ok((row, vec![event(kind, id, &c)?]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 60 * MINUTE_US;

    #[test]
    fn quiet_hours_edges() {
        let day = 20_000 * DAY_US; // a UTC midnight
        let (from, to) = (22 * 60, 9 * 60);
        assert_eq!(
            quiet_hours_end(day + 21 * H + 59 * MINUTE_US, 0, from, to),
            None
        );
        assert_eq!(
            quiet_hours_end(day + 22 * H + MINUTE_US, 0, from, to),
            Some(day + DAY_US + 9 * H),
            "22:01 moves to the next 09:00"
        );
        assert_eq!(
            quiet_hours_end(day + 22 * H, 0, from, to),
            Some(day + DAY_US + 9 * H),
            "the window starts at 22:00"
        );
        assert_eq!(
            quiet_hours_end(day + 3 * H, 0, from, to),
            Some(day + 9 * H),
            "after midnight: the same day's 09:00"
        );
        assert_eq!(
            quiet_hours_end(day + 9 * H, 0, from, to),
            None,
            "09:00 is outside"
        );
        // Recipient at UTC+02:00: 22:01 local is 20:01Z; the end is 09:00 local = 07:00Z.
        assert_eq!(
            quiet_hours_end(day + 20 * H + MINUTE_US, 120, from, to),
            Some(day + DAY_US + 7 * H)
        );
        // A window that does not wrap.
        assert_eq!(
            quiet_hours_end(day + 13 * H, 0, 12 * 60, 14 * 60),
            Some(day + 14 * H)
        );
        assert_eq!(quiet_hours_end(day + 14 * H, 0, 12 * 60, 14 * 60), None);
    }

    #[test]
    fn long_notification_ids_get_a_hashed_delivery_id() {
        assert_eq!(delivery_id("n1", "desktop"), "dlv:n1:desktop");
        let long = "x".repeat(128);
        let id = delivery_id(&long, "desktop");
        assert!(id.len() <= 128 && id.starts_with("dlv:~"), "{id}");
        assert_eq!(id, delivery_id(&long, "desktop"));
    }
}
