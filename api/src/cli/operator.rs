//! The operator's commands: projections, deliveries, cursors.

use std::io::Write;

use crate::cli::{SourcesAction, SourcesArgs};

use super::{
    CliResult, CursorsAction, CursorsArgs, DeliveriesAction, DeliveriesArgs, Output,
    ProjectionsAction, ProjectionsArgs, client, enc, get_json, send_text,
};

pub(crate) async fn projections(a: ProjectionsArgs) -> CliResult {
    let http = client(&a.client)?;
    let base = format!(
        "{}/v1/admin/projections",
        a.client.url.trim_end_matches('/')
    );
    let out = a.client.output();
    let names: Vec<(String, &str)> = match &a.action {
        ProjectionsAction::List => {
            let v = get_json(&http, &base).await?;
            let rows = v["projections"].as_array().cloned().unwrap_or_default();
            return out.list(&rows, &["name", "checkpoint", "lag", "digest"]);
        }
        ProjectionsAction::Rebuild { name } => vec![(name.clone(), "rebuild")],
        ProjectionsAction::Verify { name: Some(name) } => vec![(name.clone(), "verify")],
        ProjectionsAction::Verify { name: None } => {
            let v = get_json(&http, &base).await?;
            v["projections"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str().map(|n| (n.to_owned(), "verify")))
                .collect()
        }
    };
    let mut all_identical = true;
    for (name, action) in names {
        let url = format!("{base}/{name}/{action}");
        let req = http.post(&url).send();
        tokio::pin!(req);
        // Show progress while the server works.
        let resp = loop {
            tokio::select! {
                r = &mut req => break r.map_err(|e| format!("cannot reach the server: {e}"))?,
                _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {
                    if let Ok(v) = get_json(&http, &base).await
                        && let Some(p) = v["projections"].as_array().into_iter().flatten().find(|p| p["name"] == name.as_str())
                        && let Some(r) = p.get("rebuild").filter(|r| !r.is_null())
                    {
                        eprint!("\r{action} {name}: {} / {} events", r["done"], r["head"]);
                    }
                }
            }
        };
        let status = resp.status();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{action} {name} failed ({status}): {text}"));
        }
        eprintln!();
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        all_identical &= v["identical"].as_bool().unwrap_or(false);
        out.one(&v)?;
    }
    if all_identical {
        Ok(())
    } else {
        Err("a rebuilt model differs from the live one (see first_divergent_seq)".into())
    }
}

pub(crate) async fn deliveries(a: DeliveriesArgs) -> CliResult {
    let http = client(&a.client)?;
    let base = format!("{}/v1/deliveries", a.client.url.trim_end_matches('/'));
    match a.action {
        DeliveriesAction::List {
            status,
            sink,
            route,
            recipient,
            limit,
        } => {
            let mut filters = String::new();
            for (k, v) in [
                ("status", &status),
                ("sink", &sink),
                ("route", &route),
                ("recipient", &recipient),
            ] {
                if let Some(v) = v {
                    filters.push_str(&format!("&{k}={}", enc(v)));
                }
            }
            let mut after: Option<String> = None;
            let mut printed = 0u64;
            let out = a.client.output();
            // JSON lines stream page by page; a table or a JSON array is printed whole.
            let mut rows: Vec<serde_json::Value> = Vec::new();
            let stdout = std::io::stdout();
            'pages: loop {
                let mut url = format!("{base}?limit=1000{filters}");
                if let Some(a) = &after {
                    url.push_str(&format!("&after={}", enc(a)));
                }
                let v = get_json(&http, &url).await?;
                let mut w = stdout.lock();
                for d in v["deliveries"].as_array().into_iter().flatten() {
                    if limit.is_some_and(|l| printed >= l) {
                        break 'pages;
                    }
                    if out == Output::Jsonl {
                        writeln!(w, "{d}").map_err(|e| e.to_string())?;
                    } else {
                        rows.push(d.clone());
                    }
                    printed += 1;
                }
                match v["next_after"].as_str() {
                    Some(n) => after = Some(n.to_owned()),
                    None => break,
                }
            }
            if out == Output::Jsonl {
                return Ok(());
            }
            out.list(
                &rows,
                &[
                    "id",
                    "status",
                    "sink",
                    "attempts",
                    "next_attempt_at",
                    "last_error_code",
                    "title",
                ],
            )
        }
        DeliveriesAction::Retry { id, reason } => {
            operator_action(&http, &base, &id, "retry", reason, a.client.output()).await
        }
        DeliveriesAction::Discard { id, reason } => {
            operator_action(&http, &base, &id, "discard", reason, a.client.output()).await
        }
    }
}

