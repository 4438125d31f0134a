//! `GET /v1/admin/overview`: the deployment at a glance for its operators (spec section 20),
//! an explicit fan-out over every tenant in its shard: each tenant's outbox KPIs, endpoints
//! and consumers read from its own shard's models with that shard's `as_of_seq`. There is no
//! order across shards, so nothing here claims one: each row says which seq of which shard
//! it reflects.

use std::collections::BTreeMap;

use axum::Json;
use serde::{Deserialize, Serialize};
use tidemark_projections::deliveries::read::Kpis;
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Problem};
use crate::request::Params;
use crate::routes::cursors::compute_lag;
use crate::routes::deliveries::{compute_kpis, interval_of};
use crate::routes::{events::parse_u64, read_model};
use crate::state::Api;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OverviewQuery {
    /// Window of `sent_last_interval`, 1–86400 s, default 60.
    #[param(value_type = Option<u64>, minimum = 1, maximum = 86400)]
    pub interval_s: Option<String>,
    /// `true`: only the tenants that need an operator (a stuck or parked delivery, an
    /// endpoint not `ok`, a stalled or stopped consumer). Default `false`.
    #[param(value_type = Option<bool>)]
    pub attention: Option<String>,
    /// Tenants per page, 1–1000, default 100 (by name).
    #[param(value_type = Option<u64>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
    /// The page after this tenant's name (a page's `next_after`).
    #[param(max_length = 32)]
    pub after: Option<String>,
}

/// A tenant's outbox, summed over its sinks.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct OutboxSummary {
    /// queued + leased + retry_wait.
    pub queue_depth: u64,
    pub queued: u64,
    pub leased: u64,
    pub retry_wait: u64,
    /// Pending and older than `outbox.stuck_after`.
    pub stuck: u64,
    pub parked: u64,
    /// Sent in the last `interval_s` seconds.
    pub sent_last_interval: u64,
    /// The oldest pending delivery's age, seconds (0 when none).
    pub oldest_pending_age_s: f64,
}

impl From<&Kpis> for OutboxSummary {
    fn from(k: &Kpis) -> Self {
        OutboxSummary {
            queue_depth: k.queue_depth,
            queued: k.queued,
            leased: k.leased,
            retry_wait: k.retry_wait,
            stuck: k.stuck,
            parked: k.parked,
            sent_last_interval: k.sent_last_interval,
            oldest_pending_age_s: k.oldest_pending_age_s,
        }
    }
}

/// Endpoints by state (`GET /v1/outbox/endpoints`' `state`).
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct EndpointCounts {
    pub total: u64,
    pub ok: u64,
    pub failing: u64,
    pub open: u64,
    pub disabled: u64,
    pub unresolved: u64,
}

impl EndpointCounts {
    fn count(&mut self, state: &str, n: u64) {
        self.total += n;
        match state {
            "ok" => self.ok += n,
            "failing" => self.failing += n,
            "open" => self.open += n,
            "disabled" => self.disabled += n,
            _ => self.unresolved += n,
        }
    }

    fn add(&mut self, o: &EndpointCounts) {
        for (state, n) in [
            ("ok", o.ok),
            ("failing", o.failing),
            ("open", o.open),
            ("disabled", o.disabled),
            ("unresolved", o.unresolved),
        ] {
            self.count(state, n);
        }
    }
}

/// An endpoint that is not `ok`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointBrief {
    /// The route's name, or `bridge:<subscription_id>`.
    pub route: String,
    #[schema(pattern = "^(failing|open|disabled|unresolved)$")]
    pub state: String,
    pub consecutive_failures: u64,
    pub last_failure_code: Option<String>,
}

/// Consumer cursors (and active bridge subscriptions).
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct ConsumerCounts {
    pub total: u64,
    pub stalled: u64,
    pub stopped: u64,
    /// The largest lag in events among them (0 when none).
    pub max_lag_events: u64,
}

/// A consumer that is stalled or stopped.
#[derive(Debug, Serialize, ToSchema)]
pub struct ConsumerBrief {
    pub consumer_id: String,
    pub lag_events: u64,
    pub stalled: bool,
    pub stopped: bool,
}

