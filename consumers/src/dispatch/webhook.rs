//! The webhook adapter (spec section 17): a delivery of a route with `sink = "webhook"` is
//! POSTed as JSON to the route's `url`, signed under its `secret` as section 6 says
//! (`webhook-id` = the delivery id, `webhook-timestamp`, `webhook-signature` and
//! `tidemark-signature`), so a receiver can verify it and drop a repeat. 2xx → sent; 408, 429
//! (its `Retry-After` honoured), 5xx and connection errors → transient; other 4xx → permanent.
//! `resolved_targets` names the endpoint by scheme, host and port only (the URL may carry a
//! secret).

use std::collections::HashMap;

use tidemark_projections::deliveries::Delivery;
use tidemark_projections::names::Sink;
use tidemark_projections::routing::RouteConfig;
use tidemark_projections::routing::body::{self, BodyConfig, Rendered};

use super::{Adapter, Outcome, resolve};
use crate::bridge::{Signatures, receiver_retry_after_ms};
use tidemark_engine::Engine;
use tidemark_engine::commands::routes::{NodeCheck, unset_env};

/// The code of an attempt whose route names an `env:` this node lacks.
pub const UNRESOLVED: &str = "endpoint_unresolved";

/// `[sinks.webhook]`.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    #[serde(default = "default_timeout")]
    pub timeout: String,
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            timeout: default_timeout(),
            concurrency: default_concurrency(),
        }
    }
}

fn default_timeout() -> String {
    "10s".into()
}

fn default_concurrency() -> usize {
    4
}

/// Where a route's deliveries go.
#[derive(Clone)]
pub struct Target {
    pub url: reqwest::Url,
    pub secret: Option<String>,
    /// The secret before a rotation, while it still signs beside `secret` (section 4: both
    /// signatures are sent, so a receiver with either key accepts the message).
    pub previous: Option<String>,
    /// What the receiver is sent (`None`: tidemark's body).
    pub body: Option<BodyConfig>,
    /// The route's own headers, their `env:` references read.
    pub headers: Vec<(String, String)>,
}

impl Target {
    /// `url`, `secret`, `body` and `headers` of `[notifications.routes.<route>]` (the url,
    /// the secret and each header's value may be `env:NAME`).
    pub fn of(route: &str, cfg: &RouteConfig) -> Result<Target, String> {
        let url = cfg
            .url
            .as_deref()
            .ok_or_else(|| format!("route {route:?} has no webhook url"))?;
        let mut t = Target::new(route, url, cfg.secret.as_deref())?;
        t.body.clone_from(&cfg.body);
        for (name, v) in cfg.headers.iter().flatten() {
            let v = resolve(v, &format!("notifications.routes.{route}.headers.{name}"))?;
            t.headers.push((name.clone(), v));
        }
        Ok(t)
    }

