//! Lazy restore (`restore-mode = "lazy"`): a store opens before its SST and blob files are
//! local. The restore writes the small files (CURRENT, MANIFEST, OPTIONS…) and registers
//! every immutable file still to download here as *remote*; the store is then opened on
//! RocksDB's `blobsnap-lazy` Env (a file system wrapper, `cpp/lazy_fs.cc`, reached through
//! `ffi`), which asks this registry before RocksDB touches a file:
//!
//! - opening a remote file fetches it first, with priority (the urgent lane of the process's
//!   transfer budget, [`crate::blobstore::limit::urgent`]), verified whole (size and SHA-256)
//!   and renamed into place before RocksDB reads a byte; a fetch that fails is an I/O error
//!   inside RocksDB (the read fails, the task stops), never wrong data;
//! - its existence and size are answered from the index entry (no fetch);
//! - a hard link of it (a RocksDB checkpoint) is recorded, not made: the checkpoint dir's
//!   scan ([`remote_files_in`]) lists it with the index entry's SHA-256, size and CRC, so the
//!   next snapshot reuses the blob it already has — a remote file is never hashed, cached or
//!   uploaded, and every retained snapshot of a still-remote file names its blob, so retention
//!   cannot delete it. The checkpoint dir gets a [`LAZY_PENDING`] list of what it lacks, so
//!   every other reader refuses it ([`check_complete`]); each file, once fetched, is
//!   hard-linked into the checkpoint dirs that recorded it, and a dir lacking nothing loses
//!   its list;
//! - deleting it (the live DB compacted it away) drops it: the background download skips it;
//! - a remote blob file (`*.blob`) is fetched at its first read rather than at its open, and a
//!   read of its footer alone — what RocksDB's purge asks of an obsolete blob file before it
//!   deletes it — is answered by a ranged read of its blob (a [`TailFn`]): a blob file the
//!   live DB compacted away is dropped without being downloaded.
//!
//! Meanwhile a background download fetches every remote file, verified, at a bounded rate (one
//! token bucket over the bytes of its bodies, paid chunk by chunk:
//! [`crate::blobstore::limit::Pace`]) and concurrency, in the transfer budget's background
//! lane, until the store is complete ([`status`], [`wait_complete`]). What is durable
//! is the snapshot's index (the committed checkpoint names it): a process killed while files
//! are remote leaves a store dir that lacks them, and the next start's restore plans against
//! the index and fetches exactly those (lazily again or in full). The registry is the
//! in-process manifest of the remote files.
//!
//! # What not to ask a lazily opened store
//!
//! Two RocksDB features open every table file, which on a lazy store means downloading every
//! remote file first: `open_files_async` (forced off in [`ENV_OPTION`]: it would fetch on the
//! flush pool) and the string property `rocksdb.aggregated-table-properties` (and its
//! per-level variant), which RocksDB computes **under the DB mutex** — writes would wait for
//! the whole download. blobsnap never asks for it; an embedder should not while
//! [`status`] is `Some` (or should [`wait_complete`] first).
//!
//! # Lock order
//!
//! One order for the whole module, outermost first: `links_io` (the checkpoint dirs'
//! pending lists and links) → the registry → a store's `placing` → a file's state → the
//! proofs. A function may skip levels but never takes an outer lock while holding an inner
//! one. No lock is held across a fetch (the download runs with none held; waiting readers
//! park on the file's condvar); `links_io` and `placing` are held across local file-system
//! calls only (an append of one line, a hard link, a rename, an fsync).

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
use crate::error::{Error, ErrorKind, Result};
use crate::index::{FileIndex, LAZY_PENDING};

/// The options string of a lazy open: the lazy file system, and no table opened in the
/// background at open (`open_files_async` would fetch up to the table cache's capacity on
/// the flush pool, where a failure is a background error).
pub const ENV_OPTION: &str = "env=blobsnap-lazy;open_files_async=false";

/// While files are remote, RocksDB keeps at most this many files open (its table cache is
/// this minus 10): a DB open then loads at most 2 tables, so it fetches at most 2 files
/// before the first read, whatever the store's size (with `max_open_files = -1` it would open,
/// and so fetch, every SST).
pub const LAZY_MAX_OPEN_FILES: i32 = 20;

/// Lazily opened databases of the process (counted by `RocksStore`'s open and drop).
static LAZY_DBS: AtomicUsize = AtomicUsize::new(0);

/// A lazily opened database's share of the process's RocksDB thread pools. Every DB schedules
/// its flushes and compactions on the default Env's pools (the lazy Env forwards to them), and
/// a compaction of a lazy DB can block on a fetch: with one LOW thread (RocksDB's default) it
/// would stall every other store's compactions behind the download. So while `n` lazy DBs are
/// open the pools hold at least `n + 2` LOW and `n + 1` HIGH threads, and each lazy DB runs at
/// most one compaction and one flush at a time (`LAZY_MAX_BACKGROUND_JOBS`): however many of
/// them wait for fetches, another store always has a thread. Dropping the guard gives the
/// share back (the pools are never shrunk).
pub struct PoolShare(());

/// `max_background_jobs` of a lazily opened DB (one flush, one compaction).
pub const LAZY_MAX_BACKGROUND_JOBS: i32 = 2;

impl PoolShare {
    /// Take a share (before the DB opens).
    pub fn take() -> PoolShare {
        ffi::install();
        let n = LAZY_DBS.fetch_add(1, Ordering::AcqRel) + 1;
        let n = i32::try_from(n).unwrap_or(i32::MAX - 2);
        ffi::widen_pools(n + 2, n + 1);
        PoolShare(())
    }
}

