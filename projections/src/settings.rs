//! The notification settings in force: the payload of the last `settings.updated`.

use crate::names::{EventType, Stream};
use tidemark_log::EventRef;
use tidemark_log::StorageError;

use crate::framework::{Fold, Store};

pub const NAME: &str = "settings";
pub(crate) const CURRENT: &str = "current";
pub(crate) const KEY: &[u8] = b"notifications";

pub struct Settings;

impl Fold for Settings {
    const NAME: &'static str = NAME;
    const TABLES: &'static [&'static str] = &[CURRENT];

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        if Stream::parse(ev.stream) == Some(Stream::Settings)
            && EventType::parse(ev.event_type) == Some(EventType::SettingsUpdated)
        {
            st.put(CURRENT, KEY, ev.payload.as_bytes())?;
        }
        Ok(())
    }
}

crate::framework::txn_view! {
    /// The settings model inside a models transaction (a command decides on it at the head).
    NAME
}

impl View<'_> {
    /// The notification settings in force (the payload of the last `settings.updated`).
    pub fn current(&self) -> Result<Option<serde_json::Value>, StorageError> {
        self.t
            .get(CURRENT, KEY)?
            .map(|b| serde_json::from_slice(&b).map_err(StorageError::of))
            .transpose()
    }

    /// The names of the routes the configuration file configures, as the last
    /// `settings.updated` recorded them (none before the first).
    pub fn file_routes(&self) -> Result<Vec<String>, StorageError> {
        let Some(v) = self.current()? else {
            return Ok(Vec::new());
        };
        Ok(v.get("routes")
            .and_then(serde_json::Value::as_object)
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default())
    }
}
