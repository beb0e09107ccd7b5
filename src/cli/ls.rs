//! `blobsnap ls`: what the store holds.

use super::args::{open_store, StoreArgs};
use blobsnap::blobstore::BlobStore;
use blobsnap::index::IndexMarker;

pub(crate) async fn run(store_args: &StoreArgs, json: bool) -> blobsnap::Result<()> {
    ls_command(store_args, json).await?;
    Ok(())
}

/// `blobsnap ls`: one listing of the store, grouped by job, task and store.
pub(crate) async fn ls_command(args: &StoreArgs, json: bool) -> blobsnap::Result<()> {
    use futures::TryStreamExt as _;
    let blob_store = open_store(args).await?;
    let all: Vec<_> = blob_store
        .list(&blobsnap::blobstore::Scope::root())
        .try_collect()
        .await?;
    #[derive(Default, serde::Serialize)]
    struct StoreInfo {
        snapshots: u64,
        blobs: u64,
        bytes: u64,
        newest: Option<String>,
    }
    #[derive(Default, serde::Serialize)]
    struct TaskInfo {
        checkpoints: u64,
        latest_seq: u64,
        /// Seconds since the latest checkpoint was written (by the store's clock).
        latest_age_secs: Option<u64>,
        stores: std::collections::BTreeMap<String, StoreInfo>,
    }
    let mut jobs: std::collections::BTreeMap<String, std::collections::BTreeMap<String, TaskInfo>> =
        Default::default();
    let un = |s: &str| blobsnap::blobstore::unescape_segment(s).unwrap_or_else(|_| s.to_string());
    for m in &all {
        let parts: Vec<&str> = m.key.as_str().split('/').collect();
        if parts.len() < 4 {
            continue;
        }
        let job = format!("{}/{}", un(parts[0]), un(parts[1]));
        match &parts[2..] {
            ["checkpoints", task, file] => {
                let t = jobs.entry(job).or_default().entry(un(task)).or_default();
                t.checkpoints += 1;
                if let Some(seq) = file
                    .strip_suffix(".json")
                    .and_then(|f| f.parse::<u64>().ok())
                {
                    if seq >= t.latest_seq {
                        t.latest_seq = seq;
                        let now = blobsnap::backend::Clock::now(&blobsnap::backend::SystemClock);
                        t.latest_age_secs = m
                            .last_modified
                            .and_then(|lm| now.duration_since(lm).ok())
                            .map(|d| d.as_secs());
                    }
                }
            }
            ["tasks", task, "stores", store, kind, rest @ ..] => {
                let t = jobs.entry(job).or_default().entry(un(task)).or_default();
                let s = t.stores.entry(un(store)).or_default();
                match *kind {
                    "index" => {
                        s.snapshots += 1;
                        // Newest by checkpoint id (never by the key's text: "…-10" sorts
                        // before "…-9"); a key that is no marker is counted, not ranked.
                        let marker = format!("index/{}", rest.join("/"));
                        if let Ok(m) = marker.parse::<IndexMarker>() {
                            let newer = s.newest.as_ref().is_none_or(|n| {
                                n.parse::<IndexMarker>()
                                    .map_or(true, |n| n.checkpoint_id < m.checkpoint_id)
                            });
                            if newer {
                                s.newest = Some(marker);
                            }
                        }
                    }
                    "blobs" => {
                        s.blobs += 1;
                        s.bytes += m.size;
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    if json {
        println!("{}", serde_json::json!({"schema": 1, "jobs": jobs}));
        return Ok(());
    }
    for (job, tasks) in &jobs {
        println!("{job}");
        for (task, t) in tasks {
            let age = t
                .latest_age_secs
                .map(|a| format!(", {}h{:02}m{:02}s ago", a / 3600, a / 60 % 60, a % 60))
                .unwrap_or_default();
            println!(
                "  task {task}: {} checkpoints, latest #{}{age}",
                t.checkpoints, t.latest_seq
            );
            for (store, s) in &t.stores {
                println!(
                    "    store {store}: {} snapshots, {} blobs, {} bytes; newest {}",
                    s.snapshots,
                    s.blobs,
                    s.bytes,
                    s.newest.as_deref().unwrap_or("-")
                );
            }
        }
    }
    Ok(())
}
