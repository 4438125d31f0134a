//! tidemark alone, beside the `queue` workload (spec section 11): `route` (how fast
//! `notification.requested` events become queued deliveries) and `deliver` (notifications
//! appended by 16 clients in batches of 100 until a webhook receiver on loopback got each:
//! notifications/s and p50/p99 from the append's send to the receipt).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};

use crate::http::{notification_requested, post_ok};
use crate::measure::{Counters, Percentiles, Proc, clock_ticks, new_histogram, round1, round3};
use crate::queue::{TIDEMARK_CONFIG, append_notifications, wait_queued};
use crate::targets::StartOpts;
use crate::targets::tidemark::TidemarkHttp;

/// `route`: how fast `notification.requested` events become queued deliveries.
#[derive(Serialize, Clone, serde::Deserialize, Debug)]
pub struct RouteResult {
    pub notifications: u64,
    /// From the first append's send until the last append's answer.
    pub append_seconds: f64,
    /// From the first append's send until every delivery was queued.
    pub seconds: f64,
    pub notifications_per_sec: f64,
    pub cpu_us_per_notification: f64,
    pub error: Option<String>,
}

/// `n` urgent notifications appended by 4 clients in batches of 1000; timed until the `app`
/// sink has them all queued.
pub async fn route(o: &StartOpts, n: u64) -> RouteResult {
    let mut out = RouteResult {
        notifications: n,
        append_seconds: 0.0,
        seconds: 0.0,
        notifications_per_sec: 0.0,
        cpu_us_per_notification: 0.0,
        error: None,
    };
    let Some((server, proc, before)) = start(o, TIDEMARK_CONFIG.into(), &mut out.error).await
    else {
        return out;
    };
    let t0 = Instant::now();
    let r = append_notifications(
        server.base(),
        server.client(),
        "r",
        n,
        |i| json!({"priority": "urgent", "title": format!("item {i}")}),
    )
    .await;
    out.append_seconds = round3(t0.elapsed().as_secs_f64());
    match r {
        Err(e) => out.error = Some(e),
        Ok(()) => {
            match wait_queued(server.base(), server.client(), n, Duration::from_secs(600)).await {
                Err(e) => out.error = Some(e),
                Ok(()) => {
                    let secs = t0.elapsed().as_secs_f64();
                    let used = proc.counters().since(before);
                    out.seconds = round3(secs);
                    out.notifications_per_sec = (n as f64 / secs).round();
                    out.cpu_us_per_notification =
                        round1(used.cpu_ticks as f64 / clock_ticks() * 1e6 / n as f64);
                }
            }
        }
    }
    crate::targets::Target::stop(server).await;
    out
}

/// `tidemark serve` with `config`, and the counters of its process tree before any work; a
/// failure to start goes to `error`.
async fn start(
    o: &StartOpts,
    config: String,
    error: &mut Option<String>,
) -> Option<(TidemarkHttp, Proc, Counters)> {
    match TidemarkHttp::start_with(o, "tidemark-http", Some(config)).await {
        Ok(server) => {
            let proc = Proc::Tree(server.pid());
            let before = proc.counters();
            Some((server, proc, before))
        }
        Err(e) => {
            *error = Some(e);
            None
        }
    }
}

/// `deliver`: notifications appended until a webhook receiver got each.
#[derive(Serialize, Clone, serde::Deserialize, Debug)]
pub struct DeliverResult {
    pub clients: usize,
    pub batch: usize,
    pub notifications: u64,
    pub received: u64,
    /// From the first append's send until the last notification was received.
    pub seconds: f64,
    pub notifications_per_sec: f64,
    /// Per notification, from its append's send to its receipt.
    pub latency_us: Percentiles,
    pub cpu_us_per_notification: f64,
    pub error: Option<String>,
}

