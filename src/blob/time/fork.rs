//! Zero-copy forks: a job that starts from a savepoint of **another** job (another job name or
//! job id), reusing that job's blobs without copying a byte (Neon's branches, SlateDB's
//! clones).
//!
//! `[job] start-from = "savepoint:SOURCE-JOB/SOURCE-ID/NAME"`: at its first start each task of
//! the fork
//!
//! 1. writes a **pin** in the source's scope, `savepoints/<NAME>/<fork-job>/<fork-id>/<task>.json`
//!    (one per source savepoint its snapshots borrow through, create-only), then reads the
//!    savepoint again: it must be the very record it forks (a `savepoint rm` racing the pin
//!    is caught by one of the two; meanwhile the source's collectors, seeing a pin without a
//!    record, delete nothing);
//! 2. writes, per store, a fork index in its **own** scope: the source snapshot's files, each
//!    source blob named `borrowed/<alias>/blobs/…`, and a `borrowed-from` table declaring
//!    the source store scope and savepoint of every alias (index format 3);
//! 3. commits a checkpoint with the savepoint's input offsets and the fork's markers as its
//!    head, and restores it the usual way (the blobs are read where they are).
//!
//! Rules that keep it safe (DESIGN §6, §10):
//!
//! - a reader resolves a borrowed id only through a declared alias, only inside the declared
//!   store's `blobs/`, only in another job's scope, and only while the pin exists
//!   ([`crate::blob::snapshot::load_snapshot`]); every other index keeps the rule that it names its own scope;
//! - the source's collectors keep the savepoint's blobs (a savepoint is a root), and
//!   `savepoint rm` refuses while a pin on it exists, naming the forks ([`dependents`]);
//! - the fork's collectors never delete a borrowed blob (they delete only their own scope), and
//!   its cleanup deletes a pin once no retained checkpoint and no savepoint of the fork's task
//!   names a snapshot that borrows through it ([`Release`]);
//! - a fork of a fork carries the declarations of the snapshot it starts from (and pins their
//!   savepoints too), so a chain never depends on a pin it does not hold itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::blob::snapshot::{
    hash_object, load_snapshot, read_index, Expected, LoadedSnapshot, FACTORY_NAME,
};
use crate::blobstore::{BlobKey, BlobStore, PutBody, PutOptions};
use crate::checkpoint::{BlobCheckpointStore, Checkpoint, CheckpointStore as _, CheckpointV2};
use crate::digest::Sha256;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{BorrowedScope, DirIndex, IndexMarker, SnapshotIndex, BORROWED_PREFIX};
use crate::layout::JobScope;
use crate::units::Clock as _;

pub use crate::blob::time::record::{dependents, pins_of, ForkPin, ForkSource};

/// What a fork of one task made.
#[derive(Clone, Debug)]
pub struct ForkedTask {
    /// The fork's first checkpoint: the savepoint's input offsets, the fork's markers.
    pub checkpoint: Checkpoint,
    /// The pins written in source scopes.
    pub pins: BTreeSet<ForkPin>,
    /// Stores forked.
    pub stores: u64,
    /// Files and bytes the fork's indexes borrow (none copied).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Requests sent to the blob store.
    pub requests: u64,
}

