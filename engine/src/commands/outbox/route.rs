//! Routing: each notification (in seq order, past the routing checkpoint) becomes one delivery
//! per route its priority resolves to, delayed, digested or held past quiet hours as the
//! settings in force at its seq say; a task cancellation cancels the task's undelivered
//! deliveries of earlier notifications.

use crate::error::CommandError;
use serde_json::Value;
use tidemark_log::{Event, NewEvent};
use tidemark_projections::deliveries::{
    self as d, Change, Created, Delivery, Group, Joined, transition,
};
use tidemark_projections::names::{
    DeliveryStatus as S, DeliveryTransition as T, EventType, Priority, Stream, ids,
    priority_or_info,
};
use tidemark_projections::routing::{RouteOutcome, RoutePolicy, resolve_routes};

use super::{draw, event};
use crate::commands::{Command, DecideResult, Decided, Round};
use crate::privacy::Privacy;
use tidemark_projections::ModelsTxn;

const MINUTE_US: i64 = 60_000_000;
const DAY_US: i64 = 1_440 * MINUTE_US;

/// Move `due_us` out of a recipient-local quiet window `[from, to)` (minutes after local
/// midnight; the window may wrap past midnight): a due time inside it moves to its end.
pub fn quiet_hours_end(due_us: i64, tz_offset_minutes: i32, from: u32, to: u32) -> Option<i64> {
    if from == to {
        return None;
    }
    let local = due_us + i64::from(tz_offset_minutes) * MINUTE_US;
    if !in_window((local.rem_euclid(DAY_US) / MINUTE_US) as u32, from, to) {
        return None;
    }
    let midnight = local - local.rem_euclid(DAY_US);
    let mut end = midnight + i64::from(to) * MINUTE_US;
    if end <= local {
        end += DAY_US;
    }
    Some(end - i64::from(tz_offset_minutes) * MINUTE_US)
}

/// What the notification fields of a notification event say.
struct Notice {
    id: String,
    seq: u64,
    source_seq: u64,
    time_us: i64,
    priority: Priority,
    title: String,
    body: Option<String>,
    recipient: Option<String>,
    /// A notification list (section 17), resolved when the delivery is attempted.
    list: Option<String>,
    group_key: Option<String>,
    task_id: Option<String>,
    deliver_after_us: Option<i64>,
    /// `type` (section 2): routes restricted to `types` take only these.
    ntype: Option<String>,
    /// `source.site_id`.
    source_site: Option<String>,
    /// The changes it stands for (a source poll's `count`, section 12); 1 otherwise.
    count: u64,
}

