//! Typed ids: what a string names travels with it, so a delivery id cannot be passed where a
//! task id is wanted, from the API's path extractor through the engine's commands to the read
//! models' queries and rows.
//!
//! Each id is its text and nothing else: serde sees it as a string (`#[serde(transparent)]`),
//! so the stored rows' bytes, their digests and the JSON served are the same as when the fields
//! were `String`. An id from outside is made by `parse`, which checks it (1–128 printable
//! characters: the API's `PathId`); `new` takes one tidemark derived or read from its own log.
//! An id is not a `&str`: it is read as text only by asking (`as_str`), so it cannot be passed
//! where another kind of id, or any string, is wanted.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What an id names, for messages (`a delivery id is …`, `no delivery "d-1"`).
pub trait Kind {
    const WHAT: &'static str;
}

/// The most characters an id from outside may have.
pub const MAX_CHARS: usize = 128;

/// An id from outside that is not one: empty, longer than [`MAX_CHARS`], or with a control
/// character.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a {what} id is 1–128 printable characters")]
pub struct IdError {
    pub what: &'static str,
}

macro_rules! ids {
    ($($(#[$doc:meta])* $name:ident = $what:literal;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// An id tidemark derived, or read from its own log (checked when it entered).
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// An id from outside, checked: 1–[`MAX_CHARS`] characters, none a control one.
            pub fn parse(id: impl Into<String>) -> Result<Self, IdError> {
                let id = id.into();
                if id.is_empty()
                    || id.chars().count() > MAX_CHARS
                    || id.chars().any(char::is_control)
                {
                    return Err(IdError { what: $what });
                }
                Ok(Self(id))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                Self(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                Self(id.to_owned())
            }
        }

        impl Kind for $name {
            const WHAT: &'static str = $what;
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    )*};
}

ids! {
    /// A task's id (the subject of its `task_events`).
    TaskId = "task";
    /// A delivery's id.
    DeliveryId = "delivery";
    /// A notification's id (its event id).
    NotificationId = "notification";
    /// A bridge subscription's id.
    SubscriptionId = "subscription";
    /// A bridge's id.
    BridgeId = "bridge";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_stored_and_served_as_its_text() {
        let id = DeliveryId::new("d-1");
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""d-1""#);
        assert_eq!(
            postcard::to_allocvec(&id).unwrap(),
            postcard::to_allocvec(&"d-1".to_string()).unwrap()
        );
        let back: DeliveryId = serde_json::from_str(r#""d-1""#).unwrap();
        assert_eq!(back, id);
        assert_eq!(format!("{id} {id:?}"), r#"d-1 "d-1""#);
    }

    #[test]
    fn an_id_from_outside_is_checked_when_made() {
        assert_eq!(TaskId::parse("t-1").unwrap().as_str(), "t-1");
        assert_eq!(
            TaskId::parse("é".repeat(128))
                .unwrap()
                .as_str()
                .chars()
                .count(),
            128
        );
        for bad in [
            String::new(),
            "x".repeat(129),
            "a\nb".to_owned(),
            "a\u{7f}".to_owned(),
        ] {
            let e = DeliveryId::parse(bad.clone()).unwrap_err();
            assert_eq!(
                e.to_string(),
                "a delivery id is 1–128 printable characters",
                "{bad:?}"
            );
        }
    }
}
