//! What a job costs on S3 (`blobsnap cost`): requests and bytes per commit, the bytes its
//! retained snapshots keep stored, and a monthly bill at the prices of [`Prices`] (S3
//! Standard's list prices by default; `[cost]` in the settings overrides them).
//!
//! The estimate is read from what the job has committed, not from a model of its workload:
//! every retained checkpoint of every task is read, and each pair of consecutive ones (by
//! sequence number, a claim's copy of the same checkpoint skipped; a task's first commit,
//! after an empty claim, skipped too: it uploads everything) is one sampled task commit. Per sampled commit, what the backup did:
//!
//! - a store whose marker did not change cost nothing (its marker was carried forward);
//! - a changed store cost one PUT per blob the newer index names and the older does not (a
//!   blob above the multipart threshold: its parts + 2), plus one index PUT; its upload bytes
//!   are those blobs' bytes and the index's;
//! - every task commit adds its checkpoint PUT, and, once the history is full, one
//!   DeleteObjects batch (the history trim's, which carries the snapshots that left retention
//!   at the commit before);
//! - a task that sweeps every `sweep-every-commits` commits adds, spread over those commits, a
//!   listing of the job's scope (one LIST per 1,000 objects), the roots' reads (per task a
//!   LIST and a GET per checkpoint, a GET per distinct index) and the probe (PUT, HEAD,
//!   DELETE).
//!
//! A running job reads nothing between sweeps (the lifecycle tests check it), so the
//! estimate has no GET per commit. The commit interval is the one given, else the median
//! spacing of the sampled checkpoints' ids (their millisecond timestamps).
//!
//! A checkpoint document or index that cannot be read (damaged, gone) does not stop the
//! estimate: it is named in [`CostReport::unreadable_roots`], the report is `partial`, and
//! the estimate is made from the rest — a commit whose changed store's snapshot (or the one
//! before it) cannot be read is not sampled, and what only an unreadable index names is not
//! counted as stored. A store that fails (transient, permanent, I/O) still fails it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::blob::snapshot::{load_snapshot, Expected, LoadedSnapshot, FACTORY_NAME};
use crate::blobstore::{BlobStore, Scope};
use crate::checkpoint::{BlobCheckpointStore, CommittedCheckpoint};
use crate::error::{Error, Result};
use crate::layout::{parse, JobScope, KeyKind};

/// Prices, in dollars. Defaults: S3 Standard's list prices (us-east-1).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Prices {
    /// Per 1,000 PUT, COPY, POST and LIST requests (multipart parts and completions count).
    pub put_per_1000: f64,
    /// Per 1,000 GET and HEAD requests.
    pub get_per_1000: f64,
    /// Per 1,000 DeleteObjects requests (S3 does not charge for deletes).
    pub delete_per_1000: f64,
    /// Per GB-month stored (GB = 2^30 bytes, as AWS bills).
    pub storage_per_gb_month: f64,
}

impl Default for Prices {
    fn default() -> Self {
        Prices {
            put_per_1000: 0.005,
            get_per_1000: 0.0004,
            delete_per_1000: 0.0,
            storage_per_gb_month: 0.023,
        }
    }
}

/// What to estimate.
#[derive(Clone, Debug)]
pub struct CostOptions {
    /// The job.
    pub job_name: String,
    /// The job's id.
    pub job_id: String,
    /// The commit interval; `None`: measured from the checkpoints' ids.
    pub commit_interval: Option<Duration>,
    /// Blobs larger than this go up as multipart uploads (`s3.multipart-threshold`;
    /// `u64::MAX` for the local store).
    pub multipart_threshold: u64,
    /// Their part size (`s3.part-size`).
    pub part_size: u64,
    /// Each task sweeps every this many commits (0: never).
    pub sweep_every_commits: u64,
    /// The job keeps a tiered retention (`last N, every D for W`): its cleanup lists the
    /// task's history before each batch delete and reads each new checkpoint once.
    pub retention_tiers: bool,
    /// The prices.
    pub prices: Prices,
}

/// Requests and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Requests {
    /// PUTs (single, multipart parts and completions) and POSTs.
    pub put: f64,
    /// LIST requests (pages).
    pub list: f64,
    /// GET and HEAD requests.
    pub get: f64,
    /// DeleteObjects requests.
    pub delete: f64,
    /// Bytes uploaded.
    pub upload_bytes: f64,
}

