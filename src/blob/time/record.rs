//! The records of state through time that every part of it reads: a savepoint's record (its
//! format, its name rules, how it is parsed, read and listed) and a fork's pin on one (the
//! fork source a reference names, the pin, the forks that pin a savepoint), and a task's
//! start-from record (the point it started from, the head it committed, a fork's pins). The bottom of
//! state through time: `blob::history`, `blob::savepoint` and `blob::fork` import
//! it, it imports none of them (their public paths re-export what moved here).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use futures::TryStreamExt as _;
use serde::{Deserialize, Serialize};

use crate::blob::snapshot::FACTORY_NAME;
use crate::blobstore::{get_bytes, BlobKey, BlobStore};
use crate::checkpoint::{Checkpoint, CommittedCheckpoint};
use crate::error::{Error, ErrorKind, Result};
use crate::index::{BorrowedScope, SnapshotIndex};
use crate::layout::{parse, JobScope, KeyKind};

/// The savepoint record's format.
pub const FORMAT: u32 = 1;

/// At most this many bytes are read of one savepoint record.
pub(crate) const MAX_RECORD_BYTES: u64 = 64 << 20;

/// A savepoint record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Savepoint {
    /// [`FORMAT`].
    pub format: u32,
    /// Its name.
    pub name: String,
    /// The job.
    pub job_name: String,
    /// The job's id.
    pub job_id: String,
    /// When it was made, ms since the epoch (this machine's clock).
    pub created_millis: u64,
    /// The reference it was made at (`latest`, `@2026-12-02T10:00Z`, …).
    pub at: String,
    /// Per task, the checkpoint it records.
    pub tasks: BTreeMap<String, SavedCheckpoint>,
}

/// One task's checkpoint in a savepoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SavedCheckpoint {
    /// Its number in the task's history when the savepoint was made.
    pub seq: u64,
    /// The checkpoint document, as committed.
    pub checkpoint: serde_json::Value,
}

impl Savepoint {
    /// The checkpoint of `task`, parsed (`Corrupt` if the record's document does not parse).
    pub fn checkpoint_of(&self, task: &str) -> Result<Option<CommittedCheckpoint>> {
        let Some(s) = self.tasks.get(task) else {
            return Ok(None);
        };
        let bytes = serde_json::to_vec(&s.checkpoint)
            .map_err(|e| Error::corrupt(format!("savepoint {:?}: {e}", self.name)))?;
        let checkpoint = Checkpoint::from_json(&bytes).map_err(|e| {
            Error::corrupt(format!(
                "savepoint {:?}: the checkpoint of task {task:?}: {e}",
                self.name
            ))
        })?;
        Ok(Some(CommittedCheckpoint {
            seq: s.seq,
            writer: format!("savepoint:{}", self.name),
            checkpoint,
        }))
    }

    /// Every (task, store, marker) it names (blob backend).
    pub fn markers(&self) -> Result<Vec<(String, String, String)>> {
        let mut out = Vec::new();
        for task in self.tasks.keys() {
            let Some(c) = self.checkpoint_of(task)? else {
                continue;
            };
            if let Some(m) = c
                .checkpoint
                .as_v2()
                .and_then(|v| v.state_checkpoint_markers.get(FACTORY_NAME))
            {
                for (store, marker) in m {
                    out.push((task.clone(), store.clone(), marker.clone()));
                }
            }
        }
        Ok(out)
    }
}

/// A savepoint name: 1 to 128 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "savepoint name {name:?}: use 1 to 128 of A-Z a-z 0-9 . _ -, not starting with . or -"
        )))
    }
}

/// Savepoint `name` of `job` (`NotFound` if there is none).
pub async fn read(store: &dyn BlobStore, job: &JobScope, name: &str) -> Result<Savepoint> {
    validate_name(name)?;
    let key = job.savepoint_key(name)?;
    let bytes = get_bytes(store, &key, MAX_RECORD_BYTES)
        .await
        .map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                Error::new(
                    ErrorKind::NotFound,
                    format!("no savepoint {name:?} ({key})"),
                )
            } else {
                e.context(format!("read savepoint {key}"))
            }
        })?;
    parse_record(&bytes, &key)
}

