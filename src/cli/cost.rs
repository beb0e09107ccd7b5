//! `blobsnap cost`: what a job costs per commit and per month ([`blobsnap::blob::cost`]).

use std::time::Duration;

use super::args::{open_existing_store, store_settings, StoreArgs};
use blobsnap::blob::cost::{estimate, CostOptions, CostReport};
use blobsnap::config::StoreKind;
use clap::Args;

#[derive(Args)]
pub(crate) struct CostArgs {
    #[command(flatten)]
    job: super::args::JobFlags,
    /// The job's commit interval ("60s", "5m"); omitted: measured from its checkpoints. For a
    /// manual backup (--name): the interval of a backup schedule to price; omitted, only its
    /// storage is priced.
    #[arg(long, value_parser = blobsnap::units::parse_duration_flag)]
    commit_interval: Option<Duration>,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: CostArgs,
) -> blobsnap::Result<()> {
    let settings = store_settings(store_args)?;
    let (multipart_threshold, part_size) = match settings.store.kind {
        StoreKind::S3 => (settings.s3.multipart_threshold, settings.s3.part_size),
        StoreKind::Local => (u64::MAX, 0),
    };
    let store = open_existing_store(store_args).await?;
    let (job_name, job_id) = args.job.names()?;
    blobsnap::blob::history::require_job(
        store.as_ref(),
        &blobsnap::layout::JobScope::new(&job_name, &job_id)?,
    )
    .await?;
    let report = estimate(
        &store,
        &CostOptions {
            job_name,
            job_id,
            commit_interval: args.commit_interval,
            multipart_threshold,
            part_size,
            sweep_every_commits: settings.job.sweep_every_commits,
            retention_tiers: !settings.job.retention.tiers.is_empty(),
            prices: settings.cost,
        },
    )
    .await?;
    let partial = super::usage::partial(
        &report.job,
        &report.job_id,
        &report.unreadable_roots,
        "estimated",
    );
    if json {
        let mut doc = serde_json::to_value(&report)
            .map_err(|e| blobsnap::Error::new(blobsnap::ErrorKind::Io, format!("json: {e}")))?;
        round_floats(&mut doc, None);
        if let Some(o) = doc.as_object_mut() {
            o.insert("schema".into(), 1.into());
        }
        println!("{doc}");
        return partial;
    }
    print_report(&report);
    super::usage::print_unreadable(&report.unreadable_roots);
    partial
}

/// An estimate's numbers as a reader wants them: dollars (`*-usd`) to the micro-dollar, other
/// fractions (requests per commit, a month's requests, an interval in seconds) to four decimals
/// — not a float's 17 digits.
fn round_floats(v: &mut serde_json::Value, key: Option<&str>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                round_floats(x, Some(k));
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| round_floats(x, key)),
        serde_json::Value::Number(n) if n.is_f64() => {
            let places = if key.is_some_and(|k| k.ends_with("-usd") || k.ends_with("-per-1000")) {
                1e6
            } else {
                1e4
            };
            if let Some(r) = n
                .as_f64()
                .map(|f| (f * places).round() / places)
                .and_then(serde_json::Number::from_f64)
            {
                *n = r;
            }
        }
        _ => {}
    }
}

fn print_report(r: &CostReport) {
    let c = &r.per_commit;
    let m = &r.monthly;
    let what = if r.manual { "backup" } else { "commit" };
    if r.manual {
        println!(
            "manual backup {}: {} backups retained; {} sampled (consecutive pairs)",
            r.job_id, r.retained_points, r.sampled_task_commits
        );
    } else {
        println!(
            "job {}/{}: {} tasks; {} task commits sampled from the retained checkpoints ({} store snapshots changed, {} carried forward)",
            r.job, r.job_id, r.tasks, r.sampled_task_commits, r.changed_store_commits, r.unchanged_store_commits
        );
    }
    if r.sampled_task_commits == 0 && !r.unreadable_roots.is_empty() {
        println!(
            "per {what}: no {what} could be sampled (a pair of consecutive readable checkpoints is needed; {} root(s) cannot be read, below): the figures below count only the fixed requests, not what a {what} uploads",
            r.unreadable_roots.len()
        );
    }
    println!(
        "per {what}{}: {:.1} PUT, {:.2} LIST, {:.2} GET, {:.1} DeleteObjects, {} uploaded",
        if r.manual { "" } else { " (all tasks)" },
        c.put,
        c.list,
        c.get,
        c.delete,
        human_bytes(c.upload_bytes)
    );
    println!(
        "stored: {} in {} objects, for {} retained points: {} in the latest snapshots + {} of distinct files born in the retention window + {} of indexes and checkpoint documents (what the number of points adds)",
        human_bytes(r.stored_bytes as f64),
        r.stored_objects,
        r.retained_points,
        human_bytes(r.live_bytes as f64),
        human_bytes(r.window_bytes as f64),
        human_bytes(r.metadata_bytes as f64)
    );
    if m.commits > 0.0 {
        println!(
            "a month at one {what} every {:.1} s ({}): {:.0} {what}s, {:.0} PUT, {:.0} LIST, {:.0} GET",
            r.commit_interval_secs,
            r.commit_interval_from,
            m.commits,
            m.requests.put,
            m.requests.list,
            m.requests.get
        );
    } else {
        println!(
            "a month: storage only (a backup's requests cost ${:.6}; give --commit-interval to price a backup schedule)",
            c.dollars(&r.prices)
        );
    }
    println!(
        "estimate: requests ${:.2} + storage ${:.2} = ${:.2} a month (PUT/LIST ${}/1000, GET ${}/1000, storage ${}/GB-month)",
        m.requests_usd,
        m.storage_usd,
        m.total_usd,
        r.prices.put_per_1000,
        r.prices.get_per_1000,
        r.prices.storage_per_gb_month
    );
}

fn human_bytes(b: f64) -> String {
    bytesize::ByteSize::b(b.max(0.0) as u64).to_string()
}
