//! Reading and checking one store snapshot, the step every path that reads state takes
//! (restore, standby, check, usage, cost, forks): the index named by a marker, fetched under
//! a size cap, its SHA-256 against the marker, its identity against what is being read, its
//! borrowed scopes resolved. And the key the blob backend's markers live under in a
//! CheckpointV2 ([`FACTORY_NAME`]).

use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::blobstore::hash_object;
use crate::blobstore::{get_bytes, BlobKey, BlobStore};
use crate::digest::Sha256;
use crate::error::{Error, ErrorKind, Result};
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

/// Where the blobs of one snapshot live: its store's own scope, and for a fork's index the
/// scopes it declares it borrows from (`borrowed-from`, checked by [`load_snapshot`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlobScopes {
    own: Option<StoreScope>,
    borrowed: BTreeMap<String, StoreScope>,
}

impl BlobScopes {
    /// Blobs of `scope` only (every snapshot a plain job writes).
    pub fn own(scope: StoreScope) -> Self {
        BlobScopes {
            own: Some(scope),
            borrowed: BTreeMap::new(),
        }
    }

    /// The full key of `blob_id`: `blobs/…` in the own scope, `borrowed/<alias>/blobs/…` in
    /// the declared scope of `alias`. Anything else (an id outside `blobs/`, an undeclared
    /// alias, a key that escapes its scope) is `Corrupt`.
    pub fn key(&self, blob_id: &str) -> Result<BlobKey> {
        let (scope, rel) = match blob_id.strip_prefix(crate::index::BORROWED_PREFIX) {
            Some(rest) => {
                let (alias, rel) = rest.split_once('/').unwrap_or((rest, ""));
                let scope = self.borrowed.get(alias).ok_or_else(|| {
                    Error::corrupt(format!(
                        "blob {blob_id:?} borrows from undeclared scope {alias:?}"
                    ))
                })?;
                (scope, rel)
            }
            None => (
                self.own
                    .as_ref()
                    .ok_or_else(|| Error::corrupt("no store scope to resolve blobs in"))?,
                blob_id,
            ),
        };
        let key = scope
            .key(rel)
            .map_err(|e| Error::corrupt(format!("bad blob id {blob_id:?}: {}", e.message())))?;
        if !rel.starts_with("blobs/") || !key.is_in(scope.scope()) {
            return Err(Error::corrupt(format!(
                "blob {blob_id:?} is outside the store's blobs/"
            )));
        }
        Ok(key)
    }

    /// Whether `blob_id` is in the own scope (a collector of this store may delete it; a
    /// borrowed blob belongs to the job it was borrowed from, and is never deleted here).
    pub fn is_own(blob_id: &str) -> bool {
        !blob_id.starts_with(crate::index::BORROWED_PREFIX)
    }

    /// The declared scopes, by alias.
    pub fn borrowed(&self) -> &BTreeMap<String, StoreScope> {
        &self.borrowed
    }
}

/// A store's snapshot, loaded and checked by [`load_snapshot`] (or just written by a backup).
#[derive(Clone, Debug)]
pub struct LoadedSnapshot {
    /// The store's scope: where its index lives, and its own blobs.
    pub scope: StoreScope,
    /// Where its blobs live (its own scope, and a fork's borrowed ones).
    pub blobs: BlobScopes,
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
    let blobs = borrowed_scopes(store, &scope, &marker, &index, who).await?;
    for (path, f) in index.present_files() {
        if f.sha256.is_none() {
            return Err(Error::corrupt(format!(
                "index {marker}: entry {path} has no sha256; cannot verify a restore"
            )));
        }
        for b in &f.blobs {
            blobs
                .key(&b.blob_id)
                .map_err(|e| e.context(format!("index {marker}: entry {path}")))?;
        }
    }
    Ok(LoadedSnapshot {
        scope,
        blobs,
        marker,
        index: Arc::new(index),
    })
}

/// The scopes a (fork's) index reads blobs from: its own, and each one it declares in
/// `borrowed-from` — a store of **another** job, on which this task holds a pin (the fork's
/// pin on the savepoint that keeps those blobs, DESIGN §10). A declaration of the own job, or
/// one without its pin, is `Corrupt`: an index never reads blobs it has no root for.
async fn borrowed_scopes(
    store: &dyn BlobStore,
    scope: &StoreScope,
    marker: &IndexMarker,
    index: &SnapshotIndex,
    who: &Expected<'_>,
) -> Result<BlobScopes> {
    let mut out = BlobScopes::own(scope.clone());
    for (alias, b) in &index.borrowed_from {
        if (b.job_name.as_str(), b.job_id.as_str()) == (who.job_name, who.job_id) {
            return Err(Error::corrupt(format!(
                "index {marker}: borrowed-from[{alias}] names its own job: only a fork borrows, and from another job"
            )));
        }
        // The pin is per task: it covers the same task and store of the source, no other.
        if (b.task_name.as_str(), b.store_name.as_str()) != (who.task_name, who.store_name) {
            return Err(Error::corrupt(format!(
                "index {marker}: borrowed-from[{alias}] names task {:?} store {:?} of {}/{}: a fork borrows only from its own task and store there",
                b.task_name, b.store_name, b.job_name, b.job_id
            )));
        }
        let source = JobScope::new(&b.job_name, &b.job_id)?;
        let pin = source.fork_pin_key(&b.savepoint, who.job_name, who.job_id, who.task_name)?;
        if let Err(e) = store.head(&pin).await {
            let what = format!(
                "index {marker} borrows blobs of {}/{} (savepoint {:?}) and needs its pin {pin}",
                b.job_name, b.job_id, b.savepoint
            );
            return Err(if e.kind() == ErrorKind::NotFound {
                Error::corrupt(format!(
                    "{what}, which is gone: the source may no longer keep those blobs"
                ))
            } else {
                e.context(what)
            });
        }
        out.borrowed
            .insert(alias.clone(), source.store(&b.task_name, &b.store_name)?);
    }
    Ok(out)
}

/// GET the index named by `marker` in `scope` and check it: the SHA-256 of its bytes against
/// the marker (`Corrupt`), its format and names (`Corrupt`/`InvalidInput`), its metadata
/// against `expected` and its checkpoint id against the marker's (`Corrupt`, naming both
/// values). Never returns someone else's snapshot.
pub(crate) async fn read_index(
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
    let mut index =
        SnapshotIndex::from_slice(&bytes).map_err(|e| e.context(format!("index {key}")))?;
    index.sha256_from_keys();
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
