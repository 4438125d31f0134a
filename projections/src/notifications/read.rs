//! The notifications model's queries, its view's: the dashboard's list and a notification's
//! status.

use tidemark_log::StorageError;

use crate::deliveries::Delivery;
use crate::framework::be_u64;
use crate::framework::paged::{Order, Position, Walk, paged};
use crate::ids::NotificationId;
use crate::names::{DeliveryStatus, Priority};
use crate::notifications::{self, Notification, View};
use crate::tasks;

#[derive(Debug, Clone, Default)]
pub struct NotificationFilter {
    pub priority: Option<Priority>,
    pub recipient: Option<String>,
    pub before_seq: Option<u64>,
    pub limit: usize,
}

/// A page of notifications, each with its task's `latest_event_seq`, and the `before_seq` of
/// the next page.
pub type NotificationsWithTaskSeq = (Vec<(Notification, u64)>, Option<u64>);

impl View<'_> {
    /// Notifications newest first; the second value is the `before_seq` of the next page, if any.
    pub fn page(
        &self,
        f: &NotificationFilter,
    ) -> Result<(Vec<Notification>, Option<u64>), StorageError> {
        let keep = |n: &Notification| {
            f.priority.is_none_or(|p| p == n.priority)
                && f.recipient
                    .as_deref()
                    .is_none_or(|r| n.recipient.as_deref() == Some(r))
        };
        let before = f.before_seq.map(u64::to_be_bytes);
        let walk = Walk::ByKey {
            filters: vec![
                (notifications::BY_PRIORITY, f.priority.map(Priority::as_str)),
                (notifications::BY_RECIPIENT, f.recipient.as_deref()),
            ],
            from: before.as_ref().map(<[u8; 8]>::as_slice),
            order: Order::Desc,
        };
        let (out, next) = paged(&self.t, notifications::BY_SEQ, walk, f.limit.max(1), keep)?;
        Ok((out, next.map(|p| p.key)))
    }

    /// [`View::page`], each with the `latest_event_seq` of its task (0 when it names no task
    /// or its task has no events), read in the same transaction: the seed a dashboard opens the
    /// task's stream after (`/v1/tasks/{id}/stream?after_sequence=…`, seed 002), so no event
    /// between the read and the stream's start is missed.
    pub fn page_with_task_seq(
        &self,
        f: &NotificationFilter,
    ) -> Result<NotificationsWithTaskSeq, StorageError> {
        let (rows, next) = self.page(f)?;
        let tasks = tasks::View::over(self.t.src(), self.t.tenant())?;
        let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        let mut out = Vec::with_capacity(rows.len());
        for n in rows {
            let seq = match &n.task_id {
                None => 0,
                Some(t) => match seen.get(t) {
                    Some(s) => *s,
                    None => {
                        let s = tasks.row(t)?.map_or(0, |t| t.latest_event_seq);
                        seen.insert(t.clone(), s);
                        s
                    }
                },
            };
            out.push((n, seq));
        }
        Ok((out, next))
    }

    /// Highest source seq the router has produced a notification for.
    pub fn router_checkpoint(&self) -> Result<u64, StorageError> {
        Ok(self
            .t
            .get(notifications::ROUTER, notifications::ROUTER_KEY)?
            .and_then(|v| be_u64(&v))
            .unwrap_or(0))
    }
}

/// What became of one notification (spec section 14), derived from its deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationStatus {
    pub notification: Notification,
    /// dashboard_only, pending, parked, delivered, discarded, cancelled or skipped.
    pub status: &'static str,
    /// Attempts of all its deliveries.
    pub attempts: u32,
    /// The error of the delivery that failed most recently.
    pub last_error: Option<String>,
    /// When it was enqueued: its `source.enqueued_at`, else the event time.
    pub enqueued_at_us: i64,
    pub created_at_us: i64,
    /// The latest delivery time of its deliveries.
    pub delivered_at_us: Option<i64>,
    /// Its deliveries (a digest it joined counts as its own), by id.
    pub deliveries: Vec<Delivery>,
}

/// A notification's project and provenance (section 2): what a delivery of it serves.
pub type Origin = (Option<String>, notifications::Provenance);

/// The [`Origin`] of the notification at each of `seqs` (`None` where none is there), read in
/// one transaction: a claim asks for all its rows at once.
impl View<'_> {
    pub fn provenances(&self, seqs: &[u64]) -> Result<Vec<Option<Origin>>, StorageError> {
        let rows = self.t.table(notifications::BY_SEQ)?;
        seqs.iter()
            .map(|seq| {
                rows.get(seq.to_be_bytes().as_slice())?
                    .map(|v| {
                        postcard::from_bytes::<Notification>(v.value()).map_err(StorageError::of)
                    })
                    .transpose()
                    .map(|n| n.map(|n| (n.project_id, n.ext)))
            })
            .collect()
    }
}

/// The status of a notification with these deliveries: none → `dashboard_only`; any queued,
/// leased or retry_wait → `pending`; else any parked → `parked`; else any sent → `delivered`;
/// else any discarded → `discarded`; else any cancelled → `cancelled`; else `skipped`.
pub fn notification_status_of(deliveries: &[Delivery]) -> &'static str {
    use DeliveryStatus as S;
    let any = |s: &[S]| deliveries.iter().any(|d| s.contains(&d.status));
    if deliveries.is_empty() {
        "dashboard_only"
    } else if any(&[S::Queued, S::Leased, S::RetryWait]) {
        "pending"
    } else if any(&[S::Parked]) {
        "parked"
    } else if any(&[S::Sent]) {
        "delivered"
    } else if any(&[S::Discarded]) {
        "discarded"
    } else if any(&[S::Cancelled]) {
        "cancelled"
    } else {
        "skipped"
    }
}

/// Deliveries a status record lists at most (one per route; a notification has a handful).
const STATUS_DELIVERIES_MAX: usize = 1000;

/// The status record of notification `id`, or `None` when no notification has that id.
impl View<'_> {
    pub fn status(
        &self,
        id: &NotificationId,
        intent_key: Option<&str>,
    ) -> Result<Option<NotificationStatus>, StorageError> {
        let id = id.as_str();
        let Some(notification) = self.by_id(id)? else {
            return Ok(None);
        };
        // Its deliveries on redacting routes carry the intent key in place of its id.
        let keys: Vec<&str> = std::iter::once(id).chain(intent_key).collect();
        let deliveries = crate::deliveries::View::over(self.t.src(), self.t.tenant())?;
        let found = deliveries.rows_of_notification(&keys, STATUS_DELIVERIES_MAX)?;
        let canceled = deliveries.notification_canceled(id)?;
        // A canceled notification whose digest let it go has no delivery left: cancelled.
        let status = match notification_status_of(&found) {
            "dashboard_only" if canceled => "cancelled",
            s => s,
        };
        let last_error = found
            .iter()
            .filter(|d| d.last_error.is_some())
            .max_by_key(|d| (d.updated_at_us, d.last_seq))
            .and_then(|d| d.last_error.clone());
        Ok(Some(NotificationStatus {
            status,
            attempts: found.iter().map(|d| d.attempts).sum(),
            last_error,
            enqueued_at_us: notification
                .ext
                .enqueued_at_us()
                .unwrap_or(notification.time_us),
            created_at_us: notification.time_us,
            delivered_at_us: found.iter().filter_map(|d| d.delivered_at_us).max(),
            deliveries: found,
            notification,
        }))
    }
}

/// A notification's place: its seq (the key of its row).
impl From<&Notification> for Position {
    fn from(n: &Notification) -> Self {
        Position {
            key: n.seq,
            id: String::new(),
        }
    }
}
