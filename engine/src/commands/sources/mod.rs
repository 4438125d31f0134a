//! The source family (spec section 12): the append of a polled page (decided at the head: the
//! items already in the log are left out, whatever their content now, and the optional
//! notification is about the new ones only), the watermark's compare-and-swap, and the operator
//! and poller state changes (pause, resume, park, reset).
//!
//! One command per file; what several share (the items, a notification's plan, the row
//! checks, the title's rendering) is here.

mod advance;
mod page;
mod park;
mod pause;
mod reset;
mod resume;

pub use advance::Advance;
pub use page::Page;
pub use park::Park;
pub use pause::Pause;
pub use reset::Reset;
pub use resume::Resume;

use crate::error::{CommandError, Rejection};
use serde_json::{Value, json};
use tidemark_log::NewEvent;
use tidemark_projections::deliveries;
use tidemark_projections::names::{EventType, Stream, ids};
use tidemark_projections::sources;
use tidemark_projections::sources::SourceRow;

use super::{Command, DecideResult, Decided, Round};
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
