//! `POST /v1/events`, `GET /v1/events`, `GET /v1/events/stream`.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use tidemark_engine::Engine;
use tidemark_log::{AppendReceipt, Event, NewEvent, ReadPage, ReadQuery, limits};
use tidemark_projections::names::EventType;
use tidemark_projections::schema::{self, SchemaError};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::{body_rejection, require_json};
use crate::state::AppState;

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

/// Filters shared by `GET /v1/events` and the SSE stream. Numbers are parsed by hand so that a
/// bad value gets a problem document rather than a plain-text rejection.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Return events with seq greater than this (default 0).
    #[param(value_type = Option<u64>)]
    pub after_sequence: Option<String>,
    /// Page size, 1–1000 (default 100). Ignored by the stream.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
    /// Only events of this stream.
    #[param(min_length = 1, max_length = 64, pattern = "^[a-z0-9_.-]+$")]
    pub stream: Option<String>,
    /// Only events with this subject.
    #[param(max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub subject: Option<String>,
    /// Only events of this type.
    #[serde(rename = "type")]
    #[param(
        rename = "type",
        min_length = 1,
        max_length = 64,
        pattern = "^[a-z0-9_.]+$"
    )]
    pub event_type: Option<String>,
    /// `asc` (the default): oldest first from `after_sequence`. `desc`: newest first, from
    /// below `before_sequence`; one request scans at most 32,000 seqs of the log, so a page
    /// may hold fewer than `limit` events and still have older ones: continue with
    /// `next_before_sequence`. Not taken by the stream.
    #[param(pattern = "^(asc|desc)$")]
    pub order: Option<String>,
    /// Only events with seq below this (default: no bound; newest first, the head + 1): with
    /// `after_sequence`, the range between the two. Not taken by the stream.
    #[param(value_type = Option<u64>, minimum = 1)]
    pub before_sequence: Option<String>,
}

/// The parameters `GET /v1/events/stream` documents (and so takes): those of
/// [`EventsQuery`] without `order` and `before_sequence` (a stream is in seq order and has no
/// end). Parsed as an [`EventsQuery`]; this type only documents them.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Return events with seq greater than this (default 0).
    #[param(value_type = Option<u64>)]
    pub after_sequence: Option<String>,
    /// Ignored by the stream (it sends pages of its own size).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
    /// Only events of this stream.
    #[param(min_length = 1, max_length = 64, pattern = "^[a-z0-9_.-]+$")]
    pub stream: Option<String>,
    /// Only events with this subject.
    #[param(max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$")]
    pub subject: Option<String>,
    /// Only events of this type.
    #[serde(rename = "type")]
    #[param(
        rename = "type",
        min_length = 1,
        max_length = 64,
        pattern = "^[a-z0-9_.]+$"
    )]
    pub event_type: Option<String>,
}

pub(crate) fn parse_u64(name: &str, v: Option<&str>) -> Result<Option<u64>, ApiError> {
    match v {
        None => Ok(None),
        // Seqs and counts are int64 in the OpenAPI document (as JSON clients read them).
        Some(s) => s
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= i64::MAX as u64)
            .map(Some)
            .ok_or_else(|| {
                ApiError::invalid_query(format!(
                    "{name} must be an integer from 0 to {}, got {s:?}",
                    i64::MAX
                ))
            }),
    }
}

/// `limit`: default when absent, 1..=max otherwise.
pub(crate) fn parse_limit(v: Option<&str>, default: usize, max: u64) -> Result<usize, ApiError> {
    match parse_u64("limit", v)? {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid_query(format!(
            "limit must be between 1 and {max}, got {n}"
        ))),
    }
}

/// How one request reads the log newest first (`order=desc`): in windows of at most this many
/// seqs, each one forward read (a window holds at most this many matches), from the top down.
const DESC_WINDOW: u64 = 1000;
/// ... and at most this many windows per request (bounded work whatever the filters match).
const DESC_WINDOWS_MAX: u64 = 32;

