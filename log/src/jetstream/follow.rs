//! The replica's follower: an ordered consumer of the stream that brings into the replica what
//! this node did not publish itself (what it published reaches the replica from the publish
//! acknowledgement, [`super::feed`]). A message the replica already holds is skipped without
//! reading its body; the rest is taken a batch at a time at the stream's sequences.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{consumer, stream};
use futures::StreamExt;

use super::feed::{Feed, Run};
use super::{Body, cluster_err};
use crate::envelope::{NewEvent, limits};
use crate::error::StorageError;

/// Follow the stream into the replica, from the replica's head on, for as long as the runtime
/// runs; a broken consumer is made again from where the replica is.
pub(super) async fn follow(stream: stream::Stream, client: async_nats::Client, feed: Arc<Feed>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if let Err(e) = follow_once(&stream, &client, &feed).await {
            tracing::warn!(error = %e, "following the stream failed; following again");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        } else {
            backoff = Duration::from_millis(50);
        }
    }
}

async fn follow_once(
    stream: &stream::Stream,
    client: &async_nats::Client,
    feed: &Feed,
) -> Result<(), StorageError> {
    let start = feed.restart().await;
    let consumer = stream
        .create_consumer(consumer::push::OrderedConfig {
            deliver_subject: client.new_inbox(),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ..Default::default()
        })
        .await
        .map_err(|e| cluster_err("making the follower", e))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| cluster_err("following", e))?;
    let mut run: Vec<NewEvent> = Vec::new();
    let mut run_first = 0;
    let mut next = start;
    while let Some(m) = messages.next().await {
        let m = m.map_err(|e| cluster_err("following", e))?;
        let (seq, at) = {
            let info = m
                .info()
                .map_err(|e| cluster_err("a message's metadata", e))?;
            (
                info.stream_sequence,
                (info.published.unix_timestamp_nanos() / 1_000) as i64,
            )
        };
        if seq < next {
            continue;
        }
        if seq > next {
            return Err(cluster_err(
                "following",
                format!("the stream jumped from {next} to {seq} (purged?)"),
            ));
        }
        next = seq + 1;
        if feed.holds(seq) {
            // Published by this node (or taken already): its whole batch is held, so a run
            // begun on its first messages is part of it.
            run.clear();
            continue;
        }
        let body: Body<'_> = serde_json::from_slice(&m.payload)
            .map_err(|e| cluster_err(&format!("message {seq}"), e))?;
        // The publishing node's time of the batch (the same on every message of it), or for a
        // message without one (an older node's), the stream's.
        let at = body.at_us.unwrap_or(at);
        let value: serde_json::Value = serde_json::from_str(body.payload.get())
            .map_err(|e| cluster_err(&format!("message {seq}"), e))?;
        let ev = NewEvent::new(
            Some(body.id.to_owned()),
            body.stream,
            body.subject,
            body.event_type,
            &value,
        )
        .and_then(|ev| match body.tenant {
            Some(t) => ev.in_tenant(t),
            None => Ok(ev),
        })
        .map_err(|e| cluster_err(&format!("message {seq}"), format!("{e:?}")))?;
        // A batch is replicated whole: its messages are contiguous in the stream, the last
        // one carrying the commit.
        let headers = m.headers.as_ref();
        let in_batch = headers.is_some_and(|h| h.get("Nats-Batch-Id").is_some());
        let commit = headers.is_some_and(|h| h.get("Nats-Batch-Commit").is_some());
        if run.is_empty() {
            run_first = seq;
        }
        run.push(ev);
        if !in_batch || commit || run.len() >= limits::BATCH_MAX_EVENTS {
            let events = std::mem::take(&mut run);
            feed.offer(run_first, Run { events, at_us: at })
                .await
                .map_err(|e| cluster_err("the replica", e))?;
        }
    }
    Err(cluster_err("following", "the consumer ended"))
}
