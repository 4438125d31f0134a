//! One source's upstream over HTTP: the list request after the watermark (its status judged
//! by section 12's error rules), the bounded body, the page's validation (naming the JSON
//! pointer that failed), and the ack. Errors never carry anything of the request (headers,
//! URL query).

use serde_json::Value;
use tidemark_engine::commands::SourceItem;

use super::PollError;
use super::config::{AckConfig, Source, SourceConfig};

/// Largest response body read from an upstream.
pub const MAX_RESPONSE_BYTES: usize = 10 << 20;
/// Most items one page may hold.
pub const MAX_ITEMS: usize = 1000;
/// Largest item (its JSON text).
pub const MAX_ITEM_BYTES: usize = 64 << 10;

/// The upstream's answer, checked: status and a bounded body.
pub(super) async fn request(
    client: &reqwest::Client,
    src: &Source,
    watermark: Option<&str>,
    limit: u32,
    series: &str,
) -> Result<Vec<u8>, PollError> {
    let cfg = &src.cfg;
    let w = &cfg.watermark;
    let mut req = match cfg.method.as_str() {
        "POST" => {
            let mut body = cfg
                .body
                .clone()
                .unwrap_or_else(|| Value::Object(Default::default()));
            if let Some(obj) = body.as_object_mut() {
                obj.insert(w.limit_field.clone(), Value::from(limit));
                match watermark {
                    Some(v) => {
                        obj.insert(w.request_field.clone(), Value::from(v));
                    }
                    None => {
                        obj.remove(&w.request_field);
                    }
                }
            }
            client.post(&cfg.url).json(&body)
        }
        _ => {
            let mut q: Vec<(&str, String)> = vec![(w.limit_field.as_str(), limit.to_string())];
            if let Some(v) = watermark {
                q.push((w.request_field.as_str(), v.to_owned()));
            }
            client.get(&cfg.url).query(&q)
        }
    };
    // Every poll request carries an id of its own (the upstream's logs can name it), and, if
    // configured, an idempotency key: the source, the watermark it reads after and the poll's
    // series (the same when a failed poll is retried, a new one after a success).
    let request_id = uuid::Uuid::now_v7().to_string();
    req = req
        .headers(headers(client, src).await?)
        .header("X-Request-ID", &request_id)
        .timeout(src.timeout);
    if let Some(h) = &cfg.idempotency_header {
        req = req.header(
            h.as_str(),
            format!("poll:{}:{}:{series}", cfg.name, watermark.unwrap_or("")),
        );
    }
    let resp = req.send().await.map_err(|e| transport(&e))?;
    if !resp.status().is_success() {
        return Err(error_answer(resp).await);
    }
    read_bounded(resp).await
}

/// The source's headers, with its OAuth token as `Authorization` in place of a configured one.
async fn headers(
    client: &reqwest::Client,
    src: &Source,
) -> Result<reqwest::header::HeaderMap, PollError> {
    let mut h = src.headers.clone();
    if let Some(auth) = &src.auth {
        h.insert(
            reqwest::header::AUTHORIZATION,
            auth.bearer(client, src.timeout).await?,
        );
    }
    Ok(h)
}

/// An error of the HTTP client, without anything of the request (headers, URL query).
pub(super) fn transport(e: &reqwest::Error) -> PollError {
    let (class, what) = if e.is_timeout() {
        ("timeout", "timeout")
    } else if e.is_connect() {
        ("network", "connection failed")
    } else if e.is_body() || e.is_decode() {
        ("network", "reading the body failed")
    } else {
        ("network", "request failed")
    };
    PollError::Transient(Some(class), what.into())
}

/// Largest part of an error answer's body read for its `retryAfter`.
const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

/// An error answer judged ([`status_error`]); a `429`/`503`'s body is read (its first 64 KiB)
/// for a `retryAfter` the upstream may say there instead of in the header.
async fn error_answer(mut resp: reqwest::Response) -> PollError {
    let (status, headers) = (resp.status(), resp.headers().clone());
    let mut body = Vec::new();
    if matches!(status.as_u16(), 429 | 503) {
        // A body that fails half-way is judged on what came: the status is the answer.
        while let Ok(Some(chunk)) = resp.chunk().await {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_ERROR_BODY_BYTES {
                body.clear();
                break;
            }
        }
    }
    status_error(status, &headers, &body)
}

