//! One append on the cluster (spec section 16, "a pipeline, not a relay"): its duplicates and
//! its condition decided on the replica, then one publish — a plain one for a single event, an
//! atomic batch for several — answered on the stream leader's acknowledgement once this node's
//! replica holds the batch, which it takes from here ([`super::feed`]), not from the stream.
//!
//! A node keeps up to [`PUBLISH_WINDOW`] publishes in flight (more are refused with
//! `Overloaded`, a 429), at most [`BATCHES_IN_FLIGHT`] of them atomic batches (the server keeps
//! at most 50 open per stream; a burst waits for a slot). Conditional appends naming the same
//! subject go one at a time on a node, so that the second is judged on what the first wrote
//! instead of being refused by the server and decided again; everything else flows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_nats::HeaderMap;
use serde::Deserialize;
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit};

use super::feed::Run;
use super::{Body, JetStreamLog, cluster_err, nats_subject};
use crate::condition::Condition;
use crate::envelope::NewEvent;
use crate::error::{AppendError, ReadError, StorageError};
use crate::{AppendReceipt, Appended};
use crate::{EventLog, Lookups};

/// Publishes one node keeps in flight at once by default ([`super::JetStreamConfig`]'s
/// `publish_window`); an append beyond them is refused with `Overloaded` (429) rather than
/// queued without bound.
pub const PUBLISH_WINDOW: usize = 1024;

/// Atomic batches one node has in flight at once. The server keeps at most 50 open batches per
/// stream and refuses more ("atomic publish batch is incomplete"); a burst above this waits
/// here instead (three nodes stay under the server's bound).
pub const BATCHES_IN_FLIGHT: usize = 16;

/// One attempt's failure: final, or worth deciding again (a duplicate met in the batch, a
/// condition the server refused that holds on a fresher replica, no leader this moment).
pub(super) enum Attempt {
    Final(AppendError),
    Again,
}

impl Attempt {
    fn storage(e: StorageError) -> Attempt {
        Attempt::Final(AppendError::Storage(e))
    }
}

impl From<AppendError> for Attempt {
    fn from(e: AppendError) -> Self {
        Attempt::Final(e)
    }
}

fn read_err(e: ReadError) -> Attempt {
    Attempt::storage(StorageError::of(e))
}

/// The stream's answer to a publish (a plain one, or an atomic batch's commit).
#[derive(Deserialize)]
pub(super) struct PubAck {
    #[serde(default)]
    pub seq: u64,
    /// Messages an atomic batch stored.
    #[serde(default)]
    pub count: Option<u64>,
    /// A plain publish whose `Nats-Msg-Id` the stream holds already: `seq` is the original's.
    #[serde(default)]
    pub duplicate: bool,
    #[serde(default)]
    pub error: Option<ApiError>,
}

#[derive(Deserialize, Debug)]
pub(super) struct ApiError {
    #[serde(default)]
    pub err_code: u64,
    #[serde(default)]
    pub description: String,
}

/// The node's bounds on what it has in flight, and its per-subject order of conditional
/// appends.
pub(super) struct Pipeline {
    window: Arc<tokio::sync::Semaphore>,
    window_size: usize,
    batches: Arc<tokio::sync::Semaphore>,
    subjects: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Pipeline {
    pub fn new(window: usize) -> Pipeline {
        Pipeline {
            window: Arc::new(tokio::sync::Semaphore::new(window)),
            window_size: window,
            batches: Arc::new(tokio::sync::Semaphore::new(BATCHES_IN_FLIGHT)),
            subjects: Mutex::new(HashMap::new()),
        }
    }

    /// A place in the window, or `Overloaded` when it is full.
    fn publish_slot(&self) -> Result<OwnedSemaphorePermit, Attempt> {
        self.window.clone().try_acquire_owned().map_err(|_| {
            Attempt::Final(AppendError::Overloaded {
                queued: self.window_size,
            })
        })
    }

    /// The turn of a conditional append on every subject it names (in one order, so two
    /// appends naming the same subjects never wait for each other crosswise).
    pub async fn subjects_turn(&self, subjects: Vec<String>) -> SubjectsTurn<'_> {
        let mut subjects = subjects;
        subjects.sort();
        subjects.dedup();
        let mut guards = Vec::with_capacity(subjects.len());
        for s in &subjects {
            let lock = self
                .subjects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(s.clone())
                .or_default()
                .clone();
            guards.push(lock.lock_owned().await);
        }
        SubjectsTurn {
            pipeline: self,
            subjects,
            guards,
        }
    }
}

