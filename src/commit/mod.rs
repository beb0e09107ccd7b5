//! The commit manager: drives every state backend of a task through a CheckpointV2 commit
//! (DESIGN §7). It knows only the SPI, never a particular backend.
//!
//! Per commit, one at a time:
//!
//! 1. **sync** — the next [`CheckpointId`] (never ≤ the last committed, whatever the clock
//!    says), the input offsets as given, a flush and a RocksDB checkpoint of every store into
//!    `<store dir>.checkpoints/<id>` — except a store whose change token
//!    ([`StoreEngine::change_token`]: RocksDB's sequence and super-version numbers) has not
//!    moved since its last checkpoint, which gets that directory again (no flush, no new
//!    checkpoint; the blob backend then reads nothing and carries its marker forward) —
//!    every backend's `snapshot`;
//! 2. **upload** — every backend's `upload`, giving store → marker;
//! 3. **write the CheckpointV2** — the commit point, create-only under the next dense sequence
//!    number, so a zombie writer of the same task loses with `Conflict` and must stop;
//! 4. **cleanup** — the checkpoint history is trimmed to the retention (first, so that it never
//!    names a snapshot about to be deleted), then every backend's `cleanup` (a failure is logged
//!    and retried at the next commit: it never un-commits), then local checkpoint dirs older
//!    than the committed one are deleted.
//!
//! At startup [`TaskCommitManager::start`] reads the last checkpoint, claims the task's epoch
//! by writing it again under the next sequence number (a zombie's next commit then collides),
//! and — once the stores are restored — re-runs cleanup for the checkpoint they were restored
//! from ([`TaskCommitManager::with_backends`]).

mod land;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Mutex;

use crate::backend::{Clock, StoreEngine, StoreMarkers, StoreSpec, TaskBackupManager, TaskContext};
use crate::blobstore::DeferredDeletes;
use crate::checkpoint::{
    Checkpoint, CheckpointId, CheckpointIdGen, CheckpointStore, CheckpointV2, Markers, Ssp,
};
use crate::error::{Error, ErrorKind, Result};

/// How many times a starting task claims the next checkpoint number when a writer it is
/// replacing keeps committing the number it tried.
const CLAIM_ATTEMPTS: u32 = 8;

/// One backend as the commit manager sees it: its factory name and its backup manager.
pub struct Backend {
    /// The key of its markers in `state-checkpoint-markers`.
    pub name: String,
    /// Its backup manager for this task.
    pub manager: Arc<dyn TaskBackupManager>,
}

/// A commit between its sync and async stages.
#[derive(Debug)]
pub struct PendingCommit {
    /// Its checkpoint id.
    pub id: CheckpointId,
    offsets: BTreeMap<Ssp, String>,
    dirs: BTreeMap<String, PathBuf>,
    snapshot_markers: BTreeMap<String, StoreMarkers>,
    sync_ms: u64,
}

/// What one commit did.
#[derive(Clone, Debug)]
pub struct CommitReport {
    /// The committed checkpoint.
    pub checkpoint: CheckpointV2,
    /// Its sequence number.
    pub seq: u64,
    /// Time of the sync stage (flush + checkpoint + snapshot), ms.
    pub sync_ms: u64,
    /// Time of the uploads, ms.
    pub upload_ms: u64,
    /// Time to write the checkpoint, ms.
    pub write_ms: u64,
    /// Time of cleanup, ms.
    pub cleanup_ms: u64,
}

