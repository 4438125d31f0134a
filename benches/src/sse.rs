//! Append-to-SSE-receipt latency of tidemark: one client follows `GET /v1/events/stream`,
//! another appends one event at a time; the latency runs from just before the `POST` to the
//! moment the stream delivers that event's seq.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;

use crate::events::EventGen;
use crate::measure::{Percentiles, micros, new_histogram};
use crate::targets::tidemark::{TidemarkHttp, http_body};

#[derive(Serialize, Clone, serde::Deserialize)]
pub struct SseResult {
    pub events: u64,
    /// POST sent → event received on the stream.
    pub append_to_receipt_us: Percentiles,
    /// POST sent → 201 received.
    pub append_us: Percentiles,
    pub error: Option<String>,
}

#[derive(serde::Deserialize)]
struct Receipt {
    last_seq: u64,
}

pub async fn sse_latency(t: &TidemarkHttp, events: u64) -> SseResult {
    let mut r = SseResult {
        events: 0,
        append_to_receipt_us: Percentiles::default(),
        append_us: Percentiles::default(),
        error: None,
    };
    if let Err(e) = run(t, events, &mut r).await {
        r.error = Some(e);
    }
    r
}

async fn run(t: &TidemarkHttp, events: u64, r: &mut SseResult) -> Result<(), String> {
    let client = t.client();
    let head = crate::http::get_json(client, &format!("{}/v1/events?limit=1", t.base())).await?;
    let after = head["latest_event_seq"].as_u64().unwrap_or(0);
    // No request timeout on the stream itself.
    let sse_client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let resp = sse_client
        .get(format!(
            "{}/v1/events/stream?after_sequence={after}",
            t.base()
        ))
        .send()
        .await
        .map_err(|e| format!("SSE: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("SSE: {}", resp.status()));
    }
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut seen = after;
    let evgen = EventGen::from_clock();
    let (mut to_receipt, mut to_ack) = (new_histogram(), new_histogram());
    for i in 0..events {
        let t0 = Instant::now();
        let resp = client
            .post(format!("{}/v1/events", t.base()))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(http_body(&[evgen.event(i)]))
            .send()
            .await
            .map_err(|e| format!("POST: {e}"))?;
        if resp.status() != reqwest::StatusCode::CREATED {
            return Err(format!("POST answered {}", resp.status()));
        }
        let seq = resp
            .json::<Receipt>()
            .await
            .map_err(|e| e.to_string())?
            .last_seq;
        to_ack.saturating_record(micros(t0.elapsed()));
        while seen < seq {
            let chunk = tokio::time::timeout(Duration::from_secs(30), body.next())
                .await
                .map_err(|_| format!("seq {seq} did not arrive on the stream within 30 s"))?
                .ok_or("the stream ended")?
                .map_err(|e| format!("SSE: {e}"))?;
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let frame: String = buf.drain(..end + 2).collect();
                if let Some(id) = frame
                    .lines()
                    .find_map(|l| l.strip_prefix("id:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                {
                    seen = seen.max(id);
                }
            }
        }
        to_receipt.saturating_record(micros(t0.elapsed()));
        r.events += 1;
    }
    r.append_to_receipt_us = Percentiles::from(&to_receipt);
    r.append_us = Percentiles::from(&to_ack);
    Ok(())
}