/// The reading order of `GET /v1/events`, and the range's upper end (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Asc { before: Option<u64> },
    Desc { before: Option<u64> },
}

impl EventsQuery {
    fn order(&self) -> Result<Order, ApiError> {
        let before = parse_u64("before_sequence", self.before_sequence.as_deref())?;
        if before == Some(0) {
            return Err(ApiError::invalid_query(
                "before_sequence must be at least 1 (no event has seq 0)",
            ));
        }
        match self.order.as_deref() {
            None | Some("asc") => Ok(Order::Asc { before }),
            Some("desc") => Ok(Order::Desc { before }),
            Some(o) => Err(ApiError::invalid_query(format!(
                "order must be asc or desc, got {o:?}"
            ))),
        }
    }

    fn to_read(&self, default_limit: usize) -> Result<ReadQuery, ApiError> {
        let after = parse_u64("after_sequence", self.after_sequence.as_deref())?.unwrap_or(0);
        let limit = parse_limit(self.limit.as_deref(), default_limit, 1000)?;
        use tidemark_log::envelope::{check_stream, check_subject, check_type};
        let filter =
            |v: &Option<String>, check: fn(&str) -> Result<(), tidemark_log::FieldError>| {
                v.as_deref()
                    .map(check)
                    .transpose()
                    .map_err(|e| ApiError::invalid_query(format!("filter {e}")))
            };
        filter(&self.stream, check_stream)?;
        filter(&self.event_type, check_type)?;
        filter(&self.subject, check_subject)?;
        Ok(ReadQuery {
            after,
            limit,
            stream: self.stream.clone(),
            subject: self.subject.clone(),
            event_type: self.event_type.clone(),
        })
    }
}

fn query_rejection(r: QueryRejection) -> ApiError {
    ApiError::invalid_query(r.body_text())
}

/// Turn one JSON event into a validated [`NewEvent`], or the error for it.
fn to_new_event(index: usize, v: Value) -> Result<NewEvent, ApiError> {
    let input: EventInput = serde_json::from_value(v).map_err(|e| {
        ApiError::bad_request("malformed_json", format!("event {index}: {e}")).at(index, None)
    })?;
    let payload = input
        .payload
        .unwrap_or_else(|| Value::Object(Default::default()));
    let event_id = event_id_of(index, input.event_id, &input.subject, &input.event_type)?;
    let ev = NewEvent::new(
        event_id,
        input.stream,
        input.subject,
        input.event_type,
        &payload,
    )
    .map_err(|e| {
        let too_large = e.kind == tidemark_log::InvalidKind::TooLarge;
        let (status, code) = if too_large {
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
        } else {
            (StatusCode::BAD_REQUEST, "invalid_field")
        };
        ApiError::new(status, code, format!("event {index}: {e}")).at(index, Some(e.field))
    })?;
    check_schema(index, &ev, &payload)?;
    Ok(ev)
}

/// The event's id by the API's own rules: a notification's id is its subject (taken from it
/// when absent, refused when another), and tidemark's id prefixes are its own.
fn event_id_of(
    index: usize,
    event_id: Option<String>,
    subject: &str,
    event_type: &str,
) -> Result<Option<String>, ApiError> {
    let mut event_id = event_id;
    if event_type == EventType::NotificationRequested.as_str() {
        match &event_id {
            None if !subject.is_empty() => event_id = Some(subject.to_owned()),
            Some(id) if id != subject => {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "schema_violation",
                    format!(
                        "event {index}: a notification.requested event's subject must equal its event_id (the notification id)"
                    ),
                )
                .at(index, Some("subject")));
            }
            _ => {}
        }
    }
    if let Some(id) = &event_id
        && let Some(prefix) = tidemark_projections::names::ids::RESERVED_PREFIXES
            .iter()
            .find(|p| id.starts_with(**p))
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "reserved_event_id",
            format!("event {index}: event_ids starting with {prefix:?} are made by tidemark only"),
        )
        .at(index, Some("event_id")));
    }
    Ok(event_id)
}