struct State {
    seq: u64,
    last: Option<Checkpoint>,
    cleanup_pending: bool,
    /// The task's retained checkpoints as this process knows them, oldest first: sequence
    /// number and checkpoint id — its claim and commits, and after its first trim (which reads
    /// the history) what that trim kept. Later trims delete from here, reading nothing.
    written: std::collections::VecDeque<(u64, String)>,
    /// Whether the history older than `written` has been trimmed (by a listing trim).
    history_trimmed: bool,
    /// The backends' deferred deletes whose snapshots no checkpoint in the history names any
    /// more: they go out with the next trim, in its batch.
    deferred: Vec<DeferredDeletes>,
    /// Per store, the last checkpoint directory made and the store's change token as it was
    /// made: a store whose token has not moved since gets that directory again.
    made: std::collections::HashMap<String, ((u64, u64), PathBuf)>,
    /// Deferred deletes handed over before the trim that removes the checkpoints naming their
    /// snapshots has landed: they join `deferred` once a trim succeeds.
    awaiting_trim: Vec<DeferredDeletes>,
    /// Checkpoint documents of this writer withdrawn because their write ran past the
    /// commit's bound (sequence number, checkpoint id). A withdrawal that failed is retried
    /// before the next write; a withdrawn document found at the next write's number (a
    /// cancelled write that landed late) is withdrawn again, never adopted.
    withdrawn: Vec<(u64, CheckpointId)>,
    /// A withdrawal still to do: its delete failed.
    withdraw_pending: Option<u64>,
}

impl State {
    /// File what a cleanup handed back: ready for the next batch if the history no longer
    /// names its snapshots (`trimmed`), else after the next trim.
    fn hand_over(&mut self, deletes: Vec<DeferredDeletes>, trimmed: bool) {
        let to = if trimmed {
            &mut self.deferred
        } else {
            &mut self.awaiting_trim
        };
        DeferredDeletes::merge(to, deletes);
    }
}

fn next_of(ids: &std::sync::Mutex<CheckpointIdGen>, clock: &dyn Clock) -> Result<CheckpointId> {
    ids.lock()
        .map_err(|_| Error::new(ErrorKind::Io, "checkpoint id generator lock poisoned"))?
        .next(clock.now_millis())
}

/// The identity the history's retention counts (a claim repeats the last checkpoint: same id).
fn id_key(checkpoint: &Checkpoint, seq: u64) -> String {
    checkpoint
        .as_v2()
        .map_or_else(|| format!("v1-{seq}"), |v| v.id.to_string())
}

/// Drives the commits of one task.
pub struct TaskCommitManager {
    task: TaskContext,
    stores: Vec<Arc<dyn StoreEngine>>,
    backends: Vec<Backend>,
    checkpoints: Arc<dyn CheckpointStore>,
    clock: Arc<dyn Clock>,
    writer: String,
    retention: usize,
    /// Tiers of the retention policy (`every D for W`) beyond the newest `retention`.
    tiers: Vec<crate::retention::Tier>,
    /// The task's one id generator, shared with the backends ([`crate::backend::IdSource`]).
    /// Taken alone or under `state` (lock order: `state`, then `ids`), never across an await.
    ids: Arc<std::sync::Mutex<CheckpointIdGen>>,
    state: Mutex<State>,
}

impl std::fmt::Debug for TaskCommitManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskCommitManager")
            .field("task", &self.task)
            .field("writer", &self.writer)
            .finish_non_exhaustive()
    }
}

fn spec_of(engine: &dyn StoreEngine) -> StoreSpec {
    StoreSpec {
        name: engine.name().to_string(),
        dir: engine.dir().to_path_buf(),
    }
}