impl Requests {
    fn add(&mut self, o: &Requests) {
        self.put += o.put;
        self.list += o.list;
        self.get += o.get;
        self.delete += o.delete;
        self.upload_bytes += o.upload_bytes;
    }

    fn scaled(&self, k: f64) -> Requests {
        Requests {
            put: self.put * k,
            list: self.list * k,
            get: self.get * k,
            delete: self.delete * k,
            upload_bytes: self.upload_bytes * k,
        }
    }

    /// Dollars at `prices` (LIST is priced as PUT, as S3 does).
    pub fn dollars(&self, prices: &Prices) -> f64 {
        (self.put + self.list) / 1000.0 * prices.put_per_1000
            + self.get / 1000.0 * prices.get_per_1000
            + self.delete / 1000.0 * prices.delete_per_1000
    }
}

/// The monthly bill.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Monthly {
    /// Job commits a month (every task commits once per interval).
    pub commits: f64,
    /// Requests a month.
    pub requests: Requests,
    /// Dollars for requests.
    pub requests_usd: f64,
    /// Dollars for storage (the retained snapshots' bytes, all month).
    pub storage_usd: f64,
    /// The sum.
    pub total_usd: f64,
}

/// What a job costs.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CostReport {
    /// The job.
    pub job: String,
    /// The job's id.
    pub job_id: String,
    /// Tasks with checkpoints.
    pub tasks: u64,
    /// Task commits sampled (pairs of consecutive retained checkpoints).
    pub sampled_task_commits: u64,
    /// Store snapshots in those commits that were carried forward (unchanged, no request).
    pub unchanged_store_commits: u64,
    /// Store snapshots in those commits that changed.
    pub changed_store_commits: u64,
    /// Per task commit, on average.
    pub per_task_commit: Requests,
    /// Per job commit (every task once).
    pub per_commit: Requests,
    /// The commit interval used, seconds.
    pub commit_interval_secs: f64,
    /// Where it came from: `given` or `checkpoints`.
    pub commit_interval_from: String,
    /// Distinct objects the retained snapshots and checkpoints keep (blobs, indexes,
    /// checkpoints).
    pub stored_objects: u64,
    /// Their bytes.
    pub stored_bytes: u64,
    /// Retained checkpoints (points one can restore or roll back to), over all tasks.
    pub retained_points: u64,
    /// Blob bytes of the tasks' latest snapshots (what a single point would keep).
    pub live_bytes: u64,
    /// Blob bytes the older retained points add: the distinct files born in the retention
    /// window that the latest snapshots no longer hold. Stored bytes grow with these, not with
    /// the number of points (which add only their indexes and checkpoint documents).
    pub window_bytes: u64,
    /// Indexes and checkpoint documents: what the points themselves cost.
    pub metadata_bytes: u64,
    /// A manual backup's scope (`blobsnap backup --name`): a "commit" is a backup, and the
    /// month is priced only for storage unless a backup interval is given.
    pub manual: bool,
    /// The prices used.
    pub prices: Prices,
    /// The monthly estimate.
    pub monthly: Monthly,
    /// Whether some checkpoint document or index could not be read (then `unreadable-roots`
    /// names each, and the estimate is made from the rest).
    pub partial: bool,
    /// Every checkpoint document and index that could not be read.
    pub unreadable_roots: Vec<crate::blob::collect::gc::UnreadableRoot>,
}

/// Seconds in the month the bill counts (30 days).
const MONTH_SECS: f64 = 30.0 * 86_400.0;
/// Keys one listing page carries.
const LIST_PAGE: f64 = 1000.0;
const GB: f64 = (1u64 << 30) as f64;

