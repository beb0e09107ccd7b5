//! Lazy restore (`restore-mode = "lazy"`): a store opens before its SST and blob files are
//! local. The restore writes the small files (CURRENT, MANIFEST, OPTIONS…) and registers
//! every immutable file still to download here as *remote*; the store is then opened on
//! RocksDB's `blobsnap-lazy` Env (a file system wrapper, `cpp/lazy_fs.cc`, reached through
//! `ffi`), which asks this registry before RocksDB touches a file:
//!
//! - opening a remote file fetches it first, with priority, verified whole (size and SHA-256)
//!   and renamed into place before RocksDB reads a byte; a fetch that fails is an I/O error
//!   inside RocksDB (the read fails, the task stops), never wrong data;
//! - its existence and size are answered from the index entry (no fetch);
//! - a hard link of it (a RocksDB checkpoint) is recorded, not made: the checkpoint dir's
//!   scan ([`remote_files_in`]) lists it with the index entry's SHA-256, size and CRC, so the
//!   next snapshot reuses the blob it already has — a remote file is never hashed, cached or
//!   uploaded, and every retained snapshot of a still-remote file names its blob, so retention
//!   cannot delete it;
//! - deleting it (the live DB compacted it away) drops it: the background download skips it.
//!
//! Meanwhile a background download fetches every remote file, verified, at a bounded rate and
//! concurrency, until the store is complete ([`status`], [`wait_complete`]). What is durable
//! is the snapshot's index (the committed checkpoint names it): a process killed while files
//! are remote leaves a store dir that lacks them, and the next start's restore plans against
//! the index and fetches exactly those (lazily again or in full). The registry is the
//! in-process manifest of the remote files.

mod ffi;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use futures::future::BoxFuture;
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::hashcache::CacheKey;
use crate::digest::FileDigest;
use crate::error::{Error, Result};
use crate::index::{FileIndex, LAZY_PENDING};

/// The options string that selects the lazy file system for a RocksDB open.
pub const ENV_OPTION: &str = "env=blobsnap-lazy";

/// While files are remote, RocksDB keeps at most this many files open (its table cache is
/// this minus 10): a DB open then loads at most 2 tables, so it fetches at most 2 files
/// before the first read, whatever the store's size (with `max_open_files = -1` it would open,
/// and so fetch, every SST).
pub const LAZY_MAX_OPEN_FILES: i32 = 20;

/// Fetches one remote file into a temporary path, verified against its entry (size and
/// SHA-256) and fsynced; called on the lazy restore's own runtime.
pub type FetchFn = Arc<dyn Fn(FileIndex, PathBuf) -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// How the background download of a lazily restored store runs.
#[derive(Clone, Copy, Debug)]
pub struct Background {
    /// Files fetched at once in the background (foreground fetches do not count).
    pub downloads: usize,
    /// Bytes per second the background download stays under (0: no bound).
    pub max_rate: u64,
}

/// The background download's default bound, bytes/s (`[job] lazy-download-rate`): on the
/// recovery bench's 2 cores it keeps the task at 72–73 % of its steady throughput while the
/// store downloads (49 % unbounded; benches/RESULTS.md §2).
pub const DEFAULT_RATE: u64 = 200 << 20;

