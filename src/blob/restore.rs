//! The blob backend's [`TaskRestoreManager`]: restore each store from its committed index,
//! reusing every local byte it can, downloading only what is missing, verifying everything,
//! and swapping the new tree in atomically (DESIGN §8).
//!
//! **Plan, then execute.** [`plan_store`] decides, for each file of the index, whether it is
//! already in the staging dir of an interrupted restore, reusable from a local file (the live
//! store dir, any local checkpoint dir of the store) with the same size and a SHA-256
//! **recomputed now**, or to be downloaded; and which local files are left over. The plan has
//! totals and prints itself. Free disk space is checked against it before anything is written.
//!
//! **Execute** builds the new tree in `<store dir>.blobsnap-staging`: SST/blob files are
//! hard-linked (unless their mode differs from the index's: never chmod a linked inode), other
//! files are copied (RocksDB may rewrite them in place), downloads stream into a temp file that
//! is SHA-256-verified and fsynced before its rename (large blobs as parallel ranged GETs). A
//! mismatch is retried a bounded number of times, then fails as `Corrupt` naming file and
//! blob. When the tree is complete: a `RESTORED` marker (checkpoint id, index key), fsync of
//! the staging tree bottom-up, `renameat2(RENAME_EXCHANGE)` of staging and store dir, fsync of
//! the parent, removal of the old tree. Where the filesystem lacks EXCHANGE, two renames with an
//! intent file, rolled forward by the next restore. A crash at any point leaves the old store
//! or the complete new one; a rerun reuses what staging already holds.
//!
//! A store without a marker (new store, V1 checkpoint, no checkpoint) is reset to an empty
//! directory the same way: only that store's own directory is touched.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{load_snapshot, Expected, LoadedSnapshot, FACTORY_NAME};
use crate::backend::{StoreSpec, TaskContext, TaskRestoreManager};
use crate::blobstore::{download_to_file, BlobStore, DownloadOptions};
use crate::checkpoint::{Checkpoint, CheckpointId};
use crate::digest::{hash_file, hash_files_in_parallel, Sha256};
use crate::error::{Error, ErrorKind, Result};
use crate::index::{FileIndex, IndexMarker, SnapshotIndex};
use crate::layout::{JobScope, StoreScope};
use crate::local::scan::is_immutable;

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
}

impl Default for RestoreSettings {
    fn default() -> Self {
        RestoreSettings {
            downloads: 16,
            part_size: 16 << 20,
            part_concurrency: 4,
            max_attempts: 3,
            cancel: CancellationToken::new(),
        }
    }
}

/// Where a file of the restored tree comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Already in the staging dir of an interrupted restore, verified.
    Staged,
    /// A local file with the same size and SHA-256 (recomputed now).
    Local(PathBuf),
    /// The blob store.
    Download,
}

/// One file of the plan.
#[derive(Clone, Debug)]
pub struct PlannedFile {
    /// Path relative to the store dir.
    pub path: String,
    /// Its index entry.
    pub entry: FileIndex,
    /// Where its bytes come from.
    pub source: Source,
}

/// Totals of a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PlanTotals {
    /// Files in the snapshot.
    pub files: u64,
    /// Bytes in the snapshot.
    pub bytes: u64,
    /// Files reused from local disk (live dir, checkpoint dirs, staging).
    pub files_reused: u64,
    /// Their bytes.
    pub bytes_reused: u64,
    /// Files to download.
    pub files_to_download: u64,
    /// Their bytes.
    pub bytes_to_download: u64,
    /// Files in the live store dir that the snapshot does not have (gone after the swap).
    pub files_to_delete: u64,
}

/// What restoring one store will do.
#[derive(Clone, Debug)]
pub struct RestorePlan {
    /// The store.
    pub store: String,
    /// The index restored from (`None`: reset to empty).
    pub marker: Option<IndexMarker>,
    /// Every file of the snapshot.
    pub files: Vec<PlannedFile>,
    /// Every directory of the snapshot (relative, parents first).
    pub dirs: Vec<String>,
    /// Live files not in the snapshot.
    pub leftover: Vec<String>,
    /// Totals.
    pub totals: PlanTotals,
}

