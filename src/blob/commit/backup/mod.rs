//! The blob backend's [`TaskBackupManager`].
//!
//! Per store and commit (DESIGN §7 step 2):
//!
//! 1. **scan** the checkpoint dir the commit manager made, hashing every file (SHA-256 and
//!    CRC32 in one read, on the blocking pool), with the [hash cache](crate::local::hashcache)
//!    for SSTs, so an SST hard-linked into many checkpoints is read once;
//! 2. **diff** against the last **committed** index of the store — never an uploaded but
//!    uncommitted one, so a failed upload or a failed checkpoint write cannot wedge later
//!    commits or make an uncommitted snapshot a baseline (Samza's §5.3 and §6.3 bugs);
//! 3. **upload** only content the committed snapshot does not reference: retained files cost
//!    zero requests; an added file whose bytes the committed snapshot already holds (a renamed
//!    file, an OPTIONS file rewritten identically) reuses that blob; identical files within
//!    the upload are sent once. New blobs go to `blobs/<this checkpoint id>/<sha256>`,
//!    create-only, with the SHA-256 for the server to check. PUTs share the store's one
//!    transfer budget with every task and store of the process
//!    ([`LimitStore`](crate::blobstore::limit::LimitStore)).
//! 4. **index**: build the SnapshotIndex, serialize it once, PUT it create-only under
//!    `index/<checkpoint-id>.<sha256>.json`. That key is the store's marker. A store whose
//!    snapshot holds exactly the files of the committed one skips steps 3 and 4: no request,
//!    and the committed marker is handed back (carried forward), so several checkpoints may
//!    name one index, which then names the oldest of them.
//!
//! [`cleanup`](TaskBackupManager::cleanup) is what makes an uploaded index the committed
//! baseline. It then expires snapshots beyond [`BackupSettings::retention`] (default 2
//! distinct snapshots: a carried marker is one, however many checkpoints name it):
//! exactly `blobs(leaving) − blobs(retained ∪ uploaded-but-uncommitted)`, by key, from the
//! indexes in hand, then the leaving index. Never from `files-removed`: with content identity
//! the same bytes can be removed in one place and present in another.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use futures::{StreamExt as _, TryStreamExt as _};

use crate::backend::{Clock, StoreMarkers, StoreSpec, TaskBackupManager, TaskContext};
use crate::blob::commit::preupload::{PreUploaded, PreUploads};
use crate::blob::snapshot::{
    hash_object, load_snapshot, BlobScopes, Expected, LoadedSnapshot, FACTORY_NAME,
};
use crate::blobstore::{BlobKey, BlobStore, DeferredDeletes, PutBody, PutOptions};
use crate::checkpoint::{Checkpoint, CheckpointId};
use crate::digest::{FileDigest, Sha256};
use crate::error::{Error, ErrorKind, Result};
use crate::index::{
    DirIndex, FileBlob, FileIndex, IndexMarker, SnapshotIndex, SnapshotMetadata, FORMAT_INLINE,
    FORMAT_V1,
};
use crate::layout::{JobScope, StoreScope};
use crate::local::hashcache::HashCache;
use crate::local::scan::{is_immutable, scan_dir_only, LocalDir, LocalFile, Owners, ScanStats};

mod retention;
mod upload;

use upload::*;
pub use upload::{diff, DiffTotals, DirDiff, SHARE_INLINE_FROM};

/// Blob uploads of one store at once: each holds an open file and, on S3, a connection, so
/// this bounds a store's descriptors even where no transfer budget
/// ([`LimitStore`](crate::blobstore::limit::LimitStore)) wraps the store.
pub const UPLOADS_IN_HAND: usize = 16;

