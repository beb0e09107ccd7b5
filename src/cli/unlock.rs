//! `blobsnap unlock`: release the writer leases of a job known to be stopped
//! ([`blobsnap::blob::admin::unlock`]).

use super::args::{open_existing_store, JobIdFlags, StoreArgs};
use blobsnap::backend::Clock as _;
use blobsnap::{Error, ErrorKind};
use clap::Args;

#[derive(Args)]
pub(crate) struct UnlockArgs {
    #[command(flatten)]
    pub(crate) job: JobIdFlags,
    /// A host the job is known to be stopped on: its leases go even within their grace
    /// (repeatable; `*` for every other host, and leases that cannot be read).
    #[arg(long = "stopped-host", value_name = "HOST")]
    pub(crate) stopped_hosts: Vec<String>,
    /// Say what would be removed; remove nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: UnlockArgs,
) -> blobsnap::Result<()> {
    let store = open_existing_store(store_args).await?;
    let (job, job_id) = (&args.job.job, &args.job.job_id);
    let scope = blobsnap::layout::JobScope::new(job, job_id)?;
    blobsnap::blob::history::require_job(store.as_ref(), &scope).await?;
    let leases = blobsnap::blob::admin::unlock(
        store.as_ref(),
        &scope,
        blobsnap::backend::SystemClock.now(),
        &args.stopped_hosts,
        args.dry_run,
    )
    .await?;
    let kept: Vec<_> = leases.iter().filter(|l| !l.removed).collect();
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "job": job, "job-id": job_id, "dry-run": args.dry_run, "leases": leases})
        );
    } else {
        let verb = if args.dry_run {
            "would remove"
        } else {
            "removed"
        };
        for l in &leases {
            let who = match (&l.task, &l.host, l.pid) {
                (Some(t), Some(h), Some(p)) => format!("task {t:?} (host {h:?}, pid {p})"),
                _ => format!("unreadable lease {}", l.key),
            };
            let what = if l.removed { verb } else { "kept" };
            println!("{what}: {who}, renewed {} s ago: {}", l.age_secs, l.verdict);
        }
        if leases.is_empty() {
            println!("{job}/{job_id}: no writer lease");
        }
    }
    if let Some(first) = kept.first() {
        let why = if kept.iter().any(|l| l.verdict == "live") {
            "a lease's process still runs on this host: stop it first"
        } else {
            "another host's lease within its grace: if the job is stopped there, name that host with --stopped-host HOST (or --stopped-host '*')"
        };
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "{} of {} writer lease(s) of {job}/{job_id} kept (first: {}): {why}",
                kept.len(),
                leases.len(),
                first.key
            ),
        ));
    }
    Ok(())
}