impl TaskCommitManager {
    /// Read the task's last checkpoint and claim the task: the claim writes that checkpoint
    /// again (or an empty one) under the next sequence number, so that any other live writer
    /// of this task is fenced off. Refuses a checkpoint store that cannot fence unless
    /// `unsafe_no_fencing`. Returns the manager and the checkpoint to restore from.
    ///
    /// The stores are not needed yet (restore comes first): attach them with
    /// [`with_stores`](Self::with_stores), and the backends with
    /// [`with_backends`](Self::with_backends), before the first commit.
    pub async fn start(
        task: TaskContext,
        checkpoints: Arc<dyn CheckpointStore>,
        clock: Arc<dyn Clock>,
        retention: usize,
        unsafe_no_fencing: bool,
    ) -> Result<(Self, Option<Checkpoint>)> {
        if !checkpoints.enforces_exclusive_writes().await? {
            if !unsafe_no_fencing {
                return Err(Error::permanent(format!(
                    "the blob store of the checkpoints does not enforce create-only writes (If-None-Match), so two processes of task {:?} could both commit checkpoint N and the state would be a mix; reading back is no fence, both writers read their own bytes: refusing to run (set unsafe_no_fencing to run anyway, with a single writer guaranteed some other way)",
                    task.task_name
                )));
            }
            tracing::warn!(task = %task.task_name, "running without fencing (unsafe_no_fencing): a zombie writer could commit over this one");
        }
        let writer = format!("{:032x}", rand::random::<u128>());
        // The claim: the latest committed state again under the next number. A writer still
        // running (the zombie this process replaces) may commit that number first: then the
        // newcomer re-reads and claims the next one, a bounded number of times, so that a
        // restarted task is not locked out by the process it replaces.
        let mut attempt = 0;
        let (seq, ids, claim) = loop {
            attempt += 1;
            // Past every document: one an operator removed (`forget --checkpoint`) keeps its
            // number, and the latest checkpoint is then older than it. Listed before the
            // latest is read: a commit landing in between is then the latest read (its number
            // the larger), never passed over.
            let top = checkpoints.latest_seq(&task.task_name).await?.unwrap_or(0);
            let latest = checkpoints.latest(&task.task_name).await?;
            let (seq, last) = match latest {
                Some(c) => (c.seq, Some(c.checkpoint)),
                None => (0, None),
            };
            let seq = seq.max(top);
            let next = next_seq(&task.task_name, seq)?;
            let last_id = last.as_ref().and_then(|c| c.as_v2()).map(|c| c.id);
            // The claim's number is this process's epoch: every id it makes carries it, so no
            // id of an earlier process (committed or not) is ever made again.
            let mut ids = CheckpointIdGen::for_epoch(last_id, next);
            let claim = match last {
                Some(c) => c,
                None => Checkpoint::V2(CheckpointV2 {
                    id: ids.next(clock.now_millis())?,
                    input_offsets: BTreeMap::new(),
                    state_checkpoint_markers: Markers::new(),
                }),
            };
            match checkpoints
                .write(&task.task_name, next, &writer, &claim)
                .await
            {
                Ok(()) => break (next, ids, claim),
                Err(e) if e.kind() == ErrorKind::Conflict && attempt < CLAIM_ATTEMPTS => {
                    tracing::info!(task = %task.task_name, seq = next, attempt, "another writer committed the number this process claimed; claiming the next one");
                }
                Err(e) => {
                    return Err(e.context(format!(
                        "claim task {:?} (attempt {attempt} of {CLAIM_ATTEMPTS})",
                        task.task_name
                    )))
                }
            }
        };
        tracing::info!(task = %task.task_name, seq, writer, "claimed the task");
        let mgr = TaskCommitManager {
            task,
            stores: Vec::new(),
            backends: Vec::new(),
            checkpoints,
            clock,
            writer,
            retention: retention.max(1),
            tiers: Vec::new(),
            ids: Arc::new(std::sync::Mutex::new(ids)),
            state: Mutex::new(State {
                seq,
                last: Some(claim.clone()),
                cleanup_pending: true,
                written: std::collections::VecDeque::from([(seq, id_key(&claim, seq))]),
                history_trimmed: false,
                deferred: Vec::new(),
                awaiting_trim: Vec::new(),
                withdrawn: Vec::new(),
                withdraw_pending: None,
                made: std::collections::HashMap::new(),
            }),
        };
        Ok((mgr, Some(claim)))
    }

    /// Retention tiers (`every D for W`, [`crate::retention`]) on top of the newest
    /// `retention`: the history keeps their union. The blob backend must know
    /// ([`BackupSettings::tiered_retention`](crate::blob::commit::backup::BackupSettings::tiered_retention)).
    pub fn with_retention_tiers(mut self, tiers: Vec<crate::retention::Tier>) -> Self {
        self.tiers = tiers;
        self
    }