/// Settings of the backup side.
#[derive(Clone, Debug)]
pub struct BackupSettings {
    /// Cache the hashes of immutable files next to each store.
    pub hash_cache: bool,
    /// Keep the hash caches in this directory instead of next to each store (one file per
    /// store, named by the SHA-256 of the store's path): for stores whose parent directory
    /// is not ours to write in (`blobsnap backup` of someone's database).
    pub hash_cache_dir: Option<PathBuf>,
    /// Committed snapshots kept per store (at least 1); older ones are deleted by cleanup.
    pub retention: usize,
    /// The sweep's grace period: an upload still running half of it after its first PUT is
    /// abandoned (its early blobs could otherwise be swept before it commits).
    pub gc_grace: std::time::Duration,
    /// Back up only these top-level names of each store dir (`None`: everything). `blobsnap
    /// backup --db` of a closed database passes its live files ([`crate::local::rocks::ClosedDb::live_files`]).
    pub only: Option<std::collections::BTreeSet<String>>,
    /// The abandon rule (DESIGN §7: an upload older than half the grace is abandoned). On
    /// unless a test turns it off to show what it prevents (tests/it/gc_model.rs finds a
    /// committed snapshot with a swept blob then). Never off in a job.
    #[doc(hidden)]
    pub abandon_rule: bool,
    /// With a tiered retention, the cleanup's check of the task's retained checkpoints right
    /// before each batch delete. On unless a test turns it off to show what it keeps
    /// (tests/it/gc_model.rs finds a retained point with a deleted blob then). Never off in a
    /// job.
    #[doc(hidden)]
    pub history_check: bool,
    /// The cleanup's check of the job's savepoints right before each batch delete. On unless
    /// a test turns it off to show what it keeps (tests/it/gc_model.rs finds a savepoint
    /// with a deleted blob then). Never off in a job.
    #[doc(hidden)]
    pub savepoint_check: bool,
    /// Mutable files (all but `*.sst` and `*.blob`) smaller than this travel inline in the
    /// index (`inline-data`, format-version 2) instead of as blobs of their own, so a commit's
    /// MANIFEST, OPTIONS, CURRENT and small WAL cost no request. Immutable files stay blobs:
    /// retained snapshots share them for free. 0: never — every index keeps Samza's v1 shape
    /// (for a Samza reader).
    pub inline_below: u64,
    /// Hold a writer lease (`writers/<task>/`, DESIGN §7) in the job's scope while uploads may
    /// be in flight: written (or refreshed, once older than a quarter of the grace) at the
    /// start of each upload, deleted by [`close`](crate::backend::TaskBackupManager::close).
    /// `blobsnap gc` refuses a sweep under the grace while a lease is live, even forced. The
    /// job runtime holds its own lease for the task's whole run and turns this off.
    pub writer_lease: bool,
    /// The job's retention has tiers (`every D for W`, [`crate::retention`]): the history
    /// keeps older checkpoints than the newest [`retention`](Self::retention), which this
    /// manager's window does not hold. Before each batch delete the task's retained
    /// checkpoints are then read (one LIST; each document and index once per process), and
    /// nothing they name is deleted; what they alone kept is the sweep's once they leave.
    pub tiered_retention: bool,
    /// Upload each table or blob file as soon as RocksDB has finished writing it, in the
    /// background, so that a commit uploads only what was not pre-uploaded yet
    /// ([`crate::blob::commit::preupload`]). Takes effect for stores opened as
    /// [`RocksStore`](crate::local::rocks::RocksStore)s in this process once a commit manager
    /// has attached the backend (it needs the task's id generator). Default off
    /// (`store.pre-upload`).
    pub pre_upload: bool,
}

/// The default [`BackupSettings::inline_below`]: 64 KiB.
pub const INLINE_BELOW: u64 = 64 << 10;

/// At most this many bytes of file content travel inline in one index (retained and added
/// files together; base64 makes them 4/3 as large): past it, small files are blobs like the
/// others, so an index stays far under the [`MAX_INDEX_BYTES`](crate::index::MAX_INDEX_BYTES)
/// its readers accept, whatever the number of small files.
pub const INLINE_BUDGET: u64 = 16 << 20;

impl Default for BackupSettings {
    fn default() -> Self {
        BackupSettings {
            hash_cache: true,
            hash_cache_dir: None,
            retention: 2,
            gc_grace: std::time::Duration::from_secs(24 * 3600),
            only: None,
            abandon_rule: true,
            history_check: true,
            savepoint_check: true,
            inline_below: INLINE_BELOW,
            writer_lease: true,
            tiered_retention: false,
            pre_upload: false,
        }
    }
}

