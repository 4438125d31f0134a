//! `Page`: append a polled page's new items, and the cycle's one notification.

use super::*;

/// Append a page's new items as one atomic batch, and with the last page of a poll cycle the
/// cycle's one notification, about every item appended since the cycle began that no
/// notification covers yet (so a cycle replayed after a crash between its pages still
/// notifies once, about all of them); answers what it appended.
#[derive(Debug, Clone)]
pub struct Page {
    pub name: String,
    pub items: Vec<SourceItem>,
    pub notify: Option<NotifyPlan>,
    /// The bound for this source (section 12: its `backpressure_threshold` × `max_pending`):
    /// a notification that would take pending deliveries past it holds the page back (nothing
    /// appended) and the poll waits for the outbox to drain.
    pub max_pending: u64,
    /// The cycle's last page: the notification goes with it.
    pub last: bool,
    /// The cycle's first item, when it was on an earlier page: the title's placeholders read
    /// it.
    pub first_of_cycle: Option<SourceItem>,
    /// The page's items its `[sources.items] schema` refused, `(id, why)`: each recorded once
    /// as `source.item_skipped` (counted), never appended as an item nor notified.
    pub rejected: Vec<(String, String)>,
}

impl Command for Page {
    type Answer = PageOutcome;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let Page {
            name,
            items,
            notify,
            max_pending,
            last,
            first_of_cycle,
            rejected,
        } = self;
        let max_pending = *max_pending;
        let now_us = round.now_us;
        let st = CommandError::Models;
        let model = sources::View::new(txn).map_err(st)?;
        let row = model.row(name).map_err(st)?;
        if let Some(e) = not_active(&row) {
            return Err(e);
        }
        let mut events = Vec::new();
        let mut new_items: Vec<&SourceItem> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut skipped = 0;
        let mut first_covered: Option<String> = None;
        for it in items {
            // An id twice on one page, or already appended: left out, whatever its
            // content now (an item that changed upstream is not a conflict).
            if !seen.insert(it.id.as_str()) || model.has_item(name, &it.id).map_err(st)? {
                if first_covered.is_none() && model.is_pending(name, &it.id).map_err(st)? {
                    first_covered = Some(it.id.clone());
                }
                skipped += 1;
                continue;
            }
            if first_covered.is_none() {
                first_covered = Some(it.id.clone());
            }
            events.push(source_event(
                name,
                EventType::SourceItem,
                Some(ids::source_item(name, &it.id)),
                &it.item,
            )?);
            new_items.push(it);
        }
        // An item the schema refused: recorded once, with why (a replayed poll finds it).
        let mut rejected_now = 0;
        for (id, why) in rejected {
            // Already in the log (whatever its content now) or already skipped: left out.
            if !seen.insert(id.as_str())
                || model.has_item(name, id).map_err(st)?
                || model.has_skipped(name, id).map_err(st)?
            {
                continue;
            }
            events.push(source_event(
                name,
                EventType::SourceItemSkipped,
                None,
                &json!({"id": id, "reason": why}),
            )?);
            rejected_now += 1;
        }
        // What the cycle's notification covers: the items earlier pages of the cycle
        // appended (still pending), then this page's new ones.
        let mut covers: Vec<String> = Vec::new();
        if *last && notify.is_some() {
            covers = model.pending(name).map_err(st)?;
            covers.extend(new_items.iter().map(|i| i.id.clone()));
        }
        let first = covers.first().map(|id| {
            new_items
                .iter()
                .copied()
                .chain(first_of_cycle.iter())
                .find(|i| i.id == *id)
                .map_or(Value::Null, |i| i.item.clone())
        });
        let mut notified = false;
        let mut notify_blocked = false;
        if let (Some(n), Some(_)) = (notify, &first)
            && let Some(r) = &n.recipient
            // Suppressed at the head (the crisis block, section 14): the page's
            // notification is left out and the items go in without it.
            && deliveries::View::new(txn)?
                .recipient(Some(r))?
                .suppressed_at(now_us)
        {
            notify_blocked = true;
        }
        if let (Some(n), Some(first), false) = (notify, &first, notify_blocked) {
            // The same bound as a client's append (section 5): never exceeded.
            let mut state = deliveries::View::new(txn)?;
            let before = round.pending_added;
            if let crate::commands::admission::Admission::Full {
                pending,
                retry_after_s,
                ..
            } = crate::commands::admission::over_bound(
                txn,
                &mut state,
                &[(n.priority.as_str(), None)],
                round,
                max_pending,
            )? {
                let held = PageOutcome {
                    appended: 0,
                    skipped: 0,
                    rejected: 0,
                    notified: false,
                    notify_blocked: false,
                    held_back: Some((pending, retry_after_s)),
                    first_covered: None,
                };
                return Ok(Decided::new(held, Vec::new()));
            }
            let count = covers.len();
            // In the recipient's locale when `[notifications.templates.<locale>.sources.<name>]`
            // has the title (section 12), else as configured.
            let locale = match &n.recipient {
                Some(r) => state.recipient(Some(r))?.ext.locale,
                None => None,
            };
            let (one, many) = state
                .settings_at(u64::MAX)?
                .source_titles(name, locale.as_deref());
            let title = if count == 1 {
                render(one.as_deref().unwrap_or(&n.title_one), count, first)
            } else {
                render(many.as_deref().unwrap_or(&n.title_many), count, first)
            };
            let id = ids::source_notification(name, &covers[0]);
            let mut payload = json!({
                "priority": n.priority,
                "title": title,
                "source_name": name,
                "items": &covers[..count.min(NOTIFY_LISTED_ITEMS)],
                "count": count,
            });
            if let Some(r) = &n.recipient {
                payload["recipient"] = json!(r);
            }
            if let Some(g) = &n.group_key {
                payload["group_key"] = json!(g);
            }
            if let Some(b) = &n.body {
                payload["body"] = json!(render(b, count, first));
            }
            events.push(
                NewEvent::new(
                    Some(id.clone()),
                    Stream::Notifications,
                    id,
                    EventType::NotificationRequested.as_str(),
                    &payload,
                )
                .map_err(CommandError::invalid_event)?,
            );
            events.extend(crate::commands::admission::admitted_marker(
                round,
                &ids::source_notification(name, &covers[0]),
                round.pending_added - before,
            )?);
            notified = true;
        }
        let page = PageOutcome {
            appended: new_items.len(),
            skipped,
            rejected: rejected_now,
            notified,
            notify_blocked,
            held_back: None,
            first_covered,
        };
        Ok(Decided::new(page, events))
    }
}
