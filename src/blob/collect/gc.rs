//! The sweep: delete what no retained snapshot of a job needs — blobs and indexes of uploads
//! whose checkpoint was never written (a crash between upload and commit), of stores or tasks
//! that were dropped, of snapshots a failed cleanup left behind (DESIGN §10).
//!
//! **Decide, then delete**: [`sweep`] loads every root before it deletes anything, then
//! streams the listing page by page and deletes each page's doomed objects in one batch, in
//! bounded memory whatever the scope's size; its dry run makes the same decisions and deletes
//! nothing. [`plan_sweep`] + [`execute_sweep`] do the same with the whole plan in memory (for
//! small scopes and tests: the plan can be inspected before anything is deleted).
//!
//! - Roots: every checkpoint in the history of every task of the job (the history is trimmed
//!   to the retention), every savepoint of the job ([`crate::blob::time::savepoint`]), and
//!   every prepared history record ([`crate::blob::time::prepared`]: a snapshot whose commit
//!   point is another checkpoint manager's, Samza's Kafka one). The sweep **fails closed**: if
//!   any task's checkpoints, any prepared record or any root index cannot be read, it plans
//!   nothing.
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

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, SystemTime};

use futures::TryStreamExt as _;
use serde::Serialize;

use crate::blob::snapshot::{load_snapshot, Expected, FACTORY_NAME};
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
#[serde(rename_all = "kebab-case")]
pub struct SweepPlan {
    /// The server-clock time the sweep started (ms since the epoch).
    pub started_millis: u64,
    /// Objects last modified before this (ms) may be deleted.
    pub cutoff_millis: u64,
    /// Root checkpoints read.
    pub roots: u64,
    /// Live objects.
    pub live: u64,
    /// Objects to delete (empty in a [`sweep`]'s report: they went to its callback).
    pub delete: Vec<Doomed>,
    /// How many objects the plan deletes.
    pub doomed: u64,
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
pub async fn server_now(store: &dyn BlobStore, job: &JobScope) -> Result<SystemTime> {
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
    refuse_foreign_engine(shared.as_ref(), settings).await?;
    let mut doomed = Vec::new();
    let mut plan = decide(shared, settings, started, None, &mut |d: &Doomed| {
        doomed.push(d.clone())
    })
    .await?;
    plan.delete = doomed;
    Ok(plan)
}

/// A sweep that streams: every root is loaded first, then the listing is decided page by
/// page and (unless `dry_run`) each page's doomed objects are deleted in one batch before the
/// next page is read. Memory holds the live set (what the retained snapshots reference), one
/// page and one batch — never the listing nor the whole list of what is deleted, so a scope of
/// millions of objects sweeps in bounded memory. `on_doomed` sees every object deleted (or,
/// in a dry run, that a real run would delete) as it is decided. A dry run takes its cutoff
/// from this machine's clock and writes nothing; a real run reads the server's clock first
/// (a probe object). Returns the plan's counts, with `delete` left empty.
pub async fn sweep(
    shared: &std::sync::Arc<dyn BlobStore>,
    settings: &SweepSettings,
    dry_run: bool,
    on_doomed: &mut (dyn FnMut(&Doomed) + Send),
) -> Result<SweepReport> {
    let job = JobScope::new(&settings.job_name, &settings.job_id)?;
    // Before anything is written (the clock probe).
    refuse_foreign_engine(shared.as_ref(), settings).await?;
    let started = if dry_run {
        crate::backend::Clock::now(&crate::backend::SystemClock)
    } else {
        server_now(shared.as_ref(), &job).await?
    };
    let mut batch = DeleteBatch {
        store: shared.as_ref(),
        keys: Vec::new(),
        deleted: 0,
        live: !dry_run,
    };
    let plan = decide(shared, settings, started, Some(&mut batch), on_doomed).await?;
    batch.flush().await?;
    if !dry_run {
        abort_stale_uploads(shared.as_ref(), &plan).await?;
        metrics::counter!("blobsnap_gc_sweep_objects_deleted_total").increment(batch.deleted);
        metrics::counter!("blobsnap_gc_sweep_bytes_deleted_total").increment(plan.bytes);
    }
    Ok(SweepReport {
        deleted: batch.deleted,
        plan,
    })
}

/// What [`sweep`] did.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SweepReport {
    /// Its decisions' counts (`delete` empty: the objects went to the callback).
    #[serde(flatten)]
    pub plan: SweepPlan,
    /// Objects deleted (0 in a dry run).
    pub deleted: u64,
}