/// Fork task `task` of `source` into job `fork_job`/`fork_id` (see the module docs): pins,
/// then one index per store in the fork's scope; returns the checkpoint to commit as the
/// fork's head. `NotFound` when the savepoint or its task is missing; `InvalidInput` when the
/// fork is the source job itself (that is a rollback: `savepoint:NAME`).
///
/// `grace` is the fork job's sweep grace: a fork index left by an earlier attempt is reused
/// only while it is younger than half of it. An older one may be an orphan that a sweep of
/// the fork job is deleting (issue 46, S4-7), so the fork fails (`Conflict`) and asks for
/// that sweep first.
pub async fn fork_task(
    store: &Arc<dyn BlobStore>,
    source: &ForkSource,
    fork_job: &str,
    fork_id: &str,
    task: &str,
    grace: Duration,
) -> Result<ForkedTask> {
    if (source.job_name.as_str(), source.job_id.as_str()) == (fork_job, fork_id) {
        return Err(Error::invalid(format!(
            "start-from savepoint:{source}: that is this job's own savepoint; start from savepoint:{} instead",
            source.savepoint
        )));
    }
    let fork_scope = JobScope::new(fork_job, fork_id)?;
    let src_scope = JobScope::new(&source.job_name, &source.job_id)?;
    let mut requests = 0u64;
    let sp =
        crate::blob::time::savepoint::read(store.as_ref(), &src_scope, &source.savepoint).await?;
    requests += 1;
    let committed = sp.checkpoint_of(task)?.ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!("savepoint {source} has no checkpoint of task {task:?}"),
        )
    })?;
    let v2 = committed.checkpoint.as_v2().ok_or_else(|| {
        Error::invalid(format!(
            "savepoint {source}: task {task:?}'s checkpoint is V1 (no state to fork)"
        ))
    })?;
    let markers = v2
        .state_checkpoint_markers
        .get(FACTORY_NAME)
        .cloned()
        .unwrap_or_default();

    // 1. the source snapshots, and the fork's index of each.
    let mut indexes = Vec::new();
    let (mut files, mut bytes) = (0u64, 0u64);
    for (store_name, marker) in &markers {
        let who = Expected {
            job_name: &source.job_name,
            job_id: &source.job_id,
            task_name: task,
            store_name,
        };
        let snap = load_snapshot(store.as_ref(), &who, marker)
            .await
            .map_err(|e| e.context(format!("savepoint {source}: store {store_name:?}")))?;
        requests += 1 + snap.index.borrowed_from.len() as u64;
        let index = fork_index(&snap, source, fork_job, fork_id)?;
        for (_, f) in index.present_files() {
            files += 1;
            bytes += f.file_metadata.size;
        }
        indexes.push((store_name.clone(), index));
    }

    // 2. the pins (create-only: one left by an earlier try of this very fork is kept as it
    //    is), then the savepoints they pin must still be the ones read.
    let pins: BTreeSet<ForkPin> = indexes
        .iter()
        .flat_map(|(_, i)| pins_of(i, fork_job, fork_id, task))
        .collect();
    let mut created = Vec::new();
    for pin in &pins {
        if write_pin(store.as_ref(), pin).await? {
            created.push(pin.clone());
        }
        requests += 1;
    }
    let mut records: BTreeMap<(String, String, String), crate::blob::time::savepoint::Savepoint> =
        BTreeMap::new();
    records.insert(
        (
            source.job_name.clone(),
            source.job_id.clone(),
            source.savepoint.clone(),
        ),
        sp.clone(),
    );
    for pin in &pins {
        let id = (
            pin.source_job.clone(),
            pin.source_id.clone(),
            pin.savepoint.clone(),
        );
        let scope = JobScope::new(&pin.source_job, &pin.source_id)?;
        requests += 1;
        let now = crate::blob::time::savepoint::read(store.as_ref(), &scope, &pin.savepoint).await;
        let same = match now {
            Ok(n) => records.get(&id).is_none_or(|before| &n == before),
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => {
                return Err(e.context(format!(
                "fork {fork_job}/{fork_id} task {task}: check savepoint {}/{}/{} after pinning it",
                pin.source_job, pin.source_id, pin.savepoint
            )))
            }
        };
        if !same {
            for p in &created {
                if let Ok(k) = p.key() {
                    let _ = store.delete_many(std::slice::from_ref(&k)).await;
                }
            }
            return Err(Error::conflict(format!(
                "fork {fork_job}/{fork_id} task {task}: savepoint {}/{}/{} was removed or replaced while it was being pinned (this fork's new pins withdrawn); start again",
                pin.source_job, pin.source_id, pin.savepoint
            )));
        }
    }

    // 3. the indexes, in the fork's own scope.
    let mut fork_markers = BTreeMap::new();
    for (store_name, index) in &indexes {
        let scope = fork_scope.store(task, store_name)?;
        let bytes = index.to_bytes()?;
        let marker = IndexMarker::of(index.snapshot_metadata.checkpoint_id, &bytes);
        let key = scope.index_key(&marker)?;
        let sha = marker.sha256;
        match store
            .put(
                &key,
                PutBody::Bytes(Bytes::from(bytes)),
                PutOptions::create_only(sha),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Conflict => {
                requests += 3;
                let named = BlobCheckpointStore::new(Arc::clone(store), fork_scope.clone())
                    .history(task, usize::MAX)
                    .await?
                    .iter()
                    .any(|c| {
                        markers_of(&c.checkpoint)
                            .contains(&(store_name.clone(), marker.to_string()))
                    });
                reusable(store.as_ref(), &key, sha, grace, named).await?;
            }
            Err(e) => return Err(e.context(format!("put fork index {key}"))),
        }
        requests += 1;
        fork_markers.insert(store_name.clone(), marker.to_string());
    }
    let mut state = BTreeMap::new();
    if !fork_markers.is_empty() {
        state.insert(FACTORY_NAME.to_string(), fork_markers);
    }
    Ok(ForkedTask {
        checkpoint: Checkpoint::V2(CheckpointV2 {
            id: v2.id,
            input_offsets: v2.input_offsets.clone(),
            state_checkpoint_markers: state,
        }),
        pins,
        stores: markers.len() as u64,
        files,
        bytes,
        requests,
    })
}

