//! The deliveries read model (spec section 5): one row per delivery with its attempt timeline,
//! and the indexes the delivery runtime decides from (claimable rows by due time, leases by
//! expiry, pending rows by age, counts per sink and status), plus the routing inputs folded
//! from the log: settings in force at each seq, recipients (time zone, suppression) and
//! canceled tasks.
//!
//! Every field comes from an event: commands read the clock and draw random numbers, write the
//! result into the event, and this fold only copies it (I3).

use crate::ids::DeliveryId;
use serde::{Deserialize, Serialize};

use crate::names::{DeliveryStatus, DeliveryTransition, Priority, Sink};

mod fold;
mod keys;
pub mod read;
mod row;
mod view;

pub use fold::Deliveries;
pub use keys::{cat, created_key, group_key, timed_key, us_key};
pub use row::{Delivery, Item};
pub use view::{DueAfter, View};

pub const NAME: &str = "deliveries";
pub const ROWS: &str = "rows";
pub const TIMELINE: &str = "timeline";
/// `sink ‖ 0 ‖ due_us ‖ id` for claimable rows: queued and retry_wait by their next attempt,
/// leased by their lease expiry; not the rows of a held endpoint ([`ROUTE_DUE`]).
pub const DUE: &str = "due";
/// `sink ‖ 0 ‖ rank ‖ due_us ‖ id` for the same rows as [`DUE`], `rank` the place of the
/// delivery's priority ([`priority_rank`]): claims take urgent first, then action, warning and
/// info, the oldest due first within a priority (section 5). Outside the digest, like the
/// list filters.
pub const DUE_BY_PRIORITY: &str = "due_by_priority";
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
/// `sink ‖ 0 ‖ id`, `route ‖ 0 ‖ id` and `recipient ‖ 0 ‖ id` (rows with a recipient): the
/// list filters of `GET /v1/deliveries`, intersected when combined. Added after the golden
/// release, so they are written outside the digest (`Store::put_index`).
pub const BY_SINK: &str = "by_sink";
pub const BY_ROUTE: &str = "by_route";
pub const BY_RECIPIENT: &str = "by_recipient";
/// `type ‖ 0 ‖ id` (the notification's type) and `list ‖ 0 ‖ id` (section 17): `?type=` and
/// `?list=`, like the filters above.
pub const BY_TYPE: &str = "by_type";
pub const BY_LIST: &str = "by_list";
/// `notification_id ‖ 0 ‖ id` for every notification a delivery carries (a digest carries the
/// ones that joined it): `?notification_id=` and the status record of a notification (spec
/// section 14). Outside the digest, like the other list-filter indexes.
pub const BY_NOTIFICATION: &str = "by_notification";
/// Per source site (the notification's `source.site_id`, section 2), outside the digest like
/// the list filters: `site ‖ 0 ‖ id` (`?source_site=`), `site ‖ 0 ‖ status ‖ 0 ‖ id`, and
/// `site ‖ 0 ‖ time ‖ id` of pending rows (by creation) and sent rows (by delivery): the
/// `by_source_site` KPIs.
pub const BY_SITE: &str = "by_site";
pub const SITE_STATUS: &str = "site_status";
pub const SITE_PENDING: &str = "site_pending";
pub const SITE_SENT: &str = "site_sent";
/// `site ‖ 0 ‖ due_us ‖ id` of claimable rows, like [`DUE`] per sink: the per-site stuck
/// count (a row is stuck once it has been due for `stuck_after`, section 5).
pub const SITE_DUE: &str = "site_due";
/// `created_us ‖ id` (the time big-endian, fixed width): the newest-first list of
/// `GET /v1/deliveries?order=newest`, and its time range. Outside the digest, like the list
/// filters.
pub const BY_CREATED: &str = "by_created";
/// `route ‖ 0 ‖ recipient ‖ 0 ‖ group_key` → the open digest [`Group`].
pub const GROUPS: &str = "groups";
/// seq (BE) → the notification settings in force from that seq on: the payload of the
/// `settings.updated` at that seq, or, once routes are managed at runtime, those settings with
/// the routes ([`crate::routing::NotificationsConfig::with_routes`]) as of that seq.
pub const SETTINGS: &str = "settings";
/// What the [`SETTINGS`] rows are made of: `base` → the payload of the last
/// `settings.updated`; `routes` → the routes managed at runtime (`route.updated`), a JSON
/// object of name → route without its `url` and `secret`. Outside the digest: every settings
/// row they make is in it.
pub const ROUTING_INPUTS: &str = "routing_inputs";
/// recipient → [`Recipient`].
pub const RECIPIENTS: &str = "recipients";
/// notification id → seq of its first `notification.canceled` (BE): routing cancels what it
/// would create for it.
pub const NOTIFICATIONS_CANCELED: &str = "notifications_canceled";
/// task_id → seq of its first `task.canceled` (BE).
pub const CANCELED: &str = "canceled";
/// `routed` → seq of the last notification or task cancellation the routing command has
/// handled (BE): routing resumes after it.
pub const STATE: &str = "state";
pub const ROUTED_KEY: &[u8] = b"routed";
/// route → [`crate::endpoints::Endpoint`], the health and circuit of each delivering route (section 17).
pub const ENDPOINTS: &str = "endpoints";
/// `route ‖ 0 ‖ due_us ‖ id` for the claimable rows of the delivering sinks (`email`,
/// `webhook`), held or not: a held route's rows leave [`DUE`] and [`DUE_BY_PRIORITY`] (they
/// wait) and are found here for a probe and to return when it closes. Outside the digest.
pub const ROUTE_DUE: &str = "route_due";
/// `route ‖ 0 ‖ order_key ‖ 0 ‖ order_seq (8) ‖ id` for each delivery that holds its
/// key of an ordered route (section 4: pending, or parked on a route whose parked deliveries
/// hold): the first of a key is the one that may be in flight; the others wait, out of
/// [`DUE`] and [`DUE_BY_PRIORITY`]. Outside the digest (a function of the rows).
pub const ORDER: &str = "order";

