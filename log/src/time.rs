//! Event time: microseconds since the Unix epoch, rendered as RFC 3339 UTC with six digits.

use time::OffsetDateTime;

/// Current wall-clock time in microseconds since the epoch. Only the writer and commands call
/// this: the time then enters the log inside an event, so no fold reads the clock.
pub fn now_micros() -> i64 {
    let now = OffsetDateTime::now_utc();
    (now.unix_timestamp_nanos() / 1_000) as i64
}

/// `2026-11-21T10:00:00.123456Z`.
pub fn format_micros(us: i64) -> String {
    Micros(us).to_string()
}

/// A time in microseconds since the epoch, written as RFC 3339 UTC with six digits wherever it
/// is displayed or serialized: an answer's times go straight into the response's buffer, with
/// no string made for each (the JSON is a string, as [`format_micros`] gives it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Micros(pub i64);

impl std::fmt::Display for Micros {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.0.div_euclid(1_000_000);
        let micros = self.0.rem_euclid(1_000_000);
        match OffsetDateTime::from_unix_timestamp(secs) {
            Ok(t) => write!(
                f,
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second(),
                micros
            ),
            Err(_) => f.write_str("1970-01-01T00:00:00.000000Z"),
        }
    }
}

impl serde::Serialize for Micros {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Parse an RFC 3339 time into microseconds since the epoch.
pub fn parse_rfc3339_micros(s: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some((t.unix_timestamp_nanos() / 1_000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_microseconds() {
        assert_eq!(format_micros(0), "1970-01-01T00:00:00.000000Z");
        let us = parse_rfc3339_micros("2026-11-21T10:00:00.123456Z").unwrap();
        assert_eq!(format_micros(us), "2026-11-21T10:00:00.123456Z");
        assert_eq!(
            serde_json::to_string(&Micros(us)).unwrap(),
            r#""2026-11-21T10:00:00.123456Z""#
        );
        assert_eq!(format_micros(i64::MAX), "1970-01-01T00:00:00.000000Z");
    }
}
