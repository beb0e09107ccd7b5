//! `blobsnap restore`: one store from a snapshot marker into a directory.

use std::path::PathBuf;

use super::args::{open_existing_store, SnapshotArgs, SnapshotFlags, StoreArgs};
use super::progress::Bar;
use blobsnap::backend::{StoreSpec, TaskContext, TaskRestoreManager as _};
use blobsnap::blob::restore::{BlobRestoreManager, RestoreSettings};
use blobsnap::blob::FACTORY_NAME;
use blobsnap::checkpoint::{Checkpoint, CheckpointV2};
use blobsnap::index::IndexMarker;
use blobsnap::local::guard;
use clap::Args;

#[derive(Args)]
pub(crate) struct RestoreArgs {
    /// The snapshot: a marker (`index/<checkpoint-id>.<sha256>.json`) or a reference to a
    /// checkpoint of the task — `latest`, `#N`, a checkpoint id or a unique prefix of one,
    /// `@2026-12-02T10:00Z` (the newest at or before), `savepoint:NAME`; omitted: latest.
    pub(crate) marker: Option<String>,
    #[command(flatten)]
    pub(crate) snap: SnapshotFlags,
    /// The directory to restore into (created if missing). It is replaced whole by the
    /// snapshot (files with the right bytes are reused): a non-empty directory that blobsnap
    /// did not restore (no `RESTORED` marker) is refused unless `--force` (a RocksDB store)
    /// or `--replace-any-dir` (anything else). Never the blob store in use, a dir inside or
    /// holding it, a store dir a task holds, `/`, the home or the current directory.
    #[arg(long)]
    pub(crate) to: PathBuf,
    /// Print the plan and stop.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Replace a `--to` that holds a RocksDB store blobsnap did not restore (`CURRENT` or a
    /// `MANIFEST` at its top, no subdirectory but RocksDB's `archive/`), or one it restored
    /// for another task, store or job.
    #[arg(long)]
    pub(crate) force: bool,
    /// Replace a `--to` that holds anything at all, deleting every file in it (the plan says
    /// how many, how many bytes, and its largest subdirectories).
    #[arg(long)]
    pub(crate) replace_any_dir: bool,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: RestoreArgs,
) -> blobsnap::Result<()> {
    let RestoreArgs {
        marker,
        snap,
        to,
        dry_run,
        force,
        replace_any_dir,
    } = args;
    let snap = snap.resolve()?;
    // `--to` a symlink to a directory restores into that directory (the link stays a link):
    // the swap exchanges directory entries, and would otherwise replace the link itself and
    // leave its target as it was.
    let to = match std::fs::symlink_metadata(&to) {
        Ok(md) if md.file_type().is_symlink() => std::fs::canonicalize(&to).map_err(|e| {
            blobsnap::Error::new(
                blobsnap::ErrorKind::InvalidInput,
                format!(
                    "--to {} is a symlink whose target cannot be resolved: {e}",
                    to.display()
                ),
            )
        })?,
        _ => to,
    };
    let allow = match (force, replace_any_dir) {
        (_, true) => guard::Allow::AnyDir,
        (true, false) => guard::Allow::Store,
        (false, false) => guard::Allow::Restored,
    };
    let replace = guard::check_replace(
        "--to",
        &to,
        &super::args::protected_store(store_args, None),
        allow,
    )?;
    let blob_store = open_existing_store(store_args).await?;
    let (marker, _) = snap.resolve_marker(&blob_store, marker).await?;
    let SnapshotArgs {
        job,
        job_id,
        task,
        store,
    } = snap;
    // A dir blobsnap restored holds whose store it is: another task's or job's store is not
    // replaced without --force (issue 51, item 12: a typo in --task replaced a neighbour).
    if !force && !replace_any_dir {
        if let Some(there) = blobsnap::blob::restore::RestoredMarker::read(&to) {
            let theirs = (&there.job, &there.job_id, &there.task, &there.store);
            let known = there.job.is_some() && there.task.is_some() && there.store.is_some();
            if known
                && theirs
                    != (
                        &Some(job.clone()),
                        &Some(job_id.clone()),
                        &Some(task.clone()),
                        &Some(store.clone()),
                    )
            {
                return Err(blobsnap::Error::new(
                    blobsnap::ErrorKind::InvalidInput,
                    format!(
                        "--to {} holds store {:?} of task {:?} of job {}/{}, restored by blobsnap; this restore is store {store:?} of task {task:?} of job {job}/{job_id}: give --force to replace it (nothing changed)",
                        to.display(),
                        there.store.unwrap_or_default(),
                        there.task.unwrap_or_default(),
                        there.job.unwrap_or_default(),
                        there.job_id.unwrap_or_default(),
                    ),
                ));
            }
        }
    }
    let parsed: IndexMarker = marker.parse()?;
    let ctx = TaskContext {
        job_name: job,
        job_id,
        task_name: task,
    };
    let spec = StoreSpec {
        name: store.clone(),
        dir: to,
    };
    // Nobody else may restore into the dir or have its database open meanwhile.
    // A dry run changes nothing (not even the lock file's parent dirs): it takes no lock.
    let _lock = if dry_run {
        None
    } else {
        Some(blobsnap::local::lock::StoreDirLock::acquire(&spec.dir)?)
    };
    let cache_dir = super::args::hash_cache_dir();
    let mgr = BlobRestoreManager::new(
        blob_store,
        ctx,
        std::slice::from_ref(&spec),
        RestoreSettings {
            // The same cache as `blobsnap backup`'s: in the user's cache dir, never beside the
            // target (a restore of a dir that `blobsnap backup` backed up proves its SSTs
            // without reading them).
            hash_cache: cache_dir.is_some(),
            hash_cache_dir: cache_dir,
            cancel: super::signal::stop_on_signal(
                "the restore stops; the target dir stays as it was, a rerun reuses what was downloaded",
            ),
            ..Default::default()
        },
    )?;
    let checkpoint = Checkpoint::V2(CheckpointV2 {
        id: parsed.checkpoint_id,
        input_offsets: Default::default(),
        state_checkpoint_markers: [(
            FACTORY_NAME.to_string(),
            [(store.clone(), marker.clone())].into(),
        )]
        .into(),
    });
    mgr.init(Some(&checkpoint)).await?;
    // The plan printed is the plan carried out: an interrupted earlier restore is
    // finished first (a dry run changes nothing, so it plans the dir as it is).
    if !dry_run {
        mgr.recover().await?;
    }
    let plans = mgr.plan().await?;
    if !json {
        for p in &plans {
            print!("{p}");
        }
        if let Some(d) = &replace.deletes {
            println!(
                "  replaces {}, which blobsnap did not restore: deletes what the snapshot lacks of its {d}",
                spec.dir.display()
            );
        }
    }
    // One document per store, the same shape with and without `--dry-run` (the per-file plan
    // included): a dry run's counts are what the real run would do, a real run's what it did.
    let files: Vec<_> = plans.iter().map(plan_files).collect();
    let document = |plan: Option<blobsnap::blob::restore::PlanTotals>,
                    files: &serde_json::Value,
                    fetched: u64| {
        // Schema 2: the dry run's `plans` (store, totals) became this document (issue 35).
        serde_json::json!({
            "schema": 2,
            "dry-run": dry_run,
            "store": store,
            "marker": marker,
            "plan": plan,
            "files": files,
            "bytes-fetched": fetched,
            "bytes-hashed": blobsnap::digest::bytes_hashed(),
            "replaces": replace.deletes,
        })
    };
    if dry_run {
        if json {
            for (p, f) in plans.iter().zip(&files) {
                println!("{}", document(Some(p.totals), f, 0));
            }
        }
        return Ok(());
    }
    let bar = mgr.progress(&store).map(|p| {
        Bar::start("restore", move || {
            use std::sync::atomic::Ordering::Relaxed;
            (
                p.bytes_fetched.load(Relaxed),
                p.bytes_to_fetch.load(Relaxed),
            )
        })
    });
    mgr.execute(plans).await?;
    drop(bar);
    let totals = mgr.plan_totals();
    let progress = mgr.progress(&store);
    let fetched = progress
        .as_ref()
        .map(|p| p.bytes_fetched.load(std::sync::atomic::Ordering::Relaxed))
        .unwrap_or(0);
    if json {
        let none = serde_json::Value::Array(Vec::new());
        println!(
            "{}",
            document(
                totals.get(&store).copied(),
                files.first().unwrap_or(&none),
                fetched
            )
        );
    } else {
        println!("restored {store} from {marker}: {fetched} bytes downloaded");
    }
    Ok(())
}