/// Parse savepoint record `bytes` stored at `key`. Unreadable (`Corrupt`, naming the key
/// and why): not JSON (or nested past serde_json's depth limit), a format this build does not
/// read, a name that differs from the key's (the key is the name: a record is never shown
/// under another), a job that is not the key's, a task's checkpoint that does not parse.
pub fn parse_record(bytes: &[u8], key: &BlobKey) -> Result<Savepoint> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| Error::corrupt(format!("savepoint {key}: not JSON: {e}")))?;
    let format = value.get("format").and_then(serde_json::Value::as_u64);
    if format.is_some_and(|f| f > u64::from(FORMAT)) {
        return Err(Error::corrupt(format!(
            "savepoint {key}: format {} is newer than this blobsnap reads ({FORMAT}): upgrade blobsnap",
            format.unwrap_or_default()
        )));
    }
    let sp: Savepoint = serde_json::from_value(value)
        .map_err(|e| Error::corrupt(format!("savepoint {key}: a field out of range: {e}")))?;
    if sp.format != FORMAT {
        return Err(Error::corrupt(format!(
            "savepoint {key}: format {} (this blobsnap reads {FORMAT})",
            sp.format
        )));
    }
    let parsed = parse(key);
    if let Some(KeyKind::Savepoint { name }) = parsed.as_ref().map(|p| &p.kind) {
        if *name != sp.name {
            return Err(Error::corrupt(format!(
                "savepoint {key}: the record says its name is {:?}, its key says {name:?}",
                sp.name
            )));
        }
    }
    if let Some(p) = &parsed {
        let (job_name, job_id) = (p.job_name.as_str(), p.job_id.as_str());
        if (job_name, job_id) != (sp.job_name.as_str(), sp.job_id.as_str()) {
            return Err(Error::corrupt(format!(
                "savepoint {key}: the record is of job {}/{}, its key of {job_name}/{job_id}",
                sp.job_name, sp.job_id
            )));
        }
    }
    for task in sp.tasks.keys() {
        sp.checkpoint_of(task)
            .map_err(|e| e.context(format!("savepoint {key}")))?;
    }
    Ok(sp)
}

/// A savepoint record that cannot be read: its key, the name the key gives, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Unreadable {
    /// The record's key.
    pub key: String,
    /// The savepoint's name, from the key.
    pub name: String,
    /// Why it cannot be read.
    pub reason: String,
}

impl Unreadable {
    /// The names of `records`, comma-separated (for a message).
    pub fn names(records: &[Unreadable]) -> String {
        records
            .iter()
            .map(|u| u.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Every savepoint of `job`: the readable records, by name, and each unreadable one named
/// by its key with the reason (an operator's listing: one damaged record never hides the
/// others; collectors use `savepoint::list_roots`, which fails closed instead).
pub async fn list_all(
    store: &dyn BlobStore,
    job: &JobScope,
) -> Result<(Vec<Savepoint>, Vec<Unreadable>)> {
    let mut out = Vec::new();
    let mut bad = Vec::new();
    let metas: Vec<_> = store.list(&job.savepoints()?).try_collect().await?;
    for m in metas {
        let Some(KeyKind::Savepoint { name }) = parse(&m.key).map(|p| p.kind) else {
            continue;
        };
        let read = match get_bytes(store, &m.key, MAX_RECORD_BYTES).await {
            Ok(b) => parse_record(&b, &m.key),
            Err(e) if e.kind() == ErrorKind::NotFound => continue, // removed meanwhile
            Err(e) => Err(e),
        };
        match read {
            Ok(sp) => out.push(sp),
            Err(e) if matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::InvalidInput) => {
                bad.push(Unreadable {
                    key: m.key.to_string(),
                    name,
                    reason: e.to_string(),
                })
            }
            Err(e) => return Err(e.context(format!("read savepoint {}", m.key))),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((out, bad))
}

/// Every savepoint of `job`, by name. Fails on one that cannot be read (a collector must not
/// go on without it).
pub async fn list(store: &dyn BlobStore, job: &JobScope) -> Result<Vec<Savepoint>> {
    let mut out = Vec::new();
    let metas: Vec<_> = store.list(&job.savepoints()?).try_collect().await?;
    for m in metas {
        let Some(KeyKind::Savepoint { .. }) = parse(&m.key).map(|p| p.kind) else {
            continue;
        };
        match get_bytes(store, &m.key, MAX_RECORD_BYTES).await {
            Ok(b) => out.push(parse_record(&b, &m.key)?),
            Err(e) if e.kind() == ErrorKind::NotFound => continue, // removed meanwhile
            Err(e) => return Err(e.context(format!("read savepoint {}", m.key))),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A savepoint of another job: `JOB/JOB-ID/NAME`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ForkSource {
    /// The source job's name.
    pub job_name: String,
    /// The source job's id.
    pub job_id: String,
    /// The source's savepoint.
    pub savepoint: String,
}

impl FromStr for ForkSource {
    type Err = Error;

    /// `JOB/JOB-ID/NAME` (a job name may itself hold `/`: the last two segments are the id and
    /// the savepoint's name).
    fn from_str(s: &str) -> Result<Self> {
        let mut it = s.rsplitn(3, '/');
        let (Some(name), Some(id), Some(job)) = (it.next(), it.next(), it.next()) else {
            return Err(Error::invalid(format!(
                "fork source {s:?}: expected JOB/JOB-ID/SAVEPOINT"
            )));
        };
        if job.is_empty() || id.is_empty() {
            return Err(Error::invalid(format!(
                "fork source {s:?}: expected JOB/JOB-ID/SAVEPOINT (a part is empty)"
            )));
        }
        validate_name(name)?;
        JobScope::new(job, id)?;
        Ok(ForkSource {
            job_name: job.to_string(),
            job_id: id.to_string(),
            savepoint: name.to_string(),
        })
    }
}

impl fmt::Display for ForkSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.job_name, self.job_id, self.savepoint)
    }
}

/// The pin one task of a fork holds on a source savepoint.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub struct ForkPin {
    /// The source job's name.
    pub source_job: String,
    /// The source job's id.
    pub source_id: String,
    /// The source savepoint pinned.
    pub savepoint: String,
    /// The fork's job name.
    pub fork_job: String,
    /// The fork's job id.
    pub fork_id: String,
    /// The fork's task.
    pub task: String,
}

impl ForkPin {
    /// Its key, in the source's scope.
    pub fn key(&self) -> Result<BlobKey> {
        JobScope::new(&self.source_job, &self.source_id)?.fork_pin_key(
            &self.savepoint,
            &self.fork_job,
            &self.fork_id,
            &self.task,
        )
    }

    pub(crate) fn of(b: &BorrowedScope, fork_job: &str, fork_id: &str, task: &str) -> Self {
        ForkPin {
            source_job: b.job_name.clone(),
            source_id: b.job_id.clone(),
            savepoint: b.savepoint.clone(),
            fork_job: fork_job.to_string(),
            fork_id: fork_id.to_string(),
            task: task.to_string(),
        }
    }
}

impl fmt::Display for ForkPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} task {} (on {}/{} savepoint {})",
            self.fork_job, self.fork_id, self.task, self.source_job, self.source_id, self.savepoint
        )
    }
}