/// The deletes of a streaming sweep, one DeleteObjects batch at a time.
struct DeleteBatch<'a> {
    store: &'a dyn BlobStore,
    keys: Vec<BlobKey>,
    deleted: u64,
    /// False in a dry run: nothing is deleted.
    live: bool,
}

impl DeleteBatch<'_> {
    async fn push(&mut self, key: BlobKey) -> Result<()> {
        if !self.live {
            return Ok(());
        }
        self.keys.push(key);
        if self.keys.len() >= DELETE_BATCH {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let failures = self.store.delete_many(&self.keys).await?;
        if let Some((k, e)) = failures.into_iter().next() {
            return Err(e.context(format!("sweep: delete {k}")));
        }
        self.deleted += self.keys.len() as u64;
        self.keys.clear();
        crate::crash::point("sweep.mid-delete");
        Ok(())
    }
}

/// Keys one DeleteObjects request carries.
const DELETE_BATCH: usize = 1000;

/// A scope another engine writes keeps its commits where the roots are not read: refused
/// (its owner record names the engine, [`crate::blob::collect::admin::refuse_foreign_engine`]).
async fn refuse_foreign_engine(store: &dyn BlobStore, settings: &SweepSettings) -> Result<()> {
    let job = JobScope::new(&settings.job_name, &settings.job_id)?;
    let record = crate::blob::collect::admin::read_scope_record(store, &job).await?;
    crate::blob::collect::admin::refuse_foreign_engine(&job, record.as_ref())
}

