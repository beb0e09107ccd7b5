//! Where each blob an index names came from (`blobsnap inspect`).

use super::*;

/// Where a blob an index names came from, told by the checkpoint id in its key
/// (`blobs/<checkpoint-id>/<sha256>`, DESIGN §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobOrigin {
    /// Uploaded by this snapshot's own commit (its checkpoint id).
    Uploaded,
    /// Uploaded for this snapshot ahead of its commit, by the pre-upload: an id of the task's
    /// newer than the previous snapshot's that is not this commit's (a commit reuses blobs of
    /// committed snapshots only, so only a pre-upload makes such a key).
    PreUploaded,
    /// Named by an earlier snapshot already (reused, or kept from it).
    Reused,
    /// A fork's blob in the scope it borrows from.
    Borrowed,
}

impl BlobOrigin {
    /// Its name in `blobsnap inspect`.
    pub fn as_str(self) -> &'static str {
        match self {
            BlobOrigin::Uploaded => "new",
            BlobOrigin::PreUploaded => "pre-uploaded",
            BlobOrigin::Reused => "reused",
            BlobOrigin::Borrowed => "borrowed",
        }
    }
}

impl SnapshotIndex {
    /// Where `blob` (a [`FileBlob`] of this index) came from.
    pub fn blob_origin(&self, blob: &FileBlob) -> BlobOrigin {
        if blob.borrowed().is_some() {
            return BlobOrigin::Borrowed;
        }
        let own = self.snapshot_metadata.checkpoint_id;
        let Some(id) = blob
            .blob_id
            .strip_prefix("blobs/")
            .and_then(|r| r.split_once('/'))
            .and_then(|(id, _)| id.parse::<CheckpointId>().ok())
        else {
            return BlobOrigin::Reused;
        };
        if id == own {
            return BlobOrigin::Uploaded;
        }
        let prev = self
            .prev_snapshot_index_blob_id
            .as_deref()
            .and_then(|m| m.parse::<IndexMarker>().ok())
            .map(|m| m.checkpoint_id);
        match prev {
            Some(p) if id <= p => BlobOrigin::Reused,
            // Made after the previous snapshot (a pre-upload may start after this commit took
            // its id: the commit waits for it) and by no commit.
            _ => BlobOrigin::PreUploaded,
        }
    }
}
