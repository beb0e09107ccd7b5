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
use crate::blob::commit::diff::{diff, DirDiff};
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
    /// Files new or changed since the committed snapshot.
    pub files_added: u64,
    /// Their bytes.
    pub bytes_added: u64,
    /// Files unchanged since the committed snapshot (zero requests).
    pub files_retained: u64,
    /// Their bytes.
    pub bytes_retained: u64,
    /// Files of the committed snapshot that are gone or changed.
    pub files_removed: u64,
    /// Their bytes.
    pub bytes_removed: u64,
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
        let pins = Arc::new(if settings.tiered_retention {
            pins.with_history(&task.task_name)
        } else {
            pins
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

    #[tracing::instrument(level = "info", skip_all, fields(task = %self.task.task_name, store = %spec.name, checkpoint = %id))]
    async fn upload_store(
        &self,
        id: CheckpointId,
        spec: &StoreSpec,
        scope: &StoreScope,
        cache: Option<Arc<HashCache>>,
        dir: PathBuf,
    ) -> Result<IndexMarker> {
        // 0. the commit manager's checkpoint directory of the committed snapshot, handed again
        //    (the store did not change): nothing read. A directory elsewhere (a caller's own)
        //    is always scanned.
        let same =
            lock(&self.state)?
                .get(&spec.name)
                .and_then(|s| match (&s.last_dir, &s.committed) {
                    (Some((d, m)), Some(c))
                        if *d == dir
                            && *m == c.marker
                            && dir.parent() == Some(&spec.checkpoints_dir()) =>
                    {
                        Some(c.clone())
                    }
                    _ => None,
                });
        if let Some(base) = same {
            let (files, bytes) = base
                .index
                .present_files()
                .iter()
                .fold((0, 0), |(n, b), (_, f)| (n + 1, b + f.file_metadata.size));
            let stats = UploadStats {
                files,
                bytes,
                files_retained: files,
                bytes_retained: bytes,
                carried_forward: true,
                ..Default::default()
            };
            return self.carry_forward(spec, &base, stats);
        }
        let started = Instant::now();
        // 1. scan
        let (local, scan_stats) = self.scan(cache, dir.clone()).await?;
        let scan_ms = started.elapsed().as_millis() as u64;

        // 2. diff against the committed snapshot
        let committed = lock(&self.state)?
            .get(&spec.name)
            .and_then(|s| s.committed.clone());
        let prev_dir = committed.as_ref().map(|c| &c.index.dir_index);
        let dd = diff(&local, prev_dir);
        let totals = dd.totals();

        // An unchanged store costs no request: its snapshot holds exactly the files of the
        // diff base, so the base's marker is handed back and no index is written (DESIGN §7
        // step 2; restore and cleanup accept a marker named by several checkpoints).
        if let Some(base) = committed.as_ref().filter(|_| dd.is_unchanged()) {
            let stats = UploadStats {
                files: totals.files_retained,
                bytes: totals.bytes_retained,
                files_retained: totals.files_retained,
                bytes_retained: totals.bytes_retained,
                bytes_hashed: scan_stats.bytes_hashed.load(Ordering::Relaxed),
                hash_cache_hits: scan_stats.cache_hits.load(Ordering::Relaxed),
                scan_ms,
                carried_forward: true,
                ..Default::default()
            };
            let marker = self.carry_forward(spec, base, stats)?;
            lock(&self.state)?
                .entry(spec.name.clone())
                .or_default()
                .last_dir = Some((dir, marker));
            return Ok(marker);
        }

        // 3. plan the blobs: reuse what the committed snapshot holds and what was pre-uploaded,
        //    send each new content once
        let pre = self.pre_uploaded(id, &spec.name, &dd).await;
        let (blob_of, to_put, to_inline, deduplicated) = plan_blobs(
            id,
            committed.as_ref(),
            &dd,
            self.settings.inline_below,
            &pre,
        );
        let pre_used: Vec<&PreUploaded> = pre
            .values()
            .filter(|p| blob_of.get(&p.digest.sha256) == Some(&p.blob_id))
            .collect();
        let progress = self.progress.get(&spec.name).cloned().unwrap_or_default();
        progress.reset();
        progress
            .files_to_upload
            .store(to_put.len() as u64, Ordering::Relaxed);
        progress.bytes_to_upload.store(
            to_put.iter().map(|f| f.digest.size).sum(),
            Ordering::Relaxed,
        );
        // A retained inline file shared as a blob now counts once: as an upload, or (already a
        // blob elsewhere) as deduplicated.
        let shared = retained_inline(&dd).len() as u64;
        progress.files_to_retain.store(
            totals.files_retained.saturating_sub(shared) + deduplicated,
            Ordering::Relaxed,
        );
        progress.bytes_to_retain.store(
            totals.bytes_added + totals.bytes_retained
                - to_put.iter().map(|f| f.digest.size).sum::<u64>(),
            Ordering::Relaxed,
        );
        let upload_started = Instant::now();
        self.note_first_put(id)?;
        // A named pre-upload's PUT is this commit's too: the abandon rule measures from the
        // earliest (DESIGN §7 step 2).
        for p in &pre_used {
            self.note_put_at(id, p.put_at)?;
        }
        if !pre_used.is_empty() {
            crate::crash::point("preupload.after-named");
        }
        let requests = self.put_blobs(id, scope, &to_put, &progress).await?;
        let inline = read_inline(&to_inline).await?;

        // 4. the index — unless the commit's uploads took so long that the sweep could have
        //    taken their first blobs (DESIGN §7 step 2; checked again before the checkpoint
        //    write, `before_commit`).
        self.check_age(id, &format!("upload of store {}", spec.name))?;
        let mut dir_index = build_dir(&dd, &blob_of, &inline)?;
        let reads = read_heat(&dir).await;
        {
            // No I/O under the lock: the heat file was read above.
            let state = lock(&self.state)?;
            let none = HashMap::new();
            let base = state.get(&spec.name).map_or(&none, |s| &s.heat_base);
            add_heat(&mut dir_index, base, &reads);
        }
        // A fork's retained files keep naming the blobs it borrows: the new index declares
        // the scopes they are in (those still named, no others).
        let (borrowed_from, blobs) = match committed.as_ref() {
            Some(c) => still_borrowed(c, &dir_index),
            None => (BTreeMap::new(), BlobScopes::own(scope.clone())),
        };
        let index = SnapshotIndex {
            format_version: if !borrowed_from.is_empty() {
                crate::index::FORMAT_FORK
            } else if has_inline(&dir_index) {
                FORMAT_INLINE
            } else {
                FORMAT_V1
            },
            creation_time_millis: self.clock.now_millis(),
            snapshot_metadata: SnapshotMetadata {
                checkpoint_id: id,
                job_name: self.task.job_name.clone(),
                job_id: self.task.job_id.clone(),
                task_name: self.task.task_name.clone(),
                store_name: spec.name.clone(),
            },
            dir_index,
            prev_snapshot_index_blob_id: committed.as_ref().map(|c| c.marker.to_string()),
            borrowed_from,
        };
        let (marker, index_len) = self.put_index(id, scope, &index).await?;

        let stats = UploadStats {
            files: totals.files_added + totals.files_retained,
            bytes: totals.bytes_added + totals.bytes_retained,
            files_added: totals.files_added,
            bytes_added: totals.bytes_added,
            files_retained: totals.files_retained,
            bytes_retained: totals.bytes_retained,
            files_removed: totals.files_removed,
            bytes_removed: totals.bytes_removed,
            blobs_uploaded: to_put.len() as u64,
            bytes_uploaded: to_put.iter().map(|f| f.digest.size).sum(),
            blobs_deduplicated: deduplicated,
            requests: requests + 1,
            bytes_hashed: scan_stats
                .bytes_hashed
                .load(std::sync::atomic::Ordering::Relaxed),
            hash_cache_hits: scan_stats
                .cache_hits
                .load(std::sync::atomic::Ordering::Relaxed),
            index_bytes: index_len,
            scan_ms,
            upload_ms: upload_started.elapsed().as_millis() as u64,
            carried_forward: false,
            files_inline: to_inline.len() as u64,
            files_pre_uploaded: pre_used.len() as u64,
            bytes_pre_uploaded: pre_used.iter().map(|p| p.digest.size).sum(),
        };
        if let Some(p) = self.pre.get(&spec.name) {
            p.used(stats.files_pre_uploaded, stats.bytes_pre_uploaded);
        }
        tracing::info!(
            marker = %marker,
            files = stats.files,
            files_added = stats.files_added,
            files_retained = stats.files_retained,
            files_removed = stats.files_removed,
            blobs_uploaded = stats.blobs_uploaded,
            bytes_uploaded = stats.bytes_uploaded,
            files_pre_uploaded = stats.files_pre_uploaded,
            bytes_retained = stats.bytes_retained,
            requests = stats.requests,
            bytes_hashed = stats.bytes_hashed,
            scan_ms = stats.scan_ms,
            upload_ms = stats.upload_ms,
            "uploaded store snapshot"
        );
        record_upload_metrics(&self.task.task_name, &spec.name, &stats);
        lock(&self.stats)?.insert(spec.name.clone(), stats);
        let mut state = lock(&self.state)?;
        let st = state.entry(spec.name.clone()).or_default();
        st.uploaded.insert(
            marker,
            LoadedSnapshot {
                scope: scope.clone(),
                blobs,
                marker,
                index: Arc::new(index),
            },
        );
        st.last_dir = Some((dir, marker));
        Ok(marker)
    }

    /// Hand back `base`'s marker for an unchanged store (DESIGN §7 step 2): no request.
    fn carry_forward(
        &self,
        spec: &StoreSpec,
        base: &LoadedSnapshot,
        stats: UploadStats,
    ) -> Result<IndexMarker> {
        if let Some(p) = self.progress.get(&spec.name) {
            p.reset();
        }
        tracing::debug!(marker = %base.marker, files = stats.files, "store unchanged: marker carried forward, nothing uploaded");
        record_upload_metrics(&self.task.task_name, &spec.name, &stats);
        lock(&self.stats)?.insert(spec.name.clone(), stats);
        Ok(base.marker)
    }

    /// Scan a checkpoint dir (blocking, off the async threads), through the hash cache.
    async fn scan(
        &self,
        cache: Option<Arc<HashCache>>,
        dir: PathBuf,
    ) -> Result<(LocalDir, Arc<ScanStats>)> {
        let scan_stats = Arc::new(ScanStats::default());
        let (owners, stats, only) = (
            Arc::clone(&self.owners),
            Arc::clone(&scan_stats),
            self.settings.only.clone(),
        );
        let tree = tokio::task::spawn_blocking(move || {
            let tree = scan_dir_only(&dir, only.as_ref(), cache.as_deref(), &owners, &stats)?;
            if let Some(c) = &cache {
                if let Err(e) = c.save() {
                    tracing::warn!(error = %e, "could not save the hash cache");
                }
            }
            Ok::<_, Error>(tree)
        })
        .await
        .map_err(|e| Error::task("scan", e))??;
        Ok((tree, scan_stats))
    }

    /// PUT the planned blobs (create-only, at most [`UPLOADS_IN_HAND`] at once; the store's
    /// transfer budget bounds what is on the wire across the process); returns the requests
    /// they took.
    async fn put_blobs(
        &self,
        id: CheckpointId,
        scope: &StoreScope,
        to_put: &[&LocalFile],
        progress: &Arc<BackupProgress>,
    ) -> Result<u64> {
        let jobs: Vec<(String, PathBuf, u64, FileDigest)> = to_put
            .iter()
            .map(|f| {
                (
                    StoreScope::blob_id(id, f.digest.sha256),
                    f.path.clone(),
                    f.digest.size,
                    f.digest,
                )
            })
            .collect();
        futures::stream::iter(jobs)
            .map(|(blob_id, path, len, digest)| {
                let progress = Arc::clone(progress);
                async move {
                    // A multipart upload's parts count as they land (never past the file's
                    // size, whatever retries resend); the rest once the put returns.
                    let reported = Arc::new(AtomicU64::new(0));
                    let report: Arc<dyn Fn(u64) + Send + Sync> = {
                        let (progress, reported) = (Arc::clone(&progress), Arc::clone(&reported));
                        Arc::new(move |n| {
                            let before = reported.fetch_add(n, Ordering::Relaxed);
                            let add = n.min(len.saturating_sub(before));
                            progress.bytes_uploaded.fetch_add(add, Ordering::Relaxed);
                        })
                    };
                    let r = crate::blobstore::with_put_progress(
                        report,
                        self.put_blob(scope, blob_id, path, len, digest),
                    )
                    .await?;
                    crate::crash::point("backup.mid-upload");
                    progress.files_uploaded.fetch_add(1, Ordering::Relaxed);
                    let counted = reported.load(Ordering::Relaxed).min(len);
                    progress
                        .bytes_uploaded
                        .fetch_add(len - counted, Ordering::Relaxed);
                    Ok::<_, Error>(r)
                }
            })
            .buffer_unordered(UPLOADS_IN_HAND)
            .try_fold(0u64, |acc, r| async move { Ok(acc + r) })
            .await
    }

    /// PUT `index` create-only under its marker's key; returns the marker and the index's size.
    async fn put_index(
        &self,
        id: CheckpointId,
        scope: &StoreScope,
        index: &SnapshotIndex,
    ) -> Result<(IndexMarker, u64)> {
        let bytes = index.to_bytes()?;
        let marker = IndexMarker::of(id, &bytes);
        let key = scope.index_key(&marker)?;
        let index_len = bytes.len() as u64;
        // Never commit an index no reader would accept: the commit fails (nothing committed
        // is lost) and says why.
        if index_len > crate::index::MAX_INDEX_BYTES {
            return Err(Error::invalid(format!(
                "the index of store {:?} at checkpoint {id} would be {index_len} bytes, over the {}-byte cap every reader enforces ({} files): not committed",
                index.snapshot_metadata.store_name,
                crate::index::MAX_INDEX_BYTES,
                index.present_files().len()
            )));
        }
        match self
            .blob_store
            .put(
                &key,
                PutBody::Bytes(bytes.into()),
                PutOptions::create_only(marker.sha256),
            )
            .await
        {
            Ok(_) => Ok((marker, index_len)),
            // The key is the hash of the bytes: an existing object with the same key and the
            // same hash is this very index (a retried upload).
            Err(e) if e.kind() == ErrorKind::Conflict => {
                let (sha, _) = hash_object(self.blob_store.as_ref(), &key).await?;
                if sha != marker.sha256 {
                    return Err(e.context(format!("index {key} exists with other bytes")));
                }
                Ok((marker, index_len))
            }
            Err(e) => Err(e.context(format!("put index {key}"))),
        }
    }

    /// PUT one blob (create-only); returns the requests it took.
    async fn put_blob(
        &self,
        scope: &StoreScope,
        blob_id: String,
        path: PathBuf,
        len: u64,
        digest: FileDigest,
    ) -> Result<u64> {
        let key = scope.key(&blob_id)?;
        let body = PutBody::File {
            path: path.clone(),
            len,
        };
        match self
            .blob_store
            .put(
                &key,
                body,
                PutOptions::create_only(digest.sha256).with_crc32(digest.crc32),
            )
            .await
        {
            Ok(r) => Ok(u64::from(r.requests)),
            // The key names this upload's checkpoint id, which carries this process's epoch:
            // no other writer makes it, and the retry layer has already settled a retried PUT
            // of ours. An object there is foreign or an earlier incarnation's orphan — one a
            // sweep may be deleting right now (its last-modified is old): never reuse it, and
            // abandon the commit; the next one has a new id.
            Err(e) if e.kind() == ErrorKind::Conflict => Err(Error::transient(format!(
                "blob {key} already exists although its checkpoint id is this upload's own: not reused (it may be an orphan a sweep is deleting); the commit is abandoned and the next one starts afresh ({e})"
            ))),
            Err(e) => Err(e.context(format!("upload {} as {key}", path.display()))),
        }
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
    metrics::counter!("blobsnap_backup_files_retained_total", &labels).increment(s.files_retained);
    metrics::counter!("blobsnap_backup_bytes_retained_total", &labels).increment(s.bytes_retained);
    metrics::counter!("blobsnap_backup_files_deduplicated_total", &labels)
        .increment(s.blobs_deduplicated);
    metrics::counter!("blobsnap_backup_bytes_hashed_total", &labels).increment(s.bytes_hashed);
    metrics::counter!("blobsnap_backup_hash_cache_hits_total", &labels)
        .increment(s.hash_cache_hits);
    metrics::counter!("blobsnap_backup_requests_total", &labels).increment(s.requests);
    metrics::gauge!("blobsnap_backup_files_to_upload", &labels).set(s.blobs_uploaded as f64);
    metrics::gauge!("blobsnap_backup_files_to_retain", &labels).set(s.files_retained as f64);
    metrics::gauge!("blobsnap_backup_files_to_remove", &labels).set(s.files_removed as f64);
    metrics::gauge!("blobsnap_backup_bytes_to_remove", &labels).set(s.bytes_removed as f64);
    metrics::histogram!("blobsnap_backup_scan_seconds", &labels).record(s.scan_ms as f64 / 1e3);
    metrics::histogram!("blobsnap_backup_upload_seconds", &labels).record(s.upload_ms as f64 / 1e3);
}

/// The heat of each file at the root of a snapshot (where RocksDB's table files are).
fn heat_of(root: &DirIndex) -> HashMap<String, u64> {
    root.files_present
        .iter()
        .filter_map(|f| Some((f.file_name.clone(), f.heat?)))
        .collect()
}

/// The reads a checkpoint directory's [`crate::index::HEAT_FILE`] sampled, by file name:
/// none when it has none (a directory the caller made, or a store nobody read). An
/// unreadable one costs the heat of this snapshot, never the backup (a warning).
async fn read_heat(dir: &Path) -> HashMap<String, u64> {
    let path = dir.join(crate::index::HEAT_FILE);
    let parsed = match tokio::fs::read(&path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HashMap::new(),
        Err(e) => Err(e.to_string()),
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| e.to_string()),
    };
    parsed.unwrap_or_else(|e| {
        tracing::warn!(file = %path.display(), error = %e, "unreadable heat file: this snapshot records no heat");
        HashMap::new()
    })
}

/// Set the heat of each root file: what it had when this process started plus the reads
/// sampled since (none written for a file never read).
fn add_heat(root: &mut DirIndex, base: &HashMap<String, u64>, reads: &HashMap<String, u64>) {
    for f in &mut root.files_present {
        let heat = base
            .get(&f.file_name)
            .copied()
            .unwrap_or(0)
            .saturating_add(reads.get(&f.file_name).copied().unwrap_or(0));
        f.heat = (heat > 0).then_some(heat);
    }
}

fn file_index(f: &LocalFile, blob_id: String) -> FileIndex {
    FileIndex {
        file_name: f.name.clone(),
        blobs: vec![FileBlob { blob_id, offset: 0 }],
        file_metadata: f.metadata.clone(),
        checksum: f.digest.crc32,
        sha256: Some(f.digest.sha256),
        inline_data: None,
        heat: None,
    }
}

/// Whether any present file of `d` (or below) travels inline.
fn has_inline(d: &DirIndex) -> bool {
    d.files_present.iter().any(|f| f.inline_data.is_some())
        || d.sub_dirs_present.iter().any(has_inline)
}

/// Read the files that travel inline (small: off the async threads, all at once) and encode
/// them, by path. Each is checked against the SHA-256 and size the scan found: a file of
/// a checkpoint dir that changed since is an error, never a wrong index.
async fn read_inline(files: &[&LocalFile]) -> Result<HashMap<PathBuf, String>> {
    let jobs: Vec<(PathBuf, FileDigest)> =
        files.iter().map(|f| (f.path.clone(), f.digest)).collect();
    tokio::task::spawn_blocking(move || {
        let mut out = HashMap::new();
        for (path, digest) in jobs {
            let bytes = std::fs::read(&path)
                .map_err(Error::io_with(format!("read {}", path.display())))?;
            if bytes.len() as u64 != digest.size || Sha256::of(&bytes) != digest.sha256 {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{} changed after it was hashed ({} bytes, {} when scanned): a checkpoint dir must not change",
                        path.display(),
                        bytes.len(),
                        digest.size
                    ),
                ));
            }
            out.insert(path, FileIndex::encode_inline(&bytes));
        }
        Ok(out)
    })
    .await
    .map_err(|e| Error::task("read inline files", e))?
}

