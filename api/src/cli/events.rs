//! `tidemark append` and `tidemark tail`.

use std::io::{BufRead, Write};

use futures::StreamExt;

use super::{AppendArgs, CliResult, TailArgs, client};

const APPEND_BATCH_EVENTS: usize = 1000;
const APPEND_BATCH_BYTES: usize = 900 * 1024;

pub(crate) async fn append(a: AppendArgs) -> CliResult {
    let http = client(&a.client)?;
    let url = format!("{}/v1/events", a.client.url.trim_end_matches('/'));
    let reader: Box<dyn BufRead> = match &a.file {
        Some(p) => Box::new(std::io::BufReader::new(
            std::fs::File::open(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?,
        )),
        None => Box::new(std::io::BufReader::new(std::io::stdin())),
    };
    let mut batch: Vec<serde_json::Value> = Vec::new();
    let mut bytes = 0usize;
    let mut total = 0u64;
    for (n, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| format!("cannot read input: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("line {}: not JSON: {e}", n + 1))?;
        if batch.len() >= APPEND_BATCH_EVENTS || bytes + line.len() > APPEND_BATCH_BYTES {
            total += post_batch(&http, &url, std::mem::take(&mut batch)).await?;
            bytes = 0;
            eprintln!("appended {total} events");
        }
        bytes += line.len();
        batch.push(v);
    }
    if !batch.is_empty() {
        total += post_batch(&http, &url, batch).await?;
    }
    eprintln!("appended {total} events");
    Ok(())
}

async fn post_batch(
    http: &reqwest::Client,
    url: &str,
    events: Vec<serde_json::Value>,
) -> Result<u64, String> {
    let body = serde_json::json!({ "events": events });
    loop {
        let resp = http
            .post(url)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("cannot reach the server: {e}"))?;
        let status = resp.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            let secs = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.parse().ok())
                .unwrap_or(1u64);
            tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
            continue;
        }
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("server refused the batch ({status}): {text}"));
        }
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let mut out = std::io::stdout().lock();
        let mut n = 0;
        for e in v["events"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "{e}");
            n += 1;
        }
        return Ok(n);
    }
}

pub(crate) async fn tail(a: TailArgs) -> CliResult {
    let http = client(&a.client)?;
    let mut url = reqwest::Url::parse(&format!(
        "{}/v1/events/stream",
        a.client.url.trim_end_matches('/')
    ))
    .map_err(|e| format!("bad --url: {e}"))?;
    {
        let mut q = url.query_pairs_mut();
        if let Some(s) = &a.stream {
            q.append_pair("stream", s);
        }
        if let Some(s) = &a.subject {
            q.append_pair("subject", s);
        }
        if let Some(s) = &a.event_type {
            q.append_pair("type", s);
        }
    }
    let mut last = a.after;
    let mut printed = 0u64;
    let mut failures = 0u32;
    loop {
        let resp = http
            .get(url.clone())
            .header("Last-Event-ID", last.to_string())
            .send()
            .await;
        let resp = match resp {
            Ok(r) if r.status().is_success() => {
                failures = 0;
                r
            }
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                return Err(format!("server refused the stream ({status}): {text}"));
            }
            Err(e) => {
                failures += 1;
                if failures > 5 {
                    return Err(format!("cannot reach the server: {e}"));
                }
                tokio::time::sleep(std::time::Duration::from_millis(500 * u64::from(failures)))
                    .await;
                continue;
            }
        };
        let mut events = eventsource_stream::Eventsource::eventsource(resp.bytes_stream());
        while let Some(ev) = events.next().await {
            let Ok(ev) = ev else { break };
            if let Ok(seq) = ev.id.parse::<u64>() {
                last = seq;
            }
            println!("{}", ev.data);
            printed += 1;
            if a.count.is_some_and(|c| printed >= c) {
                return Ok(());
            }
        }
        // The stream ended (server restart or shutdown): resume after the last event seen.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
