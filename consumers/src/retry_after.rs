//! The wait a server asks for before the next request. `Retry-After` is either a number of
//! seconds or an HTTP date (RFC 9110 section 10.2.3); a date is read against our clock, and
//! one already past asks for no wait. An upstream in the style of seed 004 also says it in its
//! JSON error body (`{"retryAfter": 60, …}`, seconds). The webhook sinks and the source poller
//! all read it here, so the same answer means the same wait everywhere.

use std::time::{Duration, SystemTime};

/// A `Retry-After` header value as a wait from `now`; `None` when it is neither form.
pub fn header(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Digits past u64 are a very long wait, capped by every caller.
        return Some(Duration::from_secs(v.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A JSON body's top-level `retryAfter` (non-negative seconds, fractions kept); `None` for a
/// body that is not a JSON object or has no such number.
pub fn body(body: &[u8]) -> Option<Duration> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let secs = v.get("retryAfter")?.as_f64()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_http_dates_are_read() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        assert_eq!(header("7", now), Some(Duration::from_secs(7)));
        assert_eq!(header(" 30 ", now), Some(Duration::from_secs(30)));
        assert_eq!(
            header("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            header("Wed, 21 Oct 2015 07:29:30 GMT", now),
            Some(Duration::from_secs(90))
        );
        // The obsolete forms RFC 9110 still asks a recipient to read.
        assert_eq!(
            header("Wednesday, 21-Oct-15 07:28:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            header("Wed Oct 21 07:28:05 2015", now),
            Some(Duration::from_secs(5))
        );
        // Past: no wait.
        assert_eq!(
            header("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        for bad in ["", "-1", "1.5", "soon", "Wed, 32 Oct 2015 07:28:00 GMT"] {
            assert_eq!(header(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn a_bodys_retry_after_is_read() {
        assert_eq!(
            body(br#"{"error":"Rate limit exceeded","retryAfter":60}"#),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            body(br#"{"retryAfter":1.5}"#),
            Some(Duration::from_millis(1500))
        );
        for bad in [
            &br#"{"retryAfter":-1}"#[..],
            br#"{"retryAfter":"60"}"#,
            br#"{"details":{"retryAfter":60}}"#,
            br#"[60]"#,
            b"not json",
        ] {
            assert_eq!(body(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
