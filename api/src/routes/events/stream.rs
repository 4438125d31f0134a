//! `GET /v1/events/stream` and the SSE response the task streams share: the log from a
//! resume point, then live, one bounded page at a time.

use crate::state::Api;
use std::convert::Infallible;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use tidemark_log::ReadQuery;

use super::read::{EventsQuery, StreamQuery, read_page};
use crate::error::{ApiError, Problem};
use crate::request::Params;

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
    st: Api,
    headers: HeaderMap,
    Params(q): Params<EventsQuery>,
) -> Result<Response, ApiError> {
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
pub(crate) async fn readable_from(st: &Api, q: &ReadQuery) -> Result<(), ApiError> {
    read_page(
        st.engine(),
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
    st: &Api,
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
    let engine = st.engine().clone();
    // The tenant's events alone, from the log and from the follower's pages alike.
    let q = ReadQuery {
        tenant: Some(engine.tenant().to_owned()),
        ..q
    };
    let shutdown = st.shutdown.clone();
    let streams = st.shard().streams.clone();
    // A tenant's stream ends when a move fences the tenant out of this shard (spec section
    // 20): its client resumes with its `Last-Event-ID`, which means the same in the new one
    // (a request waits for the switch at the tenant's gate).
    let placement = engine.placement().clone();
    let (shard, tenant) = (st.shard_number(), engine.tenant().to_owned());
    let mut moves = placement.changes();
    let fence_of = {
        let (engine, tenant) = (engine.clone(), tenant.clone());
        move || engine.fence_of(&tenant).unwrap_or(0)
    };
    let moved_away = move || {
        tidemark_log::tenant_of(&tenant).is_some()
            && (placement.shard_of(&tenant).is_some_and(|s| s != shard)
                || placement.fenced_from(&tenant, shard))
    };
    let keepalive = Duration::from_secs(st.config.server.keepalive_secs);
    let events = async_stream::stream! {
        let _permit = permit;
        let _gauge = SseGauge::new();
        let mut q = q;
        let mut wake = streams.watch(&q);
        loop {
            if moved_away() {
                break;
            }
            wake.mark_seen();
            metrics::counter!("tidemark_sse_log_reads_total").increment(1);
            let page = {
                let Ok(_turn) = STREAM_READS.acquire().await else { break };
                match read_page(&engine, q.clone()).await {
                    Ok(p) => p,
                    Err(_) => break,
                }
            };
            // On a cluster, what the stream orders after the tenant's fence is void: the
            // stream ends before it (read after the page, the replica holding it).
            let fence = fence_of();
            for ev in page.events.iter().filter(|e| fence == 0 || e.seq < fence) {
                yield Ok(sse_event(ev));
            }
            if fence > 0 {
                break;
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
                    _ = moves.changed() => if moved_away() { stop = true; break } else { continue },
                }
                metrics::counter!("tidemark_sse_wakeups_total").increment(1);
                match wake.next(q.after) {
                    tidemark_consumers::streams::Next::Events { mut events, upto } => {
                        for ev in &mut events {
                            // As a read of the log redacts it (`Queries::events`).
                            tidemark_projections::secrets::redact(ev);
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