/// Which blobs an upload sends: an added mutable file (not `*.sst` or `*.blob`) smaller than
/// `inline_below` travels inline in the index; an added file whose SHA-256 the committed snapshot (or an earlier file of this
/// upload) already holds reuses that blob; every other content is sent once, as
/// `blobs/<id>/<sha256>`. Returns the blob of every content, the files to PUT, the files to
/// carry inline and how many added files were deduplicated.
type BlobPlan<'a> = (
    HashMap<Sha256, String>,
    Vec<&'a LocalFile>,
    Vec<&'a LocalFile>,
    u64,
);

fn plan_blobs<'a>(
    id: CheckpointId,
    committed: Option<&LoadedSnapshot>,
    dd: &'a DirDiff<'a>,
    inline_below: u64,
    pre: &HashMap<Sha256, PreUploaded>,
) -> BlobPlan<'a> {
    let mut blob_of: HashMap<Sha256, String> = HashMap::new();
    if let Some(c) = committed {
        for (_, f) in c.index.present_files() {
            if let (Some(sha), [blob]) = (f.sha256, f.blobs.as_slice()) {
                blob_of.entry(sha).or_insert_with(|| blob.blob_id.clone());
            }
        }
    }
    let mut to_put: Vec<&LocalFile> = Vec::new();
    let mut to_inline: Vec<&LocalFile> = Vec::new();
    let mut deduplicated = 0u64;
    // What the retained files already carry inline counts against the index's budget.
    let mut inline_left = INLINE_BUDGET.saturating_sub(retained_inline_bytes(dd));
    // A file carried inline that came back unchanged (RocksDB's OPTIONS file, the same for the
    // DB's whole open life) would be sent again in every later index: from its first repeat
    // on it is a blob of its own (one PUT, once), which later snapshots share for free.
    for f in retained_inline(dd) {
        let sha = f.digest.sha256;
        if blob_of.contains_key(&sha) {
            deduplicated += 1;
            continue;
        }
        blob_of.insert(sha, StoreScope::blob_id(id, sha));
        to_put.push(f);
    }
    for f in dd.added_files() {
        // Only mutable files (MANIFEST, OPTIONS, CURRENT, a WAL): they change at almost every
        // commit, so a blob of their own would cost a PUT each time. An SST or blob file is
        // immutable and stays a blob, which retained snapshots share for free (inline, it
        // would be sent again in every later index).
        if f.digest.size < inline_below && !is_immutable(&f.name) && f.digest.size <= inline_left {
            inline_left -= f.digest.size;
            to_inline.push(f);
            continue;
        }
        let sha = f.digest.sha256;
        if blob_of.contains_key(&sha) {
            deduplicated += 1;
            continue;
        }
        if let Some(p) = pre.get(&sha) {
            blob_of.insert(sha, p.blob_id.clone());
            continue;
        }
        blob_of.insert(sha, StoreScope::blob_id(id, sha));
        to_put.push(f);
    }
    (blob_of, to_put, to_inline, deduplicated)
}

