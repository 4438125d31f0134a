//! Bearer tokens with scopes (spec section 8). Tokens are configured as SHA-256 hashes; the
//! token text is hashed on each request and never logged.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::Request;
use axum::http::header;
use sha2::{Digest, Sha256};

use crate::config::TokenConfig;
use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Append,
    Read,
    Bridge,
    Operator,
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 5] = [
        Scope::Append,
        Scope::Read,
        Scope::Bridge,
        Scope::Operator,
        Scope::Admin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Append => "append",
            Scope::Read => "read",
            Scope::Bridge => "bridge",
            Scope::Operator => "operator",
            Scope::Admin => "admin",
        }
    }
}

struct Token {
    name: String,
    hash: [u8; 32],
    scopes: Vec<String>,
    /// The tenant it acts for; `None`: every tenant (`*`).
    tenant: Option<Arc<str>>,
    /// Its `rate`, when it has one.
    bucket: Option<Mutex<Bucket>>,
}

/// `"<count>/<s|m|h>"` as (count, period in seconds); None when malformed.
pub fn parse_rate(s: &str) -> Option<(u32, u32)> {
    let (n, unit) = s.trim().split_once('/')?;
    let n: u32 = n
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=1_000_000).contains(n))?;
    let period = match unit.trim() {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return None,
    };
    Some((n, period))
}

/// A token bucket: `capacity` requests, refilled continuously at `per_s` a second.
#[derive(Debug)]
pub(crate) struct Bucket {
    capacity: f64,
    per_s: f64,
    tokens: f64,
    at: Instant,
}

/// What the bucket said about one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Take {
    /// Allowed; this many requests remain now.
    Allowed { remaining: u64 },
    /// Refused; one request is allowed again after this many seconds (at least 1).
    Refused { retry_after_s: u64 },
}

impl Bucket {
    pub(crate) fn new((count, period_s): (u32, u32), now: Instant) -> Bucket {
        Bucket {
            capacity: f64::from(count),
            per_s: f64::from(count) / f64::from(period_s),
            tokens: f64::from(count),
            at: now,
        }
    }

    pub(crate) fn take(&mut self, now: Instant) -> Take {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_s).min(self.capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Take::Allowed {
                remaining: self.tokens.floor() as u64,
            }
        } else {
            let wait = (1.0 - self.tokens) / self.per_s;
            Take::Refused {
                retry_after_s: (wait.ceil() as u64).max(1),
            }
        }
    }
}

/// The configured tokens; empty means the server runs open.
#[derive(Clone)]
pub struct Auth {
    tokens: Arc<Vec<Token>>,
}

impl Auth {
    pub fn new(cfg: &[TokenConfig]) -> Auth {
        let tokens = cfg
            .iter()
            .map(|t| {
                let mut hash = [0u8; 32];
                // Validated as 64 hex digits at config load.
                let _ = hex::decode_to_slice(&t.sha256, &mut hash);
                Token {
                    name: t.name.clone(),
                    hash,
                    scopes: t.scopes.clone(),
                    tenant: (t.tenant != "*").then(|| Arc::from(t.tenant.as_str())),
                    // Validated at config load.
                    bucket: t
                        .rate
                        .as_deref()
                        .and_then(parse_rate)
                        .map(|r| Mutex::new(Bucket::new(r, Instant::now()))),
                }
            })
            .collect();
        Auth {
            tokens: Arc::new(tokens),
        }
    }

    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Who the caller is (`GET /v1/whoami`): any valid token, or everyone in open mode.
    pub fn identify(&self, authorization: Option<&str>) -> Result<Identity, ApiError> {
        if self.is_open() {
            return Ok(Identity {
                name: None,
                scopes: Scope::ALL.iter().map(|s| s.name().to_owned()).collect(),
                open: true,
                tenant: "*".to_owned(),
            });
        }
        let token = self.token(authorization)?;
        Ok(Identity {
            name: Some(token.name.clone()),
            scopes: token.scopes.clone(),
            open: false,
            tenant: token.tenant.as_deref().unwrap_or("*").to_owned(),
        })
    }

