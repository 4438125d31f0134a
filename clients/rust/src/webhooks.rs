//! Verifying tidemark's webhook POSTs (Standard Webhooks): `webhook-id`, `webhook-timestamp`
//! and `webhook-signature: v1,<base64>` (several, space-separated, during a secret's rotation),
//! each an HMAC-SHA256 of `"<id>.<timestamp>.<body>"`. The key is the secret's UTF-8 bytes, or
//! for a secret written `whsec_<base64>` the decoded bytes, as the server signs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use reqwest::header::HeaderMap;
use sha2::Sha256;

/// How far a timestamp may be from now (either way) by default.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Why a POST was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the {0} header is missing")]
    Missing(&'static str),
    #[error("webhook-timestamp is not a number of seconds")]
    BadTimestamp,
    #[error("webhook-timestamp is further than the tolerance from now")]
    Stale,
    #[error("no signature matches any of the secrets")]
    NoMatch,
}

/// Verify a POST's headers and exact body against any of `secrets` (the current and, during a
/// rotation, the previous), with the timestamp within [`TOLERANCE`] of now. A receiver should
/// also drop a `webhook-id` it has already handled (a retry or a replay).
pub fn verify(secrets: &[&str], headers: &HeaderMap, body: &[u8]) -> Result<(), VerifyError> {
    let h = |name: &'static str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or(VerifyError::Missing(name))
    };
    verify_parts(
        secrets,
        h("webhook-id")?,
        h("webhook-timestamp")?,
        h("webhook-signature")?,
        body,
        SystemTime::now(),
        TOLERANCE,
    )
}

/// [`verify`] on the header values, at `now`, with a tolerance of one's own.
pub fn verify_parts(
    secrets: &[&str],
    id: &str,
    timestamp: &str,
    signatures: &str,
    body: &[u8],
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), VerifyError> {
    let ts: u64 = timestamp
        .trim()
        .parse()
        .map_err(|_| VerifyError::BadTimestamp)?;
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    if ts.abs_diff(now) > tolerance.as_secs() {
        return Err(VerifyError::Stale);
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let given: Vec<Vec<u8>> = signatures
        .split_whitespace()
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|s| b64.decode(s).ok())
        .collect();
    for secret in secrets {
        let key = secret
            .strip_prefix("whsec_")
            .and_then(|k| b64.decode(k).ok())
            .unwrap_or_else(|| secret.as_bytes().to_vec());
        for sig in &given {
            let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
                continue;
            };
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(timestamp.trim().as_bytes());
            mac.update(b".");
            mac.update(body);
            // Constant-time comparison.
            if mac.verify_slice(sig).is_ok() {
                return Ok(());
            }
        }
    }
    Err(VerifyError::NoMatch)
}

/// The `webhook-signature` value for `secret` (for tests and for receivers that forward).
pub fn sign(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = secret
        .strip_prefix("whsec_")
        .and_then(|k| b64.decode(k).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec());
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes keys of any length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", b64.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn a_signature_verifies_under_its_secret_only_and_with_its_body_only() {
        let sig = sign("s3cret", "dlv:n-1:hook", NOW, b"{\"a\":1}");
        let ok = |secrets: &[&str], body: &[u8]| {
            verify_parts(
                secrets,
                "dlv:n-1:hook",
                &NOW.to_string(),
                &sig,
                body,
                at(NOW),
                TOLERANCE,
            )
        };
        assert_eq!(ok(&["s3cret"], b"{\"a\":1}"), Ok(()));
        assert_eq!(ok(&["other", "s3cret"], b"{\"a\":1}"), Ok(()));
        assert_eq!(ok(&["other"], b"{\"a\":1}"), Err(VerifyError::NoMatch));
        assert_eq!(ok(&["s3cret"], b"{\"a\":2}"), Err(VerifyError::NoMatch));
    }

    #[test]
    fn during_a_rotation_either_signature_verifies() {
        let both = format!(
            "{} {}",
            sign("new", "i", NOW, b"x"),
            sign("whsec_b2xk", "i", NOW, b"x")
        );
        for s in ["new", "whsec_b2xk"] {
            assert_eq!(
                verify_parts(&[s], "i", &NOW.to_string(), &both, b"x", at(NOW), TOLERANCE),
                Ok(())
            );
        }
    }

    #[test]
    fn an_old_or_malformed_timestamp_is_refused() {
        let sig = sign("k", "i", NOW, b"x");
        let old = verify_parts(
            &["k"],
            "i",
            &NOW.to_string(),
            &sig,
            b"x",
            at(NOW + 301),
            TOLERANCE,
        );
        assert_eq!(old, Err(VerifyError::Stale));
        let bad = verify_parts(&["k"], "i", "soon", &sig, b"x", at(NOW), TOLERANCE);
        assert_eq!(bad, Err(VerifyError::BadTimestamp));
    }
}