impl fmt::Display for RestorePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.totals;
        match &self.marker {
            Some(m) => writeln!(f, "restore store {} from {m}", self.store)?,
            None => writeln!(f, "reset store {} to empty (no snapshot)", self.store)?,
        }
        writeln!(
            f,
            "  {} files, {} bytes: reuse {} files ({} bytes), download {} files ({} bytes), delete {} local files",
            t.files, t.bytes, t.files_reused, t.bytes_reused, t.files_to_download, t.bytes_to_download, t.files_to_delete
        )?;
        for p in &self.files {
            let how = match &p.source {
                Source::Staged => "staged".to_string(),
                Source::Local(from) => format!("reuse {}", from.display()),
                Source::Download => format!("download {}", p.entry.blobs[0].blob_id),
            };
            writeln!(f, "  {:>12}  {}  {how}", p.entry.file_metadata.size, p.path)?;
        }
        for l in &self.leftover {
            writeln!(f, "  {:>12}  {l}  delete", "")?;
        }
        Ok(())
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
}

fn sibling(dir: &Path, suffix: &str) -> Result<PathBuf> {
    let name = dir
        .file_name()
        .ok_or_else(|| Error::invalid(format!("store dir {} has no name", dir.display())))?;
    let mut n = name.to_os_string();
    n.push(suffix);
    Ok(dir.with_file_name(n))
}

/// `<store dir>.blobsnap-staging`
pub fn staging_dir(store_dir: &Path) -> Result<PathBuf> {
    sibling(store_dir, ".blobsnap-staging")
}

fn intent_file(store_dir: &Path) -> Result<PathBuf> {
    sibling(store_dir, ".blobsnap-intent")
}

fn io(what: impl fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// Regular files below `dir`, relative path → (full path, size). Missing dir: empty.
fn list_files(dir: &Path) -> Result<BTreeMap<String, (PathBuf, u64)>> {
    fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, (PathBuf, u64)>) -> Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("list {}", dir.display()), e)),
        };
        for entry in entries {
            let entry = entry.map_err(io(format!("list {}", dir.display())))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let path = entry.path();
            let md =
                std::fs::symlink_metadata(&path).map_err(io(format!("stat {}", path.display())))?;
            let r = format!("{rel}{name}");
            if md.is_dir() {
                walk(&path, &format!("{r}/"), out)?;
            } else if md.is_file() {
                out.insert(r, (path, md.len()));
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out)?;
    Ok(out)
}

/// SHA-256 of each file (`None` if unreadable), on up to as many threads as there are cores.
fn hash_in_parallel(paths: &[PathBuf]) -> HashMap<PathBuf, Option<Sha256>> {
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    paths
        .iter()
        .cloned()
        .zip(hash_files_in_parallel(&refs))
        .map(|(p, d)| (p, d.ok().map(|d| d.sha256)))
        .collect()
}

/// What is on local disk for one store: the files a restore could reuse.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    /// The live store dir: relative path -> (full path, size).
    pub live: BTreeMap<String, (PathBuf, u64)>,
    /// The staging dir of an interrupted restore, the same way.
    pub staged: BTreeMap<String, (PathBuf, u64)>,
    /// Every local file by size — the live dir first, then every local checkpoint dir.
    pub by_size: HashMap<u64, Vec<PathBuf>>,
}

impl Inventory {
    /// List the live, staging and local checkpoint dirs of `spec` (blocking).
    pub fn of(spec: &StoreSpec) -> Result<Inventory> {
        let staged = list_files(&staging_dir(&spec.dir)?)?;
        let live = list_files(&spec.dir)?;
        let mut by_size: HashMap<u64, Vec<PathBuf>> = HashMap::new();
        for (path, size) in live.values() {
            by_size.entry(*size).or_default().push(path.clone());
        }
        let checkpoints = sibling(&spec.dir, ".checkpoints")?;
        if let Ok(entries) = std::fs::read_dir(&checkpoints) {
            for e in entries.flatten() {
                for (path, size) in list_files(&e.path())?.into_values() {
                    by_size.entry(size).or_default().push(path);
                }
            }
        }
        Ok(Inventory {
            live,
            staged,
            by_size,
        })
    }