/// The delivery an entry of [`ORDER`] names, when `entry` is one of `prefix`'s key.
pub(crate) fn order_entry_id(prefix: &[u8], entry: &[u8]) -> Option<String> {
    entry
        .strip_prefix(prefix)
        .and_then(|rest| rest.get(8..))
        .map(|id| String::from_utf8_lossy(id).into_owned())
}

/// The prefix of the entries of `route`'s key `order_key` in [`ORDER`].
pub fn order_prefix(route: &str, order_key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(route.len() + order_key.len() + 2);
    k.extend_from_slice(route.as_bytes());
    k.push(0);
    k.extend_from_slice(order_key.as_bytes());
    k.push(0);
    k
}

/// The place of `priority` in claim order: urgent 0, action 1, warning 2, info 3.
pub fn priority_rank(priority: Priority) -> u8 {
    Priority::ALL
        .iter()
        .position(|p| *p == priority)
        .map_or(PRIORITY_RANKS - 1, |i| i as u8)
}

/// How many ranks [`priority_rank`] gives.
pub const PRIORITY_RANKS: u8 = Priority::ALL.len() as u8;

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
    /// Who retried or discarded it (section 8; absent in open mode and on other steps).
    /// Trailing, so a step stored before it keeps its bytes.
    #[serde(default, with = "crate::trailing")]
    pub by: Option<String>,
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
    #[serde(default, with = "crate::trailing")]
    pub ext: RecipientExt,
}

/// The fields a recipient gained after the golden release (a row that leaves them at their
/// defaults keeps its bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecipientExt {
    /// BCP 47 tag from `recipient.updated`: the digest templates' locale (section 4).
    pub locale: Option<String>,
    /// IANA time-zone name (`Europe/Berlin`) from `recipient.updated`: quiet hours follow its
    /// daylight-saving changes; it wins over `tz_offset_minutes`.
    pub tz: Option<String>,
}

impl Recipient {
    /// The recipient's time zone, if it set an IANA name.
    pub fn zone(&self) -> Option<chrono_tz::Tz> {
        self.ext.tz.as_deref().and_then(|t| t.parse().ok())
    }
}