/// Estimate what the job of `opts` costs from its retained checkpoints (reads every
/// retained checkpoint and index; writes nothing). `NotFound` when no task has two retained
/// checkpoints to compare and no interval can be measured.
pub async fn estimate(store: &Arc<dyn BlobStore>, opts: &CostOptions) -> Result<CostReport> {
    let job = JobScope::new(&opts.job_name, &opts.job_id)?;
    let cps = BlobCheckpointStore::new(Arc::clone(store), job.clone());
    let tasks = tasks_with_checkpoints(store.as_ref(), &job).await?;
    if tasks.is_empty() {
        return Err(Error::not_found(format!(
            "job {}/{} has no checkpoints in {store}",
            opts.job_name, opts.job_id
        )));
    }
    let mut report = CostReport {
        job: opts.job_name.clone(),
        job_id: opts.job_id.clone(),
        tasks: tasks.len() as u64,
        prices: opts.prices,
        ..Default::default()
    };
    let mut sampled = Requests::default();
    let mut spacings: Vec<u64> = Vec::new();
    // Every stored object, by key: size (blobs, indexes, checkpoints of the retained history).
    let mut stored: HashMap<String, u64> = HashMap::new();
    let mut blob_bytes: HashMap<String, u64> = HashMap::new();
    let mut live: HashMap<String, u64> = HashMap::new();
    let mut sweep_reads = Requests::default();
    let mut unreadable: Vec<crate::blob::collect::gc::UnreadableRoot> = Vec::new();
    for task in &tasks {
        // Every document on its own: one that cannot be read is named, the rest estimated.
        let mut history =
            crate::blob::collect::gc::readable_history(&cps, &job, task, &mut unreadable).await?;
        history.sort_by_key(|c| c.seq);
        // A claim writes the last checkpoint again under the next number: one commit.
        history.dedup_by(|b, a| same_checkpoint(a, b));
        report.retained_points += history.len() as u64;
        sweep_reads.list += 1.0;
        sweep_reads.get += history.len() as f64;
        for c in &history {
            stored.insert(
                format!("checkpoint {task} {}", c.seq),
                c.checkpoint.to_json().map(|j| j.len() as u64).unwrap_or(0),
            );
        }
        let mut snapshots: HashMap<(String, String), LoadedSnapshot> = HashMap::new();
        // The snapshots whose index cannot be read (named in `unreadable`).
        let mut lost: HashSet<(String, String)> = HashSet::new();
        for c in &history {
            for (name, marker) in markers(c) {
                let both = (name.clone(), marker.clone());
                if snapshots.contains_key(&both) || lost.contains(&both) {
                    continue;
                }
                let who = Expected {
                    job_name: &opts.job_name,
                    job_id: &opts.job_id,
                    task_name: task,
                    store_name: &name,
                };
                let snap = match load_snapshot(store.as_ref(), &who, &marker).await {
                    Ok(snap) => snap,
                    Err(e) if crate::blob::collect::gc::is_unreadable(&e) => {
                        let scope = job.store(task, &name)?;
                        let key = marker
                            .parse::<crate::index::IndexMarker>()
                            .ok()
                            .and_then(|m| scope.index_key(&m).ok())
                            .map_or_else(|| marker.clone(), |k| k.to_string());
                        unreadable.push(crate::blob::collect::gc::UnreadableRoot {
                            what: "index".into(),
                            key,
                            root: format!("task {task:?} checkpoint #{} store {name}", c.seq),
                            kind: e.kind().as_str().into(),
                            reason: e.to_string(),
                            may_name: scope.scope().clone(),
                        });
                        lost.insert(both);
                        continue;
                    }
                    Err(e) => return Err(e.context(format!("cost: task {task:?} store {name:?}"))),
                };
                sweep_reads.get += 1.0;
                let index_len = snap.index.to_bytes().map(|b| b.len() as u64).unwrap_or(0);
                stored.insert(
                    snap.scope.index_key(&snap.marker)?.as_str().into(),
                    index_len,
                );
                for (_, f) in snap.index.present_files() {
                    for (key, size) in blob_sizes(&snap, f)? {
                        stored.insert(key.clone(), size);
                        blob_bytes.insert(key, size);
                    }
                }
                snapshots.insert((name, marker), snap);
            }
        }
        if let Some(latest) = history.last() {
            for (name, marker) in markers(latest) {
                if let Some(snap) = snapshots.get(&(name, marker)) {
                    for (_, f) in snap.index.present_files() {
                        for (key, size) in blob_sizes(snap, f)? {
                            live.insert(key, size);
                        }
                    }
                }
            }
        }
        for pair in history.windows(2) {
            let (older, newer) = (&pair[0], &pair[1]);
            if let (Some(a), Some(b)) = (older.checkpoint.as_v2(), newer.checkpoint.as_v2()) {
                spacings.push(b.id.millis().saturating_sub(a.id.millis()));
            }
            let before: BTreeMap<String, String> = markers(older).into_iter().collect();
            if before.is_empty() {
                // The task's first commit (after its first claim, an empty checkpoint):
                // everything is new, which is not what a commit costs.
                continue;
            }
            // A commit whose snapshots cannot all be read is not sampled: what it uploaded
            // is unknown.
            if markers(older)
                .into_iter()
                .chain(markers(newer))
                .any(|m| lost.contains(&m))
            {
                continue;
            }
            let mut commit = Requests {
                put: 1.0, // the checkpoint
                upload_bytes: newer
                    .checkpoint
                    .to_json()
                    .map(|j| j.len() as f64)
                    .unwrap_or(0.0),
                ..Default::default()
            };
            for (name, marker) in markers(newer) {
                if before.get(&name) == Some(&marker) {
                    report.unchanged_store_commits += 1;
                    continue;
                }
                report.changed_store_commits += 1;
                let Some(snap) = snapshots.get(&(name.clone(), marker.clone())) else {
                    continue;
                };
                let had: HashSet<String> = before
                    .get(&name)
                    .and_then(|m| snapshots.get(&(name.clone(), m.clone())))
                    .map(blob_keys)
                    .transpose()?
                    .unwrap_or_default();
                for (_, f) in snap.index.present_files() {
                    for (key, size) in blob_sizes(snap, f)? {
                        if !had.contains(&key) {
                            commit.put += put_requests(size, opts);
                            commit.upload_bytes += size as f64;
                        }
                    }
                }
                commit.put += 1.0; // the index
                commit.upload_bytes += snap.index.to_bytes().map(|b| b.len() as f64).unwrap_or(0.0);
            }
            // Steady state: one batch every commit, the trim's, carrying the last cleanup's,
            // and the LIST of the job's savepoints right before it (they may pin a key).
            commit.delete += 1.0;
            commit.list += 1.0;
            if opts.retention_tiers {
                // The history's LIST before the delete, and the new checkpoint read once.
                commit.list += 1.0;
                commit.get += 1.0;
            }
            sampled.add(&commit);
            report.sampled_task_commits += 1;
        }
    }
    report.partial = !unreadable.is_empty();
    report.unreadable_roots = unreadable;
    report.stored_objects = stored.len() as u64;
    report.stored_bytes = stored.values().sum();
    report.live_bytes = live.values().sum();
    let blobs: u64 = blob_bytes.values().sum();
    report.window_bytes = blobs.saturating_sub(report.live_bytes);
    report.metadata_bytes = report.stored_bytes.saturating_sub(blobs);
    report.manual = opts.job_name == crate::blob::time::manual::JOB;

    let interval = match opts.commit_interval {
        Some(d) => {
            report.commit_interval_from = "given".into();
            d.as_secs_f64()
        }
        None if opts.job_name == crate::blob::time::manual::JOB => {
            report.commit_interval_from = "none (manual backups)".into();
            0.0
        }
        None => {
            spacings.sort_unstable();
            let Some(median) = spacings.get(spacings.len() / 2) else {
                return Err(Error::not_found(format!(
                    "job {}/{}: no task has two retained checkpoints to measure the commit interval from; give it (--commit-interval)",
                    opts.job_name, opts.job_id
                )));
            };
            report.commit_interval_from = "checkpoints".into();
            (*median as f64 / 1000.0).max(0.001)
        }
    };
    report.commit_interval_secs = interval;
    if report.sampled_task_commits > 0 {
        report.per_task_commit = sampled.scaled(1.0 / report.sampled_task_commits as f64);
    }
    if opts.sweep_every_commits > 0 {
        // One task's sweep: list the scope, read every task's roots, the probe.
        let sweep = Requests {
            list: sweep_reads.list + (report.stored_objects as f64 / LIST_PAGE).ceil().max(1.0),
            get: sweep_reads.get + 1.0,
            put: 1.0,
            delete: 1.0,
            upload_bytes: 0.0,
        };
        report
            .per_task_commit
            .add(&sweep.scaled(1.0 / opts.sweep_every_commits as f64));
    }
    report.per_commit = report.per_task_commit.scaled(report.tasks as f64);
    // Manual backups are made by hand or by a schedule: their spacing is no rate to bill a
    // month at. Only a given interval prices their requests.
    let commits = if report.manual && opts.commit_interval.is_none() {
        0.0
    } else {
        MONTH_SECS / interval
    };
    let requests = report.per_commit.scaled(commits);
    let requests_usd = requests.dollars(&opts.prices);
    let storage_usd = report.stored_bytes as f64 / GB * opts.prices.storage_per_gb_month;
    report.monthly = Monthly {
        commits,
        requests,
        requests_usd,
        storage_usd,
        total_usd: requests_usd + storage_usd,
    };
    Ok(report)
}