    /// The likely reuse candidates of `index`: the same path with the same size, staged or
    /// live (hashed first and in parallel: reusing most of a store is bound by this re-hash).
    fn likely(&self, index: &SnapshotIndex) -> Vec<PathBuf> {
        index
            .present_files()
            .into_iter()
            .filter_map(|(path, entry)| {
                let size = entry.file_metadata.size;
                self.staged
                    .get(&path)
                    .filter(|(_, s)| *s == size)
                    .or_else(|| self.live.get(&path).filter(|(_, s)| *s == size))
                    .map(|(p, _)| p.clone())
            })
            .collect()
    }
}

/// Plan the restore of `spec` to `index` (blocking: lists the local dirs and hashes the
/// candidates; the decision is [`decide`]'s).
pub fn plan_store(
    spec: &StoreSpec,
    marker: Option<IndexMarker>,
    index: Option<&SnapshotIndex>,
) -> Result<RestorePlan> {
    let inventory = Inventory::of(spec)?;
    let likely = index.map(|i| inventory.likely(i)).unwrap_or_default();
    let mut hashes: HashMap<PathBuf, Option<Sha256>> = hash_in_parallel(&likely);
    let hash_of = |p: &Path| -> Option<Sha256> {
        *hashes
            .entry(p.to_path_buf())
            .or_insert_with(|| hash_file(p).ok().map(|d| d.sha256))
    };
    decide(&spec.name, marker, index, &inventory, hash_of)
}

/// The restore decision, with no I/O of its own: for each file of `index`, reuse a staged
/// file of the same path, else a local file of the same size (the same path in the live dir
/// first), whose SHA-256 — as `hash_of` computes it (`None`: unreadable) — is the index's;
/// else download it. Live files the snapshot lacks are leftovers. An entry without a SHA-256
/// or with other than one blob is `Corrupt` (a restore must verify every byte).
pub fn decide(
    store: &str,
    marker: Option<IndexMarker>,
    index: Option<&SnapshotIndex>,
    inventory: &Inventory,
    mut hash_of: impl FnMut(&Path) -> Option<Sha256>,
) -> Result<RestorePlan> {
    let Inventory {
        live,
        staged,
        by_size,
    } = inventory;
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    let mut totals = PlanTotals::default();
    if let Some(index) = index {
        fn collect_dirs(d: &crate::index::DirIndex, prefix: &str, out: &mut Vec<String>) {
            for s in &d.sub_dirs_present {
                let p = format!("{prefix}{}", s.dir_name);
                out.push(p.clone());
                collect_dirs(s, &format!("{p}/"), out);
            }
        }
        collect_dirs(&index.dir_index, "", &mut dirs);
        for (path, entry) in index.present_files() {
            let sha = entry.sha256.ok_or_else(|| {
                Error::corrupt(format!(
                    "index entry {path} has no sha256 (a Samza index?): blobsnap restores only verifiable files"
                ))
            })?;
            if entry.blobs.len() != 1 {
                return Err(Error::corrupt(format!(
                    "index entry {path} has {} blobs; blobsnap restores single-blob files",
                    entry.blobs.len()
                )));
            }
            let size = entry.file_metadata.size;
            totals.files += 1;
            totals.bytes += size;
            let source = if staged
                .get(&path)
                .is_some_and(|(p, s)| *s == size && hash_of(p) == Some(sha))
            {
                Source::Staged
            } else {
                // Prefer the same path in the live dir, then any candidate of that size.
                let mut cands: Vec<PathBuf> = Vec::new();
                if let Some((p, s)) = live.get(&path) {
                    if *s == size {
                        cands.push(p.clone());
                    }
                }
                cands.extend(by_size.get(&size).into_iter().flatten().cloned());
                match cands.into_iter().find(|p| hash_of(p) == Some(sha)) {
                    Some(p) => Source::Local(p),
                    None => Source::Download,
                }
            };
            match source {
                Source::Download => {
                    totals.files_to_download += 1;
                    totals.bytes_to_download += size;
                }
                _ => {
                    totals.files_reused += 1;
                    totals.bytes_reused += size;
                }
            }
            files.push(PlannedFile {
                path,
                entry: entry.clone(),
                source,
            });
        }
    }
    let wanted: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let leftover: Vec<String> = live
        .keys()
        .filter(|k| !wanted.contains(k.as_str()))
        .cloned()
        .collect();
    totals.files_to_delete = leftover.len() as u64;
    Ok(RestorePlan {
        store: store.to_owned(),
        marker,
        files,
        dirs,
        leftover,
        totals,
    })
}