/// One tenant, read from its shard.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantOverview {
    pub tenant: String,
    pub shard: u32,
    /// The seq of its shard its models had folded through when read.
    pub as_of_seq: u64,
    pub outbox: OutboxSummary,
    pub endpoints: EndpointCounts,
    /// Its endpoints that are not `ok`.
    pub endpoints_attention: Vec<EndpointBrief>,
    pub consumers: ConsumerCounts,
    /// Its consumers that are stalled or stopped.
    pub consumers_attention: Vec<ConsumerBrief>,
    /// Whether it needs an operator (anything stuck or parked, or in the two lists above, or
    /// its shard could not be read).
    pub attention: bool,
    /// Why its shard could not be read now (its models lag past the read wait, or their store
    /// fails): the row's counts are then 0 and its `as_of_seq` what the shard had folded. The
    /// other tenants are read all the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One shard as this read saw it.
#[derive(Debug, Serialize, ToSchema)]
pub struct OverviewShard {
    pub shard: u32,
    /// Its head when the read began.
    pub head: u64,
    /// The least seq its tenants' rows reflect (each row has its own); of a shard without
    /// tenants, the seq its models had folded through.
    pub as_of_seq: u64,
    /// Its live tenants.
    pub tenants: u64,
}

/// Over every tenant of the deployment, whatever the page.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct OverviewTotals {
    pub tenants: u64,
    /// Tenants that need an operator.
    pub attention: u64,
    pub outbox: OutboxSummary,
    pub endpoints: EndpointCounts,
    pub consumers: ConsumerCounts,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OverviewPage {
    pub shards: Vec<OverviewShard>,
    pub totals: OverviewTotals,
    /// A page of tenants by name (`default` among them).
    pub tenants: Vec<TenantOverview>,
    /// Pass as `after` for the next page; absent on the last.
    pub next_after: Option<String>,
    /// The interval `sent_last_interval` covers, seconds.
    pub interval_s: u64,
}

/// Read one tenant from its shard's models (and its KPIs, for the totals).
async fn tenant_overview(t: &Api, interval_s: u64) -> Result<(TenantOverview, Kpis), ApiError> {
    let (all, _, as_of_seq) = compute_kpis(t, interval_s, Some(0)).await?;
    let (rows, _) = read_model(t.engine(), as_of_seq, |q| q.endpoints()).await?;
    let mut endpoints = EndpointCounts::default();
    let mut endpoints_attention = Vec::new();
    for (e, _) in rows {
        let state = e.state();
        endpoints.count(state, 1);
        if state != "ok" {
            endpoints_attention.push(EndpointBrief {
                state: state.to_owned(),
                consecutive_failures: e.consecutive_failures,
                last_failure_code: e.last_failure_code,
                route: e.route,
            });
        }
    }
    let lags = compute_lag(t).await?;
    let consumers = ConsumerCounts {
        total: lags.len() as u64,
        stalled: lags.iter().filter(|l| l.stalled).count() as u64,
        stopped: lags.iter().filter(|l| l.stopped).count() as u64,
        max_lag_events: lags.iter().map(|l| l.lag_events).max().unwrap_or(0),
    };
    let consumers_attention: Vec<ConsumerBrief> = lags
        .into_iter()
        .filter(|l| l.stalled || l.stopped)
        .map(|l| ConsumerBrief {
            consumer_id: l.consumer_id,
            lag_events: l.lag_events,
            stalled: l.stalled,
            stopped: l.stopped,
        })
        .collect();
    let attention = all.stuck > 0
        || all.parked > 0
        || !endpoints_attention.is_empty()
        || !consumers_attention.is_empty();
    let row = TenantOverview {
        tenant: t.tenant().to_owned(),
        shard: t.shard().engine.shard(),
        as_of_seq,
        outbox: OutboxSummary::from(&all),
        endpoints,
        endpoints_attention,
        consumers,
        consumers_attention,
        attention,
        error: None,
    };
    Ok((row, all))
}

