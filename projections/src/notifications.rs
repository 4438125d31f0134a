//! The notifications read model (the dashboard) and the routing of lifecycle events.
//!
//! A notification comes from a client's `notification.requested` (its event_id is the
//! notification id) or from the router's `notification.created` (id `ntf:<source_seq>`).

pub mod read;

use crate::names::{EventType, Priority, Stream};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_log::StorageError;
use tidemark_log::{Event, EventRef};

use crate::framework::{Fold, Store, be_u64};

pub const NAME: &str = "notifications";
pub const BY_SEQ: &str = "by_seq";
pub const IDS: &str = "ids";
/// `priority ‖ 0 ‖ seq (BE)` and `recipient ‖ 0 ‖ seq (BE)` (notifications with a recipient):
/// the list filters of `GET /v1/notifications`, intersected when combined. Added after the
/// golden release, so they are written outside the digest (`Store::put_index`).
pub(crate) const BY_PRIORITY: &str = "by_priority";
pub(crate) const BY_RECIPIENT: &str = "by_recipient";
pub(crate) const ROUTER: &str = "router";
pub(crate) const ROUTER_KEY: &[u8] = b"source_seq";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    pub notification_id: String,
    pub seq: u64,
    pub priority: Priority,
    pub title: String,
    pub body: Option<String>,
    pub recipient: Option<String>,
    pub group_key: Option<String>,
    pub task_id: Option<String>,
    pub project_id: Option<String>,
    pub deliver_after: Option<String>,
    /// For routed notifications: the lifecycle event they come from.
    pub source_seq: Option<u64>,
    /// Event time, microseconds since the epoch.
    pub time_us: i64,
    /// Provenance (section 2), at its default for a notification without any (so such a row
    /// keeps the bytes, and the digest, it had before: [`crate::trailing`]).
    #[serde(default, with = "crate::trailing")]
    pub ext: Provenance,
}

crate::framework::postcard_row!(Notification);

/// A notification's `type`, `type_data` and `source` (section 2); the objects are kept as the
/// client's JSON text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    pub ntype: Option<String>,
    pub type_data: Option<String>,
    pub source: Option<String>,
    /// What later releases added (trailing: a notification without them keeps its bytes).
    #[serde(default, with = "crate::trailing")]
    pub more: ProvenanceMore,
}

/// The fields of seed 000's delivery rows that come from the notification: the session it
/// belongs to, a key telling apart the destinations of one notification and route, and the
/// request the sink is to send (an object, kept as the client's JSON text).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvenanceMore {
    pub session_id: Option<String>,
    pub destination_key: Option<String>,
    pub request_json: Option<String>,
}

impl Provenance {
    /// Read from a payload (the fields the schema admitted).
    pub fn of(p: &Value) -> Provenance {
        let obj = |k: &str| p.get(k).filter(|v| v.is_object()).map(Value::to_string);
        let text = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_owned);
        Provenance {
            ntype: text("type"),
            type_data: obj("type_data"),
            source: obj("source"),
            more: ProvenanceMore {
                session_id: text("session_id"),
                destination_key: text("destination_key"),
                request_json: obj("request_json"),
            },
        }
    }

    /// `source.site_id`.
    pub fn site_id(&self) -> Option<String> {
        let v: Value = serde_json::from_str(self.source.as_deref()?).ok()?;
        v.get("site_id").and_then(Value::as_str).map(str::to_owned)
    }

    /// `source.enqueued_at`, microseconds.
    pub fn enqueued_at_us(&self) -> Option<i64> {
        let v: Value = serde_json::from_str(self.source.as_deref()?).ok()?;
        v.get("enqueued_at")
            .and_then(Value::as_str)
            .and_then(tidemark_log::time::parse_rfc3339_micros)
    }
}

/// The priority a lifecycle event's notification gets (spec section 2), if it gets one.
pub fn lifecycle_priority(event_type: &str) -> Option<Priority> {
    use EventType as T;
    Some(match EventType::parse(event_type)? {
        T::TaskRunFailed => Priority::Urgent,
        T::TaskRunReviewRequested => Priority::Action,
        T::TaskRunReviewRejected | T::TaskRunCanceled | T::TaskCanceled => Priority::Warning,
        T::TaskRunCompleted | T::TaskRunReviewApproved => Priority::Info,
        _ => return None,
    })
}