/// The receiver: each POST's `notification_id` with the time it came.
async fn receiver(
    sent: Arc<dashmap_lite::Times>,
    hist: Arc<std::sync::Mutex<Histogram<u64>>>,
    got: Arc<AtomicU64>,
) -> Result<u16, String> {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let (sent, hist, got) = (sent.clone(), hist.clone(), got.clone());
            async move {
                let now = Instant::now();
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if let Some(at) = v["notification_id"]
                    .as_str()
                    .and_then(|id| id.strip_prefix("d-"))
                    .and_then(|i| i.parse::<u64>().ok())
                    .and_then(|i| sent.get(i))
                {
                    let _ = hist
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .record(crate::measure::micros(now.saturating_duration_since(at)).max(1));
                    got.fetch_add(1, Ordering::Relaxed);
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(port)
}

/// A fixed table of send times, one slot per notification (written once, read by the
/// receiver).
mod dashmap_lite {
    use std::sync::Mutex;
    use std::time::Instant;

    pub struct Times(Mutex<Vec<Option<Instant>>>);

    impl Times {
        pub fn new(n: usize) -> Times {
            Times(Mutex::new(vec![None; n]))
        }
        pub fn set(&self, from: u64, to: u64, at: Instant) {
            let mut v = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for i in from..to {
                if let Some(slot) = v.get_mut(i as usize) {
                    *slot = Some(at);
                }
            }
        }
        pub fn get(&self, i: u64) -> Option<Instant> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(i as usize)
                .copied()
                .flatten()
        }
    }
}

/// `n` notifications appended by `clients` clients in batches of `batch` to a server whose
/// urgent notifications go to a webhook route on a receiver in this process (the sink's
/// `concurrency` at its bound, 256); timed until the receiver got every one.
pub async fn deliver(o: &StartOpts, clients: usize, batch: usize, n: u64) -> DeliverResult {
    let mut out = DeliverResult {
        clients,
        batch,
        notifications: n,
        received: 0,
        seconds: 0.0,
        notifications_per_sec: 0.0,
        latency_us: Percentiles::default(),
        cpu_us_per_notification: 0.0,
        error: None,
    };
    let sent = Arc::new(dashmap_lite::Times::new(n as usize));
    let hist = Arc::new(std::sync::Mutex::new(new_histogram()));
    let got = Arc::new(AtomicU64::new(0));
    let port = match receiver(sent.clone(), hist.clone(), got.clone()).await {
        Ok(p) => p,
        Err(e) => {
            out.error = Some(e);
            return out;
        }
    };
    let config = format!(
        "{TIDEMARK_CONFIG}[notifications.routing]\nurgent = [\"dashboard\", \"hook\"]\n\
         [notifications.routes.hook]\nsink = \"webhook\"\nurl = \"http://127.0.0.1:{port}/hook\"\n\
         [sinks.webhook]\nconcurrency = 256\ntimeout = \"30s\"\n"
    );
    let Some((server, proc, before)) = start(o, config, &mut out.error).await else {
        return out;
    };
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (next, client, url, sent) = (
            next.clone(),
            server.client().clone(),
            format!("{}/v1/events", server.base()),
            sent.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let from = next.fetch_add(batch as u64, Ordering::Relaxed);
                if from >= n {
                    return Ok::<(), String>(());
                }
                let to = (from + batch as u64).min(n);
                let events: Vec<Value> = (from..to)
                    .map(|i| {
                        let payload = json!({"priority": "urgent", "title": format!("item {i}")});
                        notification_requested(&format!("d-{i}"), payload)
                    })
                    .collect();
                sent.set(from, to, Instant::now());
                post_ok(&client, &url, &json!({ "events": events }), "append").await?;
            }
        }));
    }
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => out.error = Some(e),
            Err(e) => out.error = Some(e.to_string()),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while got.load(Ordering::Relaxed) < n && Instant::now() < deadline && out.error.is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let used = proc.counters().since(before);
    out.received = got.load(Ordering::Relaxed);
    if out.received < n && out.error.is_none() {
        out.error = Some(format!("{} of {n} received after 600 s", out.received));
    }
    out.seconds = round3(secs);
    out.notifications_per_sec = (out.received as f64 / secs.max(1e-9)).round();
    out.latency_us = Percentiles::from(
        &*hist
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    out.cpu_us_per_notification =
        round1(used.cpu_ticks as f64 / clock_ticks() * 1e6 / out.received.max(1) as f64);
    crate::targets::Target::stop(server).await;
    out
}