    /// `url` and `secret` of `[notifications.routes.<route>]` (each may be `env:NAME`).
    pub fn new(route: &str, url: &str, secret: Option<&str>) -> Result<Target, String> {
        let k = |f: &str| format!("notifications.routes.{route}.{f}");
        let url = resolve(url, &k("url"))?;
        let url = reqwest::Url::parse(&url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or_else(|| format!("{} must be an http:// or https:// URL", k("url")))?;
        let secret = secret.map(|s| resolve(s, &k("secret"))).transpose()?;
        Ok(Target {
            url,
            secret,
            previous: None,
            body: None,
            headers: Vec::new(),
        })
    }

    /// What `resolved_targets` says of it: scheme, host and port.
    pub fn shown(&self) -> String {
        endpoint(&self.url)
    }
}

/// An endpoint as tidemark names it where the URL itself could be a secret: scheme, host and
/// port (`resolved_targets`, `GET /v1/routes`).
pub fn endpoint(u: &reqwest::Url) -> String {
    tidemark_projections::secrets::shown(u).unwrap_or_else(|| {
        format!(
            "{}://:{}",
            u.scheme(),
            u.port_or_known_default().unwrap_or(0)
        )
    })
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

/// The webhook sink: every webhook route's target, the configuration file's (read at start)
/// and those managed at runtime (read from the routes model at each attempt, so a changed
/// route is used from the next attempt on).
pub struct Webhook {
    http: reqwest::Client,
    routes: HashMap<String, Target>,
    concurrency: usize,
    engine: std::sync::OnceLock<Engine>,
    /// The server's public address, for the console links of the bodies.
    console: Option<String>,
}

impl Webhook {
    pub fn new(cfg: &WebhookConfig, routes: HashMap<String, Target>) -> Result<Webhook, String> {
        let (timeout, concurrency) = super::pool("webhook", &cfg.timeout, cfg.concurrency)?;
        let http = reqwest::Client::builder()
            .user_agent(crate::USER_AGENT)
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Webhook {
            http,
            routes,
            concurrency,
            engine: std::sync::OnceLock::new(),
            console: None,
        })
    }

    /// Link deliveries to the console at `base` (`https://tidemark.example.org`).
    #[must_use]
    pub fn with_console(mut self, base: Option<String>) -> Webhook {
        self.console = base;
        self
    }
}

impl Webhook {
    /// Where a delivery of `route` of `tenant` (`None`: the default tenant) goes: the file's
    /// route (the default tenant's), else the route managed at runtime as the tenant's models
    /// hold it now (its `env:` references read from this node's environment).
    async fn target(&self, tenant: Option<&Engine>, route: &str) -> Result<Target, Outcome> {
        let default = tenant.is_none_or(|t| t.tenant() == tidemark_log::DEFAULT_TENANT);
        if default && let Some(t) = self.routes.get(route) {
            return Ok(t.clone());
        }
        let no_endpoint = || Outcome::Permanent {
            code: "no_endpoint".into(),
            error: format!("route {route:?} has no webhook url"),
        };
        let Some(engine) = tenant.cloned().or_else(|| self.engine.get().cloned()) else {
            return Err(no_endpoint());
        };
        let name = route.to_owned();
        let row = tokio::task::spawn_blocking(move || engine.read().route(&name))
            .await
            .map_err(|_| no_endpoint())?
            .map_err(|e| Outcome::Transient {
                code: "models_unavailable".into(),
                error: e.to_string(),
                retry_after_ms: None,
            })?;
        let row = row.ok_or_else(no_endpoint)?;
        let spec = row.spec().ok_or_else(no_endpoint)?;
        if spec.config.url.is_none() {
            return Err(no_endpoint());
        }
        // An `env:` reference this node cannot read: another node may; retried.
        let unresolved = |error| Outcome::Transient {
            code: UNRESOLVED.into(),
            error,
            retry_after_ms: None,
        };
        let mut t = Target::of(route, &spec.config).map_err(unresolved)?;
        let now_us = tidemark_log::time::now_micros();
        if let Some(p) = row.previous_secret_at(now_us) {
            t.previous = Some(
                resolve(p, &format!("the previous secret of route {route}")).map_err(unresolved)?,
            );
        }
        Ok(t)
    }
}

/// Look at the webhook routes managed through the API (all of them, or `only`) with this
/// node's environment and record which it cannot resolve (`endpoint.unresolved`: their
/// deliveries wait without spending attempts, listed `unresolved` in
/// `GET /v1/outbox/endpoints`) and which it resolves again (spec section 17). Run at start,
/// and after an attempt found a route unresolved (changed through another node).
pub async fn check_api_routes(engine: &Engine, only: Option<&str>) {
    let e = engine.clone();
    let rows = match tokio::task::spawn_blocking(move || e.read().routes()).await {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "reading the routes to resolve their env: failed");
            return;
        }
        Err(_) => return,
    };
    let found: Vec<(String, Vec<String>)> = rows
        .iter()
        .filter(|r| only.is_none_or(|o| o == r.name))
        .filter_map(|r| {
            let spec = r.spec()?;
            (spec.config.sink == Some(Sink::Webhook))
                .then(|| (r.name.clone(), unset_env(&spec, NodeCheck::here(true))))
        })
        .collect();
    for (route, unset) in &found {
        if !unset.is_empty() {
            tracing::error!(
                target: "tidemark::endpoints",
                route = %route,
                unset = %unset.join(", "),
                "webhook route unresolved on this node: its deliveries wait until the \
                 variable is set (and the server restarted) or the route is set again"
            );
        }
    }
    if found.is_empty() {
        return;
    }
    let cmd = tidemark_engine::commands::outbox::ResolveEndpoints {
        found,
        node: engine.leases().node().to_owned(),
    };
    if let Err(e) = engine.execute(cmd).await {
        tracing::warn!(error = %e, "recording the routes' env: resolution failed");
    }
}

/// What the receiver of `target` is sent for `d`, linked to the console at `console`.
pub fn render(target: &Target, d: &Delivery, console: Option<&str>) -> Result<Rendered, String> {
    body::render(target.body.as_ref(), &d.template_context(console))
}

impl Adapter for Webhook {
    fn sink(&self) -> Sink {
        Sink::Webhook
    }

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    fn to_people(&self) -> bool {
        false
    }

    fn start(&self, engine: &Engine) {
        let _ = self.engine.set(engine.clone());
    }

