//! Pre-upload: each table or blob file RocksDB finishes is uploaded in the background, before
//! any commit needs it, so that a commit after a compaction burst uploads almost nothing
//! (DESIGN §7 step 2, "Pre-upload").
//!
//! Per store, a worker takes the [`FileEvent`]s of the store's open database
//! ([`crate::local::events`]); for each finished `*.sst` or `*.blob` it hashes the file once
//! (SHA-256 and CRC32; the hash cache records it, so the commit's scan proves the file's hard
//! link without reading it) and PUTs it create-only under `blobs/<id>/<sha256>`, where `id` is
//! a fresh id of the task's checkpoint-id generator: it carries the task's epoch and is never
//! a commit's, so no other upload, epoch or process ever makes that key, and it is never
//! written twice. The PUTs run in the transfer budget's background lane
//! ([`crate::blobstore::limit::background`]): at most half the process's window, below the
//! commits' uploads, under the same bandwidth and request limits. At most
//! [`PRE_UPLOADS_IN_HAND`] per store at once.
//!
//! A commit's upload then asks [`PreUploads::resolve`] for each table or blob file it adds:
//!
//! - **done** (same content, PUT younger than [`fresh_for`]) — the index names the
//!   pre-uploaded blob, nothing is sent, and the PUT's start counts as the commit's first PUT
//!   for the abandon rule;
//! - **uploading** — the commit waits for that PUT, then as above (the file is sent once);
//! - **queued, unknown, failed, stale** — the file is the commit's (claimed: the worker skips
//!   it), uploaded under the commit's own id as before. A stale blob (older than
//!   [`fresh_for`]) is never named: the sweep's grace could be running out on it.
//!
//! **Soundness** (DESIGN §5, §7). A pre-uploaded blob is an orphan until a committed index
//! names it; cleanup's deletes are computed from indexes, so it never deletes one a snapshot
//! names; the sweep deletes it only once it is older than the grace, and a commit names only
//! blobs younger than [`fresh_for`] (a quarter of the grace) and is abandoned once its first
//! PUT — a named pre-upload's included — is half a grace old. A crash loses only the
//! in-memory registry: the orphans are the sweep's.
//!
//! **Waste.** A file RocksDB deletes (compacted away) before any commit named its blob was
//! uploaded for nothing: counted (`blobsnap_preupload_waste_bytes_total`), and its blob is
//! deleted with the next commit's batch of deletes — only once no commit can name it any more
//! (see [`PreUploads::settle`]). A pre-upload a commit named stays until the snapshots naming
//! it leave retention, like every blob.
//!
//! Lock order: one lock per store's registry, taken alone, never across I/O or an await.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::sync::Notify;

use crate::backend::Clock;
use crate::blobstore::{BlobKey, BlobStore, PutBody, PutOptions};
use crate::checkpoint::CheckpointId;
use crate::digest::FileDigest;
use crate::error::{Error, ErrorKind, Result};
use crate::layout::StoreScope;
use crate::local::events::FileEvent;
use crate::local::hashcache::{CacheKey, HashCache};
use crate::local::scan::is_immutable;

/// Pre-uploads of one store in flight at once.
pub const PRE_UPLOADS_IN_HAND: usize = 2;

pub use crate::backend::IdSource;

/// How long a pre-uploaded blob may be named by a commit: a quarter of the sweep's grace
/// (the commit then has another quarter before the abandon rule stops it, and the sweep
/// leaves objects younger than the whole grace alone).
pub fn fresh_for(gc_grace: Duration) -> Duration {
    gc_grace / 4
}

/// A finished pre-upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreUploaded {
    /// The file's content.
    pub digest: FileDigest,
    /// Its blob id (scope-relative: `blobs/<id>/<sha256>`).
    pub blob_id: String,
    /// When its PUT started: monotonic, and on the task's clock (ms).
    pub put_at: (Instant, u64),
}

#[derive(Debug)]
enum State {
    /// Waiting for the worker.
    Queued,
    /// Being hashed and uploaded; notified when done.
    Uploading(Arc<Notify>),
    /// Uploaded.
    Done(PreUploaded),
    /// A commit took it (uploads it itself), or the pre-upload failed or went stale: the
    /// worker leaves it alone.
    Claimed,
}

#[derive(Debug)]
struct Entry {
    state: State,
    /// The snapshot generation at which RocksDB deleted the file (see [`PreUploads::settle`]).
    deleted_gen: Option<u64>,
    /// The uploads whose index named the pre-uploaded blob.
    named_in: BTreeSet<CheckpointId>,
}

