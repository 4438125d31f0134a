//! The bridge terminal notifier (spec section 6): for each active subscription, replay its
//! task's `task_events` past the subscription's cursor and decide deliver / defer / mismatch
//! for each terminal event against the task's current state.
//!
//! - deliver: a pull sink shows the envelope to `GET /v1/bridges/{bridge_id}/deliveries` until
//!   the bridge acks it; a webhook sink gets it POSTed (HMAC-signed). Only a confirmation moves
//!   the cursor ([`confirm`], a command that re-checks the decision inside the writer), and the
//!   scan then goes on.
//! - defer: scanned past, the cursor does not move for it.
//! - mismatch: the subscription stops there; one `notification.terminal_state_mismatch`
//!   (event id `mismatch:<subscription_id>:<seq>`) records it; the next replay after new task
//!   events or a cursor reset decides afresh.
//!
//! Commits wake the notifier; the wake-up is only a nudge, the log is the authority.

use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use tidemark_engine::CommandError;
use tidemark_engine::commands::bridges::{Confirm, ConfirmOne, Confirmation};
use tidemark_engine::{Engine, Lag, Queries, Stopped};
use tidemark_log::{AppendError, Event, EventLog, NewEvent, ReadQuery, StorageError};
use tidemark_projections::bridges::{self, Decision, Subscription};
use tidemark_projections::cursors::{self, Cursor};
use tidemark_projections::ids::SubscriptionId;
use tidemark_projections::names::{EventType, Stream, ids};

use tidemark_projections::tasks::Task;

mod acks;
mod hub;
mod notifier;

pub use acks::{pending_for_bridge, plan_acks};
pub use hub::PullHub;
pub(crate) use notifier::concerns;
pub use notifier::spawn;

/// Candidates examined per scan (explain lists at most this many).
pub const SCAN_LIMIT: usize = 1_000;

/// One event past the cursor and what the notifier decides for it.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub seq: u64,
    pub event_type: String,
    pub decision: Decision,
    pub reason: String,
}

/// A subscription's position: its cursor, and what the next step is.
#[derive(Debug, Clone)]
pub struct Scan {
    pub cursor: Cursor,
    /// Every terminal candidate past the cursor, in order, up to the first deliver or mismatch
    /// (or all of them when `all`).
    pub candidates: Vec<Candidate>,
    /// The event to deliver next, if the scan reached one before any mismatch.
    pub deliver: Option<Event>,
    /// The event the subscription is stopped at, with the reason.
    pub mismatch: Option<(Event, String)>,
    /// The task's latest_event_seq when scanned.
    pub task_seq: u64,
}

/// Replay `sub`'s task events past its cursor and decide (blocking: reads the log and the
/// read models).
pub fn scan(engine: &Engine, sub: &Subscription, all: bool) -> Result<Scan, StorageError> {
    scan_in(engine, engine.read(), sub, all)
}

