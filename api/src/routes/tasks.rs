//! `GET /v1/tasks`, `GET /v1/tasks/{id}`, `GET /v1/tasks/{id}/stream`.

use crate::request::{OneOf, query_name};
use crate::state::Api;
use axum::Json;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tidemark_log::ReadQuery;
use tidemark_log::time::Micros;
use tidemark_projections::tasks::Task;
use tidemark_projections::tasks::read::TaskFilter;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use tidemark_projections::names::TaskStatus;

use crate::request::Params;
use crate::routes::events::{parse_limit, parse_u64, resume_point, sse_response};
use crate::routes::order::{next_cursors, parse_before, parse_order};

/// The review gate of a run.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewOut {
    /// The task required review when the run started.
    pub required: bool,
    /// A review was requested for this run.
    pub requested: bool,
    /// none, pending, approved, rejected.
    pub state: String,
    pub reviewer: Option<String>,
    pub reason: Option<String>,
    /// A rejection that continues the run is in force.
    pub continuation: bool,
    /// The run's final event is its approval (deliveries wait for it).
    pub gated: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RunOut {
    pub run_id: String,
    /// running, completed, failed, canceled; null for a run that ended without having
    /// started (`mismatch`: it did not complete, spec section 6).
    pub outcome: Option<String>,
    /// On a `run_not_started` run only: what its ending event said (`completed`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_outcome: Option<String>,
    pub error: Option<String>,
    pub review: ReviewOut,
    pub started_seq: u64,
    pub ended_seq: Option<u64>,
    /// Set when the run ended without a `task.run_started` before its end: `run_not_started`
    /// (spec section 6: a mismatch; bridge subscriptions stop at it, and the router makes no
    /// "completed" notification of it); its `outcome` is null and the task's status does not
    /// follow it.
    pub mismatch: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TaskOut {
    pub task_id: String,
    pub project_id: Option<String>,
    pub title: Option<String>,
    /// open, running, awaiting_review, completed, failed, canceled.
    #[schema(inline, value_type = crate::openapi::TaskStatusName)]
    pub status: OneOf<TaskStatus>,
    pub current_run_id: Option<String>,
    pub review_required: bool,
    pub canceled: bool,
    pub cancel_reason: Option<String>,
    pub runs: Vec<RunOut>,
    /// Highest seq of any event whose subject is this task; stream from here with
    /// `GET /v1/tasks/{id}/stream?after_sequence=` to miss nothing.
    pub latest_event_seq: u64,
    #[schema(value_type = String)]
    pub updated_at: Micros,
}

impl From<Task> for TaskOut {
    fn from(t: Task) -> Self {
        let requires = t.review_required;
        let not_started: Vec<bool> = t
            .runs
            .iter()
            .map(|r| {
                r.ended_seq > 0
                    && t.run_started_seq(&r.run_id)
                        .is_none_or(|s| s >= r.ended_seq)
            })
            .collect();
        TaskOut {
            runs: t
                .runs
                .into_iter()
                .zip(not_started)
                .map(|(r, not_started)| RunOut {
                    mismatch: not_started
                        .then(|| tidemark_projections::bridges::RUN_NOT_STARTED.to_owned()),
                    review: ReviewOut {
                        gated: r.review.gated(requires),
                        required: r.review.required,
                        requested: r.review.requested,
                        state: r.review.state.into(),
                        reviewer: r.review.reviewer,
                        reason: r.review.reason,
                        continuation: r.review.continuation,
                    },
                    run_id: r.run_id,
                    outcome: (!not_started).then(|| r.outcome.clone()),
                    reported_outcome: not_started.then_some(r.outcome),
                    error: r.error,
                    started_seq: r.started_seq,
                    ended_seq: (r.ended_seq > 0).then_some(r.ended_seq),
                })
                .collect(),
            task_id: t.task_id,
            project_id: t.project_id,
            title: t.title,
            status: t.status.into(),
            current_run_id: t.current_run_id,
            review_required: t.review_required,
            canceled: t.canceled,
            cancel_reason: t.cancel_reason,
            latest_event_seq: t.latest_event_seq,
            updated_at: Micros(t.updated_at_us),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TasksPage {
    pub tasks: Vec<TaskOut>,
    /// In id order: pass as `after` for the next page; null on the last page (and newest
    /// first).
    pub next_after: Option<String>,
    /// With `order=newest`: pass as `before` for the next page, `<creation seq>:<task id>`;
    /// absent on the last page (and in id order).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]{1,19}:[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$")]
    pub next_before: Option<String>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

/// One task, as of at least `as_of_seq`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskAnswer {
    #[serde(flatten)]
    pub task: TaskOut,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TasksQuery {
    /// open, running, awaiting_review, completed, failed, canceled.
    #[param(pattern = "^(open|running|awaiting_review|completed|failed|canceled)$")]
    pub status: Option<String>,
    pub project_id: Option<String>,
    /// `id` (the default): by task id, bytewise, paged with `after`. `newest`: newest first by
    /// creation (the seq of the task's `task.created`, or of its first run's first event for a
    /// task created without one), paged with `before`.
    #[param(pattern = "^(id|newest)$")]
    pub order: Option<String>,
    /// Only tasks whose id sorts after this one: the cursor of id order (`next_after`).
    pub after: Option<String>,
    /// Only tasks created before this position, `<creation seq>:<task id>`: the cursor of
    /// newest order (`next_before`).
    #[param(pattern = "^[0-9]{1,19}:[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$")]
    pub before: Option<String>,
    /// 1–500, default 50.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
    /// Answer as of at least this seq (see `ReadAt`).
    #[param(value_type = Option<u64>)]
    pub min_seq: Option<String>,
}

/// List tasks, by id or newest first.
#[utoipa::path(
    get, path = "/v1/tasks", operation_id = "listTasks", tag = "tasks", params(TasksQuery),
    responses(
        (status = 200, body = TasksPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn list(st: Api, Params(q): Params<TasksQuery>) -> Result<Json<TasksPage>, ApiError> {
    let status = query_name::<TaskStatus>("status", q.status.as_deref())?;
    let order = parse_order(q.order.as_deref())?;
    let f = TaskFilter {
        status,
        project_id: q.project_id,
        after: q.after,
        before: parse_before(q.before.as_deref(), "creation seq")?,
        order,
        limit: parse_limit(q.limit.as_deref(), 50, 500)?,
    };
    let min_seq = crate::routes::ReadAt { min_seq: q.min_seq }.seq()?;
    let ((tasks, next), as_of_seq) =
        crate::routes::read_model(st.engine(), min_seq, move |r| r.tasks(&f)).await?;
    let (next_after, next_before) = next_cursors(order, next);
    Ok(Json(TasksPage {
        tasks: tasks.into_iter().map(TaskOut::from).collect(),
        next_after,
        next_before,
        as_of_seq,
    }))
}

/// One task with its runs and review gates.
#[utoipa::path(
    get, path = "/v1/tasks/{id}", operation_id = "getTask", tag = "tasks",
    params(("id" = String, Path, description = "Task id"), crate::routes::ReadAt),
    responses(
        (status = 200, body = TaskAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all, fields(task_id = %id))]
pub async fn get(
    st: Api,
    crate::request::PathId(id): crate::request::PathId<crate::request::TaskId>,
    Params(q): Params<crate::routes::ReadAt>,
) -> Result<Json<TaskAnswer>, ApiError> {
    let key = id.clone();
    match crate::routes::read_model(st.engine(), q.seq()?, move |r| r.task(&key)).await? {
        (Some(t), as_of_seq) => Ok(Json(TaskAnswer {
            task: t.into(),
            as_of_seq,
        })),
        (None, _) => Err(ApiError::not_found(format!("no task {:?}", id.as_str()))),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskStreamQuery {
    /// Events with seq greater than this (default 0); `Last-Event-ID` wins.
    #[param(value_type = Option<u64>)]
    pub after_sequence: Option<String>,
}

/// SSE of every event whose subject is the task, with the resume rules of `/v1/events/stream`.
#[utoipa::path(
    get, path = "/v1/tasks/{id}/stream", operation_id = "streamTask", tag = "tasks",
    params(
        ("id" = String, Path, description = "Task id"),
        TaskStreamQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this seq; wins over after_sequence"),
    ),
    responses(
        (status = 200, description = "text/event-stream", content_type = "text/event-stream", body = String),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The position is before the compacted prefix of the log", body = Problem, content_type = "application/problem+json"),
        (status = 429, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all, fields(task_id = %id))]
pub async fn stream(
    st: Api,
    crate::request::PathId(id): crate::request::PathId<crate::request::TaskId>,
    headers: HeaderMap,
    Params(q): Params<TaskStreamQuery>,
) -> Result<Response, ApiError> {
    tidemark_log::envelope::check_subject(id.as_str())
        .map_err(|e| ApiError::invalid_query(format!("task id: {e}")))?;
    let after = parse_u64("after_sequence", q.after_sequence.as_deref())?.unwrap_or(0);
    let rq = ReadQuery {
        after: resume_point(&headers, after)?,
        limit: 256,
        subject: Some(id.to_string()),
        ..ReadQuery::default()
    };
    crate::routes::events::readable_from(&st, &rq).await?;
    Ok(sse_response(&st, rq)?.into_response())
}