impl Entry {
    fn new(state: State) -> Self {
        Entry {
            state,
            deleted_gen: None,
            named_in: BTreeSet::new(),
        }
    }
}

/// Counters of one store's pre-uploads since the process started.
#[derive(Debug, Default)]
pub struct PreUploadStats {
    /// Files pre-uploaded.
    pub files: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
    /// Pre-uploaded files a commit named (uploaded by no commit).
    pub files_used: AtomicU64,
    /// Their bytes.
    pub bytes_used: AtomicU64,
    /// Pre-uploaded files no commit named (RocksDB deleted them first, or they went stale).
    pub files_wasted: AtomicU64,
    /// Their bytes.
    pub bytes_wasted: AtomicU64,
    /// Finished files deleted before their pre-upload could read them (nothing sent).
    pub files_skipped: AtomicU64,
    /// Files waiting for the worker now.
    pub queued: AtomicU64,
}

/// What a store's pre-uploads did (a copy of [`PreUploadStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreUploadTotals {
    /// Files pre-uploaded.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Pre-uploaded files a commit named.
    pub files_used: u64,
    /// Their bytes.
    pub bytes_used: u64,
    /// Pre-uploaded files no commit named.
    pub files_wasted: u64,
    /// Their bytes.
    pub bytes_wasted: u64,
    /// Finished files deleted before their pre-upload read them.
    pub files_skipped: u64,
    /// Files waiting now.
    pub queued: u64,
}

/// One store's pre-upload registry: what the worker did, what the commits took.
#[derive(Debug)]
pub struct PreUploads {
    task: String,
    store: String,
    files: Mutex<HashMap<String, Entry>>,
    /// The task's snapshot generation: bumped by every commit's sync stage, after it made its
    /// checkpoint dirs (shared by the task's stores).
    generation: Arc<AtomicU64>,
    stats: PreUploadStats,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain maps and states, each change made whole under the lock.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn name_of(path: &Path) -> Option<String> {
    path.file_name()?.to_str().map(str::to_string)
}

/// What the worker needs besides the registry.
pub(crate) struct Worker {
    pub(crate) blob_store: Arc<dyn BlobStore>,
    pub(crate) scope: StoreScope,
    pub(crate) cache: Option<Arc<HashCache>>,
    pub(crate) ids: IdSource,
    pub(crate) clock: Arc<dyn Clock>,
}

impl PreUploads {
    /// An empty registry for `store` of `task`, on the task's snapshot `generation`.
    pub fn new(task: &str, store: &str, generation: Arc<AtomicU64>) -> Self {
        PreUploads {
            task: task.to_string(),
            store: store.to_string(),
            files: Mutex::default(),
            generation,
            stats: PreUploadStats::default(),
        }
    }

    /// The counters so far.
    pub fn totals(&self) -> PreUploadTotals {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PreUploadTotals {
            files: l(&s.files),
            bytes: l(&s.bytes),
            files_used: l(&s.files_used),
            bytes_used: l(&s.bytes_used),
            files_wasted: l(&s.files_wasted),
            bytes_wasted: l(&s.bytes_wasted),
            files_skipped: l(&s.files_skipped),
            queued: l(&s.queued),
        }
    }

    fn labels(&self) -> [(&'static str, String); 2] {
        [("task", self.task.clone()), ("store", self.store.clone())]
    }

    fn set_queued(&self, delta: i64) {
        let n = if delta >= 0 {
            self.stats.queued.fetch_add(delta as u64, Ordering::Relaxed) + delta as u64
        } else {
            self.stats
                .queued
                .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed)
                .saturating_sub(delta.unsigned_abs())
        };
        metrics::gauge!("blobsnap_preupload_queue_depth", &self.labels()).set(n as f64);
    }