impl Drop for PoolShare {
    fn drop(&mut self) {
        LAZY_DBS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Fetches one remote file into a temporary path, verified against its entry (size and
/// SHA-256) and fsynced; called on the lazy restore's own runtime.
pub type FetchFn = Arc<dyn Fn(FileIndex, PathBuf) -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// Reads `range` of one remote file's blob (its footer, at most [`MAX_TAIL`] bytes), checked
/// against the entry's size; called on the lazy restore's own runtime. The bytes are not
/// verified (a file's SHA-256 covers it whole): they only decide whether RocksDB's purge may
/// delete an obsolete blob file, never what a read returns.
pub type TailFn = Arc<
    dyn Fn(FileIndex, std::ops::Range<u64>) -> BoxFuture<'static, Result<bytes::Bytes>>
        + Send
        + Sync,
>;

/// The most bytes at a remote file's end [`TailFn`] is asked for (a blob file's footer is 32).
pub const MAX_TAIL: usize = 64;

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
    /// The last fetch failed: what kind of failure (a corrupt or missing blob, a transient
    /// fault…) and the message.
    Failed(ErrorKind, String),
}

#[derive(Debug)]
struct Remote {
    name: String,
    /// The store dir the file is placed into once fetched.
    store_dir: PathBuf,
    entry: FileIndex,
    state: Mutex<FileState>,
    changed: Condvar,
    /// Lifted when RocksDB waits for the file while the background download fetches it: the
    /// rest of that fetch is no longer paced.
    lift: Arc<crate::blobstore::limit::Lift>,
    /// Cancelled when RocksDB deletes the file: a fetch in flight stops (a paced background
    /// fetch of a compacted-away file would otherwise go on to its end).
    gone: CancellationToken,
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
            FileState::Remote | FileState::Fetching | FileState::Failed(..)
        )
    }
}

/// Counters of one lazily restored store.
#[derive(Debug, Default)]
pub struct LazyProgress {
    /// Background passes after the first.
    pub background_retries: AtomicU64,
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
    /// Footers of remote blob files read from their blobs (a ranged read) instead of a fetch.
    pub tail_reads: AtomicU64,
}

/// Where a lazily restored store stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LazyStatus {
    /// Files still remote.
    pub files_remote: u64,
    /// Their bytes.
    pub bytes_remote: u64,
    /// Files whose last fetch failed (the background retries a transient failure with
    /// backoff; RocksDB's next open of the file fetches it again).
    pub files_failed: u64,
    /// Of those, files whose blob is corrupt or missing: never retried by the background
    /// (a restore fallback's case, not a retry's).
    pub files_failed_permanently: u64,
    /// Background passes after the first (each over the files a transient failure left).
    pub background_retries: u64,
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
    /// Footers of remote blob files read with a ranged read of their blobs, not a fetch.
    pub tail_reads: u64,
}

struct LazyStore {
    dir: PathBuf,
    files: BTreeMap<String, Arc<Remote>>,
    fetch: FetchFn,
    tail: Option<TailFn>,
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
                FileState::Failed(kind, _) => {
                    s.files_remote += 1;
                    s.files_failed += 1;
                    s.files_failed_permanently += u64::from(!retryable(*kind));
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
        s.tail_reads = p.tail_reads.load(Ordering::Relaxed);
        s.background_retries = p.background_retries.load(Ordering::Relaxed);
        s
    }
}

/// A failed fetch the background tries again (issue 46, L6): anything but a blob that is
/// corrupt or missing (those are for the restore fallback, not a retry).
fn retryable(kind: ErrorKind) -> bool {
    !matches!(kind, ErrorKind::Corrupt | ErrorKind::NotFound)
}