impl Default for Background {
    fn default() -> Self {
        Background {
            downloads: 2,
            max_rate: DEFAULT_RATE,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum FileState {
    Remote,
    Fetching,
    Local,
    Dropped,
    Failed(String),
}

#[derive(Debug)]
struct Remote {
    name: String,
    entry: FileIndex,
    state: Mutex<FileState>,
    changed: Condvar,
}

impl Remote {
    fn state(&self) -> MutexGuard<'_, FileState> {
        // A panic while holding this lock leaves a valid state (every write is one assignment).
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_remote(&self) -> bool {
        matches!(
            *self.state(),
            FileState::Remote | FileState::Fetching | FileState::Failed(_)
        )
    }
}

/// Counters of one lazily restored store.
#[derive(Debug, Default)]
pub struct LazyProgress {
    /// Files fetched because RocksDB opened them.
    pub files_on_demand: AtomicU64,
    /// Their bytes.
    pub bytes_on_demand: AtomicU64,
    /// Files fetched by the background download.
    pub files_background: AtomicU64,
    /// Their bytes.
    pub bytes_background: AtomicU64,
    /// Files dropped (deleted by RocksDB while remote) and so never fetched.
    pub files_dropped: AtomicU64,
}

/// Where a lazily restored store stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LazyStatus {
    /// Files still remote.
    pub files_remote: u64,
    /// Their bytes.
    pub bytes_remote: u64,
    /// Files whose last fetch failed (retried when RocksDB opens them).
    pub files_failed: u64,
    /// Files fetched on demand / in the background, and dropped.
    pub files_on_demand: u64,
    /// Bytes fetched on demand.
    pub bytes_on_demand: u64,
    /// Files fetched in the background.
    pub files_background: u64,
    /// Bytes fetched in the background.
    pub bytes_background: u64,
    /// Files dropped before they were fetched.
    pub files_dropped: u64,
}

struct LazyStore {
    dir: PathBuf,
    files: BTreeMap<String, Arc<Remote>>,
    fetch: FetchFn,
    cancel: CancellationToken,
    progress: LazyProgress,
    done: tokio::sync::watch::Sender<bool>,
    /// Held while a fetched file is renamed into the dir, and by [`close`] while it cancels:
    /// once closed, nothing more is placed (a later restore may have swapped a new tree in).
    placing: Mutex<()>,
}

impl LazyStore {
    fn placing(&self) -> MutexGuard<'_, ()> {
        self.placing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl LazyStore {
    fn status(&self) -> LazyStatus {
        let mut s = LazyStatus::default();
        for r in self.files.values() {
            match &*r.state() {
                FileState::Remote | FileState::Fetching => {
                    s.files_remote += 1;
                    s.bytes_remote += r.entry.file_metadata.size;
                }
                FileState::Failed(_) => {
                    s.files_remote += 1;
                    s.files_failed += 1;
                    s.bytes_remote += r.entry.file_metadata.size;
                }
                FileState::Local | FileState::Dropped => {}
            }
        }
        let p = &self.progress;
        s.files_on_demand = p.files_on_demand.load(Ordering::Relaxed);
        s.bytes_on_demand = p.bytes_on_demand.load(Ordering::Relaxed);
        s.files_background = p.files_background.load(Ordering::Relaxed);
        s.bytes_background = p.bytes_background.load(Ordering::Relaxed);
        s.files_dropped = p.files_dropped.load(Ordering::Relaxed);
        s
    }
}

#[derive(Default)]
struct Registry {
    /// Lazily restored store dirs.
    stores: HashMap<PathBuf, Arc<LazyStore>>,
    /// Checkpoint dirs, and the remote files RocksDB "linked" into them.
    links: HashMap<PathBuf, BTreeMap<String, Arc<Remote>>>,
}

/// Entries in the registry (stores + link dirs): 0 makes every callback a no-op at once.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Files a lazy restore fetched and verified, by the hash-cache key of the file as placed
/// (name, device, inode, size, mtime), per store dir: a checkpoint's hard link of one has the
/// same key, so the backup's scan takes its SHA-256 from here instead of reading the file
/// ([`proof`]) and records it in its own hash cache. Dropped when the store closes.
fn proofs() -> MutexGuard<'static, HashMap<PathBuf, HashMap<CacheKey, FileDigest>>> {
    static P: OnceLock<Mutex<HashMap<PathBuf, HashMap<CacheKey, FileDigest>>>> = OnceLock::new();
    P.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The digest of the immutable file whose hash-cache key is `key`, when a lazy restore of
/// this process fetched, verified and placed that very inode.
pub fn proof(key: &CacheKey) -> Option<FileDigest> {
    let p = proofs();
    p.values().find_map(|m| m.get(key).copied())
}

fn record_proof(dir: &Path, remote: &Remote, dest: &Path) {
    let (Some(sha256), Ok(md)) = (remote.entry.sha256, std::fs::symlink_metadata(dest)) else {
        return;
    };
    let digest = FileDigest {
        sha256,
        crc32: remote.entry.checksum,
        size: md.len(),
    };
    proofs()
        .entry(dir.to_path_buf())
        .or_default()
        .insert(CacheKey::of(&remote.name, &md), digest);
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn count(r: &Registry) {
    ACTIVE.store(r.stores.len() + r.links.len(), Ordering::Release);
}

/// The runtime the fetches run on: its own, so that a RocksDB read blocked on a fetch never
/// waits for a runtime thread it is itself holding.
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("blobsnap-lazy")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| {
        Error::new(
            crate::error::ErrorKind::Io,
            format!("lazy restore runtime: {e}"),
        )
    })
}

fn split(path: &Path) -> Option<(&Path, &str)> {
    Some((path.parent()?, path.file_name()?.to_str()?))
}

/// The key a dir is registered under: absolute, lexically (no symlink resolution: RocksDB is
/// handed the same absolute path).
pub fn absolute(dir: &Path) -> Result<PathBuf> {
    std::path::absolute(dir).map_err(Error::io_with(format!(
        "absolute path of {}",
        dir.display()
    )))
}

/// Register the store at `dir` as lazily restored: `files` (immutable files of the snapshot,
/// not in `dir`) are remote, fetched by `fetch`; starts their background download. Replaces
/// (and stops) an earlier registration of the same dir. Installs the lazy file system.
pub fn register(
    dir: &Path,
    files: Vec<FileIndex>,
    fetch: FetchFn,
    background: Background,
) -> Result<()> {
    ffi::install();
    let dir = absolute(dir)?;
    let progress = LazyProgress::default();
    let files = files
        .into_iter()
        .map(|entry| {
            let r = Remote {
                name: entry.file_name.clone(),
                entry,
                state: Mutex::new(FileState::Remote),
                changed: Condvar::new(),
            };
            (r.name.clone(), Arc::new(r))
        })
        .collect();
    let (done, _) = tokio::sync::watch::channel(false);
    let store = Arc::new(LazyStore {
        dir: dir.clone(),
        files,
        fetch,
        cancel: CancellationToken::new(),
        progress,
        done,
        placing: Mutex::new(()),
    });
    {
        let mut r = registry();
        if let Some(old) = r.stores.insert(dir.clone(), Arc::clone(&store)) {
            let _placing = old.placing();
            old.cancel.cancel();
            let _ = old.done.send(true);
        }
        count(&r);
    }
    runtime()?.spawn(download_all(store, background));
    Ok(())
}

/// Record in `dir` (a restore's staging tree, before it is swapped in) that `files` are
/// remote: [`LAZY_PENDING`], the durable list of them (name, size, SHA-256, blob), fsynced.
/// It is removed once every file is local; while it is there, the dir is not a complete
/// database and nothing opens or backs it up as one ([`check_complete`]).
pub fn write_pending(dir: &Path, files: &[FileIndex]) -> Result<()> {
    use std::io::Write as _;
    let path = dir.join(LAZY_PENDING);
    let bytes = serde_json::to_vec(files)
        .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
        .map_err(Error::io_with(format!("write {}", path.display())))
}

/// `Err` when `dir` holds a lazy restore's files-still-remote list and no lazy restore of this
/// process serves it (the process that restored it stopped or died before every file was
/// local): its database names files that are not there. A restore completes it.
pub fn check_complete(dir: &Path) -> Result<()> {
    if !dir.join(LAZY_PENDING).exists() || is_lazy(dir) {
        return Ok(());
    }
    Err(Error::new(
        crate::error::ErrorKind::InvalidInput,
        format!(
            "{} is an incomplete lazy restore ({LAZY_PENDING} lists files still only in the blob store): restore it again before opening or backing it up",
            dir.display()
        ),
    ))
}

/// Whether `dir` is a lazily restored store with files still remote (open it with
/// [`ENV_OPTION`]).
pub fn is_lazy(dir: &Path) -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Ok(dir) = absolute(dir) else { return false };
    registry().stores.contains_key(&dir)
}

/// Where the lazily restored store at `dir` stands (`None`: not lazy, or complete).
pub fn status(dir: &Path) -> Option<LazyStatus> {
    let dir = absolute(dir).ok()?;
    let store = registry().stores.get(&dir).cloned()?;
    Some(store.status())
}

/// Wait until the store at `dir` has every file local (returns at once when it is not lazy);
/// `Err` when its background download ended with files it could not fetch.
pub async fn wait_complete(dir: &Path) -> Result<()> {
    let dir = absolute(dir)?;
    let Some(store) = registry().stores.get(&dir).cloned() else {
        return Ok(());
    };
    let mut rx = store.done.subscribe();
    let _ = rx.wait_for(|d| *d).await;
    let st = store.status();
    if st.files_remote > 0 {
        return Err(Error::new(
            crate::error::ErrorKind::Io,
            format!(
                "lazy restore of {}: {} files could not be fetched",
                dir.display(),
                st.files_remote
            ),
        ));
    }
    Ok(())
}

/// Stop the background download of the store at `dir` and forget it (its DB is closed).
/// What is still remote stays missing on disk; the next restore fetches it.
pub fn close(dir: &Path) {
    let Ok(dir) = absolute(dir) else { return };
    let mut r = registry();
    if let Some(s) = r.stores.remove(&dir) {
        let _placing = s.placing();
        s.cancel.cancel();
        // Every file local (read on demand before the background got to it): complete.
        if s.status().files_remote == 0 {
            let _ = std::fs::remove_file(dir.join(LAZY_PENDING));
        }
        let _ = s.done.send(true);
    }
    count(&r);
    drop(r);
    proofs().remove(&dir);
}

/// The remote files RocksDB linked into `dir` (a checkpoint of a lazily restored store), as
/// the scan reports files: name, digest (from the index entry: nothing read) and entry.
pub fn remote_files_in(dir: &Path) -> Vec<(String, FileDigest, FileIndex)> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let Ok(dir) = absolute(dir) else {
        return Vec::new();
    };
    let r = registry();
    let Some(links) = r.links.get(&dir) else {
        return Vec::new();
    };
    links
        .iter()
        .filter_map(|(name, remote)| {
            let sha256 = remote.entry.sha256?;
            let digest = FileDigest {
                sha256,
                crc32: remote.entry.checksum,
                size: remote.entry.file_metadata.size,
            };
            Some((name.clone(), digest, remote.entry.clone()))
        })
        .collect()
}

