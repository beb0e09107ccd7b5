//! What RocksDB tells us about its files: each open [`RocksStore`](crate::local::rocks::RocksStore)
//! carries a RocksDB `EventListener` (`cpp/lazy_fs.cc`, added through
//! [`crate::local::lazy`]'s FFI module) that reports every table or blob file RocksDB has
//! finished writing (created, synced, about to join a version) and every one it deleted.
//! Whoever wants them — the pre-upload of the blob backend ([`crate::blob::commit::preupload`]) —
//! [`subscribe`]s by store directory and receives [`FileEvent`]s on a channel.
//!
//! The listener runs on RocksDB's flush and compaction threads: `publish` only looks the
//! token up and queues the event (an unbounded channel; a subscriber that went away is
//! dropped), never blocks and never does I/O. One lock (the registry's), held for a lookup or
//! an insertion, never across anything else.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// One thing RocksDB did to a file of a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileEvent {
    /// A table (`*.sst`) or blob (`*.blob`) file is complete on disk: it is never written
    /// again, and RocksDB is about to make it part of the database.
    Finished(PathBuf),
    /// RocksDB deleted this table or blob file (compacted away, or an aborted job's output).
    Deleted(PathBuf),
}

#[derive(Default)]
struct Registry {
    /// Token → the store dir its database reports for.
    dirs: HashMap<u64, PathBuf>,
    /// Store dir → its subscribers.
    subscribers: HashMap<PathBuf, Vec<UnboundedSender<FileEvent>>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    // The registry holds plain maps; a panic elsewhere cannot leave them half-written.
    let mut g = REGISTRY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    f(g.get_or_insert_with(Registry::default))
}

/// The key a store dir is known by: its canonical path (a symlinked or relative spelling of
/// one dir is one key) — of its parent when the dir does not exist yet — else the path as
/// given.
fn key(dir: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(dir) {
        return p;
    }
    match (dir.parent().map(std::fs::canonicalize), dir.file_name()) {
        (Some(Ok(parent)), Some(name)) => parent.join(name),
        _ => dir.to_path_buf(),
    }
}

/// A database's registration: its events go to `dir`'s subscribers until it is dropped.
#[derive(Debug)]
pub(crate) struct Registration {
    token: u64,
}

impl Registration {
    /// The token the listener reports with.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        with(|r| r.dirs.remove(&self.token));
    }
}

/// Register the database about to be opened at `dir`.
pub(crate) fn register(dir: &Path) -> Registration {
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let dir = key(dir);
    with(|r| r.dirs.insert(token, dir));
    Registration { token }
}

/// The events of the database open (or opened later) at `dir`, from now on, until the
/// receiver is dropped.
pub fn subscribe(dir: &Path) -> UnboundedReceiver<FileEvent> {
    let (tx, rx) = unbounded_channel();
    let dir = key(dir);
    with(|r| r.subscribers.entry(dir).or_default().push(tx));
    rx
}

/// Tell `dir`'s subscribers of `event` directly: a [`StoreEngine`](super::engine::StoreEngine)
/// that is not a [`RocksStore`](crate::local::rocks::RocksStore) announces the immutable files
/// it has finished (`*.sst`, `*.blob`: never written again) and the ones it deleted, so that
/// they are pre-uploaded too.
pub fn announce(dir: &Path, event: FileEvent) {
    let dir = key(dir);
    with(|r| {
        if let Some(subs) = r.subscribers.get_mut(&dir) {
            subs.retain(|tx| tx.send(event.clone()).is_ok());
        }
    });
}

/// Called by the listener (on a RocksDB thread): `kind` 1 or 2 is a finished table or blob
/// file, 3 or 4 a deleted one.
pub(crate) fn publish(token: u64, kind: i32, path: &Path) {
    let event = match kind {
        1 | 2 => FileEvent::Finished(path.to_path_buf()),
        3 | 4 => FileEvent::Deleted(path.to_path_buf()),
        _ => return,
    };
    with(|r| {
        let Some(dir) = r.dirs.get(&token) else {
            return;
        };
        if let Some(subs) = r.subscribers.get_mut(dir) {
            subs.retain(|tx| tx.send(event.clone()).is_ok());
            if subs.is_empty() {
                let dir = dir.clone();
                r.subscribers.remove(&dir);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_and_a_compaction_are_reported_to_the_dir_s_subscribers() {
        let dir = tempfile::tempdir().unwrap();
        let db_dir = dir.path().join("db");
        let mut rx = subscribe(&db_dir);
        let mut other = subscribe(&dir.path().join("elsewhere"));
        let db = crate::local::rocks::RocksStore::open("s", &db_dir).unwrap();
        for round in 0..2u8 {
            for i in 0..100u32 {
                db.db().put(i.to_be_bytes(), [round; 100]).unwrap();
            }
            db.db().flush().unwrap();
        }
        db.db().compact_range::<&[u8], &[u8]>(None, None);
        drop(db);
        let mut finished = Vec::new();
        let mut deleted = Vec::new();
        while let Ok(e) = rx.try_recv() {
            match e {
                FileEvent::Finished(p) => finished.push(p),
                FileEvent::Deleted(p) => deleted.push(p),
            }
        }
        // Two flushes and the compaction's output; the compaction deleted the flushed two.
        assert_eq!(finished.len(), 3, "{finished:?}");
        assert!(finished
            .iter()
            .all(|p| p.extension().is_some_and(|e| e == "sst")
                && p.parent().map(key) == Some(key(&db_dir))));
        assert_eq!(deleted.len(), 2, "{deleted:?}");
        assert!(deleted.iter().all(|d| finished[..2].contains(d)));
        assert!(
            other.try_recv().is_err(),
            "another dir's subscriber heard nothing"
        );
    }
}