/// The background's wait before its pass number `pass` (1 = the first retry): 1 s doubling
/// to at most a minute.
fn retry_delay(pass: u32) -> std::time::Duration {
    std::time::Duration::from_secs(1u64 << pass.saturating_sub(1).min(6))
        .min(std::time::Duration::from_secs(60))
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
    .map_err(|e| Error::new(ErrorKind::Io, format!("lazy restore runtime: {e}")))
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
/// not in `dir`) are remote, fetched by `fetch` (and their footers read by `tail`, when
/// given); starts their background download. Replaces (and stops) an earlier registration of
/// the same dir. Installs the lazy file system.
pub fn register(
    dir: &Path,
    files: Vec<FileIndex>,
    fetch: FetchFn,
    tail: Option<TailFn>,
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
                store_dir: dir.clone(),
                entry,
                state: Mutex::new(FileState::Remote),
                changed: Condvar::new(),
                lift: Arc::default(),
                gone: CancellationToken::new(),
            };
            (r.name.clone(), Arc::new(r))
        })
        .collect();
    let (done, _) = tokio::sync::watch::channel(false);
    let store = Arc::new(LazyStore {
        dir: dir.clone(),
        files,
        fetch,
        tail,
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
/// remote: [`LAZY_PENDING`], the durable list of them (one JSON index entry a line: name,
/// size, SHA-256, blob), fsynced. It is removed once every file is local; while it is there,
/// the dir is not a complete database and nothing opens or backs it up as one
/// ([`check_complete`]).
pub fn write_pending(dir: &Path, files: &[FileIndex]) -> Result<()> {
    use std::io::Write as _;
    let path = dir.join(LAZY_PENDING);
    let mut bytes = Vec::new();
    for f in files {
        bytes.extend(pending_line(&path, f)?);
    }
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
        .map_err(Error::io_with(format!("write {}", path.display())))
}

fn pending_line(path: &Path, entry: &FileIndex) -> Result<Vec<u8>> {
    let mut line = serde_json::to_vec(entry)
        .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    line.push(b'\n');
    Ok(line)
}

/// The names a [`LAZY_PENDING`] file lists (`None`: unreadable or not a list).
fn read_pending(dir: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(dir.join(LAZY_PENDING)).ok()?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()?
                .get("file-name")?
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// `Err` when `dir` holds a lazy restore's files-still-remote list ([`LAZY_PENDING`]: a store
/// dir, or a RocksDB checkpoint of one taken while files were remote) and no lazy restore of
/// this process serves it (the process that made it stopped or died before every file was
/// local): its MANIFEST names files that are not there. The error names them. A restore
/// completes a store dir; a checkpoint dir is complete in the checkpoints taken after its
/// store's files were all local.
pub fn check_complete(dir: &Path) -> Result<()> {
    if !dir.join(LAZY_PENDING).exists() || is_served(dir) {
        return Ok(());
    }
    let missing = match read_pending(dir) {
        Some(names) => {
            let missing: Vec<String> = names
                .into_iter()
                .filter(|n| std::fs::symlink_metadata(dir.join(n)).is_err())
                .collect();
            let shown = missing
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            let more = missing.len().saturating_sub(5);
            format!(
                "{} files it lists are missing ({shown}{})",
                missing.len(),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )
        }
        None => "its list is unreadable".to_string(),
    };
    Err(Error::new(
        ErrorKind::InvalidInput,
        format!(
            "{} is an incomplete lazy restore: not every file had been fetched when it was made ({LAZY_PENDING}: {missing}): restore the store again, or back up a checkpoint taken once every file was local",
            dir.display()
        ),
    ))
}

/// Whether a lazy restore of this process serves `dir`: a lazily restored store dir, or a
/// checkpoint dir with remote files recorded in it.
fn is_served(dir: &Path) -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Ok(dir) = absolute(dir) else { return false };
    let r = registry();
    r.stores.contains_key(&dir) || r.links.contains_key(&dir)
}

/// `SetDBOptions` on an open DB ([`ffi`]'s `set_db_options`): rust-rocksdb wraps only the
/// column-family `SetOptions`.
pub(crate) fn set_db_options(
    db: &rocksdb::DB,
    options: &[(&str, &str)],
) -> std::result::Result<(), String> {
    ffi::set_db_options(db, options)
}

/// Make a DB opened with `opts` report its finished and deleted table and blob files to
/// [`crate::local::events`] under `token` ([`ffi`]'s `add_file_listener`).
pub(crate) fn add_file_listener(opts: &mut rocksdb::Options, token: u64) -> bool {
    ffi::add_file_listener(opts, token)
}

/// The bytes the open `db`'s SstFileManager accounts for.
pub(crate) fn tracked_bytes(db: &rocksdb::DB) -> u64 {
    ffi::tracked_bytes(db)
}

/// The sampled read count of each live table file of the open `db` ([`ffi`]'s `file_reads`).
pub(crate) fn file_reads(db: &rocksdb::DB) -> Vec<(String, u64)> {
    ffi::file_reads(db)
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

/// The final status of each store dir whose lazy restore completed in this process. Its lock
/// is taken alone (never with the registry's or a file's).
fn completed() -> MutexGuard<'static, std::collections::HashMap<PathBuf, LazyStatus>> {
    static COMPLETED: std::sync::OnceLock<Mutex<std::collections::HashMap<PathBuf, LazyStatus>>> =
        std::sync::OnceLock::new();
    COMPLETED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How the newest lazy restore of `dir` that completed in this process ended (its counts once
/// [`status`] is `None`); `None` when none has.
pub fn completed_status(dir: &Path) -> Option<LazyStatus> {
    let dir = absolute(dir).ok()?;
    completed().get(&dir).copied()
}

/// The names of the lazily restored store's files at `dir` whose fetch is in flight (on
/// demand or in the background), sorted; empty when it is not lazy.
pub fn fetching(dir: &Path) -> Vec<String> {
    let Ok(dir) = absolute(dir) else {
        return Vec::new();
    };
    let Some(store) = registry().stores.get(&dir).cloned() else {
        return Vec::new();
    };
    let mut names: Vec<String> = store
        .files
        .values()
        .filter(|r| *r.state() == FileState::Fetching)
        .map(|r| r.name.clone())
        .collect();
    names.sort();
    names
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
            ErrorKind::Io,
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
    let store = {
        let mut r = registry();
        let s = r.stores.remove(&dir);
        count(&r);
        s
    };
    if let Some(s) = store {
        // Cancelling ends every fetch in flight (its download is dropped, its file set to
        // Failed, its waiters woken: a RocksDB read or compaction parked on it gets an error
        // at once), and nothing is placed once the cancel is seen under `placing`.
        {
            let _placing = s.placing();
            s.cancel.cancel();
            // Every file local (read on demand before the background got to it): complete.
            if s.status().files_remote == 0 {
                let _ = std::fs::remove_file(dir.join(LAZY_PENDING));
            }
        }
        let _ = s.done.send(true);
    }
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
/// flight) and return once it is in place; `Err` with the kind of failure and the reason when
/// it cannot be.
fn fetch_now(path: &Path) -> std::result::Result<(), (ErrorKind, String)> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let Some((store, remote)) = find(&registry(), path) else {
        return Ok(());
    };
    refuse_current_thread().map_err(|e| (e.kind(), e.to_string()))?;
    let mut started = false;
    let mut st = remote.state();
    loop {
        match &*st {
            FileState::Local | FileState::Dropped => return Ok(()),
            FileState::Failed(kind, msg) if started => return Err((*kind, msg.clone())),
            FileState::Remote | FileState::Failed(..) => {
                let rt = runtime().map_err(|e| (e.kind(), e.to_string()))?;
                if store.cancel.is_cancelled() {
                    return Err((ErrorKind::Cancelled, "the store was closed".into()));
                }
                *st = FileState::Fetching;
                started = true;
                let (store, remote) = (Arc::clone(&store), Arc::clone(&remote));
                // RocksDB waits for it: the urgent lane of the process's transfer budget, so it
                // never queues behind the background download or the uploads.
                rt.spawn(crate::blobstore::limit::urgent(async move {
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
                }));
            }
            FileState::Fetching => {
                // Fetched by the background download, maybe paced: RocksDB waits for it now.
                remote.lift.lift();
                st = wait(&remote, st);
            }
        }
    }
}

/// The `n` last bytes of `path` (from `offset`, its size less `n`) when it is a remote file of
/// a store registered with a [`TailFn`], read from its blob without fetching the file; `None`
/// when it is not (then RocksDB's read fetches it whole, as any other read does) or the
/// ranged read failed.
fn read_tail(path: &Path, offset: u64, n: usize) -> Option<bytes::Bytes> {
    if ACTIVE.load(Ordering::Acquire) == 0 || n == 0 || n > MAX_TAIL {
        return None;
    }
    let (store, remote) = find(&registry(), path)?;
    let tail = store.tail.clone()?;
    let size = remote.entry.file_metadata.size;
    if offset.checked_add(n as u64) != Some(size)
        || !remote.is_remote()
        || store.cancel.is_cancelled()
        || refuse_current_thread().is_err()
    {
        return None;
    }
    let rt = runtime().ok()?;
    let (tx, rx) = std::sync::mpsc::channel();
    let (entry, cancel) = (remote.entry.clone(), store.cancel.clone());
    rt.spawn(crate::blobstore::limit::urgent(async move {
        let r = tokio::select! {
            r = tail(entry, offset..size) => r,
            () = cancel.cancelled() => Err(Error::new(ErrorKind::Cancelled, "the store was closed")),
        };
        let _ = tx.send(r);
    }));
    let got = match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| rx.recv())
        }
        _ => rx.recv(),
    };
    match got {
        Ok(Ok(bytes)) if bytes.len() == n => {
            store.progress.tail_reads.fetch_add(1, Ordering::Relaxed);
            Some(bytes)
        }
        Ok(Ok(bytes)) => {
            tracing::warn!(file = %path.display(), got = bytes.len(), n, "lazy restore: a footer read returned the wrong length; fetching the file");
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(file = %path.display(), error = %e, "lazy restore: footer read failed; fetching the file");
            None
        }
        Err(_) => None,
    }
}

/// `Err` on the thread of a current-thread tokio runtime: a lazily restored store's read
/// would park that runtime's only thread until a fetch completes, and whatever the fetch
/// needs from that runtime (a pooled connection it drives) could never run. Lazily restored
/// stores are opened and read from multi-thread runtimes (the job runtime is one), or from
/// threads outside any runtime.
pub fn refuse_current_thread() -> Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread => {
            Err(Error::new(
                ErrorKind::InvalidInput,
                "a lazily restored store cannot be opened or read on a current-thread tokio \
                 runtime (its reads block until a download completes): use a multi-thread \
                 runtime, or restore-mode = \"full\"",
            ))
        }
        _ => Ok(()),
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

/// Serializes the writers of checkpoint dirs' [`LAZY_PENDING`] lists and their hard links
/// ([`link`], [`renamed`], [`materialize`]). First in the module's lock order; held across
/// local file-system calls only (an append of one line, a hard link, an fsync), never across
/// a fetch.
fn links_io() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// RocksDB hard-links `src` to `dst` (a checkpoint): when `src` is remote, record `dst` as
/// naming the same remote file and return true (nothing is made on disk but a line of the
/// checkpoint dir's [`LAZY_PENDING`] list, which marks the dir incomplete for every other
/// reader until [`materialize`] links the fetched file in). False: link it for real — also
/// when the list cannot be written, so the checkpoint fails rather than be incomplete and
/// unmarked.
fn link(src: &Path, dst: &Path) -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let _io = links_io();
    let (dir, name, entry, first) = {
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
        // No pruning of dirs that do not exist here (issue 46, L2): another store's
        // checkpoint may be between RocksDB's rename of its `.tmp` dir and the rename's
        // callback ([`renamed`]), its records under a name that no longer exists. The commit
        // manager forgets the dirs it deletes ([`forget_links`]).
        let first = !r.links.contains_key(&dir);
        let entry = remote.entry.clone();
        r.links
            .entry(dir.clone())
            .or_default()
            .insert(name.to_string(), remote);
        count(&r);
        (dir, name.to_string(), entry, first)
    };
    match append_pending(&dir, &entry, first) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(dir = %dir.display(), error = %e, "lazy restore: cannot record a remote file in a checkpoint dir");
            let mut r = registry();
            if let Some(l) = r.links.get_mut(&dir) {
                l.remove(&name);
                if l.is_empty() {
                    r.links.remove(&dir);
                }
            }
            count(&r);
            false
        }
    }
}

