//! The blob backend's [`TaskRestoreManager`]: restore each store from its committed index,
//! reusing every local byte it can, downloading only what is missing, verifying everything,
//! and swapping the new tree in atomically (DESIGN §8).
//!
//! **Plan, then execute.** [`plan_store`] decides, for each file of the index, whether it is
//! already in the staging dir of an interrupted restore, reusable from a local file (the live
//! store dir, a warm standby's dir, any local checkpoint dir of the store) and proved intact —
//! an immutable file (`*.sst`, `*.blob`) by the hash cache's entry for this very inode, any
//! other by a SHA-256 **recomputed now** — or to be downloaded; and which local files are left over. The plan has
//! totals and prints itself. Free disk space is checked against it before anything is written.
//!
//! **Execute** builds the new tree in `<store dir>.blobsnap-staging`: SST/blob files are
//! hard-linked (unless their mode differs from the index's: never chmod a linked inode), other
//! files are copied (RocksDB may rewrite them in place), downloads stream into a temp file that
//! is SHA-256-verified and fsynced before its rename (large blobs as parallel ranged GETs). A
//! mismatch is retried a bounded number of times, then fails as `Corrupt` naming file and
//! blob. The stores of a task restore at once; each fetches its small files first, then its
//! largest first, and the process's transfer budget (FIFO) shares the wire among the stores
//! and tasks restoring together. A ranged download is hashed in order and flushed while its
//! later ranges are still arriving ([`download_to_file`](crate::blobstore::download_to_file)). When the tree is complete: a `RESTORED` marker (checkpoint id, index key), fsync of
//! the staging tree bottom-up, `renameat2(RENAME_EXCHANGE)` of staging and store dir, fsync of
//! the parent, removal of the old tree. Where the filesystem lacks EXCHANGE, two renames with an
//! intent file, rolled forward by the next restore. A crash at any point leaves the old store
//! or the complete new one; a rerun reuses what staging already holds.
//!
//! A store without a marker (new store, V1 checkpoint, no checkpoint) is reset to an empty
//! directory the same way: only that store's own directory is touched.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::backend::{StoreSpec, TaskContext, TaskRestoreManager};
use crate::blob::snapshot::{load_snapshot, BlobScopes, Expected, LoadedSnapshot, FACTORY_NAME};
use crate::blobstore::{download_to_file_counted, BlobStore, DownloadOptions};
use crate::checkpoint::{Checkpoint, CheckpointId};
use crate::error::{Error, ErrorKind, Result};
use crate::index::FileIndex;
use crate::layout::{JobScope, StoreScope};
use crate::local::hashcache::{CacheKey, HashCache};
use crate::local::lock::StoreDirLock;
use crate::local::scan::is_immutable;
use crate::local::swap::{
    available_bytes, fsync_tree, remove_tree, roll_forward, standby_dir, swap_in,
};

mod fetch;
mod plan;
mod stage;

use fetch::*;

pub use crate::local::swap::staging_dir;
pub use plan::{
    decide, plan_store, proved_by_cache, Inventory, PlanTotals, PlannedFile, Proof, RestorePlan,
    Source, Sources,
};
use stage::prepare_staging;

/// How long a restore waits for a standby to finish applying a commit before it plans
/// without the standby's copy.
pub const STANDBY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Name of the marker file written into a restored store.
pub use crate::index::RESTORED_MARKER;

