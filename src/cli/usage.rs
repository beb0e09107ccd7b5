//! `blobsnap usage`: every object and byte of a job's scope, classified
//! ([`blobsnap::blob::usage`]).

use super::args::{open_existing_store, JobIdFlags, StoreArgs};
use blobsnap::backend::Clock as _;
use blobsnap::blob::gc::UnreadableRoot;
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
    let partial = partial(job, job_id, &report.unreadable_roots, "classified");
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "job": job, "job-id": job_id, "usage": report, "partial": report.partial})
        );
        return partial;
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
    println!("(sizes: every object under the job's scope, as the store bills it, each once; live = named by a retained checkpoint; each class is described in docs/state-through-time.md)");
    print_unreadable(&report.unreadable_roots);
    partial
}

/// The roots a report could not read, one line each (nothing when there are none).
pub(super) fn print_unreadable(roots: &[UnreadableRoot]) {
    for r in roots {
        println!("  UNREADABLE {} of {}: {}", r.what, r.root, r.reason);
    }
}

/// A report made without `roots` (which could not be read): `Corrupt` (exit 4) saying
/// "partial", naming them and what removes or repairs each kind, as `blobsnap checkpoints`
/// reports a partial listing; `Ok` when there are none. `what` says what was done with the
/// rest ("classified", "estimated").
pub(super) fn partial(
    job: &str,
    job_id: &str,
    roots: &[UnreadableRoot],
    what: &str,
) -> blobsnap::Result<()> {
    if roots.is_empty() {
        return Ok(());
    }
    let flags = if job_id == "1" {
        format!("--job {job}")
    } else {
        format!("--job {job} --job-id {job_id}")
    };
    let mut keys: Vec<&str> = roots.iter().map(|r| r.key.as_str()).collect();
    keys.dedup();
    Err(blobsnap::Error::new(
        blobsnap::ErrorKind::Corrupt,
        format!(
            "partial report: {} root(s) of {job}/{job_id} cannot be read ({}), the rest is {what}; gc deletes nothing until they can be read or are gone. {}",
            keys.len(),
            keys.join(", "),
            UnreadableRoot::ways_out(roots, &flags)
        ),
    ))
}
