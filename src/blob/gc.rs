//! The sweep: delete what no retained snapshot of a job needs — blobs and indexes of uploads
//! whose checkpoint was never written (a crash between upload and commit), of stores or tasks
//! that were dropped, of snapshots a failed cleanup left behind (DESIGN §10).
//!
//! **Plan, then execute**; [`plan_sweep`] deletes nothing, so a dry run prints exactly what a
//! real run deletes.
//!
//! - Roots: every checkpoint in the history of every task of the job (the history is trimmed
//!   to the retention). The sweep **fails closed**: if any task's checkpoints or any root index
//!   cannot be read, it plans nothing.
//! - Live: every index named by a root, and every blob those indexes list.
//! - Candidates: objects under `tasks/` whose key has a known shape (`…/blobs/<id>/<sha256>`,
//!   `…/index/<id>.<sha256>.json`), that are not live and were last modified before
//!   `sweep start − grace`, with the sweep start read from the **server's** clock (the
//!   last-modified of a probe object). Never candidates: anything under `checkpoints/`,
//!   `scope.json`, unknown keys (reported).
//! - Incomplete multipart uploads (or abandoned local temp files) older than the grace are
//!   aborted.
//!
//! Why this is safe while the job runs: blob keys are written once and never overwritten, so an
//! object older than the cutoff is never written again; an upload whose first PUT is older than
//! half the grace is abandoned before it can commit (the backup side enforces it); and an
//! upload in flight only reuses blobs of the task's newest committed snapshot, which is a root.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt as _;
use serde::Serialize;

use super::{load_snapshot, Expected, FACTORY_NAME};
use crate::blobstore::{BlobKey, BlobStore, MultipartUpload, Probe, PutBody, PutOptions, Scope};
use crate::checkpoint::{BlobCheckpointStore, CheckpointStore};
use crate::error::{Error, Result};
use crate::layout::{parse, JobScope, KeyKind};

/// What to sweep.
#[derive(Clone, Debug)]
pub struct SweepSettings {
    /// The job.
    pub job_name: String,
    /// The job's id.
    pub job_id: String,
    /// Only this task (all tasks when `None`); roots are always read for every task.
    pub task: Option<String>,
    /// Only this store.
    pub store: Option<String>,
    /// Objects younger than this are never deleted.
    pub grace: Duration,
}

/// One object the sweep will delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Doomed {
    /// Its key.
    pub key: String,
    /// Its size.
    pub size: u64,
}

/// What a sweep will do.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SweepPlan {
    /// The server-clock time the sweep started (ms since the epoch).
    pub started_millis: u64,
    /// Objects last modified before this (ms) may be deleted.
    pub cutoff_millis: u64,
    /// Root checkpoints read.
    pub roots: u64,
    /// Live objects.
    pub live: u64,
    /// Objects to delete.
    pub delete: Vec<Doomed>,
    /// Bytes freed.
    pub bytes: u64,
    /// Not live, but younger than the grace: kept.
    pub kept_young: u64,
    /// Keys of no known shape under `tasks/`: reported, never deleted.
    pub unknown: Vec<String>,
    /// Incomplete uploads to abort (begun before the cutoff).
    #[serde(skip)]
    pub uploads: Vec<MultipartUpload>,
    /// Where they were listed: the job's scope.
    #[serde(skip)]
    pub uploads_scope: Option<Scope>,
    /// Their keys (for printing).
    pub upload_keys: Vec<String>,
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The server's current time: PUT a probe object under the job scope, HEAD it, delete it.
async fn server_now(store: &dyn BlobStore, job: &JobScope) -> Result<SystemTime> {
    let probe = job
        .scope()
        .key(&format!("gc-probe-{:016x}", rand::random::<u64>()))?;
    store
        .put(
            &probe,
            PutBody::Bytes(bytes::Bytes::from_static(b"probe")),
            PutOptions::default(),
        )
        .await?;
    let meta = store.head(&probe).await;
    let _ = store.delete_many(std::slice::from_ref(&probe)).await;
    meta?.last_modified.ok_or_else(|| {
        Error::permanent(format!(
            "{store}: objects have no last-modified time; cannot sweep safely"
        ))
    })
}

/// Plan a sweep (deletes nothing). Its clock is the server's: a probe object is written,
/// read back for its last-modified time and deleted.
pub async fn plan_sweep(
    shared: &std::sync::Arc<dyn BlobStore>,
    settings: &SweepSettings,
) -> Result<SweepPlan> {
    let job = JobScope::new(&settings.job_name, &settings.job_id)?;
    let started = server_now(shared.as_ref(), &job).await?;
    plan_sweep_at(shared, settings, started).await
}

/// Plan a sweep that writes nothing at all (`blobsnap gc --dry-run`): the cutoff is taken from
/// this machine's clock instead of the server's (no probe object), so near the cutoff it may
/// differ from what a real sweep would delete by the clocks' skew.
pub async fn plan_sweep_read_only(
    shared: &std::sync::Arc<dyn BlobStore>,
    settings: &SweepSettings,
) -> Result<SweepPlan> {
    plan_sweep_at(
        shared,
        settings,
        crate::backend::Clock::now(&crate::backend::SystemClock),
    )
    .await
}

