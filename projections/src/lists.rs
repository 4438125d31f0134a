//! The lists model (spec section 17): notification lists, each its members as of its last
//! `list.updated` (stream `lists`, subject the list's name); `list.deleted` removes it. A list
//! is resolved when a delivery is attempted, so a change reaches deliveries routed before it.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_log::{EventRef, StorageError};

use crate::framework::{Fold, Store};
use crate::names::{EventType, Stream};

pub const NAME: &str = "lists";
pub(crate) const ROWS: &str = "rows";

/// One list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRow {
    pub name: String,
    pub members: Vec<String>,
    /// Why it last changed, and who changed it.
    pub reason: String,
    pub by: Option<String>,
    pub updated_at_us: i64,
    pub updated_seq: u64,
}

pub struct Lists;

impl Fold for Lists {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[ROWS];

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        if Stream::parse(ev.stream) != Some(Stream::Lists) {
            return Ok(());
        }
        let key = ev.subject.as_bytes();
        match EventType::parse(ev.event_type) {
            Some(EventType::ListUpdated) => {
                let p: Value = serde_json::from_str(ev.payload).unwrap_or(Value::Null);
                let text = |f: &str| p.get(f).and_then(Value::as_str).map(str::to_owned);
                let row = ListRow {
                    name: ev.subject.to_owned(),
                    members: p
                        .get("members")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|m| m.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default(),
                    reason: text("reason").unwrap_or_default(),
                    by: text("by"),
                    updated_at_us: ev.time_us,
                    updated_seq: ev.seq,
                };
                st.put_val(ROWS, key, &row)
            }
            Some(EventType::ListDeleted) => st.delete(ROWS, key),
            _ => Ok(()),
        }
    }
}

crate::framework::txn_view! {
    /// The lists model inside a models transaction (a command decides on it at the head).
    NAME
}

impl View<'_> {
    /// List `name`.
    pub fn row(&self, name: &str) -> Result<Option<ListRow>, StorageError> {
        self.t.get_val(ROWS, name.as_bytes())
    }

    /// Every list, by name.
    pub fn all(&self) -> Result<Vec<ListRow>, StorageError> {
        self.t.values(ROWS)
    }
}