/// Inline files at least this large that a snapshot retains unchanged become blobs of their
/// own from their first repeat on (one PUT, once; later snapshots name the blob); smaller
/// ones (CURRENT, IDENTITY) cost less inline than a PUT.
pub const SHARE_INLINE_FROM: u64 = 4 << 10;

/// The files `dd` retains (same name and content as the committed snapshot) whose entries
/// carry their content inline and are at least [`SHARE_INLINE_FROM`] bytes.
fn retained_inline<'a>(dd: &'a DirDiff<'a>) -> Vec<&'a LocalFile> {
    fn collect<'a>(d: &'a DirDiff<'a>, out: &mut Vec<&'a LocalFile>) {
        out.extend(
            d.files_retained
                .iter()
                .filter(|(local, prev)| {
                    prev.inline_data.is_some() && local.digest.size >= SHARE_INLINE_FROM
                })
                .map(|(local, _)| *local),
        );
        for sub in d.sub_dirs_added.iter().chain(&d.sub_dirs_retained) {
            collect(sub, out);
        }
    }
    let mut out = Vec::new();
    collect(dd, &mut out);
    out
}

/// Bytes of the files `dd` retains that keep carrying their content inline (their entries
/// keep it; the larger ones become blobs, see `retained_inline`).
fn retained_inline_bytes(dd: &DirDiff<'_>) -> u64 {
    let here: u64 = dd
        .files_retained
        .iter()
        .filter(|(local, prev)| prev.inline_data.is_some() && local.digest.size < SHARE_INLINE_FROM)
        .map(|(_, prev)| prev.file_metadata.size)
        .sum();
    dd.sub_dirs_added
        .iter()
        .chain(&dd.sub_dirs_retained)
        .map(retained_inline_bytes)
        .fold(here, u64::saturating_add)
}