fn available_bytes(dir: &Path) -> Option<u64> {
    let mut probe = dir.to_path_buf();
    while !probe.exists() {
        probe = probe.parent()?.to_path_buf();
    }
    rustix::fs::statvfs(&probe)
        .ok()
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
}

fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("fsync {}", dir.display())))
}

fn fsync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io(format!("list {}", dir.display())))? {
        let entry = entry.map_err(io(format!("list {}", dir.display())))?;
        let md = std::fs::symlink_metadata(entry.path())
            .map_err(io(format!("stat {}", entry.path().display())))?;
        if md.is_dir() {
            fsync_tree(&entry.path())?;
        }
    }
    fsync_dir(dir)
}

fn remove_tree(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", dir.display()), e)),
    }
}

/// Finish a swap that an earlier run left half done (the rename fallback): if the intent
/// file exists, the staging dir is complete; move it into place.
fn roll_forward(store_dir: &Path) -> Result<()> {
    let intent = intent_file(store_dir)?;
    let old = sibling(store_dir, ".blobsnap-old")?;
    if !intent.exists() {
        // No swap in progress: an old tree left beside the store dir (a swap whose last step,
        // its removal, did not happen) holds nothing anybody needs.
        return remove_tree(&old);
    }
    let staging = staging_dir(store_dir)?;
    if staging.join(RESTORED_MARKER).exists() {
        // The new tree is complete: whatever `old` holds (a leftover of an earlier swap, or
        // this swap's previous tree after a crash between the two renames) is not needed, and
        // it must go before the store dir can be moved aside.
        remove_tree(&old)?;
        if store_dir.exists() {
            std::fs::rename(store_dir, &old)
                .map_err(io(format!("move {} aside", store_dir.display())))?;
        }
        std::fs::rename(&staging, store_dir)
            .map_err(io(format!("move {} into place", staging.display())))?;
    }
    if let Some(parent) = store_dir.parent() {
        fsync_dir(parent)?;
    }
    std::fs::remove_file(&intent).map_err(io(format!("remove {}", intent.display())))?;
    remove_tree(&old)
}

