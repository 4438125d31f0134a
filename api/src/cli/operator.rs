//! The operator's commands: projections, deliveries, cursors, sources, lists.

use std::io::IsTerminal;

use serde_json::{Value, json};

use super::client::Client;
use super::error::CliError;
use super::output::Records;
use super::{
    CliResult, CursorsAction, CursorsArgs, DeliveriesAction, DeliveriesArgs, EndpointsAction,
    EndpointsArgs, ListOrder, ListsAction, ListsArgs, ProjectionsAction, ProjectionsArgs,
    RoutesAction, RoutesArgs, SourcesAction, SourcesArgs,
};

const REPORT_COLUMNS: &[&str] = &[
    "name",
    "identical",
    "events_replayed",
    "duration_ms",
    "first_divergent_seq",
    "digest",
];

pub(crate) async fn projections(a: ProjectionsArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    let shard = a.shard.map(|n| n.to_string());
    let q: Vec<(&str, &str)> = shard.iter().map(|n| ("shard", n.as_str())).collect();
    let q = q.as_slice();
    let (names, action, many): (Vec<String>, &str, bool) = match &a.action {
        ProjectionsAction::List => {
            let v = c.op(c.ops().list_projections(q)).await?;
            return out.list(
                &items(&v, "projections"),
                &["name", "checkpoint", "lag", "digest"],
            );
        }
        ProjectionsAction::Rebuild { name } => (vec![name.clone()], "rebuild", false),
        ProjectionsAction::Verify { name: Some(name) } => (vec![name.clone()], "verify", false),
        ProjectionsAction::Verify { name: None } => {
            let v = c.op(c.ops().list_projections(q)).await?;
            let names = items(&v, "projections")
                .iter()
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect();
            (names, "verify", true)
        }
    };
    let mut reports = Vec::new();
    for name in names {
        let ops = c.ops();
        let req = c.op(async {
            if action == "rebuild" {
                ops.rebuild_projection(&name, q).await
            } else {
                ops.verify_projection(&name, q).await
            }
        });
        tokio::pin!(req);
        // Show progress while the server works (on a terminal: it is a line redrawn in place).
        let mut shown = false;
        let v = loop {
            tokio::select! {
                r = &mut req => break r?,
                () = tokio::time::sleep(std::time::Duration::from_millis(500)) => {
                    if std::io::stderr().is_terminal()
                        && let Ok(v) = c.op(c.ops().list_projections(q)).await
                        && let Some(p) = items(&v, "projections").iter().find(|p| p["name"] == name.as_str())
                        && let Some(r) = p.get("rebuild").filter(|r| !r.is_null())
                    {
                        eprint!("\r{action} {name}: {} / {} events", r["done"], r["head"]);
                        shown = true;
                    }
                }
            }
        };
        if shown {
            eprintln!();
        }
        reports.push(v);
    }
    // Several reports are a list (one JSON array); one is the record itself.
    if many {
        out.list(&reports, REPORT_COLUMNS)?;
    } else if let Some(r) = reports.first() {
        out.one(r)?;
    }
    let differ: Vec<&str> = reports
        .iter()
        .filter(|r| r["identical"].as_bool() != Some(true))
        .filter_map(|r| r["name"].as_str())
        .collect();
    if differ.is_empty() {
        Ok(())
    } else {
        Err(CliError::Other(format!(
            "the rebuilt {} differs from the live model (see first_divergent_seq in the report)",
            differ.join(", ")
        )))
    }
}