/// What one store's upload did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadStats {
    /// Files in the snapshot.
    pub files: u64,
    /// Bytes in the snapshot.
    pub bytes: u64,
    /// The diff against the committed snapshot: files added (new or changed), retained
    /// (unchanged: zero requests) and removed (gone or changed), with their bytes.
    pub diff: DiffTotals,
    /// Blobs PUT.
    pub blobs_uploaded: u64,
    /// Bytes PUT (blobs only).
    pub bytes_uploaded: u64,
    /// Added files whose content an existing or sibling blob already held.
    pub blobs_deduplicated: u64,
    /// Requests the blob PUTs took (multipart: parts + 2 each), plus 1 for the index.
    pub requests: u64,
    /// Bytes read from disk to hash files.
    pub bytes_hashed: u64,
    /// Files whose hash came from the hash cache.
    pub hash_cache_hits: u64,
    /// Size of the index.
    pub index_bytes: u64,
    /// Time to scan and hash, ms.
    pub scan_ms: u64,
    /// Time to upload blobs and the index, ms.
    pub upload_ms: u64,
    /// The store was unchanged since the committed snapshot: no request was made and the
    /// committed marker was handed back (carried forward).
    pub carried_forward: bool,
    /// Added files carried inline in the index (no blob, no request of their own).
    pub files_inline: u64,
    /// Added files whose blobs were pre-uploaded before this commit (nothing sent now;
    /// [`crate::blob::commit::preupload`]).
    pub files_pre_uploaded: u64,
    /// Their bytes.
    pub bytes_pre_uploaded: u64,
}

/// Live progress of one store's upload (Samza's `files-to-upload`, `bytes-uploaded`, …
/// gauges); reset at the start of each upload. Remaining = to upload − uploaded.
#[derive(Debug, Default)]
pub struct BackupProgress {
    /// Blobs this upload must PUT.
    pub files_to_upload: AtomicU64,
    /// Their bytes.
    pub bytes_to_upload: AtomicU64,
    /// Blobs PUT so far.
    pub files_uploaded: AtomicU64,
    /// Their bytes.
    pub bytes_uploaded: AtomicU64,
    /// Files reused from the committed snapshot (no request).
    pub files_to_retain: AtomicU64,
    /// Their bytes.
    pub bytes_to_retain: AtomicU64,
}

