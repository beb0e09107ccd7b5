//! A small CheckpointV2 job runtime, and the demo job (word count).
//!
//! A job has N tasks; task `Partition p` reads partition `p` of a file-based input system (one
//! append-only text file per partition, offsets are byte positions of line starts), keeps its
//! state in one RocksDB store, and commits every `commit_every` messages (or every
//! `commit_interval`, whichever comes first) through the
//! [`TaskCommitManager`] with the blob backend. At startup
//! each task claims its epoch, restores its store from the last checkpoint (reusing local
//! files), and resumes from the checkpointed offset — so state and offsets always come from
//! the same commit, whatever killed the previous run.

mod restore;
pub mod standby;
mod start_from;
pub mod wordcount;

use restore::*;
use start_from::*;
pub use start_from::{
    check_start_from, last_start_from, start_from_pending, start_task_from, StartFrom,
};

use std::collections::BTreeMap;
use std::io::{BufRead as _, Seek as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::{
    Clock, StateBackendFactory, StoreEngine, StoreSpec, TaskBackupManager, TaskContext,
};
use crate::blob::collect::admin::WriterLease;
use crate::blobstore::BlobStore;
use crate::checkpoint::{BlobCheckpointStore, Checkpoint, CheckpointStore, Ssp};
use crate::commit::{Backend, CommitReport, TaskCommitManager};
use crate::error::{Error, Result};
use crate::layout::JobScope;
use crate::local::rocks::RocksStore;

/// Settings of a job run.
#[derive(Clone, Debug)]
pub struct JobSettings {
    /// The job's name.
    pub job_name: String,
    /// The job's id.
    pub job_id: String,
    /// Where the tasks' stores live (`<state dir>/<store>/<task>`).
    pub state_dir: PathBuf,
    /// The input system's directory (`<input dir>/<partition>.txt`).
    pub input_dir: PathBuf,
    /// The input stream's name (for SSPs).
    pub stream: String,
    /// Number of partitions (= tasks).
    pub partitions: u32,
    /// The stores of every task (the first is the processor's main store). A store added
    /// to a job that already committed has no snapshot: it starts empty.
    pub stores: Vec<String>,
    /// Commit after this many messages.
    pub commit_every: u64,
    /// Also commit when this long has passed since the last commit (zero: only by count).
    pub commit_interval: std::time::Duration,
    /// Committed snapshots kept per store.
    pub retention: usize,
    /// Retention tiers on top of the newest `retention` (`every 5m for 1d, every 1h for 7d`,
    /// [`crate::retention`]): the history keeps the union, and the cleanup deletes nothing a
    /// retained checkpoint names. Empty: the count alone.
    pub retention_tiers: Vec<crate::retention::Tier>,
    /// Run even if the checkpoint store cannot fence a second writer.
    pub unsafe_no_fencing: bool,
    /// A commit that comes due while the previous one is still uploading is skipped (processing
    /// goes on) for at most this long; then processing waits for the previous one.
    pub commit_max_delay: std::time::Duration,
    /// Sweep this task's orphans every this many commits (0: never).
    pub sweep_every_commits: u64,
    /// The sweep's grace period (also: uploads older than half of it are abandoned).
    pub gc_grace: std::time::Duration,
    /// When the last checkpoint's snapshot cannot be restored because it is corrupt or
    /// missing, restore the newest retained checkpoint whose snapshot does, and resume from
    /// *its* input offsets (the messages after them are processed again). Off by default: the
    /// task fails instead, naming what is wrong.
    pub restore_fallback: bool,
    /// This deployment's id, recorded in the scope's owner record.
    pub deployment_id: String,
    /// Create the job's resources before the first commit (they are validated either way).
    pub create_resources: bool,
    /// Files smaller than this travel inline in the index ([`BackupSettings::inline_below`](crate::blob::commit::backup::BackupSettings::inline_below); 0: Samza's v1 shape).
    pub index_inline_below: u64,
    /// How the task's stores are restored at its start (default: the verified full restore).
    pub restore_mode: RestoreMode,
    /// A lazy restore's background download stays under this many bytes/s (0: no bound;
    /// default [`DEFAULT_RATE`](crate::local::lazy::DEFAULT_RATE)).
    pub lazy_download_rate: u64,
    /// Upload each table or blob file as soon as RocksDB finishes it, in the background
    /// ([`crate::blob::commit::preupload`], `store.pre-upload`), so that a commit after a compaction
    /// uploads little.
    pub pre_upload: bool,
    /// Start every task from this point instead of its latest checkpoint (a rollback, or a
    /// roll-forward to a newer retained checkpoint): `savepoint:NAME`, `#N`, a checkpoint id,
    /// `@TIME` ([`CheckpointRef`](crate::blob::time::history::CheckpointRef)). Each task claims its
    /// epoch, then commits a new head whose offsets and markers are the point's, and restores
    /// it the usual way. Applied once: the task records it (`start-from/<task>.json`), and a
    /// restart with the same value resumes from the task's latest checkpoint.
    pub start_from: Option<crate::blob::time::history::CheckpointRef>,
    /// Apply `start_from` again, once more, when this id differs from the one it was last
    /// applied with (issue 51, item 5): a rollback to the same point a second time takes a new
    /// id (a date, a ticket), and a restart with the same one still resumes from the latest.
    pub start_from_id: Option<String>,
    /// Cancel to stop the job gracefully (the `blobsnap` command does on its first SIGINT or
    /// SIGTERM): a task restoring stops its restore (the store dirs unchanged); a task
    /// processing stops taking messages, waits for its commit in flight, commits what it
    /// processed since, hands back what retention let go, releases its stores and deletes its
    /// writer lease — without waiting for a lazy restore's background download — and
    /// returns `Cancelled` naming the offset it committed.
    pub stop: tokio_util::sync::CancellationToken,
}

impl JobSettings {
    /// The operator's start-from point, with its id and the job's grace.
    pub fn start_from(&self) -> Option<StartFrom> {
        self.start_from.clone().map(|point| StartFrom {
            point,
            id: self.start_from_id.clone(),
            grace: self.gc_grace,
        })
    }
}

/// How a task's stores are restored when it starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RestoreMode {
    /// Every file is downloaded and verified before the store opens.
    #[default]
    Full,
    /// The store opens once its small files are local; each SST or blob file is fetched
    /// (verified) when RocksDB first opens it, and all are downloaded in the background
    /// ([`crate::local::lazy`]).
    Lazy,
}

