//! Prepared history records (docs/samza.md): when a Samza job keeps its CheckpointV2s in Kafka
//! (route 1 under Kafka's checkpoint manager, or Samza's own engine through samza-s3, route 2),
//! blobsnap's bucket holds no commit point, so the snapshots a commit uploads would be orphans
//! to the sweep. Route 2 writes one record per store (`<id>.<store>.json`, at the index's PUT)
//! and promotes at the index's `removeTTL`; what follows is route 1's. At the end of each upload the
//! backup writes a *prepared* record, `prepared/<task>/<checkpoint-id>.json` (the CheckpointV2
//! it hands Samza: its markers, no offsets), which the sweep reads as a root. When Samza has
//! written its checkpoint (`cleanUp`, or the next start's `init`, which gets it back) the record
//! is promoted: the checkpoint is committed into blobsnap's own history, then the record is
//! deleted. A start drops the records of the commits Samza never wrote (their snapshots become
//! orphans, swept after the grace).

use bytes::Bytes;
use futures::TryStreamExt as _;

use crate::blobstore::{get_bytes, BlobKey, BlobStore, PutBody, PutOptions};
use crate::checkpoint::{Checkpoint, CheckpointV2, MAX_CHECKPOINT_BYTES};
use crate::digest::Sha256;
use crate::error::{Error, ErrorKind, Result};
use crate::id::CheckpointId;
use crate::layout::{parse, JobScope, KeyKind};

/// One prepared record, as listed.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// Its key.
    pub key: BlobKey,
    /// The task.
    pub task: String,
    /// The checkpoint it prepares.
    pub id: CheckpointId,
    /// The one store a per-store record holds (Samza's own engine writes one per store).
    pub store: Option<String>,
}

/// Write the prepared record of `checkpoint` for `task` (before the upload's future completes:
/// the record is a root from here on).
pub async fn write(
    store: &dyn BlobStore,
    job: &JobScope,
    task: &str,
    checkpoint: &CheckpointV2,
) -> Result<()> {
    let key = job.prepared_key(task, &checkpoint.id)?;
    let bytes = Bytes::from(checkpoint.to_json()?);
    let opts = PutOptions {
        sha256: Some(Sha256::of(&bytes)),
        ..PutOptions::default()
    };
    store
        .put(&key, PutBody::Bytes(bytes), opts)
        .await
        .map_err(|e| e.context(format!("write the prepared history record {key}")))?;
    Ok(())
}

/// Every prepared record of the job (of `task` only, when given), in key order.
pub async fn list(
    store: &dyn BlobStore,
    job: &JobScope,
    task: Option<&str>,
) -> Result<Vec<Prepared>> {
    Ok(list_with_strays(store, job, task).await?.0)
}

/// [`list`], and the keys under `prepared/` that are no record's shape (a sweep fails closed
/// on one: it may be a record it cannot read).
pub async fn list_with_strays(
    store: &dyn BlobStore,
    job: &JobScope,
    task: Option<&str>,
) -> Result<(Vec<Prepared>, Vec<BlobKey>)> {
    let scope = match task {
        Some(t) => job.prepared(t)?,
        None => job.all_prepared()?,
    };
    let (mut out, mut strays) = (Vec::new(), Vec::new());
    let mut listing = store.list(&scope);
    while let Some(m) = listing.try_next().await? {
        match parse(&m.key).map(|p| p.kind) {
            Some(KeyKind::Prepared {
                task,
                checkpoint_id,
                store,
            }) => out.push(Prepared {
                key: m.key,
                task,
                id: checkpoint_id,
                store,
            }),
            // A folder marker some S3 tools make (`prepared/`, `prepared/<task>/`) holds nothing.
            _ if m.size == 0 && m.key.as_str().ends_with('/') => {}
            _ => strays.push(m.key),
        }
    }
    Ok((out, strays))
}

/// Read one prepared record: `Corrupt` naming the key when it is not the CheckpointV2 of its
/// name.
pub async fn read(store: &dyn BlobStore, p: &Prepared) -> Result<CheckpointV2> {
    let bytes = get_bytes(store, &p.key, MAX_CHECKPOINT_BYTES as u64).await?;
    let bad = |why: String| Error::corrupt(format!("prepared history record {}: {why}", p.key));
    let one_store = |c: &CheckpointV2| match &p.store {
        None => true,
        Some(s) => c
            .state_checkpoint_markers
            .values()
            .all(|m| m.keys().all(|k| k == s)),
    };
    match Checkpoint::from_json(&bytes).map_err(|e| bad(e.to_string()))? {
        Checkpoint::V2(c) if c.id == p.id && one_store(&c) => Ok(c),
        Checkpoint::V2(c) if c.id == p.id => Err(bad(format!(
            "the record of store {:?} names other stores",
            p.store.as_deref().unwrap_or_default()
        ))),
        Checkpoint::V2(c) => Err(bad(format!("it holds checkpoint {}", c.id))),
        Checkpoint::V1(_) => Err(bad("it is a CheckpointV1".into())),
    }
}

/// Delete prepared records (one already gone is no error).
pub async fn remove(store: &dyn BlobStore, keys: &[BlobKey]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let failed = store.delete_many(keys).await?;
    if let Some((key, e)) = failed
        .into_iter()
        .find(|(_, e)| e.kind() != ErrorKind::NotFound)
    {
        return Err(e.context(format!("delete the prepared history record {key}")));
    }
    Ok(())
}
