//! Appends that retry safely: every event carries its id before the first send, so sending
//! the same batch again after a lost answer, a 5xx or a 429 is answered with the seqs it
//! already has (`duplicate: true`) and never appends twice.

use std::time::Duration;

use reqwest::Method;

use crate::{AppendReceipt, Client, Error, NewEvent};

/// How an append retries.
#[derive(Debug, Clone)]
pub struct Retry {
    /// Sends in all, the first included (at least 1).
    pub attempts: u32,
    /// The first wait; doubled each time, jittered.
    pub base: Duration,
    /// The longest wait the client picks itself.
    pub max: Duration,
    /// The longest `Retry-After` honoured; a longer one ends the retries with the problem.
    pub max_retry_after: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: 8,
            base: Duration::from_millis(100),
            max: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl Retry {
    /// `call` again while it fails with what a retry may fix (a lost connection, a 5xx, a 408,
    /// a 429), after the server's `Retry-After` or a jittered backoff, at most `attempts`
    /// times; a `Retry-After` beyond `max_retry_after` ends the retries with the problem.
    pub async fn run<T, F, Fut>(&self, mut call: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let mut attempt = 0;
        loop {
            let err = match call().await {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            attempt += 1;
            if !err.is_retryable() || attempt >= self.attempts.max(1) {
                return Err(err);
            }
            let wait = match &err {
                Error::Api(p) => match p.retry_after {
                    Some(w) if w > self.max_retry_after => return Err(err),
                    Some(w) => w,
                    None => crate::backoff(attempt - 1, self.base, self.max),
                },
                _ => crate::backoff(attempt - 1, self.base, self.max),
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// No retries.
    pub fn none() -> Retry {
        Retry {
            attempts: 1,
            ..Retry::default()
        }
    }
}

impl Client {
    /// Append `events` atomically (`POST /v1/events`), giving each one without an `event_id` a
    /// new UUIDv7 first. What is safe to retry is retried with the same ids ([`Retry`]): a
    /// retry of a batch that landed is answered as duplicates with the original seqs. A
    /// problem that is the caller's to fix (4xx but 408 and 429) is returned at once.
    pub async fn append(
        &self,
        events: impl IntoIterator<Item = NewEvent>,
    ) -> Result<AppendReceipt, Error> {
        let events: Vec<NewEvent> = events
            .into_iter()
            .map(|mut e| {
                if e.event_id.is_none() {
                    e.event_id = Some(uuid::Uuid::now_v7().to_string());
                }
                e
            })
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({ "events": events }))
            .map_err(|e| Error::Decode(format!("the events do not encode: {e}")))?;
        self.retry
            .run(|| async {
                let sent = self
                    .request(Method::POST, "/v1/events")
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .map_err(Error::Transport)?;
                crate::read::<AppendReceipt>(sent).await
            })
            .await
    }
}