/// Exchange the complete staging tree with the store dir, atomically.
fn swap_in(store_dir: &Path, staging: &Path) -> Result<()> {
    let parent = store_dir.parent().ok_or_else(|| {
        Error::invalid(format!("store dir {} has no parent", store_dir.display()))
    })?;
    if !store_dir.exists() {
        std::fs::rename(staging, store_dir)
            .map_err(io(format!("move {} into place", staging.display())))?;
        return fsync_dir(parent);
    }
    match rustix::fs::renameat_with(
        rustix::fs::CWD,
        staging,
        rustix::fs::CWD,
        store_dir,
        rustix::fs::RenameFlags::EXCHANGE,
    ) {
        Ok(()) => {
            fsync_dir(parent)?;
            crate::crash::point("restore.after-exchange");
            // `staging` now holds the old tree.
            remove_tree(staging)
        }
        Err(e)
            if e == rustix::io::Errno::INVAL
                || e == rustix::io::Errno::NOSYS
                || e == rustix::io::Errno::OPNOTSUPP =>
        {
            tracing::warn!(dir = %store_dir.display(), "filesystem lacks RENAME_EXCHANGE; swapping with two renames and an intent file");
            let intent = intent_file(store_dir)?;
            std::fs::write(&intent, b"swap").map_err(io(format!("write {}", intent.display())))?;
            fsync_dir(parent)?;
            roll_forward(store_dir)
        }
        Err(e) => Err(Error::io(
            format!(
                "exchange {} with {}",
                staging.display(),
                store_dir.display()
            ),
            std::io::Error::from(e),
        )),
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
        for s in stores {
            specs.push((s.clone(), job.store(&task.task_name, &s.name)?));
            progress.insert(s.name.clone(), Arc::default());
        }
        Ok(BlobRestoreManager {
            blob_store,
            task,
            stores: specs,
            settings,
            loaded: Mutex::new(None),
            progress,
            plans: Mutex::new(BTreeMap::new()),
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
            let spec = spec.clone();
            let plan = tokio::task::spawn_blocking(move || {
                plan_store(
                    &spec,
                    l.as_ref().map(|l| l.marker),
                    l.as_ref().map(|l| l.index.as_ref()),
                )
            })
            .await
            .map_err(|e| Error::task("plan", e))??;
            plans.push(plan);
        }
        Ok(plans)
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
    pub async fn execute(&self, plans: Vec<RestorePlan>) -> Result<()> {
        let loaded = self.loaded()?;
        let mut by_store: HashMap<String, RestorePlan> =
            plans.into_iter().map(|p| (p.store.clone(), p)).collect();
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
            self.execute_store(spec, scope, l, plan).await?;
        }
        Ok(())
    }

    async fn execute_store(
        &self,
        spec: &StoreSpec,
        scope: &StoreScope,
        loaded: Option<LoadedSnapshot>,
        plan: RestorePlan,
    ) -> Result<()> {
        tracing::info!(store = %spec.name, plan = ?plan.totals, "restore plan");
        crate::crash::point("restore.after-plan");
        lock(&self.plans)?.insert(spec.name.clone(), plan.totals);
        if loaded.is_none() {
            tracing::warn!(task = %self.task.task_name, store = %spec.name,
                "no snapshot for this store in the checkpoint: resetting it to empty");
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
        match self
            .stage_and_swap(spec, scope, plan, &progress, &staging)
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
        scope: &StoreScope,
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

        let downloads: Vec<PlannedFile> = plan
            .files
            .iter()
            .filter(|f| f.source == Source::Download)
            .cloned()
            .collect();
        futures::stream::iter(downloads)
            .map(|f| {
                let progress = Arc::clone(progress);
                let staging = staging.clone();
                async move {
                    self.download_one(scope, &staging, &f).await?;
                    crate::crash::point("restore.mid-download");
                    progress.files_fetched.fetch_add(1, Ordering::Relaxed);
                    progress
                        .bytes_fetched
                        .fetch_add(f.entry.file_metadata.size, Ordering::Relaxed);
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
        };
        let dir = spec.dir.clone();
        tokio::task::spawn_blocking(move || {
            crate::crash::point("restore.before-marker");
            let bytes =
                serde_json::to_vec(&marker).map_err(|e| Error::invalid(format!("marker: {e}")))?;
            let path = staging.join(RESTORED_MARKER);
            std::fs::write(&path, bytes).map_err(io(format!("write {}", path.display())))?;
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io(format!("fsync {}", path.display())))?;
            fsync_tree(&staging)?;
            crate::crash::point("restore.after-marker");
            swap_in(&dir, &staging)
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

    async fn download_one(
        &self,
        scope: &StoreScope,
        staging: &Path,
        f: &PlannedFile,
    ) -> Result<()> {
        let blob = &f.entry.blobs[0].blob_id;
        let key = scope.key(blob)?;
        let dest = staging.join(&f.path);
        let tmp = dest.with_file_name(format!(
            ".{}.blobsnap-part",
            dest.file_name().and_then(|n| n.to_str()).unwrap_or("file")
        ));
        let opts = DownloadOptions {
            expected_size: f.entry.file_metadata.size,
            expected_sha256: f.entry.sha256,
            part_size: self.settings.part_size,
            concurrency: self.settings.part_concurrency,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            if self.settings.cancel.is_cancelled() {
                return Err(Error::new(ErrorKind::Cancelled, "restore cancelled"));
            }
            match download_to_file(self.blob_store.as_ref(), &key, &tmp, opts).await {
                Ok(_) => break,
                Err(e)
                    if e.kind() == ErrorKind::Corrupt && attempt < self.settings.max_attempts =>
                {
                    tracing::warn!(file = %f.path, %key, attempt, error = %e, "downloaded blob failed verification; fetching it again");
                }
                Err(e) if matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::NotFound) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e.context(format!(
                        "file {} (blob {key}) after {attempt} attempts",
                        f.path
                    )));
                }
                Err(e) if e.is_transient() && attempt < self.settings.max_attempts => {
                    tracing::warn!(file = %f.path, %key, attempt, error = %e, "download failed; retrying");
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e.context(format!("file {} (blob {key})", f.path)));
                }
            }
        }
        if let Some(mode) = f.entry.file_metadata.mode() {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
                .map_err(io(format!("chmod {}", tmp.display())))?;
        }
        std::fs::rename(&tmp, &dest).map_err(io(format!("rename into {}", dest.display())))
    }
}

/// Make the staging dir hold exactly the plan's staged files, the directories, and the reused
/// local files (linked or copied); downloads are added afterwards.
fn prepare_staging(staging: &Path, plan: &RestorePlan) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    // The staging dir itself must be a directory of ours: a symlink there (or anything else)
    // is removed, never followed.
    match std::fs::symlink_metadata(staging) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => {
            std::fs::remove_file(staging).map_err(io(format!("remove {}", staging.display())))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("stat {}", staging.display()), e)),
    }
    std::fs::create_dir_all(staging).map_err(io(format!("create {}", staging.display())))?;
    let keep: HashSet<&str> = plan
        .files
        .iter()
        .filter(|f| f.source == Source::Staged)
        .map(|f| f.path.as_str())
        .collect();
    let wanted_dirs: HashSet<&str> = plan.dirs.iter().map(String::as_str).collect();
    // One walk that never follows a link (file types from the directory entry, not from the
    // path): staged files of the plan stay, wanted directories are walked, every other entry
    // — a file the plan does not stage, a directory it does not have, a symlink, a FIFO — is
    // removed itself. (A staging dir left by an interrupted restore holds the old tree, which
    // may hold anything.)
    fn prune(dir: &Path, rel: &str, keep: &HashSet<&str>, wanted: &HashSet<&str>) -> Result<()> {
        for e in std::fs::read_dir(dir).map_err(io(format!("list {}", dir.display())))? {
            let e = e.map_err(io(format!("list {}", dir.display())))?;
            let path = e.path();
            let ft = e
                .file_type()
                .map_err(io(format!("stat {}", path.display())))?;
            let r = e
                .file_name()
                .into_string()
                .ok()
                .map(|name| format!("{rel}{name}"));
            if ft.is_dir() {
                match &r {
                    Some(r) if wanted.contains(r.as_str()) => {
                        prune(&path, &format!("{r}/"), keep, wanted)?
                    }
                    _ => remove_tree(&path)?,
                }
            } else if !(ft.is_file() && r.as_deref().is_some_and(|r| keep.contains(r))) {
                std::fs::remove_file(&path).map_err(io(format!("remove {}", path.display())))?;
            }
        }
        Ok(())
    }
    prune(staging, "", &keep, &wanted_dirs)?;
    for d in &plan.dirs {
        let p = staging.join(d);
        std::fs::create_dir_all(&p).map_err(io(format!("create {}", p.display())))?;
    }
    for f in &plan.files {
        let Source::Local(from) = &f.source else {
            continue;
        };
        let dest = staging.join(&f.path);
        let mode = f.entry.file_metadata.mode();
        let src_mode = std::fs::metadata(from)
            .map(|m| m.permissions().mode() & 0o777)
            .map_err(io(format!("stat {}", from.display())))?;
        let linkable = is_immutable(&f.path) && mode.is_none_or(|m| m == src_mode);
        if linkable {
            match std::fs::hard_link(from, &dest) {
                Ok(()) => continue,
                // Another filesystem (EXDEV) or no link support: copy instead.
                Err(e) => {
                    tracing::debug!(from = %from.display(), error = %e, "cannot hard-link; copying")
                }
            }
        }
        std::fs::copy(from, &dest).map_err(io(format!(
            "copy {} to {}",
            from.display(),
            dest.display()
        )))?;
        if let Some(mode) = mode {
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))
                .map_err(io(format!("chmod {}", dest.display())))?;
        }
        // Re-verify the copy: the source could have changed since it was hashed.
        let d = hash_file(&dest)?;
        if Some(d.sha256) != f.entry.sha256 {
            return Err(Error::corrupt(format!(
                "{} changed while being copied for {}",
                from.display(),
                f.path
            )));
        }
        std::fs::File::open(&dest)
            .and_then(|file| file.sync_all())
            .map_err(io(format!("fsync {}", dest.display())))?;
    }
    Ok(())
}