/// The schema of tidemark's own types (section 2); `payload` is read only for those
/// ([`schema::reads_payload`]).
fn check_schema(index: usize, ev: &NewEvent, payload: &Value) -> Result<(), ApiError> {
    schema::check_client_event(&ev.stream, &ev.subject, &ev.event_type, payload).map_err(
        |e| match e {
            SchemaError::ServerOnly(_) => ApiError::new(
                StatusCode::FORBIDDEN,
                "server_only_type",
                format!("event {index}: {e}"),
            )
            .at(index, Some("type")),
            SchemaError::Invalid(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "schema_violation",
                format!("event {index}: {e}"),
            )
            .at(index, Some("payload")),
        },
    )
}

/// Parse and validate a whole request body; nothing is appended unless all of it is valid.
///
/// A body is read once, from its bytes into the events to append, with each payload kept as
/// the client's text when it is already canonical ([`NewEvent::from_json_text`]). Anything
/// that path does not take (a malformed body, an invalid event, a duplicate key) is read again
/// the long way, through a value tree, which finds the error and words it: the answers and the
/// stored bytes are the same either way.
pub fn parse_append_body(body: &[u8]) -> Result<Vec<NewEvent>, ApiError> {
    match parse_once(body) {
        Some(events) => Ok(events),
        None => parse_the_long_way(body),
    }
}

/// An event as sent, its payload borrowed from the body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sent<'a> {
    event_id: Option<String>,
    stream: String,
    #[serde(default)]
    subject: String,
    #[serde(rename = "type")]
    event_type: String,
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SentBatch<'a> {
    #[serde(borrow)]
    events: Vec<Sent<'a>>,
}

/// The events of a valid body, or `None` for the long way to judge.
fn parse_once(body: &[u8]) -> Option<Vec<NewEvent>> {
    // serde reads a struct from an array too; the long way takes an object only.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let sent = match serde_json::from_slice::<SentBatch<'_>>(body) {
        Ok(batch) => batch.events,
        Err(_) => vec![serde_json::from_slice::<Sent<'_>>(body).ok()?],
    };
    if sent.is_empty() || sent.len() > limits::BATCH_MAX_EVENTS {
        return None;
    }
    sent.into_iter()
        .map(|e| {
            let payload: &RawValue = match e.payload {
                Some(p) => p,
                None => empty_object(),
            };
            // A deep payload is the long way's to judge: the whole body through a value tree
            // meets serde_json's recursion limit where it always has.
            if tidemark_log::canonical::nesting_depth(payload.get())
                > tidemark_log::canonical::MAX_DEPTH
            {
                return None;
            }
            // The same rules as the long way; their errors are its to word.
            let event_id = event_id_of(0, e.event_id, &e.subject, &e.event_type).ok()?;
            let ev = NewEvent::from_json_text(event_id, e.stream, e.subject, e.event_type, payload)
                .ok()?;
            let parsed: Value = if schema::reads_payload(&ev.event_type) {
                serde_json::from_str(payload.get()).ok()?
            } else {
                Value::Null
            };
            check_schema(0, &ev, &parsed).ok()?;
            Some(ev)
        })
        .collect()
}

fn empty_object() -> &'static RawValue {
    serde_json::from_str("{}").expect("an empty object is JSON")
}