    /// The configured token whose text the header carries, or 401.
    fn token(&self, authorization: Option<&str>) -> Result<&Token, ApiError> {
        self.known(authorization).ok_or_else(unauthorized)
    }

    /// The configured token whose text the header carries, if any.
    fn known(&self, authorization: Option<&str>) -> Option<&Token> {
        self.known_index(authorization).map(|i| &self.tokens[i])
    }

    /// The position of [`Auth::known`]'s token among the configured ones.
    fn known_index(&self, authorization: Option<&str>) -> Option<usize> {
        let text = bearer(authorization?)?;
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        // Compare every configured hash without stopping early.
        self.tokens.iter().enumerate().fold(
            None,
            |acc, (i, t)| if t.hash == digest { Some(i) } else { acc },
        )
    }

    /// The token the header carries may act with `scope`: `Ok` in open mode or with the
    /// scope, 401/403 otherwise.
    #[cfg(test)]
    fn check(&self, authorization: Option<&str>, scope: Scope) -> Result<(), ApiError> {
        self.allows(self.known(authorization), scope)
    }

    /// `found` (the caller's configured token, if any) may act with `scope`: `Ok` in open mode
    /// or with the scope, 401/403 otherwise.
    fn allows(&self, found: Option<&Token>, scope: Scope) -> Result<(), ApiError> {
        if self.is_open() {
            return Ok(());
        }
        let token = found.ok_or_else(unauthorized)?;
        if token
            .scopes
            .iter()
            .any(|s| s == scope.name() || s == "admin")
        {
            Ok(())
        } else {
            tracing::info!(
                token = %token.name,
                scope = scope.name(),
                request_id = %crate::request_id::current(),
                "request refused: missing scope"
            );
            Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "forbidden_scope",
                format!("this token lacks the {:?} scope", scope.name()),
            ))
        }
    }
}

fn unauthorized() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::UNAUTHORIZED,
        "unauthorized",
        "send a valid token as `Authorization: Bearer <token>`",
    )
}

/// The configured token a request carries (its position), found once per request by
/// [`Auth::take_rate`] and read by [`Auth::check_scope`]: the token's text is hashed once.
#[derive(Debug, Clone, Copy)]
struct Caller(Option<usize>);

