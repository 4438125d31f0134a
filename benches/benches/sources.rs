//! Source benchmark (issue 14): items per second a source appends from a fast local upstream
//! with pages of 1000 — the release server as a child process, an upstream on loopback in this
//! process that serves pre-built pages (`afterId` → the next page, `hasMore`/`nextAfterId`),
//! the clock from the upstream's first request to the source's `items_total` reaching the
//! backlog (every page appended as one command at the head, then its watermark
//! compare-and-swap, as section 12 says).
//!
//! ```sh
//! cargo build --release -p tidemark-api
//! cargo bench -p tidemark-benches --bench sources -- [--items 200000] [--page 1000] [--ack]
//! ```

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use clap::Parser;
use common::*;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(name = "sources")]
struct Opts {
    /// Items of the backlog.
    #[arg(long, default_value_t = 200_000)]
    items: usize,
    /// Items per page (≤ 1000).
    #[arg(long, default_value_t = 1000)]
    page: usize,
    /// Acknowledge every page upstream too.
    #[arg(long)]
    ack: bool,
    /// The server binary (default: `<target dir>/release/tidemark`).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

struct Upstream {
    pages: Vec<bytes::Bytes>,
    empty: bytes::Bytes,
    page: usize,
    first: Mutex<Option<Instant>>,
}

#[derive(serde::Deserialize)]
struct Q {
    #[serde(rename = "afterId")]
    after_id: Option<String>,
}

async fn list(State(up): State<Arc<Upstream>>, Query(q): Query<Q>) -> axum::response::Response {
    up.first.lock().unwrap().get_or_insert_with(Instant::now);
    let index = match q.after_id.and_then(|a| a.parse::<usize>().ok()) {
        None => 0,
        Some(after) => (after + 1) / up.page,
    };
    let body = up
        .pages
        .get(index)
        .cloned()
        .unwrap_or_else(|| up.empty.clone());
    ([("content-type", "application/json")], body).into_response()
}

use axum::response::IntoResponse as _;

async fn ack() -> &'static str {
    "{}"
}

fn main() -> std::process::ExitCode {
    run_main("sources", run)
}

fn run(opts: &Opts) -> Result<(), String> {
    let bin = server_bin(opts.server_bin.as_ref())?;
    warn_if_stale(&bin);
    let page = opts.page.clamp(1, 1000);
    let mut pages = Vec::new();
    for start in (0..opts.items).step_by(page) {
        let end = (start + page).min(opts.items);
        let data: Vec<_> = (start..end)
            .map(|i| json!({"id": format!("{i:08}"), "plan": {"name": format!("plan {i}"), "updated": "2026-11-23T10:00:00Z"}}))
            .collect();
        let v = json!({"data": data, "pagination": {"nextAfterId": format!("{:08}", end - 1), "hasMore": end < opts.items}});
        pages.push(bytes::Bytes::from(v.to_string()));
    }
    let up = Arc::new(Upstream {
        pages,
        empty: bytes::Bytes::from(
            json!({"data": [], "pagination": {"nextAfterId": null, "hasMore": false}}).to_string(),
        ),
        page,
        first: Mutex::new(None),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let addr = rt.block_on(async {
        let app = axum::Router::new()
            .route("/items", axum::routing::get(list))
            .route("/ack", axum::routing::post(ack))
            .with_state(up.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        tokio::spawn(async move { axum::serve(l, app).await });
        Ok::<_, String>(addr)
    })?;
    let dir = tempfile::tempdir_in(work_dir(None)?).map_err(|e| e.to_string())?;
    let ack = if opts.ack {
        format!("[sources.ack]\nurl = \"http://{addr}/ack\"\nfield = \"ids\"\n")
    } else {
        String::new()
    };
    let config = format!(
        "[[sources]]\nname = \"bench\"\nurl = \"http://{addr}/items\"\nevery = \"1h\"\n\
         max_pages_per_poll = 1000\npage_size = {page}\n{ack}\
         [sources.watermark]\nrequest_field = \"afterId\"\nnext = \"/pagination/nextAfterId\"\n\
         has_more = \"/pagination/hasMore\"\n[sources.items]\npath = \"/data\"\nid = \"/id\"\n"
    );
    let server = Server::start(&bin, dir.path(), &config)?;
    let client = reqwest::Client::new();
    let done = rt.block_on(async {
        server.wait_ready(&client).await?;
        let url = server.url("/v1/sources/bench");
        loop {
            let v = tidemark_benches::http::get_json(&client, &url).await?;
            if v["items_total"].as_u64() == Some(opts.items as u64) {
                return Ok::<_, String>((Instant::now(), v));
            }
            if v["state"] == "parked" {
                return Err(format!("the source parked: {v}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })?;
    let first = up
        .first
        .lock()
        .unwrap()
        .ok_or("the upstream was never asked")?;
    let secs = done.0.duration_since(first).as_secs_f64();
    let rate = opts.items as f64 / secs;
    eprintln!(
        "sources: {} items in pages of {page}{} in {secs:.2} s: {rate:.0} items/s (watermark {})",
        opts.items,
        if opts.ack { " with acks" } else { "" },
        done.1["watermark"]
    );
    println!(
        "{}",
        json!({"items": opts.items, "page": page, "ack": opts.ack, "seconds": secs, "items_per_sec": rate})
    );
    server.stop()
}