/// The body through a value tree: every error found and worded.
fn parse_the_long_way(body: &[u8]) -> Result<Vec<NewEvent>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request("malformed_json", format!("the body is not JSON: {e}"))
    })?;
    let Value::Object(mut obj) = v else {
        return Err(ApiError::bad_request(
            "malformed_json",
            "the body must be an event object or {\"events\": [...]}",
        ));
    };
    let raw: Vec<Value> = if obj.contains_key("events") {
        if obj.len() != 1 {
            return Err(ApiError::bad_request(
                "malformed_json",
                "a batch body has the single key \"events\"",
            ));
        }
        match obj.remove("events") {
            Some(Value::Array(items)) => items,
            _ => {
                return Err(ApiError::bad_request(
                    "malformed_json",
                    "\"events\" must be an array of event objects",
                ));
            }
        }
    } else {
        vec![Value::Object(obj)]
    };
    if raw.is_empty() {
        return Err(ApiError::bad_request(
            "empty_batch",
            "the batch has no events",
        ));
    }
    if raw.len() > limits::BATCH_MAX_EVENTS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "batch_too_large",
            format!(
                "the batch has {} events, more than the {} allowed",
                raw.len(),
                limits::BATCH_MAX_EVENTS
            ),
        ));
    }
    raw.into_iter()
        .enumerate()
        .map(|(i, v)| to_new_event(i, v))
        .collect()
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
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = body.map_err(body_rejection)?;
    require_json(&headers)?;
    let events = parse_append_body(&body)?;
    tracing::Span::current().record("events", events.len());
    let receipt = st
        .engine
        .append_from_client(events, st.routing.max_pending)
        .await?;
    record_append(&receipt, started);
    // The receipt is the answer's shape: written straight into the response body.
    Ok((StatusCode::CREATED, Json(receipt)).into_response())
}

fn record_append(receipt: &AppendReceipt, started: Instant) {
    let dup = receipt.events.iter().filter(|e| e.duplicate).count() as u64;
    metrics::counter!("tidemark_events_appended_total")
        .increment(receipt.events.len() as u64 - dup);
    metrics::counter!("tidemark_events_duplicate_total").increment(dup);
    metrics::histogram!("tidemark_append_duration_seconds").record(started.elapsed().as_secs_f64());
    metrics::gauge!("tidemark_log_head").set(receipt.last_seq as f64);
}

pub(crate) async fn read_page(engine: &Engine, q: ReadQuery) -> Result<ReadPage, ApiError> {
    let engine = engine.clone();
    crate::routes::blocking(move || engine.read().events(&q)).await
}

/// Webhook secrets are recorded in `bridge.subscribed` (the notifier signs with them after a
/// restart) but never served: event pages and streams show `"secret": "[redacted]"`.
/// Read a page of events after a seq, optionally filtered; or newest first with `order=desc`.
#[utoipa::path(
    get, path = "/v1/events", operation_id = "listEvents", tag = "events",
    params(EventsQuery),
    responses(
        (status = 200, description = "A page of events in seq order, or newest first with `order=desc`", body = EventsPage),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "`after` is before the compacted prefix of the log", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or bad token", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    State(st): State<AppState>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Json<EventsPage>, ApiError> {
    let Query(q) = q.map_err(query_rejection)?;
    let order = q.order()?;
    let rq = q.to_read(100)?;
    let before = match order {
        Order::Desc { before } => {
            let engine = st.engine.clone();
            return crate::routes::blocking(move || read_desc(&engine, &rq, before))
                .await
                .map(Json);
        }
        Order::Asc { before } => before,
    };
    let after = rq.after;
    let page = read_page(&st.engine, rq).await?;
    let (events, next_after_sequence) = match before {
        None => (page.events, page.next_after),
        // The range ends below `before`: once the page reaches it, the range is done.
        Some(b) => {
            let end = b - 1;
            let past = page.events.iter().any(|e| e.seq > end);
            let events: Vec<Event> = page.events.into_iter().filter(|e| e.seq <= end).collect();
            let next = if past { end } else { page.next_after.min(end) };
            (events, next.max(after))
        }
    };
    Ok(Json(EventsPage {
        events,
        next_after_sequence,
        latest_event_seq: page.head,
        next_before_sequence: None,
    }))
}

