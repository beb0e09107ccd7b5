//! Sizes and durations in settings, as people write them: `part-size = "16MiB"`,
//! `read-timeout-ms = "30s"`, or the plain integers of the field's unit (bytes,
//! milliseconds, seconds) as before. Used with `#[serde(deserialize_with = …)]`. And a time
//! as people read it ([`utc`]), and the wall clock the library reads it from ([`Clock`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::{self, Deserializer, Visitor};

/// What a setting's integer counts, and how a string is read into it.
#[derive(Clone, Copy)]
enum Unit {
    Bytes,
    BytesPerSec,
    Millis,
    Secs,
}

struct Human(Unit);

impl Visitor<'_> for Human {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Unit::Bytes => "a size: bytes, or a string such as \"64MiB\" or \"1 GB\"",
            Unit::BytesPerSec => {
                "a rate: bytes per second, or a string such as \"50MiB\" or \"50MiB/s\""
            }
            Unit::Millis => "milliseconds, or a duration such as \"30s\" or \"1m 30s\"",
            Unit::Secs => "seconds, or a duration such as \"24h\" or \"90s\"",
        })
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        parse(self.0, v).map_err(|why| E::custom(format!("{v:?}: {why}")))
    }
}

fn parse(unit: Unit, v: &str) -> Result<u64, String> {
    match unit {
        Unit::BytesPerSec => parse(Unit::Bytes, v.trim().trim_end_matches("/s")),
        Unit::Bytes => v
            .trim()
            .parse::<bytesize::ByteSize>()
            .map(|b| b.as_u64())
            .map_err(|e| format!("not a size ({e})")),
        Unit::Millis | Unit::Secs => {
            let d: Duration =
                humantime::parse_duration(v.trim()).map_err(|e| format!("not a duration ({e})"))?;
            let n = match unit {
                Unit::Millis => d.as_millis(),
                _ => {
                    if d.subsec_nanos() != 0 {
                        return Err("a whole number of seconds is needed".into());
                    }
                    u128::from(d.as_secs())
                }
            };
            u64::try_from(n).map_err(|_| "too long".into())
        }
    }
}

/// A command-line duration in seconds: plain seconds (`90`), or `"90s"`, `"1d"`, `"1h 30m"`
/// — the same forms everywhere a flag takes a duration.
pub fn parse_secs(v: &str) -> Result<u64, String> {
    let t = v.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map_err(|e| format!("{v:?}: {e}"));
    }
    parse(Unit::Secs, t)
        .map_err(|why| format!("{v:?}: {why}: give seconds (90) or a duration (90s, 1d)"))
}

/// As [`parse_secs`], as a [`Duration`].
pub fn parse_duration_flag(v: &str) -> Result<Duration, String> {
    parse_secs(v).map(Duration::from_secs)
}

/// A size in bytes: an integer, or `"64MiB"`, `"16 MB"`, `"1GiB"`.
pub fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(Human(Unit::Bytes))
}

/// A rate in bytes per second: an integer, or `"50MiB"`, `"50MiB/s"`, `"1 GB/s"`.
pub fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(Human(Unit::BytesPerSec))
}

/// [`rate`] for a flag or an environment variable: bytes per second from `"50MiB/s"`,
/// `"50MiB"` or `"52428800"`.
pub fn parse_rate(v: &str) -> Result<u64, String> {
    parse(Unit::BytesPerSec, v).map_err(|why| format!("{v:?}: {why}"))
}

/// A duration in milliseconds: an integer, or `"30s"`, `"250ms"`, `"2m"`.
pub fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(Human(Unit::Millis))
}

/// A duration in seconds: an integer, or `"24h"`, `"90s"`.
pub fn secs<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(Human(Unit::Secs))
}

