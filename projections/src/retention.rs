//! Retention (spec section 13): the payload of `retention.purged`, which every projection
//! folds by removing the rows it names. The retention command decides, at the head, what has
//! been done with for `window` (cross-model rules: a notification's deliveries, a task's
//! followers) and writes the ids into the events, so a rebuild removes exactly the same rows.

use serde::{Deserialize, Serialize};

/// Ids one `retention.purged` event names at most (its payload stays well under 64 KiB).
pub const IDS_PER_EVENT: usize = 200;

/// Payload of `retention.purged`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Purged {
    /// RFC 3339: rows whose last change (event time) is before this are past the window.
    pub before: String,
    /// The head the decision was taken at: a row changed after it is never purged by it.
    pub through_seq: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deliveries: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifications: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<String>,
    /// Run by hand (section 8): the token's name, `null` in open mode; absent on the
    /// periodic run.
    #[serde(
        skip_serializing_if = "Option::is_none",
        default,
        deserialize_with = "crate::by::present"
    )]
    pub by: Option<Option<String>>,
}

impl Purged {
    /// Read from an event's payload (a malformed one names nothing).
    pub fn parse(payload: &str) -> Purged {
        serde_json::from_str(payload).unwrap_or_default()
    }
}