/// Settings of the restore side.
#[derive(Clone, Debug)]
pub struct RestoreSettings {
    /// Files of one store downloaded at once (what is on the wire is bounded by the store's
    /// transfer budget, [`LimitStore`](crate::blobstore::limit::LimitStore); this bounds
    /// downloads in hand: 1 fetches, verifies and stages one file after another).
    pub downloads: usize,
    /// Blobs larger than this are fetched as parallel ranged GETs of this size.
    pub part_size: u64,
    /// Ranged GETs in flight per blob.
    pub part_concurrency: usize,
    /// Downloads of one blob that fail verification before the restore fails as `Corrupt`.
    pub max_attempts: u32,
    /// Cancels the restore (also stops when the `restore()` future is dropped).
    pub cancel: CancellationToken,
    /// Prove reusable immutable local files by the store's hash cache (the one the backup
    /// keeps, DESIGN §7) instead of reading them, and record every restored immutable file in
    /// it. Off: every reused file is read whole and its SHA-256 compared.
    pub hash_cache: bool,
    /// Where the hash cache lives (as [`BackupSettings::hash_cache_dir`](crate::blob::commit::backup::BackupSettings::hash_cache_dir); `None`: beside the store dir).
    pub hash_cache_dir: Option<std::path::PathBuf>,
    /// `Some`: a lazy restore ([`crate::local::lazy`]): only the small files are written
    /// before the restore returns; every SST and blob file to download is fetched when RocksDB
    /// first opens it, and all are downloaded in the background as set here. `None` (the
    /// default): the verified full restore.
    pub lazy: Option<crate::local::lazy::Background>,
}

impl Default for RestoreSettings {
    fn default() -> Self {
        RestoreSettings {
            downloads: 16,
            part_size: 16 << 20,
            part_concurrency: 4,
            max_attempts: 3,
            cancel: CancellationToken::new(),
            hash_cache: true,
            hash_cache_dir: None,
            lazy: None,
        }
    }
}

/// Live progress of one store's restore (Samza's `files-to-restore`, `bytes-restored`, …).
#[derive(Debug, Default)]
pub struct RestoreProgress {
    /// Files to download.
    pub files_to_fetch: AtomicU64,
    /// Bytes to download.
    pub bytes_to_fetch: AtomicU64,
    /// Files downloaded so far.
    pub files_fetched: AtomicU64,
    /// Bytes downloaded so far (verified files only).
    pub bytes_fetched: AtomicU64,
    /// Files reused from local disk.
    pub files_reused: AtomicU64,
    /// Their bytes.
    pub bytes_reused: AtomicU64,
}

/// The marker a restore leaves in the store dir.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RestoredMarker {
    /// The checkpoint restored (absent for a reset).
    pub checkpoint_id: Option<CheckpointId>,
    /// The index key restored from (absent for a reset).
    pub index: Option<String>,
    /// Whose store this is: the job, its id, the task and the store restored (absent in
    /// markers of older versions). A restore of another task's store over it needs `--force`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The job's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// The task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
}