pub(crate) async fn deliveries(a: DeliveriesArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    match a.action {
        DeliveriesAction::List {
            status,
            sink,
            route,
            recipient,
            notification_id,
            source_site,
            created_after,
            created_before,
            search,
            ntype,
            list,
            stuck,
            order,
            limit,
        } => {
            let stuck = stuck.map(|b| b.to_string());
            let newest = order == ListOrder::Newest;
            let mut filters: Vec<(&str, String)> =
                vec![("order", (if newest { "newest" } else { "id" }).to_owned())];
            for (k, v) in [
                ("status", &status),
                ("sink", &sink),
                ("route", &route),
                ("recipient", &recipient),
                ("notification_id", &notification_id),
                ("source_site", &source_site),
                ("created_after", &created_after),
                ("created_before", &created_before),
                ("q", &search),
                ("type", &ntype),
                ("list", &list),
                ("stuck", &stuck),
            ] {
                if let Some(v) = v {
                    filters.push((k, v.clone()));
                }
            }
            // Newest first pages backwards with `before` / `next_before`; id order forwards with
            // `after` / `next_after`.
            let (cursor_param, next_key) = if newest {
                ("before", "next_before")
            } else {
                ("after", "next_after")
            };
            let mut after: Option<String> = None;
            let mut printed = 0u64;
            // JSON lines go out page by page; a table or a JSON array is printed whole.
            let mut rows = Records::new(
                out,
                &[
                    "id",
                    "status",
                    "stuck",
                    "sink",
                    "attempts",
                    "next_attempt_at",
                    "last_error_code",
                    "title",
                ],
            );
            'pages: loop {
                let mut query: Vec<(&str, &str)> = vec![("limit", "1000")];
                query.extend(filters.iter().map(|(k, v)| (*k, v.as_str())));
                if let Some(a) = &after {
                    query.push((cursor_param, a));
                }
                let v = c.op(c.ops().list_deliveries(&query)).await?;
                for d in items(&v, "deliveries") {
                    if limit.is_some_and(|l| printed >= l) {
                        break 'pages;
                    }
                    rows.push(d)?;
                    printed += 1;
                }
                match v[next_key].as_str() {
                    Some(n) => after = Some(n.to_owned()),
                    None => break,
                }
            }
            rows.finish()
        }
        DeliveriesAction::Retry { id, reason } => {
            out.one(&operator_action(&c, &id, "retry", reason).await?)
        }
        DeliveriesAction::Discard { id, reason } => {
            out.one(&operator_action(&c, &id, "discard", reason).await?)
        }
        DeliveriesAction::Resend { id, reason } => out.one(
            &c.op(c.ops().resend_delivery(&id, &json!({ "reason": reason })))
                .await?,
        ),
        DeliveriesAction::Recover {
            route,
            since,
            reason,
        } => out.one(
            &c.op(c
                .ops()
                .recover_deliveries(&json!({ "route": route, "since": since, "reason": reason })))
                .await?,
        ),
    }
}

async fn operator_action(
    c: &Client,
    id: &str,
    action: &str,
    reason: Option<String>,
) -> Result<Value, CliError> {
    let mut body = json!({"by": "cli"});
    if let Some(r) = reason {
        body["reason"] = Value::String(r);
    }
    if action == "retry" {
        c.op(c.ops().retry_delivery(id, &body)).await
    } else {
        c.op(c.ops().discard_delivery(id, &body)).await
    }
}

