//! `GET /v1/events`: a page of the log after a seq, filtered, or newest first.

use crate::state::Api;
use axum::Json;
use serde::Deserialize;
use tidemark_engine::Engine;
use tidemark_log::{Event, ReadPage, ReadQuery};
use utoipa::IntoParams;

use super::EventsPage;
use crate::error::{ApiError, Problem};
use crate::request::Params;

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

    pub(super) fn to_read(&self, default_limit: usize) -> Result<ReadQuery, ApiError> {
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
            tenant: None,
            after,
            limit,
            stream: self.stream.clone(),
            subject: self.subject.clone(),
            event_type: self.event_type.clone(),
        })
    }
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
pub async fn list(st: Api, Params(q): Params<EventsQuery>) -> Result<Json<EventsPage>, ApiError> {
    let order = q.order()?;
    let rq = q.to_read(100)?;
    let before = match order {
        Order::Desc { before } => {
            let engine = st.engine().clone();
            return crate::routes::blocking(move || read_desc(&engine, &rq, before))
                .await
                .map(Json);
        }
        Order::Asc { before } => before,
    };
    let after = rq.after;
    let page = read_page(st.engine(), rq).await?;
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