/// An error answer's class. A `429`/`503` that says how long to wait — `Retry-After` as
/// seconds or an HTTP date, else the JSON body's `retryAfter` (seed 004's upstream writes
/// `{"error": …, "retryAfter": 60}`) — waits that long (capped by `retry_after_max`).
pub(super) fn status_error(
    status: reqwest::StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &[u8],
) -> PollError {
    let code = status.as_u16();
    let retry_after = headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| crate::retry_after::header(v, std::time::SystemTime::now()))
        .or_else(|| crate::retry_after::body(body));
    match (code, retry_after) {
        (429 | 503, Some(d)) => {
            PollError::RetryAfter(d, Some("rate_limited"), format!("status {code}"))
        }
        (401, _) => PollError::Unauthorized(format!("status {code}")),
        (429, None) => PollError::Transient(Some("rate_limited"), format!("status {code}")),
        (500..=599, _) | (408, _) => {
            PollError::Transient(Some("server_error"), format!("status {code}"))
        }
        _ => PollError::Park(format!("status {code}")),
    }
}

pub(super) async fn read_bounded(mut resp: reqwest::Response) -> Result<Vec<u8>, PollError> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_RESPONSE_BYTES as u64)
    {
        return Err(PollError::Park(format!(
            "response over {MAX_RESPONSE_BYTES} bytes"
        )));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(&e))? {
        if out.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(PollError::Park(format!(
                "response over {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A validated page.
#[derive(Debug)]
pub(super) struct Page {
    pub(super) items: Vec<SourceItem>,
    /// The items `[sources.items] schema` refused: `(id, why)`, in page order.
    pub(super) rejected: Vec<(String, String)>,
    /// Every item's id, in page order (what the ack names).
    pub(super) ids: Vec<String>,
    pub(super) next: Option<String>,
    pub(super) has_more: bool,
}

fn invalid(pointer: &str, why: &str) -> PollError {
    PollError::Park(format!("invalid response at {pointer}: {why}"))
}

/// Why `item` does not satisfy `schema`: its first error and where (`/plan/name: 7 is not of
/// type "string"`), at most 512 characters.
fn schema_error(schema: &jsonschema::Validator, item: &Value) -> Option<String> {
    let e = schema.validate(item).err()?;
    let at = e.instance_path().to_string();
    let why = format!("{}: {e}", if at.is_empty() { "/" } else { &at });
    Some(match why.char_indices().nth(512) {
        Some((i, _)) => format!("{}…", &why[..i]),
        None => why,
    })
}

pub(super) fn parse_page(
    cfg: &SourceConfig,
    schema: Option<&jsonschema::Validator>,
    body: &[u8],
) -> Result<Page, PollError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| invalid("", "not JSON"))?;
    let path = &cfg.items.path;
    let list = if path.is_empty() {
        Some(&v)
    } else {
        v.pointer(path)
    };
    let list = list
        .and_then(Value::as_array)
        .ok_or_else(|| invalid(path, "not an array"))?;
    if list.len() > MAX_ITEMS {
        return Err(invalid(path, &format!("more than {MAX_ITEMS} items")));
    }
    let mut items = Vec::with_capacity(list.len());
    let mut rejected = Vec::new();
    let mut ids = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let at = format!("{path}/{i}");
        if !item.is_object() {
            return Err(invalid(&at, "not an object"));
        }
        if serde_json::to_string(item)
            .map(|s| s.len())
            .unwrap_or(usize::MAX)
            > MAX_ITEM_BYTES
        {
            return Err(invalid(&at, "item over 64 KiB"));
        }
        let id_at = format!("{at}{}", cfg.items.id);
        let id = item
            .pointer(&cfg.items.id)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid(&id_at, "not a non-empty string"))?;
        let event_id = tidemark_projections::names::ids::source_item(&cfg.name, id);
        if event_id.chars().count() > 128 || id.chars().any(char::is_control) {
            return Err(invalid(&id_at, "does not make a valid event_id"));
        }
        ids.push(id.to_owned());
        // An item the configured schema refuses is skipped (recorded with why), not the page.
        if let Some(why) = schema.and_then(|s| schema_error(s, item)) {
            rejected.push((id.to_owned(), why));
            continue;
        }
        items.push(SourceItem {
            id: id.to_owned(),
            item: item.clone(),
        });
    }
    let next = match v.pointer(&cfg.watermark.next) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid(&cfg.watermark.next, "not a string or null")),
    };
    let has_more = match v.pointer(&cfg.watermark.has_more) {
        Some(Value::Bool(b)) => *b,
        _ => return Err(invalid(&cfg.watermark.has_more, "not a boolean")),
    };
    if (!items.is_empty() || !rejected.is_empty()) && next.is_none() {
        return Err(invalid(&cfg.watermark.next, "null on a page with items"));
    }
    Ok(Page {
        items,
        rejected,
        ids,
        next,
        has_more,
    })
}