fn find(r: &Registry, path: &Path) -> Option<(Arc<LazyStore>, Arc<Remote>)> {
    let (dir, name) = split(path)?;
    let store = r.stores.get(dir)?;
    let remote = store.files.get(name)?;
    Some((Arc::clone(store), Arc::clone(remote)))
}

// ---- the file system's questions (called by `ffi` from RocksDB's threads) ----

/// `Some(size)` when `path` is a remote file (of a store or linked into a checkpoint).
fn remote_size(path: &Path) -> Option<u64> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let r = registry();
    if let Some((_, remote)) = find(&r, path) {
        return remote
            .is_remote()
            .then_some(remote.entry.file_metadata.size);
    }
    let (dir, name) = split(path)?;
    r.links
        .get(&absolute(dir).ok()?)?
        .get(name)
        .map(|remote| remote.entry.file_metadata.size)
}

/// Make `path` local if it is a remote file of a store: fetch it (or wait for the fetch in
/// flight) and return once it is in place; `Err` with the reason when it cannot be.
fn fetch_now(path: &Path) -> std::result::Result<(), String> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let Some((store, remote)) = find(&registry(), path) else {
        return Ok(());
    };
    let mut started = false;
    let mut st = remote.state();
    loop {
        match &*st {
            FileState::Local | FileState::Dropped => return Ok(()),
            FileState::Failed(msg) if started => return Err(msg.clone()),
            FileState::Remote | FileState::Failed(_) => {
                let rt = runtime().map_err(|e| e.to_string())?;
                if store.cancel.is_cancelled() {
                    return Err("the store was closed".into());
                }
                *st = FileState::Fetching;
                started = true;
                let (store, remote) = (Arc::clone(&store), Arc::clone(&remote));
                rt.spawn(async move {
                    let size = remote.entry.file_metadata.size;
                    if fetch_one(&store, &remote).await {
                        store
                            .progress
                            .files_on_demand
                            .fetch_add(1, Ordering::Relaxed);
                        store
                            .progress
                            .bytes_on_demand
                            .fetch_add(size, Ordering::Relaxed);
                    }
                });
            }
            FileState::Fetching => {
                st = wait(&remote, st);
            }
        }
    }
}