impl BackupProgress {
    fn reset(&self) {
        for a in [
            &self.files_to_upload,
            &self.bytes_to_upload,
            &self.files_uploaded,
            &self.bytes_uploaded,
            &self.files_to_retain,
            &self.bytes_to_retain,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

#[derive(Default)]
struct StoreState {
    committed: Option<LoadedSnapshot>,
    /// Committed snapshots still retained, oldest first (the last is `committed`).
    retained: std::collections::VecDeque<LoadedSnapshot>,
    uploaded: HashMap<IndexMarker, LoadedSnapshot>,
    /// The directory of the last upload and the marker it gave: handed the same directory
    /// again while that marker is the committed one, the upload reads nothing (the commit
    /// manager reuses the checkpoint directory of a store that did not change; checkpoint
    /// directories are never written after they are made).
    last_dir: Option<(PathBuf, IndexMarker)>,
    /// The heat of each file of the snapshot this process started from (its committed
    /// index at `init`): an index written here records that plus the reads the store's
    /// checkpoint sampled since it was opened ([`crate::index::FileIndex::heat`]).
    heat_base: HashMap<String, u64>,
}

/// What cleanup deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanupStats {
    /// Snapshots that left retention.
    pub snapshots_expired: u64,
    /// Blobs deleted.
    pub blobs_deleted: u64,
    /// Their bytes.
    pub bytes_deleted: u64,
}

/// What leaves retention at a cleanup: the keys to delete, the snapshots leaving per store
/// (oldest first in its window) and their counts.
#[derive(Default)]
struct Expiry {
    keys: Vec<BlobKey>,
    leaving: Vec<(String, usize)>,
    stats: CleanupStats,
}

/// The keys of the blobs `index` names in its own scope, with their sizes. A fork's
/// borrowed blobs are not among them: they belong to the job they were borrowed from, and
/// this store's cleanup never deletes them.
fn blob_keys(
    scope: &StoreScope,
    index: &SnapshotIndex,
) -> Result<HashMap<crate::blobstore::BlobKey, u64>> {
    let mut out = HashMap::new();
    for (_, f) in index.present_files() {
        for b in &f.blobs {
            if BlobScopes::is_own(&b.blob_id) {
                out.insert(scope.key(&b.blob_id)?, f.file_metadata.size);
            }
        }
    }
    Ok(out)
}

/// The declarations of `committed` (a fork's snapshot) that `dir` still names, and the scopes
/// to read the new snapshot's blobs in.
fn still_borrowed(
    committed: &LoadedSnapshot,
    dir: &DirIndex,
) -> (BTreeMap<String, crate::index::BorrowedScope>, BlobScopes) {
    if committed.index.borrowed_from.is_empty() {
        return (BTreeMap::new(), BlobScopes::own(committed.scope.clone()));
    }
    let mut named = std::collections::BTreeSet::new();
    collect_aliases(dir, &mut named);
    let declared = committed
        .index
        .borrowed_from
        .iter()
        .filter(|(alias, _)| named.contains(alias.as_str()))
        .map(|(a, b)| (a.clone(), b.clone()))
        .collect();
    (declared, committed.blobs.clone())
}

fn collect_aliases<'a>(dir: &'a DirIndex, out: &mut std::collections::BTreeSet<&'a str>) {
    for f in &dir.files_present {
        out.extend(f.blobs.iter().filter_map(|b| b.borrowed().map(|(a, _)| a)));
    }
    for d in &dir.sub_dirs_present {
        collect_aliases(d, out);
    }
}

/// The blob backend's backup manager for one task.
pub struct BlobBackupManager {
    blob_store: Arc<dyn BlobStore>,
    task: TaskContext,
    stores: Vec<(StoreSpec, StoreScope, Option<Arc<HashCache>>)>,
    progress: HashMap<String, Arc<BackupProgress>>,
    clock: Arc<dyn Clock>,
    settings: BackupSettings,
    owners: Arc<Owners>,
    state: Mutex<HashMap<String, StoreState>>,
    stats: Mutex<BTreeMap<String, UploadStats>>,
    cleanup_stats: Mutex<CleanupStats>,
    /// When each uncommitted upload made its first PUT (over all stores): monotonic and on
    /// the task's clock. The abandon rule measures from here.
    first_put: Mutex<BTreeMap<CheckpointId, (Instant, u64)>>,
    /// Commits abandoned by the abandon rule since the last one that committed.
    abandoned_in_a_row: std::sync::atomic::AtomicU32,
    /// Whether the last cleanup held the retention window (a store lazily restoring): the
    /// next one holds too, since the commit manager decided before it whether to trim.
    held: std::sync::atomic::AtomicBool,
    /// The writer lease ([`BackupSettings::writer_lease`]) and when it was last written.
    lease: Option<(
        crate::blob::collect::admin::WriterLease,
        Mutex<Option<Instant>>,
    )>,
    /// A fork's pins on the savepoints its snapshots borrow through, released once unused.
    release: crate::blob::time::fork::Release,
    /// What keeps this job's doomed keys alive when a cleanup's delete is sent: its
    /// savepoints (and, with a tiered retention, the task's retained checkpoints). One per
    /// manager, so that each checkpoint document and index it reads is read once, not at
    /// every commit.
    pins: Arc<crate::blob::time::savepoint::Pins>,
    /// Per store, its pre-uploads ([`BackupSettings::pre_upload`]; empty when off).
    pre: HashMap<String, Arc<PreUploads>>,
    /// The task's snapshot generation (bumped by each sync stage) and the generation of each
    /// commit not yet committed ([`PreUploads::settle`]).
    generation: Arc<AtomicU64>,
    generations: Mutex<BTreeMap<CheckpointId, u64>>,
    /// The pre-upload workers, stopped on close and drop.
    workers: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for BlobBackupManager {
    fn drop(&mut self) {
        if let Ok(w) = self.workers.get_mut() {
            for h in w.drain(..) {
                h.abort();
            }
        }
    }
}

/// After this many consecutive commits abandoned by the abandon rule, the next abandonment is
/// an `InvalidInput` error that stops the task (the grace is too short for the store's
/// uploads: every retry would upload at least as much and be abandoned again).
pub const ABANDON_LIMIT: u32 = 3;

impl std::fmt::Debug for BlobBackupManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobBackupManager")
            .field("task", &self.task)
            .field("store", &self.blob_store.to_string())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::new(ErrorKind::Io, "backup manager state lock poisoned"))
}