/// Held while a conditional append runs; the locks of subjects nobody else waits for are
/// dropped with it.
pub(super) struct SubjectsTurn<'a> {
    pipeline: &'a Pipeline,
    subjects: Vec<String>,
    guards: Vec<OwnedMutexGuard<()>>,
}

impl Drop for SubjectsTurn<'_> {
    fn drop(&mut self) {
        self.guards.clear();
        let mut map = self
            .pipeline
            .subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for s in &self.subjects {
            if map.get(s).is_some_and(|l| Arc::strong_count(l) == 1) {
                map.remove(s);
            }
        }
    }
}

/// The subject check a message carries: on its own subject, or on another one the batch only
/// read (`Nats-Expected-Last-Subject-Sequence-Subject`, any message of a batch may carry one).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Check {
    Own(u64),
    Other(String, u64),
}

/// Where each subject of `condition` is checked among messages on `subject_of`: a subject the
/// batch writes on its first message there; a subject it only reads on a message that carries
/// no check of its own. `true` when some read subject found no such message: the publish then
/// holds the head the condition was judged at instead (nothing appended since).
fn place_checks(
    subject_of: &[String],
    condition: &Condition,
    nats: impl Fn(&crate::condition::SubjectSeq) -> String,
) -> (Vec<Option<Check>>, bool) {
    let mut checks: Vec<Option<Check>> = vec![None; subject_of.len()];
    let mut read_only = Vec::new();
    for c in &condition.subjects {
        let want = nats(c);
        match subject_of.iter().position(|s| *s == want) {
            Some(i) => checks[i] = Some(Check::Own(c.last_seq)),
            None => read_only.push((want, c.last_seq)),
        }
    }
    let mut hold_head = false;
    for (subject, last) in read_only {
        match checks.iter().position(Option::is_none) {
            Some(i) => checks[i] = Some(Check::Other(subject, last)),
            None => hold_head = true,
        }
    }
    (checks, hold_head)
}

/// A message to publish: its NATS subject, headers and body.
type Message = (String, HeaderMap, Vec<u8>);