pub(crate) async fn cursors(a: CursorsArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    match a.action {
        CursorsAction::Show { lag: true, .. } => {
            let v = c.op(c.ops().get_consumer_lag()).await?;
            // `consumers` is the list key of section 7.
            let rows = items(&v, "consumers");
            out.list(
                &rows,
                &[
                    "consumer_id",
                    "stream_name",
                    "subject_id",
                    "last_sequence",
                    "lag_events",
                    "lag_seconds",
                    "stalled",
                    "stopped",
                    "stopped_reason",
                    "last_error",
                ],
            )
        }
        CursorsAction::Show {
            consumer,
            stream,
            subject,
            lag: false,
        } => {
            let consumer = consumer.ok_or("give --consumer (or --lag for every cursor)")?;
            let mut query = vec![("consumer_id", consumer.as_str())];
            if let Some(s) = &stream {
                query.push(("stream_name", s));
                query.push(("subject_id", &subject));
            }
            let v = c.op(c.ops().get_cursors(&query)).await?;
            out.list(
                &items(&v, "cursors"),
                &[
                    "consumer_id",
                    "stream_name",
                    "subject_id",
                    "last_sequence",
                    "last_delivery_id",
                    "updated_at",
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
            let body = json!({
                "consumer_id": consumer, "stream_name": stream, "subject_id": subject,
                "last_sequence": to, "reason": reason,
            });
            out.one(&c.op(c.ops().reset_cursor(&body)).await?)
        }
    }
}

pub(crate) async fn sources(a: SourcesArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    let ops = c.ops();
    let v = match a.action {
        SourcesAction::List => {
            let v = c.op(ops.list_sources(&[])).await?;
            return out.list(
                &items(&v, "sources"),
                &[
                    "name",
                    "state",
                    "watermark",
                    "last_success_at",
                    "last_error",
                ],
            );
        }
        SourcesAction::Show { name } => c.op(ops.get_source(&name, &[])).await?,
        SourcesAction::Poll { name } => c.op(ops.poll_source(&name)).await?,
        SourcesAction::Pause { name, reason } => {
            c.op(ops.pause_source(&name, &json!({ "reason": reason })))
                .await?
        }
        SourcesAction::Resume { name, now } => {
            c.op(ops.resume_source(&name, &json!({ "now": now })))
                .await?
        }
        SourcesAction::Reset {
            name,
            watermark,
            reason,
        } => {
            c.op(ops.reset_source(&name, &json!({ "watermark": watermark, "reason": reason })))
                .await?
        }
    };
    out.one(&v)
}

pub(crate) async fn lists(a: ListsArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    let ops = c.ops();
    let v = match a.action {
        ListsAction::List => {
            let v = c.op(ops.list_lists()).await?;
            return out.list(
                &items(&v, "lists"),
                &["name", "members", "updated_at", "by", "reason"],
            );
        }
        ListsAction::Show { name } => c.op(ops.get_list(&name)).await?,
        ListsAction::Set {
            name,
            members,
            reason,
        } => {
            let body = json!({ "members": members, "reason": reason });
            c.op(ops.put_list(&name, &body)).await?
        }
        ListsAction::Delete { name, reason } => {
            let body = json!({ "reason": reason });
            // 204: nothing to read back; say what was done.
            c.op(ops.delete_list(&name, &body)).await?;
            json!({ "name": name, "deleted": true })
        }
    };
    out.one(&v)
}

pub(crate) async fn routes(a: RoutesArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    let ops = c.ops();
    let v = match a.action {
        RoutesAction::List => {
            let v = c.op(ops.list_routes(&[])).await?;
            let rows: Vec<Value> = items(&v, "routes")
                .into_iter()
                .map(|mut r| {
                    r["sink"] = r["route"]["sink"].clone();
                    r["priorities"] = r["route"]["priorities"].clone();
                    r
                })
                .collect();
            return out.list(
                &rows,
                &[
                    "name",
                    "origin",
                    "sink",
                    "priorities",
                    "updated_at",
                    "by",
                    "reason",
                ],
            );
        }
        RoutesAction::Show { name } => c.op(ops.get_route(&name, &[])).await?,
        RoutesAction::Preview { name, delivery } => {
            let body = match delivery {
                Some(id) => json!({ "delivery_id": id }),
                None => json!({}),
            };
            c.op(ops.preview_route(&name, &body)).await?
        }
        RoutesAction::Set {
            name,
            sink,
            webhook_url,
            webhook_secret,
            no_signing,
            list,
            types,
            priorities,
            body,
            order_by,
            on_park,
            rate,
            json,
            reason,
        } => {
            let mut route = match json {
                Some(j) => serde_json::from_str::<Value>(&j)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| CliError::from("--json must be a JSON object"))?,
                None => json!({}),
            };
            for (k, v) in [
                ("sink", sink),
                ("url", webhook_url),
                ("secret", webhook_secret),
                ("list", list),
                ("body", body),
                ("rate", rate),
            ] {
                if let Some(v) = v {
                    route[k] = json!(v);
                }
            }
            if no_signing {
                route["secret"] = Value::Null;
            }
            if let Some(key) = order_by {
                route["ordering"] =
                    json!({"key": key, "on_park": on_park.unwrap_or_else(|| "hold".into())});
            }
            if !types.is_empty() {
                route["types"] = json!(types);
            }
            if !priorities.is_empty() {
                route["priorities"] = json!(priorities);
            }
            let body = json!({ "route": route, "reason": reason });
            let v = c.op(ops.put_route(&name, &body)).await?;
            for w in v["warnings"].as_array().into_iter().flatten() {
                eprintln!("warning: {}", w.as_str().unwrap_or_default());
            }
            v
        }
        RoutesAction::Delete { name, reason } => {
            let body = json!({ "reason": reason });
            c.op(ops.delete_route(&name, &body)).await?;
            json!({ "name": name, "deleted": true })
        }
    };
    out.one(&v)
}

pub(crate) async fn endpoints(a: EndpointsArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    let (route, enable, reason) = match a.action {
        EndpointsAction::List => {
            let v = c.op(c.ops().list_endpoints(&[])).await?;
            return out.list(
                &items(&v, "endpoints"),
                &[
                    "route",
                    "sink",
                    "state",
                    "attempts",
                    "successes",
                    "consecutive_failures",
                    "last_failure_code",
                    "last_failure_at",
                ],
            );
        }
        EndpointsAction::Disable { route, reason } => (route, false, reason),
        EndpointsAction::Enable { route, reason } => (route, true, reason),
    };
    let body = json!({ "reason": reason });
    let v = if enable {
        c.op(c.ops().enable_endpoint(&route, &body)).await?
    } else {
        c.op(c.ops().disable_endpoint(&route, &body)).await?
    };
    out.one(&v["endpoint"])
}

/// The records under a list's plural key (section 7: `{"deliveries": [...], ...}`).
pub(crate) fn items(v: &Value, key: &str) -> Vec<Value> {
    v[key].as_array().cloned().unwrap_or_default()
}
