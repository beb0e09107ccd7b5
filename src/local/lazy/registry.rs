//! The registry of a process's lazy restores: per store dir, its remote files and their
//! states; per checkpoint dir, the remote files RocksDB "linked" into it. One lock over the
//! whole map ([`registry`], second in the module's lock order), then a store's `placing`, then
//! a file's state.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, ErrorKind, Result};
use crate::index::FileIndex;

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
pub(super) enum FileState {
    Remote,
    Fetching,
    Local,
    Dropped,
    /// The last fetch failed: what kind of failure (a corrupt or missing blob, a transient
    /// fault…) and the message.
    Failed(ErrorKind, String),
}

#[derive(Debug)]
pub(super) struct Remote {
    pub(super) name: String,
    /// The store dir the file is placed into once fetched.
    pub(super) store_dir: PathBuf,
    pub(super) entry: FileIndex,
    pub(super) state: Mutex<FileState>,
    pub(super) changed: Condvar,
    /// Lifted when RocksDB waits for the file while the background download fetches it: the
    /// rest of that fetch is no longer paced.
    pub(super) lift: Arc<crate::blobstore::limit::Lift>,
    /// Cancelled when RocksDB deletes the file: a fetch in flight stops (a paced background
    /// fetch of a compacted-away file would otherwise go on to its end).
    pub(super) gone: CancellationToken,
}

impl Remote {
    pub(super) fn state(&self) -> MutexGuard<'_, FileState> {
        // A panic while holding this lock leaves a valid state (every write is one assignment).
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn is_remote(&self) -> bool {
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

pub(super) struct LazyStore {
    pub(super) dir: PathBuf,
    pub(super) files: BTreeMap<String, Arc<Remote>>,
    pub(super) fetch: FetchFn,
    pub(super) tail: Option<TailFn>,
    pub(super) cancel: CancellationToken,
    pub(super) progress: LazyProgress,
    pub(super) done: tokio::sync::watch::Sender<bool>,
    /// Held while a fetched file is renamed into the dir, and by [`close`] while it cancels:
    /// once closed, nothing more is placed (a later restore may have swapped a new tree in).
    pub(super) placing: Mutex<()>,
}

impl LazyStore {
    pub(super) fn placing(&self) -> MutexGuard<'_, ()> {
        self.placing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl LazyStore {
    pub(super) fn status(&self) -> LazyStatus {
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
pub(super) fn retryable(kind: ErrorKind) -> bool {
    !matches!(kind, ErrorKind::Corrupt | ErrorKind::NotFound)
}

#[derive(Default)]
pub(super) struct Registry {
    /// Lazily restored store dirs.
    pub(super) stores: HashMap<PathBuf, Arc<LazyStore>>,
    /// Checkpoint dirs, and the remote files RocksDB "linked" into them.
    pub(super) links: HashMap<PathBuf, BTreeMap<String, Arc<Remote>>>,
}

/// Entries in the registry (stores + link dirs): 0 makes every callback a no-op at once.
pub(super) static ACTIVE: AtomicUsize = AtomicUsize::new(0);

pub(super) fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) fn count(r: &Registry) {
    ACTIVE.store(r.stores.len() + r.links.len(), Ordering::Release);
}

/// The runtime the fetches run on: its own, so that a RocksDB read blocked on a fetch never
/// waits for a runtime thread it is itself holding.
pub(super) fn runtime() -> Result<&'static tokio::runtime::Runtime> {
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

pub(super) fn split(path: &Path) -> Option<(&Path, &str)> {
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

pub(super) fn find(r: &Registry, path: &Path) -> Option<(Arc<LazyStore>, Arc<Remote>)> {
    let (dir, name) = split(path)?;
    let store = r.stores.get(dir)?;
    let remote = store.files.get(name)?;
    Some((Arc::clone(store), Arc::clone(remote)))
}

/// Whether a lazy restore of this process serves `dir`: a lazily restored store dir, or a
/// checkpoint dir with remote files recorded in it.
pub(super) fn is_served(dir: &Path) -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Ok(dir) = absolute(dir) else { return false };
    let r = registry();
    r.stores.contains_key(&dir) || r.links.contains_key(&dir)
}

/// Whether `dir` is a lazily restored store with files still remote (open it with
/// `ENV_OPTION`).
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
pub(super) fn completed() -> MutexGuard<'static, std::collections::HashMap<PathBuf, LazyStatus>> {
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
pub(super) fn wait<'a>(
    remote: &'a Remote,
    st: MutexGuard<'a, FileState>,
) -> MutexGuard<'a, FileState> {
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