    fn policy(&self) -> crate::retention::RetentionPolicy {
        crate::retention::RetentionPolicy {
            last: self.retention,
            tiers: self.tiers.clone(),
        }
    }

    /// Whether a store of the task is still lazily restoring (files remote): while one is,
    /// no checkpoint leaves the history.
    fn hydrating(&self) -> bool {
        self.stores
            .iter()
            .any(|e| crate::local::lazy::status(e.dir()).is_some())
    }

    /// Attach the open stores.
    pub fn with_stores(mut self, stores: Vec<Arc<dyn StoreEngine>>) -> Self {
        self.stores = stores;
        self
    }

    /// Attach the backends, already `init`-ed with `restored`: the checkpoint the task's
    /// stores were restored from. It is the base of the next commit — its startup cleanup
    /// runs for it — which after a restore fallback is an older checkpoint than the claim:
    /// the newer, unrestorable one is never adopted as a diff or dedup base (its blobs may be
    /// the broken ones).
    pub fn with_backends(mut self, backends: Vec<Backend>, restored: Option<Checkpoint>) -> Self {
        for b in &backends {
            b.manager.attach_ids(self.id_source());
        }
        self.backends = backends;
        self.state.get_mut().last = restored;
        self
    }

    /// Every backend keeps at least what the history retains (one source of truth for the
    /// retention, checked before anything is committed or deleted): a backend whose window
    /// is smaller than the history's count, or that does not read a tiered history, would
    /// delete the snapshots of checkpoints the history still offers for restore.
    fn check_windows(&self) -> Result<()> {
        for b in &self.backends {
            let Some((window, tiered)) = b.manager.retention_window() else {
                continue;
            };
            if window < self.retention {
                return Err(Error::invalid(format!(
                    "backend {}: its cleanup keeps the newest {window} snapshots, the checkpoint history of task {} retains {}: it would delete the snapshots of retained checkpoints; give the backend the same retention (BackupSettings::retention = {})",
                    b.name, self.task.task_name, self.retention, self.retention
                )));
            }
            if !self.tiers.is_empty() && !tiered {
                return Err(Error::invalid(format!(
                    "backend {}: the checkpoint history of task {} keeps retention tiers, the backend does not read them: it would delete the snapshots of tier points; set BackupSettings::tiered_retention",
                    b.name, self.task.task_name
                )));
            }
        }
        Ok(())
    }

    /// The next id of the task's generator.
    fn next_id(&self) -> Result<CheckpointId> {
        next_of(&self.ids, self.clock.as_ref())
    }

    /// The generator as the backends take ids from it.
    fn id_source(&self) -> crate::backend::IdSource {
        let (ids, clock) = (Arc::clone(&self.ids), Arc::clone(&self.clock));
        Arc::new(move || next_of(&ids, clock.as_ref()))
    }

    /// This process's writer nonce.
    pub fn writer(&self) -> &str {
        &self.writer
    }

    /// The last committed checkpoint.
    pub async fn last(&self) -> Option<Checkpoint> {
        self.state.lock().await.last.clone()
    }

    /// Send the deferred deletes that are ready (a task that stops calls this after its last
    /// commit; otherwise they go with the next commit's trim). Deletes whose snapshots the
    /// history may still name are left for the sweep.
    pub async fn finish(&self) -> Result<()> {
        let mut st = self.state.lock().await;
        let ready = std::mem::take(&mut st.deferred);
        for (i, d) in ready.iter().enumerate() {
            if let Err(e) = d.delete_with(&[]).await {
                st.hand_over(ready[i..].to_vec(), true);
                return Err(e.context("send the last cleanup's deletes"));
            }
        }
        Ok(())
    }