/// The new DirIndex: retained files keep their blob or inline data (with attributes from
/// disk now), added files get their inline data or the blob planned for their content.
fn build_dir(
    d: &DirDiff<'_>,
    blob_of: &HashMap<Sha256, String>,
    inline: &HashMap<PathBuf, String>,
) -> Result<DirIndex> {
    let mut files = Vec::with_capacity(d.files_added.len() + d.files_retained.len());
    for (local, prev) in &d.files_retained {
        // An inline file shared as a blob from its first repeat on (see `plan_blobs`).
        if prev.inline_data.is_some() && local.digest.size >= SHARE_INLINE_FROM {
            if let Some(blob) = blob_of.get(&local.digest.sha256) {
                files.push(file_index(local, blob.clone()));
                continue;
            }
        }
        let mut fi = (*prev).clone();
        fi.file_metadata = local.metadata.clone();
        files.push(fi);
    }
    for f in &d.files_added {
        // By file, not by content: a copy of an inlined content that came past the inline
        // budget is a blob.
        if let Some(data) = inline.get(&f.path) {
            files.push(FileIndex {
                blobs: Vec::new(),
                inline_data: Some(data.clone()),
                heat: None,
                ..file_index(f, String::new())
            });
            continue;
        }
        let blob = blob_of.get(&f.digest.sha256).ok_or_else(|| {
            Error::new(
                ErrorKind::Io,
                format!("internal: no blob planned for {}", f.path.display()),
            )
        })?;
        files.push(file_index(f, blob.clone()));
    }
    let mut dirs = Vec::new();
    for sub in d.sub_dirs_added.iter().chain(&d.sub_dirs_retained) {
        dirs.push(build_dir(sub, blob_of, inline)?);
    }
    Ok(DirIndex {
        dir_name: d.name.clone(),
        files_present: files,
        // A removed inline file is named without its bytes: they are in the previous index,
        // and copying them again made the removed MANIFEST a third of every index.
        files_removed: d
            .files_removed
            .iter()
            .map(|f| FileIndex {
                inline_data: None,
                ..(*f).clone()
            })
            .collect(),
        sub_dirs_present: dirs,
        sub_dirs_removed: d.sub_dirs_removed.iter().map(|d| (*d).clone()).collect(),
    })
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
                    files_reused: s.files_retained + s.blobs_deduplicated,
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

impl BlobBackupManager {
    /// A fork's task: delete the pins none of its snapshots needs any more (best effort: a
    /// pin kept too long only keeps the source's savepoint from being removed).
    async fn release_pins(&self) {
        if !self.release.holds_any() {
            return;
        }
        let window: Vec<Arc<SnapshotIndex>> = match lock(&self.state) {
            Ok(state) => state
                .values()
                .flat_map(|st| st.retained.iter().chain(st.uploaded.values()))
                .map(|s| Arc::clone(&s.index))
                .collect(),
            Err(_) => return,
        };
        if let Err(e) = self
            .release
            .release_unused(window.iter().map(|i| i.as_ref()))
            .await
        {
            tracing::warn!(task = %self.task.task_name, error = %e, "could not release a fork pin; retried at the next commit");
        }
    }

    fn job_scope(&self) -> Result<JobScope> {
        if self.task.job_name == crate::layout::MANUAL_JOB {
            JobScope::manual(&self.task.job_id)
        } else {
            JobScope::new(&self.task.job_name, &self.task.job_id)
        }
    }

    /// Write the writer lease, or refresh it once it is older than a quarter of the grace:
    /// an upload starting now has its lease for at least three quarters of the grace, longer
    /// than the half the abandon rule lets it run.
    async fn renew_lease(&self) -> Result<()> {
        let Some((lease, renewed)) = &self.lease else {
            return Ok(());
        };
        let due = lock(renewed)?.is_none_or(|t| t.elapsed() >= self.settings.gc_grace / 4);
        if due {
            lease
                .announce(self.blob_store.as_ref(), &self.job_scope()?)
                .await?;
            *lock(renewed)? = Some(Instant::now());
        }
        Ok(())
    }
}

impl BlobBackupManager {
    /// The checkpoint naming `markers` is committed: each store's index named there becomes
    /// the baseline of the next upload and joins the retention window. Returns the keys of
    /// pre-uploaded blobs no index named whose files RocksDB has deleted since: waste, which
    /// no commit can name any more ([`PreUploads::settle`]).
    async fn note_committed(
        &self,
        id: CheckpointId,
        markers: &StoreMarkers,
    ) -> Result<Vec<BlobKey>> {
        // Uploads up to this one will never commit now: their clocks are done.
        lock(&self.first_put)?.retain(|k, _| *k > id);
        let mut wasted = Vec::new();
        let generation = {
            let mut g = lock(&self.generations)?;
            let mine = g.get(&id).copied();
            g.retain(|k, _| *k > id);
            mine
        };
        if let Some(generation) = generation {
            for (spec, scope, _) in &self.stores {
                if let Some(pre) = self.pre.get(&spec.name) {
                    for blob in pre.settle(id, generation) {
                        wasted.push(scope.key(&blob)?);
                    }
                }
            }
        }
        self.abandoned_in_a_row
            .store(0, std::sync::atomic::Ordering::Relaxed);
        for (spec, _, _) in &self.stores {
            let Some(marker_str) = markers.get(&spec.name) else {
                continue;
            };
            let marker: IndexMarker = marker_str.parse()?;
            let known = {
                let mut state = lock(&self.state)?;
                let st = state.entry(spec.name.clone()).or_default();
                if st.committed.as_ref().is_some_and(|c| c.marker == marker) {
                    continue;
                }
                let found = st.uploaded.remove(&marker);
                if found.is_some() {
                    // Uploads older than the committed one can never commit now.
                    st.uploaded
                        .retain(|m, _| m.checkpoint_id > marker.checkpoint_id);
                }
                found
            };
            let snap = match known {
                Some(s) => s,
                None => self.load_committed(spec, marker_str).await?,
            };
            tracing::debug!(store = %spec.name, checkpoint = %id, marker = %snap.marker, "committed");
            self.release.note(&snap.index);
            let mut state = lock(&self.state)?;
            let st = state.entry(spec.name.clone()).or_default();
            st.committed = Some(snap.clone());
            if st.retained.back().map(|s| s.marker) != Some(snap.marker) {
                st.retained.push_back(snap);
            }
        }
        Ok(wasted)
    }

    /// The pre-uploaded blobs upload `id` of `store` can name for the table and blob files it
    /// adds (waiting for pre-uploads in flight), by content. Files the committed snapshot
    /// already holds are not asked for (they reuse its blob).
    async fn pre_uploaded(
        &self,
        id: CheckpointId,
        store: &str,
        dd: &DirDiff<'_>,
    ) -> HashMap<Sha256, PreUploaded> {
        let mut out = HashMap::new();
        let Some(pre) = self.pre.get(store) else {
            return out;
        };
        let held: std::collections::HashSet<Sha256> = lock(&self.state)
            .ok()
            .and_then(|s| s.get(store).and_then(|s| s.committed.clone()))
            .map(|c| {
                c.index
                    .present_files()
                    .iter()
                    .filter_map(|(_, f)| f.sha256)
                    .collect()
            })
            .unwrap_or_default();
        let fresh = crate::blob::commit::preupload::fresh_for(self.settings.gc_grace);
        for f in dd.added_files() {
            if !is_immutable(&f.name) || held.contains(&f.digest.sha256) {
                continue;
            }
            let now = self.clock.now_millis();
            if let Some(p) = pre.resolve(id, &f.name, &f.digest, now, fresh).await {
                out.insert(p.digest.sha256, p);
            }
        }
        out
    }

    /// Upload `id` names a blob whose PUT started at `at`: its first PUT is at the latest then.
    fn note_put_at(&self, id: CheckpointId, at: (Instant, u64)) -> Result<()> {
        let mut first = lock(&self.first_put)?;
        let e = first.entry(id).or_insert(at);
        if at.0 < e.0 {
            e.0 = at.0;
        }
        if at.1 < e.1 {
            e.1 = at.1;
        }
        Ok(())
    }

    /// Start the pre-upload workers (once, when the commit manager hands over its ids; in a
    /// tokio runtime only).
    fn start_pre_uploads(&self, ids: crate::backend::IdSource) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(task = %self.task.task_name, "no tokio runtime: no pre-upload");
            return;
        };
        let Ok(mut workers) = lock(&self.workers) else {
            return;
        };
        if !workers.is_empty() {
            return;
        }
        for (spec, scope, cache) in &self.stores {
            let Some(pre) = self.pre.get(&spec.name) else {
                continue;
            };
            let events = crate::local::events::subscribe(&spec.dir);
            let worker = crate::blob::commit::preupload::Worker {
                blob_store: Arc::clone(&self.blob_store),
                scope: scope.clone(),
                cache: cache.clone(),
                ids: Arc::clone(&ids),
                clock: Arc::clone(&self.clock),
            };
            let h = rt.spawn(Arc::clone(pre).run(events, worker));
            workers.push(h.abort_handle());
        }
    }

    /// The time of upload `id`'s first PUT: now, unless a store of the same upload put first.
    fn note_first_put(&self, id: CheckpointId) -> Result<(Instant, u64)> {
        let mut first = lock(&self.first_put)?;
        Ok(*first
            .entry(id)
            .or_insert_with(|| (Instant::now(), self.clock.now_millis())))
    }

    /// Abandon upload `id` if its first PUT is older than half the sweep's grace. Measured on
    /// the monotonic clock and on the task's clock (the one the tests inject), whichever says
    /// longer. An upload that never PUT anything is not bounded.
    ///
    /// `Ok(Some(left))`: the time left before the bound (on whichever clock says less).
    fn check_age(&self, id: CheckpointId, what: &str) -> Result<Option<std::time::Duration>> {
        let Some((t0, t0_ms)) = lock(&self.first_put)?.get(&id).copied() else {
            return Ok(None);
        };
        let ran = t0.elapsed().max(std::time::Duration::from_millis(
            self.clock.now_millis().saturating_sub(t0_ms),
        ));
        if self.settings.abandon_rule && ran > self.settings.gc_grace / 2 {
            lock(&self.first_put)?.remove(&id);
            metrics::counter!("blobsnap_commit_abandoned_total", "task" => self.task.task_name.clone())
                .increment(1);
            let n = self
                .abandoned_in_a_row
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            if n >= ABANDON_LIMIT {
                // Not transient: every next commit uploads at least as much and is abandoned
                // again (a livelock that never commits). Stop the task, saying what to change.
                return Err(Error::invalid(format!(
                    "{what} at {id}: {n} commits in a row were abandoned because their uploads outlived half the sweep's grace ({:?}; this one's first PUT was {ran:?} ago): the store's uploads take longer than gc-grace / 2. Raise job.gc-grace-secs above twice the upload time, or make each commit upload less",
                    self.settings.gc_grace
                )));
            }
            return Err(Error::transient(format!(
                "{what} at {id}: its first PUT was {ran:?} ago, over half the sweep's grace ({:?}): abandoned ({n} in a row); the next commit starts afresh",
                self.settings.gc_grace
            )));
        }
        if !self.settings.abandon_rule {
            return Ok(None);
        }
        Ok(Some((self.settings.gc_grace / 2).saturating_sub(ran)))
    }

    /// What leaves retention now: exactly
    /// `blobs(leaving) − blobs(retained ∪ uploaded-but-uncommitted)`, computed by key from the
    /// indexes in hand (no listing), and the leaving indexes — every store's, for one batch
    /// delete for the whole task (DESIGN §7 step 4). Changes nothing:
    /// [`retire`](Self::retire) takes the snapshots out of the window once their deletes were
    /// sent or handed over.
    fn expiry(&self) -> Result<Expiry> {
        let mut out = Expiry::default();
        for (spec, scope, _) in &self.stores {
            let (leaving, keep) = {
                let state = lock(&self.state)?;
                let Some(st) = state.get(&spec.name) else {
                    continue;
                };
                let n = st
                    .retained
                    .len()
                    .saturating_sub(self.settings.retention.max(1));
                if n == 0 {
                    continue;
                }
                let leaving: Vec<LoadedSnapshot> = st.retained.iter().take(n).cloned().collect();
                let keep: Vec<LoadedSnapshot> = st
                    .retained
                    .iter()
                    .skip(n)
                    .chain(st.uploaded.values())
                    .cloned()
                    .collect();
                (leaving, keep)
            };
            let mut doomed = BTreeMap::new();
            for l in &leaving {
                doomed.extend(blob_keys(scope, &l.index)?);
            }
            for k in &keep {
                for key in blob_keys(scope, &k.index)?.keys() {
                    doomed.remove(key);
                }
            }
            out.stats.bytes_deleted += doomed.values().sum::<u64>();
            out.stats.blobs_deleted += doomed.len() as u64;
            out.keys.extend(doomed.into_keys());
            // A leaving index goes unless a snapshot kept names the same marker (markers are
            // carried forward: DESIGN §7 step 4).
            for l in &leaving {
                if !keep.iter().any(|k| k.marker == l.marker) {
                    out.keys.push(scope.index_key(&l.marker)?);
                }
                tracing::info!(store = %spec.name, expired = %l.marker, "snapshot left retention");
            }
            out.stats.snapshots_expired += leaving.len() as u64;
            out.leaving.push((spec.name.clone(), leaving.len()));
        }
        Ok(out)
    }

    /// Take the snapshots of `expiry` out of the retention window and count them.
    fn retire(&self, expiry: Expiry) -> Result<()> {
        {
            let mut state = lock(&self.state)?;
            for (store, n) in expiry.leaving {
                if let Some(st) = state.get_mut(&store) {
                    for _ in 0..n {
                        st.retained.pop_front();
                    }
                }
            }
        }
        let total = expiry.stats;
        if total.snapshots_expired > 0 {
            let labels = [("task", self.task.task_name.clone())];
            metrics::counter!("blobsnap_gc_blobs_deleted_total", &labels)
                .increment(total.blobs_deleted);
            metrics::counter!("blobsnap_gc_bytes_deleted_total", &labels)
                .increment(total.bytes_deleted);
        }
        let mut c = lock(&self.cleanup_stats)?;
        c.snapshots_expired += total.snapshots_expired;
        c.blobs_deleted += total.blobs_deleted;
        c.bytes_deleted += total.bytes_deleted;
        Ok(())
    }

    /// What cleanup has deleted since this manager was created.
    pub fn cleanup_stats(&self) -> CleanupStats {
        self.cleanup_stats.lock().map(|c| *c).unwrap_or_default()
    }
}