/// Whether the fork index at `key`, left by an earlier attempt, may be named again: the same
/// bytes, and either `named` by a retained checkpoint of the fork (a root: no sweep deletes
/// it) or younger than half the sweep's grace (an older orphan may be being deleted by a
/// sweep: a head naming it would name a missing index).
async fn reusable(
    store: &dyn BlobStore,
    key: &BlobKey,
    sha: Sha256,
    grace: Duration,
    named: bool,
) -> Result<()> {
    let meta = store
        .head(key)
        .await
        .map_err(|e| e.context(format!("head fork index {key}")))?;
    let age = meta
        .last_modified
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map(|t| {
            let now = Duration::from_millis(crate::units::SystemClock.now_millis());
            now.saturating_sub(t)
        });
    match age {
        _ if named => {}
        Some(age) if age < grace / 2 => {}
        _ => {
            let age = age.map_or_else(
                || "of unknown age".to_string(),
                |a| format!("{} s old", a.as_secs()),
            );
            return Err(Error::conflict(format!(
                "fork index {key} exists from an earlier attempt ({age}, the sweep's grace is {} s): a sweep of the fork job may be deleting it; run `blobsnap gc` on the fork job, then start again",
                grace.as_secs()
            )));
        }
    }
    let (got, _) = hash_object(store, key).await?;
    if got != sha {
        return Err(Error::conflict(format!(
            "fork index {key} exists with other bytes"
        )));
    }
    Ok(())
}

