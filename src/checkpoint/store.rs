//! Where committed checkpoints live: the [`CheckpointStore`] trait.
//!
//! Writing a checkpoint is the commit point of a task (DESIGN §7 step 3). Each task's
//! checkpoints form a dense sequence `1, 2, 3, …`; the next one is written **create-only**
//! under `latest + 1`. Two writers of one task (a zombie and its replacement) therefore
//! collide on the same sequence number and exactly one wins; the loser gets `Conflict` and
//! must stop. A task *claims* its epoch at startup by writing its last checkpoint again under
//! the next number before it restores, so a zombie's next commit loses.

use async_trait::async_trait;

use super::Checkpoint;
use crate::blobstore::DeferredDeletes;
use crate::error::Result;

/// A checkpoint as committed: its sequence number and the id of the process that wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedCheckpoint {
    /// The dense per-task sequence number (1-based).
    pub seq: u64,
    /// A nonce naming the writing process; it settles ambiguous writes by reading back.
    pub writer: String,
    /// The checkpoint.
    pub checkpoint: Checkpoint,
}

/// The store of committed checkpoints of a job's tasks.
///
/// Preconditions and guarantees every implementation keeps:
/// - [`write`](Self::write) is create-only: it fails with `Conflict` if `seq` is taken, even
///   when two processes write at the same moment. A store that cannot guarantee this must say
///   so ([`enforces_exclusive_writes`](Self::enforces_exclusive_writes)), and blobsnap then
///   refuses to run a job on it unless fencing is explicitly waived (`unsafe_no_fencing`).
/// - A write is durable when it returns `Ok` (fsync of file and directory, or a PUT
///   acknowledged).
/// - [`latest`](Self::latest) returns the highest sequence number written.
/// - History is kept at least as long as the caller's retention; [`trim`](Self::trim) never
///   deletes the latest. The commit manager trims *before* a backend deletes the snapshots
///   that left retention, so the history never names a deleted snapshot (a crash in between
///   leaves orphans for the sweep, never a dangling root that would stop it).
#[async_trait]
pub trait CheckpointStore: Send + Sync + std::fmt::Debug {
    /// Whether concurrent writes of one sequence number are guaranteed exclusive (may ask the
    /// server: see [`BlobStore::capabilities`](crate::blobstore::BlobStore::capabilities)).
    async fn enforces_exclusive_writes(&self) -> Result<bool>;

    /// The latest committed checkpoint of `task`, or `None` for a task that never committed.
    async fn latest(&self, task: &str) -> Result<Option<CommittedCheckpoint>>;

    /// The sequence number of the latest committed checkpoint of `task`, without reading it
    /// (a standby's poll: one listing).
    async fn latest_seq(&self, task: &str) -> Result<Option<u64>> {
        Ok(self.latest(task).await?.map(|c| c.seq))
    }

    /// Up to `limit` committed checkpoints of `task`, newest first.
    async fn history(&self, task: &str, limit: usize) -> Result<Vec<CommittedCheckpoint>>;

    /// Commit checkpoint `cp` as number `seq` of `task` (create-only). `seq` must be one more
    /// than the latest; `Conflict` if another writer took it.
    async fn write(&self, task: &str, seq: u64, writer: &str, cp: &Checkpoint) -> Result<()>;

    /// Delete the checkpoints of `task` older than the newest `keep` distinct checkpoint ids
    /// (a claim repeats the last checkpoint under a new number: both copies count as one id).
    /// At least the latest is always kept.
    async fn trim(&self, task: &str, keep: usize) -> Result<()>;

    /// Delete exactly the checkpoints `seqs` of `task` (ones the caller wrote and retention
    /// let go; never the latest), without reading the history: one batch delete on a blob
    /// store. Deleting a number that is already gone is not an error.
    async fn delete_seqs(&self, task: &str, seqs: &[u64]) -> Result<()>;

    /// [`delete_seqs`](Self::delete_seqs), and `also` — a backend's deferred deletes, safe
    /// to send because the checkpoints that named them are already gone — in the same batch
    /// delete where they live in this store's own blob store (the runtime's case: one request
    /// per commit), else one batch for each. An error leaves unknown which were deleted (every
    /// one may be sent again).
    async fn delete_seqs_and(
        &self,
        task: &str,
        seqs: &[u64],
        also: &[DeferredDeletes],
    ) -> Result<()> {
        if !seqs.is_empty() {
            self.delete_seqs(task, seqs).await?;
        }
        for d in also {
            d.delete_with(&[]).await?;
        }
        Ok(())
    }
}
