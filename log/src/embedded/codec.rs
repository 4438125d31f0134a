//! The stored envelope.
//!
//! Byte map of one value of the `events` table (the key is the `u64` seq):
//!
//! ```text
//! offset 0     u8      format version (currently 1)
//! offset 1..   postcard(StoredV1):
//!                varint-prefixed UTF-8  event_id
//!                varint-prefixed UTF-8  stream
//!                varint-prefixed UTF-8  subject
//!                varint-prefixed UTF-8  type
//!                zigzag varint i64      time, microseconds since the Unix epoch (UTC)
//!                varint-prefixed bytes  payload: compact JSON text of an object, keys sorted
//! ```
//!
//! A new format gets a new version byte and a new decoder arm; old versions stay readable
//! (`tests/fixtures/v1.bin` is read by a test).

use serde::{Deserialize, Serialize};

pub const FORMAT_V1: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredV1<'a> {
    #[serde(borrow)]
    pub event_id: &'a str,
    pub stream: &'a str,
    pub subject: &'a str,
    pub event_type: &'a str,
    pub time_us: i64,
    pub payload: &'a [u8],
}

pub(crate) fn encode(rec: &StoredV1<'_>, out: &mut Vec<u8>) {
    out.clear();
    out.push(FORMAT_V1);
    // Serialising borrowed strings and bytes into a Vec cannot fail.
    let body = postcard::to_extend(rec, std::mem::take(out)).unwrap_or_default();
    *out = body;
}

pub(crate) fn decode(bytes: &[u8]) -> Result<StoredV1<'_>, String> {
    match bytes.split_first() {
        Some((&FORMAT_V1, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
        Some((v, _)) => Err(format!("format version {v} is not known to this build")),
        None => Err("empty record".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StoredV1<'static> {
        StoredV1 {
            event_id: "evt-7f3a",
            stream: "task_events",
            subject: "task-1",
            event_type: "task.run_completed",
            time_us: 1_795_255_200_123_456,
            payload: br#"{"run_id":"r1"}"#,
        }
    }

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        encode(&sample(), &mut buf);
        assert_eq!(buf[0], FORMAT_V1);
        assert_eq!(decode(&buf).unwrap(), sample());
    }

    #[test]
    fn unknown_version_is_an_error() {
        assert!(decode(&[9, 1, 2]).unwrap_err().contains("version 9"));
        assert!(decode(&[]).is_err());
    }

    /// The v1 fixture was written by the first release of the format; it must stay readable.
    #[test]
    fn v1_fixture_stays_readable() {
        let fixture = include_bytes!("../../tests/fixtures/v1.bin");
        assert_eq!(decode(fixture).unwrap(), sample());
    }
}
