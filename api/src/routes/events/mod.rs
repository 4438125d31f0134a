//! `POST /v1/events`, `GET /v1/events`, `GET /v1/events/stream`: the append ([`append`], its
//! body read by [`body`]), the reads ([`read`]) and the live streams ([`stream`], which the
//! task streams share).

pub mod body;
pub mod read;
pub mod stream;

pub(crate) use read::{parse_limit, parse_u64};

use crate::state::Api;
use body::parse_append_body;
pub(crate) use stream::{readable_from, resume_point, sse_response};

use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_log::{AppendReceipt, Event};
use utoipa::ToSchema;

use crate::error::{ApiError, Problem};
use crate::request::{body_rejection, require_json};

/// One event as a client sends it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventInput {
    /// 1–128 of `A-Za-z0-9._:-`; the server makes one when absent. Retrying with the same id is
    /// safe: the event is appended once.
    #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:-]+$")]
    pub event_id: Option<String>,
    /// 1–64 of `a-z0-9_.-`.
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9_.-]+$")]
    pub stream: String,
    /// 0–128 printable characters.
    #[serde(default)]
    #[schema(max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub subject: String,
    /// 1–64 of `a-z0-9_.`.
    #[serde(rename = "type")]
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9_.]+$")]
    pub event_type: String,
    /// A JSON object of at most 64 KiB; `{}` when absent.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<Value>,
}

/// Body of `POST /v1/events`: one event, or a batch of at most 1000.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AppendBody {
    Batch {
        #[schema(value_type = Vec<EventInput>, min_items = 1, max_items = 1000)]
        events: Vec<Value>,
    },
    One(Box<EventInput>),
}

// The schema of one entry of the log's `AppendReceipt`, which the append answer serialises as
// it is (no copy into these types: they only document it; a test holds the two shapes equal).
// Plain comments: a doc comment would become the schema's description.
#[derive(Debug, Serialize, ToSchema)]
pub struct AppendedOut {
    pub event_id: String,
    pub seq: u64,
    /// True when the event_id was already in the log with the same content.
    pub duplicate: bool,
}

// The schema of the log's `AppendReceipt` (see `AppendedOut`).
#[derive(Debug, Serialize, ToSchema)]
pub struct AppendResponse {
    /// One entry per event sent, in order.
    pub events: Vec<AppendedOut>,
    /// The log's head after this append's commit (at least every seq above).
    pub last_seq: u64,
}

/// A stored event, as served.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventEnvelope {
    pub seq: u64,
    /// The event's tenant (spec section 20); absent for the default tenant's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub event_id: String,
    pub stream: String,
    pub subject: String,
    #[serde(rename = "type")]
    pub event_type: String,
    /// Commit time, RFC 3339 UTC with microseconds.
    pub time: String,
    #[schema(value_type = Object)]
    pub payload: Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventsPage {
    #[schema(value_type = Vec<EventEnvelope>)]
    pub events: Vec<Event>,
    /// Every matching event with seq up to this one has been returned; pass it as
    /// `after_sequence` to continue. With `order=desc`: the top of the range read
    /// (`before_sequence` − 1, or the head), to follow what comes after it in seq order.
    pub next_after_sequence: u64,
    /// The log's head when this page was read.
    pub latest_event_seq: u64,
    /// Only with `order=desc`: pass as `before_sequence` for the next (older) page; absent
    /// when nothing older is left. Every matching event with this seq or above, and below the
    /// request's `before_sequence`, has been returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before_sequence: Option<u64>,
}

/// Append one event or a batch, atomically and durably.
#[utoipa::path(
    post, path = "/v1/events", operation_id = "appendEvents", tag = "events",
    request_body(content = AppendBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Appended (or recognised as duplicates); durable", body = AppendResponse),
        (status = 400, description = "Malformed input", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or bad token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Missing scope or server-only type", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "event_id already used with other content (`event_id_conflict`), or a notification for a suppressed recipient (`recipient_blocked`: `blocked` lists the indexes, nothing appended)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body, batch or payload too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Reserved type with an invalid payload", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Writer queue full (`overloaded`), or the outbox bound (`outbox_full`: Retry-After from the drain rate)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shutting down", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["append"]))
)]
#[tracing::instrument(skip_all, fields(events))]
pub async fn append(
    st: Api,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = body.map_err(body_rejection)?;
    require_json(&headers)?;
    let events = parse_append_body(&body)?;
    tracing::Span::current().record("events", events.len());
    let receipt = st
        .engine()
        .append_from_client(events, st.routing.max_pending)
        .await?;
    record_append(&receipt, started, st.tenant());
    // The receipt is the answer's shape: written straight into the response body.
    Ok((StatusCode::CREATED, Json(receipt)).into_response())
}

fn record_append(receipt: &AppendReceipt, started: Instant, tenant: &str) {
    let tenant = tidemark_engine::labels::tenant_label(tenant);
    let dup = receipt.events.iter().filter(|e| e.duplicate).count() as u64;
    metrics::counter!("tidemark_events_appended_total", "tenant" => tenant)
        .increment(receipt.events.len() as u64 - dup);
    metrics::counter!("tidemark_events_duplicate_total", "tenant" => tenant).increment(dup);
    metrics::histogram!("tidemark_append_duration_seconds").record(started.elapsed().as_secs_f64());
    // The home shard's head (another shard's numbers are its own).
    if tenant == tidemark_log::DEFAULT_TENANT {
        metrics::gauge!("tidemark_log_head").set(receipt.last_seq as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The append answer is the log's receipt serialised as it is; the document describes it
    /// with `AppendResponse`: the same fields, nothing more.
    #[test]
    fn the_receipt_is_the_documented_answer() {
        use utoipa::PartialSchema;
        let receipt = AppendReceipt {
            events: vec![tidemark_log::Appended {
                event_id: "e1".into(),
                seq: 7,
                duplicate: false,
            }],
            last_seq: 7,
        };
        let served = serde_json::to_value(&receipt).unwrap();
        let fields = |schema: serde_json::Value| -> Vec<String> {
            let mut f: Vec<String> = schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            f.sort();
            f
        };
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let doc = serde_json::to_value(AppendResponse::schema()).unwrap();
        assert_eq!(keys(&served), fields(doc));
        let item = serde_json::to_value(AppendedOut::schema()).unwrap();
        assert_eq!(keys(&served["events"][0]), fields(item));
    }
}