/// A page newest first: the matches below `before` (default: above the head) and above
/// `q.after`, the newest `q.limit` of them, found window by window from the top down (see
/// [`DESC_WINDOW`]); the scan stops at the bound and says where with `next_before_sequence`.
fn read_desc(
    engine: &Engine,
    q: &ReadQuery,
    before: Option<u64>,
) -> Result<EventsPage, tidemark_engine::QueryError> {
    use tidemark_engine::QueryError;
    let r = engine.read();
    let head = engine.head();
    // Exclusive upper end of what is left to scan, and the inclusive lower bound of the scan.
    let mut top = before.unwrap_or(head + 1).min(head + 1);
    let mut floor = q.after;
    let mut found: Vec<Event> = Vec::new();
    let mut windows = 0;
    let mut latest = head;
    while top > floor + 1 && found.len() < q.limit && windows < DESC_WINDOWS_MAX {
        windows += 1;
        let lo = top.saturating_sub(DESC_WINDOW + 1).max(floor);
        let mut window: Vec<Event> = Vec::new();
        let mut cur = lo;
        loop {
            let read = ReadQuery {
                after: cur,
                limit: (top - 1 - lo) as usize,
                ..q.clone()
            };
            let page = match r.events(&read) {
                Ok(p) => p,
                // The log now starts at `first` (section 13): nothing below it is left. A
                // request wholly below it is answered `410 compacted`, as in seq order.
                Err(QueryError::Compacted { first }) => {
                    if first >= top && found.is_empty() && before.is_some() {
                        return Err(QueryError::Compacted { first });
                    }
                    floor = floor.max(first - 1);
                    if first >= top {
                        break;
                    }
                    cur = first - 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            latest = latest.max(page.head);
            let past = page.events.iter().any(|e| e.seq >= top);
            let full = page.events.len() >= read.limit;
            window.extend(page.events.into_iter().filter(|e| e.seq < top));
            if past || full || page.next_after >= top - 1 || page.next_after <= cur {
                break;
            }
            cur = page.next_after;
        }
        found.extend(window.into_iter().rev());
        top = lo.max(floor) + 1;
    }
    found.truncate(q.limit);
    let next_before_sequence = if found.len() >= q.limit {
        found.last().map(|e| e.seq).filter(|s| *s > floor + 1)
    } else {
        Some(top).filter(|t| *t > floor + 1)
    };
    Ok(EventsPage {
        next_after_sequence: before.map_or(latest, |b| b.saturating_sub(1).min(latest)),
        events: found,
        latest_event_seq: latest,
        next_before_sequence,
    })
}

/// The resume point of a stream: `Last-Event-ID` wins over `after_sequence`, including `0`.
pub(crate) fn resume_point(headers: &HeaderMap, query_after: u64) -> Result<u64, ApiError> {
    match headers.get("last-event-id") {
        None => Ok(query_after),
        Some(v) => v
            .to_str()
            .ok()
            .map(str::trim)
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_last_event_id",
                    "Last-Event-ID must be the seq (a non-negative integer) of the last event received",
                )
            }),
    }
}

/// Server-sent events of the log from a resume point, live.
#[utoipa::path(
    get, path = "/v1/events/stream", operation_id = "streamEvents", tag = "events",
    params(
        StreamQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this seq; wins over after_sequence"),
    ),
    responses(
        (status = 200, description = "text/event-stream: `id` = seq, `event` = type, `data` = envelope", content_type = "text/event-stream", body = String),
        (status = 400, description = "Bad query or Last-Event-ID", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The position is before the compacted prefix of the log", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many open streams", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["read"]))
)]
#[tracing::instrument(skip_all)]
pub async fn stream(
    State(st): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(query_rejection)?;
    // Not documented for the stream, so the front refuses them first (`unknown_parameter`).
    if q.order.is_some() || q.before_sequence.is_some() {
        return Err(ApiError::invalid_query(
            "a stream is in seq order: order and before_sequence are for GET /v1/events",
        ));
    }
    let mut rq = q.to_read(256)?;
    rq.limit = 256;
    rq.after = resume_point(&headers, rq.after)?;
    readable_from(&st, &rq).await?;
    Ok(sse_response(&st, rq)?.into_response())
}

/// A stream resumes from `q.after` only if the log still holds what follows it: before the
/// compacted prefix the answer is `410 compacted` (spec section 13), not a stream with a gap.
pub(crate) async fn readable_from(st: &AppState, q: &ReadQuery) -> Result<(), ApiError> {
    read_page(
        &st.engine,
        ReadQuery {
            limit: 1,
            ..q.clone()
        },
    )
    .await
    .map(drop)
}

