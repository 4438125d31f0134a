//! The free space where the log is kept (I10), and how near the reserve it is.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use super::storage;
use crate::AppendError;

/// How near the log is to refusing appends for want of space (spec section 17: operators are
/// told when it comes near, and when it was reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpaceLevel {
    /// More than twice the reserve is free.
    #[default]
    Ok,
    /// Less than twice the reserve is free: appends are still taken.
    Low,
    /// Less than the reserve is free, or the disk is full: appends are refused.
    Reserve,
}

/// The level last seen, with the free bytes and the reserve at the time it was entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpaceState {
    pub level: SpaceLevel,
    pub available: u64,
    pub min_free: u64,
}

/// Where the log checks its free space.
#[derive(Debug, Clone)]
pub(crate) struct Space {
    pub storage: storage::Storage,
    pub path: PathBuf,
    pub min_free: u64,
    /// The level as the checks meet it; changed only when the level changes, so a watcher is
    /// woken by a crossing, never by an ordinary append.
    pub state: Arc<watch::Sender<SpaceState>>,
}

impl Space {
    pub fn new(storage: storage::Storage, path: PathBuf, min_free: u64) -> Space {
        Space {
            storage,
            path,
            min_free,
            state: Arc::new(watch::Sender::new(SpaceState {
                min_free,
                ..SpaceState::default()
            })),
        }
    }

    /// `Err((available, min_free))` when less than `min_free` is free. Records the level met.
    pub fn check(&self) -> Result<(), (u64, u64)> {
        let available = self.storage.available(&self.path);
        if let Some(a) = available {
            self.record(self.level_of(a), a);
        }
        match available {
            Some(a) if a < self.min_free => Err((a, self.min_free)),
            _ => Ok(()),
        }
    }

    /// The level `available` free bytes are at. Leaving `Low` takes a quarter of the reserve
    /// more than entering it, so free space that hovers at the line does not flap.
    fn level_of(&self, available: u64) -> SpaceLevel {
        let low = self.min_free.saturating_mul(2);
        let was = self.state.borrow().level;
        if available < self.min_free {
            SpaceLevel::Reserve
        } else if available < low
            || (was != SpaceLevel::Ok && available < low.saturating_add(self.min_free / 4))
        {
            SpaceLevel::Low
        } else {
            SpaceLevel::Ok
        }
    }

    /// Record that the log is at `level` (a full disk is at the reserve whatever the count).
    pub fn record(&self, level: SpaceLevel, available: u64) {
        let min_free = self.min_free;
        self.state.send_if_modified(|s| {
            if s.level == level {
                return false;
            }
            *s = SpaceState {
                level,
                available,
                min_free,
            };
            true
        });
    }

    /// A receiver of the level's changes.
    pub fn watch(&self) -> watch::Receiver<SpaceState> {
        self.state.subscribe()
    }

    /// The refusal of a write while the disk is full.
    pub fn refusal(&self) -> AppendError {
        AppendError::InsufficientStorage {
            available: self.storage.available(&self.path).unwrap_or(0),
            min_free: self.min_free,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_crosses_at_the_reserve_and_twice_it_and_leaves_low_with_a_margin() {
        let s = Space::new(storage::Storage::File, PathBuf::from("x"), 100);
        let mut rx = s.watch();
        let at = |a| {
            s.record(s.level_of(a), a);
            s.state.borrow().level
        };
        assert_eq!(at(500), SpaceLevel::Ok);
        assert!(!rx.has_changed().unwrap(), "no crossing, no wake-up");
        assert_eq!(at(199), SpaceLevel::Low);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert_eq!(at(210), SpaceLevel::Low, "within the margin");
        assert!(!rx.has_changed().unwrap());
        assert_eq!(at(99), SpaceLevel::Reserve);
        assert_eq!(rx.borrow_and_update().available, 99);
        assert_eq!(at(150), SpaceLevel::Low);
        assert_eq!(at(225), SpaceLevel::Ok);
        let none = Space::new(storage::Storage::File, PathBuf::from("x"), 0);
        none.record(none.level_of(0), 0);
        assert_eq!(
            none.state.borrow().level,
            SpaceLevel::Ok,
            "no reserve, no level"
        );
    }
}
