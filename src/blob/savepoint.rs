//! Savepoints: named, user-owned records of one committed checkpoint per task of a job,
//! never collected while they exist (Flink's savepoints, restic's snapshots with a tag).
//!
//! `<job>/<job-id>/savepoints/<name>.json` holds, for every task, the checkpoint's number and
//! its CheckpointV2 document as the task committed it (input offsets and markers: a Samza
//! reader reads it as it is). Nothing is copied: the snapshots stay where the tasks wrote
//! them, and the savepoint is a **root** for both collectors:
//!
//! - the commit manager's cleanup asks [`Pins`] right before it sends each batch delete (one
//!   LIST of `savepoints/`, only when there is something to delete; each pinned index read once
//!   per process) and withholds every index and blob a savepoint names;
//! - the sweep reads every savepoint with the checkpoint histories, and fails closed when one
//!   cannot be read;
//! - both fail closed on a fork's pin (`savepoints/<name>/<fork-job>/<fork-id>/<task>.json`,
//!   [`super::fork`]) whose savepoint has no record ([`list_roots`]).
//!
//! [`create`] writes the record create-only (a name is taken once), then checks that every
//! index and blob it names exists — a checkpoint that left retention while it was being pinned
//! is refused and the record withdrawn. [`remove`] deletes the record; what only it kept alive
//! is then an orphan the sweep takes after its grace.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};

use super::history::{self, CheckpointRef};
use super::{load_snapshot, Expected, FACTORY_NAME};
use crate::blobstore::{get_bytes, BlobKey, BlobStore, DeleteFilter, PutBody, PutOptions};
use crate::checkpoint::{Checkpoint, CommittedCheckpoint};
use crate::digest::Sha256;
use crate::error::{Error, ErrorKind, Result};
use crate::layout::{parse, JobScope, KeyKind};

/// The savepoint record's format.
pub const FORMAT: u32 = 1;

/// At most this many bytes are read of one savepoint record.
const MAX_RECORD_BYTES: u64 = 64 << 20;

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

/// Make savepoint `name` of `job` at `at`: every task's checkpoint that `at` names (a task
/// that has none is refused, naming it, before anything is written). Refused if the name is
/// taken (`Conflict`) or the job has no checkpoint (`NotFound`).
pub async fn create(
    store: &Arc<dyn BlobStore>,
    job_name: &str,
    job_id: &str,
    name: &str,
    at: &CheckpointRef,
) -> Result<Savepoint> {
    validate_name(name)?;
    let job = JobScope::new(job_name, job_id)?;
    let tasks = history::task_names(store.as_ref(), &job).await?;
    if tasks.is_empty() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("job {job_name}/{job_id} has no checkpoint to save"),
        ));
    }
    let mut saved = BTreeMap::new();
    for task in &tasks {
        let r = history::resolve(store, &job, task, at)
            .await
            .map_err(|e| e.context(format!("savepoint {name:?} at {at}")))?;
        saved.insert(
            task.clone(),
            SavedCheckpoint {
                seq: r.committed.seq,
                checkpoint: history::checkpoint_json(&r.committed.checkpoint)?,
            },
        );
    }
    let sp = Savepoint {
        format: FORMAT,
        name: name.to_string(),
        job_name: job_name.to_string(),
        job_id: job_id.to_string(),
        created_millis: crate::backend::Clock::now_millis(&crate::backend::SystemClock),
        at: at.to_string(),
        tasks: saved,
    };
    let bytes = Bytes::from(
        serde_json::to_vec_pretty(&sp).map_err(|e| Error::invalid(format!("savepoint: {e}")))?,
    );
    let key = job.savepoint_key(name)?;
    let taken = || {
        Error::conflict(format!(
            "savepoint {name:?} of {job_name}/{job_id} exists: remove it first (blobsnap savepoint rm) or pick another name"
        ))
    };
    // The create-only PUT is the guard where the server enforces it; where it does not (a
    // store running without fencing), the HEAD keeps a name from being overwritten by a
    // later, sequential create.
    match store.head(&key).await {
        Ok(_) => return Err(taken()),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e.context(format!("savepoint {name:?}: is the name taken?"))),
    }
    store
        .put(
            &key,
            PutBody::Bytes(bytes.clone()),
            PutOptions::create_only(Sha256::of(&bytes)),
        )
        .await
        .map_err(|e| {
            if e.kind() == ErrorKind::Conflict {
                taken()
            } else {
                e.context(format!("write savepoint {key}"))
            }
        })?;
    // The record is a root from here on; what it names must still exist (a checkpoint that
    // left retention while being pinned may have lost its blobs to a cleanup).
    if let Err(e) = check_present(store.as_ref(), &sp).await {
        let _ = store.delete_many(std::slice::from_ref(&key)).await;
        return Err(e.context(format!(
            "savepoint {name:?} withdrawn: a checkpoint it names is no longer whole (it left retention while being saved?); save a newer one"
        )));
    }
    Ok(sp)
}

