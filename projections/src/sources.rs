//! The sources read model (spec section 12): per source its watermark, whether an operator
//! paused it or a failure parked it (with the parking error), and how many items it appended;
//! and every item id it appended, so the command that appends a page leaves out the items
//! already in the log. The poller's transient state (polling, backing off, last poll times)
//! is kept in memory by the poller, not here: it is not in the log.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_log::{EventRef, StorageError};

use crate::framework::{Fold, Store};
use crate::names::{EventType, Stream, ids};

pub const NAME: &str = "sources";
pub(crate) const ROWS: &str = "rows";
pub(crate) const ITEMS: &str = "items";
/// `name ‖ 0 ‖ seq (BE) ‖ item id` of the items appended since the watermark last moved that
/// no notification has covered yet: the one notification of a poll cycle covers them all,
/// also after a crash between pages (section 12). Outside the digest (`put_index`): it is
/// derived from the items, the source's notifications and its watermark moves.
pub(crate) const PENDING: &str = "pending";
/// `name ‖ 0 ‖ item id` of each item `[sources.items] schema` refused (`source.item_skipped`),
/// so a replayed poll records it once.
pub(crate) const SKIPPED: &str = "skipped";

/// What the log says about one source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRow {
    pub name: String,
    /// The upstream's `next` of the last page whose items are durable (and acknowledged).
    pub watermark: Option<String>,
    pub paused: bool,
    pub parked: bool,
    /// Why it was parked.
    pub last_error: Option<String>,
    pub items_total: u64,
    /// Seq of the last event about this source.
    pub updated_seq: u64,
    /// What later releases added, at its default for a row that does not use it (so such a
    /// row keeps the bytes, and the digest, it had before: [`crate::trailing`]).
    #[serde(default, with = "crate::trailing")]
    pub ext: SourceExt,
}

/// The fields a source row gained after the golden release (see [`SourceRow::ext`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceExt {
    /// Items its `[sources.items] schema` refused (`source.item_skipped`), each counted once.
    pub items_skipped: u64,
}

/// `name ‖ 0 ‖ item id`.
pub fn item_key(name: &str, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 1 + id.len());
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(id.as_bytes());
    k
}

pub struct Sources;

fn text(p: &Value, field: &str) -> Option<String> {
    p.get(field).and_then(Value::as_str).map(str::to_owned)
}

impl Fold for Sources {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[ROWS, ITEMS, PENDING, SKIPPED];
    /// 2: `pending` (the items a cycle's notification is still to cover); 3: `skipped` and a
    /// row's `items_skipped`. An older model is rebuilt at the next open, which fills them.
    const VERSION: u32 = 3;

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        if Stream::parse(ev.stream) == Some(Stream::Notifications) {
            return covered(st, ev);
        }
        if Stream::parse(ev.stream) != Some(Stream::Sources) {
            return Ok(());
        }
        let Some(ty) = EventType::parse(ev.event_type) else {
            return Ok(());
        };
        let name = ev.subject;
        let mut row: SourceRow = st
            .get_val(ROWS, name.as_bytes())?
            .unwrap_or_else(|| SourceRow {
                name: name.to_owned(),
                ..SourceRow::default()
            });
        match ty {
            EventType::SourceItem => {
                let Some(id) = ids::source_item_id(name, ev.event_id) else {
                    return Ok(());
                };
                let key = item_key(name, id);
                if st.get(ITEMS, &key)?.is_some() {
                    return Ok(());
                }
                st.put(ITEMS, &key, &ev.seq.to_be_bytes())?;
                st.put_index(PENDING, &pending_key(name, ev.seq, id));
                row.items_total += 1;
            }
            EventType::SourceItemSkipped => {
                let p = ev.payload_value();
                let Some(id) = p.get("id").and_then(Value::as_str) else {
                    return Ok(());
                };
                let key = item_key(name, id);
                if st.get(SKIPPED, &key)?.is_some() {
                    return Ok(());
                }
                st.put(SKIPPED, &key, &ev.seq.to_be_bytes())?;
                row.ext.items_skipped += 1;
            }
            _ => {
                let p = ev.payload_value();
                match ty {
                    EventType::SourceWatermarkAdvanced | EventType::SourceReset => {
                        row.watermark = text(&p, "to");
                        // The cycle is over: what it appended is settled, notified or not.
                        let mut prefix = name.as_bytes().to_vec();
                        prefix.push(0);
                        for k in st.prefix_keys(PENDING, &prefix)? {
                            st.delete_index(PENDING, &k);
                        }
                    }
                    EventType::SourcePaused => row.paused = true,
                    EventType::SourceResumed => {
                        row.paused = false;
                        row.parked = false;
                        row.last_error = None;
                    }
                    EventType::SourceParked => {
                        row.parked = true;
                        row.last_error = text(&p, "error");
                    }
                    _ => return Ok(()),
                }
            }
        }
        row.updated_seq = ev.seq;
        st.put_val(ROWS, name.as_bytes(), &row)
    }
}

