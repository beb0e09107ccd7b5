//! `blobsnap diff`: what changed between two snapshots of a store.

use super::args::{open_store, SnapshotFlags, StoreArgs};
use clap::Args;

#[derive(Args)]
pub(crate) struct DiffArgs {
    #[command(flatten)]
    pub(crate) snap: SnapshotFlags,
    /// The older marker.
    pub(crate) a: String,
    /// The newer marker.
    pub(crate) b: String,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: DiffArgs,
) -> blobsnap::Result<()> {
    let DiffArgs { snap, a, b } = args;
    let snap = snap.resolve()?;
    let blob_store = open_store(store_args).await?;
    let ia = snap.load(blob_store.as_ref(), &a).await?.index;
    let ib = snap.load(blob_store.as_ref(), &b).await?.index;
    let fa: std::collections::BTreeMap<String, (Option<blobsnap::digest::Sha256>, u64)> = ia
        .present_files()
        .into_iter()
        .map(|(p, f)| (p, (f.sha256, f.file_metadata.size)))
        .collect();
    let fb: std::collections::BTreeMap<String, (Option<blobsnap::digest::Sha256>, u64)> = ib
        .present_files()
        .into_iter()
        .map(|(p, f)| (p, (f.sha256, f.file_metadata.size)))
        .collect();
    let mut rows = Vec::new();
    let (mut added, mut removed, mut changed, mut retained) =
        ((0u64, 0u64), (0u64, 0u64), (0u64, 0u64), (0u64, 0u64));
    for (p, (sha, size)) in &fb {
        match fa.get(p) {
            None => {
                added.0 += 1;
                added.1 += size;
                rows.push(("added", p.clone(), *size));
            }
            Some((sa, _)) if sa == sha && sha.is_some() => {
                retained.0 += 1;
                retained.1 += size;
            }
            Some(_) => {
                changed.0 += 1;
                changed.1 += size;
                rows.push(("changed", p.clone(), *size));
            }
        }
    }
    for (p, (_, size)) in &fa {
        if !fb.contains_key(p) {
            removed.0 += 1;
            removed.1 += size;
            rows.push(("removed", p.clone(), *size));
        }
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "schema": 1,
                "added": {"files": added.0, "bytes": added.1},
                "removed": {"files": removed.0, "bytes": removed.1},
                "changed": {"files": changed.0, "bytes": changed.1},
                "retained": {"files": retained.0, "bytes": retained.1},
                "entries": rows.iter().map(|(k, p, s)| serde_json::json!({"change": k, "path": p, "size": s})).collect::<Vec<_>>(),
            })
        );
    } else {
        for (k, p, size) in &rows {
            println!("  {k:<8} {size:>12}  {p}");
        }
        println!(
                "added {} files ({} bytes), removed {} ({} bytes), changed {} ({} bytes), retained {} ({} bytes)",
                added.0, added.1, removed.0, removed.1, changed.0, changed.1, retained.0, retained.1
            );
    }
    Ok(())
}
