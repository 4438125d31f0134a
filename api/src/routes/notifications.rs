//! `GET /v1/notifications`: the dashboard.

use crate::request::{OneOf, query_name};
use crate::state::Api;
use axum::Json;
use serde::{Deserialize, Serialize};
use tidemark_log::time::Micros;
use tidemark_projections::names::{Priority, sink_or_none};
use tidemark_projections::notifications::Notification;
use tidemark_projections::notifications::read::{NotificationFilter, NotificationStatus};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::Params;
use crate::routes::events::{parse_limit, parse_u64};

#[derive(Debug, Serialize, ToSchema)]
pub struct NotificationOut {
    pub notification_id: String,
    pub seq: u64,
    /// urgent, action, warning, info.
    #[schema(inline, value_type = crate::openapi::PriorityName)]
    pub priority: OneOf<Priority>,
    pub title: String,
    pub body: Option<String>,
    pub recipient: Option<String>,
    pub group_key: Option<String>,
    pub task_id: Option<String>,
    pub project_id: Option<String>,
    /// Time of the event that created it.
    #[schema(value_type = String)]
    pub time: Micros,
    /// The `latest_event_seq` of its task (`task_id`) as of this answer, 0 when it names no
    /// task or the task has no events: open `GET /v1/tasks/{task_id}/stream` with
    /// `after_sequence` set to it, and no event of the task after this read is missed.
    pub latest_event_seq: u64,
    #[serde(flatten)]
    pub provenance: ProvenanceOut,
}

/// Provenance (section 2): a free type name (`email`, `teams`, `app`), its data as given, and
/// where a forwarded notification comes from (`site_id`, `node`, `instance_id`, `script`,
/// `enqueued_at`). Each absent when not given.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct ProvenanceOut {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub ntype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub type_data: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub source: Option<serde_json::Value>,
    /// The session the notification belongs to (seed 000), as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// What tells apart the destinations of one notification and route (seed 000), as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination_key: Option<String>,
    /// The request the sink is to send (seed 000), as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub request_json: Option<serde_json::Value>,
}

impl From<tidemark_projections::notifications::Provenance> for ProvenanceOut {
    fn from(p: tidemark_projections::notifications::Provenance) -> Self {
        let obj = |t: Option<String>| t.and_then(|t| serde_json::from_str(&t).ok());
        ProvenanceOut {
            ntype: p.ntype,
            type_data: obj(p.type_data),
            source: obj(p.source),
            session_id: p.more.session_id,
            destination_key: p.more.destination_key,
            request_json: obj(p.more.request_json),
        }
    }
}