/// [`scan`] reading the models through `q` (e.g. [`Queries::unwaited`]).
fn scan_in(
    engine: &Engine,
    q: &Queries,
    sub: &Subscription,
    all: bool,
) -> Result<Scan, StorageError> {
    let task_id = &sub.target.task_id;
    let cursor = q.cursor(
        &ids::bridge_consumer(sub.subscription_id.as_str()),
        Stream::TaskEvents.as_str(),
        task_id.as_str(),
    )?;
    let task: Option<Task> = q.task(task_id)?;
    let mut out = Scan {
        task_seq: task.as_ref().map(|t| t.latest_event_seq).unwrap_or(0),
        cursor,
        candidates: Vec::new(),
        deliver: None,
        mismatch: None,
    };
    // On a cluster, what the stream ordered after the tenant's fence out of this shard is void
    // (the models fold it; no bridge is told of it). Read after the task: the replica holds a
    // fence before anything the models folded after it.
    let fence = engine.fence_of(engine.tenant())?;
    let mut after = out.cursor.last_sequence;
    loop {
        let page = engine
            .log()
            .read(&ReadQuery {
                after,
                limit: 500,
                stream: Some(Stream::TaskEvents.into()),
                subject: Some(task_id.to_string()),
                // The subscription's tenant's task (another tenant's may share its id).
                tenant: Some(engine.tenant().to_owned()),
                ..ReadQuery::default()
            })
            .map_err(StorageError::of)?;
        for ev in page.events {
            // The task row and the events are read in two transactions: an event committed
            // between them is newer than the row it would be judged against (a false
            // mismatch). Judge only what the row has seen; the follower's next page brings the
            // rest.
            if task.as_ref().is_some_and(|t| ev.seq > t.latest_event_seq)
                || (fence > 0 && ev.seq > fence)
            {
                return Ok(out);
            }
            let (decision, reason) = bridges::decide(task.as_ref(), &ev);
            if decision == Decision::Skip {
                continue;
            }
            out.candidates.push(Candidate {
                seq: ev.seq,
                event_type: ev.event_type.clone(),
                decision: decision.clone(),
                reason: reason.clone(),
            });
            let stop = match decision {
                Decision::Deliver if out.deliver.is_none() && out.mismatch.is_none() => {
                    out.deliver = Some(ev);
                    true
                }
                Decision::Mismatch if out.deliver.is_none() && out.mismatch.is_none() => {
                    out.mismatch = Some((ev, reason));
                    true
                }
                _ => false,
            };
            if (stop && !all) || out.candidates.len() >= SCAN_LIMIT {
                return Ok(out);
            }
        }
        if page.next_after <= after || page.next_after >= page.head {
            return Ok(out);
        }
        after = page.next_after;
    }
}

/// Every cursor's lag (section 10), with each bridge subscription's judged by what its
/// notifier would do now: `stalled` only when its scan has an event to deliver that has waited
/// for `stuck_after_ms` since the latest of that event, the cursor's last progress and the
/// subscription's (re)creation, so a subscription waiting on a running or review-gated task is
/// not; `stopped` at once at a mismatch, with its reason; a deleted subscription's cursor has
/// nobody to deliver to and is neither. Never waits for the read models (section 7): it judges
/// what they have folded (a scan judges only events its task row has seen), and a subscription
/// it cannot judge is not flagged. Blocking: reads the log and the read models.
pub fn lags(
    engine: &Engine,
    now_us: i64,
    stuck_after_ms: u64,
) -> Result<Vec<Lag>, tidemark_engine::QueryError> {
    let q = engine.read().unwaited();
    let mut lags = q.lags(now_us, stuck_after_ms)?;
    for lag in &mut lags {
        let Some(sub_id) = ids::subscription_of_consumer(&lag.consumer_id).map(str::to_owned)
        else {
            continue;
        };
        let sub_id = sub_id.as_str();
        let judged = q
            .subscription(&SubscriptionId::new(sub_id))
            .and_then(
                |sub| match sub.filter(|s| s.active && s.target.task_id == lag.subject_id) {
                    Some(sub) => Ok(Some((scan_in(engine, &q, &sub, false)?, sub.updated_at_us))),
                    None => Ok(None),
                },
            );
        match judged {
            Ok(Some((scan, _))) if scan.mismatch.is_some() => {
                let since = scan.cursor.progress_at_us();
                let (ev, reason) = scan.mismatch.expect("checked");
                lag.stopped = Some(Stopped {
                    seq: ev.seq,
                    reason,
                });
                // Nothing to deliver, so not stalled; its lag in time is how long it has been
                // stopped: since the mismatch (or a later reset), not 0.
                lag.judge(None, None, now_us, stuck_after_ms);
                let since = since.map_or(ev.time_us, |p| p.max(ev.time_us));
                lag.lag_seconds = (now_us - since).max(0) as f64 / 1e6;
            }
            Ok(Some((scan, subscribed_at))) => {
                let progress = scan.cursor.progress_at_us().max(Some(subscribed_at));
                lag.judge(
                    scan.deliver.as_ref().map(|e| e.time_us),
                    progress,
                    now_us,
                    stuck_after_ms,
                );
                // Its endpoint holds it (section 17): it waits by design, and the endpoint's
                // own state and alert say so; the lag says why instead of "stalled".
                if scan.deliver.is_some()
                    && let Ok(Some(e)) = q.bridge_endpoint(&SubscriptionId::new(sub_id))
                    && let Some(why) = e.held_by()
                {
                    lag.stalled = false;
                    lag.held_by = Some(why);
                }
            }
            Ok(None) => lag.judge(None, None, now_us, stuck_after_ms),
            Err(e) => {
                tracing::debug!(error = %e, subscription = sub_id, "lag judged without a scan");
                lag.judge(None, None, now_us, stuck_after_ms);
            }
        }
    }
    Ok(lags)
}

