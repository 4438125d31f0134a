//! The stored envelope.
//!
//! Byte map of one value of the `events` table (the key is the `u64` seq):
//!
//! ```text
//! offset 0     u8      format version: 1 (an event of the default tenant), 2 (of another)
//! offset 1..   postcard(StoredV1):                 postcard(StoredV2):
//!                                                    varint-prefixed UTF-8  tenant
//!                varint-prefixed UTF-8  event_id   the fields of StoredV1, in order
//!                varint-prefixed UTF-8  stream
//!                varint-prefixed UTF-8  subject
//!                varint-prefixed UTF-8  type
//!                zigzag varint i64      time, microseconds since the Unix epoch (UTC)
//!                varint-prefixed bytes  payload: compact JSON text of an object, keys sorted
//! ```
//!
//! A new format gets a new version byte and a new decoder arm; old versions stay readable
//! (`tests/fixtures/v1.bin` is read by a test). The default tenant's events are still written
//! as version 1, byte for byte what a log written before tenants holds (spec section 20).

use serde::{Deserialize, Serialize};

pub const FORMAT_V1: u8 = 1;
pub const FORMAT_V2: u8 = 2;

/// A stored event, decoded from either version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored<'a> {
    /// `None`: the default tenant (version 1).
    pub tenant: Option<&'a str>,
    pub event_id: &'a str,
    pub stream: &'a str,
    pub subject: &'a str,
    pub event_type: &'a str,
    pub time_us: i64,
    pub payload: &'a [u8],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredV1<'a> {
    #[serde(borrow)]
    event_id: &'a str,
    stream: &'a str,
    subject: &'a str,
    event_type: &'a str,
    time_us: i64,
    payload: &'a [u8],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredV2<'a> {
    #[serde(borrow)]
    tenant: &'a str,
    #[serde(borrow)]
    v1: StoredV1<'a>,
}

pub(crate) fn encode(rec: &Stored<'_>, out: &mut Vec<u8>) {
    out.clear();
    let v1 = StoredV1 {
        event_id: rec.event_id,
        stream: rec.stream,
        subject: rec.subject,
        event_type: rec.event_type,
        time_us: rec.time_us,
        payload: rec.payload,
    };
    // Serialising borrowed strings and bytes into a Vec cannot fail.
    let body = match rec.tenant {
        None => {
            out.push(FORMAT_V1);
            postcard::to_extend(&v1, std::mem::take(out))
        }
        Some(tenant) => {
            out.push(FORMAT_V2);
            postcard::to_extend(&StoredV2 { tenant, v1 }, std::mem::take(out))
        }
    };
    *out = body.unwrap_or_default();
}

/// Whether a stored record is the default tenant's (format version 1), read from its first
/// byte alone.
pub(crate) fn is_default_tenant(bytes: &[u8]) -> bool {
    bytes.first() == Some(&FORMAT_V1)
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Stored<'_>, String> {
    let (tenant, v1) = match bytes.split_first() {
        Some((&FORMAT_V1, rest)) => (
            None,
            postcard::from_bytes::<StoredV1>(rest).map_err(|e| e.to_string())?,
        ),
        Some((&FORMAT_V2, rest)) => {
            let v2: StoredV2 = postcard::from_bytes(rest).map_err(|e| e.to_string())?;
            (Some(v2.tenant), v2.v1)
        }
        Some((v, _)) => return Err(format!("format version {v} is not known to this build")),
        None => return Err("empty record".to_owned()),
    };
    Ok(Stored {
        tenant,
        event_id: v1.event_id,
        stream: v1.stream,
        subject: v1.subject,
        event_type: v1.event_type,
        time_us: v1.time_us,
        payload: v1.payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Stored<'static> {
        Stored {
            tenant: None,
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

    /// Another tenant's event is version 2; the default tenant's stays version 1, the same
    /// bytes as the fixture written before tenants.
    #[test]
    fn a_tenant_is_version_2_and_the_default_stays_version_1() {
        let mut buf = Vec::new();
        let t = Stored {
            tenant: Some("acme"),
            ..sample()
        };
        encode(&t, &mut buf);
        assert_eq!(buf[0], FORMAT_V2);
        assert_eq!(decode(&buf).unwrap(), t);
        encode(&sample(), &mut buf);
        assert_eq!(&buf[..], include_bytes!("../../tests/fixtures/v1.bin"));
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
