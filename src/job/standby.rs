//! A warm standby of a task (DESIGN §8): it follows the task's committed checkpoints without
//! claiming the task — it never writes under `checkpoints/`, holds no writer lease, touches no
//! fence and pins nothing — and keeps the task's stores restored and verified in standby dirs
//! of its own, `<store dir>.blobsnap-standby`, never the task's store dirs. After each commit
//! it downloads only what the new snapshot adds (the rest is reused from what it holds,
//! proved by its hash cache). When the task then starts on the standby's host, its restore
//! takes each standby dir's lock (the standby waits meanwhile) and hard-links from it, so it
//! finds all but at most the last commit local.
//!
//! Cheap: one LIST of `checkpoints/<task>/` per poll when nothing changed. Safe: a standby
//! dir changes only by a restore's atomic swap of a complete, verified tree, and the task's
//! restore proves every file it takes from it again (by SHA-256 or the hash cache). A
//! snapshot deleted under it (cleanup, the sweep) fails that update and the next poll takes
//! the newer checkpoint; a standby that fell behind goes straight to the newest one.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{store_specs, JobSettings};
use crate::backend::{Clock, StateBackendFactory, StoreSpec, TaskContext};
use crate::blobstore::BlobStore;
use crate::checkpoint::{BlobCheckpointStore, CheckpointId, CheckpointStore};
use crate::error::{Error, ErrorKind, Result};
use crate::layout::JobScope;
use crate::local::lock::StoreDirLock;
use crate::local::swap::standby_dir;

/// How a standby follows its task.
#[derive(Clone, Debug)]
pub struct StandbySettings {
    /// How often it looks for a new checkpoint (one LIST request each time).
    pub poll: Duration,
}

impl Default for StandbySettings {
    fn default() -> Self {
        StandbySettings {
            poll: Duration::from_secs(1),
        }
    }
}

/// What one update of a standby did.
#[derive(Clone, Debug)]
pub enum StandbyUpdate {
    /// The standby dirs now hold checkpoint number `seq`, restored and verified.
    Applied {
        /// Its sequence number.
        seq: u64,
        /// Its checkpoint id.
        checkpoint_id: Option<CheckpointId>,
        /// Bytes downloaded for it (the rest was reused).
        bytes_downloaded: u64,
        /// Bytes reused from what the standby held.
        bytes_reused: u64,
    },
    /// A poll found nothing new: the standby dirs hold checkpoint `seq` (`None`: none yet).
    Unchanged {
        /// The checkpoint held.
        seq: Option<u64>,
        /// The task's newest checkpoint number as listed (`None`: the task has no checkpoint
        /// yet — it has not committed, or the name is not one of the job's tasks).
        latest: Option<u64>,
    },
    /// Checkpoint number `seq` could not be applied this time (a snapshot deleted under the
    /// standby, the task restoring from the standby dir, a server that did not answer); the
    /// standby dirs still hold the last one applied, and the next poll tries the newest.
    Skipped {
        /// Its sequence number.
        seq: u64,
        /// What kind of failure.
        kind: ErrorKind,
        /// The error, in words.
        message: String,
    },
}

/// The standby specs of `task`: its stores, each in its standby dir.
pub fn standby_specs(settings: &JobSettings, task: &str) -> Result<Vec<StoreSpec>> {
    store_specs(settings, task)?
        .into_iter()
        .map(|s| {
            Ok(StoreSpec {
                dir: standby_dir(&s.dir)?,
                name: s.name,
            })
        })
        .collect()
}