impl BlobBackupManager {
    /// A backup manager for `task`'s `stores`, writing to `blob_store`.
    pub fn new(
        blob_store: Arc<dyn BlobStore>,
        task: TaskContext,
        stores: &[StoreSpec],
        clock: Arc<dyn Clock>,
        settings: BackupSettings,
    ) -> Result<Self> {
        let job = JobScope::new(&task.job_name, &task.job_id)?;
        let mut specs = Vec::with_capacity(stores.len());
        let mut seen = std::collections::HashSet::new();
        let mut progress = HashMap::new();
        for spec in stores {
            let spec = &spec.normalized()?;
            if !seen.insert(spec.name.clone()) {
                return Err(Error::invalid(format!(
                    "store {:?} is listed twice for task {:?}",
                    spec.name, task.task_name
                )));
            }
            let scope = job.store(&task.task_name, &spec.name)?;
            let cache = settings.hash_cache.then(|| {
                Arc::new(HashCache::load(HashCache::path_in(
                    &spec.dir,
                    settings.hash_cache_dir.as_deref(),
                )))
            });
            specs.push((spec.clone(), scope, cache));
            progress.insert(spec.name.clone(), Arc::default());
        }
        let generation = Arc::new(AtomicU64::new(0));
        let pre = if settings.pre_upload {
            specs
                .iter()
                .map(|(spec, _, _)| {
                    let p = PreUploads::new(&task.task_name, &spec.name, Arc::clone(&generation));
                    (spec.name.clone(), Arc::new(p))
                })
                .collect()
        } else {
            HashMap::new()
        };
        let release = crate::blob::time::fork::Release::new(
            Arc::clone(&blob_store),
            &task.job_name,
            &task.job_id,
            &task.task_name,
        );
        let pins = crate::blob::time::savepoint::Pins::new(
            Arc::clone(&blob_store),
            &task.job_name,
            &task.job_id,
        )?;
        let pins = if settings.tiered_retention && settings.history_check {
            pins.with_history(&task.task_name)
        } else {
            pins
        };
        let pins = Arc::new(if settings.savepoint_check {
            pins
        } else {
            pins.without_savepoints()
        });
        Ok(BlobBackupManager {
            blob_store,
            stores: specs,
            progress,
            clock,
            owners: Arc::new(Owners::load()),
            state: Mutex::new(HashMap::new()),
            stats: Mutex::new(BTreeMap::new()),
            cleanup_stats: Mutex::new(CleanupStats::default()),
            first_put: Mutex::default(),
            abandoned_in_a_row: Default::default(),
            held: Default::default(),
            lease: settings.writer_lease.then(|| {
                (
                    crate::blob::collect::admin::WriterLease::new(
                        &task.task_name,
                        settings.gc_grace,
                    ),
                    Mutex::new(None),
                )
            }),
            release,
            pins,
            pre,
            generation,
            generations: Mutex::default(),
            workers: Mutex::default(),
            task,
            settings,
        })
    }

