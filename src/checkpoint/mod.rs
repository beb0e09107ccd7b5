//! The checkpoint model: [`CheckpointId`], [`Ssp`], [`CheckpointV1`], [`CheckpointV2`], and
//! their JSON, wire-compatible with Samza (reference §2.2, §2.4).
//!
//! - **V2** (what blobsnap writes): `{"checkpoint-id": "<millis>-<seq>", "input-offsets":
//!   {"<system>.<stream>.<partition>": "<offset>"}, "state-checkpoint-markers": {"<backend
//!   factory>": {"<store>": "<marker>"}}, "version": 2}`. The checkpoint id must be a JSON
//!   string.
//! - **V1** (read for migration): Samza's map keyed by the SSP's display form
//!   (`SystemStreamPartition [system, stream, 0]`), each value an object with `system`,
//!   `stream`, `partition` and `offset`.
//! - A document is V2 if and only if it has `checkpoint-id`. Unknown fields and map order are
//!   ignored.
//!
//! **SSP keys** are split at the *first* and the *last* dot, so a stream named `a.b` survives
//! (`kafka.a.b.0` is system `kafka`, stream `a.b`, partition 0). A system name containing a dot
//! cannot be encoded unambiguously and is refused when writing. Note: Samza ≥ 1.8 itself splits
//! on every dot and mis-reads dotted stream names (reference §2.2); avoid dotted stream names if
//! Samza must read checkpoints blobsnap writes.

mod blob_store;
mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use serde_json::Value;

pub use crate::id::{CheckpointId, CheckpointIdGen, EPOCHS, EPOCH_STRIDE};
pub use blob_store::{
    is_record, parse_entry, parse_record, record_to_json, BlobCheckpointStore, Listed, Record,
    Removal, RemovedReport,
};
pub use store::{CheckpointStore, CommittedCheckpoint};

use crate::error::{Error, Result};

/// The largest checkpoint document accepted, in bytes (checked before parsing).
pub const MAX_CHECKPOINT_BYTES: usize = 16 << 20;

/// A system-stream-partition: one unit of input.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Ssp {
    /// The system (`kafka`).
    pub system: String,
    /// The stream (may contain dots).
    pub stream: String,
    /// The partition.
    pub partition: u32,
}

impl Ssp {
    /// A new SSP.
    pub fn new(system: impl Into<String>, stream: impl Into<String>, partition: u32) -> Self {
        Ssp {
            system: system.into(),
            stream: stream.into(),
            partition,
        }
    }

    /// The V2 map key `<system>.<stream>.<partition>`; refuses names that would not read back.
    pub fn to_key(&self) -> Result<String> {
        if self.system.is_empty() || self.stream.is_empty() {
            return Err(Error::invalid(format!(
                "SSP {self}: empty system or stream"
            )));
        }
        if self.system.contains('.') {
            return Err(Error::invalid(format!(
                "SSP {self}: a system name containing '.' cannot be encoded in a checkpoint key"
            )));
        }
        Ok(format!(
            "{}.{}.{}",
            self.system, self.stream, self.partition
        ))
    }

    /// Parse a V2 map key with the first-dot/last-dot rule.
    pub fn from_key(key: &str) -> Result<Self> {
        let bad = |why: &str| Error::corrupt(format!("SSP key {key:?}: {why}"));
        let first = key.find('.').ok_or_else(|| bad("no '.'"))?;
        let last = key.rfind('.').ok_or_else(|| bad("no '.'"))?;
        if first == last {
            return Err(bad("needs <system>.<stream>.<partition>"));
        }
        let (system, stream, partition) = (&key[..first], &key[first + 1..last], &key[last + 1..]);
        if system.is_empty() || stream.is_empty() {
            return Err(bad("empty system or stream"));
        }
        let partition =
            parse_partition(partition).ok_or_else(|| bad("partition is not a number"))?;
        Ok(Ssp::new(system, stream, partition))
    }
}

fn parse_partition(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl fmt::Display for Ssp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SystemStreamPartition [{}, {}, {}]",
            self.system, self.stream, self.partition
        )
    }
}

