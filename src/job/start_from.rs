//! Where a task starts: the operator's start-from (`[job] start-from`), read once
//! at the task's start, checked against the checkpoint it names, and applied at most once.

use super::*;

use crate::blob::time::record::StartFromRecord as StartedFrom;

/// Every task of the job has the point `point` names (checked before any task starts, so a
/// rollback never leaves the job half rolled back): `NotFound` naming the first task that
/// does not. Skips tasks that already applied this very point.
pub async fn check_start_from(
    settings: &JobSettings,
    blob_store: &Arc<dyn BlobStore>,
) -> Result<()> {
    let Some(point) = &settings.start_from else {
        return Ok(());
    };
    let job = JobScope::new(&settings.job_name, &settings.job_id)?;
    let mut pending = Vec::new();
    for p in 0..settings.partitions {
        let task = task_name(p);
        if applied(
            blob_store.as_ref(),
            &job,
            &task,
            point,
            &settings.start_from_id,
        )
        .await?
        .is_none()
        {
            pending.push(task);
        }
    }
    // A fork's source is read only while some task has yet to start from it (a fork that
    // applied it long ago restarts even after the source removed the savepoint).
    let fork_source = match point {
        crate::blob::time::history::CheckpointRef::Fork(src) if !pending.is_empty() => {
            if (src.job_name.as_str(), src.job_id.as_str())
                == (settings.job_name.as_str(), settings.job_id.as_str())
            {
                return Err(Error::invalid(format!(
                    "start-from {point}: that is this job's own savepoint; start from savepoint:{} instead (nothing started)",
                    src.savepoint
                )));
            }
            let sp = crate::blob::time::savepoint::read(
                blob_store.as_ref(),
                &JobScope::new(&src.job_name, &src.job_id)?,
                &src.savepoint,
            )
            .await
            .map_err(|e| e.context(format!("start-from {point} (nothing started)")))?;
            Some(sp)
        }
        _ => None,
    };
    for task in pending {
        if let Some(sp) = &fork_source {
            if sp.checkpoint_of(&task)?.is_none() {
                return Err(Error::new(
                    crate::error::ErrorKind::NotFound,
                    format!("start-from {point}: the savepoint has no checkpoint of task {task:?} (nothing started)"),
                ));
            }
            continue;
        }
        if let Err(e) = crate::blob::time::history::resolve(blob_store, &job, &task, point).await {
            let e = e.context(format!(
                "start-from {point}: task {task:?} cannot start there (nothing started)"
            ));
            // `#N` is a task's number: say what it means for a job, and what works.
            return Err(crate::blob::time::history::job_wide(blob_store, &job, point, e).await);
        }
    }
    Ok(())
}

/// The record of `task` having started from `point`, if it did — with the start-from id `id`
/// when one is given: a point is applied once per id, and without an id once whatever id it
/// was last applied with (a restart with the old settings never rolls back again).
pub(super) async fn applied(
    store: &dyn BlobStore,
    job: &JobScope,
    task: &str,
    point: &crate::blob::time::history::CheckpointRef,
    id: &Option<String>,
) -> Result<Option<StartedFrom>> {
    Ok(read_start_from(store, job, task)
        .await?
        .filter(|r| point.is_recorded_as(&r.start_from) && (id.is_none() || r.id == *id)))
}

/// Whether `task` has yet to start from `settings.start_from` (false without one).
pub async fn start_from_pending(
    store: &dyn BlobStore,
    task: &str,
    settings: &JobSettings,
) -> Result<bool> {
    let Some(point) = &settings.start_from else {
        return Ok(false);
    };
    let job = JobScope::new(&settings.job_name, &settings.job_id)?;
    Ok(applied(store, &job, task, point, &settings.start_from_id)
        .await?
        .is_none())
}

/// The point `task` last started from and the number of the head checkpoint it committed for
/// it (`None`: the task never started from a chosen point), for listings.
pub async fn last_start_from(
    store: &dyn BlobStore,
    job: &JobScope,
    task: &str,
) -> Result<Option<(String, u64)>> {
    Ok(read_start_from(store, job, task)
        .await?
        .map(|r| (r.start_from, r.seq)))
}

/// `task`'s start-from record (`None`: it has none); a damaged one is `Corrupt`.
pub(super) async fn read_start_from(
    store: &dyn BlobStore,
    job: &JobScope,
    task: &str,
) -> Result<Option<StartedFrom>> {
    crate::blob::time::record::read_start_from(store, job, task).await
}

pub(super) fn start_from_key(job: &JobScope, task: &str) -> Result<crate::blobstore::BlobKey> {
    job.start_from_key(task)
}

