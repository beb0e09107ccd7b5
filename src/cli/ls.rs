//! `blobsnap ls`: what the store holds.

use super::args::{open_existing_store, StoreArgs};
use blobsnap::blobstore::BlobStore;
use blobsnap::index::IndexMarker;

pub(crate) async fn run(store_args: &StoreArgs, json: bool) -> blobsnap::Result<()> {
    ls_command(store_args, json).await?;
    Ok(())
}

/// `blobsnap ls`: one listing of the store, grouped by job, task and store.
pub(crate) async fn ls_command(args: &StoreArgs, json: bool) -> blobsnap::Result<()> {
    use futures::TryStreamExt as _;
    let blob_store = open_existing_store(args).await?;
    let all: Vec<_> = blob_store
        .list(&blobsnap::blobstore::Scope::root())
        .try_collect()
        .await?;
    #[derive(Default, serde::Serialize)]
    struct StoreInfo {
        snapshots: u64,
        blobs: u64,
        bytes: u64,
        #[serde(serialize_with = "newest_marker")]
        newest: Option<IndexMarker>,
    }
    #[derive(Default, serde::Serialize)]
    #[serde(rename_all = "kebab-case")]
    struct TaskInfo {
        checkpoints: u64,
        latest_seq: u64,
        /// Seconds since the latest checkpoint was written (by the store's clock).
        latest_age_secs: Option<u64>,
        stores: std::collections::BTreeMap<String, StoreInfo>,
    }
    let mut jobs: std::collections::BTreeMap<String, std::collections::BTreeMap<String, TaskInfo>> =
        Default::default();
    let mut ours = false;
    for m in &all {
        use blobsnap::layout::KeyKind;
        let Some(p) = blobsnap::layout::parse(&m.key) else {
            continue;
        };
        ours |= !matches!(p.kind, KeyKind::Unknown { .. });
        let job = format!("{}/{}", p.job_name, p.job_id);
        match p.kind {
            KeyKind::Checkpoint { task, seq } => {
                let t = jobs.entry(job).or_default().entry(task).or_default();
                t.checkpoints += 1;
                if seq >= t.latest_seq {
                    t.latest_seq = seq;
                    let now = blobsnap::backend::Clock::now(&blobsnap::backend::SystemClock);
                    t.latest_age_secs = m
                        .last_modified
                        .and_then(|lm| now.duration_since(lm).ok())
                        .map(|d| d.as_secs());
                }
            }
            KeyKind::Index {
                task,
                store,
                marker,
            } => {
                let t = jobs.entry(job).or_default().entry(task).or_default();
                let s = t.stores.entry(store).or_default();
                s.snapshots += 1;
                // Newest by checkpoint id (never by the key's text: "…-10" sorts before "…-9").
                if s.newest
                    .as_ref()
                    .is_none_or(|n| n.checkpoint_id < marker.checkpoint_id)
                {
                    s.newest = Some(marker);
                }
            }
            KeyKind::Blob { task, store, .. } => {
                let t = jobs.entry(job).or_default().entry(task).or_default();
                let s = t.stores.entry(store).or_default();
                s.blobs += 1;
                s.bytes += m.size;
            }
            _ => {}
        }
    }
    // A local dir that holds files but none of blobsnap's is the wrong dir (the demo's --dir
    // for its store); a bucket or prefix may hold other objects beside none of ours.
    let local = super::args::store_settings(args)
        .is_ok_and(|s| s.store.kind == blobsnap::config::StoreKind::Local);
    if local && !ours && !all.is_empty() {
        return Err(not_a_store(args, &all));
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
                "  task {task}: {} checkpoint documents, latest #{}{age}",
                t.checkpoints, t.latest_seq
            );
            for (store, s) in &t.stores {
                println!(
                    "    store {store}: {} snapshots, {} blobs, {}; newest {}",
                    s.snapshots,
                    s.blobs,
                    bytesize::ByteSize(s.bytes),
                    s.newest.as_ref().map_or("-".to_string(), |m| m.to_string())
                );
            }
        }
    }
    if !jobs.is_empty() {
        println!("(a store's size: its blobs as stored, each once — every snapshot's files, deduplicated; not its indexes; `usage` counts every object)");
    }
    Ok(())
}

/// A local store that holds files but no job, task or store of blobsnap's layout: the wrong
/// dir (`--local blobsnap-demo` for `--local blobsnap-demo/store`), named with what it holds
/// (issue 51, item 11) instead of an empty listing.
fn not_a_store(args: &StoreArgs, all: &[blobsnap::blobstore::ObjectMeta]) -> blobsnap::Error {
    let mut tops: Vec<String> = all
        .iter()
        .filter_map(|m| m.key.as_str().split('/').next().map(str::to_string))
        .collect();
    tops.dedup();
    tops.truncate(8);
    let hint = match &args.local {
        Some(dir) if dir.join("store").is_dir() && dir.join("state").is_dir() => format!(
            " ({} looks like a demo's --dir: its store is {})",
            dir.display(),
            dir.join("store").display()
        ),
        _ => String::new(),
    };
    blobsnap::Error::new(
        blobsnap::ErrorKind::NotFound,
        format!(
            "no job stored here: the dir holds {} files, none of blobsnap's layout (top level: {}){hint}; a typo in --local?",
            all.len(),
            tops.join(", ")
        ),
    )
}

/// The newest marker as the text of its key (as `ls --json` always printed it).
fn newest_marker<S: serde::Serializer>(m: &Option<IndexMarker>, s: S) -> Result<S::Ok, S::Error> {
    match m {
        Some(m) => s.serialize_str(&m.to_string()),
        None => s.serialize_none(),
    }
}
