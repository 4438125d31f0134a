//! `GET /v1/notifications`: the dashboard.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};
use tidemark_projections::names::Priority;
use tidemark_projections::notifications::Notification;
use tidemark_projections::read::NotificationFilter;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::routes::events::{parse_limit, parse_u64};
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct NotificationOut {
    pub notification_id: String,
    pub seq: u64,
    /// urgent, action, warning, info.
    pub priority: String,
    pub title: String,
    pub body: Option<String>,
    pub recipient: Option<String>,
    pub group_key: Option<String>,
    pub task_id: Option<String>,
    pub project_id: Option<String>,
    /// Time of the event that created it.
    pub time: String,
}

impl From<Notification> for NotificationOut {
    fn from(n: Notification) -> Self {
        NotificationOut {
            time: tidemark_log::time::format_micros(n.time_us),
            notification_id: n.notification_id,
            seq: n.seq,
            priority: n.priority,
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
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NotificationsQuery {
    /// urgent, action, warning, info.
    pub priority: Option<String>,
    pub recipient: Option<String>,
    /// 1–500, default 50.
    #[param(value_type = Option<u32>)]
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
    get, path = "/v1/notifications", tag = "notifications", params(NotificationsQuery),
    responses(
        (status = 200, body = NotificationsPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    State(st): State<AppState>,
    q: Result<Query<NotificationsQuery>, QueryRejection>,
) -> Result<Json<NotificationsPage>, ApiError> {
    let Query(q) = q.map_err(|r| ApiError::invalid_query(r.body_text()))?;
    if let Some(p) = &q.priority
        && Priority::parse(p).is_none()
    {
        return Err(ApiError::invalid_query(format!(
            "priority must be one of {}",
            Priority::joined()
        )));
    }
    let f = NotificationFilter {
        priority: q.priority,
        recipient: q.recipient,
        before_seq: parse_u64("before_seq", q.before_seq.as_deref())?,
        limit: parse_limit(q.limit.as_deref(), 50, 500)?,
    };
    let min_seq = crate::routes::ReadAt { min_seq: q.min_seq }.seq()?;
    let ((items, next), as_of_seq) =
        crate::routes::read_model(&st.engine, min_seq, move |r| r.notifications(&f)).await?;
    Ok(Json(NotificationsPage {
        notifications: items.into_iter().map(NotificationOut::from).collect(),
        next_before_seq: next,
        as_of_seq,
    }))
}