impl std::str::FromStr for RestoreMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "full" => Ok(RestoreMode::Full),
            "lazy" => Ok(RestoreMode::Lazy),
            other => Err(Error::invalid(format!(
                "restore mode {other:?}: expected \"full\" or \"lazy\""
            ))),
        }
    }
}

/// One input message.
#[derive(Debug, Clone)]
pub struct Message {
    /// Its text.
    pub line: String,
    /// The offset of the next message.
    pub next_offset: u64,
}

/// Reads one partition file from an offset.
pub struct PartitionReader {
    reader: std::io::BufReader<std::fs::File>,
    offset: u64,
}

impl PartitionReader {
    /// Open `path` at `offset`.
    pub fn open(path: &Path, offset: u64) -> Result<Self> {
        let mut file = std::fs::File::open(path)
            .map_err(|e| Error::io(format!("open input {}", path.display()), e))?;
        file.seek(std::io::SeekFrom::Start(offset))
            .map_err(|e| Error::io(format!("seek input {}", path.display()), e))?;
        Ok(PartitionReader {
            reader: std::io::BufReader::new(file),
            offset,
        })
    }

    /// The next message, or `None` at the end of the file (a partial last line is not a
    /// message yet).
    pub fn next_message(&mut self) -> Result<Option<Message>> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| Error::io("read input", e))?;
        if n == 0 || !line.ends_with('\n') {
            return Ok(None);
        }
        self.offset += n as u64;
        line.pop();
        Ok(Some(Message {
            line,
            next_offset: self.offset,
        }))
    }
}

