//! A bridge's cursor loop: read the events after the stored cursor, hand the page to the
//! caller's handler, and advance the cursor only after the handler returned `Ok`. After a
//! crash anywhere (of the caller, between the handler and the advance, or of the server) it
//! resumes from the stored cursor: every event is handled at least once, in seq order, and a
//! page whose handler returned is never handled again once its advance was answered.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{Client, Error, Event};

/// Whose cursor over what.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    pub consumer_id: String,
    /// The log stream the cursor follows (`notifications`, `tasks`, …).
    pub stream_name: String,
    /// One subject of it, or "" for the whole stream.
    pub subject_id: String,
    /// Events per page (1–1000).
    pub page: u32,
    /// How long to wait before looking again when nothing is new.
    pub idle: Duration,
}

impl ConsumerOptions {
    /// A cursor of `consumer_id` over the whole of `stream_name`, pages of 100.
    pub fn new(consumer_id: impl Into<String>, stream_name: impl Into<String>) -> Self {
        ConsumerOptions {
            consumer_id: consumer_id.into(),
            stream_name: stream_name.into(),
            subject_id: String::new(),
            page: 100,
            idle: Duration::from_millis(250),
        }
    }

    /// Only `subject` of the stream.
    #[must_use]
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject_id = subject.into();
        self
    }
}

/// See the module's documentation.
pub struct Consumer {
    client: Client,
    opts: ConsumerOptions,
}

impl Consumer {
    pub(crate) fn new(client: Client, opts: ConsumerOptions) -> Consumer {
        Consumer { client, opts }
    }

    /// Run until `shutdown`: each page to `handler`, the cursor advanced after it returns
    /// `Ok`. A handler's `Err` is retried on the same page after a backoff (the cursor stays);
    /// a failing call to the server is retried the same way. Answers the seq the cursor
    /// stands at when it stops, or a problem no retry fixes (a bad consumer id, a missing
    /// scope).
    pub async fn run<H, F, E>(
        &self,
        mut handler: H,
        shutdown: CancellationToken,
    ) -> Result<u64, Error>
    where
        H: FnMut(Vec<Event>) -> F,
        F: Future<Output = Result<(), E>>,
    {
        let o = &self.opts;
        let subject = (!o.subject_id.is_empty()).then_some(o.subject_id.as_str());
        let mut at: Option<u64> = None;
        let mut failures = 0u32;
        loop {
            if shutdown.is_cancelled() {
                return Ok(at.unwrap_or(0));
            }
            let step = async {
                let cursor = match at {
                    Some(c) => c,
                    None => {
                        self.client
                            .cursor(&o.consumer_id, &o.stream_name, &o.subject_id)
                            .await?
                            .last_sequence
                    }
                };
                at = Some(cursor);
                let page = self
                    .client
                    .events(cursor, Some(&o.stream_name), subject, o.page.clamp(1, 1000))
                    .await?;
                let Some(top) = page.events.last().map(|e| e.seq) else {
                    return Ok::<_, Error>(false);
                };
                if handler(page.events).await.is_err() {
                    // Not advanced: the same page again after the wait.
                    return Err(Error::Decode("the handler failed".into()));
                }
                let delivery_id = format!("client:{top}");
                match self
                    .client
                    .advance_cursor(
                        &o.consumer_id,
                        &o.stream_name,
                        &o.subject_id,
                        top,
                        &delivery_id,
                        Some(cursor),
                    )
                    .await
                {
                    Ok(c) => at = Some(c.last_sequence),
                    // Moved meanwhile (another instance, an operator's reset): read it again.
                    Err(e) if e.status() == Some(reqwest::StatusCode::CONFLICT) => at = None,
                    Err(e) => {
                        // Unknown whether it landed: read the stored cursor again.
                        at = None;
                        return Err(e);
                    }
                }
                Ok(true)
            };
            let wait = match step.await {
                Ok(true) => {
                    failures = 0;
                    continue;
                }
                Ok(false) => {
                    failures = 0;
                    o.idle
                }
                Err(e)
                    if matches!(e, Error::Api(_))
                        && !e.is_retryable()
                        && e.status() != Some(reqwest::StatusCode::CONFLICT) =>
                {
                    return Err(e);
                }
                Err(_) => {
                    failures = failures.saturating_add(1);
                    crate::backoff(
                        failures - 1,
                        Duration::from_millis(100),
                        Duration::from_secs(10),
                    )
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return Ok(at.unwrap_or(0)),
            }
        }
    }
}
