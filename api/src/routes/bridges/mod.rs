//! Bridge subscriptions of a task, their explain view, and pull-sink delivery (spec sections 6
//! and 7, I5).

use crate::request::Bounded;
use crate::request::OneOf;
use crate::state::Api;
use axum::Json;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tidemark_consumers::bridge::{self, Candidate};

use tidemark_engine::commands::bridges::{Subscribe, Subscribed, Unsubscribe};
use tidemark_log::time::Micros;
use tidemark_projections::bridges::{BridgeSink, Subscription, Target};
use tidemark_projections::names::ids;
use tidemark_projections::names::{BridgeMode, Stream};
use tidemark_projections::secrets;
use utoipa::ToSchema;

use crate::error::{ApiError, Problem};
use crate::request::Params;
use crate::request::{
    BridgeId, PathId, SubscriptionId, TaskId, Text, Validate, ValidatedJson, invalid, path_id,
};
use crate::routes::blocking;
use crate::routes::cursors::CursorOut;
use crate::routes::deliveries::check_text;

mod pull;

pub use pull::*;

#[derive(Debug, Serialize, ToSchema)]
pub struct SinkOut {
    /// pull or webhook.
    pub kind: String,
    /// A webhook's endpoint by scheme, host and port (its path can be a credential, spec
    /// section 17).
    pub url: Option<String>,
    /// Whether a webhook secret is set (the secret itself is never returned).
    pub secret_set: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionOut {
    #[schema(value_type = String)]
    pub subscription_id: SubscriptionId,
    #[schema(value_type = String)]
    pub task_id: TaskId,
    #[schema(value_type = String)]
    pub bridge_id: BridgeId,
    pub scope: Option<String>,
    pub workspace_id: Option<String>,
    pub thread_id: Option<String>,
    /// reply or post.
    #[schema(inline, value_type = crate::openapi::BridgeModeName)]
    pub mode: OneOf<BridgeMode>,
    pub sink: SinkOut,
    pub active: bool,
    #[schema(value_type = String)]
    pub created_at: Micros,
    #[schema(value_type = String)]
    pub updated_at: Micros,
    /// `(bridge_task_subscription:<subscription_id>, task_events, <task_id>)`; the zero state
    /// when it never moved.
    pub cursor: CursorOut,
}

fn out(s: Subscription, cursor: tidemark_projections::cursors::Cursor) -> SubscriptionOut {
    SubscriptionOut {
        subscription_id: s.subscription_id,
        task_id: s.target.task_id,
        bridge_id: s.target.bridge_id,
        scope: s.target.scope,
        workspace_id: s.target.workspace_id,
        thread_id: s.target.thread_id,
        mode: s.target.mode.into(),
        sink: SinkOut {
            kind: s.target.sink.kind().to_owned(),
            url: s.target.sink.url().map(secrets::shown_url),
            secret_set: s.target.sink.secret().is_some(),
        },
        active: s.active,
        created_at: Micros(s.created_at_us),
        updated_at: Micros(s.updated_at_us),
        cursor: cursor.into(),
    }
}

/// The subscription with its cursor, as served.
async fn with_cursor(st: &Api, s: Subscription) -> Result<SubscriptionOut, ApiError> {
    let engine = st.engine().clone();
    let (consumer, task) = (
        ids::bridge_consumer(s.subscription_id.as_str()),
        s.target.task_id.clone(),
    );
    let c = blocking(move || {
        engine
            .read()
            .cursor(&consumer, Stream::TaskEvents.as_str(), task.as_str())
    })
    .await?;
    Ok(out(s, c))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionsPage {
    pub subscriptions: Vec<SubscriptionOut>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

/// One subscription, as of at least `as_of_seq`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionAnswer {
    #[serde(flatten)]
    pub subscription: SubscriptionOut,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

/// Wait for the read models (the head at arrival, or `min_seq`): the `as_of_seq`.
async fn as_of(st: &Api, q: crate::routes::ReadAt) -> Result<u64, ApiError> {
    Ok(crate::routes::read_model(st.engine(), q.seq()?, |_| Ok(()))
        .await?
        .1)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SinkIn {
    /// pull or webhook.
    pub kind: String,
    /// Webhook: `https://…` (or `http://…`) URL the envelope is POSTed to.
    pub url: Option<String>,
    /// Webhook: HMAC-SHA256 key (its UTF-8 bytes, or for `whsec_<base64>` the decoded
    /// bytes); each POST carries `webhook-signature: v1,<base64>` (Standard Webhooks) and
    /// `tidemark-signature: v1=<hex>` of the same HMAC over
    /// `<webhook-id>.<webhook-timestamp>.<body>`.
    pub secret: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscribeBody {
    #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._-]+$")]
    pub subscription_id: String,
    #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._-]+$")]
    pub bridge_id: String,
    #[schema(inline)]
    pub scope: Option<Text<256>>,
    #[schema(inline)]
    pub workspace_id: Option<Text<256>>,
    #[schema(inline)]
    pub thread_id: Option<Text<256>>,
    /// reply (default) or post.
    #[schema(value_type = Option<String>, pattern = "^(reply|post)$")]
    pub mode: Option<OneOf<BridgeMode>>,
    #[schema(schema_with = sink_in_schema)]
    pub sink: SinkIn,
}

/// `sink` as the handler reads it: `{"kind": "pull"}`, or a webhook with its URL (and an
/// optional secret).
/// What `sink.url` may be (the same rule as [`WEBHOOK_URL`]): `http(s)://host[:port][/path]`,
/// the host of `A-Za-z0-9.-`, the port of 1–5 digits, the path of visible ASCII; ≤ 2048.
fn webhook_url_ok(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return false;
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (host, port) = match authority.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    };
    url.len() <= 2048
        && !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        && port.is_none_or(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
        && path.bytes().all(|b| b.is_ascii_graphic())
}

/// [`webhook_url_ok`] as a pattern.
const WEBHOOK_URL: &str = "^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[!-~]*)?$";

fn sink_in_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Type};
    let string = |nullable: bool| {
        ObjectBuilder::new().schema_type(if nullable {
            utoipa::openapi::schema::SchemaType::from_iter([Type::String, Type::Null])
        } else {
            utoipa::openapi::schema::SchemaType::new(Type::String)
        })
    };
    let kind = |k: &str| string(false).enum_values(Some([k]));
    let pull = ObjectBuilder::new()
        .description(Some(
            "A bridge fetches and acknowledges its deliveries (no url, no secret)",
        ))
        .property("kind", kind("pull"))
        .property("url", ObjectBuilder::new().schema_type(Type::Null))
        .property("secret", ObjectBuilder::new().schema_type(Type::Null))
        .required("kind")
        .additional_properties(Some(AdditionalProperties::FreeForm(false)));
    let webhook = ObjectBuilder::new()
        .description(Some("The envelope is POSTed, signed, to url"))
        .property("kind", kind("webhook"))
        .property(
            "url",
            string(false)
                .max_length(Some(2048))
                .pattern(Some(WEBHOOK_URL)),
        )
        .property(
            "secret",
            string(true)
                .min_length(Some(1))
                .max_length(Some(512))
                .pattern(Some(crate::openapi::PRINTABLE))
                .description(Some("HMAC-SHA256 key of the signature")),
        )
        .required("kind")
        .required("url")
        .additional_properties(Some(AdditionalProperties::FreeForm(false)));
    OneOfBuilder::new().item(pull).item(webhook).into()
}

fn check_id(field: &str, v: &str) -> Result<(), ApiError> {
    if v.is_empty()
        || v.len() > 128
        || !v
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c))
    {
        return Err(invalid(
            field,
            format!("{field} must be 1–128 of A-Za-z0-9._-"),
        ));
    }
    Ok(())
}

impl Validate for SubscribeBody {
    fn validate(&self) -> Result<(), ApiError> {
        self.scope.check_at("scope")?;
        self.workspace_id.check_at("workspace_id")?;
        self.thread_id.check_at("thread_id")?;
        self.mode.check_at("mode")
    }
}

fn target(task_id: &TaskId, body: SubscribeBody) -> Result<(SubscriptionId, Target), ApiError> {
    check_id("subscription_id", &body.subscription_id)?;
    check_id("bridge_id", &body.bridge_id)?;
    let mode = body.mode.map_or(BridgeMode::Reply, |m| m.get());
    let sink = match body.sink.kind.as_str() {
        "pull" => {
            if body.sink.url.is_some() || body.sink.secret.is_some() {
                return Err(invalid("sink", "a pull sink takes no url or secret"));
            }
            BridgeSink::Pull
        }
        "webhook" => {
            let url = body
                .sink
                .url
                .ok_or_else(|| invalid("sink.url", "a webhook sink needs a url"))?;
            if !webhook_url_ok(&url) {
                return Err(invalid(
                    "sink.url",
                    "sink.url must be an https:// or http:// URL of at most 2048 characters: \
                     a host name or IPv4 address of A-Za-z0-9.-, an optional :port, and an \
                     optional path of visible ASCII characters",
                ));
            }
            if let Some(s) = &body.sink.secret {
                check_text("sink.secret", s, 512)?;
            }
            BridgeSink::Webhook {
                url,
                secret: body.sink.secret,
            }
        }
        _ => return Err(invalid("sink.kind", "sink.kind must be pull or webhook")),
    };
    Ok((
        SubscriptionId::new(body.subscription_id),
        Target {
            task_id: task_id.clone(),
            bridge_id: BridgeId::new(body.bridge_id),
            scope: body.scope.map(Text::into_string),
            workspace_id: body.workspace_id.map(Text::into_string),
            thread_id: body.thread_id.map(Text::into_string),
            mode,
            sink,
        },
    ))
}

/// Subscribe a bridge to a task's terminal notification: 201 new (or re-created: resumes from
/// the kept cursor), 200 the same again, 409 the same id with another target.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/notifications/bridges", operation_id = "createBridgeSubscription", tag = "bridges",
    params(("id" = String, Path, description = "Task id")),
    request_body(content = SubscribeBody, content_type = "application/json"),
    responses(
        (status = 201, body = SubscriptionOut),
        (status = 200, description = "Already subscribed with this target", body = SubscriptionOut),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(task = %task_id))]