/// Every index `sp` names parses and every blob it lists exists (HEAD, 16 at a time).
pub async fn check_present(store: &dyn BlobStore, sp: &Savepoint) -> Result<()> {
    for (task, store_name, marker) in sp.markers()? {
        let who = Expected {
            job_name: &sp.job_name,
            job_id: &sp.job_id,
            task_name: &task,
            store_name: &store_name,
        };
        let snap = load_snapshot(store, &who, &marker).await?;
        let keys: Vec<BlobKey> = snap
            .index
            .present_files()
            .into_iter()
            .flat_map(|(_, f)| {
                f.blobs
                    .iter()
                    .map(|b| b.blob_id.clone())
                    .collect::<Vec<_>>()
            })
            .map(|id| snap.blobs.key(&id))
            .collect::<Result<_>>()?;
        futures::stream::iter(keys)
            .map(|k| async move { store.head(&k).await.map_err(|e| e.context(format!("{k}"))) })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await?;
    }
    Ok(())
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

fn parse_record(bytes: &[u8], key: &BlobKey) -> Result<Savepoint> {
    let sp: Savepoint = serde_json::from_slice(bytes)
        .map_err(|e| Error::corrupt(format!("savepoint {key}: {e}")))?;
    if sp.format != FORMAT {
        return Err(Error::corrupt(format!(
            "savepoint {key}: format {} (this blobsnap reads {FORMAT})",
            sp.format
        )));
    }
    Ok(sp)
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

/// Every savepoint of `job`, for a collector: as [`list`], and also the forks' pins (one
/// listing of `savepoints/` reads both). A pin whose savepoint has no record — a `savepoint
/// rm` in flight or interrupted while a fork pinned it — fails the call (`Conflict`): what the
/// record named is unknown, so the collector deletes nothing until it is resolved.
pub async fn list_roots(store: &dyn BlobStore, job: &JobScope) -> Result<Vec<Savepoint>> {
    let mut out = Vec::new();
    let mut pinned = BTreeMap::new();
    let metas: Vec<_> = store.list(&job.savepoints()?).try_collect().await?;
    for m in metas {
        match parse(&m.key).map(|p| p.kind) {
            Some(KeyKind::Savepoint { .. }) => {
                match get_bytes(store, &m.key, MAX_RECORD_BYTES).await {
                    Ok(b) => out.push(parse_record(&b, &m.key)?),
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(e.context(format!("read savepoint {}", m.key))),
                }
            }
            Some(KeyKind::ForkPin {
                savepoint,
                fork_job,
                fork_id,
                task,
            }) => {
                pinned
                    .entry(savepoint)
                    .or_insert_with(|| format!("{fork_job}/{fork_id} task {task}"));
            }
            _ => {}
        }
    }
    for (name, fork) in pinned {
        if !out.iter().any(|sp| sp.name == name) {
            return Err(Error::conflict(format!(
                "fork {fork} pins savepoint {name:?} of {}, which has no record (a savepoint rm in flight, or one that was interrupted): nothing is deleted while what it kept is unknown; if the rm was interrupted, the fork's pins under {} must go (blobsnap savepoint rm refuses while they exist) before the job's collectors run again",
                job.scope().as_str().trim_end_matches('/'),
                job.fork_pins(&name)?.as_str()
            )));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Delete savepoint `name` (`NotFound` if there is none). Refused (`Conflict`, naming them)
/// while forks hold a pin on it ([`super::fork`]): their snapshots read its blobs. A fork
/// pinning it while it is being removed is caught by one side: the fork checks the record
/// after its pin, and this checks the pins again after the delete and puts the record back.
pub async fn remove(store: &dyn BlobStore, job: &JobScope, name: &str) -> Result<Savepoint> {
    let sp = read(store, job, name).await?;
    let key = job.savepoint_key(name)?;
    let in_use = |forks: Vec<super::fork::ForkPin>| {
        Error::conflict(format!(
            "savepoint {name:?} is in use by {} fork task(s): {}; it can be removed once they no longer borrow from it (their snapshots were rewritten, or the forks deleted)",
            forks.len(),
            forks
                .iter()
                .map(|p| format!("{}/{} task {}", p.fork_job, p.fork_id, p.task))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    let forks = super::fork::dependents(store, job, name).await?;
    if !forks.is_empty() {
        return Err(in_use(forks));
    }
    if let Some((_, e)) = store
        .delete_many(std::slice::from_ref(&key))
        .await?
        .into_iter()
        .next()
    {
        return Err(e.context(format!("delete savepoint {key}")));
    }
    let forks = super::fork::dependents(store, job, name).await?;
    if !forks.is_empty() {
        let bytes = serde_json::to_vec_pretty(&sp)
            .map_err(|e| Error::invalid(format!("savepoint: {e}")))?;
        let sha = Sha256::of(&bytes);
        match store
            .put(
                &key,
                PutBody::Bytes(bytes.into()),
                PutOptions::create_only(sha),
            )
            .await
        {
            Ok(_) => {}
            // Created again meanwhile (by another create): that record stands.
            Err(e) if e.kind() == ErrorKind::Conflict => {}
            Err(e) => return Err(e.context(format!("put back savepoint {key}"))),
        }
        return Err(in_use(forks));
    }
    Ok(sp)
}

/// The keys one store snapshot keeps alive (its index and blobs).
async fn live_keys(
    store: &dyn BlobStore,
    job_name: &str,
    job_id: &str,
    task: &str,
    store_name: &str,
    marker: &str,
) -> Result<HashSet<BlobKey>> {
    let who = Expected {
        job_name,
        job_id,
        task_name: task,
        store_name,
    };
    let snap = load_snapshot(store, &who, marker).await?;
    let mut keys = HashSet::new();
    keys.insert(snap.scope.index_key(&snap.marker)?);
    for (_, f) in snap.index.present_files() {
        for b in &f.blobs {
            keys.insert(snap.blobs.key(&b.blob_id)?);
        }
    }
    Ok(keys)
}

/// (task, store, marker): one store snapshot.
type SnapshotId = (String, String, String);

/// The savepoints of one job as a [`DeleteFilter`]: consulted right before a cleanup's batch
/// delete is sent. Each pinned snapshot's keys are read once per process (indexes never
/// change); the savepoints themselves are listed at every call with something to delete.
pub struct Pins {
    store: Arc<dyn BlobStore>,
    job_name: String,
    job_id: String,
    job: JobScope,
    /// With a tiered retention: this task's retained checkpoints pin too (the backend's
    /// window counts only the newest; older ones the policy keeps are roots as well).
    history_of: Option<String>,
    /// (task, store, marker) → the keys that snapshot keeps alive (indexes never change), for
    /// the roots of the last call.
    known: Mutex<HashMap<SnapshotId, Arc<HashSet<BlobKey>>>>,
    /// Checkpoint number → its (store, marker)s, read once. A document below the newest
    /// number never changes (numbers are dense: the writer writes `n + 1` only once `n` is
    /// committed); the newest may be withdrawn and written again under the same number (a
    /// commit abandoned past its bound), so it is read at every call and kept only once a
    /// newer one is listed.
    docs: Mutex<HashMap<u64, Vec<(String, String)>>>,
}

impl Pins {
    /// The pins of job `job_name`/`job_id` in `store`: its savepoints.
    pub fn new(store: Arc<dyn BlobStore>, job_name: &str, job_id: &str) -> Result<Self> {
        Ok(Pins {
            job: JobScope::new(job_name, job_id)?,
            store,
            job_name: job_name.to_string(),
            job_id: job_id.to_string(),
            history_of: None,
            known: Mutex::default(),
            docs: Mutex::default(),
        })
    }

    /// Also every retained checkpoint of `task` (one LIST of its history per delete; each
    /// document read once, but the newest, read at every delete). Keep one `Pins` for the
    /// task's life: what it has read is what it does not read again.
    pub fn with_history(mut self, task: &str) -> Self {
        self.history_of = Some(task.to_string());
        self
    }

    /// The keys of one snapshot, read once.
    async fn snapshot_keys(&self, id: SnapshotId) -> Result<Arc<HashSet<BlobKey>>> {
        if let Some(l) = self.known.lock().ok().and_then(|k| k.get(&id).cloned()) {
            return Ok(l);
        }
        let l = Arc::new(
            live_keys(
                self.store.as_ref(),
                &self.job_name,
                &self.job_id,
                &id.0,
                &id.1,
                &id.2,
            )
            .await?,
        );
        if let Ok(mut k) = self.known.lock() {
            k.insert(id, Arc::clone(&l));
        }
        Ok(l)
    }

    /// The snapshots the retained history of `task` names: (store, marker).
    async fn history_markers(&self, task: &str) -> Result<Vec<(String, String)>> {
        let cps =
            crate::checkpoint::BlobCheckpointStore::new(Arc::clone(&self.store), self.job.clone());
        let seqs = cps.seqs(task).await?;
        let newest = seqs.last().map(|(seq, _)| *seq);
        let mut out = Vec::new();
        let mut fresh = HashMap::new();
        for (seq, key) in seqs {
            let cached = if Some(seq) == newest {
                None
            } else {
                self.docs.lock().ok().and_then(|d| d.get(&seq).cloned())
            };
            let markers = match cached {
                Some(m) => m,
                None => match cps.read(task, seq, &key).await {
                    Ok(c) => c
                        .checkpoint
                        .as_v2()
                        .and_then(|v| v.state_checkpoint_markers.get(FACTORY_NAME))
                        .map(|m| m.iter().map(|(s, m)| (s.clone(), m.clone())).collect())
                        .unwrap_or_default(),
                    // Trimmed since the listing: no longer a root.
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                },
            };
            out.extend(markers.iter().cloned());
            if Some(seq) != newest {
                fresh.insert(seq, markers);
            }
        }
        if let Ok(mut d) = self.docs.lock() {
            *d = fresh;
        }
        Ok(out)
    }
}

#[async_trait]
impl DeleteFilter for Pins {
    async fn pinned(&self, keys: &[BlobKey]) -> Result<HashSet<BlobKey>> {
        // Which (task, store) areas the doomed keys are in: only their snapshots matter.
        let areas: HashSet<(String, String)> = keys
            .iter()
            .filter_map(|k| match parse(k)?.kind {
                KeyKind::Index { task, store, .. } | KeyKind::Blob { task, store, .. } => {
                    Some((task, store))
                }
                _ => None,
            })
            .collect();
        if areas.is_empty() {
            return Ok(HashSet::new());
        }
        let savepoints = list_roots(self.store.as_ref(), &self.job)
            .await
            .map_err(|e| {
                e.context("read the job's savepoints before a cleanup delete (nothing deleted)")
            })?;
        let doomed: HashSet<&BlobKey> = keys.iter().collect();
        let mut roots: Vec<SnapshotId> = Vec::new();
        for sp in &savepoints {
            roots.extend(sp.markers()?);
        }
        if let Some(task) = &self.history_of {
            let markers = self.history_markers(task).await.map_err(|e| {
                e.context("read the task's retained checkpoints before a cleanup delete (nothing deleted)")
            })?;
            roots.extend(markers.into_iter().map(|(s, m)| (task.clone(), s, m)));
        }
        let mut out = HashSet::new();
        for id in &roots {
            if !areas.contains(&(id.0.clone(), id.1.clone())) {
                continue;
            }
            let live = self.snapshot_keys(id.clone()).await?;
            out.extend(live.iter().filter(|k| doomed.contains(k)).cloned());
        }
        // What is no root any more is not read again: forget its keys.
        let roots: HashSet<&SnapshotId> = roots.iter().collect();
        if let Ok(mut known) = self.known.lock() {
            known.retain(|id, _| roots.contains(id));
        }
        Ok(out)
    }
}