/// Follow `task` until `stop`: after each commit of the task, restore its checkpoint into
/// the standby dirs (see the [module docs](self)). `on_update` hears of every update.
/// Returns `Ok` when stopped; an error only for what polling again cannot mend (bad settings,
/// a bucket that refuses access).
#[allow(clippy::too_many_arguments)]
pub async fn follow(
    settings: &JobSettings,
    task: &str,
    blob_store: Arc<dyn BlobStore>,
    backend: &Arc<dyn StateBackendFactory>,
    clock: Arc<dyn Clock>,
    standby: &StandbySettings,
    stop: CancellationToken,
    on_update: &(dyn Fn(&StandbyUpdate) + Send + Sync),
) -> Result<()> {
    let specs = standby_specs(settings, task)?;
    let ctx = TaskContext {
        job_name: settings.job_name.clone(),
        job_id: settings.job_id.clone(),
        task_name: task.to_string(),
    };
    let checkpoints = BlobCheckpointStore::new(
        Arc::clone(&blob_store),
        JobScope::new(&settings.job_name, &settings.job_id)?,
    );
    let mut applied: Option<u64> = None;
    // A checkpoint whose snapshot is gone or corrupt is not fetched again at every poll; a
    // newer one is awaited (a transient failure is retried).
    let mut given_up: Option<u64> = None;
    loop {
        if stop.is_cancelled() {
            return Ok(());
        }
        match checkpoints.latest_seq(task).await {
            Ok(Some(seq)) if Some(seq) != applied && Some(seq) != given_up => {
                match apply(&checkpoints, backend, &ctx, &specs, &clock).await {
                    Ok(update) => {
                        if let StandbyUpdate::Applied { seq: got, .. } = &update {
                            // The polled number, when larger: the newest document may be a
                            // removal's record (`forget --checkpoint`), which is never applied.
                            applied = Some((*got).max(seq));
                            metrics::gauge!("blobsnap_standby_applied_seq", "task" => task.to_string())
                                .set(*got as f64);
                        }
                        on_update(&update);
                    }
                    Err(e) if retriable(&e) => {
                        if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Corrupt) {
                            given_up = Some(seq);
                        }
                        tracing::warn!(task, seq, error = %e, "standby: checkpoint not applied; trying the newest at the next poll");
                        metrics::counter!("blobsnap_standby_skipped_total", "task" => task.to_string())
                            .increment(1);
                        on_update(&StandbyUpdate::Skipped {
                            seq,
                            kind: e.kind(),
                            message: e.to_string(),
                        });
                    }
                    Err(e) => return Err(e.context(format!("standby of task {task:?}"))),
                }
            }
            Ok(latest) => on_update(&StandbyUpdate::Unchanged {
                seq: applied,
                latest,
            }),
            Err(e) if retriable(&e) => {
                tracing::warn!(task, error = %e, "standby: could not list the task's checkpoints; polling again");
            }
            Err(e) => return Err(e.context(format!("standby of task {task:?}"))),
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(standby.poll) => {}
        }
    }
}

/// What a standby survives by trying again at the next poll.
fn retriable(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::NotFound
            | ErrorKind::Conflict
            | ErrorKind::Transient
            | ErrorKind::Corrupt
            | ErrorKind::Io
    )
}

/// Restore the newest checkpoint of the task into the standby dirs, under their locks.
async fn apply(
    checkpoints: &BlobCheckpointStore,
    backend: &Arc<dyn StateBackendFactory>,
    ctx: &TaskContext,
    specs: &[StoreSpec],
    clock: &Arc<dyn Clock>,
) -> Result<StandbyUpdate> {
    let Some(latest) = checkpoints.latest(&ctx.task_name).await? else {
        return Err(Error::new(
            ErrorKind::NotFound,
            "the task's checkpoints were trimmed while the standby read them",
        ));
    };
    // The task's restore on this host holds these while it links from them: wait for the
    // next poll rather than change the tree under it.
    let _locks = specs
        .iter()
        .map(|s| StoreDirLock::acquire(&s.dir))
        .collect::<Result<Vec<_>>>()?;
    let restorer = backend.restore_manager(ctx, specs, Arc::clone(clock))?;
    restorer.init(Some(&latest.checkpoint)).await?;
    restorer.restore().await?;
    let stats = restorer.last_restore();
    Ok(StandbyUpdate::Applied {
        seq: latest.seq,
        checkpoint_id: latest.checkpoint.as_v2().map(|c| c.id),
        bytes_downloaded: stats.values().map(|s| s.bytes_downloaded).sum(),
        bytes_reused: stats.values().map(|s| s.bytes_reused).sum(),
    })
}