pub async fn create(
    st: Api,
    task_id: PathId<TaskId>,
    ValidatedJson(body): ValidatedJson<SubscribeBody>,
) -> Result<Response, ApiError> {
    let (id, t) = target(&task_id.0, body)?;
    let (Subscribed { row, created }, _) = st.engine().execute(Subscribe { id, target: t }).await?;
    if created {
        metrics::counter!("tidemark_bridge_subscriptions_created_total").increment(1);
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(with_cursor(&st, row).await?)).into_response())
}

/// The task's active subscriptions, each with its cursor.
#[utoipa::path(
    get, path = "/v1/tasks/{id}/notifications/bridges", operation_id = "listBridgeSubscriptions", tag = "bridges",
    params(("id" = String, Path, description = "Task id"), crate::routes::ReadAt),
    responses((status = 200, body = SubscriptionsPage)),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all, fields(task = %task_id))]
pub async fn list(
    st: Api,
    PathId(task_id): PathId<TaskId>,
    Params(q): Params<crate::routes::ReadAt>,
) -> Result<Json<SubscriptionsPage>, ApiError> {
    let as_of_seq = as_of(&st, q).await?;
    let engine = st.engine().clone();
    let subs = blocking(move || engine.read().task_subscriptions(&[task_id.as_str()])).await?;
    let mut out = Vec::with_capacity(subs.len());
    for s in subs {
        out.push(with_cursor(&st, s).await?);
    }
    Ok(Json(SubscriptionsPage {
        subscriptions: out,
        as_of_seq,
    }))
}

