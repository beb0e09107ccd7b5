//! `blobsnap forget`: prune a manual backup's history by a retention policy
//! ([`blobsnap::blob::manual::forget`]); `blobsnap gc --name NAME` then frees the bytes.

use super::args::{open_existing_store, StoreArgs};
use super::checkpoints::local;
use blobsnap::backend::Clock as _;
use blobsnap::blob::history::utc;
use blobsnap::retention::RetentionPolicy;
use clap::Args;

#[derive(Args)]
pub(crate) struct ForgetArgs {
    /// The manual backup (`blobsnap backup --name NAME`).
    #[arg(long)]
    pub(crate) name: String,
    /// What to keep: a count ("7"), or rules such as "last 3, every 1d for 30d, every 7d for
    /// 1y" (the newest N; the newest of each period within the window). The newest backup
    /// always stays.
    #[arg(long)]
    pub(crate) keep: String,
    /// Print what would be kept and removed; remove nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: ForgetArgs,
) -> blobsnap::Result<()> {
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
        for (seq, id, ms) in list {
            println!("  {what:<12} #{seq:<5} {id}  {} ({})", utc(*ms), local(*ms));
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