impl JetStreamLog {
    pub(super) async fn append_once(
        &self,
        events: &[NewEvent],
        condition: &Condition,
        force: bool,
        at_us: Option<i64>,
    ) -> Result<AppendReceipt, Attempt> {
        // Everything committed before the last catch-up is in the replica: its ids are known
        // exactly; anything published since is within the server's window.
        self.catch_up(force).await?;
        let replica = &self.inner.replica;
        // A batch is one tenant's (`prepare_batch`).
        let tenant = events.first().and_then(|e| e.tenant.as_deref());
        // A tenant fenced out of this stream by a move (spec section 20): what the stream
        // orders after its fence is void, so nothing is published, and a resend is a
        // duplicate only of what was stored before the fence.
        let fenced = |fence_seq: u64| {
            Attempt::Final(AppendError::Fenced {
                tenant: tenant.unwrap_or_default().to_owned(),
                fence_seq,
            })
        };
        let fence = match tenant {
            Some(t) => self.fence_of(t).map_err(Attempt::storage)?,
            None => 0,
        };
        let void = |seq: u64| fence > 0 && seq > fence;
        let mut results: Vec<Option<Appended>> = Vec::with_capacity(events.len());
        let mut fresh: Vec<&NewEvent> = Vec::new();
        let mut in_batch: HashMap<&str, usize> = HashMap::new();
        for ev in events {
            let id = ev.event_id.as_deref().unwrap_or_default();
            if let Some(&i) = in_batch.get(id) {
                if !fresh[i].same_as(ev) {
                    return Err(Attempt::Final(AppendError::Conflict {
                        event_id: id.to_owned(),
                        seq: 0,
                    }));
                }
                results.push(None);
                continue;
            }
            match replica.get_by_id(tenant, id).map_err(read_err)? {
                Some(orig) if void(orig.seq) => return Err(fenced(fence)),
                Some(orig) if ev.same_content(&orig) => results.push(Some(Appended {
                    event_id: id.to_owned(),
                    seq: orig.seq,
                    duplicate: true,
                })),
                Some(orig) => {
                    return Err(Attempt::Final(AppendError::Conflict {
                        event_id: id.to_owned(),
                        seq: orig.seq,
                    }));
                }
                None => {
                    in_batch.insert(id, fresh.len());
                    fresh.push(ev);
                    results.push(None);
                }
            }
        }
        if fresh.is_empty() {
            // A resend of an append that succeeded: its duplicates, whatever the condition.
            return Ok(AppendReceipt {
                events: results.into_iter().flatten().collect(),
                last_seq: replica.head(),
            });
        }
        // Nothing new of a fenced tenant (its condition is not judged: what it names past the
        // fence is void).
        if fence > 0 {
            return Err(fenced(fence));
        }
        // The condition judged on the caught-up replica, as the embedded log judges it (the
        // exact refusal); the headers below hold it against whatever lands meanwhile.
        let (head, failed) = self.judge(tenant, condition)?;
        if let Some(failed) = failed {
            // A replica caught up a while ago may be behind: judge again on a fresh one
            // before refusing.
            return Err(if force {
                Attempt::Final(failed)
            } else {
                Attempt::Again
            });
        }
        let at = at_us.unwrap_or_else(|| self.batch_time());
        let msgs = self.messages(tenant, &fresh, condition, head, at)?;
        let n = fresh.len() as u64;
        let ack = self.publish(msgs).await?;
        if let Some(err) = ack.error {
            return Err(self.refused(tenant, err, condition).await);
        }
        let (first, last) = if ack.duplicate {
            // One event the stream holds already (published meanwhile by another node, or by
            // a request of this one that did not see its answer): the original's seq.
            self.replica_at(ack.seq).await?;
            let ev = fresh[0];
            match replica.get(ack.seq).map_err(read_err)? {
                Some(orig) if orig.event_id == ev.event_id.clone().unwrap_or_default() => {
                    if !ev.same_content(&orig) {
                        return Err(Attempt::Final(AppendError::Conflict {
                            event_id: orig.event_id,
                            seq: ack.seq,
                        }));
                    }
                }
                // The server's window answered for another message: decide again.
                _ => return Err(Attempt::Again),
            }
            if let Some(f) = self.fenced_before(tenant, ack.seq)? {
                return Err(fenced(f));
            }
            (ack.seq, replica.head())
        } else {
            let last = ack.seq;
            let counted = ack.count.unwrap_or(1);
            if counted != n || last < n {
                return Err(Attempt::storage(cluster_err(
                    "the publish acknowledgement",
                    format!(
                        "{n} events acknowledged as {:?} ending at {last}",
                        ack.count
                    ),
                )));
            }
            let first = last + 1 - n;
            // The replica takes the batch from here (the follower skips it), then this
            // answers once the replica holds it: reads on this node see it from now on.
            let run = Run {
                events: fresh.iter().map(|e| (*e).clone()).collect(),
                at_us: at,
            };
            self.inner
                .feed
                .offer(first, run)
                .await
                .map_err(|e| Attempt::storage(cluster_err("the replica", e)))?;
            self.replica_at(last).await?;
            // Published while another node fenced the tenant: stored after the fence, the
            // batch is void (the replica holds the stream through it, so any fence before it).
            if let Some(f) = self.fenced_before(tenant, first)? {
                return Err(fenced(f));
            }
            (first, last)
        };
        let mut k = 0;
        let out = events
            .iter()
            .zip(results)
            .map(|(ev, r)| {
                r.unwrap_or_else(|| {
                    let id = ev.event_id.clone().unwrap_or_default();
                    let i = in_batch[id.as_str()];
                    let dup = ack.duplicate || i < k;
                    k = k.max(i + 1);
                    Appended {
                        event_id: id,
                        seq: first + i as u64,
                        duplicate: dup,
                    }
                })
            })
            .collect();
        Ok(AppendReceipt {
            events: out,
            last_seq: last,
        })
    }

    /// The seq of `tenant`'s fence if the stream holds one before `seq` (the replica holding
    /// the stream through `seq`).
    fn fenced_before(&self, tenant: Option<&str>, seq: u64) -> Result<Option<u64>, Attempt> {
        let Some(t) = tenant else {
            return Ok(None);
        };
        let f = self.fence_of(t).map_err(Attempt::storage)?;
        Ok((f > 0 && f < seq).then_some(f))
    }