/// `name ‖ 0 ‖ seq ‖ id` of [`PENDING`].
fn pending_key(name: &str, seq: u64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 9 + id.len());
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// A source's notification (`src:<name>:notify:…`) covers every item of the source pending
/// when it was appended (it lists only the first of them when they are many): those are no
/// longer pending. Other notifications are not read.
fn covered(st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
    if EventType::parse(ev.event_type) != Some(EventType::NotificationRequested) {
        return Ok(());
    }
    // `src:<name>:notify:<id>`: a source name has no colon, so the id names the source and
    // the payload need not be parsed.
    let Some((name, _)) = ev
        .event_id
        .strip_prefix("src:")
        .and_then(|rest| rest.split_once(":notify:"))
    else {
        return Ok(());
    };
    let mut prefix = name.as_bytes().to_vec();
    prefix.push(0);
    for k in st.prefix_keys(PENDING, &prefix)? {
        let seq = crate::framework::be_u64(&k[prefix.len()..prefix.len() + 8]).unwrap_or(0);
        if seq < ev.seq {
            st.delete_index(PENDING, &k);
        }
    }
    Ok(())
}

crate::framework::txn_view! {
    /// The sources model inside the writer's transaction (commands decide on it at the head),
    /// its tables opened once for every lookup of a command.
    NAME
}

impl View<'_> {
    /// The source's row as recorded (`None`: nothing recorded about it yet).
    pub fn recorded(&self, name: &str) -> Result<Option<SourceRow>, StorageError> {
        self.t.get_val(ROWS, name.as_bytes())
    }

    /// The source's row, or its state before anything was recorded about it.
    pub fn row(&self, name: &str) -> Result<SourceRow, StorageError> {
        Ok(self
            .t
            .get_val(ROWS, name.as_bytes())?
            .unwrap_or_else(|| SourceRow {
                name: name.to_owned(),
                ..SourceRow::default()
            }))
    }

    /// The items appended since the watermark last moved that no notification covers yet,
    /// in the order they were appended.
    pub fn pending(&self, name: &str) -> Result<Vec<String>, StorageError> {
        let mut prefix = name.as_bytes().to_vec();
        prefix.push(0);
        let mut out = Vec::new();
        for row in self.t.table(PENDING)?.range(prefix.as_slice()..)? {
            let (k, _) = row.map_err(StorageError::of)?;
            let k = k.value();
            if !k.starts_with(&prefix) {
                break;
            }
            out.push(String::from_utf8_lossy(&k[prefix.len() + 8..]).into_owned());
        }
        Ok(out)
    }

    /// Whether item `id` of the source is pending (appended since the watermark last moved,
    /// not covered by a notification yet).
    pub fn is_pending(&self, name: &str, id: &str) -> Result<bool, StorageError> {
        let Some(seq) = self
            .t
            .get(ITEMS, &item_key(name, id))?
            .and_then(|b| crate::framework::be_u64(&b))
        else {
            return Ok(false);
        };
        Ok(self.t.get(PENDING, &pending_key(name, seq, id))?.is_some())
    }

    /// Whether the source has appended item `id`.
    pub fn has_item(&self, name: &str, id: &str) -> Result<bool, StorageError> {
        Ok(self.t.get(ITEMS, &item_key(name, id))?.is_some())
    }

    /// Whether item `id` of source `name` was skipped (its schema refused it) already.
    pub fn has_skipped(&self, name: &str, id: &str) -> Result<bool, StorageError> {
        Ok(self.t.get(SKIPPED, &item_key(name, id))?.is_some())
    }
}
