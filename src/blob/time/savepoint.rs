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
//!   `blob::fork`) whose savepoint has no record ([`list_roots`]).
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

use crate::blob::snapshot::{load_snapshot, Expected, FACTORY_NAME};
use crate::blob::time::history::{self, CheckpointRef};
use crate::blobstore::{get_bytes, BlobKey, BlobStore, DeleteFilter, PutBody, PutOptions};
use crate::digest::Sha256;
use crate::error::{Error, ErrorKind, Result};
use crate::layout::{parse, JobScope, KeyKind};

use crate::blob::time::record::{dependents, ForkPin, MAX_RECORD_BYTES};
pub use crate::blob::time::record::{
    list, list_all, parse_record, read, validate_name, SavedCheckpoint, Savepoint, Unreadable,
    FORMAT,
};

/// The fork tasks of `forks`, for a message: `JOB/ID task T, …`.
fn fork_tasks(forks: &[ForkPin]) -> String {
    forks
        .iter()
        .map(|p| format!("{}/{} task {}", p.fork_job, p.fork_id, p.task))
        .collect::<Vec<_>>()
        .join(", ")
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
    // Every task at once (16 at a time): the longer the resolve, the more of the job's
    // checkpoints leave the history before the record is written (and the re-check below
    // withdraws it).
    let resolved: Result<Vec<(String, SavedCheckpoint)>> = futures::stream::iter(tasks.iter())
        .map(|task| {
            let job = &job;
            async move {
                let r = history::resolve(store, job, task, at)
                    .await
                    .map_err(|e| e.context(format!("savepoint {name:?} at {at}")))?;
                Ok::<_, Error>((
                    task.clone(),
                    SavedCheckpoint {
                        seq: r.committed.seq,
                        checkpoint: history::checkpoint_json(&r.committed.checkpoint)?,
                    },
                ))
            }
        })
        .buffered(16)
        .try_collect()
        .await;
    let resolved = match resolved {
        Ok(r) => r,
        // `#N` is a task's number: say what it means for a job, and what works.
        Err(e) => return Err(history::job_wide(store, &job, at, e).await),
    };
    let saved: BTreeMap<String, SavedCheckpoint> = resolved.into_iter().collect();
    crate::crash::test_point("savepoint.after-resolve");
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
    // The record is a root from here on, for every collector that reads the roots after
    // this. One that read them before may still delete what a checkpoint that left the
    // history meanwhile named (issue 46, S4-1): presence now (below) does not prove it will
    // not. A checkpoint document still in the history after the PUT does: it was a root for
    // every collector that decided before (documents are trimmed, never re-created, and a
    // snapshot's keys are deleted only after its document is gone).
    if let Err(e) = still_retained(store, &job, at, &sp).await {
        let _ = store.delete_many(std::slice::from_ref(&key)).await;
        return Err(e.context(format!(
            "savepoint {name:?} withdrawn: a checkpoint it names left the history while it was being saved; save a newer one"
        )));
    }
    // What it names must still exist (a checkpoint that left retention while being pinned
    // may have lost its blobs to a cleanup).
    if let Err(e) = check_present(store.as_ref(), &sp).await {
        let _ = store.delete_many(std::slice::from_ref(&key)).await;
        return Err(e.context(format!(
            "savepoint {name:?} withdrawn: a checkpoint it names is no longer whole (it left retention while being saved?); save a newer one"
        )));
    }
    Ok(sp)
}

