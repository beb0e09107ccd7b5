//! `CheckpointId`: `<millis>-<seq>`, strictly increasing per task (the ground floor: the index,
//! the bucket layout and the checkpoint model all name it; `checkpoint` re-exports it).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The id of one commit of one task: `<millis>-<seq>` (Samza's `<millis>-<nanoId>` string
/// form, reference §2.1). Ordered by millis, then seq. Both parts are non-negative and at most
/// `i64::MAX`, so Samza's Java `long` parser reads every id we write.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointId {
    millis: u64,
    seq: u64,
}

impl CheckpointId {
    /// An id from its two parts (each at most `i64::MAX`).
    pub fn new(millis: u64, seq: u64) -> Result<Self> {
        if millis > i64::MAX as u64 || seq > i64::MAX as u64 {
            return Err(Error::invalid(format!(
                "checkpoint id {millis}-{seq}: parts must fit a signed 64-bit integer"
            )));
        }
        Ok(CheckpointId { millis, seq })
    }

    /// Wall-clock milliseconds when the id was made.
    pub fn millis(&self) -> u64 {
        self.millis
    }

    /// The tie-breaker within one millisecond.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.millis, self.seq)
    }
}

impl fmt::Debug for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CheckpointId({self})")
    }
}

fn parse_part(s: &str, part: &str, whole: &str) -> Result<u64> {
    if s.is_empty() {
        return Err(Error::invalid(format!(
            "checkpoint id {whole:?}: the {part} part is missing"
        )));
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::invalid(format!(
            "checkpoint id {whole:?}: the {part} part {s:?} is not a non-negative decimal number"
        )));
    }
    s.parse::<u64>()
        .ok()
        .filter(|v| *v <= i64::MAX as u64)
        .ok_or_else(|| {
            Error::invalid(format!(
                "checkpoint id {whole:?}: the {part} part {s:?} is too large"
            ))
        })
}

impl FromStr for CheckpointId {
    type Err = Error;

    /// Parse `<millis>-<seq>` strictly: no blanks, signs, extra parts or missing parts.
    fn from_str(s: &str) -> Result<Self> {
        if s.trim().is_empty() {
            return Err(Error::invalid("checkpoint id is blank"));
        }
        let mut parts = s.split('-');
        let millis = parts.next().unwrap_or_default();
        let Some(seq) = parts.next() else {
            return Err(Error::invalid(format!(
                "checkpoint id {s:?} is not <millis>-<seq>: no '-'"
            )));
        };
        if parts.next().is_some() {
            return Err(Error::invalid(format!(
                "checkpoint id {s:?} is not <millis>-<seq>: more than two parts"
            )));
        }
        Ok(CheckpointId {
            millis: parse_part(millis, "millis", s)?,
            seq: parse_part(seq, "seq", s)?,
        })
    }
}

impl serde::Serialize for CheckpointId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for CheckpointId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How many ids one epoch can make within one millisecond: the `seq` part of an id made in
/// epoch `e` lies in `[e × EPOCH_STRIDE, (e + 1) × EPOCH_STRIDE)` (epochs taken modulo
/// [`EPOCHS`]), so that two epochs never make the same id, whatever their clocks say.
pub const EPOCH_STRIDE: u64 = 1_000_000;

/// Distinct epochs an id can carry (`seq` stays at most `i64::MAX`).
pub const EPOCHS: u64 = i64::MAX as u64 / EPOCH_STRIDE;

/// Makes strictly increasing ids for one task, whatever the wall clock does.
///
/// Seed it with the last committed id ([`CheckpointIdGen::after`]): a task restarted on a host
/// whose clock is behind still never reuses or goes below an id already committed.
///
/// A generator of an **epoch** ([`CheckpointIdGen::for_epoch`]: the runtime's epoch is the
/// sequence number of the task's claim, unique per process that ever claimed the task) puts
/// the epoch in the `seq` part of every id it makes: two processes of one task never make the
/// same id, even when the later one starts with a clock behind the ids the earlier one made
/// but never committed (DESIGN §7) — its RocksDB checkpoint dirs and blob keys are its own.
#[derive(Clone, Debug, Default)]
pub struct CheckpointIdGen {
    last: Option<CheckpointId>,
    epoch: u64,
}

impl CheckpointIdGen {
    /// A generator with no history (epoch 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// A generator (epoch 0) whose ids are all greater than `last` (if any).
    pub fn after(last: Option<CheckpointId>) -> Self {
        CheckpointIdGen { last, epoch: 0 }
    }

    /// A generator of epoch `epoch` whose ids are all greater than `last` (if any) and carry
    /// the epoch: their `seq / EPOCH_STRIDE` is `epoch % EPOCHS`.
    pub fn for_epoch(last: Option<CheckpointId>, epoch: u64) -> Self {
        CheckpointIdGen {
            last,
            epoch: epoch % EPOCHS,
        }
    }

