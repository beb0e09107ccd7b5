//! The state-backend SPI (DESIGN §2): Samza's `StateBackendFactory`, `TaskBackupManager`,
//! `TaskRestoreManager` and `StateBackendAdmin`, in async Rust.
//!
//! This floor knows nothing of S3 or RocksDB: a backend gets the job/task context, the stores
//! with their directories and [`StoreEngine`] handles, and a [`Clock`]. The commit manager owns
//! the local steps of a commit (flush, RocksDB checkpoint into
//! `<store dir>.checkpoints/<checkpoint-id>`), and hands every backend those directories.
//!
//! Lifecycle of one commit, as the commit manager drives it:
//!
//! 1. [`TaskBackupManager::snapshot`] (sync, fast, no network);
//! 2. [`TaskBackupManager::upload`] (async) → store → marker;
//! 3. the CheckpointV2 with every backend's markers is written (the commit point);
//! 4. [`TaskBackupManager::cleanup_deferred`] (async, idempotent) with the committed markers;
//!    what it hands back goes out with the next commit's trim of the checkpoint history.
//!
//! A backend's markers are stored in the CheckpointV2 under its
//! [`StateBackendFactory::name`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

use crate::blobstore::DeferredDeletes;
use crate::checkpoint::{Checkpoint, CheckpointId};
use crate::error::{Error, Result};
pub use crate::local::engine::{sibling_of, StoreEngine};
pub use crate::units::{Clock, SystemClock};

/// Store name → marker.
pub type StoreMarkers = BTreeMap<String, String>;

/// Fresh checkpoint ids from the task's one generator (the commit manager's): each carries
/// the task's epoch and is never made again, by this process or any other.
pub type IdSource = Arc<dyn Fn() -> Result<CheckpointId> + Send + Sync>;

/// Who is running: the job and the task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskContext {
    /// The job's name.
    pub job_name: String,
    /// The job's id (`1`).
    pub job_id: String,
    /// The task's name (`Partition 0`).
    pub task_name: String,
}

/// One store of a task as a backend sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreSpec {
    /// The store's name.
    pub name: String,
    /// Its live directory.
    pub dir: PathBuf,
}

impl StoreSpec {
    /// Where the commit manager puts checkpoint `id` of this store:
    /// `<store dir>.checkpoints/<checkpoint-id>`.
    pub fn checkpoint_dir(&self, id: CheckpointId) -> PathBuf {
        self.checkpoints_dir().join(id.to_string())
    }

    /// `<store dir>.checkpoints`: the commit manager's checkpoint directories, never written
    /// after they are made.
    pub fn checkpoints_dir(&self) -> PathBuf {
        sibling_of(&self.dir, ".checkpoints")
    }

    /// The spec as the backends use it: the dir without a trailing `/` or `.` components
    /// (so that `<store dir>.checkpoints` and the other siblings are beside it, never inside
    /// it), and a dir that is a symlink replaced by what it points to (a restore exchanges the
    /// target tree, on the target's filesystem, and the link stays a link). A dangling link is
    /// an `InvalidInput` error naming it.
    pub fn normalized(&self) -> Result<StoreSpec> {
        let mut dir: PathBuf = self.dir.components().collect();
        if dir.as_os_str().is_empty() {
            dir = PathBuf::from(".");
        }
        if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
            dir = std::fs::canonicalize(&dir).map_err(|e| {
                Error::invalid(format!(
                    "store {:?}: its dir {} is a symlink whose target cannot be resolved: {e}",
                    self.name,
                    self.dir.display()
                ))
            })?;
        }
        Ok(StoreSpec {
            name: self.name.clone(),
            dir,
        })
    }
}

/// Backs up a task's stores at each commit (Samza's `TaskBackupManager`).
#[async_trait]
pub trait TaskBackupManager: Send + Sync {
    /// Prepare, given the task's last committed checkpoint (`None` for a new task). Reads the
    /// committed state of this backend (e.g. the stores' indexes) to diff against.
    async fn init(&self, last: Option<&Checkpoint>) -> Result<()>;

    /// The commit manager hands over its id generator when the backend is attached: a backend
    /// that writes keys of its own between commits (the blob backend's pre-upload) takes its
    /// ids from it, so that they never collide with a commit's or another epoch's. The
    /// default ignores it.
    fn attach_ids(&self, _ids: IdSource) {}

    /// The synchronous part of a commit: fast, no network. Returns store → marker for
    /// backends that know their markers now (the blob backend returns none).
    fn snapshot(&self, id: CheckpointId) -> Result<StoreMarkers>;

    /// Persist the stores' checkpoint directories (`dirs`: store → directory made by the
    /// commit manager) and return store → marker. Nothing becomes committed here.
    async fn upload(
        &self,
        id: CheckpointId,
        snapshot_markers: &StoreMarkers,
        dirs: &BTreeMap<String, PathBuf>,
    ) -> Result<StoreMarkers>;

