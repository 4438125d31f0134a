//! Bearer tokens with scopes (spec section 8). Tokens are configured as SHA-256 hashes; the
//! token text is hashed on each request and never logged.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
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
            });
        }
        let token = self.token(authorization)?;
        Ok(Identity {
            name: Some(token.name.clone()),
            scopes: token.scopes.clone(),
            open: false,
        })
    }

    /// The configured token whose text the header carries, or 401.
    fn token(&self, authorization: Option<&str>) -> Result<&Token, ApiError> {
        let unauthorized = || {
            ApiError::new(
                axum::http::StatusCode::UNAUTHORIZED,
                "unauthorized",
                "send a valid token as `Authorization: Bearer <token>`",
            )
        };
        let text = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(unauthorized)?;
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        // Compare every configured hash without stopping early.
        let found = self
            .tokens
            .iter()
            .fold(None, |acc, t| if t.hash == digest { Some(t) } else { acc });
        found.ok_or_else(unauthorized)
    }

    fn check(&self, authorization: Option<&str>, scope: Scope) -> Result<(), ApiError> {
        if self.is_open() {
            return Ok(());
        }
        let token = self.token(authorization)?;
        if token
            .scopes
            .iter()
            .any(|s| s == scope.name() || s == "admin")
        {
            Ok(())
        } else {
            tracing::info!(token = %token.name, scope = scope.name(), "request refused: missing scope");
            Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "forbidden_scope",
                format!("this token lacks the {:?} scope", scope.name()),
            ))
        }
    }
}

/// The calling token as `GET /v1/whoami` answers it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Identity {
    /// The token's configured name; null in open mode.
    pub name: Option<String>,
    pub scopes: Vec<String>,
    /// The server runs without tokens (loopback only).
    pub open: bool,
}

/// Middleware factory: require `scope` on every route of a router.
pub async fn require(
    State((auth, scope)): State<(Auth, Scope)>,
    req: Request,
    next: Next,
) -> Response {
    let h = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match auth.check(h, scope) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(text: &str, scopes: &[&str]) -> TokenConfig {
        TokenConfig {
            name: text.to_owned(),
            sha256: hex::encode(Sha256::digest(text.as_bytes())),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
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
}