/// State checkpoint markers: backend factory name → store name → marker.
pub type Markers = BTreeMap<String, BTreeMap<String, String>>;

/// A V2 checkpoint: id, input offsets, and one marker per backend per store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointV2 {
    /// The commit's id.
    pub id: CheckpointId,
    /// Last processed offset per input SSP.
    pub input_offsets: BTreeMap<Ssp, String>,
    /// Markers per backend factory and store.
    pub state_checkpoint_markers: Markers,
}

/// A V1 checkpoint: offsets only (read for migration; carries no state markers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointV1 {
    /// Offsets per SSP (Samza mixes changelog positions in here).
    pub offsets: BTreeMap<Ssp, String>,
}

/// Either version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// A V1 checkpoint.
    V1(CheckpointV1),
    /// A V2 checkpoint.
    V2(CheckpointV2),
}

impl Checkpoint {
    /// 1 or 2.
    pub fn version(&self) -> u16 {
        match self {
            Checkpoint::V1(_) => 1,
            Checkpoint::V2(_) => 2,
        }
    }

    /// The input offsets.
    pub fn offsets(&self) -> &BTreeMap<Ssp, String> {
        match self {
            Checkpoint::V1(c) => &c.offsets,
            Checkpoint::V2(c) => &c.input_offsets,
        }
    }

    /// The V2 checkpoint, if this is one.
    pub fn as_v2(&self) -> Option<&CheckpointV2> {
        match self {
            Checkpoint::V2(c) => Some(c),
            Checkpoint::V1(_) => None,
        }
    }

    /// Parse either version's JSON (V2 iff the object has `checkpoint-id`). Malformed input is
    /// `Corrupt`, with the reason.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_CHECKPOINT_BYTES {
            return Err(Error::corrupt(format!(
                "checkpoint document is {} bytes, over the {MAX_CHECKPOINT_BYTES}-byte cap",
                bytes.len()
            )));
        }
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::corrupt(format!("checkpoint is not valid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(Error::corrupt("checkpoint JSON is not an object"));
        };
        if obj.contains_key("checkpoint-id") {
            parse_v2(&obj).map(Checkpoint::V2)
        } else {
            parse_v1(&obj).map(Checkpoint::V1)
        }
    }

    /// Serialize (V2 in Samza's field order; V1 in Samza's V1 shape).
    pub fn to_json(&self) -> Result<Vec<u8>> {
        match self {
            Checkpoint::V1(c) => c.to_json(),
            Checkpoint::V2(c) => c.to_json(),
        }
    }
}

#[derive(Serialize)]
struct V2Wire<'a> {
    #[serde(rename = "checkpoint-id")]
    id: String,
    #[serde(rename = "input-offsets")]
    input_offsets: BTreeMap<String, &'a str>,
    #[serde(rename = "state-checkpoint-markers")]
    markers: &'a Markers,
    version: u8,
}

impl CheckpointV2 {
    /// Compact JSON, fields in Samza's order (`checkpoint-id`, `input-offsets`,
    /// `state-checkpoint-markers`, `version`), maps sorted by key.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        let mut input_offsets = BTreeMap::new();
        for (ssp, off) in &self.input_offsets {
            input_offsets.insert(ssp.to_key()?, off.as_str());
        }
        let wire = V2Wire {
            id: self.id.to_string(),
            input_offsets,
            markers: &self.state_checkpoint_markers,
            version: 2,
        };
        serde_json::to_vec(&wire).map_err(|e| Error::invalid(format!("serialize checkpoint: {e}")))
    }

    /// The marker of `store` under backend `factory`, if any.
    pub fn marker(&self, factory: &str, store: &str) -> Option<&str> {
        self.state_checkpoint_markers
            .get(factory)?
            .get(store)
            .map(String::as_str)
    }
}

impl CheckpointV1 {
    /// Samza's V1 JSON.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        let mut map = serde_json::Map::new();
        for (ssp, off) in &self.offsets {
            map.insert(
                ssp.to_string(),
                serde_json::json!({
                    "system": ssp.system,
                    "stream": ssp.stream,
                    "partition": ssp.partition.to_string(),
                    "offset": off,
                }),
            );
        }
        serde_json::to_vec(&Value::Object(map))
            .map_err(|e| Error::invalid(format!("serialize checkpoint: {e}")))
    }
}

