//! The delivery runtime over HTTP (spec sections 5 and 7): claim, complete, fail, extend by the
//! lease owner; retry and discard by an operator; the deliveries read model and the outbox
//! KPIs. Every state change is a command run inside the log's writer, so it is checked and
//! recorded in one transaction and answered after its commit.

use crate::request::{OneOf, query_name};
use crate::state::Api;
use std::collections::BTreeMap;

use axum::Json;
use serde::{Deserialize, Serialize};
use tidemark_log::time::{Micros, now_micros};
use tidemark_projections::deliveries::read::{DeliveryFilter, Kpis, StuckFilter};
use tidemark_projections::deliveries::{Delivery, Step};
use tidemark_projections::names::{DeliveryStatus, Priority, Sink, sink_or_none};
use tidemark_projections::routing::RoutingSettings;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::Params;
pub(crate) use crate::request::invalid;
use crate::routes::blocking;
use crate::routes::events::parse_limit;
use crate::routes::order::{next_cursors, parse_before, parse_order};

mod endpoints;
mod lease;
mod operator;
mod sinks;

pub use endpoints::*;
pub use lease::*;
pub use operator::*;
pub use sinks::*;

#[derive(Debug, Serialize, ToSchema)]
pub struct ItemOut {
    /// On a redacted delivery: the intent key.
    pub notification_id: String,
    /// Absent on a redacted delivery.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notification_seq: Option<u64>,
    pub title: String,
    pub body: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StepOut {
    pub seq: u64,
    /// created, joined, leased, lease_extended, sent, attempt_failed, lease_expired, skipped,
    /// cancelled, retried, discarded.
    pub event: String,
    #[schema(value_type = String)]
    pub at: Micros,
    pub owner: Option<String>,
    pub attempt: Option<u32>,
    pub error_code: Option<String>,
    pub error: Option<String>,
    pub reason: Option<String>,
    #[schema(value_type = Option<String>)]
    pub next_attempt_at: Option<Micros>,
    #[schema(value_type = Option<String>)]
    pub lease_expires_at: Option<Micros>,
    /// On `retried` and `discarded`: the token that did it (absent in open mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

impl From<Step> for StepOut {
    fn from(s: Step) -> Self {
        StepOut {
            seq: s.seq,
            event: s.event,
            at: Micros(s.at_us),
            owner: s.owner,
            attempt: s.attempt,
            error_code: s.error_code,
            error: s.error,
            reason: s.reason,
            next_attempt_at: s.next_attempt_at_us.map(Micros),
            lease_expires_at: s.lease_expires_at_us.map(Micros),
            by: s.by,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryOut {
    /// `dlv:<notification_id>:<route>`.
    #[schema(value_type = String)]
    pub id: DeliveryId,
    pub notification_id: String,
    pub route: String,
    /// `app` for the desktop route; `email` and `webhook` are delivered by tidemark.
    pub sink: String,
    /// The notification's `type` (section 2), when it has one.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub ntype: Option<String>,
    /// The notification list its targets are (section 17), resolved when it is attempted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub list: Option<String>,
    pub recipient: Option<String>,
    /// queued, leased, retry_wait, sent, parked, discarded, skipped, cancelled.
    #[schema(inline, value_type = crate::openapi::DeliveryStatusName)]
    pub status: OneOf<DeliveryStatus>,
    /// Why it was skipped, cancelled or parked (`unknown_route`, `suppressed`,
    /// `task_canceled`, `max_attempts`, `permanent_failure`).
    pub reason: Option<String>,
    /// urgent, action, warning, info.
    #[schema(inline, value_type = crate::openapi::PriorityName)]
    pub priority: OneOf<Priority>,
    /// The notification's title, or "N new updates" for a digest.
    pub title: String,
    pub body: Option<String>,
    pub sound: bool,
    pub task_id: Option<String>,
    pub group_key: Option<String>,
    pub attempts: u32,
    pub max_attempts: u32,
    /// When it is due: a `queued` delivery (scheduled later by a route's delay, quiet hours or
    /// a digest window, or due at once) or one in `retry_wait` can be claimed from this time.
    /// In other statuses it is what it was when the delivery was last due.
    #[schema(value_type = Option<String>)]
    pub next_attempt_at: Option<Micros>,
    pub lease_owner: Option<String>,
    #[schema(value_type = Option<String>)]
    pub lease_expires_at: Option<Micros>,
    pub last_error_code: Option<String>,
    pub last_error: Option<String>,
    pub external_id: Option<String>,
    /// Whom tidemark's dispatcher reached when it sent it (section 17): the addresses, or
    /// the endpoint's scheme, host and port; absent for other deliveries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resolved_targets: Vec<String>,
    #[schema(value_type = String)]
    pub created_at: Micros,
    #[schema(value_type = String)]
    pub updated_at: Micros,
    #[schema(value_type = Option<String>)]
    pub delivered_at: Option<Micros>,
    /// The notifications it carries (several for a digest): the first `max_items`.
    pub items: Vec<ItemOut>,
    /// A digest's notifications past its `max_items`, counted.
    #[serde(skip_serializing_if = "is_zero")]
    pub more: usize,
    /// A zero-PII delivery (section 14): no title, body, recipient or notification id in
    /// clear; `notification_id` is the intent key.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub redacted: bool,
    /// On a redacted delivery: HMAC-SHA256 of the recipient (hex), in place of `recipient`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipient_hash: Option<String>,
    /// On a redacted delivery: HMAC-SHA256 of the notification id (hex), the key its
    /// deliveries and status record are found by (section 14).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intent_key: Option<String>,
    /// The project of its notification (seed 000), when it has one; never on a redacted
    /// delivery.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// The notification's provenance (section 2) and seed 000's `session_id`,
    /// `destination_key` and `request_json`, when it has them; never on a redacted delivery.
    #[serde(flatten)]
    pub provenance: crate::routes::notifications::ProvenanceOut,
    /// Pending (queued, leased or retry_wait) for longer than `outbox.stuck_after`, judged
    /// when the answer was made.
    pub stuck: bool,
    /// Only on `GET /v1/deliveries/{id}` of a pending delivery that waits (sections 4 and
    /// 17): `ordering` (its route's order: it waits for `waits_for` to be sent),
    /// `rate_limited` (due, but its route is at its `rate` on this node),
    /// `circuit_open` (it waits for the circuit's probe to succeed), `endpoint_disabled` (for
    /// an operator to enable it) or `endpoint_unresolved`. It spends no attempt meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = "^(ordering|rate_limited|circuit_open|endpoint_disabled|endpoint_unresolved)$"
    )]
    pub held_by: Option<String>,
    /// With `held_by: "ordering"`: the delivery of the same key before it, which goes first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits_for: Option<String>,
    /// Only on `GET /v1/deliveries/{id}`: every step with its time, owner, code and error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<StepOut>>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Deliveries pending since before this time (µs) are stuck.
fn stuck_cut(now_us: i64, stuck_after_ms: u64) -> i64 {
    now_us.saturating_sub(stuck_after_ms as i64 * 1_000)
}

impl DeliveryOut {
    /// With the provenance of its notification (none for a redacted delivery).
    pub(crate) fn with_provenance(
        mut self,
        p: Option<tidemark_projections::notifications::read::Origin>,
    ) -> Self {
        if let (false, Some((project_id, p))) = (self.redacted, p) {
            self.project_id = project_id;
            self.provenance = p.into();
            // The notification's `type` is the row's own `type` field: served once (a
            // second "type" key is refused by strict JSON readers).
            let ntype = self.provenance.ntype.take();
            self.ntype = self.ntype.take().or(ntype);
        }
        self
    }
}

/// Deliveries as served, each with its notification's provenance (read in the same blocking
/// task as the rows) and whether it is stuck, judged against `stuck_cut_us` (see
/// [`stuck_cut`]).
pub(crate) fn with_provenance(
    r: &tidemark_engine::Queries,
    rows: Vec<Delivery>,
    stuck_cut_us: i64,
) -> Result<Vec<DeliveryOut>, tidemark_engine::QueryError> {
    // One read for every row's notification (a redacted row serves none; seq 0 is none).
    let seqs: Vec<u64> = rows
        .iter()
        .map(|d| if d.redacted { 0 } else { d.notification_seq })
        .collect();
    let provenances = r.provenances(&seqs)?;
    Ok(rows
        .into_iter()
        .zip(provenances)
        .map(|(d, p)| {
            let stuck = StuckFilter::is_stuck(stuck_cut_us, &d);
            DeliveryOut {
                stuck,
                ..DeliveryOut::from(d).with_provenance(p)
            }
        })
        .collect())
}

impl From<Delivery> for DeliveryOut {
    /// The row's fields moved into their API shape (nothing copied but a redacted row's
    /// intent key, which it serves twice).
    fn from(mut d: Delivery) -> Self {
        let redacted = d.redacted;
        let more = d.more_items.len();
        let (recipient, recipient_hash) = match redacted {
            true => (None, d.recipient.take()),
            false => (d.recipient.take(), None),
        };
        DeliveryOut {
            id: d.id,
            intent_key: redacted.then(|| d.notification_id.clone()),
            notification_id: d.notification_id,
            route: d.route,
            sink: sink_or_none::name(d.sink).to_owned(),
            ntype: d.ntype.take(),
            list: d.list.take(),
            recipient,
            recipient_hash,
            redacted,
            more,
            project_id: None,
            provenance: Default::default(),
            status: d.status.into(),
            reason: d.reason,
            priority: d.priority.into(),
            title: d.title,
            body: d.body,
            sound: d.sound,
            task_id: d.task_id,
            group_key: d.group_key,
            attempts: d.attempts,
            max_attempts: d.max_attempts,
            next_attempt_at: d.next_attempt_at_us.map(Micros),
            lease_owner: d.lease_owner,
            lease_expires_at: d.lease_expires_at_us.map(Micros),
            last_error_code: d.last_error_code,
            last_error: d.last_error,
            external_id: d.external_id,
            resolved_targets: std::mem::take(&mut d.resolved_targets),
            created_at: Micros(d.created_at_us),
            stuck: false,
            updated_at: Micros(d.updated_at_us),
            delivered_at: d.delivered_at_us.map(Micros),
            items: d
                .items
                .into_iter()
                .map(|i| ItemOut {
                    notification_id: i.notification_id,
                    notification_seq: (!redacted).then_some(i.notification_seq),
                    title: i.title,
                    body: i.body,
                })
                .collect(),
            held_by: None,
            waits_for: None,
            timeline: None,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveriesPage {
    pub deliveries: Vec<DeliveryOut>,
    /// In id order: pass as `after` for the next page; null on the last page (and newest
    /// first).
    pub next_after: Option<String>,
    /// With `order=newest`: pass as `before` for the next page, `<created_at in µs since the
    /// epoch>:<delivery id>`; absent on the last page (and in id order).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]{1,19}:[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$")]
    pub next_before: Option<String>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

/// One delivery with its timeline, as of at least `as_of_seq`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryAnswer {
    #[serde(flatten)]
    pub delivery: DeliveryOut,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

pub(crate) use crate::request::check_text;

pub(crate) use crate::request::DeliveryId;

const LEASE_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

fn lease_ms(v: Option<u64>, settings: &RoutingSettings) -> Result<u64, ApiError> {
    let ms = v.unwrap_or(settings.retry.lease_ttl_ms);
    if !LEASE_MS.contains(&ms) {
        return Err(invalid("lease_ms", "lease_ms must be from 100 to 3600000"));
    }
    Ok(ms)
}

fn settings(st: &Api) -> &RoutingSettings {
    &st.routing
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveriesQuery {
    /// queued, leased, retry_wait, sent, parked, discarded, skipped, cancelled.
    #[param(pattern = "^(queued|leased|retry_wait|sent|parked|discarded|skipped|cancelled)$")]
    pub status: Option<String>,
    /// app, email, webhook, or none (the skipped deliveries no sink takes).
    #[param(pattern = "^(app|email|webhook|none)$")]
    pub sink: Option<String>,
    #[param(max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub route: Option<String>,
    #[param(max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub recipient: Option<String>,
    /// Deliveries carrying this notification (a digest carries every notification that
    /// joined it; a redacted delivery is found by the notification id too).
    #[param(max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub notification_id: Option<String>,
    /// Deliveries of notifications from this `source.site_id`.
    #[param(max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub source_site: Option<String>,
    /// Deliveries of notifications of this `type` (section 2).
    #[param(max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub r#type: Option<String>,
    /// Deliveries to this notification list (section 17).
    #[param(max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub list: Option<String>,
    /// Created at or after this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub created_after: Option<String>,
    /// Created before this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub created_before: Option<String>,
    /// `true`: only stuck deliveries (pending for longer than `outbox.stuck_after`);
    /// `false`: only the others.
    #[param(value_type = Option<bool>)]
    pub stuck: Option<String>,
    /// A case-insensitive substring of the title (a digest's item titles too). It may scan;
    /// a page still holds up to `limit` matches when they exist.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$"
    )]
    pub q: Option<String>,
    /// `id` (the default): by delivery id, bytewise, paged with `after`. `newest`: newest
    /// first by `created_at` (ties by id), paged with `before`; every filter applies, and a
    /// page still holds up to `limit` matches when they exist (it may scan).
    #[param(pattern = "^(id|newest)$")]
    pub order: Option<String>,
    /// Only deliveries whose id sorts after this one: the cursor of id order (`next_after`).
    #[param(max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub after: Option<String>,
    /// Only deliveries created before this position, `<created_at in µs since the
    /// epoch>:<delivery id>`: the cursor of newest order (`next_before`).
    #[param(pattern = "^[0-9]{1,19}:[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$")]
    pub before: Option<String>,
    /// 1–1000, default 100.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
    /// Answer as of at least this seq (see `ReadAt`).
    #[param(value_type = Option<u64>)]
    pub min_seq: Option<String>,
}

/// Deliveries by id or newest first, filtered.
#[utoipa::path(
    get, path = "/v1/deliveries", operation_id = "listDeliveries", tag = "deliveries", params(DeliveriesQuery),
    responses(
        (status = 200, body = DeliveriesPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    st: Api,
    Params(q): Params<DeliveriesQuery>,
) -> Result<Json<DeliveriesPage>, ApiError> {
    let status = query_name::<DeliveryStatus>("status", q.status.as_deref())?;
    let sink = q
        .sink
        .as_deref()
        .map(|v| {
            sink_or_none::parse(v).ok_or_else(|| {
                ApiError::invalid_query(format!(
                    "sink must be one of {}, {}",
                    Sink::joined(),
                    sink_or_none::NONE
                ))
            })
        })
        .transpose()?;
    for (name, v) in [
        ("route", &q.route),
        ("recipient", &q.recipient),
        ("notification_id", &q.notification_id),
        ("source_site", &q.source_site),
        ("type", &q.r#type),
        ("list", &q.list),
        ("after", &q.after),
        ("q", &q.q),
    ] {
        if let Some(v) = v
            && (v.chars().count() > 256 || v.chars().any(char::is_control))
        {
            return Err(ApiError::invalid_query(format!(
                "{name} must be at most 256 printable characters"
            )));
        }
    }
    if q.q.as_deref() == Some("") {
        return Err(ApiError::invalid_query("q must not be empty"));
    }
    let time = |name: &str, v: Option<&str>| -> Result<Option<i64>, ApiError> {
        v.map(|v| {
            tidemark_log::time::parse_rfc3339_micros(v).ok_or_else(|| {
                ApiError::invalid_query(format!("{name} must be an RFC 3339 time, not {v:?}"))
            })
        })
        .transpose()
    };
    let order = parse_order(q.order.as_deref())?;
    let created_after_us = time("created_after", q.created_after.as_deref())?;
    let created_before_us = time("created_before", q.created_before.as_deref())?;
    let now = now_micros();
    let stuck_cut = stuck_cut(now, settings(&st).stuck_after_ms);
    let stuck = match q.stuck.as_deref() {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(v) => {
            return Err(ApiError::invalid_query(format!(
                "stuck must be true or false, not {v:?}"
            )));
        }
    }
    .map(|stuck_only| StuckFilter {
        cut_us: stuck_cut,
        stuck_only,
    });
    let f = DeliveryFilter {
        created_after_us,
        created_before_us,
        stuck,
        title_contains: q.q,
        status,
        sink,
        route: q.route,
        recipient: q.recipient,
        notification_id: q.notification_id,
        source_site: q.source_site,
        ntype: q.r#type,
        list: q.list,
        after: q.after,
        before: parse_before(q.before.as_deref(), "created_at in µs")?,
        order,
        limit: parse_limit(q.limit.as_deref(), 100, 1000)?,
    };
    let min_seq = crate::routes::ReadAt { min_seq: q.min_seq }.seq()?;
    let ((rows, next), as_of_seq) = crate::routes::read_model(st.engine(), min_seq, move |r| {
        let (rows, next) = r.deliveries(&f)?;
        Ok((with_provenance(r, rows, stuck_cut)?, next))
    })
    .await?;
    let (next_after, next_before) = next_cursors(order, next);
    Ok(Json(DeliveriesPage {
        deliveries: rows,
        next_after,
        next_before,
        as_of_seq,
    }))
}

/// One delivery with its attempt timeline.
#[utoipa::path(
    get, path = "/v1/deliveries/{id}", operation_id = "getDelivery", tag = "deliveries",
    params(("id" = String, Path, description = "Delivery id"), crate::routes::ReadAt),
    responses(
        (status = 200, body = DeliveryAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn get(
    st: Api,
    crate::request::PathId(id): crate::request::PathId<DeliveryId>,
    Params(q): Params<crate::routes::ReadAt>,
) -> Result<Json<DeliveryAnswer>, ApiError> {
    let key = id.clone();
    let cut = stuck_cut(now_micros(), settings(&st).stuck_after_ms);
    let (pacer, now) = (st.engine().pacer(), st.engine().now_us());
    let (found, as_of_seq) = crate::routes::read_model(st.engine(), q.seq()?, move |r| {
        Ok(match r.delivery(&key)? {
            Some((row, steps)) => {
                // The order first (it decides which of a key may go at all), then the
                // endpoint (which holds whichever may).
                let waits_for = if row.is_pending() {
                    r.order_waits_for(&row)?
                } else {
                    None
                };
                let held = match &waits_for {
                    Some(_) => Some("ordering"),
                    None if row.is_pending() => r.endpoint(&row.route)?.and_then(|e| e.held_by()),
                    None => None,
                }
                .or_else(|| {
                    // Due, but its route is at its pace (section 4).
                    let due = row.status != tidemark_projections::names::DeliveryStatus::Leased
                        && row.due_us().is_some_and(|d| d <= now);
                    (due && pacer.paced_until(&row.route, now).is_some()).then_some("rate_limited")
                });
                let out = with_provenance(r, vec![row], cut)?.remove(0);
                Some((out, steps, held, waits_for))
            }
            None => None,
        })
    })
    .await?;
    let (mut out, steps, held, waits_for) = found.ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "delivery_not_found",
            format!("no delivery {:?}", id.as_str()),
        )
    })?;
    out.timeline = Some(steps.into_iter().map(StepOut::from).collect());
    out.held_by = held.map(str::to_owned);
    out.waits_for = waits_for;
    Ok(Json(DeliveryAnswer {
        delivery: out,
        as_of_seq,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KpisOut {
    /// queued + leased + retry_wait.
    pub queue_depth: u64,
    pub queued: u64,
    pub leased: u64,
    pub retry_wait: u64,
    /// Pending and older than `outbox.stuck_after`.
    pub stuck: u64,
    pub parked: u64,
    /// Sent in the last `interval_s` seconds.
    pub sent_last_interval: u64,
    pub oldest_pending_age_s: f64,
    /// The interval `sent_last_interval` covers, seconds.
    pub interval_s: u64,
    #[schema(value_type = Object)]
    pub by_sink: BTreeMap<String, Kpis>,
    /// The same per source site (`source.site_id` of the notifications); deliveries of
    /// notifications without a site are not in it. Absent while no delivery has a site.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_source_site: BTreeMap<String, Kpis>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct KpisQuery {
    /// Window of `sent_last_interval`, 1–86400 s, default 60.
    #[param(value_type = Option<u64>, minimum = 1, maximum = 86400)]
    pub interval_s: Option<String>,
    /// Answer as of at least this seq (see `ReadAt`).
    #[param(value_type = Option<u64>)]
    pub min_seq: Option<String>,
}

/// `interval_s` of a KPIs read: 1–86400 s, default 60.
pub(crate) fn interval_of(v: Option<&str>) -> Result<u64, ApiError> {
    match v {
        None => Ok(60),
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|n| (1..=86_400).contains(n))
            .ok_or_else(|| ApiError::invalid_query("interval_s must be from 1 to 86400")),
    }
}

/// Compute the KPIs now: as of at least the head and `min_seq` (the KPIs endpoint; with the
/// `as_of_seq`), or as the model stands (`None`: `/metrics`, which never waits; 0).
pub(crate) async fn compute_kpis(
    st: &Api,
    interval_s: u64,
    min_seq: Option<u64>,
) -> Result<(Kpis, BTreeMap<String, Kpis>, u64), ApiError> {
    let stuck_after = settings(st).stuck_after_ms;
    let engine = st.engine().clone();
    blocking(move || {
        let q = engine.read();
        let interval_ms = interval_s * 1_000;
        match min_seq {
            Some(min) => {
                let as_of = q.floor(min)?;
                let (all, by_sink) = q.kpis(now_micros(), stuck_after, interval_ms)?;
                Ok::<_, tidemark_engine::QueryError>((all, by_sink, as_of))
            }
            None => {
                let (all, by_sink) = q.kpis_now(now_micros(), stuck_after, interval_ms)?;
                Ok((all, by_sink, 0))
            }
        }
    })
    .await
}

/// Queue depth, stuck, parked, sent in the last interval and oldest pending age; overall, per
/// sink and per source site.
#[utoipa::path(
    get, path = "/v1/outbox/kpis", operation_id = "getOutboxKpis", tag = "deliveries", params(KpisQuery),
    responses(
        (status = 200, body = KpisOut),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn kpis(st: Api, Params(q): Params<KpisQuery>) -> Result<Json<KpisOut>, ApiError> {
    let interval_s = interval_of(q.interval_s.as_deref())?;
    let min_seq = crate::routes::ReadAt { min_seq: q.min_seq }.seq()?;
    let (all, by_sink, as_of_seq) = compute_kpis(&st, interval_s, Some(min_seq)).await?;
    let stuck_after = settings(&st).stuck_after_ms;
    let (by_source_site, _) = crate::routes::read_model(st.engine(), as_of_seq, move |r| {
        r.kpis_by_site(now_micros(), stuck_after, interval_s * 1_000)
    })
    .await?;
    Ok(Json(KpisOut {
        by_source_site,
        queue_depth: all.queue_depth,
        queued: all.queued,
        leased: all.leased,
        retry_wait: all.retry_wait,
        stuck: all.stuck,
        parked: all.parked,
        sent_last_interval: all.sent_last_interval,
        oldest_pending_age_s: all.oldest_pending_age_s,
        interval_s,
        by_sink,
        as_of_seq,
    }))
}
