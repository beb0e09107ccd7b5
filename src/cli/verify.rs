//! `blobsnap verify`: every object a snapshot references, by HEAD or by hash.

use std::sync::Arc;

use super::args::{open_store, SnapshotFlags, StoreArgs};
use super::progress::Bar;
use blobsnap::blobstore::BlobStore;
use blobsnap::{Error, ErrorKind};
use clap::Args;

#[derive(Args)]
pub(crate) struct VerifyArgs {
    #[command(flatten)]
    pub(crate) snap: SnapshotFlags,
    /// The marker (`index/<checkpoint-id>.<sha256>.json`); omitted: the task's latest
    /// checkpoint.
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
    if !(sample > 0.0 && sample <= 100.0) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("--sample {sample}: a percentage in (0, 100]"),
        ));
    }
    if sample < 100.0 && !deep {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--sample chooses blobs to download: it needs --deep",
        ));
    }
    let blob_store = open_store(store_args).await?;
    let (marker, _) = snap.resolve_marker(&blob_store, marker).await?;
    let blobsnap::blob::LoadedSnapshot { scope, index, .. } =
        snap.load(blob_store.as_ref(), &marker).await?;
    // --sample: exactly ceil(objects × pct / 100) blobs, chosen at random.
    let objects: usize = index
        .present_files()
        .iter()
        .map(|(_, f)| f.blobs.len())
        .sum();
    let chosen: std::collections::HashSet<usize> = if sample >= 100.0 {
        (0..objects).collect()
    } else {
        let k = ((objects as f64 * sample / 100.0).ceil() as usize).min(objects);
        rand::seq::index::sample(&mut rand::rng(), objects, k)
            .into_iter()
            .collect()
    };
    let mut problems: Vec<(ErrorKind, String)> = Vec::new();
    let total_bytes: u64 = index
        .present_files()
        .iter()
        .map(|(_, f)| f.file_metadata.size)
        .sum();
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bar = deep.then(|| {
        let done = Arc::clone(&done);
        Bar::start("verify", move || {
            (done.load(std::sync::atomic::Ordering::Relaxed), total_bytes)
        })
    });
    let mut checked = 0u64;
    let mut deep_checked = 0u64;
    for (path, f) in index.present_files() {
        for b in &f.blobs {
            let key = scope.key(&b.blob_id)?;
            checked += 1;
            match blob_store.head(&key).await {
                Ok(meta) if meta.size != f.file_metadata.size => problems.push((
                    ErrorKind::Corrupt,
                    format!(
                        "{path}: blob {key} is {} bytes, the index says {}",
                        meta.size, f.file_metadata.size
                    ),
                )),
                Ok(_) => {
                    done.fetch_add(f.file_metadata.size, std::sync::atomic::Ordering::Relaxed);
                    if deep && chosen.contains(&(checked as usize - 1)) {
                        deep_checked += 1;
                        match blobsnap::blob::hash_object(blob_store.as_ref(), &key).await {
                            Ok((sha, _)) if Some(sha) != f.sha256 => problems.push((
                                ErrorKind::Corrupt,
                                format!(
                                    "{path}: blob {key} has SHA-256 {sha}, the index says {}",
                                    f.sha256.map(|s| s.to_hex()).unwrap_or_default()
                                ),
                            )),
                            Ok(_) => {}
                            Err(e) => problems.push((e.kind(), format!("{path}: {e}"))),
                        }
                    }
                }
                Err(e) => problems.push((e.kind(), format!("{path}: blob {key}: {e}"))),
            }
        }
    }
    drop(bar);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "schema": 1, "marker": marker, "objects": checked, "deep-checked": deep_checked,
                "problems": problems.iter().map(|(k, m)| serde_json::json!({"kind": k.as_str(), "message": m})).collect::<Vec<_>>(),
            })
        );
    } else {
        for (k, m) in &problems {
            println!("  {k}: {m}");
        }
        println!(
            "verified {checked} objects ({deep_checked} downloaded and hashed): {} problems",
            problems.len()
        );
    }
    // Missing beats corrupt beats anything else, for the exit code.
    if let Some(kind) = [ErrorKind::NotFound, ErrorKind::Corrupt]
        .into_iter()
        .find(|k| problems.iter().any(|(p, _)| p == k))
        .or_else(|| problems.first().map(|(k, _)| *k))
    {
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
