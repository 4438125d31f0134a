//! Why a writer stopped for good (spec I10), kept where every caller sees it. The log's
//! group commit and indexer and the engine's decider share this one type (after fjall's
//! `poison.rs`): set once, by the first failure or panic, which is the cause (what fails
//! after it is a consequence); read without a lock on every append and command.

use std::sync::OnceLock;

use crate::StorageError;

/// A writer's poison: unset while it is healthy.
#[derive(Debug, Default)]
pub struct Poison(OnceLock<StorageError>);

impl Poison {
    /// Poison with `why`; true if this set it (a later reason does not replace the first).
    pub fn set(&self, why: StorageError) -> bool {
        self.0.set(why).is_ok()
    }

    /// Why it is poisoned, if it is.
    pub fn get(&self) -> Option<&StorageError> {
        self.0.get()
    }

    pub fn is_set(&self) -> bool {
        self.0.get().is_some()
    }

    /// The reason a panic of `who` poisons with: its message (`&str` or `String` payloads),
    /// else "a panic".
    pub fn panicked(who: &str, payload: &(dyn std::any::Any + Send)) -> StorageError {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        StorageError::msg(format!("{who} panicked: {what}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_stays() {
        let p = Poison::default();
        assert!(!p.is_set());
        assert!(p.get().is_none());
        assert!(p.set(StorageError::msg("the sync failed")));
        assert!(!p.set(StorageError::msg("a later failure")));
        assert!(p.is_set());
        assert_eq!(
            p.get().map(ToString::to_string).as_deref(),
            Some("the sync failed")
        );
    }

    #[test]
    fn a_panics_message_is_its_reason() {
        let r = std::panic::catch_unwind(|| panic!("index {} out of range", 3)).unwrap_err();
        assert_eq!(
            Poison::panicked("the indexer", r.as_ref()).to_string(),
            "the indexer panicked: index 3 out of range"
        );
        let r = std::panic::catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(
            Poison::panicked("the decider", r.as_ref()).to_string(),
            "the decider panicked: static"
        );
        let r = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(
            Poison::panicked("x", r.as_ref()).to_string(),
            "x panicked: a panic"
        );
    }
}
