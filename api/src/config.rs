//! Settings: the commented defaults embedded in the binary, then the file, then `TIDEMARK_*`
//! environment variables. Validated once at start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};

pub const DEFAULTS_TOML: &str = include_str!("defaults.toml");

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub log: LogSettings,
    pub auth: AuthConfig,
    /// Notification routing settings (spec section 4). Kept as the TOML tree so every key the
    /// spec names reaches the log's `settings.updated` event unchanged; the reactors that use
    /// them parse their part.
    pub notifications: toml::Table,
    /// Source pollers (spec section 12), `[[sources]]`.
    #[serde(default)]
    pub sources: Vec<tidemark_consumers::sources::SourceConfig>,
    /// The key of zero-PII routes (spec section 14).
    #[serde(default)]
    pub privacy: PrivacyConfig,
    /// What leaves the read models, and when (spec section 13).
    pub retention: RetentionConfig,
    /// The sinks tidemark delivers itself (spec section 17), `[sinks.email]`, `[sinks.webhook]`.
    #[serde(default)]
    pub sinks: SinksConfig,
}

/// `[sinks]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinksConfig {
    pub email: Option<tidemark_consumers::dispatch::email::EmailConfig>,
    pub webhook: Option<tidemark_consumers::dispatch::webhook::WebhookConfig>,
}

fn one() -> u32 {
    1
}

fn tenant_labels() -> usize {
    tidemark_engine::labels::DEFAULT_TENANT_LABELS
}

fn text() -> String {
    "text".to_owned()
}

/// `[retention]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Terminal rows leave the read models this long after their last change ("365d").
    pub window: String,
    /// How often the purge runs ("24h").
    pub run_every: String,
    /// Also drop the log's events older than the window (after snapshots of every read model,
    /// keeping what a live cursor still needs).
    pub compact_log: bool,
}

/// `[privacy]`: `hmac_key = "env:NAME"` names the environment variable holding the key of the
/// redacting routes (its UTF-8 bytes). The key itself never enters the config file, the log
/// or `settings.updated`.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivacyConfig {
    pub hmac_key: Option<String>,
}

impl std::fmt::Debug for PrivacyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivacyConfig")
            .field(
                "hmac_key",
                &self.hmac_key.as_ref().map(|_| "<env reference>"),
            )
            .finish()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub data: PathBuf,
    pub max_body_bytes: usize,
    pub sse_max_clients: usize,
    pub keepalive_secs: u64,
    pub shutdown_grace_secs: u64,
    /// Longest long-poll `wait_ms` of `GET /v1/bridges/{id}/deliveries` (≤ 30000).
    pub max_wait_ms: u64,
    /// Origins (`https://host[:port]`) whose browsers may call the API (section 8).
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// Where backups taken through the server are written (section 18); empty: `backups` in
    /// the data directory.
    #[serde(default)]
    pub backup_dir: PathBuf,
    /// `text` or `json` (one object per line): how log lines are written (section 18; also
    /// `TIDEMARK_LOG_FORMAT`).
    #[serde(default = "text")]
    pub log_format: String,
    /// HTTPS (section 18): the PEM certificate chain and private key; both or neither.
    #[serde(default)]
    pub tls_cert: PathBuf,
    #[serde(default)]
    pub tls_key: PathBuf,
    /// Where users reach this server (`https://tidemark.example.org`): the base of the console
    /// links webhook bodies carry. Empty: its listen address.
    #[serde(default)]
    pub public_url: String,
    /// How many tenants the metrics' `tenant` label names (spec section 20); the rest are
    /// `other` (`tidemark_engine::labels`).
    #[serde(default = "tenant_labels")]
    pub metrics_tenant_labels: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub cache_mb: usize,
    pub merge_threshold: usize,
    pub max_group_events: usize,
    pub queue_capacity: usize,
    pub quick_repair: bool,
    /// Free space kept in reserve where the log lives ("64MiB", "1GiB", or bytes): under it,
    /// appends and commands are refused with 507 (spec section 1, I10).
    pub min_free: String,
    /// Memory for the `event_id` index's filter pages ("32MiB"); the filters are on disk, so
    /// memory stays flat as the log grows (I9).
    pub id_filter_cache: String,
    /// `embedded` or `jetstream` (spec section 16).
    pub backend: String,
    /// The cluster's servers (`nats://host:port`), for `jetstream`.
    pub servers: Vec<String>,
    /// The stream's name, for `jetstream` (created if absent).
    pub stream: String,
    /// Replicas of a stream this node creates, for `jetstream`.
    pub replicas: usize,
    /// How long a lease on once-per-cluster work outlives its node's last renewal, for
    /// `jetstream` ("6s"; 1 s to 5 min).
    pub lease_ttl: String,
    /// Publishes one node keeps in flight, for `jetstream` (beyond them: 429).
    pub publish_window: usize,
    /// How many logs the deployment's tenants are spread over (spec section 20), each with
    /// its own `event_seq`, group commit, models and decider: shard 0 is the data directory's
    /// own files, shard n is `shards/<n>/` in it; on `jetstream` shard 0 is `stream` and
    /// shard n the stream `<stream>_s<n>`, each with its replica and models in its directory.
    #[serde(default = "one")]
    pub shards: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub tokens: Vec<TokenConfig>,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub name: String,
    /// Hex SHA-256 of the token text; the text itself is never stored.
    pub sha256: String,
    pub scopes: Vec<String>,
    /// A request rate, `"<count>/<s|m|h>"` (e.g. `"100/m"`): a token bucket of `count`
    /// requests refilled continuously over the period (spec section 8). None: no limit.
    #[serde(default)]
    pub rate: Option<String>,
    /// The tenant the token acts for (spec section 20); `"*"` (the default): the deployment's
    /// operators, who name a tenant by a path prefix (`/tenants/{tenant}/v1/…`) or act for the
    /// default tenant.
    #[serde(default = "any_tenant")]
    pub tenant: String,
}