    /// Make `to` (an earlier or later checkpoint of this task, or a savepoint's) the task's
    /// head: written under the next number, after the claim and before the restore, so the
    /// history stays linear and records the move. Returns its number. `Conflict`: fenced off.
    pub async fn rollback(&self, to: Checkpoint) -> Result<u64> {
        let mut st = self.state.lock().await;
        let seq = next_seq(&self.task.task_name, st.seq)?;
        self.checkpoints
            .write(&self.task.task_name, seq, &self.writer, &to)
            .await
            .map_err(|e| e.context(format!("commit the chosen start point as #{seq}")))?;
        st.seq = seq;
        st.written.push_back((seq, id_key(&to, seq)));
        st.last = Some(to);
        Ok(seq)
    }

    /// Commit: [`sync_stage`](Self::sync_stage) then [`async_stage`](Self::async_stage). A
    /// `Conflict` means another process owns the task: stop.
    pub async fn commit(&self, offsets: BTreeMap<Ssp, String>) -> Result<CommitReport> {
        let pending = self.sync_stage(offsets).await?;
        self.async_stage(pending).await
    }

    /// The synchronous part of a commit, to run while processing is paused: the next id, a
    /// flush and a checkpoint of every store, every backend's `snapshot`. Fast: no network.
    /// At most one commit may be between its sync and async stages at a time (the runtime's
    /// policy: a commit that comes due while one is in flight is skipped, up to a max delay).
    pub async fn sync_stage(&self, offsets: BTreeMap<Ssp, String>) -> Result<PendingCommit> {
        self.check_windows()?;
        let mut st = self.state.lock().await;
        let t = Instant::now();
        let id = self.next_id()?;
        let mut dirs: BTreeMap<String, PathBuf> = BTreeMap::new();
        for engine in &self.stores {
            let spec = spec_of(engine.as_ref());
            let before = engine.change_token();
            if let (Some(token), Some((made_at, made))) = (before, st.made.get(&spec.name)) {
                if token == *made_at && made.is_dir() {
                    // Nothing written, flushed or compacted since: that checkpoint is this
                    // one (the backend reads nothing for it).
                    dirs.insert(spec.name, made.clone());
                    continue;
                }
            }
            // Checkpoint dirs of attempts that never committed (a failed upload, an outage)
            // and `.tmp` dirs of checkpoints a crash cut short: nothing reads them now (one
            // commit at a time), and they would pin deleted SSTs on disk, commit after commit.
            let committed = st.last.as_ref().and_then(|c| c.as_v2()).map(|c| c.id);
            let keep = st.made.get(&spec.name).map(|(_, d)| d.clone());
            remove_failed_checkpoint_dirs(&spec, committed, keep.as_deref());
            let dir = spec.checkpoint_dir(id);
            engine
                .flush()
                .map_err(|e| e.context(format!("flush store {}", spec.name)))?;
            engine
                .checkpoint_to(&dir)
                .map_err(|e| e.context(format!("checkpoint store {}", spec.name)))?;
            // The token after the checkpoint's own flush, if no write came in meanwhile (the
            // sequence number did not move): what this directory holds.
            match (before, engine.change_token()) {
                (Some(b), Some(a)) if a.0 == b.0 => {
                    st.made.insert(spec.name.clone(), (a, dir.clone()));
                }
                _ => {
                    st.made.remove(&spec.name);
                }
            }
            dirs.insert(spec.name, dir);
        }
        let mut snapshot_markers = BTreeMap::new();
        for b in &self.backends {
            snapshot_markers.insert(b.name.clone(), b.manager.snapshot(id)?);
        }
        drop(st);
        Ok(PendingCommit {
            id,
            offsets,
            dirs,
            snapshot_markers,
            sync_ms: t.elapsed().as_millis() as u64,
        })
    }

