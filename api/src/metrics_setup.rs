//! The Prometheus recorder, installed once per process.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("duration_seconds".into()),
                    &[
                        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                        0.25, 0.5, 1.0, 2.5, 5.0,
                    ],
                )
                .map(|b| b.build_recorder());
            match recorder {
                Ok(r) => {
                    let h = r.handle();
                    // Another recorder may already be installed (embedding); then ours only
                    // renders what it was given.
                    let _ = metrics::set_global_recorder(r);
                    h
                }
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

pub fn describe() {
    metrics::describe_counter!(
        "tidemark_source_polls_total",
        "Source polls by source and outcome (ok, retry_after, error, unauthorized, parked, not_active)"
    );
    metrics::describe_counter!(
        "tidemark_source_items_total",
        "Items a source appended (items already in the log not counted)"
    );
    metrics::describe_histogram!(
        "tidemark_source_poll_duration_seconds",
        "Duration of one source poll (all its pages), seconds"
    );
    metrics::describe_gauge!(
        "tidemark_source_seconds_since_success",
        "Seconds since the source's last successful poll (since the start before the first)"
    );
    metrics::describe_gauge!(
        "tidemark_source_stale",
        "1 when the source has not succeeded for three intervals"
    );
    metrics::describe_counter!(
        "tidemark_events_appended_total",
        "Events appended (duplicates not counted)"
    );
    metrics::describe_counter!(
        "tidemark_events_duplicate_total",
        "Appended events that were duplicates of an event already in the log"
    );
    metrics::describe_histogram!(
        "tidemark_append_duration_seconds",
        "Time from receiving an append request to its durable reply"
    );
    metrics::describe_gauge!("tidemark_sse_clients", "Open SSE streams");
    metrics::describe_gauge!("tidemark_log_head", "Highest committed event_seq");
    metrics::describe_gauge!(
        "tidemark_log_queue_depth",
        "Append requests waiting for the log writer (429 when full)"
    );
    metrics::describe_counter!(
        "tidemark_http_requests_total",
        "HTTP requests by route and status"
    );
    metrics::describe_histogram!(
        "tidemark_http_request_duration_seconds",
        "HTTP request latency by route"
    );
}