/// Every tenant's outbox, endpoints and consumers, each read from its own shard with that
/// shard's `as_of_seq`, and their totals (spec section 20: a fan-out, not one order). The
/// totals cover every tenant; the rows are a page by name.
#[utoipa::path(
    get, path = "/v1/admin/overview", tag = "admin", operation_id = "getOverview",
    params(OverviewQuery),
    responses(
        (status = 200, body = OverviewPage),
        (status = 400, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = ["operator"]))
)]
#[tracing::instrument(skip_all)]
pub async fn overview(
    st: Api,
    Params(q): Params<OverviewQuery>,
) -> Result<Json<OverviewPage>, ApiError> {
    let interval_s = interval_of(q.interval_s.as_deref())?;
    let only_attention = match q.attention.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => {
            return Err(ApiError::invalid_query(format!(
                "attention must be true or false, got {v:?}"
            )));
        }
    };
    let limit = parse_u64("limit", q.limit.as_deref())?.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid_query("limit must be from 1 to 1000"));
    }
    // Any text orders against the names: a page starts after it, whatever it is.
    if q.after.as_ref().is_some_and(|a| a.chars().count() > 32) {
        return Err(ApiError::invalid_query(
            "after must be at most 32 characters (a page's next_after)",
        ));
    }
    // Each shard's head, and what its models had folded, as the read begins.
    let heads: Vec<(u64, u64)> = st.shards.iter().map(|s| s.head_and_folded()).collect();
    let mut tenants = crate::routes::every_tenant(&st, true).await?;
    tenants.sort_by(|a, b| a.tenant().cmp(b.tenant()));

    let mut totals = OverviewTotals::default();
    let mut total_kpis = Kpis::default();
    let mut shards: BTreeMap<u32, OverviewShard> = heads
        .iter()
        .enumerate()
        .map(|(i, &(head, folded))| {
            let shard = i as u32;
            let s = OverviewShard {
                shard,
                head,
                as_of_seq: folded,
                tenants: 0,
            };
            (shard, s)
        })
        .collect();
    let mut page = Vec::new();
    let mut next_after = None;
    for t in &tenants {
        let shard = t.shard().engine.shard();
        let (row, kpis) = match tenant_overview(t, interval_s).await {
            Ok(r) => r,
            // One shard in trouble does not hide the others: its tenants say why.
            Err(e) => {
                let folded = heads.get(shard as usize).map_or(0, |h| h.1);
                let row = TenantOverview {
                    tenant: t.tenant().to_owned(),
                    shard,
                    as_of_seq: folded,
                    outbox: OutboxSummary::default(),
                    endpoints: EndpointCounts::default(),
                    endpoints_attention: Vec::new(),
                    consumers: ConsumerCounts::default(),
                    consumers_attention: Vec::new(),
                    attention: true,
                    error: Some(e.problem.detail.clone()),
                };
                (row, Kpis::default())
            }
        };
        if let Some(s) = shards.get_mut(&row.shard) {
            // The first of its tenants sets it; the least of them stands.
            s.as_of_seq = if s.tenants == 0 {
                row.as_of_seq
            } else {
                s.as_of_seq.min(row.as_of_seq)
            };
            s.tenants += 1;
        }
        totals.tenants += 1;
        totals.attention += u64::from(row.attention);
        total_kpis.add(&kpis);
        totals.endpoints.add(&row.endpoints);
        totals.consumers.total += row.consumers.total;
        totals.consumers.stalled += row.consumers.stalled;
        totals.consumers.stopped += row.consumers.stopped;
        totals.consumers.max_lag_events = totals
            .consumers
            .max_lag_events
            .max(row.consumers.max_lag_events);
        let listed = q.after.as_deref().is_none_or(|a| row.tenant.as_str() > a)
            && (row.attention || !only_attention);
        if !listed {
            continue;
        }
        if page.len() as u64 == limit {
            next_after = page.last().map(|r: &TenantOverview| r.tenant.clone());
            continue;
        }
        page.push(row);
    }
    totals.outbox = OutboxSummary::from(&total_kpis);
    Ok(Json(OverviewPage {
        shards: shards.into_values().collect(),
        totals,
        tenants: page,
        next_after,
        interval_s,
    }))
}
