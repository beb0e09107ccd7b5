//! `blobsnap forget`: prune a manual backup's history by a retention policy
//! ([`blobsnap::blob::manual::forget`]; `blobsnap gc --name NAME` then frees the bytes), remove
//! one checkpoint of a task ([`blobsnap::checkpoint::BlobCheckpointStore::remove`]; the next
//! sweep frees what only it needed), or remove a whole deployment — a retired job id or a
//! fork — at once ([`blobsnap::blob::remove::remove_deployment`]).

use std::sync::Arc;

use super::args::{open_existing_store, StoreArgs};
use super::checkpoints::local_millis;
use blobsnap::backend::Clock as _;
use blobsnap::blob::history::utc_millis;
use blobsnap::retention::RetentionPolicy;
use clap::Args;

#[derive(Args)]
pub(crate) struct ForgetArgs {
    /// The manual backup (`blobsnap backup --name NAME`).
    #[arg(long, required_unless_present_any = ["checkpoint", "all"], requires = "keep")]
    pub(crate) name: Option<String>,
    /// What to keep: a count ("7"), or rules such as "last 3, every 1d for 30d, every 7d for
    /// 1y" (the newest N; the newest of each period within the window). The newest backup
    /// always stays.
    #[arg(long, requires = "name")]
    pub(crate) keep: Option<String>,
    /// Remove one checkpoint of a task, by its key as `blobsnap checkpoints --json` names it
    /// (`JOB/ID/checkpoints/TASK/SEQ.json`): it is replaced by the record of its removal, so
    /// its number stays taken, and every reader passes over it; the next `gc` frees what only
    /// it needed. A document that cannot be read goes with why; a readable checkpoint only
    /// while a newer one can be read (the newest is what the task restores).
    #[arg(long, value_name = "KEY", conflicts_with_all = ["name", "keep", "all"])]
    pub(crate) checkpoint: Option<String>,
    /// Remove a whole deployment, `--job J --job-id ID` (a retired job id, or a fork): every
    /// checkpoint, savepoint, index, blob and record under its scope, and the pins a fork
    /// holds on its sources. Refused while the job runs (a live writer lease) or while a fork
    /// borrows from one of its savepoints.
    #[arg(long, requires_all = ["job", "job_id"], conflicts_with_all = ["name", "keep"])]
    pub(crate) all: bool,
    /// The job of `--all`.
    #[arg(long, requires = "all")]
    pub(crate) job: Option<String>,
    /// The job id of `--all` (no default: name the deployment to remove).
    #[arg(long, requires = "all")]
    pub(crate) job_id: Option<String>,
    /// Print what would be kept and removed; remove nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: ForgetArgs,
) -> blobsnap::Result<()> {
    if let Some(key) = &args.checkpoint {
        return forget_checkpoint(store_args, json, key, args.dry_run).await;
    }
    if let (true, Some(job), Some(job_id)) = (args.all, &args.job, &args.job_id) {
        return forget_deployment(store_args, json, job, job_id, args.dry_run).await;
    }
    let (Some(name), Some(keep)) = (args.name.clone(), args.keep.clone()) else {
        return Err(blobsnap::Error::new(
            blobsnap::ErrorKind::InvalidInput,
            "forget takes --name NAME --keep POLICY, --checkpoint KEY, or --all --job J --job-id ID",
        ));
    };
    let args = Named {
        name,
        keep,
        dry_run: args.dry_run,
    };
    let policy: RetentionPolicy = args.keep.parse()?;
    let store = open_existing_store(store_args).await?;
    let now = blobsnap::backend::SystemClock.now_millis();
    let report =
        blobsnap::blob::manual::forget(store, &args.name, &policy, now, args.dry_run).await?;
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "name": args.name, "dry-run": args.dry_run, "forget": report})
        );
        return Ok(());
    }
    println!("manual backup {}: keep {}", args.name, report.policy);
    for (what, list) in [
        ("keep", &report.kept),
        (
            if args.dry_run {
                "would remove"
            } else {
                "remove"
            },
            &report.removed,
        ),
    ] {
        for e in list {
            println!(
                "  {what:<12} #{:<5} {}  {} ({})",
                e.seq,
                e.checkpoint_id,
                utc_millis(e.time_millis),
                local_millis(e.time_millis)
            );
        }
    }
    println!(
        "{} kept, {} {}; the bytes only they held go with `blobsnap gc --name {}`",
        report.kept.len(),
        report.removed.len(),
        if args.dry_run {
            "to remove (dry run)"
        } else {
            "removed"
        },
        args.name
    );
    Ok(())
}

/// `forget --name`'s arguments, checked.
struct Named {
    name: String,
    keep: String,
    dry_run: bool,
}