/// Decide a sweep: load every root, then stream the listing of the sweep's area (the task's
/// or the store's under `tasks/` when the settings name one, all of `tasks/` otherwise),
/// handing each doomed object to `on_doomed` and to `batch` (which deletes as it fills).
async fn decide(
    shared: &std::sync::Arc<dyn BlobStore>,
    settings: &SweepSettings,
    started: SystemTime,
    mut batch: Option<&mut DeleteBatch<'_>>,
    on_doomed: &mut (dyn FnMut(&Doomed) + Send),
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

    let roots = read_roots(shared, &job, &settings.job_name, &settings.job_id).await?;
    plan.roots = roots.roots;
    let live: HashSet<BlobKey> = roots.history.union(&roots.savepoints).cloned().collect();
    plan.live = live.len() as u64;

    let area = match (&settings.task, &settings.store) {
        (Some(task), Some(store_name)) => job.store(task, store_name)?.scope().clone(),
        (Some(task), None) => job.tasks()?.escaped(task)?,
        (None, _) => job.tasks()?,
    };
    let mut listing = store.list(&area);
    while let Some(m) = listing.try_next().await? {
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
        plan.doomed += 1;
        on_doomed(&Doomed {
            key: m.key.as_str().to_string(),
            size: m.size,
        });
        if let Some(b) = batch.as_deref_mut() {
            b.push(m.key).await?;
        }
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

/// Abort the uploads a plan listed as stale, with the plan's cutoff: those it listed, less
/// any finished since (an upload begun after planning is younger than the cutoff).
async fn abort_stale_uploads(store: &dyn BlobStore, plan: &SweepPlan) -> Result<()> {
    if let (false, Some(scope)) = (plan.uploads.is_empty(), &plan.uploads_scope) {
        let cutoff = SystemTime::UNIX_EPOCH + Duration::from_millis(plan.cutoff_millis);
        store.incomplete_uploads(scope, Some(cutoff)).await?;
    }
    Ok(())
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
    abort_stale_uploads(store, plan).await?;
    metrics::counter!("blobsnap_gc_sweep_objects_deleted_total").increment(deleted);
    metrics::counter!("blobsnap_gc_sweep_bytes_deleted_total").increment(plan.bytes);
    Ok(deleted)
}

/// What a job's roots keep alive: the keys named by its tasks' retained checkpoints, and by
/// its savepoints; fails closed (an unreadable root is an error naming it and how to repair).
#[derive(Default)]
pub(crate) struct Roots {
    /// Checkpoints and savepoints read.
    pub roots: u64,
    /// Index and blob keys named by a retained checkpoint.
    pub history: HashSet<BlobKey>,
    /// Index and blob keys named by a savepoint.
    pub savepoints: HashSet<BlobKey>,
}

/// A root that a partial read of the roots (`usage`, `cost`) could not read: a
/// task's checkpoint document, the snapshot index a root names, or a savepoint record.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct UnreadableRoot {
    /// `checkpoint` (a task's checkpoint document), `index` (the snapshot index a checkpoint
    /// or savepoint names) or `savepoint` (a savepoint record).
    pub what: String,
    /// The key that cannot be read.
    pub key: String,
    /// The root: `task "Partition 1" checkpoint #146 store counts` (an index, or `… savepoint
    /// NAME …`), `task "Partition 1" checkpoint #146` (a document), `savepoint NAME`.
    pub root: String,
    /// Why, as an error kind: `not-found`, `corrupt`, `invalid-input`.
    pub kind: String,
    /// Why, in words.
    pub reason: String,
    /// Where what it names may lie: objects there that no readable root names may be live.
    #[serde(skip)]
    pub(crate) may_name: Scope,
}

/// The readable checkpoints of `task` (every document read on its own, in number order),
/// each document that cannot be read named in `bad`; removal records are passed over. A
/// failed listing, or a document that fails otherwise, is an error.
pub(crate) async fn readable_history(
    cps: &BlobCheckpointStore,
    job: &JobScope,
    task: &str,
    bad: &mut Vec<UnreadableRoot>,
) -> Result<Vec<crate::checkpoint::CommittedCheckpoint>> {
    let mut history = Vec::new();
    for l in cps.listing(task).await? {
        match l.record {
            Ok(crate::checkpoint::Record::Checkpoint(c)) => history.push(c),
            Ok(crate::checkpoint::Record::Removed { .. }) => {}
            Err(e) if is_unreadable(&e) => bad.push(UnreadableRoot {
                what: "checkpoint".into(),
                key: l.key.to_string(),
                root: format!("task {task:?} checkpoint #{}", l.seq),
                kind: e.kind().as_str().into(),
                reason: e.to_string(),
                may_name: job.tasks()?.escaped(task)?,
            }),
            Err(e) => return Err(e),
        }
    }
    Ok(history)
}

impl UnreadableRoot {
    /// Whether `key` lies where this root may name objects.
    pub fn may_name(&self, key: &BlobKey) -> bool {
        key.as_str().starts_with(self.may_name.as_str())
    }

    /// What removes or repairs roots like `roots`, for a message: one clause per kind.
    pub fn ways_out(roots: &[UnreadableRoot], job_flags: &str) -> String {
        let mut out = Vec::new();
        if roots.iter().any(|r| r.what == "index") {
            out.push(format!(
                "`blobsnap check {job_flags}` names every checkpoint and savepoint that needs an unreadable index; `blobsnap forget --checkpoint KEY` removes an older checkpoint that names one (its key from `blobsnap checkpoints --json`), `blobsnap savepoint rm` a savepoint; the newest checkpoint of a task goes once the job commits past it (`restore-fallback`), or restore the index from a copy"
            ));
        }
        if roots.iter().any(|r| r.what == "checkpoint") {
            out.push(format!(
                "`blobsnap checkpoints {job_flags}` names every unreadable checkpoint document by its key and why, `blobsnap forget --checkpoint KEY` removes one"
            ));
        }
        if roots.iter().any(|r| r.what == "savepoint") {
            out.push(format!(
                "`blobsnap savepoint ls {job_flags}` names every unreadable savepoint record and why, `blobsnap savepoint rm {job_flags} --name NAME` removes one"
            ));
        }
        out.join("; ")
    }
}

/// Whether an error reading a root says the root is unreadable (gone, damaged, of a newer
/// format) rather than that the store failed (transient, permanent, I/O).
pub(crate) fn is_unreadable(e: &Error) -> bool {
    matches!(
        e.kind(),
        crate::error::ErrorKind::NotFound
            | crate::error::ErrorKind::Corrupt
            | crate::error::ErrorKind::InvalidInput
    )
}

/// Read every root of `job` ([`Roots`]).
pub(crate) async fn read_roots(
    shared: &std::sync::Arc<dyn BlobStore>,
    job: &JobScope,
    job_name: &str,
    job_id: &str,
) -> Result<Roots> {
    read_roots_with(shared, job, job_name, job_id, None).await
}

/// Read every root of `job` that can be read, and name each one that cannot (gone, damaged,
/// of a newer format) instead of failing: for reports (`usage`), never for a collector — what
/// an unreadable root keeps alive is unknown. A store that fails (transient, permanent,
/// I/O) is still an error, as is a fork's pin on a savepoint that has no record.
pub(crate) async fn read_roots_partial(
    shared: &std::sync::Arc<dyn BlobStore>,
    job: &JobScope,
    job_name: &str,
    job_id: &str,
) -> Result<(Roots, Vec<UnreadableRoot>)> {
    let mut bad = Vec::new();
    let roots = read_roots_with(shared, job, job_name, job_id, Some(&mut bad)).await?;
    Ok((roots, bad))
}

/// [`read_roots`] (`partial` `None`: the first unreadable root is the error) or
/// [`read_roots_partial`] (each unreadable root goes to `partial`).
async fn read_roots_with(
    shared: &std::sync::Arc<dyn BlobStore>,
    job: &JobScope,
    job_name: &str,
    job_id: &str,
    mut partial: Option<&mut Vec<UnreadableRoot>>,
) -> Result<Roots> {
    let store = shared.as_ref();
    let mut out = Roots::default();
    // Prepared records first: a promotion writes the checkpoint document before it deletes the
    // record, so a record gone by the time the tasks and their histories are listed (after
    // this) is in one of them.
    prepared_roots(
        store,
        job,
        (job_name, job_id),
        &mut out,
        partial.as_deref_mut(),
    )
    .await?;
    crate::crash::point("sweep.after-prepared");
    // Roots: every task's history, whatever the sweep's area; tasks are found under
    // checkpoints/ (a task without a checkpoint has no root).
    let tasks: BTreeSet<String> = crate::blob::time::history::task_names(store, job).await?;
    let cps = BlobCheckpointStore::new(std::sync::Arc::clone(shared), job.clone());
    for task in &tasks {
        let history = match partial.as_deref_mut() {
            None => cps.history(task, usize::MAX).await.map_err(|e| {
                let fix = if e.kind() == crate::error::ErrorKind::Corrupt {
                    "; a checkpoint document cannot be read: `blobsnap checkpoints` names every unreadable one by its key and why, `blobsnap forget --checkpoint KEY` removes one"
                } else {
                    ""
                };
                e.context(format!(
                    "the roots of task {task:?} (its retained checkpoints) cannot all be read, so nothing is deleted or classified{fix}"
                ))
            })?,
            // Every document on its own: one that cannot be read is named, the others are
            // roots (a document trimmed while listed is not listed).
            Some(bad) => readable_history(&cps, job, task, bad).await?,
        };
        let newest = history.first().map(|c| c.seq);
        for c in history {
            out.roots += 1;
            let Some(v2) = c.checkpoint.as_v2() else {
                continue;
            };
            let Some(markers) = v2.state_checkpoint_markers.get(FACTORY_NAME) else {
                continue;
            };
            for (store_name, marker) in markers {
                let who = Expected {
                    job_name,
                    job_id,
                    task_name: task,
                    store_name,
                };
                let snap = match load_snapshot(store, &who, marker).await {
                    Ok(snap) => snap,
                    Err(e) if is_unreadable(&e) && partial.is_some() => {
                        let scope = job.store(task, store_name)?;
                        let key = index_key_of(&scope, marker);
                        if let Some(bad) = partial.as_deref_mut() {
                            // Named by a root: live, if it is there at all.
                            if let Some(k) = &key {
                                out.history.insert(k.clone());
                            }
                            bad.push(UnreadableRoot {
                                what: "index".into(),
                                key: key.map_or_else(|| marker.clone(), |k| k.to_string()),
                                root: format!(
                                    "task {task:?} checkpoint #{} store {store_name}",
                                    c.seq
                                ),
                                kind: e.kind().as_str().into(),
                                reason: e.to_string(),
                                may_name: scope.scope().clone(),
                            });
                        }
                        continue;
                    }
                    Err(e) => {
                        let repair = if Some(c.seq) == newest {
                            "it is the task's latest checkpoint: restore the index from a copy, or run the job with restore-fallback so that it commits past it".to_string()
                        } else {
                            format!(
                                "it is an older retained checkpoint (the latest is #{}): the job's next commits trim it from the history once it leaves retention, or `blobsnap forget --checkpoint {}` removes it now if no rollback to it is needed",
                                newest.unwrap_or(c.seq),
                                job.checkpoint_key(task, c.seq).map(|k| k.to_string()).unwrap_or_default()
                            )
                        };
                        return Err(e.context(format!(
                            "sweep: checkpoint #{} ({}) of task {task:?} names the snapshot {marker} of store {store_name:?}, which cannot be read, so the sweep cannot know what it keeps alive and deletes nothing; {repair}",
                            c.seq,
                            v2.id
                        )));
                    }
                };
                keep_snapshot(&mut out.history, &snap)?;
            }
        }
    }
    // Savepoints are roots too (fail closed: one that cannot be read stops the sweep).
    let savepoints = match partial.as_deref_mut() {
        None => crate::blob::time::savepoint::list_roots(store, job)
            .await
            .map_err(|e| {
                let hint = if e.kind() == crate::error::ErrorKind::Corrupt {
                    ": a savepoint record cannot be read; `blobsnap savepoint ls` names every unreadable one and why, `blobsnap savepoint rm --name NAME` removes one"
                } else {
                    ""
                };
                e.context(format!(
                    "sweep reads the job's savepoints (nothing deleted){hint}"
                ))
            })?,
        Some(bad) => {
            let (readable, unreadable) =
                crate::blob::time::savepoint::list_roots_partial(store, job).await?;
            for (u, kind) in unreadable {
                bad.push(UnreadableRoot {
                    what: "savepoint".into(),
                    key: u.key,
                    root: format!("savepoint {}", u.name),
                    kind: kind.as_str().into(),
                    reason: u.reason,
                    // A record names snapshots of any task.
                    may_name: job.tasks()?,
                });
            }
            readable
        }
    };
    for sp in &savepoints {
        out.roots += 1;
        for (task, store_name, marker) in sp.markers()? {
            let who = Expected {
                job_name,
                job_id,
                task_name: &task,
                store_name: &store_name,
            };
            let snap = match load_snapshot(store, &who, &marker).await {
                Ok(snap) => snap,
                Err(e) if is_unreadable(&e) && partial.is_some() => {
                    let scope = job.store(&task, &store_name)?;
                    let key = index_key_of(&scope, &marker);
                    if let Some(bad) = partial.as_deref_mut() {
                        if let Some(k) = &key {
                            out.savepoints.insert(k.clone());
                        }
                        bad.push(UnreadableRoot {
                            what: "index".into(),
                            key: key.map_or_else(|| marker.clone(), |k| k.to_string()),
                            root: format!(
                                "savepoint {} task {task:?} store {store_name}",
                                sp.name
                            ),
                            kind: e.kind().as_str().into(),
                            reason: e.to_string(),
                            may_name: scope.scope().clone(),
                        });
                    }
                    continue;
                }
                Err(e) => return Err(e.context(format!(
                    "sweep: savepoint {:?} names the snapshot {marker} of task {task:?} store {store_name:?}, which cannot be read, so the sweep deletes nothing; remove the savepoint (blobsnap savepoint rm) if it is broken",
                    sp.name
                ))),
            };
            keep_snapshot(&mut out.savepoints, &snap)?;
        }
    }
    Ok(out)
}

/// Prepared history records are roots (route 1 under Kafka's checkpoint manager, docs/samza.md):
/// the commit point of their snapshots is Samza's, outside the bucket, until a promotion
/// commits them into the history or the task's next start drops them. Fails closed as the
/// history does.
async fn prepared_roots(
    store: &dyn BlobStore,
    job: &JobScope,
    (job_name, job_id): (&str, &str),
    out: &mut Roots,
    mut partial: Option<&mut Vec<UnreadableRoot>>,
) -> Result<()> {
    use crate::blob::time::prepared;
    const FIX: &str = "the task's next start promotes or drops its prepared records; `blobsnap forget --all` removes a retired deployment whole";
    let (records, strays) = prepared::list_with_strays(store, job, None).await?;
    if let Some(k) = strays.first() {
        let e = Error::corrupt(format!(
            "{k} is under prepared/ but is no prepared history record's key ({} such keys)",
            strays.len()
        ));
        match partial.as_deref_mut() {
            Some(bad) => {
                for k in &strays {
                    bad.push(UnreadableRoot {
                        what: "prepared".into(),
                        key: k.to_string(),
                        root: "a key under prepared/".into(),
                        kind: e.kind().as_str().into(),
                        reason: e.to_string(),
                        may_name: job.tasks()?,
                    });
                }
            }
            None => {
                return Err(e.context(format!(
                    "sweep: a key under prepared/ may be a record it cannot read, so the sweep deletes nothing; {FIX}"
                )))
            }
        }
    }
    for p in records {
        let unreadable = |e: &Error, what: &str, key: String, may_name: crate::blobstore::Scope| {
            UnreadableRoot {
                what: what.into(),
                key,
                root: format!("task {:?} prepared checkpoint {}", p.task, p.id),
                kind: e.kind().as_str().into(),
                reason: e.to_string(),
                may_name,
            }
        };
        let cp = match prepared::read(store, &p).await {
            Ok(cp) => cp,
            // Promoted since it was listed: its checkpoint document, written before the record
            // was deleted, is in the history, read after this.
            Err(e) if e.kind() == crate::error::ErrorKind::NotFound => continue,
            Err(e) if is_unreadable(&e) && partial.is_some() => {
                if let Some(bad) = partial.as_deref_mut() {
                    bad.push(unreadable(&e, "prepared", p.key.to_string(), job.tasks()?.escaped(&p.task)?));
                }
                continue;
            }
            Err(e) => {
                return Err(e.context(format!(
                    "sweep: the prepared history record {} of task {:?} cannot be read, so the sweep cannot know what it keeps alive and deletes nothing; {FIX}",
                    p.key, p.task
                )))
            }
        };
        out.roots += 1;
        let Some(markers) = cp.state_checkpoint_markers.get(FACTORY_NAME) else {
            continue;
        };
        for (store_name, marker) in markers {
            let who = Expected {
                job_name,
                job_id,
                task_name: &p.task,
                store_name,
            };
            let snap = match load_snapshot(store, &who, marker).await {
                Ok(snap) => snap,
                Err(e) if is_unreadable(&e) && partial.is_some() => {
                    let scope = job.store(&p.task, store_name)?;
                    let key = index_key_of(&scope, marker);
                    if let Some(k) = &key {
                        out.history.insert(k.clone());
                    }
                    if let Some(bad) = partial.as_deref_mut() {
                        let key = key.map_or_else(|| marker.clone(), |k| k.to_string());
                        bad.push(unreadable(&e, "index", key, scope.scope().clone()));
                    }
                    continue;
                }
                Err(e) => {
                    return Err(e.context(format!(
                        "sweep: the prepared history record {} names the snapshot {marker} of store {store_name:?}, which cannot be read, so the sweep deletes nothing; {FIX}",
                        p.key
                    )))
                }
            };
            keep_snapshot(&mut out.history, &snap)?;
        }
    }
    Ok(())
}

/// `snap`'s index and every blob it lists, into `live`.
fn keep_snapshot(
    live: &mut HashSet<BlobKey>,
    snap: &crate::blob::snapshot::LoadedSnapshot,
) -> Result<()> {
    live.insert(snap.scope.index_key(&snap.marker)?);
    for (_, f) in snap.index.present_files() {
        for b in &f.blobs {
            live.insert(snap.blobs.key(&b.blob_id)?);
        }
    }
    Ok(())
}

/// The key of the index `marker` names in `scope`, when the marker parses.
fn index_key_of(scope: &crate::layout::StoreScope, marker: &str) -> Option<BlobKey> {
    marker
        .parse::<crate::index::IndexMarker>()
        .ok()
        .and_then(|m| scope.index_key(&m).ok())
}
