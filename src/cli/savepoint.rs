//! `blobsnap savepoint create | ls | show | rm | unpin`: named, user-owned records of one committed
//! checkpoint per task, never collected while they exist ([`blobsnap::blob::savepoint`]).

use super::args::{open_existing_store, JobIdFlags, StoreArgs};
use super::checkpoints::local;
use blobsnap::blob::history::{utc, utc_millis, CheckpointRef};
use blobsnap::blob::savepoint::{self, Savepoint};
use blobsnap::layout::JobScope;
use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum SavepointAction {
    /// Record, for every task of the job, one committed checkpoint (the latest, or the one
    /// `--at` names) under NAME. Nothing is copied; what it names is kept by the job's
    /// cleanup and by `gc` until `savepoint rm`.
    Create {
        #[command(flatten)]
        job: JobIdFlags,
        /// The savepoint's name (A-Z a-z 0-9 . _ -).
        #[arg(long = "name")]
        savepoint: String,
        /// Which checkpoint of each task: `latest` (default), `@2026-12-02T10:00Z` (each
        /// task's newest at or before that time), `savepoint:NAME`, `#N` (each task's own
        /// number N: tasks' numbers diverge after restarts), a checkpoint id or prefix.
        #[arg(long, default_value = "latest")]
        at: String,
    },
    /// List the job's savepoints.
    Ls {
        #[command(flatten)]
        job: JobIdFlags,
    },
    /// Show one savepoint: per task, the checkpoint, its offsets and markers.
    Show {
        #[command(flatten)]
        job: JobIdFlags,
        /// The savepoint's name.
        #[arg(long = "name")]
        savepoint: String,
    },
    /// Delete a savepoint: what only it kept alive is left to `gc` (after its grace). A
    /// record that cannot be read (damaged, or of a newer format) is removed too, after
    /// saying why, unless a fork pins it.
    Rm {
        #[command(flatten)]
        job: JobIdFlags,
        /// The savepoint's name.
        #[arg(long = "name")]
        savepoint: String,
        /// Say what would be removed (and whether the record can be read); remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove the pins a fork holds on a savepoint that nothing of the fork borrows through
    /// any more (its deployment deleted, or everything it borrowed compacted away): the way
    /// out when gc refuses because a fork pins a savepoint that has no record. Pins a retained
    /// checkpoint or a savepoint of the fork still borrows through are kept (exit 6).
    Unpin {
        #[command(flatten)]
        job: JobIdFlags,
        /// The savepoint's name.
        #[arg(long = "name")]
        savepoint: String,
        /// The fork: `JOB/ID` (as `savepoint ls` and gc name it).
        #[arg(long)]
        fork: String,
        /// Say which pins would go; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    action: SavepointAction,
) -> blobsnap::Result<()> {
    let store = open_existing_store(store_args).await?;
    match action {
        SavepointAction::Create { job, savepoint, at } => {
            let (job_name, job_id) = (job.job, job.job_id);
            let at: CheckpointRef = at.parse()?;
            let sp = savepoint::create(&store, &job_name, &job_id, &savepoint, &at).await?;
            if json {
                print_json(&sp)?;
            } else {
                println!(
                    "savepoint {} of {job_name}/{job_id} at {}: {} task(s)",
                    sp.name,
                    sp.at,
                    sp.tasks.len()
                );
                print_tasks(&sp)?;
            }
        }
        SavepointAction::Ls { job } => {
            let (job_name, job_id) = (job.job, job.job_id);
            // A typo in --job fails as everywhere else (naming what the store holds), never
            // "has no savepoint" (issue 51, item 11).
            blobsnap::blob::history::require_job(
                store.as_ref(),
                &JobScope::new(&job_name, &job_id)?,
            )
            .await?;
            let (all, unreadable) =
                savepoint::list_all(store.as_ref(), &JobScope::new(&job_name, &job_id)?).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"schema": 1, "savepoints": all, "unreadable": unreadable, "partial": !unreadable.is_empty()})
                );
            } else if all.is_empty() && unreadable.is_empty() {
                println!("job {job_name}/{job_id} has no savepoint");
            } else {
                for sp in &all {
                    println!(
                        "{}  made {} ({})  at {}  {} task(s)",
                        sp.name,
                        utc(sp.created_millis),
                        local(sp.created_millis),
                        sp.at,
                        sp.tasks.len()
                    );
                }
                for u in &unreadable {
                    println!("{}  UNREADABLE  {}", u.name, u.reason);
                }
            }
            if !unreadable.is_empty() {
                return Err(blobsnap::Error::new(
                    blobsnap::ErrorKind::Corrupt,
                    format!(
                        "partial listing: {} savepoint record(s) of {job_name}/{job_id} cannot be read ({}); the others are listed. `blobsnap savepoint rm --name NAME` removes one (gc and the job's cleanup refuse to delete anything while one is unreadable)",
                        unreadable.len(),
                        blobsnap::blob::savepoint::Unreadable::names(&unreadable)
                    ),
                ));
            }
        }
        SavepointAction::Show { job, savepoint } => {
            let (job_name, job_id) = (job.job, job.job_id);
            let scope = JobScope::new(&job_name, &job_id)?;
            let sp = savepoint::read(store.as_ref(), &scope, &savepoint).await?;
            let forks =
                blobsnap::blob::fork::dependents(store.as_ref(), &scope, &savepoint).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"schema": 1, "savepoint": sp, "forks": forks})
                );
            } else {
                println!(
                    "savepoint {} of {job_name}/{job_id}, made {} at {}",
                    sp.name,
                    utc(sp.created_millis),
                    sp.at
                );
                print_tasks(&sp)?;
                for f in &forks {
                    println!(
                        "  borrowed by fork {}/{} task {} (rm refuses while it does)",
                        f.fork_job, f.fork_id, f.task
                    );
                }
            }
        }
        SavepointAction::Rm {
            job,
            savepoint,
            dry_run,
        } => {
            let (job_name, job_id) = (job.job, job.job_id);
            let removed = savepoint::remove_any(
                store.as_ref(),
                &JobScope::new(&job_name, &job_id)?,
                &savepoint,
                dry_run,
            )
            .await?;
            let (name, unreadable) = match &removed {
                savepoint::Removed::Record(sp) => (sp.name.clone(), None),
                savepoint::Removed::Unreadable(u) => (u.name.clone(), Some(u)),
            };
            if json {
                println!(
                    "{}",
                    serde_json::json!({"schema": 1, "dry-run": dry_run, "removed": name, "unreadable": unreadable})
                );
            } else {
                let verb = if dry_run { "would remove" } else { "removed" };
                match unreadable {
                    Some(u) => println!(
                        "{verb} the unreadable savepoint record {} ({}); what only it kept is left to gc",
                        u.key, u.reason
                    ),
                    None => println!(
                        "{verb} savepoint {name} of {job_name}/{job_id}; what only it kept is left to gc"
                    ),
                }
            }
        }
        SavepointAction::Unpin {
            job,
            savepoint,
            fork,
            dry_run,
        } => {
            let (job_name, job_id) = (job.job, job.job_id);
            let Some((fork_job, fork_id)) = fork.rsplit_once('/') else {
                return Err(blobsnap::Error::new(
                    blobsnap::ErrorKind::InvalidInput,
                    format!("--fork {fork:?}: expected JOB/ID"),
                ));
            };
            let done = blobsnap::blob::fork::unpin(
                std::sync::Arc::clone(&store),
                &JobScope::new(&job_name, &job_id)?,
                &savepoint,
                fork_job,
                fork_id,
                dry_run,
            )
            .await?;
            let names = |pins: &[blobsnap::blob::fork::ForkPin]| {
                pins.iter()
                    .map(|p| format!("task {}", p.task))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if json {
                println!(
                    "{}",
                    serde_json::json!({"schema": 1, "dry-run": dry_run, "unpinned": done})
                );
            } else {
                let verb = if dry_run { "would remove" } else { "removed" };
                println!(
                    "savepoint {savepoint} of {job_name}/{job_id}: {verb} {} pin(s) of fork {fork}{}",
                    done.removed.len(),
                    if done.removed.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", names(&done.removed))
                    }
                );
            }
            if !done.kept.is_empty() {
                return Err(blobsnap::Error::new(
                    blobsnap::ErrorKind::Conflict,
                    format!(
                        "fork {fork} still borrows from savepoint {savepoint:?} of {job_name}/{job_id} through {} pin(s) ({}): a retained checkpoint or a savepoint of the fork names a snapshot that borrows from it; they are kept",
                        done.kept.len(),
                        names(&done.kept)
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn print_json(sp: &Savepoint) -> blobsnap::Result<()> {
    println!("{}", serde_json::json!({"schema": 1, "savepoint": sp}));
    Ok(())
}

fn print_tasks(sp: &Savepoint) -> blobsnap::Result<()> {
    for task in sp.tasks.keys() {
        let Some(c) = sp.checkpoint_of(task)? else {
            continue;
        };
        let Some(v2) = c.checkpoint.as_v2() else {
            println!("  task {task}: checkpoint #{} (V1)", c.seq);
            continue;
        };
        let offsets = v2
            .input_offsets
            .iter()
            .map(|(k, v)| format!("{}={v}", k.to_key().unwrap_or_else(|_| k.to_string())))
            .collect::<Vec<_>>()
            .join(" ");
        println!(
            "  task {task}: checkpoint #{} {} ({})  {offsets}",
            c.seq,
            v2.id,
            utc_millis(v2.id.millis())
        );
        for (store, marker) in v2
            .state_checkpoint_markers
            .get(blobsnap::blob::FACTORY_NAME)
            .into_iter()
            .flatten()
        {
            println!("    store {store}: {marker}");
        }
    }
    Ok(())
}