/// The payload of the `notification.created` routed from a lifecycle event; a function of the
/// event (and the project id the router read), so a replay produces the same bytes.
pub fn routed_payload(ev: &Event, project_id: Option<&str>) -> Option<Value> {
    let priority = lifecycle_priority(&ev.event_type)?;
    let p = ev.payload_value();
    let run = p.get("run_id").and_then(Value::as_str);
    let task = ev.subject.as_str();
    use EventType as T;
    let title = match (EventType::parse(&ev.event_type), run) {
        (Some(T::TaskRunFailed), Some(r)) => format!("Run {r} of {task} failed"),
        (Some(T::TaskRunReviewRequested), Some(r)) => format!("Run {r} of {task} needs review"),
        (Some(T::TaskRunReviewRejected), Some(r)) => {
            format!("Review of run {r} of {task} rejected")
        }
        (Some(T::TaskRunCanceled), Some(r)) => format!("Run {r} of {task} canceled"),
        (Some(T::TaskRunCompleted), Some(r)) => format!("Run {r} of {task} completed"),
        (Some(T::TaskRunReviewApproved), Some(r)) => format!("Run {r} of {task} approved"),
        (Some(T::TaskCanceled), _) => format!("Task {task} canceled"),
        _ => format!("{} on {task}", ev.event_type),
    };
    let body = p
        .get("error")
        .or_else(|| p.get("reason"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut out = serde_json::json!({
        "priority": priority.as_str(),
        "title": title,
        "task_id": task,
        "source_seq": ev.seq,
        "source_type": ev.event_type,
    });
    if let Some(b) = body {
        out["body"] = Value::String(b);
    }
    if let Some(pid) = project_id {
        out["project_id"] = Value::String(pid.to_owned());
    }
    if let Some(r) = run {
        out["run_id"] = Value::String(r.to_owned());
    }
    Some(out)
}

/// The payload fields the dashboard row takes, read without building a value tree: strings
/// are borrowed from the event where they can be, and a field of another JSON type reads as
/// absent (as `Value::as_str` / `as_u64` read it).
#[derive(Default, Deserialize)]
#[serde(default, bound(deserialize = "'de: 'a"))]
struct Fields<'a> {
    priority: LenientStr<'a>,
    title: LenientStr<'a>,
    body: LenientStr<'a>,
    recipient: LenientStr<'a>,
    group_key: LenientStr<'a>,
    task_id: LenientStr<'a>,
    project_id: LenientStr<'a>,
    deliver_after: LenientStr<'a>,
    source_seq: LenientU64,
}

impl<'a> Fields<'a> {
    /// The same fields read from a value tree (`Value::as_str` / `as_u64`).
    fn of_tree(p: &'a Value) -> Fields<'a> {
        let s = |k: &str| {
            LenientStr(
                p.get(k)
                    .and_then(Value::as_str)
                    .map(std::borrow::Cow::Borrowed),
            )
        };
        Fields {
            priority: s("priority"),
            title: s("title"),
            body: s("body"),
            recipient: s("recipient"),
            group_key: s("group_key"),
            task_id: s("task_id"),
            project_id: s("project_id"),
            deliver_after: s("deliver_after"),
            source_seq: LenientU64(p.get("source_seq").and_then(Value::as_u64)),
        }
    }
}

#[derive(Default)]
struct LenientStr<'a>(Option<std::borrow::Cow<'a, str>>);

impl LenientStr<'_> {
    fn owned(&self) -> Option<String> {
        self.0.as_deref().map(str::to_owned)
    }
}

#[derive(Default)]
struct LenientU64(Option<u64>);

/// Reads any JSON value, keeping a string or a non-negative integer.
struct Lenient;

enum Read<'a> {
    Str(std::borrow::Cow<'a, str>),
    U64(u64),
    Other,
}

impl<'de> serde::de::Visitor<'de> for Lenient {
    type Value = Read<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Read<'de>, E> {
        Ok(Read::Str(std::borrow::Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Read<'de>, E> {
        Ok(Read::Str(std::borrow::Cow::Owned(v.to_owned())))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Read<'de>, E> {
        Ok(Read::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Read<'de>, E> {
        Ok(u64::try_from(v).map_or(Read::Other, Read::U64))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Read<'de>, E> {
        Ok(Read::Other)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Read<'de>, E> {
        Ok(Read::Other)
    }
    fn visit_unit<E>(self) -> Result<Read<'de>, E> {
        Ok(Read::Other)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Read<'de>, A::Error> {
        while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Read::Other)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Read<'de>, A::Error> {
        while a
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        Ok(Read::Other)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for LenientStr<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(LenientStr(match d.deserialize_any(Lenient)? {
            Read::Str(s) => Some(s),
            _ => None,
        }))
    }
}