async fn plan_sweep_at(
    shared: &std::sync::Arc<dyn BlobStore>,
    settings: &SweepSettings,
    started: SystemTime,
) -> Result<SweepPlan> {
    let store = shared.as_ref();
    let job = JobScope::new(&settings.job_name, &settings.job_id)?;
    let cutoff = started
        .checked_sub(settings.grace)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut plan = SweepPlan {
        started_millis: millis(started),
        cutoff_millis: millis(cutoff),
        ..Default::default()
    };

    // Roots: every task's history. Tasks are found from checkpoints/ and from tasks/.
    let mut tasks: HashSet<String> = HashSet::new();
    let listing: Vec<_> = store.list(job.scope()).try_collect().await?;
    for m in &listing {
        if let Some(task) = parse(&m.key).as_ref().and_then(|p| p.kind.task()) {
            tasks.insert(task.to_string());
        }
    }
    let cps = BlobCheckpointStore::new(std::sync::Arc::clone(shared), job.clone());
    let mut live: HashSet<BlobKey> = HashSet::new();
    for task in &tasks {
        let history = cps.history(task, usize::MAX).await.map_err(|e| {
            e.context(format!(
                "sweep reads the roots of task {task:?} (nothing deleted)"
            ))
        })?;
        for c in history {
            plan.roots += 1;
            let Some(v2) = c.checkpoint.as_v2() else {
                continue;
            };
            let Some(markers) = v2.state_checkpoint_markers.get(FACTORY_NAME) else {
                continue;
            };
            for (store_name, marker) in markers {
                let who = Expected {
                    job_name: &settings.job_name,
                    job_id: &settings.job_id,
                    task_name: task,
                    store_name,
                };
                let snap = load_snapshot(store, &who, marker).await.map_err(|e| {
                    e.context(format!(
                        "sweep: root of task {task:?} store {store_name:?} (nothing deleted)"
                    ))
                })?;
                live.insert(snap.scope.index_key(&snap.marker)?);
                for (_, f) in snap.index.present_files() {
                    for b in &f.blobs {
                        live.insert(snap.scope.key(&b.blob_id)?);
                    }
                }
            }
        }
    }
    plan.live = live.len() as u64;

    for m in listing {
        let (task, store_name) = match parse(&m.key).map(|p| p.kind) {
            Some(KeyKind::Index { task, store, .. } | KeyKind::Blob { task, store, .. }) => {
                (task, store)
            }
            Some(KeyKind::Unknown { swept: true, .. }) => {
                plan.unknown.push(m.key.as_str().to_string());
                continue;
            }
            // checkpoints/, writers/, scope.json, probes: never swept.
            _ => continue,
        };
        if settings.task.as_ref().is_some_and(|t| *t != task)
            || settings.store.as_ref().is_some_and(|s| *s != store_name)
            || live.contains(&m.key)
        {
            continue;
        }
        let young = m.last_modified.is_none_or(|t| t >= cutoff);
        if young {
            plan.kept_young += 1;
            continue;
        }
        plan.bytes += m.size;
        plan.delete.push(Doomed {
            key: m.key.as_str().to_string(),
            size: m.size,
        });
    }
    if store.capabilities(Probe::Never).await?.multipart_listing {
        plan.uploads_scope = Some(job.scope().clone());
        for u in store.incomplete_uploads(job.scope(), None).await? {
            if u.begun_before(cutoff) {
                plan.upload_keys.push(u.key.as_str().to_string());
                plan.uploads.push(u);
            }
        }
    }
    Ok(plan)
}

/// Carry out a plan: delete its objects, abort its uploads. Returns the number deleted.
pub async fn execute_sweep(store: &dyn BlobStore, plan: &SweepPlan) -> Result<u64> {
    execute_sweep_with_progress(store, plan, &std::sync::atomic::AtomicU64::new(0)).await
}

/// [`execute_sweep`], adding the bytes freed so far to `freed` as it goes.
pub async fn execute_sweep_with_progress(
    store: &dyn BlobStore,
    plan: &SweepPlan,
    freed: &std::sync::atomic::AtomicU64,
) -> Result<u64> {
    let keys: Vec<BlobKey> = plan
        .delete
        .iter()
        .map(|d| BlobKey::new(d.key.clone()))
        .collect::<Result<_>>()?;
    let mut deleted = 0;
    for chunk in keys.chunks(1000) {
        let failures = store.delete_many(chunk).await?;
        if let Some((k, e)) = failures.into_iter().next() {
            return Err(e.context(format!("sweep: delete {k}")));
        }
        deleted += chunk.len() as u64;
        let start = deleted as usize - chunk.len();
        let bytes: u64 = plan.delete[start..start + chunk.len()]
            .iter()
            .map(|d| d.size)
            .sum();
        freed.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        crate::crash::point("sweep.mid-delete");
    }
    if let (false, Some(scope)) = (plan.uploads.is_empty(), &plan.uploads_scope) {
        // The plan's cutoff: the uploads it listed, less any finished since (an upload begun
        // after planning is younger than the cutoff).
        let cutoff = SystemTime::UNIX_EPOCH + Duration::from_millis(plan.cutoff_millis);
        store.incomplete_uploads(scope, Some(cutoff)).await?;
    }
    metrics::counter!("blobsnap_gc_sweep_objects_deleted_total").increment(deleted);
    metrics::counter!("blobsnap_gc_sweep_bytes_deleted_total").increment(plan.bytes);
    Ok(deleted)
}
