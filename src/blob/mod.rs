//! The blob-store state backend: one wing that implements the SPI of [`backend`](crate::backend)
//! over any [`BlobStore`].
//!
//! - [`backup::BlobBackupManager`]: scan a checkpoint dir (hash cache), diff it against the
//!   last *committed* index, PUT only content the committed snapshot does not reference,
//!   write the index, return its key as the marker.
//! - [`restore::BlobRestoreManager`]: plan (reuse local bytes, download what is missing),
//!   execute into a staging dir with verified downloads, swap atomically.
//! - [`diff`]: local tree vs index, shared by backup and restore.
//!
//! Markers are stored in CheckpointV2 under [`FACTORY_NAME`].

pub mod admin;
pub mod backup;
pub mod diff;
pub mod factory;
pub mod gc;
pub mod restore;

pub use crate::blobstore::hash_object;
use crate::blobstore::{get_bytes, BlobStore};
use crate::digest::Sha256;
use crate::error::{Error, Result};
use crate::index::{IndexMarker, SnapshotIndex, MAX_INDEX_BYTES};
use crate::layout::StoreScope;

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

/// GET the index named by `marker` in `scope` and check it: the SHA-256 of its bytes against
/// the marker (`Corrupt`), its format and names (`Corrupt`/`InvalidInput`), its metadata
/// against `expected` and its checkpoint id against the marker's (`Corrupt`, naming both
/// values). Never returns someone else's snapshot.
pub async fn read_index(
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