fn any_tenant() -> String {
    "*".to_owned()
}

impl std::fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConfig")
            .field("name", &self.name)
            .field("sha256", &"<redacted>")
            .field("scopes", &self.scopes)
            .field("rate", &self.rate)
            .field("tenant", &self.tenant)
            .finish()
    }
}

pub const SCOPES: [&str; 5] = ["append", "read", "bridge", "operator", "admin"];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// A figment error in the file's own terms: the key as written (`server.listn`, not figment's
/// internal profile path `default.server.listn`), what it must be, and where it was set.
fn figment_message(e: figment::Error) -> String {
    use figment::error::Kind;
    e.into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let what = match &e.kind {
                Kind::UnknownField(field, known) => {
                    let table = e.path[..e.path.len().saturating_sub(1)].join(".");
                    let known = known.join(", ");
                    if table.is_empty() {
                        format!("{field} is not a known section (known: {known})")
                    } else {
                        format!("{key} is not a known key of [{table}] (known: {known})")
                    }
                }
                Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
                    let expected = match expected.as_str() {
                        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number, 0 or more",
                        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number",
                        "f32" | "f64" => "a number",
                        "bool" => "true or false",
                        other => other,
                    };
                    format!("{key} is {actual}: it must be {expected}")
                }
                Kind::MissingField(field) if key.is_empty() => format!("{field} is missing"),
                Kind::MissingField(field) => format!("{key}.{field} is missing"),
                other if key.is_empty() => other.to_string(),
                other => format!("{key}: {other}"),
            };
            let from = e.metadata.as_ref().map(|m| match &m.source {
                Some(figment::Source::File(p)) => format!(" (in {})", p.display()),
                _ => format!(" (from {})", m.name),
            });
            format!("{what}{}", from.unwrap_or_default())
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl Config {
    /// Defaults, then `file` (when given), then `TIDEMARK_*` variables.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Toml::string(DEFAULTS_TOML));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file(path));
        }
        fig = fig.merge(
            // Only SECTION__KEY variables are settings; single-word ones (TIDEMARK_DATA,
            // TIDEMARK_TOKEN, TIDEMARK_FAULT_*) belong to the CLI or to tests.
            Env::prefixed("TIDEMARK_")
                .filter(|k| k.as_str().contains("__"))
                .split("__"),
        );
        let mut cfg: Config = fig
            .extract()
            .map_err(|e| ConfigError::Invalid(figment_message(e)))?;
        if let Ok(f) = std::env::var("TIDEMARK_LOG_FORMAT") {
            cfg.server.log_format = f;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The built-in defaults alone.
    pub fn defaults() -> Config {
        Figment::from(Toml::string(DEFAULTS_TOML))
            .extract()
            .expect("the embedded defaults parse")
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        for t in &self.auth.tokens {
            if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad(format!(
                    "auth token {:?}: sha256 must be 64 hex digits",
                    t.name
                ));
            }
            if let Some(r) = &t.rate
                && crate::auth::parse_rate(r).is_none()
            {
                return bad(format!(
                    "auth token {:?}: rate {r:?} must be <count>/<s|m|h> with a count of 1 to \
                     1000000 (e.g. \"100/m\")",
                    t.name
                ));
            }
            if t.tenant != "*"
                && let Err(e) = tidemark_log::check_tenant(&t.tenant)
            {
                return bad(format!(
                    "auth token {:?}: tenant {:?}: {e} (or \"*\" for every tenant)",
                    t.name, t.tenant
                ));
            }
            if let Some(s) = t.scopes.iter().find(|s| !SCOPES.contains(&s.as_str())) {
                return bad(format!(
                    "auth token {:?}: unknown scope {s:?} (known: {})",
                    t.name,
                    SCOPES.join(", ")
                ));
            }
        }
        if self.server.max_body_bytes == 0 || self.server.sse_max_clients == 0 {
            return bad("server.max_body_bytes and server.sse_max_clients must be positive".into());
        }
        if !matches!(self.server.log_format.as_str(), "text" | "json") {
            return bad(format!(
                "server.log_format (or TIDEMARK_LOG_FORMAT) is {:?}: text or json",
                self.server.log_format
            ));
        }
        if self.server.tls_cert.as_os_str().is_empty() != self.server.tls_key.as_os_str().is_empty()
        {
            return bad(
                "server.tls_cert and server.tls_key go together: set both, or neither".into(),
            );
        }
        if self.server.metrics_tenant_labels > 10_000 {
            return bad("server.metrics_tenant_labels must be at most 10000".into());
        }
        if self.server.max_wait_ms > 30_000 {
            return bad("server.max_wait_ms must be at most 30000".into());
        }
        for o in &self.server.cors_origins {
            if !is_origin(o) {
                return bad(format!(
                    "server.cors_origins: {o:?} is not an origin (scheme://host[:port], \
                     e.g. \"https://ops.example.org\")"
                ));
            }
        }
        if !self.server.public_url.is_empty() && !is_base_url(&self.server.public_url) {
            // The value is not repeated: one with credentials in it must not reach the log.
            return bad(
                "server.public_url is not a base URL: http(s)://host[:port][/path], with \
                 no credentials, query or fragment (e.g. \"https://tidemark.example.org\")"
                    .into(),
            );
        }
        if self.server.keepalive_secs == 0 || self.server.keepalive_secs > 15 {
            return bad("server.keepalive_secs must be between 1 and 15".into());
        }
        if self.log.cache_mb == 0 || self.log.merge_threshold == 0 || self.log.max_group_events == 0
        {
            return bad(
                "log.cache_mb, log.merge_threshold and log.max_group_events must be positive"
                    .into(),
            );
        }
        if !(1..=64).contains(&self.log.shards) {
            return bad("log.shards must be between 1 and 64".into());
        }
        match self.log.backend.as_str() {
            "embedded" => {}
            "jetstream" => {
                if self.log.servers.is_empty() {
                    return bad("log.backend = \"jetstream\" needs log.servers (e.g. \
                         [\"nats://127.0.0.1:4222\"])"
                        .into());
                }
                if let Some(s) = self
                    .log
                    .servers
                    .iter()
                    .find(|s| !tidemark_log::jetstream::is_server_address(s))
                {
                    return bad(format!("log.servers: {s:?} is not a NATS server address"));
                }
                let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
                if self.log.stream.is_empty()
                    || self.log.stream.len() > 64
                    || !self.log.stream.chars().all(ok)
                {
                    return bad(format!(
                        "log.stream {:?} must be 1 to 64 letters, digits, '_' or '-'",
                        self.log.stream
                    ));
                }
                if !(1..=5).contains(&self.log.replicas) {
                    return bad("log.replicas must be between 1 and 5".into());
                }
                if self.retention.compact_log {
                    return bad("retention.compact_log is not supported with log.backend = \
                         \"jetstream\" yet: the stream keeps every event (purging its prefix \
                         and the nodes' replicas together is not built)"
                        .into());
                }
                if !(1..=65_536).contains(&self.log.publish_window) {
                    return bad(format!(
                        "log.publish_window {} must be between 1 and 65536",
                        self.log.publish_window
                    ));
                }
                match tidemark_projections::routing::parse_duration_ms(&self.log.lease_ttl) {
                    Some(ms) if (1_000..=300_000).contains(&ms) => {}
                    _ => {
                        return bad(format!(
                            "log.lease_ttl {:?} must be a duration from 1s to 5m",
                            self.log.lease_ttl
                        ));
                    }
                }
            }
            other => {
                return bad(format!(
                    "log.backend {other:?} is not a backend (embedded, jetstream)"
                ));
            }
        }
        if parse_size(&self.log.min_free).is_none() {
            return bad(format!(
                "log.min_free {:?} is not a size (e.g. \"64MiB\", \"1GiB\", or bytes)",
                self.log.min_free
            ));
        }
        if parse_size(&self.log.id_filter_cache).is_none() {
            return bad(format!(
                "log.id_filter_cache {:?} is not a size (e.g. \"32MiB\", or bytes)",
                self.log.id_filter_cache
            ));
        }
        let routing = self
            .notifications_config()?
            .settings()
            .map_err(ConfigError::Invalid)?;
        tidemark_consumers::sources::from_config(&self.sources).map_err(ConfigError::Invalid)?;
        let dur = |k: &str, v: &str| {
            tidemark_projections::routing::parse_duration_ms(v)
                .filter(|ms| *ms >= 1_000)
                .ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "retention.{k} {v:?} is not a duration of at least 1s (e.g. \"365d\", \"24h\")"
                    ))
                })
        };
        dur("window", &self.retention.window)?;
        dur("run_every", &self.retention.run_every)?;
        let key = self.privacy()?;
        if let Some((route, _)) = routing.routes.iter().find(|(_, p)| p.redact)
            && key.is_none()
        {
            return bad(format!(
                "notifications.routes.{route}.redact = true needs a key: set [privacy] hmac_key = \
                 \"env:NAME\" and the variable NAME"
            ));
        }
        if let Some(route) = routing
            .routes
            .keys()
            .find(|r| tidemark_projections::names::ids::subscription_of_endpoint(r).is_some())
        {
            return bad(format!(
                "notifications.routes.{route}: a route name may not start with \"bridge:\" (it \
                 names a bridge webhook's endpoint)"
            ));
        }
        self.dispatch_sinks()?;
        Ok(())
    }

    /// The retention settings (validated at start).
    pub fn retention(&self) -> tidemark_consumers::retention::Retention {
        let ms = |v: &str| tidemark_projections::routing::parse_duration_ms(v).unwrap_or(1_000);
        tidemark_consumers::retention::Retention {
            window_ms: ms(&self.retention.window),
            run_every: std::time::Duration::from_millis(ms(&self.retention.run_every)),
            compact_log: self.retention.compact_log,
        }
    }

    /// The key of the redacting routes, read from the variable `[privacy] hmac_key` names
    /// (`None` when not configured).
    pub fn privacy(&self) -> Result<Option<tidemark_engine::privacy::Privacy>, ConfigError> {
        let Some(spec) = &self.privacy.hmac_key else {
            return Ok(None);
        };
        let Some(var) = spec.strip_prefix("env:").filter(|v| !v.is_empty()) else {
            return Err(ConfigError::Invalid(
                "privacy.hmac_key must be \"env:NAME\", the environment variable holding the key"
                    .into(),
            ));
        };
        match tidemark_consumers::env_value(spec) {
            Ok(v) if !v.is_empty() => Ok(tidemark_engine::privacy::Privacy::new(v.into_bytes())),
            _ => Err(ConfigError::Invalid(format!(
                "privacy.hmac_key names the environment variable {var}, which is not set"
            ))),
        }
    }

    /// `[notifications]`, read once into its types (unknown keys refused, each error naming
    /// its key).
    pub fn notifications_config(
        &self,
    ) -> Result<tidemark_projections::routing::NotificationsConfig, ConfigError> {
        let v = serde_json::to_value(&self.notifications)
            .map_err(|e| ConfigError::Invalid(format!("notifications: {e}")))?;
        tidemark_projections::routing::NotificationsConfig::from_json(&v)
            .map_err(ConfigError::Invalid)
    }

    /// The notification settings as the JSON payload of `settings.updated`, written from
    /// [`Config::notifications_config`]'s types. A webhook route's `url` and `secret`
    /// (section 17) stay out of it: they are this node's configuration (and may be secrets),
    /// read by the dispatcher ([`Config::dispatch_sinks`]). Validated at start; an invalid
    /// section gives no settings.
    pub fn notification_settings(&self) -> serde_json::Value {
        self.notifications_config()
            .map(|c| c.event_payload())
            .unwrap_or_default()
    }

    /// The sinks the dispatcher delivers to (spec section 17), secrets resolved from the
    /// environment: `[sinks.email]`, and every route with `sink = "webhook"` and its `url`.
    /// Errors name the key.
    pub fn dispatch_sinks(&self) -> Result<tidemark_consumers::dispatch::Sinks, ConfigError> {
        use tidemark_consumers::dispatch::{self, email, webhook};
        use tidemark_projections::routing::Sink;
        let bad = |m: String| ConfigError::Invalid(m);
        let mut sinks = dispatch::Sinks::default();
        let routes = self.notifications_config()?.routes.unwrap_or_default();
        let mut hooks = std::collections::HashMap::new();
        let mut email_routes = Vec::new();
        for (name, p) in &routes {
            match p.sink {
                Some(Sink::Webhook) => {
                    if p.url.is_none() {
                        return Err(bad(format!(
                            "notifications.routes.{name}: sink = \"webhook\" needs url"
                        )));
                    }
                    hooks.insert(name.clone(), webhook::Target::of(name, p).map_err(bad)?);
                }
                Some(Sink::Email) => {
                    if p.redact == Some(true) {
                        return Err(bad(format!(
                            "notifications.routes.{name}: a redacting route cannot use the \
                             email sink (it needs the recipient's address)"
                        )));
                    }
                    email_routes.push(name.clone());
                }
                _ => {
                    if p.url.is_some()
                        || p.secret.is_some()
                        || p.body.is_some()
                        || p.headers.is_some()
                    {
                        return Err(bad(format!(
                            "notifications.routes.{name}: url, secret, body and headers are for \
                             sink = \"webhook\""
                        )));
                    }
                }
            }
        }
        match (&self.sinks.email, email_routes.first()) {
            (Some(cfg), _) => sinks
                .adapters
                .push(std::sync::Arc::new(email::Email::new(cfg).map_err(bad)?)),
            (None, Some(route)) => {
                return Err(bad(format!(
                    "notifications.routes.{route}: sink = \"email\" needs [sinks.email]"
                )));
            }
            (None, None) => {}
        }
        // Always: a webhook route may be added through the API at any time (section 4).
        let cfg = self.sinks.webhook.clone().unwrap_or_default();
        sinks.adapters.push(std::sync::Arc::new(
            webhook::Webhook::new(&cfg, hooks)
                .map_err(bad)?
                .with_console(Some(self.public_url())),
        ));
        Ok(sinks)
    }

    /// Where users reach this server (`server.public_url`, else its listen address): the
    /// base of the console links in webhook bodies.
    pub fn public_url(&self) -> String {
        let s = &self.server;
        if !s.public_url.is_empty() {
            return s.public_url.trim_end_matches('/').to_owned();
        }
        let scheme = if self.tls().is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", s.listen)
    }

    /// The certificate and key files when HTTPS is configured.
    pub fn tls(&self) -> Option<(PathBuf, PathBuf)> {
        let s = &self.server;
        (!s.tls_cert.as_os_str().is_empty()).then(|| (s.tls_cert.clone(), s.tls_key.clone()))
    }

    /// The directory backups taken through the server go in (absolute).
    pub fn backup_root(&self) -> PathBuf {
        let root = if self.server.backup_dir.as_os_str().is_empty() {
            self.server.data.join("backups")
        } else {
            self.server.backup_dir.clone()
        };
        std::path::absolute(&root).unwrap_or(root)
    }

    pub fn log_config(&self) -> tidemark_log::LogConfig {
        let mut c = tidemark_log::LogConfig::in_dir(&self.server.data);
        c.cache_bytes = self.log.cache_mb * 1024 * 1024;
        c.merge_threshold = self.log.merge_threshold;
        c.max_group_events = self.log.max_group_events;
        c.queue_capacity = self.log.queue_capacity.max(1);
        c.quick_repair = self.log.quick_repair;
        c.min_free = parse_size(&self.log.min_free).unwrap_or(c.min_free);
        c.id_filter_cache = parse_size(&self.log.id_filter_cache)
            .map(|b| b as usize)
            .unwrap_or(c.id_filter_cache);
        c
    }

    /// The embedded log of shard `shard` (spec section 20): shard 0 in the data directory,
    /// shard n in `shards/<n>/` of it, each with its share of the page cache.
    pub fn shard_log_config(&self, shard: u32) -> tidemark_log::LogConfig {
        let mut c = self.log_config();
        if shard > 0 {
            c.path = self
                .server
                .data
                .join("shards")
                .join(shard.to_string())
                .join("log.redb");
        }
        c.cache_bytes /= self.log.shards.max(1) as usize;
        c
    }

    /// The JetStream log of `[log] backend = "jetstream"`: its local replica is an embedded
    /// log under `<data>/jetstream-replica` with the `[log]` settings above.
    pub fn jetstream_config(&self) -> Option<tidemark_log::JetStreamConfig> {
        self.shard_jetstream_config(0)
    }

    /// The JetStream log of shard `shard` (spec section 20): the stream `stream` for shard 0,
    /// `<stream>_s<n>` for shard n, each with its replica in the shard's directory
    /// (`<data>/jetstream-replica`, `<data>/shards/<n>/jetstream-replica`).
    pub fn shard_jetstream_config(&self, shard: u32) -> Option<tidemark_log::JetStreamConfig> {
        if self.log.backend != "jetstream" {
            return None;
        }
        let mut replica = self.shard_log_config(shard);
        if let Some(dir) = replica.path.parent() {
            replica.path = dir.join("jetstream-replica").join("log.redb");
        }
        let stream = match shard {
            0 => self.log.stream.clone(),
            n => format!("{}_s{n}", self.log.stream),
        };
        let mut c = tidemark_log::JetStreamConfig::new(self.log.servers.clone(), stream, replica);
        c.replicas = self.log.replicas;
        c.publish_window = self.log.publish_window;
        if let Some(ms) = tidemark_projections::routing::parse_duration_ms(&self.log.lease_ttl) {
            c.lease_ttl = std::time::Duration::from_millis(ms);
        }
        Some(c)
    }
}

