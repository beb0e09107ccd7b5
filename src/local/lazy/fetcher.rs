//! Fetching: one remote file, verified and renamed into its store dir ([`fetch_one`]), and the
//! background download of a whole store ([`download_all`]). No lock is held across a fetch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::StreamExt as _;

use super::links::materialize;
use super::proof::record_proof;
use super::registry::{
    completed, count, registry, retryable, Background, FileState, LazyStore, Remote,
};
use crate::error::{Error, ErrorKind};
use crate::index::{FileIndex, LAZY_FAILED, LAZY_PENDING};

/// The background's wait before its pass number `pass` (1 = the first retry): 1 s doubling
/// to at most a minute.
pub(super) fn retry_delay(pass: u32) -> std::time::Duration {
    std::time::Duration::from_secs(1u64 << pass.saturating_sub(1).min(6))
        .min(std::time::Duration::from_secs(60))
}

/// Sets a file left `Fetching` by a fetch that ended without an outcome (its task panicked or
/// was dropped) to `Failed`, and wakes its waiters: no waiter waits forever.
pub(super) struct Settle<'a>(&'a Remote);

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
pub(super) fn background_rank(
    entry: &FileIndex,
) -> (std::cmp::Reverse<u64>, std::cmp::Reverse<u64>) {
    (
        std::cmp::Reverse(entry.heat.unwrap_or(0)),
        std::cmp::Reverse(entry.file_metadata.size),
    )
}

/// A temporary name for a fetch of `name`, unique in this process (two fetches of one file by
/// two registrations never share one).
pub(super) fn part_name(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        ".{name}.{}-{}.blobsnap-part",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Fetch `remote` (whose state the caller set to `Fetching`) into the store dir; sets the
/// outcome and wakes the waiters. True when the file was put in place.
pub(super) async fn fetch_one(store: &LazyStore, remote: &Remote) -> bool {
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
        let mut failed_for_good = None;
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
                if !retryable(e.kind()) {
                    failed_for_good = Some(e);
                }
                false
            }
        };
        drop(st);
        // Durable, so that the next start's restore verifies this file before the store
        // opens instead of failing its first read again (issue 46, L4); under `placing` (the
        // dir is still this store's), not under the file's state.
        if let Some(e) = failed_for_good {
            if let Err(w) = note_failed(&store.dir, remote, &e) {
                tracing::warn!(store = %store.dir.display(), error = %w, "lazy restore: cannot record a failed fetch");
            }
        }
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
pub(super) async fn download_all(store: Arc<LazyStore>, bg: Background) {
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

/// Append to `dir`'s [`LAZY_FAILED`] the file `remote` whose fetch failed for good (its blob
/// corrupt or missing), fsynced with its dir. Called with the store's `placing` held (the dir
/// is still this store's: a later restore may swap a new tree in only after a close).
fn note_failed(dir: &std::path::Path, remote: &Remote, e: &Error) -> crate::error::Result<()> {
    use std::io::Write as _;
    let line = serde_json::json!({
        "file-name": remote.name,
        "blob-id": remote.entry.blobs.first().map(|b| b.blob_id.as_str()),
        "kind": format!("{:?}", e.kind()),
        "reason": e.to_string(),
    });
    let mut bytes = serde_json::to_vec(&line).map_err(|e| Error::invalid(e.to_string()))?;
    bytes.push(b'\n');
    let path = dir.join(LAZY_FAILED);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(Error::io_with(format!("open {}", path.display())))?;
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .map_err(Error::io_with(format!("write {}", path.display())))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io_with(format!("fsync {}", dir.display())))
}

/// The blobs a lazy restore of `dir` could not fetch for good ([`LAZY_FAILED`]): their ids.
/// Empty when there is no note (or it cannot be read: a note is advice, never a refusal).
pub fn failed_blobs(dir: &std::path::Path) -> std::collections::HashSet<String> {
    let Ok(text) = std::fs::read_to_string(dir.join(LAZY_FAILED)) else {
        return Default::default();
    };
    text.lines()
        .filter_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()?
                .get("blob-id")?
                .as_str()
                .map(str::to_string)
        })
        .collect()
}
