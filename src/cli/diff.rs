//! `blobsnap diff`: what changed between two snapshots of a store.

use super::args::{open_existing_store, SnapshotFlags, StoreArgs};
use clap::Args;

#[derive(Args)]
pub(crate) struct DiffArgs {
    #[command(flatten)]
    pub(crate) snap: SnapshotFlags,
    /// The older snapshot: a marker, or a checkpoint reference (`#N`, an id or prefix,
    /// `@TIME`, `savepoint:NAME`, `latest`).
    pub(crate) a: String,
    /// The newer snapshot (as the older one).
    pub(crate) b: String,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: DiffArgs,
) -> blobsnap::Result<()> {
    let DiffArgs { snap, a, b } = args;
    let snap = snap.resolve()?;
    let blob_store = open_existing_store(store_args).await?;
    let (a, _) = snap.resolve_marker(&blob_store, Some(a)).await?;
    let (b, _) = snap.resolve_marker(&blob_store, Some(b)).await?;
    let ia = snap.load(blob_store.as_ref(), &a).await?.index;
    let ib = snap.load(blob_store.as_ref(), &b).await?.index;
    let c = ia.compare(&ib);
    let (added, removed, changed, retained) = (c.added, c.removed, c.changed, c.retained);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "schema": 1,
                "added": {"files": added.files, "bytes": added.bytes},
                "removed": {"files": removed.files, "bytes": removed.bytes},
                "changed": {"files": changed.files, "bytes": changed.bytes},
                "retained": {"files": retained.files, "bytes": retained.bytes},
                "entries": c.entries.iter().map(|(k, p, s)| serde_json::json!({"change": k.as_str(), "path": p, "size": s})).collect::<Vec<_>>(),
            })
        );
    } else {
        for (k, p, size) in &c.entries {
            println!("  {:<8} {size:>12}  {p}", k.as_str());
        }
        println!(
                "added {} files ({} bytes), removed {} ({} bytes), changed {} ({} bytes), retained {} ({} bytes)",
                added.files, added.bytes, removed.files, removed.bytes, changed.files, changed.bytes, retained.files, retained.bytes
            );
    }
    Ok(())
}
