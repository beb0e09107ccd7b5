//! The file system's questions, called by `ffi` from RocksDB's threads: a remote file's size,
//! its fetch before a read, its footer, its deletion and a checkpoint's rename.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::fetcher::fetch_one;
use super::links::{links_io, materialize};
use super::registry::{
    absolute, count, find, refuse_current_thread, registry, runtime, split, wait, FileState,
    ACTIVE, MAX_TAIL,
};
use crate::error::{Error, ErrorKind};
use crate::index::LAZY_PENDING;

/// `Some(size)` when `path` is a remote file (of a store or linked into a checkpoint).
pub(super) fn remote_size(path: &Path) -> Option<u64> {
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
pub(super) fn fetch_now(path: &Path) -> std::result::Result<(), (ErrorKind, String)> {
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
pub(super) fn read_tail(path: &Path, offset: u64, n: usize) -> Option<bytes::Bytes> {
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

/// RocksDB deletes `path`: when it is remote, drop it (the background download skips it) and
/// return true.
pub(super) fn drop_file(path: &Path) -> bool {
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
pub(super) fn renamed(src: &Path, dst: &Path) {
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
