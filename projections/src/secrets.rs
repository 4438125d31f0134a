//! Secrets the log keeps and nothing serves (spec section 8): a bridge webhook sink's secret in
//! `bridge.subscribed` (the notifier signs with it after a restart) and a webhook route's in
//! `route.updated` (every node's dispatcher signs with it). Event pages and streams show
//! `"secret": "[redacted]"` in their place.

use tidemark_log::Event;

use crate::names::EventType;

/// What a served event shows in place of a secret.
pub const REDACTED: &str = "[redacted]";

/// Hide the secret of a served event that carries one.
pub fn redact(ev: &mut Event) {
    let at = match EventType::parse(&ev.event_type) {
        Some(EventType::BridgeSubscribed) => "/target/sink",
        Some(EventType::RouteUpdated) => "/route",
        _ => return,
    };
    if !ev.payload.get().contains("\"secret\"") {
        return;
    }
    let mut v = ev.payload_value();
    if let Some(obj) = v.pointer_mut(at).and_then(serde_json::Value::as_object_mut)
        && obj.contains_key("secret")
    {
        obj.insert("secret".into(), serde_json::Value::String(REDACTED.into()));
        if let Ok(raw) = serde_json::value::to_raw_value(&v) {
            ev.payload = raw;
        }
    }
}
