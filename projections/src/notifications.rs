//! The notifications read model (the dashboard) and the routing of lifecycle events.
//!
//! A notification comes from a client's `notification.requested` (its event_id is the
//! notification id) or from the router's `notification.created` (id `ntf:<source_seq>`).

use crate::names::{EventType, Priority, Stream};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_log::Event;
use tidemark_log::StorageError;

use crate::framework::{Projection, Store, be_u64};

pub const NAME: &str = "notifications";
pub(crate) const BY_SEQ: &str = "by_seq";
pub(crate) const IDS: &str = "ids";
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
    pub priority: String,
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

fn s(p: &Value, k: &str) -> Option<String> {
    p.get(k).and_then(Value::as_str).map(str::to_owned)
}

/// `value ‖ 0 ‖ seq (BE)`: a row of `by_priority` or `by_recipient`.
pub(crate) fn index_key(value: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(value.len() + 9);
    k.extend_from_slice(value.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub struct Notifications;

impl Projection for Notifications {
    fn name(&self) -> &'static str {
        NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        &[BY_SEQ, IDS, ROUTER, BY_PRIORITY, BY_RECIPIENT]
    }

    /// 2: the list-filter indexes `by_priority`, `by_recipient` (outside the digest); a model
    /// of version 1 is rebuilt from the log at the next open, which fills them.
    fn version(&self) -> u32 {
        2
    }

    fn apply(&self, st: &mut Store<'_>, ev: &Event) -> Result<(), StorageError> {
        if ev.stream != Stream::Notifications {
            return Ok(());
        }
        let id = match EventType::parse(&ev.event_type) {
            Some(EventType::NotificationRequested) => ev.event_id.clone(),
            Some(EventType::NotificationCreated) => ev.subject.clone(),
            _ => return Ok(()),
        };
        if st.get(IDS, id.as_bytes())?.is_some() {
            // One notification per id, whatever arrives later under it.
            return Ok(());
        }
        let p = ev.payload_value();
        let n = Notification {
            notification_id: id.clone(),
            seq: ev.seq,
            priority: s(&p, "priority").unwrap_or_else(|| "info".into()),
            title: s(&p, "title").unwrap_or_default(),
            body: s(&p, "body"),
            recipient: s(&p, "recipient"),
            group_key: s(&p, "group_key"),
            task_id: s(&p, "task_id"),
            project_id: s(&p, "project_id"),
            deliver_after: s(&p, "deliver_after"),
            source_seq: p.get("source_seq").and_then(Value::as_u64),
            time_us: ev.time_us,
        };
        st.put(IDS, id.as_bytes(), &ev.seq.to_be_bytes())?;
        st.put_val(BY_SEQ, &ev.seq.to_be_bytes(), &n)?;
        // A notification is written once and never changes or goes (see above), so its index
        // rows are only ever added.
        st.put_index(BY_PRIORITY, &index_key(&n.priority, ev.seq));
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