impl RestoredMarker {
    /// The marker in `dir`, if there is one that parses.
    pub fn read(dir: &Path) -> Option<RestoredMarker> {
        let bytes = std::fs::read(dir.join(RESTORED_MARKER)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// Record in `cache` the SHA-256 of every immutable file of the tree just restored into
/// `dir` (each one verified: downloaded and checked, or proved before it was reused), so that
/// the next restore and the next backup need not read it. A cache that cannot be saved only
/// costs a re-read later: logged, not an error.
fn remember(cache: &HashCache, dir: &Path, files: &[PlannedFile]) {
    for f in files {
        let (Some(sha256), Some(name)) = (f.entry.sha256, f.path.rsplit('/').next()) else {
            continue;
        };
        if !is_immutable(name) {
            continue;
        }
        let path = dir.join(&f.path);
        match std::fs::symlink_metadata(&path) {
            Ok(md) if md.is_file() && md.len() == f.entry.file_metadata.size => {
                let digest = crate::digest::FileDigest {
                    sha256,
                    crc32: f.entry.checksum,
                    size: md.len(),
                };
                cache.insert(CacheKey::of(name, &md), digest);
            }
            _ => {}
        }
    }
    if let Err(e) = cache.save() {
        tracing::warn!(error = %e, "could not save the hash cache after a restore; the next backup reads the files again");
    }
}

/// The blob backend's restore manager for one task.
pub struct BlobRestoreManager {
    blob_store: Arc<dyn BlobStore>,
    task: TaskContext,
    stores: Vec<(StoreSpec, StoreScope)>,
    settings: RestoreSettings,
    loaded: Mutex<Option<HashMap<String, Option<LoadedSnapshot>>>>,
    progress: HashMap<String, Arc<RestoreProgress>>,
    plans: Mutex<BTreeMap<String, PlanTotals>>,
    /// Each store's hash cache, where [`RestoreSettings::hash_cache`] is on.
    caches: HashMap<String, Arc<HashCache>>,
    /// The standby dirs this manager plans to link from, locked from the plan to the end of
    /// that store's execution (a standby does not change them meanwhile).
    standby_locks: Mutex<HashMap<String, StoreDirLock>>,
    /// The swaps of this restore: begun and not yet ended, and the stores swapped in. A swap
    /// runs on a blocking thread to its end even when the restore is cancelled meanwhile
    /// (dropping the future cannot stop it), so a cancel waits for the ones begun and says
    /// which stores were replaced ([`SwapLedger`]).
    swaps: Arc<SwapLedger>,
    /// Whether [`init`](TaskRestoreManager::init) was given a checkpoint naming a snapshot of
    /// any store: a store without one then was added since (worth a warning); without any the
    /// task has committed no state yet (its first run, or only its claim: a line at info).
    had_checkpoint: std::sync::atomic::AtomicBool,
}

/// What the swaps of a restore have done (see `BlobRestoreManager::swaps`).
#[derive(Debug, Default)]
struct SwapLedger {
    /// (swaps begun and not ended, stores swapped in).
    state: Mutex<(usize, Vec<String>)>,
    ended: tokio::sync::Notify,
}

/// Counts a swap from before its blocking work is spawned to its end (wherever the future
/// awaiting it went): records the store when `done` was set.
struct SwapGuard {
    ledger: Arc<SwapLedger>,
    store: String,
    done: bool,
}

impl SwapLedger {
    fn begin(self: &Arc<Self>, store: &str) -> SwapGuard {
        if let Ok(mut st) = self.state.lock() {
            st.0 += 1;
        }
        SwapGuard {
            ledger: Arc::clone(self),
            store: store.to_string(),
            done: false,
        }
    }

    /// Wait until no swap is under way; the stores swapped in so far.
    async fn settled(&self) -> Vec<String> {
        loop {
            let ended = self.ended.notified();
            {
                let st = self
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if st.0 == 0 {
                    return st.1.clone();
                }
            }
            ended.await;
        }
    }
}

impl Drop for SwapGuard {
    fn drop(&mut self) {
        let mut st = self
            .ledger
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.0 = st.0.saturating_sub(1);
        if self.done {
            st.1.push(std::mem::take(&mut self.store));
        }
        drop(st);
        self.ledger.ended.notify_waiters();
    }
}

impl fmt::Debug for BlobRestoreManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobRestoreManager")
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::new(ErrorKind::Io, "restore manager lock poisoned"))
}

impl BlobRestoreManager {
    /// A restore manager for `task`'s `stores`, reading from `blob_store`.
    pub fn new(
        blob_store: Arc<dyn BlobStore>,
        task: TaskContext,
        stores: &[StoreSpec],
        settings: RestoreSettings,
    ) -> Result<Self> {
        let job = JobScope::new(&task.job_name, &task.job_id)?;
        let mut specs = Vec::new();
        let mut progress = HashMap::new();
        let mut caches = HashMap::new();
        for s in stores {
            let s = &s.normalized()?;
            specs.push((s.clone(), job.store(&task.task_name, &s.name)?));
            progress.insert(s.name.clone(), Arc::default());
            if settings.hash_cache {
                let path = HashCache::path_in(&s.dir, settings.hash_cache_dir.as_deref());
                caches.insert(s.name.clone(), Arc::new(HashCache::load(path)));
            }
        }
        Ok(BlobRestoreManager {
            blob_store,
            task,
            stores: specs,
            settings,
            loaded: Mutex::new(None),
            progress,
            plans: Mutex::new(BTreeMap::new()),
            caches,
            standby_locks: Mutex::new(HashMap::new()),
            swaps: Arc::default(),
            had_checkpoint: Default::default(),
        })
    }

