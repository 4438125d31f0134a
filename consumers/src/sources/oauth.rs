//! An upstream token by the OAuth 2 client-credentials grant (RFC 6749 section 4.4; seed 004's
//! authenticated polling): asked for at a source's first request, kept in memory, renewed
//! `refresh_before` its expiry and once more when the upstream answers `401` (a token revoked
//! before its time). The client id and secret come from the environment (`env:NAME`); the
//! token, the secret and the token endpoint's answer are never logged, served or put into an
//! error.

use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use serde::Deserialize;
use tokio::sync::Mutex;

use super::PollError;
use super::config::{AuthConfig, key_err};
use tidemark_projections::routing::parse_duration_ms;

/// A source's client credentials and the token they got.
pub struct ClientCredentials {
    token_url: reqwest::Url,
    client_id: String,
    client_secret: String,
    scope: Option<String>,
    audience: Option<String>,
    refresh_before: Duration,
    token: Mutex<Option<Token>>,
}

struct Token {
    /// `Bearer <access_token>`, marked sensitive.
    header: HeaderValue,
    /// When it should be renewed (`expires_in` − `refresh_before`); `None`: until a `401`.
    renew_at: Option<Instant>,
}

/// The token endpoint's answer (RFC 6749 section 5.1).
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    token_type: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl ClientCredentials {
    /// `[sources.auth]` of source `name`, checked; `env:` values read now (errors name the key,
    /// never a value).
    pub fn new(name: &str, a: &AuthConfig) -> Result<ClientCredentials, String> {
        if a.kind != "oauth2_client_credentials" {
            return Err(key_err(
                name,
                "auth.kind",
                "must be oauth2_client_credentials",
            ));
        }
        let token_url = reqwest::Url::parse(&a.token_url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| key_err(name, "auth.token_url", "must be an http:// or https:// URL"))?;
        let value = |v: &str, key: &str| {
            crate::env_value(v)
                .map_err(|e| key_err(name, key, e))
                .and_then(|v| {
                    (!v.is_empty())
                        .then_some(v)
                        .ok_or_else(|| key_err(name, key, "must not be empty"))
                })
        };
        let refresh_before = parse_duration_ms(&a.refresh_before)
            .map(Duration::from_millis)
            .ok_or_else(|| key_err(name, "auth.refresh_before", "is not a duration"))?;
        Ok(ClientCredentials {
            token_url,
            client_id: value(&a.client_id, "auth.client_id")?,
            client_secret: value(&a.client_secret, "auth.client_secret")?,
            scope: a.scope.clone(),
            audience: a.audience.clone(),
            refresh_before,
            token: Mutex::new(None),
        })
    }

    /// The `Authorization` value to send: the token held, or a new one when there is none or
    /// it is due for renewal.
    pub async fn bearer(
        &self,
        client: &reqwest::Client,
        timeout: Duration,
    ) -> Result<HeaderValue, PollError> {
        let mut held = self.token.lock().await;
        if let Some(t) = held.as_ref()
            && t.renew_at.is_none_or(|at| Instant::now() < at)
        {
            return Ok(t.header.clone());
        }
        let t = self.fetch(client, timeout).await?;
        let header = t.header.clone();
        *held = Some(t);
        Ok(header)
    }

    /// Forget the token (the upstream refused it): the next request asks for a new one.
    pub async fn forget(&self) {
        *self.token.lock().await = None;
    }

    async fn fetch(&self, client: &reqwest::Client, timeout: Duration) -> Result<Token, PollError> {
        let mut form: Vec<(&str, &str)> = vec![("grant_type", "client_credentials")];
        if let Some(s) = &self.scope {
            form.push(("scope", s));
        }
        if let Some(a) = &self.audience {
            form.push(("audience", a));
        }
        let asked = Instant::now();
        let resp = client
            .post(self.token_url.clone())
            // RFC 6749 section 2.3.1: each form-urlencoded, then HTTP Basic.
            .basic_auth(
                urlencoded(&self.client_id),
                Some(urlencoded(&self.client_secret)),
            )
            .header("accept", "application/json")
            .form(&form)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| {
                let class = if e.is_timeout() { "timeout" } else { "network" };
                PollError::Transient(
                    Some(class),
                    "the token endpoint could not be reached".into(),
                )
            })?;
        let status = resp.status();
        if !status.is_success() {
            let why = format!("the token endpoint answered {}", status.as_u16());
            return Err(match status.as_u16() {
                // The credentials themselves are refused: an operator must fix them.
                400 | 401 | 403 => PollError::Park(why),
                _ => PollError::Transient(Some("server_error"), why),
            });
        }
        let body = super::upstream::read_bounded(resp).await?;
        let t: TokenAnswer = serde_json::from_slice(&body).map_err(|_| {
            PollError::Park("the token endpoint's answer is not an OAuth 2 token".into())
        })?;
        if !t.token_type.eq_ignore_ascii_case("bearer") {
            return Err(PollError::Park(format!(
                "the token endpoint gave a {:?} token, not a bearer one",
                t.token_type
            )));
        }
        let mut header =
            HeaderValue::from_str(&format!("Bearer {}", t.access_token)).map_err(|_| {
                PollError::Park("the token endpoint gave a token that is not a header value".into())
            })?;
        header.set_sensitive(true);
        // Renewed `refresh_before` its end (at half its life when that is shorter).
        let renew_at = t.expires_in.map(|secs| {
            let life = Duration::from_secs(secs);
            asked + life.saturating_sub(self.refresh_before.min(life / 2))
        });
        Ok(Token { header, renew_at })
    }
}

/// `v` as `application/x-www-form-urlencoded` writes it.
fn urlencoded(v: &str) -> String {
    form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("token_url", &self.token_url.as_str())
            .finish_non_exhaustive()
    }
}