/// Append `entry` to `dir`'s [`LAZY_PENDING`]; the first line creates it, durably (file and
/// dir fsynced: from then on the dir is marked incomplete); the later lines are fsynced when
/// the checkpoint's dir is renamed into place ([`renamed`]).
fn append_pending(dir: &Path, entry: &FileIndex, first: bool) -> Result<()> {
    use std::io::Write as _;
    let path = dir.join(LAZY_PENDING);
    let line = pending_line(&path, entry)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(Error::io_with(format!("open {}", path.display())))?;
    f.write_all(&line)
        .map_err(Error::io_with(format!("write {}", path.display())))?;
    if first {
        f.sync_all()
            .map_err(Error::io_with(format!("fsync {}", path.display())))?;
        sync_dir(dir)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io_with(format!("fsync {}", dir.display())))
}

/// Hard-link every recorded remote file that is now local (fetched into its store dir) into
/// the checkpoint dirs that name it; a checkpoint dir with nothing left to link loses its
/// [`LAZY_PENDING`] (after an fsync of the links): it is a complete database on disk. Called
/// after each placement, after a checkpoint's rename, before RocksDB deletes a store file, and
/// when a store's download completes.
fn materialize() {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let _io = links_io();
    let todo: Vec<(PathBuf, String, PathBuf)> = {
        let r = registry();
        r.links
            .iter()
            .flat_map(|(dir, files)| {
                files
                    .iter()
                    .filter(|(_, remote)| *remote.state() == FileState::Local)
                    .map(move |(name, remote)| {
                        (
                            dir.clone(),
                            name.clone(),
                            remote.store_dir.join(&remote.name),
                        )
                    })
            })
            .collect()
    };
    if todo.is_empty() {
        return;
    }
    let mut linked = Vec::new();
    for (dir, name, src) in todo {
        match std::fs::hard_link(&src, dir.join(&name)) {
            Ok(()) => linked.push((dir, name)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => linked.push((dir, name)),
            // The dir is gone (deleted, or renamed and the rename's callback will call again).
            Err(e) => {
                tracing::debug!(src = %src.display(), dir = %dir.display(), error = %e, "lazy restore: link into a checkpoint dir deferred");
            }
        }
    }
    let mut emptied = Vec::new();
    {
        let mut r = registry();
        for (dir, name) in linked {
            if let Some(l) = r.links.get_mut(&dir) {
                l.remove(&name);
                if l.is_empty() {
                    r.links.remove(&dir);
                    emptied.push(dir);
                }
            }
        }
        count(&r);
    }
    for dir in emptied {
        // The links first, durably; then the list that said they were missing.
        if sync_dir(&dir).is_ok() && std::fs::remove_file(dir.join(LAZY_PENDING)).is_ok() {
            let _ = sync_dir(&dir);
        }
    }
}

/// The checkpoint dir `dir` was deleted (by the commit manager, with `std::fs`): forget the
/// remote files recorded in it.
pub fn forget_links(dir: &Path) {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let Ok(dir) = absolute(dir) else { return };
    let _io = links_io();
    let mut r = registry();
    if r.links.remove(&dir).is_some() {
        count(&r);
    }
}

/// RocksDB deletes `path`: when it is remote, drop it (the background download skips it) and
/// return true.
fn drop_file(path: &Path) -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    // A fetched file some checkpoint dir still records as remote is linked there before
    // RocksDB deletes it from the store.
    materialize();
    let mut r = registry();
    if let Some((store, remote)) = find(&r, path) {
        let mut st = remote.state();
        if matches!(
            *st,
            FileState::Remote | FileState::Fetching | FileState::Failed(..)
        ) {
            *st = FileState::Dropped;
            store.progress.files_dropped.fetch_add(1, Ordering::Relaxed);
            remote.changed.notify_all();
            remote.gone.cancel();
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
    {
        let _io = links_io();
        let moved = {
            let mut r = registry();
            match r.links.remove(&src) {
                Some(links) => {
                    r.links.insert(dst.clone(), links);
                    true
                }
                None => false,
            }
        };
        if moved {
            // The whole list durable before RocksDB fsyncs the checkpoint into place.
            let path = dst.join(LAZY_PENDING);
            if let Err(e) = std::fs::File::open(&path).and_then(|f| f.sync_all()) {
                tracing::warn!(file = %path.display(), error = %e, "lazy restore: fsync of a checkpoint's pending list failed");
            }
        }
    }
    materialize();
}

// ---- fetching ----

/// Sets a file left `Fetching` by a fetch that ended without an outcome (its task panicked or
/// was dropped) to `Failed`, and wakes its waiters: no waiter waits forever.
struct Settle<'a>(&'a Remote);

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state();
        if *st == FileState::Fetching {
            *st = FileState::Failed(ErrorKind::Io, "the fetch ended without a result".into());
            self.0.changed.notify_all();
        }
    }
}

