//! The Prometheus recorder, installed once per process.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            // Every histogram is in seconds (`*_seconds`) but the commit size.
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("tidemark_log_commit_items".into()),
                    &[
                        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0, 4096.0,
                    ],
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Suffix("_seconds".into()),
                        &[
                            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                            0.25, 0.5, 1.0, 2.5, 5.0,
                        ],
                    )
                })
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
    for (name, help) in [
        (
            "tidemark_bridge_confirmed_total",
            "Bridge deliveries confirmed (acked), advancing their subscription's cursor",
        ),
        (
            "tidemark_bridge_mismatches_total",
            "Terminal-state mismatches recorded by the bridge notifier",
        ),
        (
            "tidemark_bridge_nacks_total",
            "Bridge deliveries refused by their sink (nack)",
        ),
        (
            "tidemark_bridge_webhook_failures_total",
            "Webhook deliveries that failed and will be retried",
        ),
        (
            "tidemark_bridge_subscriptions_created_total",
            "Bridge subscriptions created",
        ),
        (
            "tidemark_commands_total",
            "Engine commands by command and result (ok, refused, error)",
        ),
        ("tidemark_cursor_advances_total", "Cursor advances recorded"),
        (
            "tidemark_cursor_resets_total",
            "Cursor resets recorded (admin)",
        ),
        (
            "tidemark_deliveries_failed_total",
            "Delivery attempts reported failed",
        ),
        (
            "tidemark_deliveries_leased_total",
            "Deliveries leased by claims",
        ),
        (
            "tidemark_deliveries_operator_total",
            "Operator retries and discards of parked deliveries",
        ),
        (
            "tidemark_deliveries_sent_total",
            "Deliveries completed (sent)",
        ),
        (
            "tidemark_delivery_leases_expired_total",
            "Delivery leases released after they expired",
        ),
        (
            "tidemark_delivery_routing_events_total",
            "Events appended by delivery routing (created, joined, cancelled)",
        ),
        (
            "tidemark_follower_events_read_total",
            "Events the reactors' follower read from the log itself (catching up)",
        ),
        (
            "tidemark_follower_events_shared_total",
            "Events the reactors' follower took from the decider's read of them",
        ),
        (
            "tidemark_follower_commits_passed_over_total",
            "Commits handed on with nothing for any reactor: the follower was not woken",
        ),
        (
            "tidemark_notification_status_reads_total",
            "Notification status records served",
        ),
        (
            "tidemark_notifications_blocked_total",
            "Notifications refused for a suppressed recipient (crisis block)",
        ),
        (
            "tidemark_outbox_refused_total",
            "Requests refused because the outbox was full",
        ),
        (
            "tidemark_rate_limited_total",
            "Requests refused by a token's rate limit",
        ),
        (
            "tidemark_reads_lagging_total",
            "Reads answered before the read models reached the requested seq",
        ),
        (
            "tidemark_log_compacted_events_total",
            "Events compaction dropped from the log",
        ),
        (
            "tidemark_retention_purged_total",
            "Rows retention removed from the read models, by kind",
        ),
        (
            "tidemark_router_notifications_total",
            "Notifications derived from lifecycle events by the router",
        ),
        (
            "tidemark_source_notifications_generated_total",
            "Notifications a source's poll cycles appended (one per cycle with new items)",
        ),
        (
            "tidemark_source_notifications_blocked_total",
            "Source notifications left out for a suppressed recipient",
        ),
        (
            "tidemark_source_operator_total",
            "Operator actions on sources (poll, pause, resume, reset)",
        ),
        (
            "tidemark_sse_wakeups_total",
            "Times a caught-up live stream was woken (only by a commit holding an event it \
             shows)",
        ),
        (
            "tidemark_sse_log_reads_total",
            "Pages live streams read from the log themselves (replays, and catching up after \
             falling behind; a caught-up stream takes its events from the follower's page)",
        ),
    ] {
        metrics::describe_counter!(name, help);
    }
    for (name, help) in [
        (
            "tidemark_bridge_notifier_dirty_subscriptions",
            "Subscriptions the bridge notifier looked at in its last pass",
        ),
        (
            "tidemark_bridge_subscriptions_deferring",
            "Subscriptions whose next delivery is deferred (review pending)",
        ),
        (
            "tidemark_bridge_subscriptions_stopped",
            "Bridge subscriptions the notifier holds stopped at a terminal-state mismatch, as of \
             its last pass (tidemark_consumer_cursors_stopped counts the same at scrape time)",
        ),
        (
            "tidemark_bridge_webhooks_retrying",
            "Webhook subscriptions waiting to retry",
        ),
        ("tidemark_consumer_cursors", "Consumer cursors"),
        (
            "tidemark_consumer_cursors_behind",
            "Consumer cursors behind the head of what they follow",
        ),
        (
            "tidemark_consumer_cursors_stalled",
            "Consumer cursors with work to deliver now (a bridge subscription: what its explain \
             would deliver) and no progress for outbox.stuck_after (a subscription waiting on a \
             running or review-gated task is not counted)",
        ),
        (
            "tidemark_consumer_cursors_stopped",
            "Bridge subscriptions stopped at a terminal-state mismatch (counted at once; they \
             resume when the task is repaired or the cursor is reset)",
        ),
        (
            "tidemark_consumer_lag_events_max",
            "Events the furthest-behind cursor has yet to deliver",
        ),
        (
            "tidemark_consumer_lag_seconds_max",
            "Longest time any cursor's deliverable work has waited (since the later of its last \
             progress and the first event it has to deliver), seconds",
        ),
        (
            "tidemark_outbox_queue_depth",
            "Deliveries queued, leased or waiting to retry, by sink",
        ),
        (
            "tidemark_outbox_stuck",
            "Deliveries not terminal and due (next attempt time passed, or lease expired) for \
             longer than outbox.stuck_after, by sink; deliveries scheduled for later are not \
             counted",
        ),
        ("tidemark_outbox_parked", "Parked deliveries, by sink"),
        (
            "tidemark_outbox_sent_last_interval",
            "Deliveries sent in the last 60 s, by sink",
        ),
        (
            "tidemark_outbox_oldest_pending_age_seconds",
            "Age of the oldest pending delivery, by sink, seconds",
        ),
        (
            "tidemark_projection_identical",
            "1 when the last verify of the projection found it identical",
        ),
        (
            "tidemark_projection_lag_events",
            "Events committed but not yet folded, by projection",
        ),
        (
            "tidemark_source_last_success_timestamp_seconds",
            "Unix time of the source's last successful poll",
        ),
        (
            "tidemark_log_first_seq",
            "The first seq the log holds (after compaction)",
        ),
        (
            "tidemark_build_info",
            "Build information (version and commit labels), always 1",
        ),
        (
            "tidemark_log_disk_free_bytes",
            "Bytes free on the disk of the log (a JetStream node: of its replica)",
        ),
        (
            "tidemark_storage_state",
            "The log's storage state: 1 for the state it is in (ok; full: appends refused until space returns; poisoned: until a restart)",
        ),
        (
            "tidemark_models_poisoned",
            "1 when the decider panicked: commands are refused until a restart",
        ),
        (
            "process_resident_memory_bytes",
            "Resident memory of the process, bytes",
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory of the process, bytes",
        ),
        (
            "process_cpu_seconds_total",
            "CPU time the process has used, user and system, seconds",
        ),
        ("process_open_fds", "File descriptors the process has open"),
        (
            "process_max_fds",
            "The process's limit on open file descriptors",
        ),
        ("process_threads", "Threads of the process"),
        (
            "process_start_time_seconds",
            "When the process started, Unix seconds",
        ),
        (
            "tidemark_sink_attempts_total",
            "Delivery attempts by tidemark's own sinks (email, webhook), by sink and outcome",
        ),
        (
            "tidemark_sink_in_flight",
            "Deliveries tidemark's own sinks are sending now, by sink",
        ),
        (
            "tidemark_commands_redecided_total",
            "Command decisions the log refused on a failed condition, each decided again",
        ),
        (
            "tidemark_backups_total",
            "Backups taken through the server, by outcome (ok; refused: the request's to change, \
             e.g. backup_exists, past_head; failed: the server's)",
        ),
        (
            "tidemark_backup_last_through_seq",
            "The through_seq of the last backup taken through the server (0: none yet)",
        ),
        (
            "tidemark_backup_last_success_timestamp_seconds",
            "Unix time of the last backup taken through the server that succeeded (0: never)",
        ),
        (
            "tidemark_projection_follower_lag_events",
            "Events the projection follower had yet to fold after its last batch",
        ),
        (
            "tidemark_endpoint_state",
            "Each delivering route's endpoint: 1 for the state it is in (ok, failing, open, \
             disabled, unresolved), 0 for the others",
        ),
        (
            "tidemark_endpoint_consecutive_failures",
            "Failed attempts in a row of each delivering route's endpoint (its circuit opens at \
             circuit.failures)",
        ),
    ] {
        metrics::describe_gauge!(name, help);
    }
    for (name, help) in [
        (
            "tidemark_bridge_notifier_pass_seconds",
            "Duration of one bridge notifier pass, seconds",
        ),
        (
            "tidemark_projection_batch_seconds",
            "Duration of folding one follower batch, seconds",
        ),
        (
            "tidemark_rebuild_duration_seconds",
            "Duration of a projection rebuild or verify, seconds",
        ),
        (
            "tidemark_log_commit_duration_seconds",
            "Duration of one group commit of the log writer (write and fsync), seconds",
        ),
        (
            "tidemark_log_fsync_duration_seconds",
            "Duration of the durable sync of one group commit, seconds",
        ),
        (
            "tidemark_log_lag_wait_seconds",
            "Time an appender waited for the indexer because memory held its bound of \
             groups redb did not have yet, seconds",
        ),
        (
            "tidemark_log_index_commit_seconds",
            "Duration of one commit of the log's indexer into redb, by kind (events: \
             not durable; checkpoint: durable; merge: the index tail merged, durable), seconds",
        ),
        (
            "tidemark_log_commit_items",
            "Requests (appends and commands) in one group commit",
        ),
        (
            "tidemark_sink_attempt_seconds",
            "Duration of one delivery attempt by tidemark's own sinks, by sink",
        ),
    ] {
        metrics::describe_histogram!(name, help);
    }

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
    metrics::describe_gauge!(
        "tidemark_source_backpressure",
        "1 while the source waits for the outbox to drain below its backpressure_threshold"
    );
    metrics::describe_counter!(
        "tidemark_endpoint_switches_total",
        "Endpoints disabled or enabled by an operator, by action"
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

/// The process's own figures (section 18), read from `/proc` at each scrape (Linux; elsewhere
/// nothing is set): resident and virtual memory, CPU seconds, open and allowed file
/// descriptors, threads, start time.
pub fn process_metrics() {
    use nix::unistd::{SysconfVar, sysconf};
    let ticks = sysconf(SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let page = sysconf(SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as f64;
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // The fields after the command name (which may hold spaces), from field 3 on.
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<f64>().ok());
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            metrics::gauge!("process_cpu_seconds_total").set((utime + stime) / ticks);
        }
        if let Some(t) = field(20) {
            metrics::gauge!("process_threads").set(t);
        }
        if let Some(v) = field(23) {
            metrics::gauge!("process_virtual_memory_bytes").set(v);
        }
        if let Some(r) = field(24) {
            metrics::gauge!("process_resident_memory_bytes").set(r * page);
        }
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
        if let (Some(boot), Some(start)) = (boot, field(22)) {
            metrics::gauge!("process_start_time_seconds").set(boot + start / ticks);
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        metrics::gauge!("process_open_fds").set(fds.count() as f64);
    }
    if let Ok((soft, _)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        metrics::gauge!("process_max_fds").set(soft as f64);
    }
}

/// Metrics kept as gauges (their value is read, not counted: the metrics crate's counters hold
/// whole numbers) that are counters in Prometheus's sense, and typed so on `/metrics`, as
/// Prometheus's own process collector types them (`rate()` then works without a warning).
const COUNTERS_KEPT_AS_GAUGES: [&str; 1] = ["process_cpu_seconds_total"];

/// The exposition text of `handle`, with the types of [`COUNTERS_KEPT_AS_GAUGES`] corrected.
pub fn render(handle: &metrics_exporter_prometheus::PrometheusHandle) -> String {
    let mut text = handle.render();
    for name in COUNTERS_KEPT_AS_GAUGES {
        text = text.replace(
            &format!("# TYPE {name} gauge\n"),
            &format!("# TYPE {name} counter\n"),
        );
    }
    text
}
