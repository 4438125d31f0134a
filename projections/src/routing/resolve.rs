//! What the settings decide for one notification: the routes it takes ([`resolve_routes`]),
//! and the delay before a retry ([`backoff_ms`]).

use super::{RetrySettings, RoutingSettings, Sink, Strategy};

/// What a route does for one notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteOutcome {
    /// A delivery row with this sink.
    Deliver { route: String, sink: Sink },
    /// A delivery row that is never delivered, with its reason code.
    Skipped { route: String, reason: &'static str },
}

/// Routes a notification of `priority` and `ntype` (its `type`, if any) takes under `s` (spec
/// sections 2 and 4). The dashboard is the notification row itself and yields nothing here; a
/// route restricted to `types` is not taken by a notification of another type or of none.
pub fn resolve_routes(
    s: &RoutingSettings,
    priority: &str,
    ntype: Option<&str>,
) -> Vec<RouteOutcome> {
    if !s.enabled {
        return Vec::new();
    }
    // What tidemark tells operators takes the operational route, and only it (section 17).
    if ntype == Some(super::OPERATIONAL_TYPE) {
        let Some(op) = &s.operational else {
            return Vec::new();
        };
        let route = op.route.clone();
        return match route.as_str() {
            "dashboard" => Vec::new(),
            "desktop" if s.desktop_enabled => vec![RouteOutcome::Deliver {
                route,
                sink: Sink::App,
            }],
            _ => match s.routes.get(&route).and_then(|p| p.sink) {
                Some(sink) => vec![RouteOutcome::Deliver { route, sink }],
                None => vec![RouteOutcome::Skipped {
                    route,
                    reason: "unknown_route",
                }],
            },
        };
    }
    let Some(routes) = s.routing.get(priority) else {
        return Vec::new();
    };
    let mut out: Vec<RouteOutcome> = Vec::new();
    for route in routes {
        if out.iter().any(|o| match o {
            RouteOutcome::Deliver { route: r, .. } | RouteOutcome::Skipped { route: r, .. } => {
                r == route
            }
        }) {
            continue;
        }
        if let Some(types) = s.routes.get(route).and_then(|p| p.types.as_ref())
            && !ntype.is_some_and(|t| types.iter().any(|x| x == t))
        {
            continue;
        }
        match route.as_str() {
            "dashboard" => {}
            "desktop" => {
                if s.desktop_enabled && s.desktop_priorities.iter().any(|p| p == priority) {
                    out.push(RouteOutcome::Deliver {
                        route: route.clone(),
                        sink: Sink::App,
                    });
                }
            }
            _ => match s.routes.get(route).and_then(|p| p.sink.as_ref()) {
                Some(sink) => out.push(RouteOutcome::Deliver {
                    route: route.clone(),
                    sink: *sink,
                }),
                None => out.push(RouteOutcome::Skipped {
                    route: route.clone(),
                    reason: "unknown_route",
                }),
            },
        }
    }
    out
}

/// Delay before attempt `attempt + 1` after `attempt` failures (attempt ≥ 1): by the strategy
/// `base · 2^(attempt−1)` (exponential), `base · attempt` (linear) or `base` (fixed), at most
/// `max`, then jitter within ±`jitter` given a draw `u` in [0, 1), capped at `max`. A
/// `retry_after_ms` from the failure report replaces it (capped at 1 h). The one backoff of
/// tidemark: deliveries (section 5) and source polls (section 12) use it.
pub fn backoff_ms(r: &RetrySettings, attempt: u32, u: f64, retry_after_ms: Option<u64>) -> u64 {
    if let Some(ms) = retry_after_ms {
        return ms.min(3_600_000);
    }
    let n = attempt.max(1);
    let raw = match r.strategy {
        Strategy::Exponential => r.base_delay_ms.saturating_mul(1u64 << (n - 1).min(62)),
        Strategy::Linear => r.base_delay_ms.saturating_mul(u64::from(n)),
        Strategy::Fixed => r.base_delay_ms,
    }
    .min(r.max_delay_ms);
    let factor = 1.0 + r.jitter * (2.0 * u.clamp(0.0, 1.0) - 1.0);
    ((raw as f64 * factor).round() as u64).min(r.max_delay_ms)
}
