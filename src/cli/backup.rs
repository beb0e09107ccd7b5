//! `blobsnap backup`: a manual backup of a closed RocksDB directory.

use std::path::PathBuf;

use super::args::{open_store, StoreArgs};
use super::progress::Bar;
use blobsnap::blob::manual;
use clap::Args;

#[derive(Args)]
pub(crate) struct BackupArgs {
    /// The RocksDB directory (closed), or a RocksDB checkpoint directory.
    #[arg(long)]
    pub(crate) db: PathBuf,
    /// The backup's name.
    #[arg(long)]
    pub(crate) name: String,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: BackupArgs,
) -> blobsnap::Result<()> {
    let BackupArgs { db, name } = args;
    backup_command(store_args, json, &db, &name).await?;
    Ok(())
}

/// `blobsnap backup`: [`blobsnap::blob::manual::backup`] with a progress bar.
pub(crate) async fn backup_command(
    args: &StoreArgs,
    json: bool,
    db_dir: &std::path::Path,
    name: &str,
) -> blobsnap::Result<()> {
    // The local store never lies in, holds or is the database it backs up.
    blobsnap::local::guard::refuse_overlap(
        "--db",
        db_dir,
        &super::args::protected_store(args, None),
    )?;
    let blob_store = open_store(args).await?;
    let stop = super::signal::stop_on_signal(
        "nothing is committed; what was uploaded is left to the sweep, after its grace",
    );
    let backup = manual::backup(
        blob_store,
        db_dir,
        name,
        super::args::hash_cache_dir(),
        |p| {
            Bar::start("backup", move || {
                use std::sync::atomic::Ordering::Relaxed;
                (
                    p.bytes_uploaded.load(Relaxed),
                    p.bytes_to_upload.load(Relaxed),
                )
            })
        },
    );
    let made = tokio::select! {
        made = backup => made?,
        () = stop.cancelled() => {
            return Err(blobsnap::Error::new(
                blobsnap::ErrorKind::Cancelled,
                format!("backup {name} stopped on request: nothing was committed (the previous backup is still the latest)"),
            ));
        }
    };
    let (marker, s) = (made.marker, made.stats);
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "name": name, "marker": marker.to_string(), "checkpoint-id": made.checkpoint_id.to_string(),
                "files": s.files, "bytes": s.bytes, "uploaded-files": s.blobs_uploaded, "uploaded-bytes": s.bytes_uploaded})
        );
    } else {
        println!("{marker}");
        let flags = args.as_flags();
        let restore = format!(
            "blobsnap {flags}{}restore --name {} --to DIR",
            if flags.is_empty() { "" } else { " " },
            super::args::shell_quote(name)
        );
        eprintln!(
            "backup {name}: {} files, {} bytes; uploaded {} files, {} bytes.\nRestore the latest backup of {name} with:\n  {restore}\nthis one with:\n  {restore} {marker}",
            s.files, s.bytes, s.blobs_uploaded, s.bytes_uploaded
        );
    }
    Ok(())
}