/// `forget --all --job J --job-id ID`: remove a whole deployment.
async fn forget_deployment(
    store_args: &StoreArgs,
    json: bool,
    job: &str,
    job_id: &str,
    dry_run: bool,
) -> blobsnap::Result<()> {
    let scope = blobsnap::layout::JobScope::new(job, job_id)?;
    let store = open_existing_store(store_args).await?;
    // Lease ages on the server's clock (as the sweep judges them: a clock here running ahead
    // cannot make a live writer look stopped); a dry run writes nothing, not even the probe.
    let now = if dry_run {
        blobsnap::backend::SystemClock.now()
    } else {
        blobsnap::blob::history::require_job(store.as_ref(), &scope).await?;
        blobsnap::blob::gc::server_now(store.as_ref(), &scope).await?
    };
    let report = blobsnap::blob::remove::remove_deployment(store, &scope, now, dry_run).await?;
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "removed-deployment": report})
        );
        return Ok(());
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    println!(
        "{job}/{job_id}: {verb} {} object(s), {}: {} checkpoint document(s), {} savepoint(s), {} index(es), {} blob(s), {} other record(s){}",
        report.objects,
        bytesize::ByteSize(report.bytes),
        report.checkpoints,
        report.savepoints,
        report.indexes,
        report.blobs,
        report.other,
        if report.uploads_aborted > 0 {
            format!("; {} incomplete upload(s) aborted", report.uploads_aborted)
        } else {
            String::new()
        }
    );
    for p in &report.pins_released {
        println!(
            "  {} its pin on savepoint {:?} of {}/{} (task {:?})",
            if dry_run { "would release" } else { "released" },
            p.savepoint,
            p.source_job,
            p.source_id,
            p.task
        );
    }
    if dry_run {
        println!("dry run: nothing was deleted");
    }
    Ok(())
}

/// `forget --checkpoint KEY`: replace one checkpoint document by its removal.
async fn forget_checkpoint(
    store_args: &StoreArgs,
    json: bool,
    key: &str,
    dry_run: bool,
) -> blobsnap::Result<()> {
    let parsed = blobsnap::blobstore::BlobKey::new(key.to_string())
        .ok()
        .and_then(|k| blobsnap::layout::parse(&k));
    let Some(blobsnap::layout::ParsedKey {
        job_name,
        job_id,
        kind: blobsnap::layout::KeyKind::Checkpoint { task, seq },
    }) = parsed
    else {
        return Err(blobsnap::Error::new(blobsnap::ErrorKind::InvalidInput, format!(
            "--checkpoint {key:?} is not the key of a checkpoint document (JOB/ID/checkpoints/TASK/SEQ.json, as `blobsnap checkpoints` names it)"
        )));
    };
    let job = if job_name == blobsnap::layout::MANUAL_JOB {
        blobsnap::layout::JobScope::manual(&job_id)?
    } else {
        blobsnap::layout::JobScope::new(&job_name, &job_id)?
    };
    let store = open_existing_store(store_args).await?;
    let cps = blobsnap::checkpoint::BlobCheckpointStore::new(Arc::clone(&store), job);
    let now = blobsnap::backend::SystemClock.now_millis();
    // A readable checkpoint goes only while the newest one restores: every snapshot it names
    // is read (its index, hash-checked against its marker).
    let restores = |newer: blobsnap::checkpoint::CommittedCheckpoint| {
        let (store, job_name, job_id, task) = (
            Arc::clone(&store),
            job_name.clone(),
            job_id.clone(),
            task.clone(),
        );
        async move {
            let markers = newer
                .checkpoint
                .as_v2()
                .and_then(|v| v.state_checkpoint_markers.get(blobsnap::blob::FACTORY_NAME))
                .cloned()
                .unwrap_or_default();
            for (store_name, marker) in &markers {
                let who = blobsnap::blob::Expected {
                    job_name: &job_name,
                    job_id: &job_id,
                    task_name: &task,
                    store_name,
                };
                blobsnap::blob::load_snapshot(store.as_ref(), &who, marker)
                    .await
                    .map_err(|e| e.context(format!("store {store_name}")))?;
            }
            Ok(())
        }
    };
    let report = cps.remove(&task, seq, now, dry_run, restores).await?;
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "dry-run": dry_run, "removed-checkpoint": report})
        );
        return Ok(());
    }
    let what = match (dry_run, report.changed) {
        (true, _) => "would remove",
        (false, true) => "removed",
        (false, false) => "already removed",
    };
    let why = if report.readable {
        "why"
    } else {
        "why it could not be read"
    };
    println!(
        "checkpoint #{seq} of task {task} of {job_name}/{job_id}: {what} (its number stays taken; `blobsnap checkpoints` lists it as removed; the next `gc` frees what only it needed)\n  key: {}\n  {why}: {}",
        report.key, report.reason
    );
    Ok(())
}
