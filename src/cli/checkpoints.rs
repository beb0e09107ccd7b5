//! `blobsnap checkpoints`: every retained checkpoint of every task of a job, newest first,
//! with its stores' sizes and new bytes, the savepoints that pin it and the forks that borrow
//! from it (a fork's own snapshots name what they borrow from)
//! ([`blobsnap::blob::history`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::args::{open_existing_store, JobFlags, StoreArgs};
use blobsnap::blob::history::{task_names, utc, utc_millis};
use blobsnap::blob::savepoint;
use blobsnap::blob::{load_snapshot, Expected, FACTORY_NAME};
use blobsnap::checkpoint::{BlobCheckpointStore, Record};
use blobsnap::Error;
use clap::Args;

#[derive(Args)]
pub(crate) struct CheckpointsArgs {
    #[command(flatten)]
    pub(crate) job: JobFlags,
    /// Only this task.
    #[arg(long)]
    pub(crate) task: Option<String>,
}

/// One store of one checkpoint.
#[derive(serde::Serialize)]
#[serde(rename_all = "kebab-case")]
struct StoreLine {
    marker: String,
    files: usize,
    bytes: u64,
    /// Bytes this checkpoint uploaded (its own blobs).
    new_bytes: u64,
    /// A fork's snapshot: the jobs (and savepoints) whose blobs it borrows, `JOB/ID/NAME`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    borrows_from: Vec<String>,
    /// Set when its index cannot be read (missing or damaged): why; the sizes are then 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    unreadable: Option<String>,
}

/// One retained checkpoint.
#[derive(serde::Serialize)]
#[serde(rename_all = "kebab-case")]
struct Line {
    seq: u64,
    /// Its document's key (what `forget --checkpoint` takes).
    key: String,
    checkpoint_id: String,
    time_millis: u64,
    time_utc: String,
    time_local: String,
    input_offsets: BTreeMap<String, String>,
    stores: BTreeMap<String, StoreLine>,
    savepoints: Vec<String>,
    /// Forks that borrow from it through those savepoints: `JOB/ID`.
    forks: Vec<String>,
    /// Set when this number repeats the checkpoint before it (a task's claim at startup).
    repeats: Option<u64>,
    /// Set on a head a task committed to start from a chosen point (a rollback, a roll
    /// forward, a fork): the point as configured, or `#K` — the older retained checkpoint whose
    /// offsets and state it carries — when the task's record names a later start.
    #[serde(skip_serializing_if = "Option::is_none")]
    start_from: Option<String>,
}

/// A checkpoint document an operator removed because it could not be read (its number stays
/// taken).
#[derive(serde::Serialize)]
#[serde(rename_all = "kebab-case")]
struct RemovedLine {
    task: String,
    seq: u64,
    key: String,
    at_millis: u64,
    reason: String,
}

/// A checkpoint document that cannot be read, by its key, with why.
#[derive(serde::Serialize)]
#[serde(rename_all = "kebab-case")]
struct UnreadableLine {
    task: String,
    seq: u64,
    key: String,
    reason: String,
}

