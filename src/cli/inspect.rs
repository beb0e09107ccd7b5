//! `blobsnap inspect`: one snapshot's files, blobs and costs.

use super::args::{open_existing_store, SnapshotFlags, StoreArgs};
use blobsnap::{Error, ErrorKind};
use clap::Args;

#[derive(Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    pub(crate) snap: SnapshotFlags,
    /// The snapshot: a marker (`index/<checkpoint-id>.<sha256>.json`) or a reference to a
    /// checkpoint of the task — `latest`, `#N`, a checkpoint id or a unique prefix of one,
    /// `@2026-12-02T10:00Z` (the newest at or before), `savepoint:NAME`; omitted: latest.
    pub(crate) marker: Option<String>,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: InspectArgs,
) -> blobsnap::Result<()> {
    let InspectArgs { snap, marker } = args;
    let snap = snap.resolve()?;
    let blob_store = open_existing_store(store_args).await?;
    let (marker, checkpoint) = snap.resolve_marker(&blob_store, marker).await?;
    if let (Some(c), false) = (&checkpoint, json) {
        println!(
            "checkpoint #{} of task {} (writer {}):",
            c.seq, snap.task, c.writer
        );
        println!("  {}", String::from_utf8_lossy(&c.checkpoint.to_json()?));
    }
    let blobsnap::blob::LoadedSnapshot {
        marker: m, index, ..
    } = snap.load(blob_store.as_ref(), &marker).await?;
    use blobsnap::index::BlobOrigin;
    let files = index.present_files();
    let origin = |f: &blobsnap::index::FileIndex| f.blobs.first().map(|b| index.blob_origin(b));
    let bytes: u64 = files.iter().map(|(_, f)| f.file_metadata.size).sum();
    let of =
        |o: BlobOrigin| -> Vec<_> { files.iter().filter(|(_, f)| origin(f) == Some(o)).collect() };
    let uploaded = of(BlobOrigin::Uploaded);
    let up_bytes: u64 = uploaded.iter().map(|(_, f)| f.file_metadata.size).sum();
    let pre = of(BlobOrigin::PreUploaded);
    let pre_bytes: u64 = pre.iter().map(|(_, f)| f.file_metadata.size).sum();
    if json {
        let checkpoint = match &checkpoint {
            Some(c) => serde_json::json!({
                "seq": c.seq,
                "writer": c.writer,
                "document": serde_json::from_slice::<serde_json::Value>(&c.checkpoint.to_json()?)
                    .map_err(|e| Error::new(ErrorKind::Corrupt, format!("checkpoint JSON: {e}")))?,
            }),
            None => serde_json::Value::Null,
        };
        println!(
            "{}",
            serde_json::json!({
                "schema": 1,
                "marker": marker,
                "checkpoint": checkpoint,
                "checkpoint-id": m.checkpoint_id.to_string(),
                "prev": index.prev_snapshot_index_blob_id,
                "files": files.iter().map(|(p, f)| serde_json::json!({
                    "path": p, "size": f.file_metadata.size,
                    "sha256": f.sha256.map(|s| s.to_hex()),
                    "blob": f.blobs.first().map(|b| b.blob_id.clone()),
                    "inline": f.inline_data.is_some(),
                    "origin": if f.inline_data.is_some() { "inline" } else { origin(f).map_or("none", BlobOrigin::as_str) },
                })).collect::<Vec<_>>(),
                "total-files": files.len(),
                "total-bytes": bytes,
                "uploaded-files": uploaded.len(),
                "uploaded-bytes": up_bytes,
                "upload-requests": uploaded.len() + 1,
                "pre-uploaded-files": pre.len(),
                "pre-uploaded-bytes": pre_bytes,
                "restore-requests": files.iter().filter(|(_, f)| !f.blobs.is_empty()).count() + 1,
                "restore-bytes": bytes,
            })
        );
    } else {
        let md = &index.snapshot_metadata;
        println!(
            "snapshot {marker}\n  job {} / {}, task {}, store {}, checkpoint {}",
            md.job_name, md.job_id, md.task_name, md.store_name, md.checkpoint_id
        );
        println!(
            "  previous: {}",
            index
                .prev_snapshot_index_blob_id
                .as_deref()
                .unwrap_or("(none)")
        );
        for (p, f) in &files {
            let blob = f.blobs.first().map(|b| b.blob_id.as_str()).unwrap_or("-");
            let new = if f.inline_data.is_some() {
                "inline"
            } else {
                origin(f).map_or("-", BlobOrigin::as_str)
            };
            println!("  {:>12}  {p}  {new} {blob}", f.file_metadata.size);
        }
        println!(
                "  {} files, {} bytes; uploaded by this checkpoint: {} files, {} bytes, about {} requests (single PUTs + the index); pre-uploaded before it: {} files, {} bytes; a restore into an empty dir: {} GETs, {} bytes",
                files.len(),
                bytes,
                uploaded.len(),
                up_bytes,
                uploaded.len() + 1,
                pre.len(),
                pre_bytes,
                files.iter().filter(|(_, f)| !f.blobs.is_empty()).count() + 1,
                bytes
            );
    }
    Ok(())
}