pub(super) async fn send_ack(
    client: &reqwest::Client,
    src: &Source,
    ack: &AckConfig,
    ids: &[String],
    from: &str,
    to: &str,
) -> Result<(), PollError> {
    let mut body: serde_json::Map<String, Value> = ack
        .extra
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    body.insert(ack.field.clone(), Value::from(ids.to_vec()));
    // When tidemark acknowledged them (seed 004: `"acknowledgedAt": "2025-01-01T12:00:00Z"`,
    // UTC to the second): the time of this request, so a repeat after a crash says when it
    // was sent, under the same idempotency key.
    body.insert(
        "acknowledgedAt".to_owned(),
        Value::from(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
    );
    let resp = client
        .post(&ack.url)
        .headers(headers(client, src).await?)
        .header(
            "X-Idempotency-Key",
            format!("ack:{}:{from}:{to}", src.cfg.name),
        )
        .timeout(src.timeout)
        .json(&Value::Object(body))
        .send()
        .await
        .map_err(|e| transport(&e))?;
    if !resp.status().is_success() {
        return Err(error_answer(resp).await);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::config::tests::cfg;

    #[test]
    fn pages_are_validated_with_the_failing_pointer() {
        let c = cfg();
        let ok =
            br#"{"data":[{"id":"a"},{"id":"b"}],"pagination":{"nextAfterId":"b","hasMore":false}}"#;
        let p = parse_page(&c, None, ok).unwrap();
        assert_eq!(p.items.len(), 2);
        assert_eq!(p.next.as_deref(), Some("b"));
        let cases: [(&[u8], &str); 5] = [
            (b"{", "not JSON"),
            (
                br#"{"data":{},"pagination":{"nextAfterId":null,"hasMore":false}}"#,
                "/data",
            ),
            (
                br#"{"data":[{"id":7}],"pagination":{"nextAfterId":"x","hasMore":false}}"#,
                "/data/0/id",
            ),
            (
                br#"{"data":[{"id":"a"}],"pagination":{"nextAfterId":null,"hasMore":false}}"#,
                "/pagination/nextAfterId",
            ),
            (
                br#"{"data":[],"pagination":{"nextAfterId":null,"hasMore":"no"}}"#,
                "/pagination/hasMore",
            ),
        ];
        let many: Vec<_> = (0..=MAX_ITEMS)
            .map(|i| serde_json::json!({"id": i.to_string()}))
            .collect();
        let too_many =
            serde_json::json!({"data": many, "pagination": {"nextAfterId": "x", "hasMore": true}})
                .to_string();
        let big = serde_json::json!({"data": [{"id": "a", "blob": "x".repeat(MAX_ITEM_BYTES)}], "pagination": {"nextAfterId": "a", "hasMore": false}}).to_string();
        let cases: Vec<(&[u8], &str)> = cases
            .into_iter()
            .chain([
                (too_many.as_bytes(), "more than 1000 items"),
                (big.as_bytes(), "/data/0: item over 64 KiB"),
            ])
            .collect();
        for (body, want) in cases {
            match parse_page(&c, None, body) {
                Err(PollError::Park(e)) => assert!(e.contains(want), "{e} should name {want}"),
                other => panic!("{want}: {other:?}"),
            }
        }
    }

    #[test]
    fn retry_after_and_statuses() {
        use reqwest::StatusCode as S;
        use std::time::Duration;
        let wait = |e: PollError| match e {
            PollError::RetryAfter(d, Some("rate_limited"), _) => Some(d),
            _ => None,
        };
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(
            wait(status_error(S::TOO_MANY_REQUESTS, &h, b"")),
            Some(Duration::from_secs(7))
        );
        // The header wins over the body.
        assert_eq!(
            wait(status_error(
                S::TOO_MANY_REQUESTS,
                &h,
                br#"{"retryAfter":60}"#
            )),
            Some(Duration::from_secs(7))
        );
        // An HTTP date: the wait until then.
        let at = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(90));
        h.insert(reqwest::header::RETRY_AFTER, at.parse().unwrap());
        let d = wait(status_error(S::SERVICE_UNAVAILABLE, &h, b"")).unwrap();
        assert!(
            d > Duration::from_secs(80) && d <= Duration::from_secs(90),
            "{d:?}"
        );
        let none = reqwest::header::HeaderMap::new();
        // The body's `retryAfter` when the header says nothing.
        assert_eq!(
            wait(status_error(
                S::TOO_MANY_REQUESTS,
                &none,
                br#"{"error":"Rate limit exceeded","retryAfter":60}"#
            )),
            Some(Duration::from_secs(60))
        );
        // A 429 without a wait is still rate limiting (its class's backoff, seed 004).
        assert!(matches!(
            status_error(S::TOO_MANY_REQUESTS, &none, b"{}"),
            PollError::Transient(Some("rate_limited"), _)
        ));
        assert!(matches!(
            status_error(S::UNAUTHORIZED, &none, b""),
            PollError::Unauthorized(_)
        ));
        assert!(matches!(
            status_error(S::BAD_GATEWAY, &none, b""),
            PollError::Transient(Some("server_error"), _)
        ));
        assert!(
            matches!(status_error(S::NOT_FOUND, &none, b""), PollError::Park(e) if e == "status 404")
        );
    }
}