/// A plan's files for `--json`: each snapshot file with where its bytes come from (`action`:
/// `download`, `inline` — written from the index —, `reuse` of a local file, `staged` by an
/// interrupted restore), the blob or local path, how a reused file was proved (`read` or
/// `hash-cache`); then each live file the snapshot lacks, `action` `delete`.
fn plan_files(plan: &blobsnap::blob::restore::RestorePlan) -> serde_json::Value {
    use blobsnap::blob::restore::Source;
    let mut rows: Vec<serde_json::Value> = plan
        .files
        .iter()
        .map(|f| {
            let (action, from) = match &f.source {
                Source::Staged => ("staged", None),
                Source::Local(p) => ("reuse", Some(p.display().to_string())),
                Source::Download => match f.entry.blobs.first() {
                    Some(b) => ("download", Some(b.blob_id.clone())),
                    None => ("inline", None),
                },
            };
            serde_json::json!({
                "path": f.path,
                "size": f.entry.file_metadata.size,
                "action": action,
                "from": from,
                "proof": f.proof,
            })
        })
        .collect();
    rows.extend(plan.leftover.iter().map(|l| {
        serde_json::json!({"path": l, "size": null, "action": "delete", "from": null, "proof": null})
    }));
    serde_json::Value::Array(rows)
}