impl Recipient {
    /// Apply a recipient event (`ty` with payload `p`); false for another type. The one rule
    /// the fold and the append's crisis-block check (which applies a batch's own recipient
    /// events in order, spec section 14) share.
    pub fn apply(&mut self, ty: crate::names::EventType, p: &serde_json::Value) -> bool {
        use crate::names::EventType as T;
        match ty {
            T::RecipientUpdated => {
                if let Some(m) = p.get("tz_offset_minutes").and_then(|v| v.as_i64()) {
                    self.tz_offset_minutes = Some(m.clamp(-840, 840) as i32);
                }
                if let Some(l) = p.get("locale").and_then(|v| v.as_str()) {
                    self.ext.locale = Some(l.to_owned());
                }
                if let Some(t) = p.get("tz").and_then(|v| v.as_str()) {
                    self.ext.tz = Some(t.to_owned());
                }
            }
            T::RecipientSuppressed => {
                self.suppressed = true;
                self.suppressed_until_us = p
                    .get("until")
                    .and_then(|v| v.as_str())
                    .and_then(tidemark_log::time::parse_rfc3339_micros);
                self.suppress_reason = p.get("reason").and_then(|v| v.as_str()).map(str::to_owned);
            }
            T::RecipientUnsuppressed => {
                self.suppressed = false;
                self.suppressed_until_us = None;
                self.suppress_reason = None;
            }
            _ => return false,
        }
        true
    }

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
    /// The sink that takes it; none (`"none"`) for a skipped delivery.
    #[serde(with = "crate::names::sink_or_none")]
    pub sink: Option<Sink>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub recipient: Option<String>,
    #[serde(with = "crate::names::priority_or_info")]
    pub priority: Priority,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub body: Option<String>,
    pub sound: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub task_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub group_key: Option<String>,
    /// queued, skipped or cancelled.
    pub status: DeliveryStatus,
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
    /// The notification's `source.site_id`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source_site: Option<String>,
    /// Zero-PII (section 14): recipient, ids and titles in this event are already redacted.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub redacted: bool,
    /// The notification list its targets are (section 17), resolved when it is attempted.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub list: Option<String>,
    /// The notification's `type` (section 2).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none", default)]
    pub ntype: Option<String>,
    /// The notification's `count` when it stands for more than one change (section 12).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub count: Option<u64>,
    /// The key its route's `ordering` keeps it in (section 4).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub order_key: Option<String>,
    /// Parked, it no longer holds its key (`on_park = "skip"`).
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub order_skips_parked: bool,
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
    /// The digest's title with this item (section 4: single, many or summary, in the
    /// recipient's locale), decided by the routing command. Absent in events written before
    /// templates: "<n> new updates".
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub digest_title: Option<String>,
    /// Items listed before the rest are only counted (absent: no limit).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_items: Option<u32>,
    /// The notification's `count` when it stands for more than one change (section 12).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub count: Option<u64>,
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
    /// A `notification.canceled` (section 4) of this notification: on a digest carrying
    /// others, only its item leaves (and the title becomes `digest_title`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub notification_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub digest_title: Option<String>,
    /// A leased delivery is cancelled when its lease ends (expiry or failure); its owner's
    /// complete is refused.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub at_lease_end: Option<bool>,
    /// For a deferral: why the due time moved (`quiet_hours`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quiet_hours_until_us: Option<i64>,
    /// For a delivery sent by tidemark's dispatcher: whom it reached (section 17).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub resolved_targets: Option<Vec<String>>,
    /// For an operator's retry or discard (section 8): `Some(name)` of the token, `Some(None)`
    /// (written `"by": null`) in open mode; absent on the other transitions.
    #[serde(
        skip_serializing_if = "Option::is_none",
        default,
        deserialize_with = "crate::by::present"
    )]
    pub by: Option<Option<String>>,
}