    fn endpoint<'a>(
        &'a self,
        route: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + 'a>> {
        Box::pin(async move { self.target(None, route).await.ok().map(|t| t.shown()) })
    }

    fn deliver(
        &self,
        tenant: Engine,
        d: Delivery,
        _: Vec<super::Target>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send + '_>> {
        Box::pin(async move {
            let target = match self.target(Some(&tenant), &d.route).await {
                Ok(t) => t,
                Err(o) => return o,
            };
            let target = &target;
            // Checked when the route was set: a failure here is a template the sample
            // rendered and this delivery does not (a value past the size bound, say).
            let Rendered {
                content_type,
                bytes: payload,
            } = match render(target, &d, self.console.as_deref()) {
                Ok(r) => r,
                Err(e) => {
                    return Outcome::Permanent {
                        code: "invalid_message".into(),
                        error: e,
                    };
                }
            };
            let timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|t| t.as_secs())
                .unwrap_or(0);
            let mut rb = self
                .http
                .post(target.url.clone())
                .header("content-type", content_type)
                .header("webhook-id", d.id.as_str())
                .header("webhook-timestamp", timestamp.to_string());
            for (name, value) in &target.headers {
                rb = rb.header(name.as_str(), value.as_str());
            }
            // The signatures cover the bytes sent, whatever their shape.
            if let Some(secret) = &target.secret {
                let sig = Signatures::new(secret, d.id.as_str(), timestamp, &payload);
                // During a rotation's overlap, the old key's signature beside the new one's
                // (`v1,<new> v1,<old>`, as Standard Webhooks lists several).
                let standard = match &target.previous {
                    Some(old) => format!(
                        "{} {}",
                        sig.standard,
                        Signatures::new(old, d.id.as_str(), timestamp, &payload).standard
                    ),
                    None => sig.standard,
                };
                rb = rb
                    .header("webhook-signature", standard)
                    .header("tidemark-signature", sig.legacy);
            }
            match rb.body(payload).send().await {
                Ok(r) => answered(
                    r.status().as_u16(),
                    r.headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok()),
                    || target.shown(),
                ),
                Err(e) if e.is_timeout() => Outcome::Transient {
                    code: "http_timeout".into(),
                    error: "the endpoint did not answer in time".into(),
                    retry_after_ms: None,
                },
                Err(_) => Outcome::Transient {
                    code: "http_connection".into(),
                    error: "the endpoint could not be reached".into(),
                    retry_after_ms: None,
                },
            }
        })
    }
}

/// What an endpoint's answer makes of an attempt: 2xx sent (to the endpoint `shown` names);
/// 408, 429 and 5xx transient, after the wait a 429 or 503 asks for in `Retry-After`; any
/// other status (a redirect, which is not followed, or a 4xx) permanent.
fn answered(status: u16, retry_after: Option<&str>, shown: impl FnOnce() -> String) -> Outcome {
    if (200..300).contains(&status) {
        return Outcome::Sent(vec![shown()]);
    }
    let code = format!("http_{status}");
    let error = format!("the endpoint answered {status}");
    if status == 408 || status == 429 || status >= 500 {
        Outcome::Transient {
            code,
            error,
            retry_after_ms: receiver_retry_after_ms(status, retry_after),
        }
    } else {
        Outcome::Permanent { code, error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_of_an_endpoint_maps_to_its_outcome() {
        let shown = || "https://hooks.example:443".to_owned();
        for status in [200, 201, 202, 204, 299] {
            assert_eq!(
                answered(status, Some("60"), shown),
                Outcome::Sent(vec![shown()]),
                "{status}"
            );
        }
        // Try again: a timeout, too many requests, and every server error.
        for (status, retry_after, wait) in [
            (408, None, None),
            (408, Some("60"), None),
            (429, None, None),
            (429, Some("7"), Some(7_000)),
            (429, Some("99999"), Some(3_600_000)),
            (500, Some("7"), None),
            (502, None, None),
            (503, Some("2"), Some(2_000)),
            (503, Some("soon"), None),
            (504, None, None),
            (599, None, None),
        ] {
            assert_eq!(
                answered(status, retry_after, shown),
                Outcome::Transient {
                    code: format!("http_{status}"),
                    error: format!("the endpoint answered {status}"),
                    retry_after_ms: wait,
                },
                "{status} {retry_after:?}"
            );
        }
        // Park it: what asking again would not change (a redirect is not followed).
        for status in [100, 301, 302, 400, 401, 403, 404, 410, 413, 422] {
            assert_eq!(
                answered(status, Some("7"), shown),
                Outcome::Permanent {
                    code: format!("http_{status}"),
                    error: format!("the endpoint answered {status}"),
                },
                "{status}"
            );
        }
    }
}