/// Streams read their pages through this many blocking reads at once. A commit wakes every
/// stream it has an event for (an unfiltered stream: every commit); without a bound, 1,000 streams woken together each took a thread of the blocking
/// pool (up to 512), and the threads' stacks and allocator heaps held about 600 KB of resident
/// memory per connection (measured by `e2e_limits::idle_slow_and_half_open_clients_…`).
const STREAM_READS_AT_ONCE: usize = 4;
static STREAM_READS: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(STREAM_READS_AT_ONCE);

/// An SSE response that replays the log from `q.after` and then follows it. The stream reads
/// one bounded page at a time and only when the client has taken the previous one, so a slow
/// client costs one page of memory, never a backlog (I9).
pub(crate) fn sse_response(
    st: &AppState,
    q: ReadQuery,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>> + use<>>, ApiError> {
    let permit = st.sse_slots.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_streams",
            "the server has reached its limit of open streams (server.sse_max_clients)",
        )
        .retry_after(5)
    })?;
    let engine = st.engine.clone();
    let shutdown = st.shutdown.clone();
    let streams = st.streams.clone();
    let keepalive = Duration::from_secs(st.config.server.keepalive_secs);
    let events = async_stream::stream! {
        let _permit = permit;
        let _gauge = SseGauge::new();
        let mut q = q;
        let mut wake = streams.watch(&q);
        loop {
            wake.mark_seen();
            metrics::counter!("tidemark_sse_log_reads_total").increment(1);
            let page = {
                let Ok(_turn) = STREAM_READS.acquire().await else { break };
                match read_page(&engine, q.clone()).await {
                    Ok(p) => p,
                    Err(_) => break,
                }
            };
            for ev in &page.events {
                yield Ok(sse_event(ev));
            }
            q.after = page.next_after;
            if page.next_after < page.head {
                continue;
            }
            // Caught up: wait for a commit holding an event this stream shows, and take its
            // events from the page the follower read, or read the log when it may have missed
            // some.
            let mut stop = false;
            loop {
                tokio::select! {
                    changed = wake.changed() => if !changed { stop = true; break },
                    _ = shutdown.cancelled() => { stop = true; break },
                }
                metrics::counter!("tidemark_sse_wakeups_total").increment(1);
                match wake.next(q.after) {
                    tidemark_consumers::streams::Next::Events { mut events, upto } => {
                        for ev in &mut events {
                            // As a read of the log redacts it (`Queries::events`).
                            tidemark_projections::bridges::redact_secret(ev);
                            yield Ok(sse_event(ev));
                        }
                        q.after = upto;
                    }
                    tidemark_consumers::streams::Next::Nothing => {}
                    tidemark_consumers::streams::Next::ReadLog => break,
                }
            }
            if stop {
                break;
            }
        }
    };
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(keepalive)))
}

/// One event as a stream sends it: `id: <seq>`, `event: <type>`, `data: <envelope>`.
fn sse_event(ev: &tidemark_log::Event) -> SseEvent {
    let data = serde_json::to_string(ev).unwrap_or_default();
    SseEvent::default()
        .id(ev.seq.to_string())
        .event(ev.event_type.clone())
        .data(data)
}

struct SseGauge;

impl SseGauge {
    fn new() -> Self {
        metrics::gauge!("tidemark_sse_clients").increment(1.0);
        SseGauge
    }
}