fn str_field<'a>(
    obj: &'a serde_json::Map<String, Value>,
    name: &str,
    what: &str,
) -> Result<&'a str> {
    match obj.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(Error::corrupt(format!(
            "{what}: {name:?} must be a string, found {}",
            type_name(other)
        ))),
        None => Err(Error::corrupt(format!("{what}: {name:?} is missing"))),
    }
}

fn obj_field<'a>(
    obj: &'a serde_json::Map<String, Value>,
    name: &str,
    what: &str,
) -> Result<&'a serde_json::Map<String, Value>> {
    match obj.get(name) {
        Some(Value::Object(o)) => Ok(o),
        Some(other) => Err(Error::corrupt(format!(
            "{what}: {name:?} must be an object, found {}",
            type_name(other)
        ))),
        None => Err(Error::corrupt(format!("{what}: {name:?} is missing"))),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_v2(obj: &serde_json::Map<String, Value>) -> Result<CheckpointV2> {
    let what = "checkpoint v2";
    let id: CheckpointId = str_field(obj, "checkpoint-id", what)?
        .parse()
        .map_err(|e: Error| Error::corrupt(format!("{what}: {}", e.message())))?;
    let mut input_offsets = BTreeMap::new();
    for (key, value) in obj_field(obj, "input-offsets", what)? {
        let ssp = Ssp::from_key(key)?;
        let Value::String(offset) = value else {
            return Err(Error::corrupt(format!(
                "{what}: offset of {key:?} must be a string, found {}",
                type_name(value)
            )));
        };
        input_offsets.insert(ssp, offset.clone());
    }
    let mut markers = Markers::new();
    for (factory, stores) in obj_field(obj, "state-checkpoint-markers", what)? {
        let Value::Object(stores) = stores else {
            return Err(Error::corrupt(format!(
                "{what}: markers of backend {factory:?} must be an object, found {}",
                type_name(stores)
            )));
        };
        let mut per_store = BTreeMap::new();
        for (store, marker) in stores {
            let Value::String(marker) = marker else {
                return Err(Error::corrupt(format!(
                    "{what}: marker of store {store:?} (backend {factory:?}) must be a string, found {}",
                    type_name(marker)
                )));
            };
            per_store.insert(store.clone(), marker.clone());
        }
        markers.insert(factory.clone(), per_store);
    }
    Ok(CheckpointV2 {
        id,
        input_offsets,
        state_checkpoint_markers: markers,
    })
}

fn parse_v1(obj: &serde_json::Map<String, Value>) -> Result<CheckpointV1> {
    let mut offsets = BTreeMap::new();
    for (key, value) in obj {
        let what = format!("checkpoint v1 entry {key:?}");
        let Value::Object(entry) = value else {
            return Err(Error::corrupt(format!(
                "{what} must be an object, found {}",
                type_name(value)
            )));
        };
        let system = str_field(entry, "system", &what)?;
        let stream = str_field(entry, "stream", &what)?;
        let partition = parse_partition(str_field(entry, "partition", &what)?)
            .ok_or_else(|| Error::corrupt(format!("{what}: partition is not a number")))?;
        let offset = str_field(entry, "offset", &what)?;
        offsets.insert(Ssp::new(system, stream, partition), offset.to_string());
    }
    Ok(CheckpointV1 { offsets })
}

impl FromStr for Checkpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Checkpoint::from_json(s.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssp_keys_first_and_last_dot() {
        let s = Ssp::from_key("kafka.a.b.7").unwrap();
        assert_eq!(s, Ssp::new("kafka", "a.b", 7));
        assert_eq!(s.to_key().unwrap(), "kafka.a.b.7");
        for bad in [
            "kafka",
            "kafka.x",
            "kafka.x.y",
            ".x.1",
            "k..1",
            "k.x.-1",
            "k.x.1a",
        ] {
            assert!(Ssp::from_key(bad).is_err(), "{bad}");
        }
        assert!(Ssp::new("a.b", "s", 0).to_key().is_err());
    }
}