/// The fork's index of `snap` (a source snapshot): the same files; the source's own blobs
/// named through a new alias; the source's borrowed blobs through the aliases it declares.
fn fork_index(
    snap: &LoadedSnapshot,
    source: &ForkSource,
    fork_job: &str,
    fork_id: &str,
) -> Result<SnapshotIndex> {
    let m = &snap.index.snapshot_metadata;
    let mut borrowed_from = snap.index.borrowed_from.clone();
    let alias = (0u32..)
        .map(|n| n.to_string())
        .find(|a| !borrowed_from.contains_key(a))
        .ok_or_else(|| Error::invalid("no free alias"))?;
    borrowed_from.insert(
        alias.clone(),
        BorrowedScope {
            job_name: source.job_name.clone(),
            job_id: source.job_id.clone(),
            task_name: m.task_name.clone(),
            store_name: m.store_name.clone(),
            savepoint: source.savepoint.clone(),
        },
    );
    // A declaration of the fork's own job (a fork of a fork back into its source) cannot be
    // read: refuse it here, not at the first restore.
    if borrowed_from
        .values()
        .any(|b| (b.job_name.as_str(), b.job_id.as_str()) == (fork_job, fork_id))
    {
        return Err(Error::invalid(format!(
            "savepoint {source} borrows from {fork_job}/{fork_id} itself: a job cannot be forked from its own fork; roll it back with savepoint:NAME of its own"
        )));
    }
    let mut dir = snap.index.dir_index.clone();
    rename_own(&mut dir, &alias);
    let mut index = SnapshotIndex {
        format_version: crate::index::FORMAT_FORK,
        creation_time_millis: snap.index.creation_time_millis,
        snapshot_metadata: crate::index::SnapshotMetadata {
            checkpoint_id: m.checkpoint_id,
            job_name: fork_job.to_string(),
            job_id: fork_id.to_string(),
            task_name: m.task_name.clone(),
            store_name: m.store_name.clone(),
        },
        dir_index: dir,
        prev_snapshot_index_blob_id: None,
        borrowed_from,
    };
    // Only the aliases the files name (an empty store borrows nothing).
    let mut named = BTreeSet::new();
    collect(&index.dir_index, &mut named);
    index.borrowed_from.retain(|a, _| named.contains(a));
    if index.borrowed_from.is_empty() {
        index.format_version = if index
            .present_files()
            .iter()
            .any(|(_, f)| f.inline_data.is_some())
        {
            crate::index::FORMAT_INLINE
        } else {
            crate::index::FORMAT_V1
        };
    }
    index.validate()?;
    Ok(index)
}

fn rename_own(dir: &mut DirIndex, alias: &str) {
    for f in dir
        .files_present
        .iter_mut()
        .chain(dir.files_removed.iter_mut())
    {
        for b in &mut f.blobs {
            if crate::blob::snapshot::BlobScopes::is_own(&b.blob_id) {
                b.blob_id = format!("{BORROWED_PREFIX}{alias}/{}", b.blob_id);
            }
        }
    }
    for d in dir
        .sub_dirs_present
        .iter_mut()
        .chain(dir.sub_dirs_removed.iter_mut())
    {
        rename_own(d, alias);
    }
}

fn collect(dir: &DirIndex, out: &mut BTreeSet<String>) {
    for f in &dir.files_present {
        out.extend(
            f.blobs
                .iter()
                .filter_map(|b| b.borrowed().map(|(a, _)| a.to_string())),
        );
    }
    for d in &dir.sub_dirs_present {
        collect(d, out);
    }
}

/// Write `pin` create-only: `true` if this call made it, `false` if it was there (an earlier
/// try of the same fork).
async fn write_pin(store: &dyn BlobStore, pin: &ForkPin) -> Result<bool> {
    let key = pin.key()?;
    let body = serde_json::to_vec(pin).map_err(|e| Error::invalid(format!("pin: {e}")))?;
    let sha = crate::digest::Sha256::of(&body);
    match store
        .put(
            &key,
            PutBody::Bytes(body.into()),
            PutOptions::create_only(sha),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::Conflict => Ok(false),
        Err(e) => Err(e.context(format!("write fork pin {key}"))),
    }
}

/// A fork task's pins, released once nothing of the task needs them: consulted by the blob
/// backend's cleanup after each commit. A pin is a release candidate once no snapshot in the
/// backend's window borrows through it; it is deleted only after the task's whole retained
/// history and the fork job's savepoints were read and none of their snapshots borrows
/// through it (each index read once per process).
pub struct Release {
    store: Arc<dyn BlobStore>,
    fork_job: String,
    fork_id: String,
    task: String,
    /// Pins this task holds, as far as this process knows (seeded from the snapshots it
    /// loaded).
    held: Mutex<BTreeSet<ForkPin>>,
    /// Marker → the pins its snapshot needs (indexes never change).
    known: Mutex<HashMap<(String, String), BTreeSet<ForkPin>>>,
    /// Checkpoint number → its (store, marker)s (documents never change).
    docs: Mutex<HashMap<u64, Vec<(String, String)>>>,
}