/// A task's open stores, by name.
pub type Stores = BTreeMap<String, Arc<RocksStore>>;

/// What a task's processing does with a message and its stores.
pub trait Processor: Send + Sync {
    /// Apply one message to the stores.
    fn process(&self, stores: &Stores, message: &Message) -> Result<()>;
}

/// Called after every commit of a task with its name, the report and the backup manager
/// (for its upload statistics, [`TaskBackupManager::last_upload`]).
pub type CommitObserver = dyn Fn(&str, &CommitReport, &dyn TaskBackupManager) + Send + Sync;

/// What one task run did.
#[derive(Debug, Default, Clone)]
pub struct TaskSummary {
    /// The task.
    pub task: String,
    /// Offset the run started from (restored from the checkpoint).
    pub resumed_from: u64,
    /// Messages processed in this run.
    pub processed: u64,
    /// Commits made in this run.
    pub commits: u64,
    /// The last of them (a long-running task keeps one report, not one per commit).
    pub last_commit: Option<CommitReport>,
    /// Commits that came due while one was in flight and were skipped.
    pub commits_skipped: u64,
    /// Commits whose async stage failed (retried by the next commit).
    pub commits_failed: u64,
    /// Sweeps run, and objects they deleted.
    pub sweeps: u64,
    /// Objects deleted by sweeps.
    pub swept: u64,
    /// Seconds from the task's start (claim, restore, DB open) to its first processed
    /// message, when it processed one (metric `blobsnap_task_first_message_seconds`).
    pub first_message_secs: Option<f64>,
    /// Set when the last checkpoint could not be restored and an older one was
    /// ([`JobSettings::restore_fallback`]): the checkpoint id restored, and why the newer ones
    /// were skipped.
    pub fell_back_to: Option<String>,
    /// What the job's start-from did for this task, in words: `started from savepoint:NAME,
    /// checkpoint #9 (committed again as #12)`, `forked from JOB/ID/NAME (…)`, or that it was
    /// applied before and not again (issue 51, items 5 and 6). `None` without a start-from.
    pub started_from: Option<String>,
    /// What the task's restore did, by store: downloaded, reused (from a warm standby among
    /// them), and left remote by a lazy restore.
    pub restored: std::collections::BTreeMap<String, crate::backend::RestoreSummary>,
}

/// The task name of partition `p`.
pub fn task_name(p: u32) -> String {
    format!("Partition {p}")
}

/// The store dir of `store` for `task`: `<state dir>/<store>/<task>`, each name made a
/// single path segment by [`local_segment`] (injective, never `.`, `..` or a `/`).
pub fn store_dir(state_dir: &Path, store: &str, task: &str) -> Result<PathBuf> {
    Ok(state_dir
        .join(local_segment(store)?)
        .join(local_segment(task)?))
}

