//! A task's restore at its start: every store from the last checkpoint (reusing local files),
//! the offset it resumes from, and the fallback to an older retained checkpoint when a
//! snapshot cannot be restored.

use super::*;

/// What a task's restore did, store by store.
pub(super) type Restored = std::collections::BTreeMap<String, crate::backend::RestoreSummary>;

/// Restore the task's stores from `last`; with `restore_fallback`, a `Corrupt` or
/// `NotFound` snapshot makes it try the older retained checkpoints. Returns the checkpoint
/// restored (the base of the next commit), after a fallback a note of it, and what the
/// restore did.
#[allow(clippy::too_many_arguments)]
pub(super) async fn restore_task(
    settings: &JobSettings,
    backend: &Arc<dyn StateBackendFactory>,
    ctx: &TaskContext,
    specs: &[StoreSpec],
    clock: &Arc<dyn Clock>,
    checkpoints: &Arc<dyn CheckpointStore>,
    last: Option<crate::checkpoint::Checkpoint>,
    (blob_store, job): (&dyn BlobStore, &JobScope),
) -> Result<(
    Option<crate::checkpoint::Checkpoint>,
    Option<String>,
    Restored,
)> {
    let restore = |from: Option<crate::checkpoint::Checkpoint>| {
        let (ctx, specs, clock) = (ctx.clone(), specs.to_vec(), Arc::clone(clock));
        async move {
            let restorer = backend.restore_manager(&ctx, &specs, clock)?;
            restorer.init(from.as_ref()).await?;
            restorer.restore().await?;
            Ok::<_, Error>(restorer.last_restore())
        }
    };
    match restore(last.clone()).await {
        Ok(restored) => Ok((last, None, restored)),
        Err(e)
            if settings.restore_fallback
                && matches!(
                    e.kind(),
                    crate::ErrorKind::Corrupt | crate::ErrorKind::NotFound
                ) =>
        {
            // Never past a start-from head (issue 46, S4-6): below it lies the state the
            // operator rolled back from (or, for a fork, an empty store), and the record says
            // "applied", so a silent fallback would never retry the rollback.
            let floor = read_start_from(blob_store, job, &ctx.task_name)
                .await?
                .map(|r| r.seq);
            let (c, why, restored) = restore_fallback(
                &ctx.task_name,
                checkpoints,
                last.as_ref(),
                floor,
                e,
                &restore,
            )
            .await?;
            let note = format!(
                "{} ({why})",
                c.as_v2()
                    .map_or_else(|| "?".to_string(), |v| v.id.to_string())
            );
            Ok((Some(c), Some(note), restored))
        }
        Err(e)
            if matches!(
                e.kind(),
                crate::ErrorKind::Corrupt | crate::ErrorKind::NotFound
            ) =>
        {
            Err(with_next_steps(e, blob_store, job).await)
        }
        Err(e) => Err(e),
    }
}

/// A restore that cannot succeed as configured, with what to do next (issue 51, item 11): an
/// older retained checkpoint through the fallback, or a savepoint of the job (named, the
/// newest first), and `check` to see what is damaged.
async fn with_next_steps(e: Error, blob_store: &dyn BlobStore, job: &JobScope) -> Error {
    let savepoints = match crate::blob::time::savepoint::list_all(blob_store, job).await {
        Ok((mut all, _)) => {
            all.sort_by_key(|s| std::cmp::Reverse(s.created_millis));
            all.into_iter().map(|s| s.name).take(3).collect::<Vec<_>>()
        }
        Err(_) => Vec::new(),
    };
    let savepoint = match savepoints.first() {
        Some(newest) => format!(
            ", or start from a savepoint: --start-from savepoint:{newest} (the job's newest: {})",
            savepoints.join(", ")
        ),
        None => String::new(),
    };
    let (name, id) = job.names();
    let kind = e.kind();
    let text = e.to_string();
    let text = text
        .strip_suffix(&format!(" [{kind}]"))
        .unwrap_or(&text)
        .to_string();
    Error::new(
        kind,
        format!(
            "{text}. To go on: start from the newest older checkpoint that restores with --restore-fallback (job.restore-fallback = true){savepoint}; `blobsnap check --job {name} --job-id {id} --read-data` names every damaged checkpoint"
        ),
    )
}