/// The calling token as `GET /v1/whoami` answers it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Identity {
    /// The token's configured name; null in open mode.
    pub name: Option<String>,
    pub scopes: Vec<String>,
    /// The server runs without tokens (loopback only).
    pub open: bool,
    /// The tenant the token acts for, or `*`: every tenant (spec section 20).
    pub tenant: String,
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is case-insensitive
/// (RFC 9110 §11.1), so `bearer` and `BEARER` are the same.
fn bearer(h: &str) -> Option<&str> {
    let (scheme, token) = h.trim_start().split_once(char::is_whitespace)?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Auth {
    /// Whether the request's token has `scope` (section 8): `401` without a valid token,
    /// `403` without the scope. The token was found once by [`Auth::take_rate`].
    pub(crate) fn check_scope(&self, req: &Request, scope: Scope) -> Result<(), ApiError> {
        let found = match req.extensions().get::<Caller>() {
            Some(Caller(i)) => i.map(|i| &self.tokens[i]),
            None => self.known(
                req.headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok()),
            ),
        };
        self.allows(found, scope)
    }

    /// Over every route (section 8): finds the caller's token once ([`Caller`]); a request
    /// carrying a rate-limited token takes from its bucket, whatever it asks for: `Ok` with
    /// the requests remaining (every answer to it carries `RateLimit-Remaining`, a 403, a 404,
    /// a 400 included), or past the limit the `429` with `Retry-After` (none remain). Requests
    /// without a valid token are left to the scope check.
    /// The tenant the request's token acts for; `None`: every tenant (a `*` token, or open
    /// mode). The token was found by [`Auth::take_rate`].
    pub(crate) fn tenant_of(&self, req: &Request) -> Option<Arc<str>> {
        let Some(Caller(Some(i))) = req.extensions().get::<Caller>() else {
            return None;
        };
        self.tokens[*i].tenant.clone()
    }

    pub(crate) fn take_rate(&self, req: &mut Request) -> Result<Option<u64>, ApiError> {
        if self.is_open() {
            return Ok(None);
        }
        let found = self.known_index(
            req.headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok()),
        );
        req.extensions_mut().insert(Caller(found));
        let Some(bucket) = found.and_then(|i| self.tokens[i].bucket.as_ref()) else {
            return Ok(None);
        };
        let take = bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(Instant::now());
        match take {
            Take::Allowed { remaining } => Ok(Some(remaining)),
            Take::Refused { retry_after_s } => {
                metrics::counter!("tidemark_rate_limited_total").increment(1);
                Err(ApiError::new(
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    "this token's request rate is used up; retry after Retry-After seconds",
                )
                .retry_after(retry_after_s))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_count_then_refills_continuously() {
        assert_eq!(parse_rate("100/m"), Some((100, 60)));
        assert_eq!(parse_rate(" 5 / s "), Some((5, 1)));
        for bad in ["", "0/m", "x/m", "5/d", "5", "2000000/s"] {
            assert_eq!(parse_rate(bad), None, "{bad:?}");
        }
        // 4 requests per 2 s: a burst of 4, then one every 0.5 s (times exact in binary).
        let t0 = Instant::now();
        let ms = |n: u64| t0 + std::time::Duration::from_millis(n);
        let mut b = Bucket::new((4, 2), t0);
        for left in [3, 2, 1, 0] {
            assert_eq!(b.take(t0), Take::Allowed { remaining: left });
        }
        assert_eq!(b.take(t0), Take::Refused { retry_after_s: 1 });
        assert_eq!(b.take(ms(250)), Take::Refused { retry_after_s: 1 });
        assert_eq!(b.take(ms(500)), Take::Allowed { remaining: 0 });
        assert_eq!(b.take(ms(500)), Take::Refused { retry_after_s: 1 });
        // Never above the burst.
        assert_eq!(b.take(ms(3_600_000)), Take::Allowed { remaining: 3 });
        // A slow rate waits whole seconds: 1 per hour, empty → 3600 s.
        let mut slow = Bucket::new((1, 3600), t0);
        assert_eq!(slow.take(t0), Take::Allowed { remaining: 0 });
        assert_eq!(
            slow.take(t0),
            Take::Refused {
                retry_after_s: 3600
            }
        );
    }

    fn token(text: &str, scopes: &[&str]) -> TokenConfig {
        TokenConfig {
            name: text.to_owned(),
            sha256: hex::encode(Sha256::digest(text.as_bytes())),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            rate: None,
            tenant: "*".into(),
        }
    }

    #[test]
    fn scopes_are_enforced() {
        let auth = Auth::new(&[token("r", &["read"]), token("a", &["admin"])]);
        assert!(auth.check(Some("Bearer r"), Scope::Read).is_ok());
        assert_eq!(
            auth.check(Some("Bearer r"), Scope::Append)
                .unwrap_err()
                .problem
                .code,
            "forbidden_scope"
        );
        assert!(auth.check(Some("Bearer a"), Scope::Append).is_ok());
        assert_eq!(
            auth.check(Some("Bearer x"), Scope::Read)
                .unwrap_err()
                .problem
                .code,
            "unauthorized"
        );
        assert_eq!(
            auth.check(None, Scope::Read).unwrap_err().problem.code,
            "unauthorized"
        );
        assert!(Auth::new(&[]).check(None, Scope::Admin).is_ok());
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let auth = Auth::new(&[token("r", &["read"])]);
        for h in [
            "Bearer r",
            "bearer r",
            "BEARER r",
            "BeArEr   r ",
            " Bearer\tr",
        ] {
            assert!(auth.check(Some(h), Scope::Read).is_ok(), "{h:?}");
        }
        for h in ["Bearerr", "Basic r", "Bearer", "Bearer  ", "r"] {
            assert!(auth.check(Some(h), Scope::Read).is_err(), "{h:?}");
        }
    }
}