/// The transitions of spec section 5: `t` may be applied to a delivery in `status`.
pub fn allowed(status: DeliveryStatus, t: DeliveryTransition) -> bool {
    use DeliveryStatus as S;
    use DeliveryTransition as T;
    match t {
        T::Leased | T::Skipped | T::Deferred => matches!(status, S::Queued | S::RetryWait),
        T::Cancelled => matches!(status, S::Queued | S::RetryWait | S::Parked),
        T::LeaseExtended | T::Sent | T::AttemptFailed | T::LeaseExpired => status == S::Leased,
        T::Retried | T::Discarded => status == S::Parked,
        T::Resent => status == S::Sent,
    }
}

/// Apply transition `t` to a row: the one function the fold and the commands share, so the
/// row a command answers with is the row the fold stores. It does not check [`allowed`]: the
/// commands check before they decide, and the fold applies what the log recorded.
pub fn transition(d: &mut Delivery, t: DeliveryTransition, c: &Change, seq: u64) {
    use DeliveryStatus as S;
    use DeliveryTransition as T;
    d.updated_at_us = c.at_us;
    d.last_seq = seq;
    let parked = c.parked.unwrap_or(false);
    match t {
        T::Leased => {
            d.status = S::Leased;
            d.lease_owner = c.owner.clone();
            d.lease_expires_at_us = c.lease_expires_at_us;
            d.attempts = c.attempt.unwrap_or(d.attempts + 1);
        }
        T::LeaseExtended => d.lease_expires_at_us = c.lease_expires_at_us,
        T::Deferred => d.next_attempt_at_us = c.next_attempt_at_us.or(d.next_attempt_at_us),
        // A leased delivery is cancelled when its lease ends.
        T::Cancelled if c.at_lease_end == Some(true) && d.status == S::Leased => {
            d.cancel_pending = true;
        }
        // A digest that carries others loses only this notification's item.
        T::Cancelled
            if d.item_count() > 1
                && let Some(nid) = &c.notification_id =>
        {
            remove_item(d, nid);
            if let Some(t) = &c.digest_title {
                d.title = t.clone();
            }
        }
        T::Sent => {
            d.status = S::Sent;
            d.delivered_at_us = Some(c.at_us);
            d.lease_expires_at_us = None;
            d.external_id = c.external_id.clone();
            d.resolved_targets = c.resolved_targets.clone().unwrap_or_default();
        }
        T::AttemptFailed => {
            d.last_error_code = c.error_code.clone();
            d.last_error = c.error.clone();
            release(d, c, parked, S::RetryWait);
        }
        T::LeaseExpired => {
            d.last_error_code = Some("lease_expired".into());
            d.last_error = Some(format!(
                "lease of {} expired",
                d.lease_owner.as_deref().unwrap_or("?")
            ));
            release(d, c, parked, S::Queued);
        }
        T::Skipped => end(d, S::Skipped, c),
        T::Cancelled => end(d, S::Cancelled, c),
        T::Discarded => end(d, S::Discarded, c),
        // Sent again: a new attempt with the same id (the receivers' idempotency key). A
        // queued row has no lease and is not delivered: the earlier send's owner and time are
        // on its timeline (its targets stay, for the record, until it is sent again).
        T::Retried | T::Resent => {
            d.status = S::Queued;
            d.attempts = 0;
            d.reason = None;
            d.next_attempt_at_us = Some(c.at_us);
            d.lease_owner = None;
            d.lease_expires_at_us = None;
            d.delivered_at_us = None;
        }
    }
}

/// A lease ends without a delivery (a failed attempt, an expiry): parked, or `again` (due at
/// the change's next attempt).
fn release(d: &mut Delivery, c: &Change, parked: bool, again: DeliveryStatus) {
    d.lease_owner = None;
    d.lease_expires_at_us = None;
    if parked {
        d.status = DeliveryStatus::Parked;
        d.reason = c.reason.clone();
        d.next_attempt_at_us = None;
    } else {
        d.status = again;
        d.next_attempt_at_us = Some(c.next_attempt_at_us.unwrap_or(c.at_us));
    }
}