/// Confirm deliveries in one command (one durable commit, one fold): inside the writer, each
/// re-reads its event and task, requires the decision to still be deliver and the cursor to be
/// where the caller saw it (or already there with this delivery id), and advances. Each item
/// is answered on its own; a refused item changes nothing.
pub async fn confirm_many(
    engine: &Engine,
    items: Vec<Confirmation>,
) -> Result<Vec<Result<Cursor, CommandError>>, CommandError> {
    let (results, _) = engine.execute(Confirm(items)).await?;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    metrics::counter!("tidemark_bridge_confirmed_total").increment(ok as u64);
    Ok(results)
}

/// Confirm delivery `seq` of `sub` ([`confirm_many`] of one). `Conflict` when the decision or
/// the cursor changed.
pub async fn confirm(
    engine: &Engine,
    sub: &Subscription,
    seq: u64,
    expected: Option<u64>,
) -> Result<Cursor, CommandError> {
    let c = Confirmation {
        subscription_id: sub.subscription_id.clone(),
        task_id: sub.target.task_id.clone(),
        seq,
        expected,
    };
    let (result, _) = engine.execute(ConfirmOne(c)).await?;
    metrics::counter!("tidemark_bridge_confirmed_total").increment(u64::from(result.is_ok()));
    result
}

/// Record a failed delivery attempt as the subscription cursor's `last_error`.
pub async fn record_failure(
    engine: &Engine,
    sub: &Subscription,
    error: &str,
    code: Option<&str>,
) -> Result<(), CommandError> {
    let ev = tidemark_engine::commands::cursors::failed_event(
        &ids::bridge_consumer(sub.subscription_id.as_str()),
        Stream::TaskEvents.as_str(),
        sub.target.task_id.as_str(),
        error,
        code,
        engine.now_us(),
    )?;
    // The subscription's tenant's event (spec section 20), as the cursor it is about.
    engine.append_own(vec![ev]).await?;
    Ok(())
}

/// Append the one mismatch event of (subscription, seq).
pub(crate) async fn record_mismatch(engine: &Engine, sub: &Subscription, ev: &Event, reason: &str) {
    let id = ids::mismatch(sub.subscription_id.as_str(), ev.seq);
    let payload = serde_json::json!({
        "subscription_id": sub.subscription_id,
        "seq": ev.seq,
        "detail": cursors::bound_error(&format!("{} at seq {}: {reason}", ev.event_type, ev.seq)),
    });
    let Ok(new) = NewEvent::new(
        Some(id),
        Stream::TaskEvents.as_str(),
        sub.target.task_id.as_str(),
        EventType::NotificationTerminalStateMismatch,
        &payload,
    ) else {
        return;
    };
    match engine.append_own(vec![new]).await {
        Ok(r) => {
            if r.events.iter().any(|e| !e.duplicate) {
                metrics::counter!("tidemark_bridge_mismatches_total").increment(1);
                tracing::warn!(subscription = %sub.subscription_id, seq = ev.seq, %reason, "terminal state mismatch");
            }
        }
        // Recorded earlier with another detail: it is recorded.
        Err(AppendError::Conflict { .. }) => {}
        Err(e) => tracing::warn!(error = %e, "recording a mismatch failed; will retry"),
    }
}

