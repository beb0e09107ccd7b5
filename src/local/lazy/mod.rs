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

//!
//! # Rooms
//!
//! - `registry`: what is remote, per store dir and per checkpoint dir, and the one lock over it;
//! - `links`: checkpoint dirs of a lazy store — the pending lists, the recorded links, and
//!   the links made once a file is local;
//! - `fetcher`: one verified fetch and the background download;
//! - `fs`: the file system's questions (called by `ffi` from RocksDB's threads);
//! - `proof`: the digest of a fetched file, which the backup's scan takes instead of reading it;
//! - `ffi`: the C ABI of the lazy Env (`cpp/lazy_fs.cc`).

mod fetcher;
mod ffi;
mod fs;
mod links;
mod proof;
mod registry;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use tokio_util::sync::CancellationToken;

use crate::error::{Error, ErrorKind, Result};
use crate::index::{FileIndex, LAZY_PENDING};
use fetcher::download_all;
use registry::{count, registry, runtime, FileState, LazyProgress, LazyStore, Remote};

pub use fetcher::failed_blobs;
pub use links::{check_complete, forget_links, remote_files_in, write_pending};
pub use proof::proof;
pub use registry::{
    absolute, completed_status, fetching, is_lazy, refuse_current_thread, status, Background,
    FetchFn, LazyStatus, TailFn, DEFAULT_RATE, MAX_TAIL,
};

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
    proof::forget(&dir);
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
