//! The HTTP requests the benchmarks make of a tidemark server (and the bench targets of their
//! own `benches/benches/` harnesses): a GET whose answer is JSON, a POST of a JSON body.

use serde_json::Value;

/// The JSON form of a `notification.requested` of `id` (its event id and subject) with
/// `payload`, as `POST /v1/events` takes it.
pub fn notification_requested(id: &str, payload: Value) -> Value {
    serde_json::json!({
        "event_id": id,
        "stream": "notifications",
        "subject": id,
        "type": "notification.requested",
        "payload": payload,
    })
}

/// `GET url`, its answer read as JSON whatever its status; a failure as its message.
pub async fn get_json(client: &reqwest::Client, url: &str) -> Result<Value, String> {
    client
        .get(url)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())
}

/// `request` sent: its answer's head; failing to send it, as `<what>: <error>`.
pub async fn send(
    request: reqwest::RequestBuilder,
    what: &str,
) -> Result<reqwest::Response, String> {
    request.send().await.map_err(|e| format!("{what}: {e}"))
}

/// `request` sent: its answer's status and body; failing to send it or to read the answer, as
/// `<what>: <error>`.
async fn answer(
    request: reqwest::RequestBuilder,
    what: &str,
) -> Result<(reqwest::StatusCode, bytes::Bytes), String> {
    let r = send(request, what).await?;
    let status = r.status();
    let body = r.bytes().await.map_err(|e| format!("{what}: {e}"))?;
    Ok((status, body))
}

/// `POST url` with `body`, JSON already encoded: the answer's status and body. Sending and
/// reading fail alike, as `POST <url>: <error>`.
pub async fn post_json_body(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
) -> Result<(reqwest::StatusCode, bytes::Bytes), String> {
    let request = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    answer(request, &format!("POST {url}")).await
}

/// `GET url` answered with a success: its body as JSON; else `GET <url> answered <status>:
/// <body>`, or what failed.
pub async fn get_ok_json(client: &reqwest::Client, url: &str) -> Result<Value, String> {
    let (status, body) = answer(client.get(url), &format!("GET {url}")).await?;
    if !status.is_success() {
        return Err(format!(
            "GET {url} answered {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("GET {url}: {e}"))
}

/// `POST url` with `value` as its JSON body: `Ok` when the answer is a success (its body left
/// unread), else its status and text as `<what>: <text>`; a failure to send as
/// `<what>: <error>`.
pub async fn post_ok(
    client: &reqwest::Client,
    url: &str,
    value: &Value,
    what: &str,
) -> Result<(), String> {
    let r = send(client.post(url).json(value), what).await?;
    if !r.status().is_success() {
        return Err(format!("{what}: {}", r.text().await.unwrap_or_default()));
    }
    Ok(())
}
