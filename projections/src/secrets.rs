//! Secrets the log keeps and nothing serves (spec sections 8 and 17): a bridge webhook sink's
//! secret and URL in `bridge.subscribed` (the notifier signs and POSTs with them after a
//! restart) and a webhook route's in `route.updated` (every node's dispatcher uses them). A
//! webhook URL is a credential too: for Slack-, Teams- and Discord-style incoming webhooks the
//! path is the token. Event pages and streams show `"secret": "[redacted]"`, the URL by
//! scheme, host and port (an `env:NAME` reference as written) and each of a webhook route's
//! `headers` by its name with `"***"` for its value (an API key, a bearer token), for every
//! scope.

use tidemark_log::Event;

use crate::names::EventType;

/// What a served event shows in place of a secret.
pub const REDACTED: &str = "[redacted]";

/// What a served event shows in place of each header value of a webhook route (as
/// `GET /v1/routes` shows a literal one).
pub const SHOWN_HEADER: &str = "***";

/// A webhook URL as tidemark shows it anywhere (answers, events, streams, the console, logs):
/// its `env:` reference as written, else scheme, host and port (`https://hooks.example:443`);
/// `"[redacted]"` for text that is not a URL with a host.
pub fn shown_url(u: &str) -> String {
    if u.starts_with("env:") {
        return u.to_owned();
    }
    url::Url::parse(u)
        .ok()
        .and_then(|p| shown(&p))
        .unwrap_or_else(|| REDACTED.to_owned())
}

/// A parsed URL by scheme, host and port (`None` without a host).
pub fn shown(u: &url::Url) -> Option<String> {
    Some(format!(
        "{}://{}:{}",
        u.scheme(),
        u.host_str()?,
        u.port_or_known_default().unwrap_or(0)
    ))
}

/// Hide the secret, the URL's path and the header values of a served event that carries them.
pub fn redact(ev: &mut Event) {
    let at = match EventType::parse(&ev.event_type) {
        Some(EventType::BridgeSubscribed) => "/target/sink",
        Some(EventType::RouteUpdated) => "/route",
        _ => return,
    };
    let raw = ev.payload.get();
    if !["\"secret\"", "\"url\"", "\"headers\""]
        .iter()
        .any(|k| raw.contains(k))
    {
        return;
    }
    let mut v = ev.payload_value();
    let Some(obj) = v.pointer_mut(at).and_then(serde_json::Value::as_object_mut) else {
        return;
    };
    let mut changed = false;
    if obj.contains_key("secret") {
        obj.insert("secret".into(), serde_json::Value::String(REDACTED.into()));
        changed = true;
    }
    if let Some(serde_json::Value::String(u)) = obj.get("url") {
        let shown = shown_url(u);
        obj.insert("url".into(), serde_json::Value::String(shown));
        changed = true;
    }
    if let Some(serde_json::Value::Object(h)) = obj.get_mut("headers") {
        for v in h.values_mut() {
            *v = serde_json::Value::String(SHOWN_HEADER.into());
        }
        changed = true;
    }
    if changed && let Ok(raw) = serde_json::value::to_raw_value(&v) {
        ev.payload = raw;
    }
}

#[cfg(test)]
mod tests {
    use super::shown_url;

    #[test]
    fn a_url_is_shown_by_scheme_host_and_port() {
        assert_eq!(
            shown_url("https://hooks.example/services/T000/B000/XXXX?x=1#f"),
            "https://hooks.example:443"
        );
        assert_eq!(
            shown_url("http://user:pw@127.0.0.1:8080/p"),
            "http://127.0.0.1:8080"
        );
        assert_eq!(shown_url("env:TEAMS_URL"), "env:TEAMS_URL");
        assert_eq!(shown_url("not a url /secret/path"), "[redacted]");
    }
}