impl NotificationOut {
    /// The row with its task's `latest_event_seq`.
    fn new(n: Notification, latest_event_seq: u64) -> Self {
        NotificationOut {
            latest_event_seq,
            provenance: n.ext.into(),
            time: Micros(n.time_us),
            notification_id: n.notification_id,
            seq: n.seq,
            priority: n.priority.into(),
            title: n.title,
            body: n.body,
            recipient: n.recipient,
            group_key: n.group_key,
            task_id: n.task_id,
            project_id: n.project_id,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct NotificationsPage {
    /// Newest first.
    pub notifications: Vec<NotificationOut>,
    /// Pass as `before_seq` for the next (older) page; absent on the last page.
    pub next_before_seq: Option<u64>,
    /// Present (`false`) only when `[notifications.dashboard] enabled = false`: the list is
    /// then empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dashboard_enabled: Option<bool>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NotificationsQuery {
    /// urgent, action, warning, info.
    #[param(pattern = "^(urgent|action|warning|info)$")]
    pub priority: Option<String>,
    pub recipient: Option<String>,
    /// 1–500, default `[notifications.dashboard] limit` (50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
    /// Only notifications older than this seq.
    #[param(value_type = Option<u64>)]
    pub before_seq: Option<String>,
    /// Answer as of at least this seq (see `ReadAt`).
    #[param(value_type = Option<u64>)]
    pub min_seq: Option<String>,
}

/// The dashboard list, newest first.
#[utoipa::path(
    get, path = "/v1/notifications", operation_id = "listNotifications", tag = "notifications", params(NotificationsQuery),
    responses(
        (status = 200, body = NotificationsPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    st: Api,
    Params(q): Params<NotificationsQuery>,
) -> Result<Json<NotificationsPage>, ApiError> {
    let f = NotificationFilter {
        priority: query_name::<Priority>("priority", q.priority.as_deref())?,
        recipient: q.recipient,
        before_seq: parse_u64("before_seq", q.before_seq.as_deref())?,
        limit: parse_limit(q.limit.as_deref(), st.routing.dashboard_limit as usize, 500)?,
    };
    let min_seq = crate::routes::ReadAt { min_seq: q.min_seq }.seq()?;
    let enabled = st.routing.dashboard_enabled;
    let ((items, next), as_of_seq) = crate::routes::read_model(st.engine(), min_seq, move |r| {
        if enabled {
            r.notifications_with_task_seq(&f)
        } else {
            Ok((Vec::new(), None))
        }
    })
    .await?;
    Ok(Json(NotificationsPage {
        notifications: items
            .into_iter()
            .map(|(n, seq)| NotificationOut::new(n, seq))
            .collect(),
        next_before_seq: next,
        dashboard_enabled: (!enabled).then_some(false),
        as_of_seq,
    }))
}

/// One of the notification's deliveries, as its status record lists it.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusDeliveryOut {
    #[schema(value_type = String)]
    pub id: tidemark_projections::ids::DeliveryId,
    pub route: String,
    pub sink: String,
    /// queued, leased, retry_wait, sent, parked, discarded, skipped, cancelled.
    pub status: String,
    pub attempts: u32,
    /// Whom it reached, when tidemark's dispatcher sent it (section 17).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resolved_targets: Vec<String>,
}

/// What became of one notification (spec section 14).
#[derive(Debug, Serialize, ToSchema)]
pub struct NotificationStatusOut {
    pub notification: NotificationOut,
    /// dashboard_only (no delivery), pending (any queued, leased or retry_wait), else parked,
    /// delivered, discarded, cancelled or skipped, in that order of precedence.
    #[schema(pattern = "^(dashboard_only|pending|parked|delivered|discarded|cancelled|skipped)$")]
    pub status: String,
    /// Attempts of all its deliveries.
    pub attempts: u32,
    /// The error of the delivery that failed most recently.
    pub last_error: Option<String>,
    #[schema(value_type = String)]
    pub enqueued_at: Micros,
    #[schema(value_type = String)]
    pub created_at: Micros,
    /// The latest delivery time among its deliveries.
    #[schema(value_type = Option<String>)]
    pub delivered_at: Option<Micros>,
    /// Its deliveries; a digest it joined counts as its own.
    pub deliveries: Vec<StatusDeliveryOut>,
    /// Whom its deliveries reached (section 17), each once, in the order of its deliveries:
    /// addresses, or a webhook endpoint's scheme, host and port.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resolved_targets: Vec<String>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

impl NotificationStatusOut {
    fn new(s: NotificationStatus, task_seq: u64, as_of_seq: u64) -> Self {
        let mut resolved_targets: Vec<String> = Vec::new();
        for t in s.deliveries.iter().flat_map(|d| &d.resolved_targets) {
            if !resolved_targets.contains(t) {
                resolved_targets.push(t.clone());
            }
        }
        NotificationStatusOut {
            resolved_targets,
            notification: NotificationOut::new(s.notification, task_seq),
            status: s.status.to_owned(),
            attempts: s.attempts,
            last_error: s.last_error,
            enqueued_at: Micros(s.enqueued_at_us),
            created_at: Micros(s.created_at_us),
            delivered_at: s.delivered_at_us.map(Micros),
            deliveries: s
                .deliveries
                .into_iter()
                .map(|d| StatusDeliveryOut {
                    id: d.id,
                    route: d.route,
                    sink: sink_or_none::name(d.sink).to_owned(),
                    status: d.status.into(),
                    attempts: d.attempts,
                    resolved_targets: d.resolved_targets,
                })
                .collect(),
            as_of_seq,
        }
    }
}

/// The status record of one notification: its dashboard row, what became of it and its
/// deliveries.
#[utoipa::path(
    get, path = "/v1/notifications/{id}", tag = "notifications", operation_id = "getNotificationStatus",
    params(("id" = String, Path, description = "Notification id"), crate::routes::ReadAt),
    responses(
        (status = 200, body = NotificationStatusOut),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn get(
    st: Api,
    crate::request::PathId(key): crate::request::PathId<crate::request::NotificationId>,
    Params(q): Params<crate::routes::ReadAt>,
) -> Result<Json<NotificationStatusOut>, ApiError> {
    let (found, as_of_seq) = crate::routes::read_model(st.engine(), q.seq()?, move |r| {
        let Some(s) = r.notification_status(&key)? else {
            return Ok(None);
        };
        let task_seq = match &s.notification.task_id {
            Some(t) => r
                .task(&crate::request::TaskId::new(t.as_str()))?
                .map_or(0, |t| t.latest_event_seq),
            None => 0,
        };
        Ok(Some((s, task_seq)))
    })
    .await?;
    let (s, task_seq) = found.ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "notification_not_found",
            "no notification with that id",
        )
    })?;
    metrics::counter!("tidemark_notification_status_reads_total", "status" => s.status)
        .increment(1);
    Ok(Json(NotificationStatusOut::new(s, task_seq, as_of_seq)))
}