pub(crate) async fn run(
    store_args: &StoreArgs,
    json: bool,
    args: CheckpointsArgs,
) -> blobsnap::Result<()> {
    let store = open_existing_store(store_args).await?;
    let (job_name, job_id) = args.job.names()?;
    let job = blobsnap::layout::JobScope::new(&job_name, &job_id)?;
    blobsnap::blob::history::require_job(store.as_ref(), &job).await?;
    let tasks = match &args.task {
        Some(t) => [t.clone()].into(),
        None => task_names(store.as_ref(), &job).await?,
    };
    if tasks.is_empty() {
        return Err(Error::new(
            blobsnap::ErrorKind::NotFound,
            format!("job {job_name}/{job_id} has no checkpoint"),
        ));
    }
    // A savepoint record that cannot be read costs its labels, not the listing (issue 47):
    // named at the end, and the command exits non-zero with "partial".
    let (savepoints, unreadable) = savepoint::list_all(store.as_ref(), &job).await?;
    let mut forks_of: BTreeMap<String, Vec<blobsnap::blob::fork::ForkPin>> = BTreeMap::new();
    for sp in &savepoints {
        forks_of.insert(
            sp.name.clone(),
            blobsnap::blob::fork::dependents(store.as_ref(), &job, &sp.name).await?,
        );
    }
    let cps = BlobCheckpointStore::new(Arc::clone(&store), job.clone());
    let mut out: BTreeMap<String, Vec<Line>> = BTreeMap::new();
    let mut removed: Vec<RemovedLine> = Vec::new();
    let mut damaged: Vec<UnreadableLine> = Vec::new();
    let mut lost_indexes: Vec<String> = Vec::new();
    for task in &tasks {
        // One damaged checkpoint document costs its own line, not the listing (issue 47).
        let mut history = Vec::new();
        for l in cps.listing(task).await? {
            match l.record {
                Ok(Record::Checkpoint(c)) => history.push(c),
                Ok(Record::Removed { removal, .. }) => removed.push(RemovedLine {
                    task: task.clone(),
                    seq: l.seq,
                    key: l.key.to_string(),
                    at_millis: removal.at_millis,
                    reason: removal.reason,
                }),
                Err(e) if e.kind() == blobsnap::ErrorKind::Corrupt => {
                    damaged.push(UnreadableLine {
                        task: task.clone(),
                        seq: l.seq,
                        key: l.key.to_string(),
                        reason: e.to_string(),
                    })
                }
                Err(e) => return Err(e),
            }
        }
        // A damaged start-from record costs its label, not the listing.
        let last_start = match blobsnap::job::last_start_from(store.as_ref(), &job, task).await {
            Ok(r) => r,
            Err(e) if e.kind() == blobsnap::ErrorKind::Corrupt => {
                tracing::warn!(task = %task, error = %e, "the task's start-from record is damaged: its head is not labelled");
                None
            }
            Err(e) => return Err(e),
        };
        let mut lines: Vec<Line> = Vec::new();
        for (i, c) in history.iter().enumerate() {
            let Some(v2) = c.checkpoint.as_v2() else {
                continue;
            };
            let id_of =
                |c: &blobsnap::checkpoint::CommittedCheckpoint| c.checkpoint.as_v2().map(|o| o.id);
            // A head committed to start from a chosen point carries that point's (older) id:
            // the task's record names the newest such head; an older one shows by its id
            // reappearing below an unrelated checkpoint.
            let start_from = match &last_start {
                Some((point, seq)) if *seq == c.seq => Some(point.clone()),
                _ => history
                    .iter()
                    .skip(i + 2)
                    .find(|older| id_of(older) == Some(v2.id))
                    .filter(|_| history.get(i + 1).and_then(id_of) != Some(v2.id))
                    .map(|older| format!("#{}", older.seq)),
            };
            let repeats = history
                .get(i + 1)
                .filter(|older| id_of(older) == Some(v2.id))
                .filter(|_| start_from.is_none())
                .map(|older| older.seq);
            let mut stores = BTreeMap::new();
            for (store_name, marker) in v2
                .state_checkpoint_markers
                .get(FACTORY_NAME)
                .into_iter()
                .flatten()
            {
                let who = Expected {
                    job_name: &job_name,
                    job_id: &job_id,
                    task_name: task,
                    store_name,
                };
                let snap = match load_snapshot(store.as_ref(), &who, marker).await {
                    Ok(snap) => snap,
                    // One lost or damaged index costs its store's line, not the listing.
                    Err(e)
                        if matches!(
                            e.kind(),
                            blobsnap::ErrorKind::NotFound | blobsnap::ErrorKind::Corrupt
                        ) =>
                    {
                        lost_indexes.push(format!("task {task:?} #{} store {store_name}", c.seq));
                        stores.insert(
                            store_name.clone(),
                            StoreLine {
                                marker: marker.clone(),
                                files: 0,
                                bytes: 0,
                                new_bytes: 0,
                                borrows_from: Vec::new(),
                                unreadable: Some(e.to_string()),
                            },
                        );
                        continue;
                    }
                    Err(e) => {
                        return Err(e.context(format!("checkpoint #{} of task {task:?}", c.seq)))
                    }
                };
                let own = format!("blobs/{}/", snap.marker.checkpoint_id);
                let files = snap.index.present_files();
                stores.insert(
                    store_name.clone(),
                    StoreLine {
                        marker: marker.clone(),
                        files: files.len(),
                        bytes: files.iter().map(|(_, f)| f.file_metadata.size).sum(),
                        new_bytes: files
                            .iter()
                            .filter(|(_, f)| f.blobs.iter().any(|b| b.blob_id.starts_with(&own)))
                            .map(|(_, f)| f.file_metadata.size)
                            .sum(),
                        borrows_from: snap
                            .index
                            .borrowed_from
                            .values()
                            .map(|b| format!("{}/{}/{}", b.job_name, b.job_id, b.savepoint))
                            .collect(),
                        unreadable: None,
                    },
                );
            }
            // A savepoint pins the checkpoint it recorded, by number (a claim or a start-from
            // head repeats its id under another number).
            let pinned_by = savepoints
                .iter()
                .filter(|sp| {
                    sp.checkpoint_of(task).ok().flatten().is_some_and(|s| {
                        s.seq == c.seq && s.checkpoint.as_v2().map(|x| x.id) == Some(v2.id)
                    })
                })
                .map(|sp| sp.name.clone())
                .collect::<Vec<String>>();
            let mut forks: Vec<String> = pinned_by
                .iter()
                .flat_map(|n| forks_of.get(n).into_iter().flatten())
                .filter(|p| &p.task == task)
                .map(|p| format!("{}/{}", p.fork_job, p.fork_id))
                .collect();
            forks.sort();
            forks.dedup();
            lines.push(Line {
                seq: c.seq,
                key: job.checkpoint_key(task, c.seq)?.to_string(),
                checkpoint_id: v2.id.to_string(),
                time_millis: v2.id.millis(),
                // To the millisecond: pasted as `@TIME`, it names this checkpoint.
                time_utc: utc_millis(v2.id.millis()),
                time_local: local_millis(v2.id.millis()),
                input_offsets: v2
                    .input_offsets
                    .iter()
                    .map(|(k, v)| (k.to_key().unwrap_or_else(|_| k.to_string()), v.clone()))
                    .collect(),
                stores,
                savepoints: pinned_by,
                forks,
                repeats,
                start_from,
            });
        }
        out.insert(task.clone(), lines);
    }
    let partial = || {
        let mut why = Vec::new();
        if !damaged.is_empty() {
            why.push(format!(
                "{} checkpoint document(s) cannot be read ({}), the others are listed; `blobsnap forget --checkpoint KEY` removes one (gc and the job's cleanup refuse to delete anything while one is unreadable)",
                damaged.len(),
                damaged
                    .iter()
                    .map(|d| d.key.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !unreadable.is_empty() {
            why.push(format!(
                "{} savepoint record(s) of {job_name}/{job_id} cannot be read ({}), so no checkpoint is labelled with them; `blobsnap savepoint ls` names why, `blobsnap savepoint rm --name NAME` removes one",
                unreadable.len(),
                blobsnap::blob::savepoint::Unreadable::names(&unreadable)
            ));
        }
        if !lost_indexes.is_empty() {
            why.push(format!(
                "the snapshot index of {} cannot be read (listed as UNREADABLE with why), so what it holds is unknown; `blobsnap check` names what else needs it, and a restore of that checkpoint fails (`demo --restore-fallback`, `[job] restore-fallback = true`, or a savepoint restores an older point)",
                lost_indexes.join(", ")
            ));
        }
        if why.is_empty() {
            return Ok(());
        }
        Err(Error::new(
            blobsnap::ErrorKind::Corrupt,
            format!("partial listing: {}", why.join("; ")),
        ))
    };
    let is_partial = !unreadable.is_empty() || !damaged.is_empty() || !lost_indexes.is_empty();
    if json {
        println!(
            "{}",
            serde_json::json!({"schema": 1, "job": job_name, "job-id": job_id, "tasks": out, "removed-checkpoints": removed, "unreadable-checkpoints": damaged, "unreadable-savepoints": unreadable, "partial": is_partial})
        );
        return partial();
    }
    println!("job {job_name}/{job_id}: retained checkpoints, newest first (a store's files and size: the snapshot as a restore writes it; new: what that checkpoint uploaded)");
    for (task, lines) in &out {
        println!("task {task}: {} retained", lines.len());
        for l in lines {
            let offsets = l
                .input_offsets
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
            let again = match (&l.repeats, &l.start_from) {
                (Some(s), _) => format!("  (claim: repeats #{s})"),
                (None, Some(p)) => format!("  (start-from {p}: its offsets and state)"),
                (None, None) if l.input_offsets.is_empty() && l.stores.is_empty() => {
                    "  (claim: the task's first start, nothing committed before)".to_string()
                }
                (None, None) => String::new(),
            };
            println!(
                "  #{:<5} {}  {}  ({})  {offsets}{again}",
                l.seq, l.checkpoint_id, l.time_utc, l.time_local
            );
            for (name, s) in &l.stores {
                if let Some(why) = &s.unreadable {
                    println!("         store {name}: UNREADABLE index: {why}");
                    continue;
                }
                let borrowed = if s.borrows_from.is_empty() {
                    String::new()
                } else {
                    format!(", borrows from {}", s.borrows_from.join(", "))
                };
                println!(
                    "         store {name}: {} files, {}, new {}{borrowed}",
                    s.files,
                    bytesize::ByteSize(s.bytes),
                    bytesize::ByteSize(s.new_bytes)
                );
            }
            if !l.savepoints.is_empty() {
                println!(
                    "         pinned by savepoint(s): {}",
                    l.savepoints.join(", ")
                );
            }
            if !l.forks.is_empty() {
                println!("         borrowed by fork(s): {}", l.forks.join(", "));
            }
        }
    }
    for r in &removed {
        println!(
            "task {}: #{} REMOVED {} ({}): {}  [{}]",
            r.task,
            r.seq,
            utc(r.at_millis),
            local(r.at_millis),
            r.reason,
            r.key
        );
    }
    for d in &damaged {
        println!(
            "task {}: #{} UNREADABLE  {}  [{}]",
            d.task, d.seq, d.reason, d.key
        );
    }
    for u in &unreadable {
        println!("savepoint {}: UNREADABLE  {}", u.name, u.reason);
    }
    partial()
}

/// `ms` since the epoch in this machine's time zone, to the second.
pub(crate) fn local(ms: u64) -> String {
    local_as(ms, "%Y-%m-%d %H:%M:%S %:z")
}

/// `ms` since the epoch in this machine's time zone, to the millisecond (a checkpoint's time,
/// beside its UTC time).
pub(crate) fn local_millis(ms: u64) -> String {
    local_as(ms, "%Y-%m-%d %H:%M:%S%.3f %:z")
}

fn local_as(ms: u64, format: &str) -> String {
    use chrono::TimeZone as _;
    match i64::try_from(ms).map(|ms| chrono::Local.timestamp_millis_opt(ms)) {
        Ok(chrono::LocalResult::Single(t)) => t.format(format).to_string(),
        _ => "-".into(),
    }
}