/// The tasks that have checkpoints: one listing of `checkpoints/`.
async fn tasks_with_checkpoints(store: &dyn BlobStore, job: &JobScope) -> Result<Vec<String>> {
    use futures::TryStreamExt as _;
    let scope: Scope = job.scope().child("checkpoints")?;
    let mut tasks = std::collections::BTreeSet::new();
    let mut listing = store.list(&scope);
    while let Some(m) = listing.try_next().await? {
        if let Some(KeyKind::Checkpoint { task, .. }) = parse(&m.key).map(|p| p.kind) {
            tasks.insert(task);
        }
    }
    Ok(tasks.into_iter().collect())
}

fn same_checkpoint(a: &CommittedCheckpoint, b: &CommittedCheckpoint) -> bool {
    match (a.checkpoint.as_v2(), b.checkpoint.as_v2()) {
        (Some(x), Some(y)) => x.id == y.id,
        _ => false,
    }
}

/// The blob backend's markers of a checkpoint: store → marker.
fn markers(c: &CommittedCheckpoint) -> Vec<(String, String)> {
    c.checkpoint
        .as_v2()
        .and_then(|v2| v2.state_checkpoint_markers.get(FACTORY_NAME))
        .map(|m| m.iter().map(|(s, k)| (s.clone(), k.clone())).collect())
        .unwrap_or_default()
}