impl<'de> Deserialize<'de> for LenientU64 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(LenientU64(match d.deserialize_any(Lenient)? {
            Read::U64(n) => Some(n),
            _ => None,
        }))
    }
}

/// `value ‖ 0 ‖ seq (BE)`: a row of `by_priority` or `by_recipient`.
pub(crate) fn index_key(value: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(value.len() + 9);
    k.extend_from_slice(value.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

crate::framework::txn_view! {
    /// The notifications model inside a models transaction (commands decide on it at the head).
    NAME
}

impl View<'_> {
    /// The notification whose id is `id`.
    pub fn by_id(&self, id: &str) -> Result<Option<Notification>, StorageError> {
        let Some(seq) = self
            .t
            .get(IDS, id.as_bytes())?
            .and_then(|v| crate::framework::be_u64(&v))
        else {
            return Ok(None);
        };
        self.t.get_row(BY_SEQ, &seq.to_be_bytes())
    }

    /// Σ `weight(priority)` over the notifications at seqs after `after`: with `after` the
    /// routing checkpoint and the deliveries each priority makes as the weight, the
    /// deliveries the router has yet to make (the outbox bound, spec section 5). Priorities of
    /// weight 0 are not read.
    pub fn weighted_after(
        &self,
        after: u64,
        weight: impl Fn(&str) -> u64,
    ) -> Result<u64, StorageError> {
        let index = self.t.table(BY_PRIORITY)?;
        let mut sum = 0;
        for p in Priority::ALL {
            let w = weight(p.as_str());
            if w == 0 {
                continue;
            }
            let lo = index_key(p.as_str(), after.saturating_add(1));
            let hi = index_key(p.as_str(), u64::MAX);
            let n = index.range(lo.as_slice()..=hi.as_slice())?.count() as u64;
            sum += w * n;
        }
        Ok(sum)
    }

    /// The notifications at seqs up to `through_seq` whose time is before `before_us`, oldest
    /// first, at most `max` (event times never go back along seq: the first one at or past
    /// `before_us` ends the list).
    pub fn older_than(
        &self,
        through_seq: u64,
        before_us: i64,
        max: usize,
    ) -> Result<Vec<Notification>, StorageError> {
        let mut rows = Vec::new();
        for row in self
            .t
            .table(BY_SEQ)?
            .range(..=through_seq.to_be_bytes().as_slice())?
        {
            let (_, v) = row.map_err(StorageError::of)?;
            let note: Notification = postcard::from_bytes(v.value()).map_err(StorageError::of)?;
            if note.time_us >= before_us || rows.len() >= max {
                break;
            }
            rows.push(note);
        }
        Ok(rows)
    }
}

pub struct Notifications;

impl Fold for Notifications {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[BY_SEQ, IDS, ROUTER, BY_PRIORITY, BY_RECIPIENT];
    /// 2: the list-filter indexes `by_priority`, `by_recipient` (outside the digest); 3: a
    /// row's provenance (`ext`, absent on rows without any); 4: seed 000's `session_id`,
    /// `destination_key` and `request_json` (`ext.more`); 5: the priority a `Priority` (an
    /// unchecked event's other value read as `info`: the same bytes for every checked one).
    /// An older model is rebuilt from the log at the next open, which fills them.
    const VERSION: u32 = 5;

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        if Stream::parse(ev.stream) == Some(Stream::Retention)
            && EventType::parse(ev.event_type) == Some(EventType::RetentionPurged)
        {
            let p = crate::retention::Purged::parse(ev.payload);
            for id in &p.notifications {
                let Some(seq) = st.get(IDS, id.as_bytes())?.and_then(|b| be_u64(&b)) else {
                    continue;
                };
                let Some(n) = st.get_val::<Notification>(BY_SEQ, &seq.to_be_bytes())? else {
                    continue;
                };
                if n.seq > p.through_seq {
                    continue;
                }
                st.delete(BY_SEQ, &seq.to_be_bytes())?;
                st.delete(IDS, id.as_bytes())?;
                st.delete_index(BY_PRIORITY, &index_key(n.priority.as_str(), seq));
                if let Some(r) = &n.recipient {
                    st.delete_index(BY_RECIPIENT, &index_key(r, seq));
                }
            }
            return Ok(());
        }
        if Stream::parse(ev.stream) != Some(Stream::Notifications) {
            return Ok(());
        }
        let id = match EventType::parse(ev.event_type) {
            Some(EventType::NotificationRequested) => ev.event_id,
            Some(EventType::NotificationCreated) => ev.subject,
            _ => return Ok(()),
        };
        if st.get(IDS, id.as_bytes())?.is_some() {
            // One notification per id, whatever arrives later under it.
            return Ok(());
        }
        // A payload the borrowed reader refuses (a key given twice) is read from the value
        // tree, as before, so the row is the same whichever reads it.
        let tree;
        let f = match serde_json::from_str::<Fields<'_>>(ev.payload) {
            Ok(f) => f,
            Err(_) => {
                tree = ev.payload_value();
                Fields::of_tree(&tree)
            }
        };
        let n = Notification {
            notification_id: id.to_owned(),
            seq: ev.seq,
            priority: crate::names::priority_or_info::parse(f.priority.0.as_deref()),
            title: f.title.owned().unwrap_or_default(),
            body: f.body.owned(),
            recipient: f.recipient.owned(),
            group_key: f.group_key.owned(),
            task_id: f.task_id.owned(),
            project_id: f.project_id.owned(),
            deliver_after: f.deliver_after.owned(),
            source_seq: f.source_seq.0,
            time_us: ev.time_us,
            // Only a payload that names them is read as a tree (most carry none).
            ext: if ev.payload.contains("\"type")
                || ev.payload.contains("\"source\"")
                || ev.payload.contains("\"session_id\"")
                || ev.payload.contains("\"destination_key\"")
                || ev.payload.contains("\"request_json\"")
            {
                Provenance::of(&ev.payload_value())
            } else {
                Provenance::default()
            },
        };
        st.put(IDS, id.as_bytes(), &ev.seq.to_be_bytes())?;
        st.put_val(BY_SEQ, &ev.seq.to_be_bytes(), &n)?;
        // A notification is written once and never changes or goes (see above), so its index
        // rows are only ever added.
        st.put_index(BY_PRIORITY, &index_key(n.priority.as_str(), ev.seq));
        if let Some(r) = &n.recipient {
            st.put_index(BY_RECIPIENT, &index_key(r, ev.seq));
        }
        if let Some(src) = n.source_seq {
            let prev = st
                .get(ROUTER, ROUTER_KEY)?
                .and_then(|b| be_u64(&b))
                .unwrap_or(0);
            if src > prev {
                st.put(ROUTER, ROUTER_KEY, &src.to_be_bytes())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: &Value, k: &str) -> Option<String> {
        p.get(k).and_then(Value::as_str).map(str::to_owned)
    }

    /// The borrowed reader reads every field as the value tree does, whatever its JSON type.
    #[test]
    fn borrowed_fields_read_like_the_value_tree() {
        for text in [
            r#"{"priority":"urgent","title":"t","body":"b","recipient":"r","group_key":"g","task_id":"x","project_id":"p","deliver_after":"2026-01-01T00:00:00Z","source_seq":7}"#,
            r#"{"title":"esc \"quoted\" \u00e9","priority":3,"body":null,"recipient":{"a":[1,2]},"group_key":[1,{"b":2}],"source_seq":-1}"#,
            r#"{"title":true,"source_seq":1.5,"task_id":"t","extra":{"deep":[[]]}}"#,
            r#"{"source_seq":18446744073709551615}"#,
            r#"{}"#,
        ] {
            let f: Fields<'_> = serde_json::from_str(text).unwrap();
            let p: Value = serde_json::from_str(text).unwrap();
            assert_eq!(f.priority.owned(), s(&p, "priority"), "{text}");
            assert_eq!(f.title.owned(), s(&p, "title"), "{text}");
            assert_eq!(f.body.owned(), s(&p, "body"), "{text}");
            assert_eq!(f.recipient.owned(), s(&p, "recipient"), "{text}");
            assert_eq!(f.group_key.owned(), s(&p, "group_key"), "{text}");
            assert_eq!(f.task_id.owned(), s(&p, "task_id"), "{text}");
            assert_eq!(f.project_id.owned(), s(&p, "project_id"), "{text}");
            assert_eq!(f.deliver_after.owned(), s(&p, "deliver_after"), "{text}");
            assert_eq!(
                f.source_seq.0,
                p.get("source_seq").and_then(Value::as_u64),
                "{text}"
            );
        }
        // A key given twice is refused by the borrowed reader (the fold then reads the tree).
        assert!(serde_json::from_str::<Fields<'_>>(r#"{"title":"a","title":"b"}"#).is_err());
    }
}