#[async_trait]
impl TaskRestoreManager for BlobRestoreManager {
    /// Read and check the index of every store that has a marker in `checkpoint`: its bytes
    /// against the marker's SHA-256, its names, its metadata against this job/task/store and
    /// its checkpoint id against the checkpoint's. Stores without a marker will be reset.
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
                    if snap.index.snapshot_metadata.checkpoint_id != cp_id {
                        return Err(Error::corrupt(format!(
                            "store {}: index {} belongs to checkpoint {}, the checkpoint is {cp_id}",
                            spec.name, snap.marker, snap.index.snapshot_metadata.checkpoint_id
                        )));
                    }
                    Some(snap)
                }
            };
            loaded.insert(spec.name.clone(), entry);
        }
        *lock(&self.loaded)? = Some(loaded);
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
        tokio::select! {
            r = work => r,
            () = self.settings.cancel.cancelled() => Err(Error::new(ErrorKind::Cancelled, "restore cancelled; the store dirs are unchanged")),
        }
    }

    async fn close(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! [`decide`] alone: no disk, no store — the inventory and the hashes are given.
    use super::*;
    use crate::index::{DirIndex, FileBlob, FileMetadata, SnapshotMetadata};

    fn sha(b: &[u8]) -> Sha256 {
        Sha256::of(b)
    }

    fn file(name: &str, content: &[u8]) -> FileIndex {
        FileIndex {
            file_name: name.into(),
            blobs: vec![FileBlob {
                blob_id: format!("blobs/1-0/{}", sha(content).to_hex()),
                offset: 0,
            }],
            file_metadata: FileMetadata {
                creation_time_millis: 0,
                last_modified_time_millis: 0,
                size: content.len() as u64,
                owner: String::new(),
                group: String::new(),
                permissions: "rw-r--r--".into(),
            },
            checksum: 0,
            sha256: Some(sha(content)),
        }
    }

    fn index(files: Vec<FileIndex>, sub: Vec<DirIndex>) -> SnapshotIndex {
        SnapshotIndex {
            format_version: crate::index::FORMAT_VERSION,
            creation_time_millis: 0,
            snapshot_metadata: SnapshotMetadata {
                checkpoint_id: "1-0".parse().unwrap(),
                job_name: "j".into(),
                job_id: "1".into(),
                task_name: "t".into(),
                store_name: "s".into(),
            },
            dir_index: DirIndex {
                files_present: files,
                sub_dirs_present: sub,
                ..DirIndex::default()
            },
            prev_snapshot_index_blob_id: None,
        }
    }

    /// An inventory of (relative path, size) in the live and staging dirs and of full paths
    /// in checkpoint dirs, and the hashes of every path in it.
    fn inventory(
        live: &[(&str, &[u8])],
        staged: &[(&str, &[u8])],
        checkpoints: &[(&str, &[u8])],
    ) -> (Inventory, HashMap<PathBuf, Sha256>) {
        let mut inv = Inventory::default();
        let mut hashes = HashMap::new();
        for (rel, bytes) in live {
            let p = PathBuf::from("/live").join(rel);
            inv.live
                .insert(rel.to_string(), (p.clone(), bytes.len() as u64));
            inv.by_size
                .entry(bytes.len() as u64)
                .or_default()
                .push(p.clone());
            hashes.insert(p, sha(bytes));
        }
        for (rel, bytes) in staged {
            let p = PathBuf::from("/staging").join(rel);
            inv.staged
                .insert(rel.to_string(), (p.clone(), bytes.len() as u64));
            hashes.insert(p, sha(bytes));
        }
        for (full, bytes) in checkpoints {
            let p = PathBuf::from(full);
            inv.by_size
                .entry(bytes.len() as u64)
                .or_default()
                .push(p.clone());
            hashes.insert(p, sha(bytes));
        }
        (inv, hashes)
    }

    fn plan_of(
        idx: &SnapshotIndex,
        inv: &Inventory,
        hashes: &HashMap<PathBuf, Sha256>,
    ) -> (RestorePlan, Vec<PathBuf>) {
        let mut asked = Vec::new();
        let plan = decide("s", None, Some(idx), inv, |p| {
            asked.push(p.to_path_buf());
            hashes.get(p).copied()
        })
        .unwrap();
        (plan, asked)
    }

    fn source_of<'a>(plan: &'a RestorePlan, path: &str) -> &'a Source {
        &plan.files.iter().find(|f| f.path == path).unwrap().source
    }

    #[test]
    fn staged_then_same_path_then_any_local_copy_then_download() {
        let idx = index(
            vec![
                file("000001.sst", b"one"),
                file("000002.sst", b"two two"),
                file("000003.sst", b"three three"),
                file("MANIFEST-000004", b"new manifest"),
            ],
            vec![DirIndex {
                dir_name: "sub".into(),
                files_present: vec![file("x", b"xx")],
                ..DirIndex::default()
            }],
        );
        let (inv, hashes) = inventory(
            // 000001 live with the right bytes; 000002 live but changed (same size);
            // MANIFEST-000004 live, stale (other size); an old file the snapshot lacks.
            &[
                ("000001.sst", b"one"),
                ("000002.sst", b"two TWO"),
                ("MANIFEST-000004", b"old"),
                ("000000.log", b"log"),
            ],
            // 000003 staged by an interrupted restore.
            &[("000003.sst", b"three three")],
            // 000002's bytes in a local checkpoint dir.
            &[("/live.checkpoints/1-0/000002.sst", b"two two")],
        );
        let (plan, _) = plan_of(&idx, &inv, &hashes);
        assert_eq!(
            source_of(&plan, "000001.sst"),
            &Source::Local("/live/000001.sst".into())
        );
        assert_eq!(
            source_of(&plan, "000002.sst"),
            &Source::Local("/live.checkpoints/1-0/000002.sst".into())
        );
        assert_eq!(source_of(&plan, "000003.sst"), &Source::Staged);
        assert_eq!(source_of(&plan, "MANIFEST-000004"), &Source::Download);
        assert_eq!(source_of(&plan, "sub/x"), &Source::Download);
        assert_eq!(plan.dirs, ["sub"]);
        assert_eq!(plan.leftover, ["000000.log"]);
        let t = plan.totals;
        assert_eq!(
            (
                t.files,
                t.files_reused,
                t.files_to_download,
                t.files_to_delete
            ),
            (5, 3, 2, 1)
        );
        assert_eq!(t.bytes_to_download, (b"new manifest".len() + 2) as u64);
        assert_eq!(t.bytes, t.bytes_reused + t.bytes_to_download);
    }

    #[test]
    fn a_file_is_never_reused_on_its_size_alone_nor_hashed_when_no_size_matches() {
        let idx = index(vec![file("a.sst", b"aaaa")], vec![]);
        // Same size, other bytes (an unreadable file hashes to None).
        let (inv, mut hashes) = inventory(&[("a.sst", b"AAAA"), ("b.sst", b"bbbb")], &[], &[]);
        let (plan, asked) = plan_of(&idx, &inv, &hashes);
        assert_eq!(source_of(&plan, "a.sst"), &Source::Download);
        assert_eq!(
            asked.len(),
            3,
            "the same path (twice: live and by size) and b.sst: {asked:?}"
        );
        hashes.clear();
        let (plan, _) = plan_of(&idx, &inv, &hashes);
        assert_eq!(source_of(&plan, "a.sst"), &Source::Download);
        // No local file of that size: nothing hashed at all.
        let (inv, hashes) = inventory(&[("c.sst", b"ccccc")], &[], &[]);
        let (plan, asked) = plan_of(&idx, &inv, &hashes);
        assert_eq!(source_of(&plan, "a.sst"), &Source::Download);
        assert!(asked.is_empty(), "{asked:?}");
    }

    #[test]
    fn an_entry_a_restore_cannot_verify_is_corrupt_and_no_snapshot_resets() {
        let mut f = file("a.sst", b"a");
        f.sha256 = None;
        let (inv, hashes) = inventory(&[("old", b"x")], &[], &[]);
        let e = decide("s", None, Some(&index(vec![f], vec![])), &inv, |p| {
            hashes.get(p).copied()
        })
        .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains("a.sst"), "{e}");
        let mut two = file("b.sst", b"b");
        two.blobs.push(two.blobs[0].clone());
        let e = decide("s", None, Some(&index(vec![two], vec![])), &inv, |_| None).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{e}");
        // No snapshot: everything live is a leftover, nothing downloads.
        let plan = decide("s", None, None, &inv, |_| None).unwrap();
        assert!(plan.files.is_empty());
        assert_eq!(plan.leftover, ["old"]);
    }
}