/// Wall-clock time, injected so that ages and ids are testable without sleeping.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_millis(&self) -> u64;

    /// The same instant as a [`SystemTime`].
    fn now(&self) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_millis(self.now_millis())
    }
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> u64 {
        #[allow(clippy::disallowed_methods)]
        let now = SystemTime::now();
        now.duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct T {
        #[serde(deserialize_with = "bytes")]
        size: u64,
        #[serde(deserialize_with = "millis")]
        timeout_ms: u64,
        #[serde(deserialize_with = "secs")]
        grace_secs: u64,
    }

    fn read(text: &str) -> Result<T, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn integers_and_human_forms() {
        let t = read("size = 16777216\ntimeout_ms = 30000\ngrace_secs = 86400").unwrap();
        assert_eq!(
            (t.size, t.timeout_ms, t.grace_secs),
            (16 << 20, 30_000, 86_400)
        );
        let t = read("size = \"16MiB\"\ntimeout_ms = \"30s\"\ngrace_secs = \"24h\"").unwrap();
        assert_eq!(
            (t.size, t.timeout_ms, t.grace_secs),
            (16 << 20, 30_000, 86_400)
        );
        let t = read("size = \"1 GB\"\ntimeout_ms = \"1m 30s\"\ngrace_secs = \"90s\"").unwrap();
        assert_eq!(
            (t.size, t.timeout_ms, t.grace_secs),
            (1_000_000_000, 90_000, 90)
        );
        let t = read("size = \"5 MiB\"\ntimeout_ms = \"250ms\"\ngrace_secs = 60").unwrap();
        assert_eq!((t.size, t.timeout_ms, t.grace_secs), (5 << 20, 250, 60));
        assert_eq!(parse_rate("50MiB/s"), Ok(50 << 20));
        assert_eq!(parse_rate(" 1 GB/s "), Ok(1_000_000_000));
        assert_eq!(parse_rate("4096"), Ok(4096));
        assert!(parse_rate("fast").unwrap_err().contains("fast"));
    }

    #[test]
    fn bad_values_name_what_was_wrong() {
        for (text, what) in [
            (
                "size = \"sixteen\"\ntimeout_ms = 1\ngrace_secs = 1",
                "sixteen",
            ),
            (
                "size = 1\ntimeout_ms = \"30 parsecs\"\ngrace_secs = 1",
                "30 parsecs",
            ),
            (
                "size = 1\ntimeout_ms = 1\ngrace_secs = \"1500ms\"",
                "whole number of seconds",
            ),
            ("size = -1\ntimeout_ms = 1\ngrace_secs = 1", "size"),
        ] {
            let e = read(text).unwrap_err();
            assert!(e.contains(what), "{text}: {e}");
        }
    }
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z).
pub const MAX_UTC_MILLIS: u64 = 253_402_300_799_999;

/// `ms` since the epoch as UTC, to the second: `2026-12-02T10:00:00Z`. A time past
/// 9999-12-31 (a hostile or mis-clocked checkpoint id, a typed `@<huge>`) is written as its
/// milliseconds, never a panic (issue 46, S4-4: the formatter fails past year 9999).
pub fn utc(ms: u64) -> String {
    if ms > MAX_UTC_MILLIS {
        return format!("{ms} ms since the epoch (past 9999-12-31)");
    }
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    let mut s = String::new();
    use std::fmt::Write as _;
    match write!(s, "{}", humantime::format_rfc3339_seconds(t)) {
        Ok(()) => s,
        Err(_) => format!("{ms} ms since the epoch"),
    }
}

/// `ms` since the epoch as UTC, to the millisecond: `2026-12-02T10:00:00.250Z` — what a
/// checkpoint's time is printed as, because `@TIME` reads it back to the same millisecond and
/// so names the checkpoint it was printed for (`blob::history`). Past 9999-12-31 as [`utc`].
pub fn utc_millis(ms: u64) -> String {
    if ms > MAX_UTC_MILLIS {
        return utc(ms);
    }
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    let mut s = String::new();
    use std::fmt::Write as _;
    match write!(s, "{}", humantime::format_rfc3339_millis(t)) {
        Ok(()) => s,
        Err(_) => format!("{ms} ms since the epoch"),
    }
}

#[cfg(test)]
mod utc_tests {
    use super::*;

    #[test]
    fn any_millisecond_formats_without_a_panic() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(MAX_UTC_MILLIS), "9999-12-31T23:59:59Z");
        assert_eq!(utc_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_millis(1_796_469_491_509), "2026-12-05T11:18:11.509Z");
        assert_eq!(utc_millis(MAX_UTC_MILLIS), "9999-12-31T23:59:59.999Z");
        for ms in [MAX_UTC_MILLIS + 1, i64::MAX as u64, u64::MAX] {
            assert!(utc(ms).contains("past 9999-12-31"), "{ms}");
            assert!(utc_millis(ms).contains("past 9999-12-31"), "{ms}");
        }
    }
}