impl Release {
    /// Nothing held yet.
    pub fn new(store: Arc<dyn BlobStore>, fork_job: &str, fork_id: &str, task: &str) -> Self {
        Release {
            store,
            fork_job: fork_job.to_string(),
            fork_id: fork_id.to_string(),
            task: task.to_string(),
            held: Mutex::default(),
            known: Mutex::default(),
            docs: Mutex::default(),
        }
    }

    /// The snapshot `index` is (or was) this task's: the pins it needs are held.
    pub fn note(&self, index: &SnapshotIndex) {
        if index.borrowed_from.is_empty() {
            return;
        }
        if let Ok(mut h) = self.held.lock() {
            h.extend(pins_of(index, &self.fork_job, &self.fork_id, &self.task));
        }
    }

    /// The pins this task wrote when it started as a fork, from its start-from record (one
    /// GET; none for a task that never forked): held until released, also across restarts in
    /// which no loaded snapshot borrows any more.
    pub async fn seed(&self) -> Result<()> {
        let job = JobScope::new(&self.fork_job, &self.fork_id)?;
        let Some(r) =
            crate::blob::time::record::read_start_from(self.store.as_ref(), &job, &self.task)
                .await?
        else {
            return Ok(());
        };
        if let Ok(mut h) = self.held.lock() {
            h.extend(r.pins.into_iter().filter(|p| {
                (p.fork_job.as_str(), p.fork_id.as_str(), p.task.as_str())
                    == (
                        self.fork_job.as_str(),
                        self.fork_id.as_str(),
                        self.task.as_str(),
                    )
            }));
        }
        Ok(())
    }

    /// Whether any pin is held.
    pub fn holds_any(&self) -> bool {
        self.held.lock().map(|h| !h.is_empty()).unwrap_or(false)
    }

