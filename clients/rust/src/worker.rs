//! A sink's claim loop: claim up to `limit` due deliveries, run the caller's handler on each
//! while a heartbeat extends the leases, then report each done (in one batch) or failed with
//! the handler's reason and wait. On shutdown it claims no more, lets the running handlers
//! finish, and hands the rows it had not started back at once (a retryable failure with no
//! wait, coded `worker_stopped`: the row counts an attempt) instead of leaving them leased
//! until their leases expire.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{Client, Delivery, Error};

/// What a handler made of one delivery.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Delivered (reported with `complete`).
    Done,
    /// Not delivered (reported with `fail`).
    Failed(Failure),
}

/// Why a delivery failed, as `POST /v1/deliveries/{id}/fail` takes it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// A stable code (`timeout`, `receiver_refused`, …).
    pub code: String,
    pub message: Option<String>,
    /// False parks the delivery at once.
    pub retryable: bool,
    /// Retry after this instead of the server's backoff (a receiver's `Retry-After`).
    pub retry_after: Option<Duration>,
}

impl Failure {
    /// A retryable failure with the server's backoff.
    pub fn retry(code: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            code: code.into(),
            message: Some(message.into()),
            retryable: true,
            retry_after: None,
        }
    }

    /// A failure that parks the delivery.
    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            code: code.into(),
            message: Some(message.into()),
            retryable: false,
            retry_after: None,
        }
    }
}

/// How a worker claims.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Who holds the leases.
    pub owner: String,
    /// Deliveries per claim (1–1000).
    pub limit: u32,
    /// Lease length; the heartbeat extends it every third of it.
    pub lease: Duration,
    /// How long to wait before claiming again when nothing was due.
    pub idle: Duration,
}

impl WorkerOptions {
    pub fn new(owner: impl Into<String>) -> Self {
        WorkerOptions {
            owner: owner.into(),
            limit: 10,
            lease: Duration::from_secs(30),
            idle: Duration::from_millis(250),
        }
    }
}

/// What a worker did, when it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    pub completed: u64,
    pub failed: u64,
    /// Handed back unstarted at shutdown.
    pub released: u64,
    /// Reports the server refused (a lease lost to expiry, say).
    pub refused: u64,
}

/// See the module's documentation.
pub struct Worker {
    client: Client,
    sink: String,
    opts: WorkerOptions,
}

impl Worker {
    pub(crate) fn new(client: Client, sink: &str, opts: WorkerOptions) -> Worker {
        Worker {
            client,
            sink: sink.to_owned(),
            opts,
        }
    }

    /// Claim and handle until `shutdown`. Handlers of one claim run one after another.
    pub async fn run<H, F>(
        &self,
        mut handler: H,
        shutdown: CancellationToken,
    ) -> Result<WorkerReport, Error>
    where
        H: FnMut(Delivery) -> F,
        F: Future<Output = Outcome>,
    {
        let o = &self.opts;
        let mut report = WorkerReport::default();
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            let claimed = tokio::select! {
                c = self.client.claim(&self.sink, &o.owner, o.limit.clamp(1, 1000), o.lease) => c,
                () = shutdown.cancelled() => break,
            };
            let rows = match claimed {
                Ok(r) => {
                    failures = 0;
                    r
                }
                Err(e) if e.is_retryable() => {
                    failures = failures.saturating_add(1);
                    let wait = crate::backoff(
                        failures - 1,
                        Duration::from_millis(100),
                        Duration::from_secs(10),
                    );
                    let wait = match &e {
                        Error::Api(p) => p.retry_after.map_or(wait, |a| a.max(wait)),
                        _ => wait,
                    };
                    tokio::select! {
                        () = tokio::time::sleep(wait) => continue,
                        () = shutdown.cancelled() => break,
                    }
                }
                Err(e) => return Err(e),
            };
            if rows.is_empty() {
                tokio::select! {
                    () = tokio::time::sleep(o.idle) => continue,
                    () = shutdown.cancelled() => break,
                }
            }
            // The heartbeat: every lease still held is extended every third of its length.
            let held: Arc<Mutex<Vec<String>>> =
                Arc::new(Mutex::new(rows.iter().map(|d| d.id.clone()).collect()));
            let beat = CancellationToken::new();
            let heartbeat = tokio::spawn(heartbeat(
                self.client.clone(),
                o.owner.clone(),
                o.lease,
                held.clone(),
                beat.clone(),
            ));
            let mut done: Vec<String> = Vec::new();
            let mut rows = rows.into_iter();
            for d in rows.by_ref() {
                let id = d.id.clone();
                match handler(d).await {
                    Outcome::Done => done.push(id),
                    Outcome::Failed(f) => {
                        match retried(|| self.client.fail(&id, &o.owner, &f)).await {
                            Ok(_) => report.failed += 1,
                            Err(_) => report.refused += 1,
                        }
                        drop_held(&held, &id);
                    }
                }
                if shutdown.is_cancelled() {
                    break;
                }
            }
            // Unstarted rows go back at once.
            for d in rows {
                let f = Failure {
                    code: "worker_stopped".into(),
                    message: Some("the worker stopped before it started this delivery".into()),
                    retryable: true,
                    retry_after: Some(Duration::ZERO),
                };
                match retried(|| self.client.fail(&d.id, &o.owner, &f)).await {
                    Ok(_) => report.released += 1,
                    Err(_) => report.refused += 1,
                }
                drop_held(&held, &d.id);
            }
            if !done.is_empty() {
                let ids: Vec<&str> = done.iter().map(String::as_str).collect();
                // The server may be restarting: a completion is safe to repeat (a sent row
                // answers the same), so it is sent until it is answered.
                let results = retried(|| self.client.complete(&o.owner, &ids)).await;
                match results {
                    Ok(rs) => {
                        for r in rs {
                            if r.status == 200 {
                                report.completed += 1;
                            } else {
                                report.refused += 1;
                            }
                        }
                    }
                    Err(e) => {
                        beat.cancel();
                        let _ = heartbeat.await;
                        return Err(e);
                    }
                }
            }
            beat.cancel();
            let _ = heartbeat.await;
        }
        Ok(report)
    }
}

/// `call`, retried as a report may be: it is safe to repeat, and the server may be
/// restarting (any `Retry-After` is waited out).
async fn retried<T, F, Fut>(call: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    crate::Retry {
        attempts: 12,
        max_retry_after: Duration::MAX,
        ..crate::Retry::default()
    }
    .run(call)
    .await
}

fn drop_held(held: &Mutex<Vec<String>>, id: &str) {
    held.lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|h| h != id);
}

async fn heartbeat(
    client: Client,
    owner: String,
    lease: Duration,
    held: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
) {
    let every = (lease / 3).max(Duration::from_millis(50));
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        let ids = held.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for id in ids {
            if stop.is_cancelled() {
                return;
            }
            let _ = client.extend(&id, &owner, lease).await;
        }
    }
}