async fn active_of_task(
    st: &Api,
    task_id: String,
    sub_id: String,
) -> Result<Subscription, ApiError> {
    let task_id: TaskId = path_id(task_id)?;
    let sub_id: SubscriptionId = path_id(sub_id)?;
    let engine = st.engine().clone();
    let id = sub_id.clone();
    blocking(move || engine.read().subscription(&id))
        .await?
        .filter(|s| s.active && s.target.task_id == task_id)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "subscription_not_found",
                format!("no subscription {sub_id:?} on task {task_id:?}"),
            )
        })
}

/// One subscription with its cursor.
#[utoipa::path(
    get, path = "/v1/tasks/{id}/notifications/bridges/{subscription_id}", operation_id = "getBridgeSubscription", tag = "bridges",
    params(("id" = String, Path, description = "Task id"), ("subscription_id" = String, Path), crate::routes::ReadAt),
    responses(
        (status = 200, body = SubscriptionAnswer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all, fields(task = %task_id, subscription = %sub_id))]
pub async fn show(
    st: Api,
    Path((task_id, sub_id)): Path<(String, String)>,
    Params(q): Params<crate::routes::ReadAt>,
) -> Result<Json<SubscriptionAnswer>, ApiError> {
    let as_of_seq = as_of(&st, q).await?;
    let s = active_of_task(&st, task_id.clone(), sub_id.clone()).await?;
    Ok(Json(SubscriptionAnswer {
        subscription: with_cursor(&st, s).await?,
        as_of_seq,
    }))
}