async fn operator_action(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    action: &str,
    reason: Option<String>,
    out: Output,
) -> CliResult {
    let url = format!("{base}/{}/{action}", enc(id));
    let mut body = serde_json::json!({"by": "cli"});
    if let Some(r) = reason {
        body["reason"] = serde_json::Value::String(r);
    }
    let text = send_text(http.post(&url).json(&body), |status, text| {
        format!("{action} {id} failed ({status}): {text}")
    })
    .await?;
    out.one(&serde_json::from_str(&text).map_err(|e| e.to_string())?)
}

pub(crate) async fn cursors(a: CursorsArgs) -> CliResult {
    let http = client(&a.client)?;
    let out = a.client.output();
    let base = a.client.url.trim_end_matches('/').to_owned();
    match a.action {
        CursorsAction::Show {
            consumer,
            stream,
            subject,
            lag,
        } => {
            let v = if lag {
                get_json(&http, &format!("{base}/v1/consumers/lag")).await?
            } else {
                let consumer = consumer.ok_or("give --consumer (or --lag for every cursor)")?;
                let mut url = format!("{base}/v1/cursors?consumer_id={}", enc(&consumer));
                if let Some(s) = &stream {
                    url.push_str(&format!(
                        "&stream_name={}&subject_id={}",
                        enc(s),
                        enc(&subject)
                    ));
                }
                get_json(&http, &url).await?
            };
            // The lag view lists `consumers` (section 7), one cursor or a consumer's `cursors`.
            let key = if lag { "consumers" } else { "cursors" };
            let rows = v[key].as_array().cloned().unwrap_or_default();
            out.list(
                &rows,
                &[
                    "consumer_id",
                    "stream_name",
                    "subject_id",
                    "last_sequence",
                    "lag_events",
                    "stalled",
                    "stopped",
                    "last_error",
                ],
            )
        }
        CursorsAction::Reset {
            consumer,
            stream,
            subject,
            to,
            reason,
        } => {
            let body = serde_json::json!({
                "consumer_id": consumer, "stream_name": stream, "subject_id": subject,
                "last_sequence": to, "reason": reason,
            });
            let rb = http.post(format!("{base}/v1/cursors/reset")).json(&body);
            let text = send_text(rb, |status, text| {
                format!("reset failed ({status}): {text}")
            })
            .await?;
            out.one(&serde_json::from_str(&text).map_err(|e| e.to_string())?)
        }
    }
}

pub(crate) async fn sources(a: SourcesArgs) -> CliResult {
    let http = client(&a.client)?;
    let out = a.client.output();
    let base = format!("{}/v1/sources", a.client.url.trim_end_matches('/'));
    let post = |name: &str, action: &str, body: serde_json::Value| {
        let url = format!("{base}/{}/{action}", enc(name));
        let what = format!("{action} {name}");
        let rb = http.post(url).json(&body);
        async move {
            let text = send_text(rb, |status, text| {
                format!("{what} failed ({status}): {text}")
            })
            .await?;
            out.one(&serde_json::from_str(&text).map_err(|e| e.to_string())?)
        }
    };
    match a.action {
        SourcesAction::List => {
            let v = get_json(&http, &base).await?;
            let rows = v["sources"].as_array().cloned().unwrap_or_default();
            out.list(
                &rows,
                &[
                    "name",
                    "state",
                    "watermark",
                    "last_success_at",
                    "last_error",
                ],
            )
        }
        SourcesAction::Show { name } => {
            out.one(&get_json(&http, &format!("{base}/{}", enc(&name))).await?)
        }
        SourcesAction::Poll { name } => post(&name, "poll", serde_json::json!({})).await,
        SourcesAction::Pause { name, reason } => {
            post(&name, "pause", serde_json::json!({ "reason": reason })).await
        }
        SourcesAction::Resume { name } => post(&name, "resume", serde_json::json!({})).await,
        SourcesAction::Reset {
            name,
            watermark,
            reason,
        } => {
            post(
                &name,
                "reset",
                serde_json::json!({ "watermark": watermark, "reason": reason }),
            )
            .await
        }
    }
}
