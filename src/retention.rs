//! Retention policies over points in time: `last 3, every 5m for 1d, every 1h for 7d`
//! (restic's `forget --keep-last / --keep-within-hourly …` semantics), or a bare count.
//!
//! A policy keeps the union of what each rule selects:
//! - `last N`: the N newest points;
//! - `every D for W`: among the points made within W of now, the newest of each period D
//!   (periods aligned to the Unix epoch, in UTC: `every 1d` keeps the newest point of each
//!   UTC day).
//!
//! The newest point is always kept. Pure: no I/O, no clock (`now` is given).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// One `every D for W` rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tier {
    /// The period: one point kept per period.
    pub every: Duration,
    /// How far back the rule reaches from now.
    pub within: Duration,
}

/// A retention policy (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// The newest this many points are kept (at least 1).
    pub last: usize,
    /// The tiers.
    pub tiers: Vec<Tier>,
}

impl RetentionPolicy {
    /// Keep the newest `n` (at least 1).
    pub fn last(n: usize) -> Self {
        RetentionPolicy {
            last: n.max(1),
            tiers: Vec::new(),
        }
    }

    /// The indexes of `points` (each a time in ms since the epoch, newest first) the policy
    /// keeps at `now_ms`.
    pub fn select(&self, points: &[u64], now_ms: u64) -> BTreeSet<usize> {
        let mut keep: BTreeSet<usize> = (0..points.len().min(self.last.max(1))).collect();
        for t in &self.tiers {
            let every = (t.every.as_millis() as u64).max(1);
            let since = now_ms.saturating_sub(t.within.as_millis() as u64);
            let mut seen = BTreeSet::new();
            for (i, &ms) in points.iter().enumerate() {
                // Newest first: the first point of a period is its newest.
                if ms >= since && seen.insert(ms / every) {
                    keep.insert(i);
                }
            }
        }
        keep
    }
}

impl FromStr for RetentionPolicy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::invalid(format!(
                "retention {s:?}: {why} (expected a count, or rules such as \"last 3, every 5m for 1d, every 1h for 7d\")"
            ))
        };
        if let Ok(n) = s.trim().parse::<usize>() {
            if n == 0 {
                return Err(bad("keeps nothing".into()));
            }
            return Ok(RetentionPolicy::last(n));
        }
        let mut policy = RetentionPolicy {
            last: 1,
            tiers: Vec::new(),
        };
        let mut saw_last = false;
        for rule in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let words: Vec<&str> = rule.split_whitespace().collect();
            match words.as_slice() {
                ["last", n] => {
                    let n: usize = n
                        .parse()
                        .map_err(|_| bad(format!("{rule:?}: last takes a count")))?;
                    if n == 0 || saw_last {
                        return Err(bad(format!("{rule:?}: one `last N` with N ≥ 1")));
                    }
                    saw_last = true;
                    policy.last = n;
                }
                ["every", d, "for", w] => {
                    let every = humantime::parse_duration(d)
                        .map_err(|e| bad(format!("{rule:?}: {d:?}: {e}")))?;
                    let within = humantime::parse_duration(w)
                        .map_err(|e| bad(format!("{rule:?}: {w:?}: {e}")))?;
                    if every.is_zero() || within < every {
                        return Err(bad(format!(
                            "{rule:?}: the period must be positive and no longer than the window"
                        )));
                    }
                    policy.tiers.push(Tier { every, within });
                }
                _ => {
                    return Err(bad(format!(
                        "{rule:?} is neither `last N` nor `every D for W`"
                    )))
                }
            }
        }
        if !saw_last && policy.tiers.is_empty() {
            return Err(bad("no rule".into()));
        }
        Ok(policy)
    }
}

/// A policy in a settings file: a count when it is one, else its rules' text.
impl serde::Serialize for RetentionPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        if self.tiers.is_empty() {
            s.serialize_u64(self.last as u64)
        } else {
            s.serialize_str(&self.to_string())
        }
    }
}

/// A policy from a settings file: a count (`2`) or rules (`"last 3, every 1h for 7d"`).
impl<'de> serde::Deserialize<'de> for RetentionPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RetentionPolicy;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a count, or rules such as \"last 3, every 5m for 1d\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> std::result::Result<Self::Value, E> {
                self.visit_str(&n.to_string())
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> std::result::Result<Self::Value, E> {
                self.visit_str(&n.to_string())
            }
            fn visit_str<E: serde::de::Error>(
                self,
                v: &str,
            ) -> std::result::Result<Self::Value, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl fmt::Display for RetentionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "last {}", self.last)?;
        for t in &self.tiers {
            write!(
                f,
                ", every {} for {}",
                humantime::format_duration(t.every),
                humantime::format_duration(t.within)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_print() {
        let p: RetentionPolicy = "last 3, every 5m for 1d, every 1h for 7d".parse().unwrap();
        assert_eq!(p.last, 3);
        assert_eq!(
            p.tiers,
            vec![
                Tier {
                    every: Duration::from_secs(300),
                    within: Duration::from_secs(86_400)
                },
                Tier {
                    every: Duration::from_secs(3600),
                    within: Duration::from_secs(7 * 86_400)
                },
            ]
        );
        assert_eq!(
            p.to_string(),
            "last 3, every 5m for 1day, every 1h for 7days"
        );
        assert_eq!(
            "2".parse::<RetentionPolicy>().unwrap(),
            RetentionPolicy::last(2)
        );
        assert_eq!(
            "every 1d for 30d".parse::<RetentionPolicy>().unwrap().last,
            1
        );
        for bad in [
            "",
            "0",
            "last 0",
            "last x",
            "every 1h for 5m",
            "every 0s for 1d",
            "keep 3",
            "last 2, last 3",
        ] {
            assert!(bad.parse::<RetentionPolicy>().is_err(), "{bad}");
        }
    }

    /// A point every second for a simulated day under a tiered policy: the newest 3, one per
    /// 5 minutes for the day (288), one per hour for the week (24 here) — their union.
    #[test]
    fn a_day_of_points_every_second_keeps_the_tiers() {
        let p: RetentionPolicy = "last 3, every 5m for 1d, every 1h for 7d".parse().unwrap();
        let now = 1_800_000_000_000u64 - 1_800_000_000_000 % 86_400_000 + 86_400_000 - 1;
        let points: Vec<u64> = (0..86_400u64).map(|s| now - s * 1000).collect();
        let keep = p.select(&points, now);
        assert!(keep.contains(&0) && keep.contains(&1) && keep.contains(&2));
        // The 5-minute tier alone keeps one point per 5-minute period of the day (288), the
        // hourly one falls inside them; plus the newest 3.
        assert!((288..=291).contains(&keep.len()), "{}", keep.len());
        // Each kept point is the newest of its 5-minute period.
        for &i in &keep {
            if i > 2 {
                let period = points[i] / 300_000;
                assert!(i == 0 || points[i - 1] / 300_000 != period, "{i}");
            }
        }
    }

    #[test]
    fn the_newest_is_always_kept() {
        let p: RetentionPolicy = "every 1d for 1d".parse().unwrap();
        // Every point older than the window: only the newest stays.
        let keep = p.select(&[1000, 500], 10 * 86_400_000);
        assert_eq!(keep, [0].into());
        assert!(p.select(&[], 0).is_empty());
    }
}