    /// The current snapshot generation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Run the worker until `events` ends (the database closed and every subscriber left) or
    /// the returned future is dropped.
    pub(crate) async fn run(
        self: Arc<Self>,
        mut events: tokio::sync::mpsc::UnboundedReceiver<FileEvent>,
        worker: Worker,
    ) {
        let worker = Arc::new(worker);
        self.set_queued(0);
        let mut in_hand = futures::stream::FuturesUnordered::new();
        let mut backlog: std::collections::VecDeque<PathBuf> = Default::default();
        loop {
            while in_hand.len() < PRE_UPLOADS_IN_HAND {
                let Some(path) = backlog.pop_front() else {
                    break;
                };
                let (me, w) = (Arc::clone(&self), Arc::clone(&worker));
                in_hand.push(async move { me.pre_upload(&w, path).await });
            }
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(FileEvent::Finished(path)) => {
                        if self.queue(&path) {
                            backlog.push_back(path);
                        }
                    }
                    Some(FileEvent::Deleted(path)) => self.deleted(&path),
                    None => break,
                },
                Some(()) = in_hand.next(), if !in_hand.is_empty() => {}
            }
        }
        while in_hand.next().await.is_some() {}
    }

    /// A finished file: queued unless it is not a table or blob file or a commit has it.
    fn queue(&self, path: &Path) -> bool {
        let Some(name) = name_of(path).filter(|n| is_immutable(n)) else {
            return false;
        };
        let mut files = lock(&self.files);
        if files.contains_key(&name) {
            return false;
        }
        files.insert(name, Entry::new(State::Queued));
        drop(files);
        self.set_queued(1);
        true
    }

    fn deleted(&self, path: &Path) {
        let Some(name) = name_of(path) else { return };
        let generation = self.generation();
        if let Some(e) = lock(&self.files).get_mut(&name) {
            e.deleted_gen.get_or_insert(generation);
        }
    }

    /// Hash and upload one queued file.
    async fn pre_upload(&self, w: &Worker, path: PathBuf) {
        let Some(name) = name_of(&path) else { return };
        let notify = Arc::new(Notify::new());
        {
            let mut files = lock(&self.files);
            let Some(e) = files.get_mut(&name) else {
                return;
            };
            if !matches!(e.state, State::Queued) {
                return; // claimed by a commit meanwhile
            }
            e.state = State::Uploading(Arc::clone(&notify));
        }
        self.set_queued(-1);
        let outcome = self.hash_and_put(w, &name, &path).await;
        {
            let mut files = lock(&self.files);
            if let Some(e) = files.get_mut(&name) {
                e.state = match &outcome {
                    Ok(Some(done)) => State::Done(done.clone()),
                    _ => State::Claimed,
                };
            }
        }
        notify.notify_waiters();
        match outcome {
            Ok(Some(done)) => {
                self.stats.files.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .bytes
                    .fetch_add(done.digest.size, Ordering::Relaxed);
                metrics::counter!("blobsnap_preupload_files_total", &self.labels()).increment(1);
                metrics::counter!("blobsnap_preupload_bytes_total", &self.labels())
                    .increment(done.digest.size);
                tracing::debug!(store = %self.store, file = %name, blob = %done.blob_id, bytes = done.digest.size, "pre-uploaded");
            }
            Ok(None) => {
                self.stats.files_skipped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(store = %self.store, file = %name, "deleted before its pre-upload: skipped");
            }
            Err(e) => {
                tracing::warn!(store = %self.store, file = %name, error = %e, "pre-upload failed; the next commit uploads the file");
            }
        }
    }

    /// `Ok(None)`: the file was gone before it could be read (compacted away).
    async fn hash_and_put(
        &self,
        w: &Worker,
        name: &str,
        path: &Path,
    ) -> Result<Option<PreUploaded>> {
        let (p, n, cache) = (path.to_path_buf(), name.to_string(), w.cache.clone());
        let hashed = tokio::task::spawn_blocking(move || -> Result<Option<FileDigest>> {
            let md = match std::fs::symlink_metadata(&p) {
                Ok(md) => md,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(Error::io(format!("stat {}", p.display()), e)),
            };
            let key = CacheKey::of(&n, &md);
            if let Some(d) = cache.as_ref().and_then(|c| c.get(&key)) {
                return Ok(Some(d));
            }
            let d = match crate::digest::hash_file(&p) {
                Ok(d) => d,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            if d.size != key.size {
                return Err(Error::invalid(format!(
                    "{} changed while being hashed ({} bytes, then {})",
                    p.display(),
                    key.size,
                    d.size
                )));
            }
            if let Some(c) = &cache {
                c.insert(key, d);
            }
            Ok(Some(d))
        })
        .await
        .map_err(|e| Error::task("pre-upload hash", e))??;
        let Some(digest) = hashed else {
            return Ok(None);
        };
        let id = (w.ids)()?;
        let blob_id = StoreScope::blob_id(id, digest.sha256);
        let key: BlobKey = w.scope.key(&blob_id)?;
        let put_at = (Instant::now(), w.clock.now_millis());
        let put = crate::blobstore::limit::background(w.blob_store.put(
            &key,
            PutBody::File {
                path: path.to_path_buf(),
                len: digest.size,
            },
            PutOptions::create_only(digest.sha256).with_crc32(digest.crc32),
        ))
        .await;
        match put {
            Ok(_) => {
                crate::crash::point("preupload.after-put");
                Ok(Some(PreUploaded {
                    digest,
                    blob_id,
                    put_at,
                }))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.context(format!("pre-upload {} as {key}", path.display()))),
        }
    }

    /// For a commit `id` adding the table or blob file `name` with `digest`: the pre-uploaded
    /// blob to name (waiting for a pre-upload in flight), or `None` — the commit uploads the
    /// file itself, and the worker leaves it alone from now on. `now_ms` is the task clock's
    /// now; `fresh` the age past which a pre-upload is not named ([`fresh_for`]).
    pub async fn resolve(
        &self,
        id: CheckpointId,
        name: &str,
        digest: &FileDigest,
        now_ms: u64,
        fresh: Duration,
    ) -> Option<PreUploaded> {
        loop {
            let wait = {
                let mut files = lock(&self.files);
                let e = files
                    .entry(name.to_string())
                    .or_insert_with(|| Entry::new(State::Claimed));
                match &e.state {
                    State::Uploading(n) => {
                        // Registered before the lock is let go: the worker's notify after its
                        // state change reaches it.
                        let n = Arc::clone(n);
                        Some(n)
                    }
                    State::Queued => {
                        e.state = State::Claimed;
                        drop(files);
                        self.set_queued(-1);
                        return None;
                    }
                    State::Claimed => return None,
                    State::Done(d) => {
                        let age = d
                            .put_at
                            .0
                            .elapsed()
                            .max(Duration::from_millis(now_ms.saturating_sub(d.put_at.1)));
                        if d.digest.sha256 != digest.sha256 || d.digest.size != digest.size {
                            return None;
                        }
                        if age > fresh {
                            // Never named now: waste once nothing else can (see `settle`).
                            tracing::info!(store = %self.store, file = %name, ?age, "pre-upload too old to be named; the commit uploads the file again");
                            return None;
                        }
                        e.named_in.insert(id);
                        return Some(d.clone());
                    }
                }
            };
            if let Some(n) = wait {
                let notified = n.notified();
                tokio::pin!(notified);
                // Enable before re-checking: a notify between the check and the await is kept.
                notified.as_mut().enable();
                let still = matches!(
                    lock(&self.files).get(name).map(|e| &e.state),
                    Some(State::Uploading(m)) if Arc::ptr_eq(m, &n)
                );
                if still {
                    notified.await;
                }
            }
        }
    }

    /// Count the pre-uploads commit `id` named (called once its upload is done).
    pub fn used(&self, files: u64, bytes: u64) {
        self.stats.files_used.fetch_add(files, Ordering::Relaxed);
        self.stats.bytes_used.fetch_add(bytes, Ordering::Relaxed);
        metrics::counter!("blobsnap_preupload_used_files_total", &self.labels()).increment(files);
        metrics::counter!("blobsnap_preupload_used_bytes_total", &self.labels()).increment(bytes);
    }

    /// Checkpoint `committed`, whose sync stage was generation `generation`, is committed:
    /// forget what it named (its index is the baseline now) and the files RocksDB deleted that
    /// no commit can name any more. Returns the blob ids of pre-uploads no index ever named:
    /// deleting them is safe (no snapshot names them, and none will).
    ///
    /// Why `deleted_gen + 1 <= generation`: a file RocksDB deleted while the generation was
    /// `g` can be in the checkpoint dir of the sync stage that made generation `g + 1` (made
    /// before the deletion was heard), never in a later one; commits run one at a time, so once
    /// the commit of generation `g + 1` or later is committed, none that could name the file
    /// is still running.
    pub fn settle(&self, committed: CheckpointId, generation: u64) -> Vec<String> {
        let mut doomed = Vec::new();
        let (mut wasted, mut wasted_bytes) = (0u64, 0u64);
        lock(&self.files).retain(|_, e| {
            if e.named_in.contains(&committed) {
                return false; // the committed index names it
            }
            let gone = e.deleted_gen.is_some_and(|g| g < generation);
            if !gone {
                return true;
            }
            if let State::Done(d) = &e.state {
                wasted += 1;
                wasted_bytes += d.digest.size;
                if e.named_in.is_empty() {
                    doomed.push(d.blob_id.clone());
                }
            }
            false
        });
        if wasted > 0 {
            self.stats.files_wasted.fetch_add(wasted, Ordering::Relaxed);
            self.stats
                .bytes_wasted
                .fetch_add(wasted_bytes, Ordering::Relaxed);
            metrics::counter!("blobsnap_preupload_waste_files_total", &self.labels())
                .increment(wasted);
            metrics::counter!("blobsnap_preupload_waste_bytes_total", &self.labels())
                .increment(wasted_bytes);
        }
        doomed
    }
}