    /// Per store, what the last upload did.
    pub fn last_upload_stats(&self) -> BTreeMap<String, UploadStats> {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// What `store`'s pre-uploads did so far (`None` when pre-upload is off).
    pub fn pre_upload_totals(
        &self,
        store: &str,
    ) -> Option<crate::blob::commit::preupload::PreUploadTotals> {
        self.pre.get(store).map(|p| p.totals())
    }

    /// Live progress of `store`'s current (or last) upload.
    pub fn progress(&self, store: &str) -> Option<Arc<BackupProgress>> {
        self.progress.get(store).cloned()
    }

    /// The committed marker of `store`, if any.
    pub fn committed_marker(&self, store: &str) -> Option<IndexMarker> {
        self.state
            .lock()
            .ok()?
            .get(store)?
            .committed
            .as_ref()
            .map(|s| s.marker)
    }

    fn expected<'a>(&'a self, store: &'a str) -> Expected<'a> {
        Expected {
            job_name: &self.task.job_name,
            job_id: &self.task.job_id,
            task_name: &self.task.task_name,
            store_name: store,
        }
    }

    async fn load_committed(&self, spec: &StoreSpec, marker: &str) -> Result<LoadedSnapshot> {
        load_snapshot(self.blob_store.as_ref(), &self.expected(&spec.name), marker)
            .await
            .map_err(|e| e.context(format!("store {}", spec.name)))
    }
}

/// Publish an upload through the `metrics` facade (any recorder the application installs:
/// Prometheus, StatsD, …). Names follow Samza's backup metrics (reference §7.4).
fn record_upload_metrics(task: &str, store: &str, s: &UploadStats) {
    let labels = [("task", task.to_string()), ("store", store.to_string())];
    metrics::counter!("blobsnap_backup_uploads_total", &labels).increment(1);
    if s.carried_forward {
        metrics::counter!("blobsnap_backup_carried_forward_total", &labels).increment(1);
    }
    metrics::counter!("blobsnap_backup_files_uploaded_total", &labels).increment(s.blobs_uploaded);
    metrics::counter!("blobsnap_backup_bytes_uploaded_total", &labels).increment(s.bytes_uploaded);
    metrics::counter!("blobsnap_backup_files_retained_total", &labels)
        .increment(s.diff.files_retained);
    metrics::counter!("blobsnap_backup_bytes_retained_total", &labels)
        .increment(s.diff.bytes_retained);
    metrics::counter!("blobsnap_backup_files_deduplicated_total", &labels)
        .increment(s.blobs_deduplicated);
    metrics::counter!("blobsnap_backup_bytes_hashed_total", &labels).increment(s.bytes_hashed);
    metrics::counter!("blobsnap_backup_hash_cache_hits_total", &labels)
        .increment(s.hash_cache_hits);
    metrics::counter!("blobsnap_backup_requests_total", &labels).increment(s.requests);
    metrics::gauge!("blobsnap_backup_files_to_upload", &labels).set(s.blobs_uploaded as f64);
    metrics::gauge!("blobsnap_backup_files_to_retain", &labels).set(s.diff.files_retained as f64);
    metrics::gauge!("blobsnap_backup_files_to_remove", &labels).set(s.diff.files_removed as f64);
    metrics::gauge!("blobsnap_backup_bytes_to_remove", &labels).set(s.diff.bytes_removed as f64);
    metrics::histogram!("blobsnap_backup_scan_seconds", &labels).record(s.scan_ms as f64 / 1e3);
    metrics::histogram!("blobsnap_backup_upload_seconds", &labels).record(s.upload_ms as f64 / 1e3);
}

#[async_trait]
impl TaskBackupManager for BlobBackupManager {
    /// Load the committed index of every store that has a marker in `last`. A store without
    /// one (new store, V1 checkpoint, no checkpoint) starts from nothing.
    async fn init(&self, last: Option<&Checkpoint>) -> Result<()> {
        let v2 = last.and_then(Checkpoint::as_v2);
        if last.is_some() && v2.is_none() {
            tracing::warn!(task = %self.task.task_name, "last checkpoint is V1: no blob snapshots to build on");
        }
        for (spec, _, _) in &self.stores {
            let committed = match v2.and_then(|c| c.marker(FACTORY_NAME, &spec.name)) {
                Some(marker) => Some(self.load_committed(spec, marker).await?),
                None => None,
            };
            // The retention window: the committed snapshot and the ones before it, followed
            // through `prev-snapshot-index-blob-id` (best effort: a predecessor already gone
            // ends the chain).
            let mut retained = std::collections::VecDeque::new();
            if let Some(c) = &committed {
                retained.push_front(c.clone());
                let mut prev = c.index.prev_snapshot_index_blob_id.clone();
                while retained.len() < self.settings.retention.max(1) {
                    let Some(p) = prev.take() else { break };
                    match self.load_committed(spec, &p).await {
                        Ok(s) => {
                            prev = s.index.prev_snapshot_index_blob_id.clone();
                            retained.push_front(s);
                        }
                        Err(e) => {
                            tracing::debug!(store = %spec.name, marker = %p, error = %e, "older snapshot not loaded");
                            break;
                        }
                    }
                }
            }
            for s in &retained {
                self.release.note(&s.index);
            }
            if self.stores.first().map(|(f, _, _)| &f.name) == Some(&spec.name) {
                self.release
                    .seed()
                    .await
                    .map_err(|e| e.context("read the task's start-from record (a fork's pins)"))?;
            }
            let heat_base = committed
                .as_ref()
                .map(|c| heat_of(&c.index.dir_index))
                .unwrap_or_default();
            lock(&self.state)?.insert(
                spec.name.clone(),
                StoreState {
                    committed,
                    retained,
                    uploaded: HashMap::new(),
                    last_dir: None,
                    heat_base,
                },
            );
        }
        Ok(())
    }

    /// The pre-upload workers start with the task's id generator.
    fn attach_ids(&self, ids: crate::backend::IdSource) {
        if !self.pre.is_empty() {
            self.start_pre_uploads(ids);
        }
    }