/// Where a remote file comes in the background download: hottest first, then largest.
fn background_rank(entry: &FileIndex) -> (std::cmp::Reverse<u64>, std::cmp::Reverse<u64>) {
    (
        std::cmp::Reverse(entry.heat.unwrap_or(0)),
        std::cmp::Reverse(entry.file_metadata.size),
    )
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
    // A close cancels the download itself (it does not wait for it: F4 of the lazy-restore
    // review); the branch below then sees the cancel.
    let r = tokio::select! {
        r = (store.fetch)(remote.entry.clone(), tmp.clone()) => r,
        () = store.cancel.cancelled() => Err(Error::new(
            ErrorKind::Cancelled,
            "the store was closed",
        )),
        // RocksDB deleted the file meanwhile: the branch below sees it dropped.
        () = remote.gone.cancelled() => Err(Error::new(
            ErrorKind::Cancelled,
            "the file was deleted",
        )),
    };
    // The module's lock order: `placing` before the file's state.
    let placed = {
        let placing = store.placing();
        let mut st = remote.state();
        let placed = match r {
            _ if *st == FileState::Dropped => {
                let _ = std::fs::remove_file(&tmp);
                false
            }
            _ if store.cancel.is_cancelled() => {
                let _ = std::fs::remove_file(&tmp);
                *st = FileState::Failed(ErrorKind::Cancelled, "the store was closed".into());
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
                    *st = FileState::Failed(
                        ErrorKind::Io,
                        format!("rename into {}: {e}", dest.display()),
                    );
                    false
                }
            },
            Err(e) => {
                tracing::warn!(file = %dest.display(), error = %e, "lazy restore: fetch failed");
                *st = FileState::Failed(e.kind(), e.to_string());
                false
            }
        };
        drop(st);
        drop(placing);
        placed
    };
    if placed {
        // Checkpoint dirs that recorded this file get it now, before the reader waiting for
        // it is woken.
        let _ = tokio::task::spawn_blocking(materialize).await;
    }
    remote.changed.notify_all();
    placed
}