    /// The asynchronous part of a commit: upload through every backend, write the checkpoint
    /// (the commit point), clean up. Runs concurrently with processing.
    pub async fn async_stage(&self, pending: PendingCommit) -> Result<CommitReport> {
        let PendingCommit {
            id,
            offsets,
            dirs,
            snapshot_markers,
            sync_ms,
        } = pending;
        let mut st = self.state.lock().await;
        // A cleanup that failed (or the startup one) runs before the next upload.
        if st.cleanup_pending {
            if let Some(cp) = st.last.as_ref().and_then(|c| c.as_v2()).cloned() {
                match self.run_cleanup(cp.id, &cp.state_checkpoint_markers).await {
                    Ok(d) => {
                        // Its trim was the last commit's (or, at startup, is still to come).
                        let trimmed = st.history_trimmed;
                        st.hand_over(d, trimmed);
                        st.cleanup_pending = false;
                    }
                    Err(e) => tracing::warn!(error = %e, "cleanup failed again; continuing"),
                }
            } else {
                st.cleanup_pending = false;
            }
        }
        crate::crash::point("commit.before-upload");

        // 2. upload
        let t = Instant::now();
        let mut markers = Markers::new();
        for b in &self.backends {
            let empty = StoreMarkers::new();
            let snap = snapshot_markers.get(&b.name).unwrap_or(&empty);
            let m = b
                .manager
                .upload(id, snap, &dirs)
                .await
                .map_err(|e| e.context(format!("upload of backend {} at {id}", b.name)))?;
            markers.insert(b.name.clone(), m);
        }
        let upload_ms = t.elapsed().as_millis() as u64;
        crate::crash::point("commit.before-checkpoint");
        self.land(st, id, offsets, markers, upload_ms, sync_ms)
            .await
    }

    /// Commit a checkpoint whose uploads were made elsewhere: a Samza job's, through the JNI
    /// plug-in, where Samza's commit manager drives the backends and hands the checkpoint
    /// manager the whole CheckpointV2. The same commit point as [`async_stage`](Self::async_stage)'s
    /// (create-only under the next number: a zombie of the task loses with `Conflict`; a write
    /// of this writer that landed although its call failed is adopted) and the same trim of
    /// the history; with no backend attached there is no bound and no backend cleanup (the
    /// caller's backends bound their uploads and clean up themselves, after this returns).
    /// Ids need not increase: Samza mints them from its clock.
    pub async fn commit_made(&self, checkpoint: CheckpointV2) -> Result<CommitReport> {
        if !self.backends.is_empty() {
            return Err(Error::invalid(
                "commit_made: this commit manager drives backends of its own; commit through it",
            ));
        }
        let st = self.state.lock().await;
        let CheckpointV2 {
            id,
            input_offsets,
            state_checkpoint_markers,
        } = checkpoint;
        self.land(st, id, input_offsets, state_checkpoint_markers, 0, 0)
            .await
    }