fn notice(ev: &Event) -> Option<Notice> {
    let id = match EventType::parse(&ev.event_type)? {
        EventType::NotificationRequested => ev.event_id.clone(),
        EventType::NotificationCreated => ev.subject.clone(),
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
        priority: priority_or_info::parse(p.get("priority").and_then(Value::as_str)),
        title: s("title").unwrap_or_default(),
        body: s("body"),
        recipient: s("recipient"),
        list: s("list"),
        group_key: s("group_key"),
        task_id: s("task_id"),
        deliver_after_us: s("deliver_after")
            .as_deref()
            .and_then(tidemark_log::time::parse_rfc3339_micros),
        ntype: s("type"),
        count: p
            .get("count")
            .and_then(Value::as_u64)
            .filter(|c| *c >= 1)
            .unwrap_or(1),
        source_site: p
            .pointer("/source/site_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

/// Rows created or changed earlier in the same routing command.
#[derive(Default)]
struct Overlay {
    rows: std::collections::HashMap<String, Delivery>,
    /// Digests opened, by route, recipient and group.
    groups: std::collections::HashMap<(String, String, String), Group>,
}

impl Overlay {
    fn row(&self, st: &mut d::View<'_>, id: &str) -> Result<Option<Delivery>, CommandError> {
        match self.rows.get(id) {
            Some(r) => Ok(Some(r.clone())),
            None => Ok(st.row(id)?),
        }
    }
}

/// Route the notifications and task cancellations among `source` past the routing
/// checkpoint (the scheduler's command); answers how many events it appended.
#[derive(Debug, Clone)]
pub struct Route {
    pub source: Vec<Event>,
}

impl Command for Route {
    type Answer = usize;

    /// Route notifications and apply task cancellations, for the events of `source` (in seq
    /// order) past the routing checkpoint. The checkpoint advances in the same transaction as the
    /// events, so every notification is routed exactly once, across crashes.
    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let (source, privacy) = (self.source.as_slice(), round.privacy);
        let mut st = d::View::new(txn)?;
        let routed = st.routed()?;
        let mut out = Vec::new();
        let mut ov = Overlay::default();
        for ev in source.iter().filter(|e| e.seq > routed) {
            match (Stream::parse(&ev.stream), EventType::parse(&ev.event_type)) {
                (Some(Stream::Notifications), Some(EventType::NotificationCanceled)) => {
                    cancel_notification(
                        &mut st,
                        &mut ov,
                        &ev.subject,
                        ev.seq,
                        ev.time_us,
                        privacy,
                        &mut out,
                    )?;
                }
                (Some(Stream::Notifications), _) => {
                    if let Some(n) = notice(ev) {
                        route_one(&mut st, &mut ov, &n, privacy, &mut out)?;
                    }
                }
                (Some(Stream::TaskEvents), Some(EventType::TaskCanceled)) => {
                    cancel_task(&mut st, &mut ov, &ev.subject, ev.seq, ev.time_us, &mut out)?;
                }
                _ => {}
            }
        }
        Ok(Decided::new(out.len(), out))
    }
}

fn route_one(
    st: &mut d::View<'_>,
    ov: &mut Overlay,
    n: &Notice,
    privacy: Option<&Privacy>,
    out: &mut Vec<NewEvent>,
) -> Result<(), CommandError> {
    let s = st.settings_at(n.seq)?;
    for outcome in resolve_routes(&s, n.priority.as_str(), n.ntype.as_deref()) {
        let (route, sink, skip) = match outcome {
            RouteOutcome::Deliver { route, sink } => (route, Some(sink), None),
            RouteOutcome::Skipped { route, reason } => (route, None, Some(reason)),
        };
        let policy = s.policy(&route);
        // A redacting route writes keyed hashes in place of the ids, the recipient and the
        // group, the generic title in place of the content, and no log positions that lead
        // back to the notification (section 14).
        let redact = match (policy.redact, privacy) {
            (false, _) => None,
            (true, Some(p)) => Some(p),
            (true, None) => {
                return Err(CommandError::Misconfigured(format!(
                    "route {route:?} redacts and the engine has no privacy key ([privacy] hmac_key)"
                )));
            }
        };
        let nid = match redact {
            Some(p) => p.intent_key(&n.id),
            None => n.id.clone(),
        };
        let recipient = match (redact, &n.recipient) {
            (Some(p), Some(r)) => Some(p.recipient_hash(r)),
            (_, r) => r.clone(),
        };
        let group = match (redact, &n.group_key) {
            (Some(p), Some(g)) => Some(p.hash(g)),
            (_, g) => g.clone(),
        };
        let (title, body, seq, source_seq) = match redact {
            Some(_) => (policy.generic_title().to_owned(), None, 0, 0),
            None => (n.title.clone(), n.body.clone(), n.seq, n.source_seq),
        };
        let id = ids::delivery(&nid, &route);
        if ov.row(st, &id)?.is_some() {
            continue;
        }
        let at = n.time_us.max(n.deliver_after_us.unwrap_or(i64::MIN));
        let mut c = Created {
            delivery_id: id.clone(),
            notification_id: nid.clone(),
            notification_seq: seq,
            source_seq,
            route: route.clone(),
            sink,
            recipient: recipient.clone(),
            priority: n.priority,
            title: title.clone(),
            body: body.clone(),
            sound: s.sound_priorities.iter().any(|p| p == n.priority.as_str()),
            task_id: n.task_id.clone(),
            group_key: group.clone(),
            status: S::Queued,
            reason: None,
            max_attempts: s.retry_for(&route).max_attempts,
            created_at_us: n.time_us,
            next_attempt_at_us: at,
            delay_ms: None,
            quiet_hours_until_us: None,
            digest_until_us: None,
            digest_max_items: None,
            source_site: n.source_site.clone().filter(|_| redact.is_none()),
            redacted: redact.is_some(),
            // The notification's list, else the route's when it names no recipient either.
            list: n
                .list
                .clone()
                .or_else(|| n.recipient.is_none().then(|| policy.list.clone()).flatten()),
            ntype: n.ntype.clone(),
            count: (n.count > 1).then_some(n.count),
            order_key: policy
                .ordering
                .and_then(|o| o.key_of(n.task_id.as_deref(), recipient.as_deref())),
            order_skips_parked: policy.ordering.is_some_and(|o| !o.hold_on_park),
        };
        let canceled_at = match &n.task_id {
            Some(t) => st.task_canceled_at(t)?,
            None => None,
        };
        let rcpt = st.recipient(n.recipient.as_deref())?;
        if let Some(reason) = skip {
            c.status = S::Skipped;
            c.reason = Some(reason.into());
        } else if canceled_at.is_some_and(|cs| n.source_seq < cs) {
            c.status = S::Cancelled;
            c.reason = Some("task_canceled".into());
        } else if st.notification_canceled(&n.id)? {
            c.status = S::Cancelled;
            c.reason = Some("notification_canceled".into());
        } else if rcpt.suppressed_at(n.time_us) {
            c.status = S::Skipped;
            c.reason = Some("suppressed".into());
        } else {
            // Digest: join the open delivery of this recipient and group, if any, however
            // many items it has (section 4: a digest is never split).
            if let (Some(dg), Some(g)) = (&policy.digest, &group) {
                let key = (
                    route.clone(),
                    recipient.clone().unwrap_or_default(),
                    g.clone(),
                );
                let open = match ov.groups.get(&key) {
                    Some(g) => Some(g.clone()),
                    None => st.open_group(&key.0, &key.1, &key.2)?,
                };
                if let Some(grp) = open
                    && at < grp.until_us
                    && let Some(mut target) = ov.row(st, &grp.delivery_id)?
                    && target.status == S::Queued
                {
                    if target.all_items().any(|i| i.notification_id == nid) {
                        continue;
                    }
                    let count = target.change_count().saturating_add(n.count as usize);
                    let first = target.items.first().map_or("", |i| i.title.as_str());
                    let digest_title = match redact {
                        Some(_) => title.clone(),
                        None => {
                            s.digest_title(&route, rcpt.ext.locale.as_deref(), count, &title, first)
                        }
                    };
                    let j = Joined {
                        notification_id: nid.clone(),
                        notification_seq: seq,
                        source_seq,
                        title: title.clone(),
                        body: body.clone(),
                        at_us: n.time_us,
                        digest_title: Some(digest_title),
                        max_items: Some(dg.max_items),
                        count: (n.count > 1).then_some(n.count),
                    };
                    d::join(&mut target, &j, 0);
                    out.push(event(EventType::DeliveryJoined, target.id.as_str(), &j)?);
                    ov.rows.insert(target.id.to_string(), target);
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
            if let Some(end) = quiet_end(&policy, n.priority.as_str(), &rcpt, due) {
                c.quiet_hours_until_us = Some(end);
                due = end;
            }
            c.next_attempt_at_us = due;
        }
        ov.rows.insert(id.clone(), c.row(0));
        out.push(event(EventType::DeliveryCreated, &id, &c)?);
    }
    Ok(())
}

/// Where a due time inside the recipient's quiet window (the route's `quiet_hours`, with the
/// recipient's time zone as it is now) moves to, unless the priority bypasses it.
pub(super) fn quiet_end(
    policy: &RoutePolicy,
    priority: &str,
    recipient: &d::Recipient,
    due_us: i64,
) -> Option<i64> {
    let (from, to) = policy.quiet_hours?;
    if policy.quiet_hours_bypass.iter().any(|p| p == priority) {
        return None;
    }
    match recipient.zone() {
        Some(tz) => quiet_hours_end_in(due_us, tz, from, to),
        None => quiet_hours_end(due_us, recipient.tz_offset_minutes.unwrap_or(0), from, to),
    }
}

/// Whether local `minute` (after midnight) is in the window `[from, to)`, which may wrap past
/// midnight.
fn in_window(minute: u32, from: u32, to: u32) -> bool {
    if from < to {
        minute >= from && minute < to
    } else {
        minute >= from || minute < to
    }
}

/// [`quiet_hours_end`] in an IANA time zone: the window is read on the local clock of the day
/// `due_us` falls on, daylight-saving changes included (the window's end on a day the clocks
/// skip it is the first local time after the gap).
pub fn quiet_hours_end_in(due_us: i64, tz: chrono_tz::Tz, from: u32, to: u32) -> Option<i64> {
    use chrono::{Duration, NaiveTime, TimeZone, Timelike};
    if from == to {
        return None;
    }
    let local = chrono::DateTime::from_timestamp_micros(due_us)?.with_timezone(&tz);
    if !in_window(local.hour() * 60 + local.minute(), from, to) {
        return None;
    }
    let end_time = NaiveTime::from_hms_opt(to / 60, to % 60, 0)?;
    let mut end = local.date_naive().and_time(end_time);
    if end <= local.naive_local() {
        end += Duration::days(1);
    }
    // A local time the clocks skip (spring forward) does not exist: an hour later does.
    let at = tz.from_local_datetime(&end).earliest().or_else(|| {
        tz.from_local_datetime(&(end + Duration::hours(1)))
            .earliest()
    })?;
    Some(at.timestamp_micros())
}

/// A `notification.canceled` (section 4): its queued, retry_wait and parked deliveries are
/// cancelled, a leased one when its lease ends; on a digest that carries others only its item
/// leaves, and the title is recomputed. Its deliveries on redacting routes are found by the
/// intent key.
fn cancel_notification(
    st: &mut d::View<'_>,
    ov: &mut Overlay,
    nid: &str,
    cancel_seq: u64,
    at_us: i64,
    privacy: Option<&Privacy>,
    out: &mut Vec<NewEvent>,
) -> Result<(), CommandError> {
    let mut keys = vec![nid.to_owned()];
    if let Some(p) = privacy {
        keys.push(p.intent_key(nid));
    }
    let mut ids = Vec::new();
    for k in &keys {
        ids.extend(st.of_notification(k)?);
    }
    for r in ov.rows.values() {
        if r.all_items().any(|i| keys.contains(&i.notification_id))
            && !ids.iter().any(|i| *i == r.id)
        {
            ids.push(r.id.to_string());
        }
    }
    ids.sort();
    ids.dedup();
    let s = st.settings_at(u64::MAX)?;
    for id in ids {
        let Some(mut row) = ov.row(st, &id)? else {
            continue;
        };
        let Some(item) = keys
            .iter()
            .find(|k| row.all_items().any(|i| &&i.notification_id == k))
            .cloned()
        else {
            continue;
        };
        let mut c = Change {
            at_us,
            reason: Some("notification_canceled".into()),
            cancel_seq: Some(cancel_seq),
            notification_id: Some(item.clone()),
            ..Change::default()
        };
        if row.status == S::Leased {
            if row.cancel_pending {
                continue;
            }
            c.at_lease_end = Some(true);
        } else if !row.allows(T::Cancelled) {
            continue;
        } else if row.item_count() > 1 {
            // The digest keeps its other items: its title as if this one had never joined.
            let mut left = row.clone();
            d::remove_item(&mut left, &item);
            let all: Vec<&d::Item> = left.all_items().collect();
            let (first, newest) = (
                all.first().map(|i| i.title.clone()),
                all.last().map(|i| i.title.clone()),
            );
            c.digest_title = Some(if row.redacted {
                row.title.clone()
            } else {
                let locale = st.recipient(row.recipient.as_deref())?.ext.locale;
                s.digest_title(
                    &row.route,
                    locale.as_deref(),
                    left.change_count(),
                    newest.as_deref().unwrap_or(""),
                    first.as_deref().unwrap_or(""),
                )
            });
        }
        transition(&mut row, T::Cancelled, &c, 0);
        out.push(event(T::Cancelled, &id, &c)?);
        ov.rows.insert(id, row);
    }
    Ok(())
}

fn cancel_task(
    st: &mut d::View<'_>,
    ov: &mut Overlay,
    task: &str,
    cancel_seq: u64,
    at_us: i64,
    out: &mut Vec<NewEvent>,
) -> Result<(), CommandError> {
    let mut ids = st.of_task(task)?;
    for r in ov.rows.values() {
        if r.task_id.as_deref() == Some(task) && !ids.iter().any(|i| *i == r.id) {
            ids.push(r.id.to_string());
        }
    }
    ids.sort();
    for id in ids {
        let Some(mut row) = ov.row(st, &id)? else {
            continue;
        };
        if row.source_seq >= cancel_seq || !row.allows(T::Cancelled) {
            continue;
        }
        let c = Change {
            at_us,
            reason: Some("task_canceled".into()),
            cancel_seq: Some(cancel_seq),
            ..Change::default()
        };
        transition(&mut row, T::Cancelled, &c, 0);
        out.push(event(T::Cancelled, &id, &c)?);
        ov.rows.insert(id, row);
    }
    Ok(())
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

    fn us(rfc3339: &str) -> i64 {
        tidemark_log::time::parse_rfc3339_micros(rfc3339).unwrap()
    }

    /// Quiet hours 22:00–07:00 in Europe/Berlin follow its clock: 07:00 is 06:00 UTC in
    /// winter, 05:00 UTC in summer, and across the spring-forward night the window ends at
    /// 07:00 CEST (05:00 UTC), an hour before a fixed +01:00 offset would say.
    #[test]
    fn quiet_hours_follow_daylight_saving_in_an_iana_zone() {
        let berlin: chrono_tz::Tz = "Europe/Berlin".parse().unwrap();
        let (from, to) = (22 * 60, 7 * 60);
        let end = |at: &str| quiet_hours_end_in(us(at), berlin, from, to);
        assert_eq!(
            end("2026-01-10T22:00:00Z"),
            Some(us("2026-01-11T06:00:00Z"))
        );
        assert_eq!(
            end("2026-07-10T21:00:00Z"),
            Some(us("2026-07-11T05:00:00Z"))
        );
        assert_eq!(
            end("2026-03-28T22:00:00Z"),
            Some(us("2026-03-29T05:00:00Z"))
        );
        assert_eq!(
            quiet_hours_end(us("2026-03-28T22:00:00Z"), 60, from, to),
            Some(us("2026-03-29T06:00:00Z")),
            "a fixed offset misses the change"
        );
        assert_eq!(end("2026-07-10T12:00:00Z"), None, "outside the window");
        // A window ending inside the skipped hour (02:30 on 29 March) ends at 03:30 CEST.
        assert_eq!(
            quiet_hours_end_in(us("2026-03-28T23:00:00Z"), berlin, 0, 150),
            Some(us("2026-03-29T01:30:00Z"))
        );
    }
}
