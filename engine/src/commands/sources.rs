//! The source family (spec section 12): the append of a polled page (decided at the head: the
//! items already in the log are left out, whatever their content now, and the optional
//! notification is about the new ones only), the watermark's compare-and-swap, and the operator
//! and poller state changes (pause, resume, park, reset).

use crate::error::{CommandError, Rejection};
use serde_json::{Value, json};
use tidemark_log::NewEvent;
use tidemark_projections::deliveries;
use tidemark_projections::names::{EventType, Stream, ids};
use tidemark_projections::sources;
use tidemark_projections::sources::SourceRow;

use super::sealed::Sealed;
use super::{Command, Decided, Round};
use tidemark_projections::ModelsTxn;

/// One item of a polled page: its upstream id and the item as the source returned it.
#[derive(Debug, Clone)]
pub struct SourceItem {
    pub id: String,
    pub item: Value,
}

/// `[sources.notify]`: one `notification.requested` per poll cycle with new items (the
/// config section itself: the poller passes it on as it is).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyPlan {
    pub priority: String,
    pub recipient: Option<String>,
    pub group_key: Option<String>,
    /// `{/json/pointer}` placeholders read from the (first) new item.
    pub title_one: String,
    /// `{count}` is the number of changes (new items) of the cycle; pointers read the first.
    pub title_many: String,
    pub body: Option<String>,
}

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

/// Move the watermark from `from` (compare-and-swap) to `to`; answers the source after it.
#[derive(Debug, Clone)]
pub struct Advance {
    pub name: String,
    pub from: Option<String>,
    pub to: String,
}

/// Pause polling; answers the source after it.
#[derive(Debug, Clone)]
pub struct Pause {
    pub name: String,
    pub by: Option<String>,
    pub reason: Option<String>,
}

/// Resume a paused or parked source; answers the source after it.
#[derive(Debug, Clone)]
pub struct Resume {
    pub name: String,
    pub by: Option<String>,
}

/// Park a source after a permanent error; answers the source after it.
#[derive(Debug, Clone)]
pub struct Park {
    pub name: String,
    pub error: String,
}

/// The operator's way back (or anywhere): needs a reason. Answers the source after it.
#[derive(Debug, Clone)]
pub struct Reset {
    pub name: String,
    pub to: Option<String>,
    pub reason: String,
    pub by: Option<String>,
}

/// What a page command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageOutcome {
    pub appended: usize,
    /// Items already in the log, left out.
    pub skipped: usize,
    /// Items the schema refused that this page recorded (`source.item_skipped`).
    pub rejected: usize,
    pub notified: bool,
    /// The notification was left out: its recipient is suppressed (the items went in).
    pub notify_blocked: bool,
    /// Held back by backpressure, nothing appended: `(pending, retry_after_s)`, the seconds
    /// until the outbox has drained enough at the rate it completed deliveries lately.
    pub held_back: Option<(u64, u64)>,
    /// The first item of the page the cycle's notification will cover (new, or appended by
    /// an earlier try of the cycle and still pending): the poller keeps the cycle's first for
    /// the title's placeholders.
    pub first_covered: Option<String>,
}

/// A cycle's notification lists at most this many item ids (its `count` is all of them): the
/// payload stays far below the 64 KiB bound whatever the page size and page count.
pub const NOTIFY_LISTED_ITEMS: usize = 100;

fn source_event(
    name: &str,
    ty: EventType,
    event_id: Option<String>,
    payload: &Value,
) -> Result<NewEvent, CommandError> {
    NewEvent::new(event_id, Stream::Sources, name, ty.as_str(), payload)
        .map_err(|e| CommandError::rejected(Rejection::InvalidItem, e.to_string()))
}

fn not_active(row: &SourceRow) -> Option<CommandError> {
    (row.paused || row.parked).then(|| {
        CommandError::rejected(
            Rejection::SourceNotActive,
            format!(
                "source {:?} is {}",
                row.name,
                if row.parked { "parked" } else { "paused" }
            ),
        )
    })
}