    /// Live progress of `store`.
    pub fn progress(&self, store: &str) -> Option<Arc<RestoreProgress>> {
        self.progress.get(store).cloned()
    }

    /// The totals of each store's last plan.
    pub fn plan_totals(&self) -> BTreeMap<String, PlanTotals> {
        self.plans.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Plan every store without changing anything (after [`init`](TaskRestoreManager::init)).
    pub async fn plan(&self) -> Result<Vec<RestorePlan>> {
        let loaded = self.loaded()?;
        let mut plans = Vec::new();
        for (spec, _) in &self.stores {
            let l = loaded.get(&spec.name).cloned().flatten();
            let standby = self.lock_standby(spec).await?;
            let spec = spec.clone();
            let mut caches: Vec<Arc<HashCache>> =
                self.caches.get(&spec.name).cloned().into_iter().collect();
            if standby && self.settings.hash_cache {
                let dir = standby_dir(&spec.dir)?;
                let path = HashCache::path_in(&dir, self.settings.hash_cache_dir.as_deref());
                caches.push(Arc::new(HashCache::load(path)));
            }
            let plan = tokio::task::spawn_blocking(move || {
                let caches: Vec<&HashCache> = caches.iter().map(|c| c.as_ref()).collect();
                plan_store(
                    &spec,
                    l.as_ref().map(|l| l.marker),
                    l.as_ref().map(|l| l.index.as_ref()),
                    Sources {
                        standby,
                        caches: &caches,
                    },
                )
            })
            .await
            .map_err(|e| Error::task("plan", e))??;
            plans.push(plan);
        }
        Ok(plans)
    }

    /// Take the lock of `spec`'s standby dir, if a standby keeps one: `true` when held (the
    /// plan may link from it). A standby holds it only while it applies one commit, so this
    /// waits for that, up to [`STANDBY_WAIT`]; then it plans without the standby.
    async fn lock_standby(&self, spec: &StoreSpec) -> Result<bool> {
        if lock(&self.standby_locks)?.contains_key(&spec.name) {
            return Ok(true);
        }
        let dir = standby_dir(&spec.dir)?;
        if !dir.is_dir() {
            return Ok(false);
        }
        let start = tokio::time::Instant::now();
        loop {
            match StoreDirLock::acquire(&dir) {
                Ok(held) => {
                    lock(&self.standby_locks)?.insert(spec.name.clone(), held);
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::Conflict && start.elapsed() < STANDBY_WAIT => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => {
                    tracing::warn!(store = %spec.name, error = %e, "standby copy not used");
                    return Ok(false);
                }
            }
        }
    }

    fn loaded(&self) -> Result<HashMap<String, Option<LoadedSnapshot>>> {
        lock(&self.loaded)?
            .clone()
            .ok_or_else(|| Error::invalid("restore manager used before init"))
    }

    /// Finish or undo what an interrupted restore left in every store dir (the swap's
    /// roll-forward): [`restore`](TaskRestoreManager::restore) does this first; call it before
    /// [`plan`](Self::plan) when that plan is to be [`execute`](Self::execute)d.
    pub async fn recover(&self) -> Result<()> {
        for (spec, _) in &self.stores {
            let dir = spec.dir.clone();
            tokio::task::spawn_blocking(move || roll_forward(&dir))
                .await
                .map_err(|e| Error::task("recovery", e))??;
        }
        Ok(())
    }

    /// Carry out `plans`, as [`plan`](Self::plan) made them (after [`recover`](Self::recover)):
    /// what was shown is what is done — the reuse decisions are the plan's, nothing is hashed
    /// again. Every store needs its plan, made for the snapshot this manager was `init`-ed with.
    ///
    /// Stops cleanly when [`RestoreSettings::cancel`] is cancelled: the store dirs unchanged,
    /// or — a swap already begun ends on its own thread — the error names the stores that
    /// were swapped in.
    pub async fn execute(&self, plans: Vec<RestorePlan>) -> Result<()> {
        self.cancellable(self.execute_uncancelled(plans)).await
    }

    /// `work`, or on [`RestoreSettings::cancel`] a `Cancelled` error that says what changed:
    /// the swaps begun are waited for (they run to their end on blocking threads), and the
    /// stores they swapped in are named — never "unchanged" for a dir that was replaced.
    async fn cancellable(&self, work: impl std::future::Future<Output = Result<()>>) -> Result<()> {
        tokio::select! {
            r = work => r,
            () = self.settings.cancel.cancelled() => {
                let swapped = self.swaps.settled().await;
                Err(Error::new(
                    ErrorKind::Cancelled,
                    if swapped.is_empty() {
                        "restore cancelled; the store dirs are unchanged".to_string()
                    } else {
                        format!(
                            "restore cancelled after store(s) {} were swapped in (complete and verified); every other store dir is unchanged",
                            swapped.join(", ")
                        )
                    },
                ))
            }
        }
    }

    async fn execute_uncancelled(&self, plans: Vec<RestorePlan>) -> Result<()> {
        let loaded = self.loaded()?;
        let mut by_store: HashMap<String, RestorePlan> =
            plans.into_iter().map(|p| (p.store.clone(), p)).collect();
        let mut stores = Vec::with_capacity(self.stores.len());
        for (spec, scope) in &self.stores {
            let l = loaded.get(&spec.name).cloned().flatten();
            let plan = by_store.remove(&spec.name).ok_or_else(|| {
                Error::invalid(format!("no restore plan given for store {:?}", spec.name))
            })?;
            if plan.marker != l.as_ref().map(|l| l.marker) {
                return Err(Error::invalid(format!(
                    "the plan of store {:?} is for {:?}, the restore for {:?}",
                    spec.name,
                    plan.marker,
                    l.as_ref().map(|l| l.marker)
                )));
            }
            stores.push((spec, scope, l, plan));
        }
        // The stores of a task restore at once: each has `downloads` files in hand, and the
        // process's transfer budget (a FIFO semaphore) shares what is on the wire among them
        // and among the tasks of the process, so none waits for another to finish.
        let done = futures::future::join_all(stores.into_iter().map(
            |(spec, scope, l, plan)| async move {
                let done = self.execute_store(spec, scope, l, plan).await;
                lock(&self.standby_locks)?.remove(&spec.name);
                done
            },
        ))
        .await;
        done.into_iter().collect::<Result<Vec<()>>>().map(drop)
    }

    async fn execute_store(
        &self,
        spec: &StoreSpec,
        scope: &StoreScope,
        loaded: Option<LoadedSnapshot>,
        plan: RestorePlan,
    ) -> Result<()> {
        tracing::info!(store = %spec.name, plan = ?plan.totals, "restore plan");
        // A lazy restore of this dir still running in this process (its database is not open:
        // the dir lock is ours) stops here, before a new tree can be swapped in under it.
        crate::local::lazy::close(&spec.dir);
        crate::crash::point("restore.after-plan");
        lock(&self.plans)?.insert(spec.name.clone(), plan.totals);
        if loaded.is_none() {
            if self.had_checkpoint.load(Ordering::Acquire) {
                tracing::warn!(task = %self.task.task_name, store = %spec.name,
                    "no snapshot for this store in the checkpoint: resetting it to empty");
            } else {
                tracing::info!(task = %self.task.task_name, store = %spec.name,
                    "no checkpoint yet: starting empty");
            }
        }

        // Room for what is downloaded or copied (hard links cost nothing).
        let need: u64 = plan
            .files
            .iter()
            .filter(|f| match &f.source {
                Source::Download => true,
                Source::Local(_) => !is_immutable(&f.path),
                Source::Staged => false,
            })
            .map(|f| f.entry.file_metadata.size)
            .sum();
        if let Some(avail) = available_bytes(&spec.dir) {
            if need > avail {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "restore of store {} needs {need} bytes on disk, {avail} are free; nothing was changed",
                        spec.name
                    ),
                ));
            }
        }