/// A file's own blobs with their sizes (blobsnap writes one blob a file; a Samza index's
/// several blobs share the file's size evenly for the estimate).
fn blob_sizes(snap: &LoadedSnapshot, f: &crate::index::FileIndex) -> Result<Vec<(String, u64)>> {
    let n = f.blobs.len().max(1) as u64;
    f.blobs
        .iter()
        // A fork's borrowed blobs are stored (and billed) under the job they came from.
        .filter(|b| crate::blob::snapshot::BlobScopes::is_own(&b.blob_id))
        .map(|b| {
            Ok((
                snap.blobs.key(&b.blob_id)?.as_str().to_owned(),
                f.file_metadata.size / n,
            ))
        })
        .collect()
}

fn blob_keys(snap: &LoadedSnapshot) -> Result<HashSet<String>> {
    let mut keys = HashSet::new();
    for (_, f) in snap.index.present_files() {
        for (k, _) in blob_sizes(snap, f)? {
            keys.insert(k);
        }
    }
    Ok(keys)
}

/// Requests to upload one blob of `size` bytes: one PUT, or a multipart upload's parts, its
/// creation and its completion.
fn put_requests(size: u64, opts: &CostOptions) -> f64 {
    if size > opts.multipart_threshold && opts.part_size > 0 {
        (size.div_ceil(opts.part_size) + 2) as f64
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_blobs_cost_their_parts_and_two() {
        let opts = CostOptions {
            job_name: "j".into(),
            job_id: "1".into(),
            commit_interval: None,
            multipart_threshold: 64 << 20,
            part_size: 16 << 20,
            sweep_every_commits: 0,
            retention_tiers: false,
            prices: Prices::default(),
        };
        assert_eq!(put_requests(1, &opts), 1.0);
        assert_eq!(put_requests(64 << 20, &opts), 1.0);
        assert_eq!(put_requests((64 << 20) + 1, &opts), 5.0 + 2.0);
    }

    #[test]
    fn list_prices_by_default() {
        let r = Requests {
            put: 1_000_000.0,
            list: 0.0,
            get: 1_000_000.0,
            delete: 1_000_000.0,
            upload_bytes: 0.0,
        };
        let d = r.dollars(&Prices::default());
        assert!((d - (5.0 + 0.4)).abs() < 1e-9, "{d}");
    }
}
