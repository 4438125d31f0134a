//! Small helpers shared by the e2e modules.

use std::collections::HashSet;

use serde_json::{Value, json};

/// An event body for `POST /v1/events`.
pub fn ev(id: &str, stream: &str, subject: &str, ty: &str, payload: Value) -> Value {
    json!({"event_id": id, "stream": stream, "subject": subject, "type": ty, "payload": payload})
}

/// The `events` of a 201 receipt as `(event_id, seq, duplicate)`.
#[track_caller]
pub fn receipts(body: &Value) -> Vec<(String, u64, bool)> {
    body["events"]
        .as_array()
        .unwrap_or_else(|| panic!("receipt without an `events` array: {body}"))
        .iter()
        .map(|r| {
            (
                r["event_id"]
                    .as_str()
                    .unwrap_or_else(|| panic!("receipt without event_id: {r}"))
                    .to_owned(),
                r["seq"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("receipt without seq: {r}")),
                r["duplicate"]
                    .as_bool()
                    .unwrap_or_else(|| panic!("receipt without duplicate: {r}")),
            )
        })
        .collect()
}

pub fn seq_of(e: &Value) -> u64 {
    e["seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("envelope without seq: {e}"))
}

pub fn id_of(e: &Value) -> &str {
    e["event_id"]
        .as_str()
        .unwrap_or_else(|| panic!("envelope without event_id: {e}"))
}

/// The whole log must be seqs `1..=head`, dense, with no event_id twice (I1, I2).
#[track_caller]
pub fn assert_dense_unique(all: &[Value], head: u64) {
    let len = u64::try_from(all.len()).expect("len");
    assert_eq!(
        len, head,
        "the log holds {len} events but latest_event_seq is {head}"
    );
    let mut ids = HashSet::new();
    for (i, e) in all.iter().enumerate() {
        let want = u64::try_from(i).expect("index") + 1;
        assert_eq!(seq_of(e), want, "the log is not dense at position {i}: {e}");
        assert!(
            ids.insert(id_of(e).to_owned()),
            "event_id {} appears twice in the log",
            id_of(e)
        );
    }
}

/// `YYYY-MM-DDTHH:MM:SS.ffffff` then `Z` or `+00:00`: RFC 3339, UTC, six fractional digits.
/// Returns the part before the offset, which sorts as time.
#[track_caller]
pub fn check_time(t: &str) -> &str {
    let (stamp, offset) = t.split_at(t.len().min(26));
    assert!(
        offset == "Z" || offset == "+00:00",
        "time {t:?} is not UTC (`Z`)"
    );
    let b = stamp.as_bytes();
    assert_eq!(b.len(), 26, "time {t:?} is not YYYY-MM-DDTHH:MM:SS.ffffff");
    for (i, c) in b.iter().enumerate() {
        let ok = match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            _ => c.is_ascii_digit(),
        };
        assert!(ok, "time {t:?} is not RFC 3339 with six fractional digits");
    }
    let num = |r: std::ops::Range<usize>| stamp[r].parse::<u32>().expect("digits");
    assert!((1..=12).contains(&num(5..7)), "month of {t:?}");
    assert!((1..=31).contains(&num(8..10)), "day of {t:?}");
    assert!(
        num(11..13) < 24 && num(14..16) < 60 && num(17..19) < 61,
        "clock of {t:?}"
    );
    stamp
}