/// `template` with `{count}` and `{/json/pointer}` (read from `item`; strings as they are,
/// other values as JSON, absent as empty) replaced.
pub fn render(template: &str, count: usize, item: &Value) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            return out;
        };
        let key = &after[..close];
        if key == "count" {
            out.push_str(&count.to_string());
        } else if key.starts_with('/') {
            match item.pointer(key) {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Null) | None => {}
                Some(v) => out.push_str(&v.to_string()),
            }
        } else {
            out.push('{');
            out.push_str(key);
            out.push('}');
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

impl Sealed for Page {}
impl Command for Page {
    type Answer = PageOutcome;

    fn name(&self) -> &'static str {
        "source.page"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        round: &mut Round<'_>,
    ) -> Result<Decided<PageOutcome>, CommandError> {
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
        let mut model = sources::View::new(txn).map_err(st)?;
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

impl Sealed for Advance {}
impl Command for Advance {
    type Answer = SourceRow;

    fn name(&self) -> &'static str {
        "source.advance"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        _: &mut Round<'_>,
    ) -> Result<Decided<SourceRow>, CommandError> {
        let Advance { name, from, to } = self;
        let row = model_row(txn, name)?;
        if row.watermark != *from {
            return Err(CommandError::rejected(
                Rejection::WatermarkConflict,
                format!(
                    "the watermark of {name:?} is {:?}, not {from:?}",
                    row.watermark
                ),
            ));
        }
        if from.as_deref() == Some(to.as_str()) {
            return Ok(Decided::new(row, Vec::new()));
        }
        if let Some(f) = from
            && to.as_str() < f.as_str()
        {
            return Err(CommandError::rejected(
                Rejection::WatermarkBackwards,
                format!("next {to:?} is before the watermark {f:?}"),
            ));
        }
        let ev = source_event(
            name,
            EventType::SourceWatermarkAdvanced,
            None,
            &json!({"from": from, "to": to}),
        )?;
        let mut after = row;
        after.watermark = Some(to.clone());
        Ok(Decided::new(after, vec![ev]))
    }
}

impl Sealed for Pause {}
impl Command for Pause {
    type Answer = SourceRow;

    fn name(&self) -> &'static str {
        "source.pause"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        _: &mut Round<'_>,
    ) -> Result<Decided<SourceRow>, CommandError> {
        let Pause { name, by, reason } = self;
        let mut row = model_row(txn, name)?;
        if row.paused {
            return Ok(Decided::new(row, Vec::new()));
        }
        let ev = source_event(
            name,
            EventType::SourcePaused,
            None,
            &json!({"by": by, "reason": reason}),
        )?;
        row.paused = true;
        Ok(Decided::new(row, vec![ev]))
    }
}

impl Sealed for Resume {}
impl Command for Resume {
    type Answer = SourceRow;

    fn name(&self) -> &'static str {
        "source.resume"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        _: &mut Round<'_>,
    ) -> Result<Decided<SourceRow>, CommandError> {
        let Resume { name, by } = self;
        let mut row = model_row(txn, name)?;
        if !row.paused && !row.parked {
            return Ok(Decided::new(row, Vec::new()));
        }
        let ev = source_event(name, EventType::SourceResumed, None, &json!({"by": by}))?;
        row.paused = false;
        row.parked = false;
        row.last_error = None;
        Ok(Decided::new(row, vec![ev]))
    }
}

impl Sealed for Park {}
impl Command for Park {
    type Answer = SourceRow;

    fn name(&self) -> &'static str {
        "source.park"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        _: &mut Round<'_>,
    ) -> Result<Decided<SourceRow>, CommandError> {
        let Park { name, error } = self;
        let mut row = model_row(txn, name)?;
        let ev = source_event(
            name,
            EventType::SourceParked,
            None,
            &json!({"error": error}),
        )?;
        row.parked = true;
        row.last_error = Some(error.clone());
        Ok(Decided::new(row, vec![ev]))
    }
}

impl Sealed for Reset {}
impl Command for Reset {
    type Answer = SourceRow;

    fn name(&self) -> &'static str {
        "source.reset"
    }

    fn decide(
        &self,
        txn: &ModelsTxn,
        _: &mut Round<'_>,
    ) -> Result<Decided<SourceRow>, CommandError> {
        let Reset {
            name,
            to,
            reason,
            by,
        } = self;
        if reason.trim().is_empty() {
            return Err(CommandError::rejected(
                Rejection::ReasonRequired,
                "a reset needs a reason",
            ));
        }
        let mut row = model_row(txn, name)?;
        let ev = source_event(
            name,
            EventType::SourceReset,
            None,
            &json!({"from": row.watermark, "to": to, "reason": reason, "by": by}),
        )?;
        row.watermark = to.clone();
        Ok(Decided::new(row, vec![ev]))
    }
}

/// Source `name` as the models have it.
fn model_row(txn: &ModelsTxn, name: &str) -> Result<SourceRow, CommandError> {
    Ok(sources::View::new(txn)?.row(name)?)
}

#[cfg(test)]
mod tests {
    use super::render;
    use serde_json::json;

    #[test]
    fn templates() {
        let item = json!({"planSummary": {"name": "Garden", "n": 3}});
        assert_eq!(
            render("{/planSummary/name} has been updated", 1, &item),
            "Garden has been updated"
        );
        assert_eq!(render("You have {count} new", 4, &item), "You have 4 new");
        assert_eq!(
            render("{/missing}|{/planSummary/n}|{other}|{", 1, &item),
            "|3|{other}|{"
        );
    }
}