    /// The time a batch published now is recorded at: this node's clock, never earlier than
    /// its last batch's (every replica records the batch at this time; it travels in the
    /// messages).
    fn batch_time(&self) -> i64 {
        let now = crate::time::now_micros();
        let prev = self
            .inner
            .last_at
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed);
        now.max(prev)
    }

    /// The messages of `fresh`: one plain message for a single event, an atomic batch for
    /// several; each with `Nats-Msg-Id` = its event id, and the condition as headers.
    fn messages(
        &self,
        tenant: Option<&str>,
        fresh: &[&NewEvent],
        condition: &Condition,
        head: u64,
        at: i64,
    ) -> Result<Vec<Message>, Attempt> {
        let prefix = &self.inner.prefix;
        let subject_of: Vec<String> = fresh
            .iter()
            .map(|e| nats_subject(prefix, tenant, &e.stream, &e.subject))
            .collect();
        let (checks, hold_head) = place_checks(&subject_of, condition, |c| {
            nats_subject(prefix, tenant, &c.stream, &c.subject)
        });
        let hold_head = hold_head.then_some(head).or(condition.head);
        let n = fresh.len();
        let batch_id = (n > 1).then(|| uuid::Uuid::now_v7().simple().to_string());
        let mut msgs = Vec::with_capacity(n);
        for (i, (ev, subject)) in fresh.iter().zip(subject_of).enumerate() {
            let mut h = HeaderMap::new();
            if let Some(batch_id) = &batch_id {
                h.insert("Nats-Batch-Id", batch_id.as_str());
                h.insert("Nats-Batch-Sequence", (i + 1).to_string().as_str());
                if i + 1 == n {
                    h.insert("Nats-Batch-Commit", "1");
                }
            }
            // The server's duplicate window is the tenant's: its ids are its own.
            h.insert("Nats-Msg-Id", &*ev.scoped_id());
            if i == 0
                && let Some(s) = hold_head
            {
                h.insert("Nats-Expected-Last-Sequence", s.to_string().as_str());
            }
            match &checks[i] {
                Some(Check::Own(last)) => {
                    h.insert(
                        "Nats-Expected-Last-Subject-Sequence",
                        last.to_string().as_str(),
                    );
                }
                Some(Check::Other(subject, last)) => {
                    h.insert(
                        "Nats-Expected-Last-Subject-Sequence",
                        last.to_string().as_str(),
                    );
                    h.insert(
                        "Nats-Expected-Last-Subject-Sequence-Subject",
                        subject.as_str(),
                    );
                }
                None => {}
            }
            let body = serde_json::to_vec(&Body {
                tenant,
                id: ev.event_id.as_deref().unwrap_or_default(),
                stream: &ev.stream,
                subject: &ev.subject,
                event_type: &ev.event_type,
                payload: ev.payload_raw(),
                at_us: Some(at),
            })
            .map_err(|e| Attempt::storage(StorageError::of(e)))?;
            msgs.push((subject, h, body));
        }
        Ok(msgs)
    }

    /// Publish `msgs` (one plain message, or an atomic batch) and read the stream's answer.
    async fn publish(&self, msgs: Vec<Message>) -> Result<PubAck, Attempt> {
        let pipeline = &self.inner.pipeline;
        let _slot = pipeline.publish_slot()?;
        // An atomic batch also waits for one of the node's batch slots, outside the request's
        // timeout (a burst queues here; each batch then has the whole timeout).
        let _batch = if msgs.len() > 1 {
            Some(
                pipeline
                    .batches
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|e| Attempt::storage(StorageError::of(e)))?,
            )
        } else {
            None
        };
        let client = self.inner.client.clone();
        let answer = self
            .run(async move {
                let mut msgs = msgs.into_iter();
                let Some(mut cur) = msgs.next() else {
                    return Err("an empty batch".to_string());
                };
                // An atomic batch's messages go without a reply subject but the last: its
                // acknowledgement says whether the whole batch was stored.
                for next in msgs {
                    client
                        .publish_with_headers(cur.0, cur.1, cur.2.into())
                        .await
                        .map_err(|e| e.to_string())?;
                    cur = next;
                }
                let reply = client
                    .request_with_headers(cur.0, cur.1, cur.2.into())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(reply.payload)
            })
            .await?
            .map_err(|e| {
                if e.contains("no responders") {
                    // The stream has no leader this moment (just made, or electing): nothing
                    // was stored; try again.
                    Attempt::Again
                } else {
                    Attempt::Final(AppendError::Storage(cluster_err("publishing", e)))
                }
            })?;
        serde_json::from_slice(&answer)
            .map_err(|e| Attempt::storage(cluster_err("the publish acknowledgement", e)))
    }

    /// What a publish the server refused means: a condition that no longer holds (judged
    /// again on the caught-up replica, for the exact answer), a duplicate being published
    /// elsewhere or a condition that holds again (decide again), or a fault.
    async fn refused(&self, tenant: Option<&str>, e: ApiError, condition: &Condition) -> Attempt {
        let d = e.description.to_ascii_lowercase();
        // A duplicate being published (10158, 10201, or met in a batch), a subject's last
        // sequence not known this moment (10163), the stream's open atomic batches all taken
        // by other nodes (10210): nothing was stored; decide again.
        if d.contains("duplicate") || matches!(e.err_code, 10158 | 10163 | 10201 | 10210) {
            return Attempt::Again;
        }
        if d.contains("wrong last") {
            if let Err(e) = self.catch_up(true).await {
                return Attempt::Final(e);
            }
            return match self.judge(tenant, condition) {
                Ok((_, Some(failed))) => Attempt::Final(failed),
                Ok((_, None)) => Attempt::Again,
                Err(e) => Attempt::Final(e),
            };
        }
        Attempt::storage(cluster_err(
            "the batch was refused",
            format!("{} (code {})", e.description, e.err_code),
        ))
    }

    /// The condition judged at one point of the replica: the head it was judged at, and the
    /// part that failed there, if any. The head is what the publish then holds (a batch the
    /// replica took in after the judgment must not pass as judged).
    fn judge(
        &self,
        tenant: Option<&str>,
        condition: &Condition,
    ) -> Result<(u64, Option<AppendError>), AppendError> {
        let replica = &self.inner.replica;
        // One point of the replica: the head, and each subject as of that head (a batch
        // replicated between the reads is not half seen).
        let head = replica.head();
        let failed = crate::condition::first_failed(condition, head, |stream, subject| {
            replica
                .last_of(tenant, stream, subject, head)
                .map_err(AppendError::Storage)
        })?;
        Ok((head, failed))
    }

    /// The NATS subjects a conditional append names (each taken in turn on this node).
    pub(super) fn condition_subjects(
        &self,
        tenant: Option<&str>,
        condition: &Condition,
    ) -> Vec<String> {
        condition
            .subjects
            .iter()
            .map(|c| nats_subject(&self.inner.prefix, tenant, &c.stream, &c.subject))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_subject_is_checked_on_a_free_message_or_held_by_the_head() {
        let subjects = vec!["a".to_string(), "a".to_string(), "b".to_string()];
        let cond = Condition::subject("s", "a", 3)
            .and_subject("s", "x", 7)
            .and_subject("s", "y", 0);
        let name = |c: &crate::condition::SubjectSeq| c.subject.clone();
        let (checks, hold) = place_checks(&subjects, &cond, name);
        assert_eq!(
            checks,
            vec![
                Some(Check::Own(3)),
                Some(Check::Other("x".into(), 7)),
                Some(Check::Other("y".into(), 0)),
            ]
        );
        assert!(!hold);
        let (checks, hold) = place_checks(&subjects[..1], &cond, name);
        assert_eq!(checks, vec![Some(Check::Own(3))]);
        assert!(
            hold,
            "no message left for the read subjects: the head holds them"
        );
    }

    #[tokio::test]
    async fn the_window_refuses_past_its_bound_and_subjects_take_turns() {
        let p = Pipeline::new(PUBLISH_WINDOW);
        let slots: Vec<_> = (0..PUBLISH_WINDOW)
            .map(|_| p.publish_slot().ok().expect("a slot"))
            .collect();
        assert!(matches!(
            p.publish_slot(),
            Err(Attempt::Final(AppendError::Overloaded { .. }))
        ));
        drop(slots);
        assert!(p.publish_slot().is_ok());

        let a = p.subjects_turn(vec!["x".into(), "y".into()]).await;
        // Another subject flows; the same one waits.
        drop(p.subjects_turn(vec!["z".into()]).await);
        let waiting = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            p.subjects_turn(vec!["y".into()]),
        )
        .await;
        assert!(waiting.is_err(), "a second append on y waits for the first");
        drop(a);
        drop(p.subjects_turn(vec!["y".into()]).await);
        assert!(
            p.subjects.lock().unwrap().is_empty(),
            "idle locks are dropped"
        );
    }
}
