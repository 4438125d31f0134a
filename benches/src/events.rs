//! The events every system appends: 256-byte payloads, unique ids with random-looking bits,
//! subjects drawn from 10,000 keys. The same generator feeds every target, so each does the
//! same logical work.

use std::ops::Range;

use serde_json::json;

pub const STREAM: &str = "task_events";
pub const EVENT_TYPE: &str = "bench.appended";
/// Canonical payload size of every benchmark event.
pub const PAYLOAD_BYTES: usize = 256;
/// Distinct subjects (task ids) the events are spread over.
pub const SUBJECTS: u64 = 10_000;

/// splitmix64: a bijection on u64, so distinct inputs give distinct, random-looking outputs.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One event as every target receives it; each target encodes it its own way in `prepare`.
#[derive(Clone, Debug)]
pub struct BenchEvent {
    pub event_id: String,
    pub subject: String,
    /// Canonical JSON, exactly `PAYLOAD_BYTES` long.
    pub payload: String,
}

/// The i-th event of a run. Ids are unique for a seed and random-looking, so an `event_id`
/// index receives random keys, as it would from real clients.
#[derive(Clone, Copy)]
pub struct EventGen {
    seed: u64,
}

impl EventGen {
    pub fn new(seed: u64) -> Self {
        EventGen { seed: mix(seed) }
    }

    /// A generator whose ids do not repeat those of an earlier process on the same log.
    pub fn from_clock() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        EventGen::new(nanos ^ u64::from(std::process::id()))
    }

    pub fn event_id(&self, i: u64) -> String {
        format!("bench-{:016x}", mix(i ^ self.seed))
    }

    pub fn subject(&self, i: u64) -> String {
        format!("task-{}", mix(i.wrapping_add(self.seed)) % SUBJECTS)
    }

    /// `{"n":i,"pad":"xxx…"}`, padded to exactly `PAYLOAD_BYTES` canonical bytes.
    pub fn payload(&self, i: u64) -> String {
        let base = r#"{"n":,"pad":""}"#.len() + i.to_string().len();
        json!({"n": i, "pad": "x".repeat(PAYLOAD_BYTES - base)}).to_string()
    }

    pub fn event(&self, i: u64) -> BenchEvent {
        BenchEvent {
            event_id: self.event_id(i),
            subject: self.subject(i),
            payload: self.payload(i),
        }
    }

    pub fn batch(&self, seqs: Range<u64>) -> Vec<BenchEvent> {
        seqs.map(|i| self.event(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_exactly_the_canonical_size_and_ids_distinct() {
        let g = EventGen::new(7);
        for i in [0, 7, 123_456_789, u64::MAX] {
            assert_eq!(g.payload(i).len(), PAYLOAD_BYTES, "event {i}");
        }
        let ids: std::collections::HashSet<String> = (0..10_000).map(|i| g.event_id(i)).collect();
        assert_eq!(ids.len(), 10_000);
    }
}