        let progress = self.progress.get(&spec.name).cloned().unwrap_or_default();
        let t = plan.totals;
        progress
            .files_to_fetch
            .store(t.files_to_download, Ordering::Relaxed);
        progress
            .bytes_to_fetch
            .store(t.bytes_to_download, Ordering::Relaxed);
        progress.files_fetched.store(0, Ordering::Relaxed);
        progress.bytes_fetched.store(0, Ordering::Relaxed);
        progress
            .files_reused
            .store(t.files_reused, Ordering::Relaxed);
        progress
            .bytes_reused
            .store(t.bytes_reused, Ordering::Relaxed);

        let staging = staging_dir(&spec.dir)?;
        let blobs = loaded
            .as_ref()
            .map(|l| l.blobs.clone())
            .unwrap_or_else(|| BlobScopes::own(scope.clone()));
        match self
            .stage_and_swap(spec, &blobs, plan, &progress, &staging)
            .await
        {
            Err(e) if e.is_no_space() => {
                let st = staging.clone();
                let _ = tokio::task::spawn_blocking(move || remove_tree(&st)).await;
                Err(e.context(format!(
                    "restore of store {}: the disk is full; the staging dir was removed and the old state kept",
                    spec.name
                )))
            }
            other => other,
        }
    }

    async fn stage_and_swap(
        &self,
        spec: &StoreSpec,
        scope: &BlobScopes,
        plan: RestorePlan,
        progress: &Arc<RestoreProgress>,
        staging: &Path,
    ) -> Result<()> {
        let t = plan.totals;
        let staging = staging.to_path_buf();
        {
            let (staging, plan) = (staging.clone(), plan.clone());
            tokio::task::spawn_blocking(move || prepare_staging(&staging, &plan))
                .await
                .map_err(|e| Error::task("staging", e))??;
        }

        // Files whose blob an earlier lazy restore of this dir found corrupt or missing are
        // downloaded and verified now, before the store opens (issue 46, L4): a blob still
        // bad fails this restore, where `restore-fallback` can act, instead of every start's
        // first read of it.
        let failed = match self.settings.lazy {
            Some(_) => crate::local::lazy::failed_blobs(&spec.dir),
            None => Default::default(),
        };
        let (mut downloads, remote): (Vec<PlannedFile>, Vec<PlannedFile>) = plan
            .files
            .iter()
            .filter(|f| f.source == Source::Download)
            .cloned()
            .partition(|f| {
                self.settings.lazy.is_none()
                    || !is_lazy_candidate(f)
                    || f.entry
                        .blobs
                        .first()
                        .is_some_and(|b| failed.contains(&b.blob_id))
            });
        if !failed.is_empty() {
            tracing::warn!(store = %spec.name, blobs = failed.len(), "an earlier lazy restore of this store could not fetch some files: they are downloaded and verified before it opens");
        }
        // The small files first (one GET each: a store's MANIFEST and OPTIONS do not queue
        // behind its large SSTs), then the largest first, so that the last files in flight
        // are the short ones and the store's ranged GETs keep the budget busy to the end.
        downloads.sort_by_key(|f| {
            let size = f.entry.file_metadata.size;
            if size <= self.settings.part_size {
                (false, size)
            } else {
                (true, u64::MAX - size)
            }
        });
        futures::stream::iter(downloads)
            .map(|f| {
                let progress = Arc::clone(progress);
                let staging = staging.clone();
                async move {
                    // A blob's bytes are counted as they land (a failed attempt takes its
                    // share back out); a file carried inline counts once written.
                    self.download_one(scope, &staging, &f, &progress.bytes_fetched)
                        .await?;
                    crate::crash::point("restore.mid-download");
                    progress.files_fetched.fetch_add(1, Ordering::Relaxed);
                    if f.entry.inline_data.is_some() {
                        progress
                            .bytes_fetched
                            .fetch_add(f.entry.file_metadata.size, Ordering::Relaxed);
                    }
                    Ok::<_, Error>(())
                }
            })
            .buffer_unordered(self.settings.downloads.max(1))
            .try_collect::<Vec<()>>()
            .await
            .map_err(|e| e.context(format!("restore store {}", spec.name)))?;

        let marker = RestoredMarker {
            checkpoint_id: plan.marker.map(|m| m.checkpoint_id),
            index: plan.marker.map(|m| m.to_string()),
            job: Some(self.task.job_name.clone()),
            job_id: Some(self.task.job_id.clone()),
            task: Some(self.task.task_name.clone()),
            store: Some(spec.name.clone()),
        };
        let dir = spec.dir.clone();
        let cache = self.caches.get(&spec.name).cloned();
        let restored = plan.files.clone();
        // A lazy restore: what is not downloaded is remote from here on (nothing remote:
        // the store opens as after a full restore). Before anything is swapped in, every
        // remote blob is proved to exist with its size: a missing or truncated one fails the
        // restore here (NotFound / Corrupt), where `restore-fallback` can act, not at the
        // task's first read of it.
        let remote: Vec<FileIndex> = remote.into_iter().map(|f| f.entry).collect();
        if let Some(t) = lock(&self.plans)?.get_mut(&spec.name) {
            t.files_left_remote = remote.len() as u64;
            t.bytes_left_remote = remote.iter().map(|f| f.file_metadata.size).sum();
        }
        if self.settings.lazy.is_some() {
            self.prove_remote(scope, &remote)
                .await
                .map_err(|e| e.context(format!("restore store {}", spec.name)))?;
        }
        let lazy = match self.settings.lazy {
            Some(bg) if !remote.is_empty() => {
                Some((bg, remote, (self.fetcher(scope), self.tail_reader(scope))))
            }
            _ => None,
        };
        let mut swap = self.swaps.begin(&spec.name);
        tokio::task::spawn_blocking(move || {
            crate::crash::point("restore.before-marker");
            let bytes =
                serde_json::to_vec(&marker).map_err(|e| Error::invalid(format!("marker: {e}")))?;
            let path = staging.join(RESTORED_MARKER);
            std::fs::write(&path, bytes)
                .map_err(Error::io_with(format!("write {}", path.display())))?;
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(Error::io_with(format!("fsync {}", path.display())))?;
            if let Some((_, remote, _)) = &lazy {
                crate::local::lazy::write_pending(&staging, remote)?;
            }
            fsync_tree(&staging)?;
            crate::crash::point("restore.after-marker");
            // An earlier lazy registration of this dir (an in-process restart) stops before
            // the swap, not after it: its fetches write temp files by path under the store
            // dir, which after the swap is the new tree (F13 of the lazy-restore review).
            crate::local::lazy::close(&dir);
            swap_in(&dir, &staging)?;
            swap.done = true;
            drop(swap);
            if let Some(cache) = cache {
                remember(&cache, &dir, &restored);
            }
            match lazy {
                Some((bg, remote, (fetch, tail))) => {
                    crate::local::lazy::register(&dir, remote, fetch, Some(tail), bg)?;
                }
                None => crate::local::lazy::close(&dir),
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::task("swap", e))??;
        tracing::info!(store = %spec.name, files = t.files, downloaded = t.bytes_to_download, reused = t.bytes_reused, "store restored");
        let labels = [
            ("task", self.task.task_name.clone()),
            ("store", spec.name.clone()),
        ];
        metrics::counter!("blobsnap_restore_files_downloaded_total", &labels)
            .increment(t.files_to_download);
        metrics::counter!("blobsnap_restore_bytes_downloaded_total", &labels)
            .increment(t.bytes_to_download);
        metrics::counter!("blobsnap_restore_files_reused_total", &labels).increment(t.files_reused);
        metrics::counter!("blobsnap_restore_bytes_reused_total", &labels).increment(t.bytes_reused);
        Ok(())
    }
}

#[async_trait]
impl TaskRestoreManager for BlobRestoreManager {
    /// Read and check the index of every store that has a marker in `checkpoint`: its bytes
    /// against the marker's SHA-256, its names, its metadata against this job/task/store and
    /// its checkpoint id against the checkpoint's (equal, or older for a marker carried
    /// forward; never newer). Stores without a marker will be reset.
    async fn init(&self, checkpoint: Option<&Checkpoint>) -> Result<()> {
        let v2 = checkpoint.and_then(Checkpoint::as_v2);
        if checkpoint.is_some() && v2.is_none() {
            tracing::warn!(task = %self.task.task_name, "checkpoint is V1: it names no blob snapshots; stores will be reset");
        }
        let mut loaded = HashMap::new();
        for (spec, scope) in &self.stores {
            let entry = match v2.and_then(|c| c.marker(FACTORY_NAME, &spec.name).map(|m| (c.id, m)))
            {
                None => None,
                Some((cp_id, m)) => {
                    let who = Expected {
                        job_name: &self.task.job_name,
                        job_id: &self.task.job_id,
                        task_name: &self.task.task_name,
                        store_name: &spec.name,
                    };
                    let snap = load_snapshot(self.blob_store.as_ref(), &who, m)
                        .await
                        .map_err(|e| e.context(format!("store {}", spec.name)))?;
                    debug_assert_eq!(&snap.scope, scope);
                    // A marker carried forward names an older checkpoint's index (an
                    // unchanged store); one newer than the checkpoint cannot be its own.
                    if snap.index.snapshot_metadata.checkpoint_id > cp_id {
                        return Err(Error::corrupt(format!(
                            "store {}: index {} belongs to checkpoint {}, newer than the checkpoint {cp_id}",
                            spec.name, snap.marker, snap.index.snapshot_metadata.checkpoint_id
                        )));
                    }
                    Some(snap)
                }
            };
            loaded.insert(spec.name.clone(), entry);
        }
        *lock(&self.loaded)? = Some(loaded);
        let any_marker = v2
            .and_then(|c| c.state_checkpoint_markers.get(FACTORY_NAME))
            .is_some_and(|m| !m.is_empty());
        self.had_checkpoint.store(any_marker, Ordering::Release);
        Ok(())
    }

    /// Restore every store; stops cleanly when cancelled (the old state stays in place).
    async fn restore(&self) -> Result<()> {
        // The same three steps as a printed restore: what is planned is what is done.
        let work = async {
            self.recover().await?;
            let plans = self.plan().await?;
            self.execute(plans).await
        };
        let start = tokio::time::Instant::now();
        let r = self.cancellable(work).await;
        if r.is_ok() {
            metrics::histogram!("blobsnap_restore_seconds", "task" => self.task.task_name.clone())
                .record(start.elapsed().as_secs_f64());
        }
        r
    }

    fn last_restore(&self) -> BTreeMap<String, crate::backend::RestoreSummary> {
        self.plan_totals()
            .into_iter()
            .map(|(store, t)| {
                let summary = crate::backend::RestoreSummary {
                    files: t.files,
                    bytes: t.bytes,
                    files_downloaded: t.files_to_download,
                    bytes_downloaded: t.bytes_to_download,
                    files_reused: t.files_reused,
                    bytes_reused: t.bytes_reused,
                    files_from_standby: t.files_from_standby,
                    bytes_from_standby: t.bytes_from_standby,
                    files_left_remote: t.files_left_remote,
                    bytes_left_remote: t.bytes_left_remote,
                };
                (store, summary)
            })
            .collect()
    }

    async fn close(&self) -> Result<()> {
        Ok(())
    }
}