/// Wait for `remote`'s state to change; on a runtime worker thread, through
/// `block_in_place` (the runtime moves its other tasks off this thread meanwhile).
fn wait<'a>(remote: &'a Remote, st: MutexGuard<'a, FileState>) -> MutexGuard<'a, FileState> {
    let park = |st| {
        remote
            .changed
            .wait(st)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| park(st))
        }
        _ => park(st),
    }
}

/// RocksDB hard-links `src` to `dst` (a checkpoint): when `src` is remote, record `dst` as
/// naming the same remote file and return true (nothing is made on disk).
fn link(src: &Path, dst: &Path) -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let mut r = registry();
    let Some((_, remote)) = find(&r, src) else {
        return false;
    };
    if !remote.is_remote() {
        return false;
    }
    let Some((dir, name)) = split(dst) else {
        return false;
    };
    let Ok(dir) = absolute(dir) else {
        return false;
    };
    if !r.links.contains_key(&dir) {
        // A new checkpoint dir: forget those that were removed since.
        r.links.retain(|d, _| d.exists());
    }
    r.links
        .entry(dir)
        .or_default()
        .insert(name.to_string(), remote);
    count(&r);
    true
}

/// RocksDB deletes `path`: when it is remote, drop it (the background download skips it) and
/// return true.
fn drop_file(path: &Path) -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let mut r = registry();
    if let Some((store, remote)) = find(&r, path) {
        let mut st = remote.state();
        if matches!(
            *st,
            FileState::Remote | FileState::Fetching | FileState::Failed(_)
        ) {
            *st = FileState::Dropped;
            store.progress.files_dropped.fetch_add(1, Ordering::Relaxed);
            remote.changed.notify_all();
            return true;
        }
        return false;
    }
    let Some((dir, name)) = split(path) else {
        return false;
    };
    let Ok(dir) = absolute(dir) else {
        return false;
    };
    let removed = r
        .links
        .get_mut(&dir)
        .is_some_and(|l| l.remove(name).is_some());
    if r.links.get(&dir).is_some_and(BTreeMap::is_empty) {
        r.links.remove(&dir);
        count(&r);
    }
    removed
}

