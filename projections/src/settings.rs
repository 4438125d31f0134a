//! The notification settings in force: the payload of the last `settings.updated`.

use crate::names::{EventType, Stream};
use tidemark_log::EventRef;
use tidemark_log::StorageError;

use crate::framework::{Projection, Store};

pub const NAME: &str = "settings";
pub(crate) const CURRENT: &str = "current";
pub(crate) const KEY: &[u8] = b"notifications";

pub struct Settings;

impl Projection for Settings {
    fn name(&self) -> &'static str {
        NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        &[CURRENT]
    }

    fn apply(&self, st: &mut Store<'_>, ev: &EventRef<'_>) -> Result<(), StorageError> {
        if ev.stream == Stream::Settings && ev.event_type == EventType::SettingsUpdated {
            st.put(CURRENT, KEY, ev.payload.as_bytes())?;
        }
        Ok(())
    }
}