/// After the record's PUT: each task's checkpoint `sp` names is still in the task's history
/// under its number (`at` a savepoint: that savepoint's record still names the same ones).
async fn still_retained(
    store: &Arc<dyn BlobStore>,
    job: &JobScope,
    at: &CheckpointRef,
    sp: &Savepoint,
) -> Result<()> {
    if let CheckpointRef::Savepoint(other) = at {
        let now = read(store.as_ref(), job, other).await?;
        for (task, saved) in &sp.tasks {
            if now.tasks.get(task) != Some(saved) {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("savepoint {other:?} changed or went meanwhile (task {task:?})"),
                ));
            }
        }
        return Ok(());
    }
    let cps = crate::checkpoint::BlobCheckpointStore::new(Arc::clone(store), job.clone());
    futures::stream::iter(sp.tasks.iter())
        .map(|(task, saved)| {
            let cps = &cps;
            async move {
                let key = job.checkpoint_key(task, saved.seq)?;
                let gone = || {
                    Error::new(
                        ErrorKind::NotFound,
                        format!(
                            "checkpoint #{} of task {task:?} is no longer in its history",
                            saved.seq
                        ),
                    )
                };
                match cps.read(task, saved.seq, &key).await {
                    Ok(c) if history::checkpoint_json(&c.checkpoint)? == saved.checkpoint => Ok(()),
                    Ok(_) => Err(gone()),
                    Err(e) if e.kind() == ErrorKind::NotFound => Err(gone()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
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

/// What [`remove_any`] removed (or, in a dry run, would remove).
#[derive(Clone, Debug)]
pub enum Removed {
    /// A readable record.
    Record(Savepoint),
    /// A record that could not be read, and why.
    Unreadable(Unreadable),
}

/// Remove savepoint `name` of `job` whether or not its record can be read (`dry_run`: say
/// what would go, delete nothing). A readable one as [`remove`]; an unreadable one (its
/// reason named) under the same guard for forks' pins: refused (`Conflict`) while a fork
/// pins the name — what the pinned record named is unknown, so the forks must go first.
pub async fn remove_any(
    store: &dyn BlobStore,
    job: &JobScope,
    name: &str,
    dry_run: bool,
) -> Result<Removed> {
    validate_name(name)?;
    match read(store, job, name).await {
        Ok(sp) if dry_run => {
            let forks = dependents(store, job, name).await?;
            if !forks.is_empty() {
                return Err(Error::conflict(format!(
                    "savepoint {name:?} is in use by {} fork task(s); rm would refuse",
                    forks.len()
                )));
            }
            Ok(Removed::Record(sp))
        }
        Ok(_) => remove(store, job, name).await.map(Removed::Record),
        Err(e) if e.kind() == ErrorKind::Corrupt => {
            let key = job.savepoint_key(name)?;
            let forks = dependents(store, job, name).await?;
            if !forks.is_empty() {
                return Err(Error::conflict(format!(
                    "savepoint {name:?} cannot be read ({e}) and {} fork task(s) pin it ({}): remove those forks first (their snapshots may read what it named)",
                    forks.len(),
                    fork_tasks(&forks)
                )));
            }
            let gone = Unreadable {
                key: key.to_string(),
                name: name.to_string(),
                reason: e.to_string(),
            };
            if !dry_run {
                delete_record(store, &key).await?;
            }
            Ok(Removed::Unreadable(gone))
        }
        Err(e) => Err(e),
    }
}

/// Every savepoint of `job`, for a collector: as [`list`], and also the forks' pins (one
/// listing of `savepoints/` reads both). A pin whose savepoint has no record — a `savepoint
/// rm` in flight or interrupted while a fork pinned it — fails the call (`Conflict`): what the
/// record named is unknown, so the collector deletes nothing until it is resolved. A record
/// that cannot be read fails it too (the first one's error).
pub async fn list_roots(store: &dyn BlobStore, job: &JobScope) -> Result<Vec<Savepoint>> {
    let (out, bad) = read_roots(store, job).await?;
    if let Some((_, e)) = bad.into_iter().next() {
        return Err(e);
    }
    Ok(out)
}

/// [`list_roots`] for a report (`usage`): each record that cannot be read (damaged, of a
/// newer format) is named with its error kind instead of failing the call; a pin whose
/// savepoint has no record at all still fails it (`Conflict`).
pub async fn list_roots_partial(
    store: &dyn BlobStore,
    job: &JobScope,
) -> Result<(Vec<Savepoint>, Vec<(Unreadable, ErrorKind)>)> {
    let (out, bad) = read_roots(store, job).await?;
    let bad = bad
        .into_iter()
        .map(|(u, e)| {
            let kind = e.kind();
            (
                Unreadable {
                    key: u.key,
                    name: u.name,
                    reason: e.to_string(),
                },
                kind,
            )
        })
        .collect();
    Ok((out, bad))
}

/// The readable records and the forks' pins of `job` (see [`list_roots`]), and each record
/// that cannot be parsed with its error (its `reason` left empty).
async fn read_roots(
    store: &dyn BlobStore,
    job: &JobScope,
) -> Result<(Vec<Savepoint>, Vec<(Unreadable, Error)>)> {
    let mut out = Vec::new();
    let mut bad = Vec::new();
    let mut pinned = BTreeMap::new();
    let metas: Vec<_> = store.list(&job.savepoints()?).try_collect().await?;
    for m in metas {
        match parse(&m.key).map(|p| p.kind) {
            Some(KeyKind::Savepoint { name }) => {
                match get_bytes(store, &m.key, MAX_RECORD_BYTES).await {
                    Ok(b) => match parse_record(&b, &m.key) {
                        Ok(sp) => out.push(sp),
                        Err(e) => bad.push((
                            Unreadable {
                                key: m.key.to_string(),
                                name,
                                reason: String::new(),
                            },
                            e,
                        )),
                    },
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
                    .or_insert_with(|| (format!("{fork_job}/{fork_id}"), task));
            }
            _ => {}
        }
    }
    // A record that cannot be read is there: its pins are not pins without a record.
    for (name, (fork, task)) in pinned {
        if !out.iter().any(|sp| sp.name == name) && !bad.iter().any(|(u, _)| u.name == name) {
            return Err(Error::conflict(format!(
                "fork {fork} task {task} pins savepoint {name:?} of {}, which has no record (a savepoint rm in flight, or one that was interrupted): nothing is deleted while what it kept is unknown; if the rm was interrupted, the fork's pins under {} must go before the job's collectors run again: `blobsnap savepoint unpin --job {} --job-id {} --name {name} --fork {fork}` removes them once nothing of the fork borrows through them",
                job.scope().as_str().trim_end_matches('/'),
                job.fork_pins(&name)?.as_str(),
                job.names().0,
                job.names().1
            )));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((out, bad))
}

/// Delete savepoint `name` (`NotFound` if there is none). Refused (`Conflict`, naming them)
/// while forks hold a pin on it (`blob::fork`): their snapshots read its blobs. A fork
/// pinning it while it is being removed is caught by one side: the fork checks the record
/// after its pin, and this checks the pins again after the delete (and never puts the
/// record back: a collector may have acted on its absence; the pin without its record keeps
/// every collector failing closed until the fork withdraws it).
pub async fn remove(store: &dyn BlobStore, job: &JobScope, name: &str) -> Result<Savepoint> {
    let sp = read(store, job, name).await?;
    let key = job.savepoint_key(name)?;
    let in_use = |forks: Vec<ForkPin>| {
        let remove = forks.first().map_or(String::new(), |f| {
            format!(
                ": `blobsnap forget --all --job {} --job-id {}`",
                f.fork_job, f.fork_id
            )
        });
        Error::conflict(format!(
            "savepoint {name:?} is in use by {} fork task(s): {}; it can be removed once they no longer borrow from it (their snapshots were rewritten, or the forks deleted{remove})",
            forks.len(),
            fork_tasks(&forks)
        ))
    };
    let forks = dependents(store, job, name).await?;
    if !forks.is_empty() {
        return Err(in_use(forks));
    }
    delete_record(store, &key).await?;
    // A fork that pinned the savepoint between the check and the delete: the record is never
    // put back (issue 46, S4-3: a collector that listed the roots while it was gone may
    // already have taken what it names). A pin without its record makes every collector of
    // this job fail closed; the fork's own re-read finds the record gone and withdraws its pin.
    let forks = dependents(store, job, name).await?;
    if !forks.is_empty() {
        let e = in_use(forks);
        return Err(Error::conflict(format!(
            "savepoint {name:?} was removed, but a fork pinned it meanwhile ({e}); until that fork withdraws its pin (it does when it finds the savepoint gone) or is removed, gc and the job's cleanup refuse to delete anything"
        )));
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
    /// Whether the job's savepoints pin (always, but in a test that shows what they keep).
    savepoints: bool,
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
            savepoints: true,
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

    /// Without the savepoints: a test-only switch that shows what they keep
    /// ([`BackupSettings::savepoint_check`](crate::blob::backup::BackupSettings)). Never in a
    /// job.
    #[doc(hidden)]
    pub fn without_savepoints(mut self) -> Self {
        self.savepoints = false;
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
        let savepoints = if self.savepoints {
            list_roots(self.store.as_ref(), &self.job)
                .await
                .map_err(|e| {
                    e.context("read the job's savepoints before a cleanup delete (nothing deleted)")
                })?
        } else {
            Vec::new()
        };
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

/// Delete the savepoint record at `key` (one request; an error names the key).
async fn delete_record(store: &dyn BlobStore, key: &BlobKey) -> Result<()> {
    match store
        .delete_many(std::slice::from_ref(key))
        .await?
        .into_iter()
        .next()
    {
        Some((_, e)) => Err(e.context(format!("delete savepoint {key}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{BlobCheckpointStore, Checkpoint, CheckpointStore as _, CheckpointV2};

    fn checkpoint(ms: u64) -> Checkpoint {
        Checkpoint::V2(CheckpointV2 {
            id: format!("{ms}-0").parse().unwrap(),
            input_offsets: Default::default(),
            state_checkpoint_markers: Default::default(),
        })
    }

    /// S4-1 of the third protocol review: a collector that trims the checkpoint a create
    /// resolved, after the resolve and before the record lands, decided without the record;
    /// what it deletes afterwards is not seen by a presence check. The create re-reads each
    /// resolved document after its PUT and withdraws the record when one is gone. (A
    /// current-thread runtime: the hook at the point runs on this thread, between the two.)
    #[tokio::test]
    async fn a_checkpoint_trimmed_between_the_resolve_and_the_record_withdraws_the_savepoint() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("store");
        let store: Arc<dyn BlobStore> =
            Arc::new(crate::blobstore::local::LocalStore::new(&root).unwrap());
        let job = JobScope::new("wc", "1").unwrap();
        let cps = BlobCheckpointStore::new(Arc::clone(&store), job.clone());
        for seq in 1..=2 {
            cps.write("Partition 0", seq, "w", &checkpoint(seq * 1000))
                .await
                .unwrap();
        }
        // Undisturbed, the same create succeeds.
        create(&store, "wc", "1", "calm", &CheckpointRef::Latest)
            .await
            .unwrap();
        let doc = root.join(job.checkpoint_key("Partition 0", 2).unwrap().as_str());
        crate::crash::TEST_HOOK.with(|h| {
            *h.borrow_mut() = Some((
                "savepoint.after-resolve",
                Box::new(move || std::fs::remove_file(&doc).unwrap()),
            ))
        });
        let raced = create(&store, "wc", "1", "raced", &CheckpointRef::Latest).await;
        crate::crash::TEST_HOOK.with(|h| *h.borrow_mut() = None);
        let e = raced.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert!(
            e.to_string().contains("withdrawn")
                && e.to_string().contains("no longer in its history"),
            "{e}"
        );
        let gone = read(store.as_ref(), &job, "raced").await.unwrap_err();
        assert_eq!(gone.kind(), ErrorKind::NotFound, "the record was withdrawn");
    }
}
