//! The routes model (spec section 4, "Routes managed at runtime"): the routes created and
//! changed through `PUT /v1/routes/{name}` as of their last `route.updated` (stream `routes`,
//! subject the route's name); `route.deleted` removes one. A row keeps the route object as it
//! was recorded, its webhook `url` and `secret` (or their `env:` references) among it: the
//! dispatcher of every node reads them here; nothing serves them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_log::{EventRef, StorageError};

use crate::framework::{Fold, Store};
use crate::names::{EventType, Stream};
use crate::routing::ApiRoute;

pub const NAME: &str = "routes";
pub(crate) const ROWS: &str = "rows";

/// One route managed through the API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteRow {
    pub name: String,
    /// The route object as recorded (JSON): the keys of `[notifications.routes.<name>]`, its
    /// `url` and `secret` among them, and `priorities`.
    pub route: String,
    /// Why it last changed, and who changed it.
    pub reason: String,
    pub by: Option<String>,
    pub updated_at_us: i64,
    pub updated_seq: u64,
    /// The secret the route had before its last change (as recorded: the secret or its
    /// `env:` reference), which keeps signing beside the new one until `previous_until_us`
    /// (the change's time plus the route's `rotation_overlap`).
    pub previous_secret: Option<String>,
    pub previous_until_us: Option<i64>,
}

impl RouteRow {
    /// The previous secret while it still signs at `now_us`.
    pub fn previous_secret_at(&self, now_us: i64) -> Option<&str> {
        self.previous_until_us
            .filter(|until| now_us < *until)
            .and(self.previous_secret.as_deref())
    }

    /// The route it records (`None` only for a row no version of the server wrote).
    pub fn spec(&self) -> Option<ApiRoute> {
        let v: Value = serde_json::from_str(&self.route).ok()?;
        ApiRoute::from_json(&v).ok()
    }
}

/// The payload of `route.updated`: the route object, the reason and who.
pub fn updated_payload(route: &ApiRoute, reason: &str, by: Option<&str>) -> Value {
    serde_json::json!({"route": route.recorded(), "reason": reason, "by": by})
}

pub struct Routes;

impl Fold for Routes {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[ROWS];
    /// 2: a removed secret keeps no previous one signing.
    const VERSION: u32 = 2;

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        if Stream::parse(ev.stream) != Some(Stream::Routes) {
            return Ok(());
        }
        let key = ev.subject.as_bytes();
        match EventType::parse(ev.event_type) {
            Some(EventType::RouteUpdated) => {
                let p: Value = serde_json::from_str(ev.payload).unwrap_or(Value::Null);
                let text = |f: &str| p.get(f).and_then(Value::as_str).map(str::to_owned);
                let mut row = RouteRow {
                    name: ev.subject.to_owned(),
                    route: p.get("route").map(Value::to_string).unwrap_or_default(),
                    reason: text("reason").unwrap_or_default(),
                    by: text("by"),
                    updated_at_us: ev.time_us,
                    updated_seq: ev.seq,
                    previous_secret: None,
                    previous_until_us: None,
                };
                // A changed secret: the old one keeps signing for the overlap (from the
                // change's time, so a replay keeps the same window); an unchanged one keeps
                // the window of the change before; a removed one (`"secret": null`) signs no
                // more: removing signing is not a rotation.
                let before: Option<RouteRow> = st.get_val(ROWS, key)?;
                let old = before.as_ref().and_then(RouteRow::spec);
                let new = row.spec();
                let (old_secret, new_secret) = (
                    old.as_ref().and_then(|r| r.config.secret.clone()),
                    new.as_ref().and_then(|r| r.config.secret.clone()),
                );
                if old_secret.is_some() && new_secret.is_some() && old_secret != new_secret {
                    let overlap = new.as_ref().map_or(
                        ApiRoute::DEFAULT_ROTATION_OVERLAP_MS,
                        ApiRoute::rotation_overlap_ms,
                    );
                    row.previous_secret = old_secret;
                    row.previous_until_us = Some(ev.time_us.saturating_add(
                        i64::try_from(overlap.saturating_mul(1_000)).unwrap_or(i64::MAX),
                    ));
                } else if let Some(b) = before.filter(|_| old_secret == new_secret) {
                    row.previous_secret = b.previous_secret;
                    row.previous_until_us = b.previous_until_us;
                }
                st.put_val(ROWS, key, &row)
            }
            Some(EventType::RouteDeleted) => st.delete(ROWS, key),
            _ => Ok(()),
        }
    }
}

crate::framework::txn_view! {
    /// The routes model inside a models transaction (a command decides on it at the head).
    NAME
}

impl View<'_> {
    /// Route `name`.
    pub fn row(&self, name: &str) -> Result<Option<RouteRow>, StorageError> {
        self.t.get_val(ROWS, name.as_bytes())
    }

    /// Every route managed through the API, by name.
    pub fn all(&self) -> Result<Vec<RouteRow>, StorageError> {
        self.t.values(ROWS)
    }
}