/// A store or task name as one local path segment, one-to-one: a space becomes `_` (so
/// `Partition 0` → `Partition_0`), and `_`, `%`, `/`, a leading `.` and every control byte
/// become `%XX`, so two names never share a dir and no name leaves the state dir. An empty
/// name is refused.
pub fn local_segment(name: &str) -> Result<String> {
    if name.is_empty() {
        return Err(Error::invalid("a store or task name is empty"));
    }
    let mut out = String::with_capacity(name.len());
    for (i, c) in name.chars().enumerate() {
        match c {
            ' ' => out.push('_'),
            '_' | '%' | '/' | '\\' => out.push_str(&format!("%{:02X}", c as u32)),
            '.' if i == 0 => out.push_str("%2E"),
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Run task `partition` to the end of its input: claim, restore, process, commit.
/// `on_commit` is called after every commit. From its claim until it stops the task holds a
/// writer lease in the scope (`writers/<task>/`, refreshed every quarter of the sweep grace,
/// deleted when it stops), which `blobsnap gc` reads to tell a running job from a stopped one.
pub async fn run_task(
    settings: &JobSettings,
    partition: u32,
    blob_store: Arc<dyn BlobStore>,
    backend: &Arc<dyn StateBackendFactory>,
    clock: Arc<dyn Clock>,
    processor: Arc<dyn Processor>,
    on_commit: &CommitObserver,
) -> Result<TaskSummary> {
    let lease = WriterLease::new(&task_name(partition), settings.gc_grace);
    crate::telemetry::register_task(&lease.task, &settings.stores);
    let job = JobScope::new(&settings.job_name, &settings.job_id)?;
    let r = run_task_leased(
        settings,
        partition,
        &blob_store,
        backend,
        clock,
        processor,
        on_commit,
        &lease,
        &job,
    )
    .await;
    if let Err(e) = lease.retire(blob_store.as_ref(), &job).await {
        tracing::warn!(task = %lease.task, error = %e, "could not delete the writer lease; it expires after the grace");
    }
    r
}

/// The stores of `task`: each named store of the job in its own dir under the state dir.
pub(crate) fn store_specs(settings: &JobSettings, task: &str) -> Result<Vec<StoreSpec>> {
    if settings.stores.is_empty() {
        return Err(Error::invalid("a job needs at least one store"));
    }
    settings
        .stores
        .iter()
        .map(|name| {
            Ok(StoreSpec {
                name: name.clone(),
                dir: store_dir(&settings.state_dir, name, task)?,
            })
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn run_task_leased(
    settings: &JobSettings,
    partition: u32,
    blob_store: &Arc<dyn BlobStore>,
    backend: &Arc<dyn StateBackendFactory>,
    clock: Arc<dyn Clock>,
    processor: Arc<dyn Processor>,
    on_commit: &CommitObserver,
    lease: &WriterLease,
    job: &JobScope,
) -> Result<TaskSummary> {
    let started = std::time::Instant::now();
    let blob_store = Arc::clone(blob_store);
    let task = task_name(partition);
    let ctx = TaskContext {
        job_name: settings.job_name.clone(),
        job_id: settings.job_id.clone(),
        task_name: task.clone(),
    };
    let specs = store_specs(settings, &task)?;
    // Every store dir is ours from before the claim and the restore until its database is
    // closed (the end of this function): a second process or task of the same task on this
    // host gets Conflict here, before it claims or touches anything.
    let _store_locks = specs
        .iter()
        .map(|s| crate::local::lock::StoreDirLock::acquire(&s.dir))
        .collect::<Result<Vec<_>>>()?;
    let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
        Arc::clone(&blob_store),
        JobScope::new(&settings.job_name, &settings.job_id)?,
    ));
    let (commits, last) = TaskCommitManager::start(
        ctx.clone(),
        Arc::clone(&checkpoints),
        Arc::clone(&clock),
        settings.retention,
        settings.unsafe_no_fencing,
    )
    .await?;
    let commits = commits.with_retention_tiers(settings.retention_tiers.clone());
    lease.announce(blob_store.as_ref(), job).await?;
    let mut lease_renewed = std::time::Instant::now();
    crate::crash::point("task.after-claim");
    let (last, started_from) = start_task_from(
        &commits,
        &ctx,
        &blob_store,
        settings.start_from().as_ref(),
        last,
    )
    .await?;

    let (last, fell_back_to, restored) = restore_task(
        settings,
        backend,
        &ctx,
        &specs,
        &clock,
        &checkpoints,
        last,
        (blob_store.as_ref(), job),
    )
    .await?;
    crate::crash::point("task.after-restore");

    let stores = open_stores(&specs)?;
    let (commits, backup) = attach_backup(
        commits,
        backend,
        &ctx,
        &specs,
        &stores,
        clock,
        last.as_ref(),
    )
    .await?;

    let ssp = Ssp::new("files", settings.stream.clone(), partition);
    let resumed_from = resumed_offset(last.as_ref(), &ssp)?;
    let input = settings.input_dir.join(format!("{partition}.txt"));
    let mut reader = PartitionReader::open(&input, resumed_from)?;
    let mut summary = TaskSummary {
        task: task.clone(),
        resumed_from,
        fell_back_to,
        started_from,
        restored,
        ..Default::default()
    };
    let sweep = SweepCtx {
        settings,
        store: &blob_store,
        task: &task,
    };
    let mut offset = resumed_from;
    let mut since_commit = 0u64;
    let mut in_flight: Option<tokio::task::JoinHandle<Result<CommitReport>>> = None;
    let mut due_since: Option<std::time::Instant> = None;
    let mut last_commit_at = std::time::Instant::now();
    // The processing loop and the last commit; whatever ends them, a commit still in flight
    // is awaited before the task returns — so it never runs on, detached, with the stores
    // open and the store-dir locks released (an in-process restart could swap a tree under
    // it).
    let processed = async {
        loop {
            if settings.stop.is_cancelled() {
                break;
            }
            if in_flight.as_ref().is_some_and(|h| h.is_finished()) {
                if let Some(h) = in_flight.take() {
                    finished(h, &task, &backup, on_commit, &mut summary, &sweep).await?;
                }
            }
            if lease_renewed.elapsed() >= settings.gc_grace / 4 {
                match lease.announce(blob_store.as_ref(), job).await {
                    Ok(()) => lease_renewed = std::time::Instant::now(),
                    // Retried at the next message; fatal only once the lease is half a grace
                    // old (past that, a sweep could take the task for stopped).
                    Err(e) if lease_renewed.elapsed() < settings.gc_grace / 2 => {
                        tracing::warn!(task = %task, error = %e, "could not renew the writer lease; retrying");
                    }
                    Err(e) => {
                        return Err(e.context(format!(
                            "the writer lease of task {task:?} could not be renewed for half the sweep grace ({} s)",
                            (settings.gc_grace / 2).as_secs()
                        )))
                    }
                }
            }
            let Some(msg) = reader.next_message()? else {
                break;
            };
            processor.process(&stores, &msg)?;
            if summary.processed == 0 {
                // From the task's start (before its claim and restore) to its first message.
                let secs = started.elapsed().as_secs_f64();
                summary.first_message_secs = Some(secs);
                metrics::gauge!("blobsnap_task_first_message_seconds", "task" => task.clone())
                    .set(secs);
            }
            // Processing is synchronous: without a yield now and then, the tasks of a job would
            // keep every runtime thread busy and the async stages of their commits would starve
            // until the input ends (found on Garage: 2 commits in a 60,000-message run).
            tokio::task::consume_budget().await;
            offset = msg.next_offset;
            summary.processed += 1;
            since_commit += 1;
            let by_time = !settings.commit_interval.is_zero()
                && last_commit_at.elapsed() >= settings.commit_interval;
            if since_commit < settings.commit_every && !by_time {
                continue;
            }
            if let Some(h) = in_flight.take() {
                let due = *due_since.get_or_insert_with(|| {
                    summary.commits_skipped += 1;
                    std::time::Instant::now()
                });
                if due.elapsed() < settings.commit_max_delay && !h.is_finished() {
                    in_flight = Some(h);
                    continue; // skipped: keep processing
                }
                finished(h, &task, &backup, on_commit, &mut summary, &sweep).await?;
            }
            due_since = None;
            last_commit_at = std::time::Instant::now();
            // A store restored lazily and now complete gets its table-cache bound back.
            for db in stores.values() {
                if let Err(e) = db.lift_lazy_limits() {
                    tracing::warn!(task = %task, error = %e, "could not lift a lazy store's table-cache bound; it stays at the lazy open's");
                }
            }
            let pending = commits
                .sync_stage(BTreeMap::from([(ssp.clone(), offset.to_string())]))
                .await?;
            since_commit = 0;
            let c = Arc::clone(&commits);
            in_flight = Some(tokio::spawn(async move { c.async_stage(pending).await }));
        }
        if let Some(h) = in_flight.take() {
            finished(h, &task, &backup, on_commit, &mut summary, &sweep).await?;
        }
        if since_commit > 0 || summary.commits == 0 {
            let report = commits
                .commit(BTreeMap::from([(ssp.clone(), offset.to_string())]))
                .await?;
            on_commit(&task, &report, backup.as_ref());
            summary.commits += 1;
            summary.last_commit = Some(report);
        }
        Ok::<(), Error>(())
    }
    .await;
    if let Some(h) = in_flight.take() {
        tracing::warn!(task = %task, "the task stops on an error: waiting for its commit in flight before it releases its stores");
        let _ = h.await;
    }
    processed?;
    // What the last commit's cleanup handed back would otherwise wait for a next commit.
    if let Err(e) = commits.finish().await {
        tracing::warn!(task = %task, error = %e, "could not delete the snapshots that left retention at the last commit; the sweep will");
    }
    if settings.stop.is_cancelled() {
        // A graceful stop: everything processed is committed, the stores close (a lazy
        // restore's background download stops with them: the next start fetches the rest).
        tracing::info!(task = %task, offset, "task stopped: its last commit holds every message it processed");
        return Err(Error::new(
            crate::error::ErrorKind::Cancelled,
            format!(
                "task {task:?} stopped on request after committing offset {offset} ({} messages processed)",
                summary.processed
            ),
        ));
    }
    // A store restored lazily is complete before a task that ran to the end of its input
    // lets it go — unless it is asked to stop meanwhile (a large store downloads for a long
    // time at the background's rate): then it goes at once, as after a graceful stop, and
    // the next start's restore fetches what is still remote.
    crate::crash::point("task.end-of-input");
    for spec in &specs {
        tokio::select! {
            r = crate::local::lazy::wait_complete(&spec.dir) => if let Err(e) = r {
                tracing::warn!(task = %task, store = %spec.name, error = %e, "the lazy restore could not complete; the next start restores what is missing");
            },
            () = settings.stop.cancelled() => {
                tracing::info!(task = %task, store = %spec.name, offset, "stop requested while the lazy restore was still downloading: its last commit holds every message; the next start fetches the rest");
                return Err(Error::new(
                    crate::error::ErrorKind::Cancelled,
                    format!(
                        "task {task:?} stopped on request after committing offset {offset} ({} messages processed), while store {:?} was still downloading",
                        summary.processed, spec.name
                    ),
                ));
            }
        }
    }
    Ok(summary)
}

/// Open the task's databases, restored.
fn open_stores(specs: &[StoreSpec]) -> Result<Stores> {
    specs
        .iter()
        .map(|spec| {
            let db = RocksStore::open(&spec.name, &spec.dir)?;
            Ok((spec.name.clone(), Arc::new(db)))
        })
        .collect()
}

/// The backup side of a task: its manager from the factory, based on `last` (the checkpoint
/// restored), and the commit manager with the open stores and that backend attached.
async fn attach_backup(
    commits: TaskCommitManager,
    backend: &Arc<dyn StateBackendFactory>,
    ctx: &TaskContext,
    specs: &[StoreSpec],
    stores: &Stores,
    clock: Arc<dyn Clock>,
    last: Option<&crate::checkpoint::Checkpoint>,
) -> Result<(Arc<TaskCommitManager>, Arc<dyn TaskBackupManager>)> {
    let backup = backend.backup_manager(ctx, specs, clock)?;
    backup.init(last).await?;
    let commits = commits
        .with_stores(
            stores
                .values()
                .map(|db| Arc::clone(db) as Arc<dyn StoreEngine>)
                .collect(),
        )
        .with_backends(
            vec![Backend {
                name: backend.name().to_string(),
                manager: Arc::clone(&backup),
            }],
            last.cloned(),
        );
    Ok((Arc::new(commits), backup))
}

struct SweepCtx<'a> {
    settings: &'a JobSettings,
    store: &'a Arc<dyn BlobStore>,
    task: &'a str,
}

/// Handle a finished async stage: report it, and run the scheduled sweep; a `Conflict`
/// (fenced off) stops the task, other failures are retried by the next commit.
async fn finished(
    h: tokio::task::JoinHandle<Result<CommitReport>>,
    task: &str,
    backup: &Arc<dyn TaskBackupManager>,
    on_commit: &CommitObserver,
    summary: &mut TaskSummary,
    sweep: &SweepCtx<'_>,
) -> Result<()> {
    let r = h.await.map_err(|e| Error::task("commit", e))?;
    match r {
        Ok(report) => {
            on_commit(task, &report, backup.as_ref());
            summary.commits += 1;
            summary.last_commit = Some(report);
            let every = sweep.settings.sweep_every_commits;
            if every > 0 && summary.commits.is_multiple_of(every) {
                let s = crate::blob::collect::gc::SweepSettings {
                    job_name: sweep.settings.job_name.clone(),
                    job_id: sweep.settings.job_id.clone(),
                    task: Some(sweep.task.to_string()),
                    store: None,
                    grace: sweep.settings.gc_grace,
                };
                match crate::blob::collect::gc::sweep(sweep.store, &s, false, &mut |_| {}).await {
                    Ok(report) => {
                        summary.sweeps += 1;
                        summary.swept += report.deleted;
                    }
                    Err(e) => {
                        metrics::counter!("blobsnap_gc_sweep_failures_total").increment(1);
                        tracing::warn!(task, error = %e, "sweep failed; the next one retries");
                    }
                }
            }
            Ok(())
        }
        // Fenced off by a newer writer, or a commit that cannot succeed as configured (an
        // index over the cap, uploads that outlive half the grace again and again): stop.
        Err(e)
            if matches!(
                e.kind(),
                crate::ErrorKind::Conflict | crate::ErrorKind::InvalidInput
            ) =>
        {
            Err(e)
        }
        Err(e) => {
            summary.commits_failed += 1;
            metrics::counter!("blobsnap_commit_failures_total", "task" => task.to_string())
                .increment(1);
            tracing::warn!(task, error = %e, "commit failed; the next commit retries from the last committed state");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_segments_stay_in_the_state_dir_and_never_collide() {
        assert_eq!(local_segment("Partition 0").unwrap(), "Partition_0");
        assert_eq!(local_segment("Partition_0").unwrap(), "Partition%5F0");
        for hostile in ["..", ".", "../x", "a/b", "/etc", ".hidden", "a\nb", "a\\b"] {
            let seg = local_segment(hostile).unwrap();
            assert!(
                !seg.contains('/') && seg != "." && seg != ".." && !seg.starts_with('.'),
                "{hostile:?} -> {seg:?}"
            );
            let dir = store_dir(Path::new("/state"), hostile, "t").unwrap();
            assert!(
                dir.starts_with("/state") && dir.components().count() == 4,
                "{dir:?}"
            );
        }
        assert!(local_segment("").is_err());
        let names = ["a b", "a_b", "a%5Fb", "a%b", "a/b", ".a", "%2Ea"];
        let segs: std::collections::HashSet<_> =
            names.iter().map(|n| local_segment(n).unwrap()).collect();
        assert_eq!(segs.len(), names.len(), "injective: {segs:?}");
    }
}