/// RocksDB renamed `src` to `dst`: a checkpoint's temporary dir becomes the checkpoint.
fn renamed(src: &Path, dst: &Path) {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let (Ok(src), Ok(dst)) = (absolute(src), absolute(dst)) else {
        return;
    };
    let mut r = registry();
    if let Some(links) = r.links.remove(&src) {
        r.links.insert(dst, links);
    }
}

// ---- fetching ----

/// Sets a file left `Fetching` by a fetch that ended without an outcome (its task panicked or
/// was dropped) to `Failed`, and wakes its waiters: no waiter waits forever.
struct Settle<'a>(&'a Remote);

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state();
        if *st == FileState::Fetching {
            *st = FileState::Failed("the fetch ended without a result".into());
            self.0.changed.notify_all();
        }
    }
}

/// A temporary name for a fetch of `name`, unique in this process (two fetches of one file by
/// two registrations never share one).
fn part_name(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        ".{name}.{}-{}.blobsnap-part",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Fetch `remote` (whose state the caller set to `Fetching`) into the store dir; sets the
/// outcome and wakes the waiters. True when the file was put in place.
async fn fetch_one(store: &LazyStore, remote: &Remote) -> bool {
    let _settle = Settle(remote);
    let dest = store.dir.join(&remote.name);
    let tmp = store.dir.join(part_name(&remote.name));
    let r = (store.fetch)(remote.entry.clone(), tmp.clone()).await;
    let mut st = remote.state();
    let placing = store.placing();
    let placed = match r {
        _ if *st == FileState::Dropped => {
            let _ = std::fs::remove_file(&tmp);
            false
        }
        _ if store.cancel.is_cancelled() => {
            let _ = std::fs::remove_file(&tmp);
            *st = FileState::Failed("the store was closed".into());
            false
        }
        Ok(()) => match std::fs::rename(&tmp, &dest) {
            Ok(()) => {
                *st = FileState::Local;
                record_proof(&store.dir, remote, &dest);
                crate::crash::point("lazy.after-fetch");
                true
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                *st = FileState::Failed(format!("rename into {}: {e}", dest.display()));
                false
            }
        },
        Err(e) => {
            tracing::warn!(file = %dest.display(), error = %e, "lazy restore: fetch failed");
            *st = FileState::Failed(e.to_string());
            false
        }
    };
    drop(placing);
    remote.changed.notify_all();
    placed
}

/// The background download: every remote file, largest first, `downloads` at once, under
/// `max_rate`; then the dir is fsynced and the store marked complete.
async fn download_all(store: Arc<LazyStore>, bg: Background) {
    let started = tokio::time::Instant::now();
    let mut order: Vec<Arc<Remote>> = store.files.values().cloned().collect();
    order.sort_by_key(|r| std::cmp::Reverse(r.entry.file_metadata.size));
    let sent = Arc::new(AtomicU64::new(0));
    futures::stream::iter(order)
        .for_each_concurrent(bg.downloads.max(1), |remote| {
            let (store, sent) = (Arc::clone(&store), Arc::clone(&sent));
            async move {
                if store.cancel.is_cancelled() {
                    return;
                }
                {
                    let mut st = remote.state();
                    match *st {
                        FileState::Remote | FileState::Failed(_) => *st = FileState::Fetching,
                        _ => return,
                    }
                }
                let size = remote.entry.file_metadata.size;
                if fetch_one(&store, &remote).await {
                    let p = &store.progress;
                    p.files_background.fetch_add(1, Ordering::Relaxed);
                    p.bytes_background.fetch_add(size, Ordering::Relaxed);
                }
                if bg.max_rate > 0 {
                    let total = sent.fetch_add(size, Ordering::Relaxed) + size;
                    let due = std::time::Duration::from_secs_f64(total as f64 / bg.max_rate as f64);
                    tokio::select! {
                        () = tokio::time::sleep_until(started + due) => {}
                        () = store.cancel.cancelled() => {}
                    }
                }
            }
        })
        .await;
    // Files fetched on demand may still be in flight: wait for each to settle.
    for remote in store.files.values() {
        let remote = Arc::clone(remote);
        let settled = tokio::task::spawn_blocking(move || {
            let mut st = remote.state();
            while *st == FileState::Fetching {
                st = remote
                    .changed
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        })
        .await;
        if settled.is_err() || store.cancel.is_cancelled() {
            break;
        }
    }
    if !store.cancel.is_cancelled() {
        let st = store.status();
        if st.files_remote == 0 {
            // Every file is local: the dir is a complete database again.
            {
                let _placing = store.placing();
                if !store.cancel.is_cancelled() {
                    let _ = std::fs::remove_file(store.dir.join(LAZY_PENDING));
                }
            }
            if let Ok(d) = std::fs::File::open(&store.dir) {
                let _ = d.sync_all();
            }
            tracing::info!(store = %store.dir.display(), on_demand = st.files_on_demand, background = st.files_background, dropped = st.files_dropped, secs = started.elapsed().as_secs_f64(), "lazy restore complete: every file is local");
            let mut r = registry();
            if r.stores
                .get(&store.dir)
                .is_some_and(|s| Arc::ptr_eq(s, &store))
            {
                r.stores.remove(&store.dir);
                count(&r);
            }
        } else {
            tracing::error!(store = %store.dir.display(), remote = st.files_remote, "lazy restore: files could not be fetched; RocksDB fails the reads that need them");
        }
    }
    let _ = store.done.send(true);
}