/// The signature headers of one webhook attempt (spec section 6), both HMAC-SHA256 under the
/// secret of `"<webhook-id>.<webhook-timestamp>.<body>"`: `webhook-signature: v1,<base64>` as
/// the Standard Webhooks specification writes it (so its stock libraries verify it), and
/// `tidemark-signature: v1=<hex>` for receivers written against earlier releases. The key is
/// the secret's UTF-8 bytes, or for a secret written `whsec_<base64>` (the form those libraries
/// take) the decoded bytes. The id and the time are signed with the body, so a receiver that
/// refuses old timestamps and seen ids cannot be replayed a captured request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signatures {
    /// The `webhook-signature` header.
    pub standard: String,
    /// The `tidemark-signature` header.
    pub legacy: String,
}

impl Signatures {
    pub fn new(secret: &str, webhook_id: &str, timestamp: u64, body: &[u8]) -> Signatures {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = secret
            .strip_prefix("whsec_")
            .and_then(|k| b64.decode(k).ok())
            .unwrap_or_else(|| secret.as_bytes().to_vec());
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes keys of any length");
        mac.update(webhook_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        let tag = mac.finalize().into_bytes();
        Signatures {
            standard: format!("v1,{}", b64.encode(tag)),
            legacy: format!("v1={}", hex::encode(tag)),
        }
    }
}

/// The wait a webhook receiver asks for with `429`/`503` and `Retry-After` (seconds or an HTTP
/// date, [`crate::retry_after::header`]), capped at an hour; `None` for other answers or a
/// header that is neither.
pub fn receiver_retry_after_ms(status: u16, retry_after: Option<&str>) -> Option<u64> {
    if status != 429 && status != 503 {
        return None;
    }
    let wait = crate::retry_after::header(retry_after?, std::time::SystemTime::now())?;
    Some(wait.as_millis().min(3_600_000) as u64)
}

#[cfg(test)]
mod webhook_tests {
    use super::*;

    #[test]
    fn a_receivers_retry_after_counts_on_429_and_503_only_and_is_capped() {
        assert_eq!(receiver_retry_after_ms(429, Some("2")), Some(2_000));
        assert_eq!(receiver_retry_after_ms(503, Some(" 30 ")), Some(30_000));
        assert_eq!(receiver_retry_after_ms(503, Some("86400")), Some(3_600_000));
        assert_eq!(receiver_retry_after_ms(500, Some("2")), None);
        assert_eq!(receiver_retry_after_ms(429, None), None);
        assert_eq!(receiver_retry_after_ms(429, Some("soon")), None);
        // An HTTP date: the wait until then (none once past), capped the same way.
        assert_eq!(
            receiver_retry_after_ms(429, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            Some(0)
        );
        let at = |s: u64| {
            httpdate::fmt_http_date(
                std::time::SystemTime::now() + std::time::Duration::from_secs(s),
            )
        };
        let ms = receiver_retry_after_ms(503, Some(&at(120))).unwrap();
        assert!((118_000..=120_000).contains(&ms), "{ms}");
        assert_eq!(
            receiver_retry_after_ms(503, Some(&at(86_400))),
            Some(3_600_000)
        );
    }

    #[test]
    fn the_signatures_cover_id_timestamp_and_body() {
        let sig = |k: &str, id: &str, t: u64, b: &[u8]| Signatures::new(k, id, t, b);
        let a = sig("k", "notif:s:1", 1_700_000_000, b"{}");
        assert!(
            a.legacy.starts_with("v1=") && a.legacy.len() == 3 + 64,
            "{a:?}"
        );
        assert!(
            a.standard.starts_with("v1,") && a.standard.len() == 3 + 44,
            "{a:?}"
        );
        assert_ne!(a, sig("k", "notif:s:2", 1_700_000_000, b"{}"));
        assert_ne!(a, sig("k", "notif:s:1", 1_700_000_001, b"{}"));
        assert_ne!(a, sig("k", "notif:s:1", 1_700_000_000, b"{ }"));
        assert_ne!(a, sig("other", "notif:s:1", 1_700_000_000, b"{}"));
    }

    /// The Standard Webhooks specification's example (its libraries' test vector): a
    /// `whsec_` secret is its base64-decoded bytes.
    #[test]
    fn the_standard_signature_matches_the_specification_example() {
        let s = Signatures::new(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(
            s.standard,
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
