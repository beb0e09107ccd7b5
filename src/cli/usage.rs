//! `blobsnap usage`: every object and byte of a job's scope, classified
//! ([`blobsnap::blob::usage`]).

use super::args::{open_existing_store, JobIdFlags, StoreArgs};
use blobsnap::backend::Clock as _;
use blobsnap::blob::usage::usage;
use clap::Args;

#[derive(Args)]
pub(crate) struct UsageArgs {
    #[command(flatten)]
    pub(crate) job: JobIdFlags,
    /// Judge orphans by this grace, seconds (default: the job's, recorded in scope.json, else
    /// 24 h).
    #[arg(long, value_parser = blobsnap::units::parse_secs)]
    pub(crate) grace_secs: Option<u64>,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: UsageArgs,
) -> blobsnap::Result<()> {
    let store = open_existing_store(store_args).await?;
    let (job, job_id) = (&args.job.job, &args.job.job_id);
    let report = usage(
        &store,
        job,
        job_id,
        args.grace_secs.map(std::time::Duration::from_secs),
        blobsnap::backend::SystemClock.now(),
    )
    .await?;
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "job": job, "job-id": job_id, "usage": report})
        );
        return Ok(());
    }
    println!(
        "{job}/{job_id}: {} objects, {} ({} roots read; orphans judged by a grace of {} s, from {})",
        report.total_objects,
        bytesize::ByteSize(report.total_bytes),
        report.roots,
        report.grace_secs,
        report.grace_from
    );
    for (name, c) in &report.classes {
        if name == "stale-multipart" && !report.multipart_listed {
            println!("  {name:<22} not listed (this store cannot list multipart uploads)");
            continue;
        }
        let oldest = match (&c.oldest, c.oldest_age_secs) {
            (Some(k), Some(a)) => format!("; oldest {}h{:02}m ago: {k}", a / 3600, a / 60 % 60),
            _ => String::new(),
        };
        println!(
            "  {name:<22} {:>8} objects {:>12}{oldest}",
            c.objects,
            bytesize::ByteSize(c.bytes).to_string()
        );
    }
    Ok(())
}
