//! The ids the server derives. Each is a function of what it stands for, so a replayed
//! derivation produces the same id and the log answers it as a duplicate.

/// Prefixes of the ids tidemark gives the events it derives: a client event under one of
/// them could block a derivation forever, so clients may not use them.
pub const RESERVED_PREFIXES: [&str; 9] = [
    "ntf:",
    "dlv:",
    "notif:",
    "mismatch:",
    "cursor:",
    "settings:",
    "src:",
    // Operational notifications (`op:<seq>`) and what a node records (`node:<node>:…`).
    "op:",
    "node:",
];

/// An item of source `name` (spec section 12): `src:<name>:<id>`.
pub fn source_item(name: &str, id: &str) -> String {
    format!("src:{name}:{id}")
}

/// The notification about a source page's new items: `src:<name>:notify:<first new id>`.
pub fn source_notification(name: &str, first_new_id: &str) -> String {
    format!("src:{name}:notify:{first_new_id}")
}

/// The item id of a source item's event id.
pub fn source_item_id<'a>(name: &str, event_id: &'a str) -> Option<&'a str> {
    event_id
        .strip_prefix("src:")?
        .strip_prefix(name)?
        .strip_prefix(':')
}

/// The notification routed from the lifecycle event at `source_seq`: `ntf:<source_seq>`.
pub fn routed_notification(source_seq: u64) -> String {
    format!("ntf:{source_seq}")
}

/// The delivery of a notification on a route: `dlv:<notification_id>:<route>`; when that
/// is longer than a subject may be (128), the notification id is replaced by a hash of it.
pub fn delivery(notification_id: &str, route: &str) -> String {
    let id = format!("dlv:{notification_id}:{route}");
    if id.chars().count() <= 128 {
        return id;
    }
    let h = blake3::hash(notification_id.as_bytes()).to_hex();
    format!("dlv:~{}:{route}", &h[..32])
}

/// The subject of a cursor's events: its consumer id, or, when that is longer than a
/// subject may be (128; a bridge consumer of a long subscription id is), `cursor:~<hash>`
/// with the consumer id in the payload.
pub fn cursor_subject(consumer_id: &str) -> Option<String> {
    if consumer_id.chars().count() <= 128 {
        return None;
    }
    let h = blake3::hash(consumer_id.as_bytes()).to_hex();
    Some(format!("cursor:~{}", &h[..32]))
}

const BRIDGE_CONSUMER: &str = "bridge_task_subscription:";

/// The consumer id of a bridge subscription's cursor.
pub fn bridge_consumer(subscription_id: &str) -> String {
    format!("{BRIDGE_CONSUMER}{subscription_id}")
}

/// What starts the endpoint name of a bridge webhook subscription (no route may be named
/// so).
pub const BRIDGE_ENDPOINT: &str = "bridge:";

/// The endpoint name of bridge webhook subscription `subscription_id` (the subject of its
/// `endpoint.*` events, and its `route` in `GET /v1/outbox/endpoints`, section 17).
pub fn bridge_endpoint(subscription_id: &str) -> String {
    format!("{BRIDGE_ENDPOINT}{subscription_id}")
}

/// The subscription whose endpoint `name` is, if it is one.
pub fn subscription_of_endpoint(name: &str) -> Option<&str> {
    name.strip_prefix(BRIDGE_ENDPOINT)
}

/// The subscription whose cursor `consumer_id` is, if it is one.
pub fn subscription_of_consumer(consumer_id: &str) -> Option<&str> {
    consumer_id.strip_prefix(BRIDGE_CONSUMER)
}

/// What every delivery id of a bridge subscription starts with: `notif:<subscription_id>:`.
pub fn bridge_delivery_prefix(subscription_id: &str) -> String {
    format!("notif:{subscription_id}:")
}

/// A bridge delivery: `notif:<subscription_id>:<seq>`.
pub fn bridge_delivery(subscription_id: &str, seq: u64) -> String {
    format!("{}{seq}", bridge_delivery_prefix(subscription_id))
}

/// The subscription and seq a bridge delivery id names.
pub fn parse_bridge_delivery(id: &str) -> Option<(&str, u64)> {
    let rest = id.strip_prefix("notif:")?;
    let (sub, seq) = rest.rsplit_once(':')?;
    Some((sub, seq.parse().ok()?))
}

/// The one record of a subscription stopping at a mismatch: `mismatch:<sub>:<seq>`.
pub fn mismatch(subscription_id: &str, seq: u64) -> String {
    format!("mismatch:{subscription_id}:{seq}")
}
