//! The bucket layout of DESIGN §5, in one place:
//!
//! ```text
//! <job>/<job-id>/scope.json                                        owner record
//! <job>/<job-id>/checkpoints/<task>/<seq:020>.json                 checkpoint store (on S3)
//! <job>/<job-id>/writers/<task>/<writer>.json                      a running task's lease
//! <job>/<job-id>/tasks/<task>/stores/<store>/blobs/<checkpoint-id>/<sha256>
//! <job>/<job-id>/tasks/<task>/stores/<store>/index/<checkpoint-id>.<sha256>.json
//! manual/<name>/...                                                CLI backups
//! ```
//!
//! Keys are relative to the blob store's root (the S3 store applies its bucket prefix). User
//! names (job, job id, task, store, backup name) are escaped with
//! [`escape_segment`](crate::blobstore::escape_segment). The golden tests below pin every
//! shape: changing one orphans every stored snapshot.

use crate::blobstore::{BlobKey, Scope};
use crate::digest::Sha256;
use crate::error::Result;
use crate::id::CheckpointId;
use crate::index::IndexMarker;

/// The scope of one job deployment (`<job>/<job-id>/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobScope(Scope);

impl JobScope {
    /// The scope of job `job` with id `job_id`.
    pub fn new(job: &str, job_id: &str) -> Result<Self> {
        Ok(JobScope(Scope::root().escaped(job)?.escaped(job_id)?))
    }

    /// The scope of a manual (CLI) backup named `name`: `manual/<name>/`.
    pub fn manual(name: &str) -> Result<Self> {
        Ok(JobScope(Scope::root().child("manual")?.escaped(name)?))
    }

    /// The scope itself.
    pub fn scope(&self) -> &Scope {
        &self.0
    }

    /// The owner record, `scope.json`.
    pub fn owner_record(&self) -> Result<BlobKey> {
        self.0.key("scope.json")
    }

    /// `tasks/`: everything the sweep may consider.
    pub fn tasks(&self) -> Result<Scope> {
        self.0.child("tasks")
    }

    /// The checkpoint history of `task`: `checkpoints/<task>/`.
    pub fn checkpoints(&self, task: &str) -> Result<Scope> {
        self.0.child("checkpoints")?.escaped(task)
    }

    /// Checkpoint number `seq` of `task`: `checkpoints/<task>/<seq:020>.json`.
    pub fn checkpoint_key(&self, task: &str, seq: u64) -> Result<BlobKey> {
        self.checkpoints(task)?.key(&format!("{seq:020}.json"))
    }

    /// Every task's writer leases: `writers/`.
    pub fn all_writers(&self) -> Result<Scope> {
        self.0.child("writers")
    }

    /// The writer leases of `task`: `writers/<task>/`.
    pub fn writers(&self, task: &str) -> Result<Scope> {
        self.all_writers()?.escaped(task)
    }

    /// The scope of one store of one task.
    pub fn store(&self, task: &str, store: &str) -> Result<StoreScope> {
        Ok(StoreScope(
            self.tasks()?
                .escaped(task)?
                .child("stores")?
                .escaped(store)?,
        ))
    }
}

/// The scope of one store: `…/tasks/<task>/stores/<store>/`. Blob ids and markers are relative
/// to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreScope(Scope);

impl StoreScope {
    /// The scope itself.
    pub fn scope(&self) -> &Scope {
        &self.0
    }

    /// The scope-relative id of a blob first uploaded by `checkpoint`:
    /// `blobs/<checkpoint-id>/<sha256>`.
    pub fn blob_id(checkpoint: CheckpointId, sha256: Sha256) -> String {
        format!("blobs/{checkpoint}/{sha256}")
    }

    /// The full key of a scope-relative blob id or marker.
    pub fn key(&self, relative: &str) -> Result<BlobKey> {
        self.0.key(relative)
    }

    /// The full key of an index.
    pub fn index_key(&self, marker: &IndexMarker) -> Result<BlobKey> {
        self.0.key(&marker.to_string())
    }

    /// `blobs/`.
    pub fn blobs(&self) -> Result<Scope> {
        self.0.child("blobs")
    }

    /// `index/`.
    pub fn indexes(&self) -> Result<Scope> {
        self.0.child("index")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden keys: persisted in every bucket. Never change them.
    #[test]
    fn layout_golden() {
        let job = JobScope::new("word.count", "1").unwrap();
        assert_eq!(job.scope().as_str(), "word%2Ecount/1/");
        assert_eq!(
            job.owner_record().unwrap().as_str(),
            "word%2Ecount/1/scope.json"
        );
        assert_eq!(
            job.checkpoint_key("Partition 0", 7).unwrap().as_str(),
            "word%2Ecount/1/checkpoints/Partition%200/00000000000000000007.json"
        );
        assert_eq!(
            job.writers("Partition 0").unwrap().as_str(),
            "word%2Ecount/1/writers/Partition%200/"
        );
        let store = job.store("Partition 0", "counts").unwrap();
        assert_eq!(
            store.scope().as_str(),
            "word%2Ecount/1/tasks/Partition%200/stores/counts/"
        );
        let id: CheckpointId = "1700000000123-0".parse().unwrap();
        let sha = Sha256::of(b"");
        let blob = StoreScope::blob_id(id, sha);
        assert_eq!(
            store.key(&blob).unwrap().as_str(),
            "word%2Ecount/1/tasks/Partition%200/stores/counts/blobs/1700000000123-0/e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let marker = IndexMarker::of(id, b"{}");
        assert_eq!(
            store.index_key(&marker).unwrap().as_str(),
            "word%2Ecount/1/tasks/Partition%200/stores/counts/index/1700000000123-0.44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a.json"
        );
        assert_eq!(
            JobScope::manual("nightly 1").unwrap().scope().as_str(),
            "manual/nightly%201/"
        );
    }

    #[test]
    fn task_scopes_do_not_overlap() {
        let job = JobScope::new("j", "1").unwrap();
        let p1 = job.store("Partition 1", "s").unwrap();
        let p10 = job.store("Partition 10", "s").unwrap();
        let k = p10.key("blobs/1-0/x").unwrap();
        assert!(!k.is_in(p1.scope()));
    }
}