/// Delete a subscription; its cursor is kept, and creating the same id again resumes from it.
#[utoipa::path(
    delete, path = "/v1/tasks/{id}/notifications/bridges/{subscription_id}", operation_id = "deleteBridgeSubscription", tag = "bridges",
    params(("id" = String, Path, description = "Task id"), ("subscription_id" = String, Path)),
    responses(
        (status = 200, description = "Deleted (active: false), with the kept cursor", body = SubscriptionOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["bridge"]))
)]
#[tracing::instrument(skip_all, fields(task = %task_id, subscription = %sub_id))]
pub async fn delete(
    st: Api,
    Path((task_id, sub_id)): Path<(String, String)>,
) -> Result<Json<SubscriptionOut>, ApiError> {
    let (row, _) = st
        .engine()
        .execute(Unsubscribe {
            task_id: path_id(task_id)?,
            id: path_id(sub_id)?,
        })
        .await?;
    Ok(Json(with_cursor(&st, row).await?))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CandidateOut {
    pub seq: u64,
    pub event_type: String,
    /// deliver, defer or mismatch.
    pub decision: String,
    pub reason: String,
}

impl From<Candidate> for CandidateOut {
    fn from(c: Candidate) -> Self {
        CandidateOut {
            seq: c.seq,
            event_type: c.event_type,
            decision: serde_json::to_value(&c.decision)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            reason: c.reason,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExplainOut {
    pub subscription_id: String,
    pub cursor: CursorOut,
    /// Every terminal event past the cursor, in order, with its decision and reason.
    pub candidates: Vec<CandidateOut>,
    /// What the notifier does next: `deliver` (seq in `next_seq`), `stopped` at a mismatch
    /// (seq in `next_seq`), or `idle`.
    pub next: String,
    pub next_seq: Option<u64>,
    /// The answer reflects the log at least up to this seq.
    pub as_of_seq: u64,
}

/// The decision for each candidate event past the cursor, with its reason.
#[utoipa::path(
    get, path = "/v1/tasks/{id}/notifications/bridges/{subscription_id}/explain", operation_id = "explainBridgeSubscription", tag = "bridges",
    params(("id" = String, Path, description = "Task id"), ("subscription_id" = String, Path), crate::routes::ReadAt),
    responses(
        (status = 200, body = ExplainOut),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all, fields(task = %task_id, subscription = %sub_id))]
pub async fn explain(
    st: Api,
    Path((task_id, sub_id)): Path<(String, String)>,
    Params(q): Params<crate::routes::ReadAt>,
) -> Result<Json<ExplainOut>, ApiError> {
    let as_of_seq = as_of(&st, q).await?;
    let s = active_of_task(&st, task_id.clone(), sub_id.clone()).await?;
    let engine = st.engine().clone();
    let scan = blocking(move || bridge::scan(&engine, &s, true)).await?;
    let (next, next_seq) = match (&scan.deliver, &scan.mismatch) {
        (Some(d), Some(m)) if m.0.seq < d.seq => ("stopped", Some(m.0.seq)),
        (Some(d), _) => ("deliver", Some(d.seq)),
        (None, Some(m)) => ("stopped", Some(m.0.seq)),
        (None, None) => ("idle", None),
    };
    Ok(Json(ExplainOut {
        subscription_id: sub_id,
        cursor: scan.cursor.into(),
        candidates: scan
            .candidates
            .into_iter()
            .map(CandidateOut::from)
            .collect(),
        next: next.into(),
        next_seq,
        as_of_seq,
    }))
}