    /// Nothing to upload synchronously (the commit manager made the checkpoint dirs): the
    /// snapshot generation moves on (the pre-uploads' waste accounting, `PreUploads::settle`).
    fn snapshot(&self, id: CheckpointId) -> Result<StoreMarkers> {
        if !self.pre.is_empty() {
            let g = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
            lock(&self.generations)?.insert(id, g);
        }
        Ok(StoreMarkers::new())
    }

    async fn upload(
        &self,
        id: CheckpointId,
        _snapshot_markers: &StoreMarkers,
        dirs: &BTreeMap<String, PathBuf>,
    ) -> Result<StoreMarkers> {
        self.renew_lease().await?;
        let mut jobs = Vec::new();
        for (spec, scope, cache) in &self.stores {
            let dir = dirs.get(&spec.name).ok_or_else(|| {
                Error::invalid(format!(
                    "no checkpoint directory given for store {:?}",
                    spec.name
                ))
            })?;
            let name = spec.name.clone();
            let fut = self.upload_store(id, spec, scope, cache.clone(), dir.clone());
            jobs.push(async move {
                fut.await
                    .map(|m| (name.clone(), m.to_string()))
                    .map_err(|e| e.context(format!("upload store {name} at checkpoint {id}")))
            });
        }
        futures::future::try_join_all(jobs)
            .await
            .map(|v| v.into_iter().collect())
    }

    /// The checkpoint naming `markers` is committed: each store's index named there becomes
    /// the baseline of the next upload, and the snapshots that left retention are deleted.
    /// Idempotent.
    async fn cleanup(&self, id: CheckpointId, markers: &StoreMarkers) -> Result<()> {
        let wasted = self.note_committed(id, markers).await?;
        let mut expiry = self.expiry()?;
        expiry.keys.extend(wasted);
        if !expiry.keys.is_empty() {
            DeferredDeletes {
                store: Arc::clone(&self.blob_store),
                keys: expiry.keys.clone(),
                pins: Some(Arc::clone(&self.pins) as _),
            }
            .delete_with(&[])
            .await
            .map_err(|e| e.context("cleanup"))?;
        }
        self.retire(expiry)?;
        self.release_pins().await;
        Ok(())
    }

    /// As [`cleanup`](Self::cleanup), but the deletes of the snapshots that left retention
    /// are handed back (they leave the window now): the commit manager sends them with its
    /// next trim.
    async fn cleanup_deferred(
        &self,
        id: CheckpointId,
        markers: &StoreMarkers,
    ) -> Result<Vec<DeferredDeletes>> {
        let wasted = self.note_committed(id, markers).await?;
        let mut expiry = self.expiry()?;
        let mut keys = std::mem::take(&mut expiry.keys);
        keys.extend(wasted);
        self.retire(expiry)?;
        self.release_pins().await;
        Ok(vec![DeferredDeletes {
            store: Arc::clone(&self.blob_store),
            keys,
            pins: Some(Arc::clone(&self.pins) as _),
        }])
    }

    fn before_commit(&self, id: CheckpointId) -> Result<Option<std::time::Duration>> {
        self.check_age(id, "commit")
    }

    fn last_upload(&self) -> BTreeMap<String, crate::backend::UploadSummary> {
        self.last_upload_stats()
            .into_iter()
            .map(|(store, s)| {
                let summary = crate::backend::UploadSummary {
                    files: s.files,
                    bytes: s.bytes,
                    files_uploaded: s.blobs_uploaded,
                    bytes_uploaded: s.bytes_uploaded,
                    files_reused: s.diff.files_retained + s.blobs_deduplicated,
                    files_pre_uploaded: s.files_pre_uploaded,
                    requests: s.requests,
                };
                (store, summary)
            })
            .collect()
    }

    fn retention_window(&self) -> Option<(usize, bool)> {
        Some((
            self.settings.retention.max(1),
            self.settings.tiered_retention,
        ))
    }

    async fn close(&self) -> Result<()> {
        for h in lock(&self.workers)?.drain(..) {
            h.abort();
        }
        let Some((lease, renewed)) = &self.lease else {
            return Ok(());
        };
        if lock(renewed)?.take().is_none() {
            return Ok(());
        }
        lease
            .retire(self.blob_store.as_ref(), &self.job_scope()?)
            .await
            .map_err(|e| e.context("delete the writer lease"))
    }
}
