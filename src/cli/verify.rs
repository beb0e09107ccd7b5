//! `blobsnap verify`: every object a snapshot references, by HEAD or by hash.

use std::sync::Arc;

use super::args::{open_existing_store, SnapshotFlags, StoreArgs};
use super::progress::Bar;
use std::sync::atomic::{AtomicU64, Ordering};

use blobsnap::blob::verify::{verify, VerifyOptions, VerifyReport};
use blobsnap::Error;
use clap::Args;

#[derive(Args)]
pub(crate) struct VerifyArgs {
    #[command(flatten)]
    pub(crate) snap: SnapshotFlags,
    /// The snapshot: a marker (`index/<checkpoint-id>.<sha256>.json`) or a reference to a
    /// checkpoint of the task — `latest`, `#N`, a checkpoint id or a unique prefix of one,
    /// `@2026-12-02T10:00Z` (the newest at or before), `savepoint:NAME`; omitted: latest.
    pub(crate) marker: Option<String>,
    /// Download every blob and check its SHA-256.
    #[arg(long)]
    pub(crate) deep: bool,
    /// With --deep: download only this percentage of the blobs (rounded up), chosen at
    /// random; every blob is still checked by HEAD.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) sample: f64,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: VerifyArgs,
) -> blobsnap::Result<()> {
    let VerifyArgs {
        snap,
        marker,
        deep,
        sample,
    } = args;
    let snap = snap.resolve()?;
    let opts = VerifyOptions {
        deep,
        sample_pct: sample,
    };
    opts.validate()?;
    let blob_store = open_existing_store(store_args).await?;
    let (marker, _) = snap.resolve_marker(&blob_store, marker).await?;
    let loaded = snap.load(blob_store.as_ref(), &marker).await?;
    let total_bytes: u64 = loaded
        .index
        .present_files()
        .iter()
        .map(|(_, f)| f.file_metadata.size)
        .sum();
    let done = Arc::new(AtomicU64::new(0));
    let bar = deep.then(|| {
        let done = Arc::clone(&done);
        Bar::start("verify", move || {
            (done.load(Ordering::Relaxed), total_bytes)
        })
    });
    let report = verify(blob_store.as_ref(), &loaded, &opts, &done).await?;
    drop(bar);
    let VerifyReport {
        objects,
        deep_checked,
        problems,
    } = &report;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "schema": 1, "marker": marker, "objects": objects, "deep-checked": deep_checked,
                "problems": problems.iter().map(|(k, m)| serde_json::json!({"kind": k.as_str(), "message": m})).collect::<Vec<_>>(),
            })
        );
    } else {
        for (k, m) in problems {
            println!("  {k}: {m}");
        }
        println!(
            "verified {objects} objects ({deep_checked} downloaded and hashed): {} problems",
            problems.len()
        );
    }
    if let Some(kind) = report.worst() {
        return Err(Error::new(
            kind,
            format!(
                "snapshot {marker} failed verification ({} problems)",
                problems.len()
            ),
        ));
    }
    Ok(())
}