/// The input offset of `ssp` in `last` (0 without one).
pub(super) fn resumed_offset(
    last: Option<&crate::checkpoint::Checkpoint>,
    ssp: &Ssp,
) -> Result<u64> {
    last.and_then(|c| c.offsets().get(ssp).cloned())
        .map(|o| {
            o.parse().map_err(|_| {
                Error::corrupt(format!(
                    "checkpointed offset {o:?} of {ssp} is not a number"
                ))
            })
        })
        .transpose()
        .map(|o| o.unwrap_or(0))
}

/// The last checkpoint did not restore (`first_error`): try the older retained ones, newest
/// first, and return the first that restores, with a note of what was skipped. None older
/// than checkpoint number `floor` (the head a start-from committed): when that head itself
/// fails, the task stops with the error.
pub(super) async fn restore_fallback<F, Fut, R>(
    task: &str,
    checkpoints: &Arc<dyn CheckpointStore>,
    failed: Option<&crate::checkpoint::Checkpoint>,
    floor: Option<u64>,
    first_error: Error,
    restore: &F,
) -> Result<(crate::checkpoint::Checkpoint, String, R)>
where
    F: Fn(Option<crate::checkpoint::Checkpoint>) -> Fut,
    Fut: std::future::Future<Output = Result<R>>,
{
    let failed_id = failed.and_then(|c| c.as_v2()).map(|c| c.id);
    tracing::error!(
        task,
        error = %first_error,
        "RESTORE FALLBACK: the last checkpoint's snapshot cannot be restored; trying older retained checkpoints (restore_fallback is on): input after the checkpoint chosen will be processed again"
    );
    let mut skipped = vec![format!(
        "{}: {first_error}",
        failed_id.map_or_else(|| "?".into(), |i| i.to_string())
    )];
    let mut tried = std::collections::BTreeSet::new();
    tried.extend(failed_id);
    for c in checkpoints.history(task, usize::MAX).await? {
        if floor.is_some_and(|f| c.seq < f) {
            break; // newest first: every later one is older still
        }
        let Some(v2) = c.checkpoint.as_v2() else {
            continue;
        };
        if !tried.insert(v2.id) {
            continue; // the same checkpoint again (a claim repeats the last one)
        }
        let id = v2.id;
        match restore(Some(c.checkpoint.clone())).await {
            Ok(restored) => {
                metrics::counter!("blobsnap_restore_fallbacks_total", "task" => task.to_string())
                    .increment(1);
                tracing::error!(
                    task,
                    checkpoint = %id,
                    skipped = ?skipped,
                    "RESTORE FALLBACK: restored the older checkpoint {id}; resuming from its offsets"
                );
                return Ok((c.checkpoint, skipped.join("; "), restored));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    crate::ErrorKind::Corrupt | crate::ErrorKind::NotFound
                ) =>
            {
                tracing::error!(task, checkpoint = %id, error = %e, "RESTORE FALLBACK: this one does not restore either");
                skipped.push(format!("{id}: {e}"));
            }
            Err(e) => return Err(e),
        }
    }
    match floor {
        Some(f) => Err(first_error.context(format!(
            "task {task}: no checkpoint since its start-from head #{f} restores (tried {}); a start-from point is never fallen back from: restore the point's snapshot (`blobsnap check`), or start from another point",
            skipped.len()
        ))),
        None => Err(first_error.context(format!(
            "task {task}: no retained checkpoint restores (tried {})",
            skipped.len()
        ))),
    }
}