    /// Called by the commit manager immediately before it writes the checkpoint naming the
    /// markers `upload` returned for `id`, after every backend's upload: an error abandons the
    /// commit (nothing is written; what was uploaded is an orphan for the sweep). The blob
    /// backend refuses once the commit's first PUT, over all its stores, is older than half
    /// the sweep's grace (DESIGN §7): past that, a sweep may have taken its first blobs.
    ///
    /// `Ok(Some(left))` is how long the commit point may still take: the commit manager
    /// cancels a checkpoint write (retries and all) that has not finished by then, calls this
    /// again after the write (a document that landed past the bound is withdrawn) and before
    /// an adoption's second write. `Ok(None)`: this backend does not bound the commit.
    fn before_commit(&self, _id: CheckpointId) -> Result<Option<std::time::Duration>> {
        Ok(None)
    }

    /// Called after the checkpoint with `markers` was written: what they name is now
    /// committed; remove what nothing retained needs. Idempotent.
    async fn cleanup(&self, id: CheckpointId, markers: &StoreMarkers) -> Result<()>;

    /// [`cleanup`](Self::cleanup), with its deletes handed back instead of sent: the commit
    /// manager sends them with its next trim of the checkpoint history, in the same batch
    /// (DESIGN §7 step 4: one batch delete per commit). A backend hands back only keys that
    /// no retained snapshot and no upload of its own needs, and forgets them: from here they
    /// are the caller's, who sends them once no checkpoint in the history names a snapshot
    /// that holds them (the trim after this call), or leaves them to the sweep. The default
    /// runs `cleanup` and hands back nothing.
    async fn cleanup_deferred(
        &self,
        id: CheckpointId,
        markers: &StoreMarkers,
    ) -> Result<Vec<DeferredDeletes>> {
        self.cleanup(id, markers).await.map(|()| Vec::new())
    }

    /// The retention this backend's cleanup assumes: how many of the newest snapshots it
    /// keeps, and whether it keeps what a tiered history retains beyond them (it reads the
    /// history). The commit manager refuses to commit when its own history retains more
    /// (issue 46, S4-5: the backend would delete the snapshots of retained checkpoints).
    /// `None` (the default): it deletes nothing by count.
    fn retention_window(&self) -> Option<(usize, bool)> {
        None
    }

    /// Release resources.
    async fn close(&self) -> Result<()>;

    /// What the last upload of each store did, for reports (a backend without statistics
    /// returns none).
    fn last_upload(&self) -> BTreeMap<String, UploadSummary> {
        BTreeMap::new()
    }
}

/// What one store's last upload did, as any backend can report it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadSummary {
    /// Files in the snapshot.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files whose bytes were sent.
    pub files_uploaded: u64,
    /// Bytes sent.
    pub bytes_uploaded: u64,
    /// Files whose bytes the backend already held (unchanged or deduplicated).
    pub files_reused: u64,
    /// Files whose bytes went up ahead of the commit (pre-uploaded) and that it named.
    pub files_pre_uploaded: u64,
    /// Requests the upload took.
    pub requests: u64,
}

/// Restores a task's stores at startup (Samza's `TaskRestoreManager`).
#[async_trait]
pub trait TaskRestoreManager: Send + Sync {
    /// Read what `checkpoint` says about this backend's stores and check it.
    async fn init(&self, checkpoint: Option<&Checkpoint>) -> Result<()>;
    /// Bring the stores' directories to the checkpointed state.
    async fn restore(&self) -> Result<()>;
    /// Release resources.
    async fn close(&self) -> Result<()>;

    /// What the last restore of each store did, for reports (a backend without statistics
    /// returns none).
    fn last_restore(&self) -> BTreeMap<String, RestoreSummary> {
        BTreeMap::new()
    }
}

/// What one store's last restore did, as any backend can report it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Files in the snapshot.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files downloaded.
    pub files_downloaded: u64,
    /// Bytes downloaded.
    pub bytes_downloaded: u64,
    /// Files reused from local disk.
    pub files_reused: u64,
    /// Their bytes.
    pub bytes_reused: u64,
    /// Of the reused files, those taken from a warm standby's copy.
    pub files_from_standby: u64,
    /// Their bytes.
    pub bytes_from_standby: u64,
    /// Of the downloaded files, those a lazy restore left remote when it returned (fetched
    /// on demand or in the background since).
    pub files_left_remote: u64,
    /// Their bytes.
    pub bytes_left_remote: u64,
}

/// Creates and validates a backend's external resources (Samza's `StateBackendAdmin`).
#[async_trait]
pub trait StateBackendAdmin: Send + Sync {
    /// Create what the backend needs (bucket, lifecycle rule, owner record).
    async fn create_resources(&self) -> Result<()>;
    /// Check that everything is reachable, writable and owned by this deployment.
    async fn validate_resources(&self) -> Result<()>;
}

/// Builds a backend's managers for a task (Samza's `StateBackendFactory`).
pub trait StateBackendFactory: Send + Sync {
    /// The name under which this backend's markers are stored in `state-checkpoint-markers`.
    fn name(&self) -> &str;

    /// A backup manager for `task` and its `stores`.
    fn backup_manager(
        &self,
        task: &TaskContext,
        stores: &[StoreSpec],
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn TaskBackupManager>>;

    /// A restore manager for `task` and its `stores`.
    fn restore_manager(
        &self,
        task: &TaskContext,
        stores: &[StoreSpec],
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn TaskRestoreManager>>;

    /// The admin for `job_name`/`job_id`.
    fn admin(&self, job_name: &str, job_id: &str) -> Result<Arc<dyn StateBackendAdmin>>;
}
