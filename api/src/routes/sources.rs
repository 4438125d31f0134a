//! `GET /v1/sources`, `GET /v1/sources/{name}` and the operator actions `poll`, `pause`,
//! `resume`, `reset` (spec section 12). The log's part of a source's state (watermark, paused,
//! parked and why, items appended) comes from the sources read model; the poller's part (state,
//! poll times, failures) from the poller, in memory.

use crate::request::Bounded;
use crate::request::OneOf;
use crate::state::Api;
use axum::Json;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use tidemark_engine::commands::sources::{Pause, Reset, Resume};
use tidemark_log::time::Micros;
use tidemark_projections::names::SourceState;
use tidemark_projections::sources::SourceRow;
use utoipa::ToSchema;

use crate::error::{ApiError, Problem};
use crate::request::{OptionalJson, Reason, Text, Validate, ValidatedJson};
use crate::routes::{ReadAt, read_model};
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct SourceOut {
    pub name: String,
    /// idle, polling, backing_off, paused or parked; standby on a node of a cluster while
    /// another node holds the source's poller lease.
    #[schema(inline, value_type = crate::openapi::SourceStateName)]
    pub state: OneOf<SourceState>,
    /// The upstream's `next` of the last page appended and acknowledged; null before any.
    pub watermark: Option<String>,
    #[schema(value_type = Option<String>)]
    pub last_poll_at: Option<Micros>,
    #[schema(value_type = Option<String>)]
    pub last_success_at: Option<Micros>,
    #[schema(value_type = Option<String>)]
    pub next_poll_at: Option<Micros>,
    pub consecutive_failures: u32,
    /// Why it is parked, or the last transient failure (status, or the JSON pointer that
    /// failed validation); never a header value.
    pub last_error: Option<String>,
    pub items_total: u64,
    /// Items its `[sources.items] schema` refused, skipped (`source.item_skipped` events say
    /// why), each counted once.
    pub items_skipped: u64,
    /// No success for three intervals (counted from the process start at the earliest).
    pub stale: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SourceAnswer {
    #[serde(flatten)]
    pub source: SourceOut,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SourcesPage {
    pub sources: Vec<SourceOut>,
    pub as_of_seq: u64,
}

fn out(st: &Api, name: &str, row: Option<SourceRow>) -> SourceOut {
    let row = row.unwrap_or_default();
    let rt = st.sources.runtime(name).unwrap_or_default();
    let state = if row.parked {
        SourceState::Parked.into()
    } else if row.paused {
        SourceState::Paused.into()
    } else if matches!(rt.state, SourceState::Paused | SourceState::Parked) {
        // The poller has not seen the resume yet.
        SourceState::Idle.into()
    } else {
        rt.state.into()
    };
    let active = !row.parked && !row.paused;
    SourceOut {
        name: name.to_owned(),
        state,
        watermark: row.watermark,
        last_poll_at: rt.last_poll_at_us.map(Micros),
        last_success_at: rt.last_success_at_us.map(Micros),
        next_poll_at: rt.next_poll_at_us.filter(|_| active).map(Micros),
        consecutive_failures: rt.consecutive_failures,
        last_error: if row.parked {
            row.last_error
        } else {
            rt.last_error
        },
        items_total: row.items_total,
        items_skipped: row.ext.items_skipped,
        stale: rt.stale && active,
    }
}

/// A configured source's name in a path, checked before any body: `404` for one not
/// configured for the request's tenant.
pub struct SourcePath(String);

impl axum::extract::FromRequestParts<AppState> for SourcePath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        st: &AppState,
    ) -> Result<Self, ApiError> {
        let name = Path::<String>::from_request_parts(parts, st)
            .await
            .map(|Path(n)| n)
            .unwrap_or_default();
        // The request's tenant's sources only (spec section 20): another's is not found.
        let api = Api::from_request_parts(parts, st).await?;
        if st.sources.contains(api.tenant(), &name) {
            Ok(SourcePath(name))
        } else {
            Err(ApiError::not_found(format!(
                "no source {name:?} is configured"
            )))
        }
    }
}

