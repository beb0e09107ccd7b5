//! `blobsnap check`: the whole job at once — every retained checkpoint and savepoint of every
//! task, every index and blob they name ([`blobsnap::blob::check`]).

use super::args::{open_existing_store, JobIdFlags, StoreArgs};
use blobsnap::blob::check::{check_job, CheckOptions};
use blobsnap::Error;
use clap::Args;

#[derive(Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    pub(crate) job: JobIdFlags,
    /// Also download every blob and check its SHA-256.
    #[arg(long, conflicts_with = "read_data_subset")]
    pub(crate) read_data: bool,
    /// Download this share of the distinct blobs ("5%", or "5"), chosen at random; every
    /// blob is still checked by HEAD.
    #[arg(long, value_parser = parse_pct)]
    pub(crate) read_data_subset: Option<f64>,
}

fn parse_pct(v: &str) -> Result<f64, String> {
    let n: f64 = v
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{v:?}: a percentage such as 5%"))?;
    if n > 0.0 && n <= 100.0 {
        Ok(n)
    } else {
        Err(format!("{v:?}: a percentage in (0, 100]"))
    }
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: CheckArgs,
) -> blobsnap::Result<()> {
    let store = open_existing_store(store_args).await?;
    let opts = CheckOptions {
        read_data: args.read_data || args.read_data_subset.is_some(),
        subset_pct: args.read_data_subset.unwrap_or(100.0),
    };
    let (job, job_id) = (&args.job.job, &args.job.job_id);
    let report = check_job(&store, job, job_id, &opts).await?;
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "job": job, "job-id": job_id, "report": report})
        );
    } else {
        for p in &report.problems {
            println!("  {}: {}", p.kind, p.message);
            for by in &p.named_by {
                println!("      named by {by}");
            }
            println!("      gc: {}", p.gc);
        }
        println!(
            "checked {job}/{job_id}: {} tasks, {} checkpoints, {} savepoints, {} indexes, {} blobs ({}; {} read and hashed): {} problems",
            report.tasks,
            report.checkpoints,
            report.savepoints,
            report.indexes,
            report.blobs,
            bytesize::ByteSize(report.bytes),
            report.blobs_read,
            report.problems.len()
        );
    }
    if let Some(kind) = report.worst() {
        return Err(Error::new(
            kind,
            format!(
                "check of {job}/{job_id} found {} problems (the first: {})",
                report.problems.len(),
                report.problems.first().map_or("", |p| p.message.as_str())
            ),
        ));
    }
    Ok(())
}