/// A size: bytes, or a number with `KiB`, `MiB`, `GiB` (or `KB`, `MB`, `GB`, powers of ten).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// `http(s)://host[:port]` and nothing more: what a browser sends as `Origin`.
fn is_origin(o: &str) -> bool {
    is_base_url(o)
        && reqwest::Url::parse(o).is_ok_and(|u| u.path() == "/")
        && !o.ends_with('/')
        && axum::http::HeaderValue::from_str(o).is_ok()
}

/// A base the console's links are made on (`server.public_url`): an absolute http(s) URL with
/// a host, and no credentials, query or fragment (the links append a path to it).
fn is_base_url(s: &str) -> bool {
    let Ok(u) = reqwest::Url::parse(s) else {
        return false;
    };
    matches!(u.scheme(), "http" | "https")
        && u.host_str().is_some()
        && u.username().is_empty()
        && u.password().is_none()
        && u.query().is_none()
        && u.fragment().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_url_is_a_base_url_or_refused_without_repeating_it() {
        let mut c = Config::defaults();
        for ok in [
            "",
            "https://tidemark.example.org",
            "http://10.0.0.5:8080/tm/",
        ] {
            c.server.public_url = ok.into();
            c.validate().unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for bad in [
            "ops.internal",
            "/console",
            "ftp://ops.internal",
            "https://ops:s3cret@ops.internal",
            "https://ops.internal/?token=s3cret",
            "https://ops.internal/#s3cret",
        ] {
            c.server.public_url = bad.into();
            let e = c.validate().expect_err(bad).to_string();
            assert!(e.contains("server.public_url"), "{e}");
            assert!(!e.contains("s3cret") && !e.contains(bad), "{e}");
        }
    }

    #[test]
    fn defaults_load_and_validate() {
        let c = Config::defaults();
        c.validate().unwrap();
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:7700");
        assert!(c.auth.tokens.is_empty());
        assert_eq!(c.log_config().min_free, 64 << 20);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2 MB"), Some(2_000_000));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("5TiB"), None);
        assert_eq!(parse_size(""), None);
    }
}