/// The background download: every remote file, hottest first (the index's `heat`: the
/// files the task read most before it stopped, which it will most likely read again), then
/// largest first, `downloads` at once, under `max_rate`; then the dir is fsynced and the store
/// marked complete.
async fn download_all(store: Arc<LazyStore>, bg: Background) {
    let started = tokio::time::Instant::now();
    let mut order: Vec<Arc<Remote>> = store.files.values().cloned().collect();
    order.sort_by_key(|r| background_rank(&r.entry));
    // One token bucket for the whole download, paid chunk by chunk as bodies are read (F8 of
    // the lazy-restore review: a sleep after each file let each file go at line rate).
    let pace = crate::blobstore::limit::Pace::new(bg.max_rate);
    let mut pass = 0u32;
    loop {
        futures::stream::iter(order)
            .for_each_concurrent(bg.downloads.max(1), |remote| {
                let store = Arc::clone(&store);
                let pace = pace.as_ref().map(|p| p.liftable(Arc::clone(&remote.lift)));
                async move {
                    if store.cancel.is_cancelled() {
                        return;
                    }
                    {
                        let mut st = remote.state();
                        match *st {
                            FileState::Remote | FileState::Failed(..) => *st = FileState::Fetching,
                            _ => return,
                        }
                    }
                    let size = remote.entry.file_metadata.size;
                    // The background lane: at most half the transfer window, so a commit's uploads
                    // and the on-demand fetches (their urgent lane) always find room beside it.
                    let fetch = crate::blobstore::limit::background(fetch_one(&store, &remote));
                    let fetched = match pace {
                        Some(pace) => crate::blobstore::limit::paced(pace, fetch).await,
                        None => fetch.await,
                    };
                    if fetched {
                        let p = &store.progress;
                        p.files_background.fetch_add(1, Ordering::Relaxed);
                        p.bytes_background.fetch_add(size, Ordering::Relaxed);
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
        // Another pass, after a capped backoff, over what a transient failure left remote: one
        // failure must not keep the store incomplete (and its lazy limits on) for the process's
        // life. A corrupt or missing blob is never retried here.
        order = store
            .files
            .values()
            .filter(|r| match &*r.state() {
                FileState::Remote => true,
                FileState::Failed(kind, _) => retryable(*kind),
                _ => false,
            })
            .cloned()
            .collect();
        if order.is_empty() || store.cancel.is_cancelled() {
            break;
        }
        pass += 1;
        store
            .progress
            .background_retries
            .fetch_add(1, Ordering::Relaxed);
        metrics::counter!("blobsnap_lazy_background_retries_total").increment(1);
        tracing::warn!(store = %store.dir.display(), files = order.len(), pass, "lazy restore: fetching again what a transient failure left remote");
        tokio::select! {
            () = tokio::time::sleep(retry_delay(pass)) => {}
            () = store.cancel.cancelled() => break,
        }
        order.sort_by_key(|r| background_rank(&r.entry));
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
            completed().insert(store.dir.clone(), st);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{FileBlob, FileMetadata};
    use std::sync::mpsc;
    use std::time::Duration;

    fn entry(name: &str, size: u64) -> FileIndex {
        FileIndex {
            file_name: name.into(),
            blobs: vec![FileBlob {
                blob_id: format!("blob-{name}"),
                offset: 0,
            }],
            file_metadata: FileMetadata {
                creation_time_millis: 0,
                last_modified_time_millis: 0,
                size,
                owner: String::new(),
                group: String::new(),
                permissions: "rw-r--r--".into(),
            },
            checksum: 0,
            sha256: None,
            inline_data: None,
            heat: None,
        }
    }

    /// A fetch of `000001.sst` that never resolves, and one of `000002.sst` that writes its
    /// temp file once `release` is sent; `started` gets each file's name as its fetch starts.
    fn gated_fetch(
        release: tokio::sync::watch::Receiver<bool>,
        started: mpsc::Sender<String>,
    ) -> FetchFn {
        let started = Mutex::new(started);
        Arc::new(move |e: FileIndex, tmp: PathBuf| {
            let mut release = release.clone();
            let _ = started
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .send(e.file_name.clone());
            Box::pin(async move {
                if e.file_name == "000001.sst" {
                    std::future::pending::<()>().await;
                }
                let _ = release.wait_for(|r| *r).await;
                std::fs::write(&tmp, vec![7u8; e.file_metadata.size as usize])
                    .map_err(Error::io_with("write"))?;
                Ok(())
            })
        })
    }

    /// F1 of the lazy-restore review: `close` (registry → placing → each file's state) racing
    /// a fetch that finishes (it used to take its file's state, then `placing`). The test
    /// holds one file's state while close runs, then lets the other file's fetch finish:
    /// with the old order both sides waited for each other forever; with the module's one
    /// lock order the close returns and the finished fetch places nothing.
    #[test]
    fn close_racing_a_finishing_fetch_returns() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().join("store");
        std::fs::create_dir(&dir).unwrap();
        let (release_tx, release_rx) = tokio::sync::watch::channel(false);
        let (started_tx, started_rx) = mpsc::channel();
        register(
            &dir,
            vec![entry("000001.sst", 10), entry("000002.sst", 20)],
            gated_fetch(release_rx, started_tx),
            None,
            Background {
                downloads: 2,
                max_rate: 0,
            },
        )
        .unwrap();
        let mut seen = vec![
            started_rx.recv_timeout(Duration::from_secs(30)).unwrap(),
            started_rx.recv_timeout(Duration::from_secs(30)).unwrap(),
        ];
        seen.sort();
        assert_eq!(seen, ["000001.sst", "000002.sst"]);
        let store = registry()
            .stores
            .get(&absolute(&dir).unwrap())
            .cloned()
            .unwrap();
        let first = Arc::clone(&store.files["000001.sst"]);
        let second = Arc::clone(&store.files["000002.sst"]);
        let held = first.state();
        let (closed_tx, closed_rx) = mpsc::channel();
        let close_dir = dir.clone();
        std::thread::spawn(move || {
            close(&close_dir);
            let _ = closed_tx.send(());
        });
        // Let the close reach the held state, then the second fetch finish (the order that
        // deadlocked; a different interleaving only makes the race easier).
        std::thread::sleep(Duration::from_millis(100));
        release_tx.send(true).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
        closed_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("close returned (no lock-order deadlock)");
        // Both fetches settle (the cancel ends the pending one), nothing is placed after the
        // close, and no temp file is left.
        for r in [&first, &second] {
            let mut st = r.state();
            while *st == FileState::Fetching {
                st = r
                    .changed
                    .wait_timeout(st, Duration::from_secs(30))
                    .unwrap()
                    .0;
            }
            assert!(
                matches!(
                    *st,
                    FileState::Failed(ErrorKind::Cancelled, _) | FileState::Local
                ),
                "{:?}",
                *st
            );
        }
        assert!(!dir.join("000001.sst").exists());
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().ends_with(".blobsnap-part"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        assert!(status(&dir).is_none());
    }

    /// F4: a reader waiting for a fetch that never completes is woken by the close, with an
    /// error, at once (the close cancels the download instead of waiting for it).
    #[test]
    fn close_wakes_a_reader_waiting_for_a_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().join("store");
        std::fs::create_dir(&dir).unwrap();
        let (_release_tx, release_rx) = tokio::sync::watch::channel(false);
        let (started_tx, started_rx) = mpsc::channel();
        register(
            &dir,
            vec![entry("000001.sst", 10)],
            gated_fetch(release_rx, started_tx),
            None,
            Background {
                downloads: 1,
                max_rate: 0,
            },
        )
        .unwrap();
        started_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        let (tx, rx) = mpsc::channel();
        let (reading_tx, reading_rx) = mpsc::channel();
        let path = absolute(&dir).unwrap().join("000001.sst");
        std::thread::spawn(move || {
            let _ = reading_tx.send(());
            let _ = tx.send(fetch_now(&path));
        });
        // The reader is parked on the in-flight fetch (or about to be): close.
        reading_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        close(&dir);
        let r = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the reader was woken");
        let (kind, msg) = r.unwrap_err();
        assert_eq!(kind, ErrorKind::Cancelled, "{msg}");
        assert!(msg.contains("closed"), "{msg}");
    }

    /// A stress of the lock order: 200 cycles of register → readers fetching on 3 threads →
    /// close racing them (and a new registration of the same dir replacing the last one),
    /// each fetch finishing at a different moment; the whole must end within its bound (a
    /// deadlock fails it instead of hanging the suite), every reader gets its file or an
    /// error, and nothing is ever left Fetching.
    #[test]
    fn two_hundred_register_read_close_cycles_never_hang() {
        let tmp = tempfile::tempdir().unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        let root = tmp.path().to_path_buf();
        std::thread::spawn(move || {
            for cycle in 0..200u32 {
                let dir = root.join(format!("s{}", cycle % 4));
                std::fs::create_dir_all(&dir).unwrap();
                for f in std::fs::read_dir(&dir).unwrap().flatten() {
                    let _ = std::fs::remove_file(f.path());
                }
                let fetch: FetchFn = Arc::new(move |e: FileIndex, tmp: PathBuf| {
                    Box::pin(async move {
                        // Finish at a different moment each time.
                        for _ in 0..(e.file_metadata.size + u64::from(cycle)) % 5 {
                            tokio::task::yield_now().await;
                        }
                        std::fs::write(&tmp, vec![1u8; e.file_metadata.size as usize])
                            .map_err(Error::io_with("write"))
                    })
                });
                let names = ["000001.sst", "000002.sst", "000003.sst"];
                register(
                    &dir,
                    names
                        .iter()
                        .enumerate()
                        .map(|(i, n)| entry(n, i as u64 + 1))
                        .collect(),
                    fetch,
                    None,
                    Background {
                        downloads: 2,
                        max_rate: 0,
                    },
                )
                .unwrap();
                let abs = absolute(&dir).unwrap();
                let readers: Vec<_> = names
                    .iter()
                    .map(|n| {
                        let p = abs.join(n);
                        std::thread::spawn(move || fetch_now(&p))
                    })
                    .collect();
                if cycle % 2 == 0 {
                    close(&dir);
                }
                for r in readers {
                    match r.join().unwrap() {
                        Ok(()) => {}
                        Err((kind, msg)) => assert_eq!(kind, ErrorKind::Cancelled, "{msg}"),
                    }
                }
                close(&dir);
            }
            let _ = done_tx.send(());
        });
        done_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("200 cycles ended (no deadlock)");
        assert_eq!(
            registry()
                .stores
                .keys()
                .filter(|d| d.starts_with(tmp.path()))
                .count(),
            0
        );
    }

    /// A read from a current-thread runtime is refused with a clear error (it would park the
    /// runtime's only thread until the download completes).
    #[test]
    fn a_current_thread_runtime_is_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = rt.block_on(async { refuse_current_thread() }).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("current-thread"), "{e}");
        assert!(refuse_current_thread().is_ok());
    }

    /// A checkpoint dir's pending list: appended per link, read back by name, and the dir is
    /// refused by every other reader (naming the missing files) until they are there.
    #[test]
    fn a_pending_list_marks_a_dir_incomplete_and_names_the_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        append_pending(dir.path(), &entry("000007.sst", 1), true).unwrap();
        append_pending(dir.path(), &entry("000009.sst", 1), false).unwrap();
        assert_eq!(
            read_pending(dir.path()).unwrap(),
            ["000007.sst", "000009.sst"]
        );
        std::fs::write(dir.path().join("000007.sst"), b"x").unwrap();
        let e = check_complete(dir.path()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let msg = e.to_string();
        assert!(
            msg.contains("000009.sst") && !msg.contains("000007.sst") && msg.contains("1 files"),
            "{msg}"
        );
        std::fs::write(dir.path().join(LAZY_PENDING), b"\xff not json").unwrap();
        let e = check_complete(dir.path()).unwrap_err();
        assert!(e.to_string().contains("unreadable"), "{e}");
    }

    fn entry_of(name: &str, bytes: &[u8]) -> FileIndex {
        let mut e = entry(name, bytes.len() as u64);
        e.sha256 = Some(crate::digest::Sha256::of(bytes));
        e
    }

    /// Register `dir` with one remote file fetched by [`gated_fetch`], one background
    /// download at a time; the returned sender releases the fetch.
    fn register_gated(dir: &Path, e: FileIndex) -> tokio::sync::watch::Sender<bool> {
        let (release_tx, release_rx) = tokio::sync::watch::channel(false);
        let (started_tx, _started) = mpsc::channel();
        register(
            dir,
            vec![e],
            gated_fetch(release_rx, started_tx),
            None,
            Background {
                downloads: 1,
                max_rate: 0,
            },
        )
        .unwrap();
        release_tx
    }

    /// Wait (on the file's condition variable, bounded) until `name` of the store at `dir` is
    /// placed, then link what is placed into the checkpoint dirs that recorded it.
    fn wait_placed(dir: &Path, name: &str) {
        let store = registry()
            .stores
            .get(&absolute(dir).unwrap())
            .cloned()
            .unwrap();
        let remote = Arc::clone(&store.files[name]);
        let mut st = remote.state();
        while *st != FileState::Local {
            let (next, timeout) = remote
                .changed
                .wait_timeout(st, Duration::from_secs(30))
                .unwrap();
            assert!(!timeout.timed_out(), "{name} never placed");
            st = next;
        }
        drop(st);
        materialize();
    }

    /// L1 of the second lazy-restore review: a file placed (and linked into a checkpoint dir)
    /// between the scan's two looks at that dir — the walk and the list of its remote files —
    /// is in the scan. The list is read first: a file it lacks was linked on disk before the
    /// walk. Read after the walk, a file placed between is in neither, and the commit's index
    /// lacks a table its MANIFEST names.
    #[test]
    fn a_file_placed_while_a_checkpoint_is_scanned_is_in_the_scan() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        std::fs::create_dir(&dir).unwrap();
        let release_tx = register_gated(&dir, entry_of("000002.sst", &[7u8; 20]));
        let (cp_tmp, cp) = (tmp.path().join("cp.tmp"), tmp.path().join("cp"));
        std::fs::create_dir(&cp_tmp).unwrap();
        assert!(link(&dir.join("000002.sst"), &cp_tmp.join("000002.sst")));
        std::fs::rename(&cp_tmp, &cp).unwrap();
        renamed(&cp_tmp, &cp);
        assert_eq!(remote_files_in(&cp).len(), 1);
        let hook_dir = dir.clone();
        crate::crash::TEST_HOOK.with(|h| {
            *h.borrow_mut() = Some((
                "scan.between-remote-list-and-walk",
                Box::new(move || {
                    release_tx.send(true).unwrap();
                    wait_placed(&hook_dir, "000002.sst");
                }),
            ))
        });
        let scanned = crate::local::scan::scan_dir_only(
            &cp,
            None,
            None,
            &crate::local::scan::Owners::default(),
            &crate::local::scan::ScanStats::default(),
        );
        crate::crash::TEST_HOOK.with(|h| *h.borrow_mut() = None);
        let scanned = scanned.unwrap();
        assert!(cp.join("000002.sst").exists(), "placed during the scan");
        let names: Vec<_> = scanned.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["000002.sst"],
            "the scan lost the file placed meanwhile"
        );
        close(&dir);
    }

    /// L2 of the second lazy-restore review: a store's first link into a new checkpoint dir
    /// must not forget another checkpoint's records while that one is between RocksDB's
    /// rename of its `.tmp` dir and the rename's callback.
    #[test]
    fn a_checkpoint_renamed_while_another_links_keeps_its_remote_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        std::fs::create_dir(&dir).unwrap();
        // 000001.sst's fetch never resolves: the file stays remote.
        let _release = register_gated(&dir, entry_of("000001.sst", &[1u8; 10]));
        let src = dir.join("000001.sst");
        let (a_tmp, a, b_tmp) = (
            tmp.path().join("a.tmp"),
            tmp.path().join("a"),
            tmp.path().join("b.tmp"),
        );
        std::fs::create_dir(&a_tmp).unwrap();
        std::fs::create_dir(&b_tmp).unwrap();
        assert!(link(&src, &a_tmp.join("000001.sst")));
        std::fs::rename(&a_tmp, &a).unwrap();
        assert!(link(&src, &b_tmp.join("000001.sst")));
        renamed(&a_tmp, &a);
        let names: Vec<_> = remote_files_in(&a).into_iter().map(|(n, ..)| n).collect();
        assert_eq!(names, ["000001.sst"], "checkpoint a lost its remote file");
        close(&dir);
    }
}