/// Where a task starts when an operator chose a point: the point, the id it is applied under
/// (`start-from-id`), and the sweep grace of the job (a fork's index reuse is bounded by it).
#[derive(Clone, Debug)]
pub struct StartFrom {
    /// The point (`savepoint:NAME`, `#N`, `@TIME`, `savepoint:JOB/JOB-ID/NAME`).
    pub point: crate::blob::time::history::CheckpointRef,
    /// Applied once per id; without one, once.
    pub id: Option<String>,
    /// The job's sweep grace.
    pub grace: std::time::Duration,
}

/// Start `task` (claimed: `commits`) from `from` (none: `last` as it is): commit a new head
/// with the point's offsets and markers, record that it did, and return the checkpoint to
/// restore with what was done, in words for the task's summary. Already applied: `last` as
/// it is, and the note says so. Used by the job runtime at each task's start and by the Samza
/// plug-in's checkpoint manager at its claim of a task.
pub async fn start_task_from(
    commits: &TaskCommitManager,
    ctx: &TaskContext,
    blob_store: &Arc<dyn BlobStore>,
    from: Option<&StartFrom>,
    last: Option<Checkpoint>,
) -> Result<(Option<Checkpoint>, Option<String>)> {
    let Some(from) = from else {
        return Ok((last, None));
    };
    let job = &JobScope::new(&ctx.job_name, &ctx.job_id)?;
    let task = ctx.task_name.as_str();
    let (point, grace) = (&from.point, from.grace);
    if let Some(r) = applied(blob_store.as_ref(), job, task, point, &from.id).await? {
        tracing::info!(task, start_from = %point, seq = r.seq, "start-from was applied before (at #{}); resuming from the latest checkpoint", r.seq);
        let note = format!(
            "start-from {point} was applied before (its head is #{}), not again: resumed from the latest checkpoint (a new --start-from-id applies it again)",
            r.seq
        );
        return Ok((last, Some(note)));
    }
    let mut pins = Vec::new();
    let (checkpoint, from_seq) = match point {
        crate::blob::time::history::CheckpointRef::Fork(src) => {
            let forked = crate::blob::time::fork::fork_task(
                blob_store,
                src,
                &ctx.job_name,
                &ctx.job_id,
                task,
                grace,
            )
            .await
            .map_err(|e| e.context(format!("start-from {point}")))?;
            tracing::info!(task, start_from = %point, stores = forked.stores, files = forked.files, bytes_borrowed = forked.bytes, requests = forked.requests, "forked: the snapshots borrow the source's blobs, none copied");
            pins = forked.pins.iter().cloned().collect();
            (forked.checkpoint, None)
        }
        _ => {
            let chosen = crate::blob::time::history::resolve(blob_store, job, task, point)
                .await
                .map_err(|e| e.context(format!("start-from {point}")))?;
            (chosen.committed.checkpoint, Some(chosen.committed.seq))
        }
    };
    // The pins of an earlier start-from (a fork started again from another savepoint, or a
    // fork rolled back to its own) stay in the record until released: overwritten, nothing
    // would ever release them and the source's savepoint could never be removed (issue 46,
    // S4-7).
    if let Some(previous) = read_start_from(blob_store.as_ref(), job, task).await? {
        for p in previous.pins {
            if !pins.contains(&p) {
                pins.push(p);
            }
        }
    }
    let seq = commits.rollback(checkpoint.clone()).await?;
    let record = StartedFrom {
        start_from: point.to_string(),
        seq,
        checkpoint_id: checkpoint
            .as_v2()
            .map(|c| c.id.to_string())
            .unwrap_or_default(),
        pins,
        id: from.id.clone(),
    };
    let bytes = serde_json::to_vec(&record).map_err(|e| Error::invalid(e.to_string()))?;
    blob_store
        .put(
            &start_from_key(job, task)?,
            crate::blobstore::PutBody::Bytes(bytes.into()),
            crate::blobstore::PutOptions::default(),
        )
        .await?;
    tracing::warn!(task, start_from = %point, from_seq = ?from_seq, head = seq, checkpoint_id = %record.checkpoint_id, "started from a chosen point: committed it as the new head");
    let note = match (point, from_seq) {
        (crate::blob::time::history::CheckpointRef::Fork(src), _) => {
            format!("forked from {src} (its head committed as #{seq})")
        }
        (_, Some(from)) => {
            format!("started from {point}, checkpoint #{from} (committed again as #{seq})")
        }
        (_, None) => format!("started from {point} (committed as #{seq})"),
    };
    Ok((Some(checkpoint), Some(note)))
}
