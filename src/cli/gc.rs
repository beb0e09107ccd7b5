//! `blobsnap gc`: the sweep of a job's scope.

use super::args::{open_existing_store, StoreArgs};
use clap::Args;

#[derive(Args)]
pub(crate) struct GcArgs {
    /// The job's name.
    #[arg(long, required_unless_present = "name")]
    pub(crate) job: Option<String>,
    /// A manual backup (`blobsnap backup --name NAME`): the same as `--job manual --job-id
    /// NAME`.
    #[arg(long, conflicts_with_all = ["job", "task", "store"])]
    pub(crate) name: Option<String>,
    /// The job's id.
    #[arg(long, default_value = "1")]
    pub(crate) job_id: String,
    /// Only this task.
    #[arg(long)]
    pub(crate) task: Option<String>,
    /// Only this store.
    #[arg(long)]
    pub(crate) store: Option<String>,
    /// Grace period in seconds: younger objects are never deleted.
    #[arg(long, default_value = "86400", value_parser = blobsnap::units::parse_secs)]
    pub(crate) grace_secs: u64,
    /// Print the plan (exactly what a real run deletes) and stop.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Allow a grace shorter than the job's (recorded in its scope.json; 24 h if none):
    /// still refused while a task of the job holds a writer lease younger than its grace.
    #[arg(long)]
    pub(crate) force: bool,
}

pub(crate) async fn run(store_args: &StoreArgs, json: bool, args: GcArgs) -> blobsnap::Result<()> {
    let GcArgs {
        job,
        name,
        job_id,
        task,
        store,
        grace_secs,
        dry_run,
        force,
    } = args;
    use blobsnap::blob::{admin, gc};
    let (job, job_id) = match (job, name) {
        (_, Some(n)) => (blobsnap::blob::manual::JOB.to_string(), n),
        (Some(j), None) => (j, job_id),
        (None, None) => {
            return Err(blobsnap::Error::new(
                blobsnap::ErrorKind::InvalidInput,
                "name a job (--job J [--job-id I]) or a manual backup (--name N)",
            ))
        }
    };
    let blob_store = open_existing_store(store_args).await?;
    blobsnap::blob::history::require_job(
        blob_store.as_ref(),
        &blobsnap::layout::JobScope::new(&job, &job_id)?,
    )
    .await?;
    let mut refused = None;
    {
        // A grace under the job's is refused unless forced, and while a task of the
        // job runs even then (a dry run deletes nothing: it prints its plan and exits with
        // the refusal's code).
        let scope = blobsnap::layout::JobScope::new(&job, &job_id)?;
        let record = admin::read_scope_record(blob_store.as_ref(), &scope).await?;
        // Lease ages on the server's clock (their last-modified times are the server's): a
        // clock here that runs ahead cannot make a live writer look stopped. A dry run writes
        // nothing, not even the probe: it judges them on this machine's clock.
        let now = if dry_run {
            blobsnap::backend::Clock::now(&blobsnap::backend::SystemClock)
        } else {
            gc::server_now(blob_store.as_ref(), &scope).await?
        };
        let active = admin::active_writers(blob_store.as_ref(), &scope, now).await?;
        match admin::sweep_guard(
            std::time::Duration::from_secs(grace_secs),
            record.as_ref(),
            &active,
            force,
        ) {
            // The plan is printed all the same; the exit says the refusal (a script that
            // checks with a dry run sees it).
            Err(e) if dry_run => refused = Some(e),
            r => r?,
        }
    }
    let settings = gc::SweepSettings {
        job_name: job,
        job_id,
        task,
        store,
        grace: std::time::Duration::from_secs(grace_secs),
    };
    // The sweep streams: each object is printed as it is decided (and, in a real run,
    // deleted page by page); a dry run writes nothing, not even the probe that reads the
    // server's clock. --json holds the decisions to print them in one document.
    let mut doomed = Vec::new();
    let mut on_doomed = |d: &gc::Doomed| {
        if json {
            doomed.push(d.clone());
        } else {
            println!("  delete {:>12}  {}", d.size, d.key);
        }
    };
    let report = gc::sweep(&blob_store, &settings, dry_run, &mut on_doomed).await?;
    let mut plan = report.plan;
    if json {
        plan.delete = doomed;
        println!(
            "{}",
            serde_json::json!({"schema": 1, "dry-run": dry_run, "plan": plan, "deleted": report.deleted, "refused": refused.as_ref().map(ToString::to_string)})
        );
    } else {
        for u in &plan.unknown {
            println!("  unknown (kept)  {u}");
        }
        println!(
            "sweep of {}/{}: {} roots, {} live objects; {} objects ({} bytes) {}, {} kept (younger than the grace), {} unknown keys, {} stale uploads",
            settings.job_name,
            settings.job_id,
            plan.roots,
            plan.live,
            plan.doomed,
            plan.bytes,
            if dry_run { "to delete" } else { "deleted" },
            plan.kept_young,
            plan.unknown.len(),
            plan.uploads.len()
        );
        if dry_run {
            println!("dry run: nothing deleted");
            if let Some(e) = &refused {
                println!("a real run would be refused: {e}");
            }
        } else {
            println!(
                "deleted {} objects, freed {} bytes",
                report.deleted, plan.bytes
            );
        }
    }
    match refused {
        Some(e) => Err(e.context("gc --dry-run: the plan above is what a run would delete, but a real run would be refused")),
        None => Ok(()),
    }
}
