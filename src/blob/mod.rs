//! The blob-store state backend: one wing that implements the SPI of [`backend`](crate::backend)
//! over any [`BlobStore`].
//!
//! - [`backup::BlobBackupManager`]: scan a checkpoint dir (hash cache), diff it against the
//!   last *committed* index, PUT only content the committed snapshot does not reference,
//!   write the index, return its key as the marker.
//! - [`restore::BlobRestoreManager`]: plan (reuse local bytes, download what is missing),
//!   execute into a staging dir with verified downloads, swap atomically.
//! - [`diff`]: local tree vs index, shared by backup and restore.
//! - [`manual`]: backups of a closed RocksDB dir outside any job (`blobsnap backup`).
//! - [`cost`]: what a job costs per commit and per month, from its retained checkpoints.
//! - [`history`]: every retained checkpoint, and references to one (`latest`, `#N`, an id,
//!   `@TIME`, a savepoint); [`savepoint`]: named, user-owned roots.
//!
//! Markers are stored in CheckpointV2 under [`FACTORY_NAME`].

pub mod admin;
pub mod backup;
pub mod check;
pub mod cost;
pub mod diff;
pub mod factory;
pub mod gc;
pub mod history;
pub mod manual;
pub mod restore;
pub mod savepoint;
pub mod usage;
pub mod verify;

use std::sync::Arc;

pub use crate::blobstore::hash_object;
use crate::blobstore::{get_bytes, BlobStore};
use crate::digest::Sha256;
use crate::error::{Error, Result};
use crate::index::{IndexMarker, SnapshotIndex, MAX_INDEX_BYTES};
use crate::layout::{JobScope, StoreScope};

/// The key of the blob backend in `state-checkpoint-markers`. Fixed forever: changing it
/// orphans every checkpoint.
pub const FACTORY_NAME: &str = "blobsnap.BlobStoreStateBackendFactory";

/// Whose snapshot an index must describe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected<'a> {
    /// Job name.
    pub job_name: &'a str,
    /// Job id.
    pub job_id: &'a str,
    /// Task name.
    pub task_name: &'a str,
    /// Store name.
    pub store_name: &'a str,
}

/// A store's snapshot, loaded and checked by [`load_snapshot`] (or just written by a backup).
#[derive(Clone, Debug)]
pub struct LoadedSnapshot {
    /// The store's scope: where its index and blobs live.
    pub scope: StoreScope,
    /// The snapshot's marker.
    pub marker: IndexMarker,
    /// Its index.
    pub index: Arc<SnapshotIndex>,
}

/// The one way a snapshot is read, by backup, restore, GC, verify and the CLI: parse
/// `marker`, GET its index in the scope of `who` and check it — the SHA-256 of its bytes
/// against the marker, its format, its names and checkpoint id (`read_index`), and
/// that every file it lists has a SHA-256 and blobs inside the store's `blobs/` (`Corrupt`
/// naming the entry). Never returns someone else's snapshot, nor one a restore could not
/// verify.
pub async fn load_snapshot(
    store: &dyn BlobStore,
    who: &Expected<'_>,
    marker: &str,
) -> Result<LoadedSnapshot> {
    let scope = JobScope::new(who.job_name, who.job_id)?.store(who.task_name, who.store_name)?;
    let marker: IndexMarker = marker.parse()?;
    let index = read_index(store, &scope, &marker, who).await?;
    for (path, f) in index.present_files() {
        if f.sha256.is_none() {
            return Err(Error::corrupt(format!(
                "index {marker}: entry {path} has no sha256; cannot verify a restore"
            )));
        }
        for b in &f.blobs {
            let key = scope.key(&b.blob_id).map_err(|e| {
                Error::corrupt(format!(
                    "index {marker}: entry {path}: bad blob id {:?}: {}",
                    b.blob_id,
                    e.message()
                ))
            })?;
            if !b.blob_id.starts_with("blobs/") || !key.is_in(scope.scope()) {
                return Err(Error::corrupt(format!(
                    "index {marker}: entry {path}: blob {:?} is outside the store's blobs/",
                    b.blob_id
                )));
            }
        }
    }
    Ok(LoadedSnapshot {
        scope,
        marker,
        index: Arc::new(index),
    })
}

/// GET the index named by `marker` in `scope` and check it: the SHA-256 of its bytes against
/// the marker (`Corrupt`), its format and names (`Corrupt`/`InvalidInput`), its metadata
/// against `expected` and its checkpoint id against the marker's (`Corrupt`, naming both
/// values). Never returns someone else's snapshot.
async fn read_index(
    store: &dyn BlobStore,
    scope: &StoreScope,
    marker: &IndexMarker,
    expected: &Expected<'_>,
) -> Result<SnapshotIndex> {
    let key = scope.index_key(marker)?;
    let bytes = get_bytes(store, &key, MAX_INDEX_BYTES)
        .await
        .map_err(|e| e.context(format!("read index {key}")))?;
    let actual = Sha256::of(&bytes);
    if actual != marker.sha256 {
        return Err(Error::corrupt(format!(
            "index {key}: its bytes hash to {actual}, the marker says {}",
            marker.sha256
        )));
    }
    let index = SnapshotIndex::from_slice(&bytes).map_err(|e| e.context(format!("index {key}")))?;
    let m = &index.snapshot_metadata;
    for (field, want, got) in [
        ("job name", expected.job_name, m.job_name.as_str()),
        ("job id", expected.job_id, m.job_id.as_str()),
        ("task", expected.task_name, m.task_name.as_str()),
        ("store", expected.store_name, m.store_name.as_str()),
    ] {
        if want != got {
            return Err(Error::corrupt(format!(
                "index {key} belongs to {field} {got:?}, not {want:?}: refusing to use another snapshot's state"
            )));
        }
    }
    if m.checkpoint_id != marker.checkpoint_id {
        return Err(Error::corrupt(format!(
            "index {key} says checkpoint {}, its marker says {}",
            m.checkpoint_id, marker.checkpoint_id
        )));
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    #[test]
    fn factory_name_golden() {
        assert_eq!(super::FACTORY_NAME, "blobsnap.BlobStoreStateBackendFactory");
    }
}