/// The pins of the snapshots an index borrows through.
pub fn pins_of(
    index: &SnapshotIndex,
    fork_job: &str,
    fork_id: &str,
    task: &str,
) -> BTreeSet<ForkPin> {
    index
        .borrowed_from
        .values()
        .map(|b| ForkPin::of(b, fork_job, fork_id, task))
        .collect()
}

/// The forks that hold a pin on savepoint `name` of `job` (one LIST).
pub async fn dependents(store: &dyn BlobStore, job: &JobScope, name: &str) -> Result<Vec<ForkPin>> {
    let metas: Vec<_> = store.list(&job.fork_pins(name)?).try_collect().await?;
    Ok(metas
        .iter()
        .filter_map(|m| {
            let p = parse(&m.key)?;
            match p.kind {
                KeyKind::ForkPin {
                    savepoint,
                    fork_job,
                    fork_id,
                    task,
                } if savepoint == name => Some(ForkPin {
                    source_job: p.job_name,
                    source_id: p.job_id,
                    savepoint,
                    fork_job,
                    fork_id,
                    task,
                }),
                _ => None,
            }
        })
        .collect())
}

/// What a task records once it has started from a chosen point (`JOB/ID/start-from/TASK.json`):
/// read at each start (the point is applied at most once), by `checkpoints` (a label) and by a
/// fork's backend (the pins it holds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct StartFromRecord {
    /// The point, as configured.
    pub start_from: String,
    /// The head checkpoint the task committed for it.
    pub seq: u64,
    /// The chosen checkpoint's id.
    pub checkpoint_id: String,
    /// A fork's: the pins its task wrote in the source scopes (the backend releases them once
    /// nothing borrows through them, also after a restart).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<ForkPin>,
    /// The id it was applied with (`start-from-id`): the same point is applied again under
    /// another id. Absent: none (and in records of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// The most bytes of a start-from record that are read.
pub const MAX_START_FROM_BYTES: u64 = 1 << 20;

/// Parse a start-from record read from `key`: `Corrupt` names the key and what is wrong
/// (serde_json's nesting limit bounds the depth; callers read at most
/// [`MAX_START_FROM_BYTES`]).
pub fn parse_start_from(bytes: &[u8], key: &BlobKey) -> Result<StartFromRecord> {
    serde_json::from_slice(bytes).map_err(|e| Error::corrupt(format!("{key}: {e}")))
}

/// `task`'s start-from record in `job` (`None`: it has none); a damaged one is `Corrupt`.
pub async fn read_start_from(
    store: &dyn BlobStore,
    job: &JobScope,
    task: &str,
) -> Result<Option<StartFromRecord>> {
    let key = job.start_from_key(task)?;
    match get_bytes(store, &key, MAX_START_FROM_BYTES).await {
        Ok(b) => parse_start_from(&b, &key).map(Some),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.context(format!("read {key}"))),
    }
}