    /// The next id for wall-clock time `now_millis`: `(now, base)` if the clock moved past the
    /// last id (`base` = the epoch's first `seq`), else the next `seq` of this epoch in the last
    /// id's millisecond, or the next millisecond when the last id's `seq` is beyond this
    /// epoch's range (a later epoch, a foreign id, or the range used up).
    pub fn next(&mut self, now_millis: u64) -> Result<CheckpointId> {
        let now = now_millis.min(i64::MAX as u64);
        let base = self.epoch * EPOCH_STRIDE;
        let end = base + EPOCH_STRIDE;
        let id = match self.last {
            Some(last) if now <= last.millis => {
                if last.seq < base {
                    CheckpointId::new(last.millis, base)?
                } else if last.seq + 1 < end {
                    CheckpointId::new(last.millis, last.seq + 1)?
                } else {
                    CheckpointId::new(
                        last.millis
                            .checked_add(1)
                            .filter(|m| *m <= i64::MAX as u64)
                            .ok_or_else(|| Error::invalid("checkpoint id space exhausted"))?,
                        base,
                    )?
                }
            }
            _ => CheckpointId::new(now, base)?,
        };
        self.last = Some(id);
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_samza_examples() {
        for s in [
            "1234-567",
            "1614556776350-123456",
            "1700000000123-42",
            "0-0",
        ] {
            assert_eq!(s.parse::<CheckpointId>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn rejects_malformed() {
        for s in [
            "",
            " ",
            "1234",
            "1234-",
            "-567",
            "1234-567-8",
            "12a-5",
            "123--456",
            "+1-2",
            "1- 2",
            "99999999999999999999-1",
        ] {
            let e = s.parse::<CheckpointId>().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidInput, "{s:?}: {e}");
        }
    }

    #[test]
    fn generator_never_goes_backwards() {
        let seed: CheckpointId = "5000-3".parse().unwrap();
        let mut g = CheckpointIdGen::after(Some(seed));
        let a = g.next(1000).unwrap(); // clock behind the seed
        assert_eq!(a.to_string(), "5000-4");
        let b = g.next(5000).unwrap();
        assert_eq!(b.to_string(), "5000-5");
        let c = g.next(6000).unwrap();
        assert_eq!(c.to_string(), "6000-0");
        assert!(seed < a && a < b && b < c);
    }

    #[test]
    fn two_epochs_never_make_the_same_id() {
        // Epoch 7 made ids it never committed; epoch 8 starts from the same committed id with
        // the same (stuck) clock: its ids are all different and all greater.
        let committed: CheckpointId = "5000-3".parse().unwrap();
        let mut a = CheckpointIdGen::for_epoch(Some(committed), 7);
        let mut b = CheckpointIdGen::for_epoch(Some(committed), 8);
        let ours: Vec<_> = (0..5).map(|_| a.next(1000).unwrap()).collect();
        let theirs: Vec<_> = (0..5).map(|_| b.next(1000).unwrap()).collect();
        assert_eq!(ours[0].to_string(), "5000-7000000");
        assert_eq!(theirs[0].to_string(), "5000-8000000");
        for id in &theirs {
            assert!(!ours.contains(id) && *id > committed, "{id}");
        }
        // A later epoch's id as the seed: an earlier epoch moves to the next millisecond.
        let mut c = CheckpointIdGen::for_epoch(Some(theirs[4]), 3);
        assert_eq!(c.next(1000).unwrap().to_string(), "5001-3000000");
        // The range of one epoch used up in one millisecond: the next millisecond.
        let full = CheckpointId::new(5000, 8 * EPOCH_STRIDE + EPOCH_STRIDE - 1).unwrap();
        let mut d = CheckpointIdGen::for_epoch(Some(full), 8);
        assert_eq!(d.next(10).unwrap().to_string(), "5001-8000000");
        // The largest epoch still fits a signed 64-bit seq.
        let mut e = CheckpointIdGen::for_epoch(None, u64::MAX);
        let id = e.next(1).unwrap();
        assert!(id.seq() <= i64::MAX as u64);
    }

    proptest! {
        #[test]
        fn generator_is_strictly_increasing(clock in proptest::collection::vec(0u64..10_000, 1..50), epoch in 0u64..100) {
            let mut g = CheckpointIdGen::for_epoch(None, epoch);
            let mut prev: Option<CheckpointId> = None;
            for now in clock {
                let id = g.next(now).unwrap();
                prop_assert!(prev.is_none_or(|p| p < id));
                prop_assert_eq!(id.seq() / EPOCH_STRIDE, epoch);
                prop_assert_eq!(id.to_string().parse::<CheckpointId>().unwrap(), id);
                prev = Some(id);
            }
        }
    }
}