    /// Step 3 and 4 of a commit whose markers are known: the bound, the checkpoint write (the
    /// commit point), the trim and the backends' cleanup.
    async fn land(
        &self,
        mut st: tokio::sync::MutexGuard<'_, State>,
        id: CheckpointId,
        offsets: BTreeMap<Ssp, String>,
        markers: Markers,
        upload_ms: u64,
        sync_ms: u64,
    ) -> Result<CommitReport> {
        // The last word of every backend, right before the commit point: the age of the
        // commit's first PUT bounds the whole commit (uploads of every store, index PUTs,
        // other backends, and the checkpoint write itself), not only each store's upload.
        let left = self.commit_bound(id)?;

        // 3. the commit point
        let t = Instant::now();
        let checkpoint = CheckpointV2 {
            id,
            input_offsets: offsets,
            state_checkpoint_markers: markers.clone(),
        };
        let mut seq = next_seq(&self.task.task_name, st.seq)?;
        if let Some(w) = st.withdraw_pending {
            self.withdraw(w).await?;
            st.withdraw_pending = None;
        }
        let doc = Checkpoint::V2(checkpoint.clone());
        if let Err(e) = self.write_bounded(&mut st, id, seq, &doc, left).await {
            if e.kind() != ErrorKind::Conflict {
                return Err(e);
            }
            // Number `seq` is taken. If this writer took it — an earlier commit whose write
            // landed although its call failed (the retry budget ran out on a lost response) —
            // that commit is committed: adopt it, clean up for it, and commit this one next.
            // Anyone else's document there means this writer is fenced off.
            let Some(landed) = self.own_landed(seq).await? else {
                return Err(e);
            };
            let landed_id = landed.as_v2().map(|c| c.id);
            if st
                .withdrawn
                .iter()
                .any(|(s, i)| *s == seq && Some(*i) == landed_id)
            {
                // A write this writer cancelled past its bound landed after all: it was never
                // committed (a sweep may have taken what it names). Withdraw it again and
                // write this commit at its number.
                self.withdraw(seq).await?;
                let left = self.commit_bound(id)?;
                self.write_bounded(&mut st, id, seq, &doc, left).await?;
                return self
                    .committed(st, id, seq, checkpoint, markers, upload_ms, t, sync_ms)
                    .await;
            }
            tracing::info!(task = %self.task.task_name, seq, "an earlier checkpoint write of this writer had landed; adopted it as committed");
            st.seq = seq;
            st.written.push_back((seq, id_key(&landed, seq)));
            if let Some(v2) = landed.as_v2() {
                match self.run_cleanup(v2.id, &v2.state_checkpoint_markers).await {
                    // The trim for the adopted checkpoint is this commit's, still to come.
                    Ok(d) => st.hand_over(d, false),
                    Err(ce) => {
                        tracing::warn!(error = %ce, "cleanup for the adopted checkpoint failed; the next cleanup covers it")
                    }
                }
            }
            st.last = Some(landed);
            seq = next_seq(&self.task.task_name, seq)?;
            // The adoption took time: this commit's bound is checked again.
            let left = self.commit_bound(id)?;
            self.write_bounded(&mut st, id, seq, &doc, left).await?;
        }
        self.committed(st, id, seq, checkpoint, markers, upload_ms, t, sync_ms)
            .await
    }
}

/// Delete `<store dir>.checkpoints/<id>` dirs newer than `committed` (every one, with no
/// commit yet) — attempts that never committed — and every `.tmp` dir there (a RocksDB
/// checkpoint cut short), but `keep`. Called before a new checkpoint is made, when no upload
/// reads any of them.
fn remove_failed_checkpoint_dirs(
    spec: &StoreSpec,
    committed: Option<CheckpointId>,
    keep: Option<&Path>,
) {
    let Ok(entries) = std::fs::read_dir(spec.checkpoints_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let failed = match name.strip_suffix(".tmp") {
            Some(base) => base.parse::<CheckpointId>().is_ok(),
            None => name
                .parse::<CheckpointId>()
                .is_ok_and(|id| committed.is_none_or(|c| id > c)),
        };
        if failed && keep != Some(e.path().as_path()) {
            tracing::debug!(dir = %e.path().display(), "removing the checkpoint dir of an attempt that never committed");
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                tracing::warn!(dir = %e.path().display(), error = %err, "could not delete an uncommitted checkpoint dir");
            }
            crate::local::lazy::forget_links(&e.path());
        }
    }
}

/// The sequence number after `seq`: a history whose latest number is `u64::MAX` is corrupt
/// (no writer gets there by counting), never wrapped to 0.
fn next_seq(task: &str, seq: u64) -> Result<u64> {
    seq.checked_add(1).ok_or_else(|| {
        Error::corrupt(format!(
            "task {task:?}: checkpoint sequence number {seq} has no successor: the history is corrupt"
        ))
    })
}

#[cfg(test)]
mod seq_tests {
    #[test]
    fn the_largest_sequence_number_is_corrupt_not_wrapped() {
        assert_eq!(super::next_seq("t", 41).unwrap(), 42);
        let e = super::next_seq("t", u64::MAX).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{e}");
    }
}