    /// Release every held pin that none of `window` (the backend's retained and uploaded
    /// snapshots), none of the task's retained checkpoints and none of the fork's savepoints
    /// needs. Returns the pins deleted.
    pub async fn release_unused<'a>(
        &self,
        window: impl IntoIterator<Item = &'a SnapshotIndex>,
    ) -> Result<Vec<ForkPin>> {
        let held: BTreeSet<ForkPin> = self.held.lock().map(|h| h.clone()).unwrap_or_default();
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let mut needed = BTreeSet::new();
        for i in window {
            needed.extend(pins_of(i, &self.fork_job, &self.fork_id, &self.task));
        }
        let candidates: BTreeSet<ForkPin> = held.difference(&needed).cloned().collect();
        let candidates = self.unneeded(candidates).await?;
        self.release(candidates).await
    }

    /// Of `candidates`, the pins no retained checkpoint of the task and no savepoint of the
    /// fork borrows through.
    async fn unneeded(&self, mut candidates: BTreeSet<ForkPin>) -> Result<BTreeSet<ForkPin>> {
        if candidates.is_empty() {
            return Ok(candidates);
        }
        // The whole history and the savepoints: every snapshot they name.
        let job = JobScope::new(&self.fork_job, &self.fork_id)?;
        let cps = BlobCheckpointStore::new(Arc::clone(&self.store), job.clone());
        let mut roots: Vec<(String, String)> = Vec::new();
        let mut fresh = HashMap::new();
        for (seq, key) in cps.seqs(&self.task).await? {
            let cached = self.docs.lock().ok().and_then(|d| d.get(&seq).cloned());
            let markers = match cached {
                Some(m) => m,
                None => match cps.read(&self.task, seq, &key).await {
                    Ok(c) => markers_of(&c.checkpoint),
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                },
            };
            roots.extend(markers.iter().cloned());
            fresh.insert(seq, markers);
        }
        if let Ok(mut d) = self.docs.lock() {
            *d = fresh;
        }
        roots.extend(self.savepoint_roots(&job).await?);
        self.still_needed(roots, &mut candidates).await?;
        Ok(candidates)
    }

    /// Delete `candidates` (pins nothing borrows through). Returns the pins deleted.
    ///
    /// Nothing made after [`unneeded`](Self::unneeded) decided can need a candidate: the
    /// task's commits run one after another with this (the window holds what they may reuse),
    /// and a savepoint of the fork names a checkpoint still in the history after its record
    /// is written, or another savepoint, and the decision read both. Each pin is still checked
    /// against the fork's savepoints once deleted, as a guard against a second writer of the
    /// task (a store run without fencing). Should one need it, the pin is written again, and
    /// the source's savepoint must still be there and unchanged; if it is not, a collector of
    /// the source may have acted while no pin stood, and the release fails naming the check to
    /// run (issue 46, S4-3: a put-back is never trusted blind).
    async fn release(&self, candidates: BTreeSet<ForkPin>) -> Result<Vec<ForkPin>> {
        let job = JobScope::new(&self.fork_job, &self.fork_id)?;
        let mut released = Vec::new();
        for pin in candidates {
            let key = pin.key()?;
            let source = JobScope::new(&pin.source_job, &pin.source_id)?;
            let before =
                crate::blob::time::savepoint::read(self.store.as_ref(), &source, &pin.savepoint)
                    .await
                    .ok();
            if let Some((_, e)) = self
                .store
                .delete_many(std::slice::from_ref(&key))
                .await?
                .into_iter()
                .next()
            {
                return Err(e.context(format!("release fork pin {key}")));
            }
            let mut again = BTreeSet::from([pin.clone()]);
            if self
                .still_needed(self.savepoint_roots(&job).await?, &mut again)
                .await?
            {
                write_pin(self.store.as_ref(), &pin).await?;
                let now = crate::blob::time::savepoint::read(
                    self.store.as_ref(),
                    &source,
                    &pin.savepoint,
                )
                .await
                .ok();
                if before.is_none() || now != before {
                    return Err(Error::conflict(format!(
                        "fork pin {key} was released while a savepoint of {}/{} made meanwhile needed it, and savepoint {}/{}/{} changed or went before it was written again: the source's collectors may have deleted blobs that savepoint names; run `blobsnap check --read-data --job {} --job-id {}`",
                        self.fork_job, self.fork_id, pin.source_job, pin.source_id, pin.savepoint, self.fork_job, self.fork_id
                    )));
                }
                tracing::warn!(pin = %pin, "a fork pin released while a new savepoint needed it was written again; its source savepoint is unchanged");
                continue;
            }
            if let Ok(mut h) = self.held.lock() {
                h.remove(&pin);
            }
            tracing::info!(pin = %pin, "released a fork pin: no retained snapshot borrows through it");
            released.push(pin);
        }
        Ok(released)
    }

    /// The (store, marker)s the fork job's savepoints name for this task.
    async fn savepoint_roots(&self, job: &JobScope) -> Result<Vec<(String, String)>> {
        let mut roots = Vec::new();
        for sp in crate::blob::time::savepoint::list(self.store.as_ref(), job).await? {
            if let Some(c) = sp.checkpoint_of(&self.task)? {
                roots.extend(markers_of(&c.checkpoint));
            }
        }
        Ok(roots)
    }

    /// Remove from `candidates` every pin a snapshot of `roots` needs; `true` once none is
    /// left.
    async fn still_needed(
        &self,
        roots: Vec<(String, String)>,
        candidates: &mut BTreeSet<ForkPin>,
    ) -> Result<bool> {
        for (store_name, marker) in roots {
            let cached = self
                .known
                .lock()
                .ok()
                .and_then(|k| k.get(&(store_name.clone(), marker.clone())).cloned());
            let pins = match cached {
                Some(p) => p,
                None => {
                    let who = Expected {
                        job_name: &self.fork_job,
                        job_id: &self.fork_id,
                        task_name: &self.task,
                        store_name: &store_name,
                    };
                    // The index alone (its hash checked), not its pins: a pin this
                    // release just deleted is exactly what it asks about.
                    let scope = JobScope::new(&self.fork_job, &self.fork_id)?
                        .store(&self.task, &store_name)?;
                    let index =
                        read_index(self.store.as_ref(), &scope, &marker.parse()?, &who).await?;
                    let p = pins_of(&index, &self.fork_job, &self.fork_id, &self.task);
                    if let Ok(mut k) = self.known.lock() {
                        k.insert((store_name, marker), p.clone());
                    }
                    p
                }
            };
            for p in &pins {
                candidates.remove(p);
            }
            if candidates.is_empty() {
                return Ok(true);
            }
        }
        Ok(candidates.is_empty())
    }
}