/// Every configured source with its state.
#[utoipa::path(
    get, path = "/v1/sources", tag = "sources", operation_id = "listSources", params(ReadAt),
    responses(
        (status = 200, body = SourcesPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "projection_lagging", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn list(st: Api, Params(q): Params<ReadAt>) -> Result<Json<SourcesPage>, ApiError> {
    let names = st.sources.names(st.tenant());
    let n = names.clone();
    let (rows, as_of_seq) = read_model(st.engine(), q.seq()?, move |r| {
        n.iter()
            .map(|name| r.source(name))
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let sources = names
        .iter()
        .zip(rows)
        .map(|(name, row)| out(&st, name, row))
        .collect();
    Ok(Json(SourcesPage { sources, as_of_seq }))
}

/// One source and its state.
#[utoipa::path(
    get, path = "/v1/sources/{name}", tag = "sources", operation_id = "getSource",
    params(("name" = String, Path, description = "Source name"), ReadAt),
    responses(
        (status = 200, body = SourceAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "projection_lagging", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all, fields(source = %name))]
pub async fn get(
    st: Api,
    SourcePath(name): SourcePath,
    Params(q): Params<ReadAt>,
) -> Result<Json<SourceAnswer>, ApiError> {
    answer(&st, &name, q.seq()?).await
}

/// The source as of at least the head (after any action) or `min_seq`.
async fn answer(st: &Api, name: &str, min_seq: u64) -> Result<Json<SourceAnswer>, ApiError> {
    let n = name.to_owned();
    let (row, as_of_seq) = read_model(st.engine(), min_seq, move |r| r.source(&n)).await?;
    Ok(Json(SourceAnswer {
        source: out(st, name, row),
        as_of_seq,
    }))
}

/// Poll now (the next poll starts at once, or right after the one running).
#[utoipa::path(
    post, path = "/v1/sources/{name}/poll", tag = "sources", operation_id = "pollSource",
    params(("name" = String, Path, description = "Source name")),
    responses(
        (status = 202, description = "The poll is scheduled", body = SourceAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "source_not_active: paused or parked", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all, fields(source = %name))]
pub async fn poll(
    st: Api,
    SourcePath(name): SourcePath,
) -> Result<(StatusCode, Json<SourceAnswer>), ApiError> {
    let a = answer(&st, &name, 0).await?;
    if matches!(
        a.source.state.get(),
        SourceState::Paused | SourceState::Parked
    ) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "source_not_active",
            format!(
                "source {name:?} is {}; resume it first",
                a.source.state.get()
            ),
        ));
    }
    st.sources.wake(&name);
    metrics::counter!("tidemark_source_operator_total", "action" => "poll").increment(1);
    Ok((StatusCode::ACCEPTED, a))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseBody {
    #[schema(inline)]
    pub reason: Option<Text<4096>>,
}

impl Validate for PauseBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.reason.check_at("reason")
    }
}

use crate::request::Params;
use crate::routes::caller;

/// Pause: no polls until resumed (recorded as `source.paused` with the token's name).
#[utoipa::path(
    post, path = "/v1/sources/{name}/pause", tag = "sources", operation_id = "pauseSource",
    params(("name" = String, Path, description = "Source name")),
    request_body(content = Option<PauseBody>, content_type = "application/json"),
    responses(
        (status = 200, body = SourceAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all, fields(source = %name))]
pub async fn pause(
    st: Api,
    SourcePath(name): SourcePath,
    headers: HeaderMap,
    OptionalJson(b): OptionalJson<PauseBody>,
) -> Result<Json<SourceAnswer>, ApiError> {
    st.engine()
        .execute(Pause {
            name: name.clone(),
            by: caller(&st, &headers),
            reason: b.reason.map(Text::into_string),
        })
        .await?;
    metrics::counter!("tidemark_source_operator_total", "action" => "pause").increment(1);
    answer(&st, &name, 0).await
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeBody {
    /// Poll at once instead of at the schedule's next time.
    #[serde(default)]
    pub now: bool,
}

impl Validate for ResumeBody {}

/// Resume a paused or parked source, from the same watermark: a `cron` source polls at its
/// schedule's next time, an `every` source at once (as at start, unless its `poll_at_start`
/// is false); `{"now": true}` polls at once.
#[utoipa::path(
    post, path = "/v1/sources/{name}/resume", tag = "sources", operation_id = "resumeSource",
    params(("name" = String, Path, description = "Source name")),
    request_body(content = Option<ResumeBody>, content_type = "application/json"),
    responses(
        (status = 200, body = SourceAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all, fields(source = %name))]
pub async fn resume(
    st: Api,
    SourcePath(name): SourcePath,
    headers: HeaderMap,
    OptionalJson(b): OptionalJson<ResumeBody>,
) -> Result<Json<SourceAnswer>, ApiError> {
    st.engine()
        .execute(Resume {
            name: name.clone(),
            by: caller(&st, &headers),
        })
        .await?;
    st.sources.resumed(&name, b.now);
    metrics::counter!("tidemark_source_operator_total", "action" => "resume").increment(1);
    answer(&st, &name, 0).await
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceResetBody {
    /// The new watermark (null: from the beginning). May move it back.
    #[schema(inline)]
    pub watermark: Option<Text<1024>>,
    /// Why; required, recorded in the `source.reset` event.
    #[schema(inline)]
    pub reason: Reason,
}

impl Validate for SourceResetBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.watermark.check_at("watermark")?;
        self.reason.check("a source reset")
    }
}

/// Admin: set the watermark (also backwards), with a reason recorded as an event.
#[utoipa::path(
    post, path = "/v1/sources/{name}/reset", tag = "sources", operation_id = "resetSource",
    params(("name" = String, Path, description = "Source name")),
    request_body(content = SourceResetBody, content_type = "application/json"),
    responses(
        (status = 200, body = SourceAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "reason_required or a malformed body", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["admin"]))
)]
#[tracing::instrument(skip_all, fields(source = %name))]
pub async fn reset(
    st: Api,
    SourcePath(name): SourcePath,
    headers: HeaderMap,
    ValidatedJson(b): ValidatedJson<SourceResetBody>,
) -> Result<Json<SourceAnswer>, ApiError> {
    st.engine()
        .execute(Reset {
            name: name.clone(),
            to: b.watermark.map(Text::into_string),
            reason: b.reason.into_string(),
            by: caller(&st, &headers),
        })
        .await?;
    tracing::info!(source = %name, request_id = %crate::request_id::current(), "source watermark reset");
    st.sources.wake(&name);
    metrics::counter!("tidemark_source_operator_total", "action" => "reset").increment(1);
    answer(&st, &name, 0).await
}