/// A final status without a delivery (skipped, cancelled, discarded), with the change's
/// reason.
fn end(d: &mut Delivery, status: DeliveryStatus, c: &Change) {
    d.cancel_pending = false;
    d.status = status;
    d.reason = c.reason.clone();
    d.lease_owner = None;
    d.lease_expires_at_us = None;
    d.next_attempt_at_us = None;
}

/// Take notification `nid` out of a digest: a listed item's place goes to the first counted
/// one.
pub fn remove_item(d: &mut Delivery, nid: &str) {
    if let Some(i) = d.items.iter().position(|x| x.notification_id == nid) {
        d.items.remove(i);
        if !d.more_items.is_empty() {
            let promoted = d.more_items.remove(0);
            d.items.push(promoted);
        }
    } else {
        d.more_items.retain(|x| x.notification_id != nid);
    }
    d.counts.retain(|(n, _)| n != nid);
}

impl Created {
    pub fn row(&self, seq: u64) -> Delivery {
        Delivery {
            id: DeliveryId::new(self.delivery_id.as_str()),
            notification_id: self.notification_id.clone(),
            notification_seq: self.notification_seq,
            source_seq: self.source_seq,
            route: self.route.clone(),
            sink: self.sink,
            recipient: self.recipient.clone(),
            priority: self.priority,
            title: self.title.clone(),
            body: self.body.clone(),
            sound: self.sound,
            task_id: self.task_id.clone(),
            group_key: self.group_key.clone(),
            status: self.status,
            reason: self.reason.clone(),
            attempts: 0,
            max_attempts: self.max_attempts,
            next_attempt_at_us: (self.status == DeliveryStatus::Queued)
                .then_some(self.next_attempt_at_us),
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
            more_items: Vec::new(),
            source_site: self.source_site.clone(),
            redacted: self.redacted,
            cancel_pending: false,
            resolved_targets: Vec::new(),
            list: self.list.clone(),
            ntype: self.ntype.clone(),
            counts: self
                .count
                .filter(|c| *c > 1)
                .map(|c| (self.notification_id.clone(), c))
                .into_iter()
                .collect(),
            order_key: self.order_key.clone(),
            order_skips_parked: self.order_skips_parked,
            order_seq: if self.order_key.is_some() { seq } else { 0 },
        }
    }
}

/// Add a notification to a digest delivery: listed while the digest has fewer than its
/// `max_items`, counted in `more` after; the title is the one the routing command chose (or
/// "N new updates" for an event from before templates).
pub fn join(d: &mut Delivery, j: &Joined, seq: u64) {
    let item = Item {
        notification_id: j.notification_id.clone(),
        notification_seq: j.notification_seq,
        title: j.title.clone(),
        body: j.body.clone(),
    };
    match j.max_items {
        Some(max) if d.items.len() >= max as usize => {
            d.more_items.push(Item { body: None, ..item });
        }
        _ => d.items.push(item),
    }
    if let Some(c) = j.count.filter(|c| *c > 1) {
        d.counts.push((j.notification_id.clone(), c));
    }
    d.title = j
        .digest_title
        .clone()
        .unwrap_or_else(|| format!("{} new updates", d.change_count()));
    d.body = None;
    d.updated_at_us = j.at_us;
    d.last_seq = seq;
}

// ---- keys ----

/// Pending deliveries (queued + leased + retry_wait) over all sinks, summed from a `counts`
/// table: the backpressure gauge.
pub(crate) fn count_pending<K, V, E>(
    rows: impl Iterator<Item = Result<(K, V), E>>,
) -> Result<u64, tidemark_log::StorageError>
where
    K: crate::framework::RowBytes,
    V: crate::framework::RowBytes,
    E: std::error::Error + Send + Sync + 'static,
{
    use tidemark_log::StorageError;
    let mut n = 0;
    for row in rows {
        let (k, v) = row.map_err(StorageError::of)?;
        let k = k.bytes();
        if DeliveryStatus::PENDING.iter().any(|s| {
            let s = s.as_str();
            k.ends_with(s.as_bytes()) && k.len() > s.len() && k[k.len() - s.len() - 1] == 0
        }) {
            n += crate::framework::be_u64(v.bytes()).unwrap_or(0);
        }
    }
    Ok(n)
}