/// What [`unpin`] did (or, in a dry run, would do).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Unpinned {
    /// The pins removed (dry run: those that would be).
    pub removed: Vec<ForkPin>,
    /// The pins kept: a retained checkpoint or a savepoint of the fork borrows through them.
    pub kept: Vec<ForkPin>,
}

/// Remove the pins fork `fork_job`/`fork_id` holds on savepoint `name` of `source` (every
/// task's) through which nothing of the fork borrows any more — no retained checkpoint of the
/// task and no savepoint of the fork names a snapshot that borrows from it (a fork whose
/// deployment was deleted, or one that compacted everything it borrowed away). The way out
/// when the source's collectors fail closed on a pin whose savepoint has no record (issue
/// 47); the pins something still borrows through are kept and reported. `NotFound` when the
/// fork holds no pin on it. `dry_run`: nothing deleted.
pub async fn unpin(
    store: Arc<dyn BlobStore>,
    source: &JobScope,
    name: &str,
    fork_job: &str,
    fork_id: &str,
    dry_run: bool,
) -> Result<Unpinned> {
    let mut by_task: BTreeMap<String, BTreeSet<ForkPin>> = BTreeMap::new();
    for p in dependents(store.as_ref(), source, name).await? {
        if p.fork_job == fork_job && p.fork_id == fork_id {
            by_task.entry(p.task.clone()).or_default().insert(p);
        }
    }
    if by_task.is_empty() {
        return Err(Error::not_found(format!(
            "fork {fork_job}/{fork_id} holds no pin on savepoint {name:?} of {}",
            source.scope()
        )));
    }
    // A running fork releases its own pins: what it is uploading now (not yet a root) may
    // borrow through one, and its history moves while this reads it.
    let fork = JobScope::new(fork_job, fork_id)?;
    let now = crate::units::Clock::now(&crate::units::SystemClock);
    if let Some((lease, age)) =
        crate::blob::collect::admin::active_writers(store.as_ref(), &fork, now)
            .await?
            .first()
    {
        return Err(Error::conflict(format!(
            "fork {fork_job}/{fork_id} is running (task {:?} on {} pid {}, its lease {} s old): its tasks release their own pins; stop it, or wait until its lease is older than its grace",
            lease.task,
            lease.host,
            lease.pid,
            age.as_secs()
        )));
    }
    let mut out = Unpinned::default();
    for (task, held) in by_task {
        let r = Release::new(Arc::clone(&store), fork_job, fork_id, &task);
        let unneeded = r.unneeded(held.clone()).await?;
        out.kept.extend(held.difference(&unneeded).cloned());
        if dry_run {
            out.removed.extend(unneeded);
        } else {
            let released = r.release(unneeded.clone()).await?;
            out.kept
                .extend(unneeded.into_iter().filter(|p| !released.contains(p)));
            out.removed.extend(released);
        }
    }
    Ok(out)
}

fn markers_of(c: &Checkpoint) -> Vec<(String, String)> {
    c.as_v2()
        .and_then(|v| v.state_checkpoint_markers.get(FACTORY_NAME))
        .map(|m| m.iter().map(|(s, m)| (s.clone(), m.clone())).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_sources_parse() {
        let s: ForkSource = "word/count/1/before-upgrade".parse().unwrap();
        assert_eq!(
            (s.job_name.as_str(), s.job_id.as_str(), s.savepoint.as_str()),
            ("word/count", "1", "before-upgrade")
        );
        assert_eq!(s.to_string(), "word/count/1/before-upgrade");
        for bad in ["a/b", "/1/x", "a//x", "a/1/", "a/1/.x"] {
            assert!(bad.parse::<ForkSource>().is_err(), "{bad}");
        }
    }
}