impl Drop for SseGauge {
    fn drop(&mut self) {
        metrics::gauge!("tidemark_sse_clients").decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn outcome(r: Result<Vec<NewEvent>, ApiError>) -> String {
        match r {
            Ok(evs) => evs
                .iter()
                .map(|e| {
                    format!(
                        "{:?}|{}|{}|{}|{}",
                        e.event_id,
                        e.stream,
                        e.subject,
                        e.event_type,
                        String::from_utf8_lossy(e.payload_bytes())
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Err(e) => format!("{} {:?}", e.status, e.problem),
        }
    }

    fn one_of(values: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
        prop::option::weighted(0.8, prop::sample::select(values).prop_map(str::to_owned))
    }

    /// An event's fields, each present or not, mostly well-formed.
    fn event() -> impl Strategy<Value = String> {
        (
            one_of(&[
                r#""event_id":"e-1""#,
                r#""event_id":"n1""#,
                r#""event_id":"dlv:x""#,
                r#""event_id":"ntf:n1""#,
                r#""event_id":null"#,
                r#""event_id":7"#,
            ]),
            one_of(&[
                r#""stream":"orders""#,
                r#""stream":"notifications""#,
                r#""stream":"Bad""#,
            ]),
            one_of(&[
                r#""subject":"n1""#,
                r#""subject":"a\u0007""#,
                r#""subject":"""#,
            ]),
            one_of(&[
                r#""type":"order.placed""#,
                r#""type":"notification.requested""#,
                r#""type":"delivery.sent""#,
                r#""type":"task.created""#,
            ]),
            one_of(&[
                r#""payload":{"a":1,"b":"x"}"#,
                r#""payload":{"b":1,"a":[1,2.5,"x"]}"#,
                r#""payload":{"a":1,"b":"\u0041"}"#,
                r#""payload":{ "a" : 1 }"#,
                r#""payload":{"priority":"info","recipient":"u1","title":"Hi"}"#,
                r#""payload":{"recipient":"u1","title":"Hi"}"#,
                r#""payload":[1]"#,
                r#""payload":null"#,
                r#""payload":{"a":1,"a":2}"#,
            ]),
            prop::option::weighted(0.1, Just(r#""extra":1"#.to_owned())),
            any::<bool>(),
        )
            .prop_map(|(id, stream, subject, ty, payload, extra, reversed)| {
                let mut f: Vec<String> = [id, stream, subject, ty, payload, extra]
                    .into_iter()
                    .flatten()
                    .collect();
                if reversed {
                    f.reverse();
                }
                format!("{{{}}}", f.join(","))
            })
    }

    fn body() -> impl Strategy<Value = String> {
        prop_oneof![
            event(),
            prop::collection::vec(event(), 0..4)
                .prop_map(|e| format!(r#"{{"events":[{}]}}"#, e.join(","))),
            prop::collection::vec(event(), 1..3)
                .prop_map(|e| format!(r#" {{ "events" : [ {} ] , "x":1}}"#, e.join(" , "))),
            event().prop_map(|e| format!("[{e}]")),
            Just(r#"["e","orders","","order.placed",{}]"#.to_owned()),
            (95usize..135, any::<bool>()).prop_map(|(n, batch)| {
                let payload = format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
                let event =
                    format!(r#"{{"stream":"orders","type":"order.placed","payload":{payload}}}"#);
                if batch {
                    format!(r#"{{"events":[{event}]}}"#)
                } else {
                    event
                }
            }),
        ]
    }

    proptest! {
        /// Read once or the long way, every body gets the same answer: the same events with
        /// the same stored payload bytes, or the same error.
        #[test]
        fn reading_once_answers_as_the_long_way(body in body()) {
            let once = parse_once(body.as_bytes());
            let long = outcome(parse_the_long_way(body.as_bytes()));
            if let Some(evs) = once {
                prop_assert_eq!(outcome(Ok(evs)), long.clone());
            }
            prop_assert_eq!(outcome(parse_append_body(body.as_bytes())), long);
        }
    }

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

    #[test]
    fn the_common_body_is_read_once() {
        for body in [
            r#"{"stream":"orders","subject":"o1","type":"order.placed","payload":{"a":1,"b":"x"}}"#,
            r#"{"events":[{"event_id":"e1","stream":"orders","type":"order.placed"}]}"#,
            r#"{"stream":"notifications","subject":"n1","type":"notification.requested","payload":{"priority":"info","recipient":"u1","title":"Hi"}}"#,
        ] {
            assert!(parse_once(body.as_bytes()).is_some(), "{body}");
        }
    }
}
