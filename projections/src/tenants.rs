//! The tenants model (spec section 20): the deployment's directory of tenants, each with the
//! shard it lives in, as of its `tenant.created` (stream `tenants`, subject the tenant's name);
//! `tenant.removed` keeps the row, marked removed, so a name is never silently reused and its
//! placement stays known; `tenant.moved` records the shard it lives in after a move (spec
//! section 20). Only the default tenant's events make the directory: a tenant
//! cannot create another.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_log::{EventRef, StorageError};

use crate::framework::{Fold, Store};
use crate::names::{EventType, Stream};

pub const NAME: &str = "tenants";
pub(crate) const ROWS: &str = "rows";

/// One tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRow {
    pub name: String,
    /// The shard its events and models live in (fixed at creation; a move records a new one).
    pub shard: u32,
    /// Why it was created, and who created it.
    pub reason: String,
    pub by: Option<String>,
    pub created_at_us: i64,
    pub created_seq: u64,
    /// Set once it is removed.
    pub removed: Option<Removed>,
}

/// A tenant's removal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    pub reason: String,
    pub by: Option<String>,
    pub at_us: i64,
    pub seq: u64,
}

impl TenantRow {
    /// Whether it is a tenant now (created and not removed).
    pub fn is_live(&self) -> bool {
        self.removed.is_none()
    }
}

pub struct Tenants;

impl Fold for Tenants {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[ROWS];

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        if ev.tenant.is_some() || Stream::parse(ev.stream) != Some(Stream::Tenants) {
            return Ok(());
        }
        let key = ev.subject.as_bytes();
        let p: Value = serde_json::from_str(ev.payload).unwrap_or(Value::Null);
        let text = |f: &str| p.get(f).and_then(Value::as_str).map(str::to_owned);
        match EventType::parse(ev.event_type) {
            Some(EventType::TenantCreated) => {
                let row = TenantRow {
                    name: ev.subject.to_owned(),
                    shard: p
                        .get("shard")
                        .and_then(Value::as_u64)
                        .and_then(|s| u32::try_from(s).ok())
                        .unwrap_or(0),
                    reason: text("reason").unwrap_or_default(),
                    by: text("by"),
                    created_at_us: ev.time_us,
                    created_seq: ev.seq,
                    removed: None,
                };
                st.put_val(ROWS, key, &row)
            }
            Some(EventType::TenantRemoved) => {
                let Some(mut row) = st.get_val::<TenantRow>(ROWS, key)? else {
                    return Ok(());
                };
                row.removed = Some(Removed {
                    reason: text("reason").unwrap_or_default(),
                    by: text("by"),
                    at_us: ev.time_us,
                    seq: ev.seq,
                });
                st.put_val(ROWS, key, &row)
            }
            Some(EventType::TenantMoved) => {
                let Some(mut row) = st.get_val::<TenantRow>(ROWS, key)? else {
                    return Ok(());
                };
                if let Some(to) = p
                    .get("to")
                    .and_then(Value::as_u64)
                    .and_then(|s| u32::try_from(s).ok())
                {
                    row.shard = to;
                }
                st.put_val(ROWS, key, &row)
            }
            _ => Ok(()),
        }
    }
}

crate::framework::txn_view! {
    /// The tenants model inside a models transaction (the default tenant's: the directory).
    NAME
}

impl View<'_> {
    /// Tenant `name` (removed or not).
    pub fn row(&self, name: &str) -> Result<Option<TenantRow>, StorageError> {
        self.t.get_val(ROWS, name.as_bytes())
    }

    /// Every tenant ever created, by name.
    pub fn all(&self) -> Result<Vec<TenantRow>, StorageError> {
        self.t.values(ROWS)
    }
}
