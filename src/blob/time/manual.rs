//! Manual backups (`blobsnap backup --db D --name N`): a backup of a closed RocksDB directory
//! (or a RocksDB checkpoint directory) made outside any job.
//!
//! A manual backup is a job named [`JOB`] whose id is the backup's name, with one task
//! ([`TASK`]) and one store ([`STORE`]), so the layout, restore, verify and the sweep apply
//! unchanged: each backup is a checkpoint of that task, pinning its snapshot, and the next
//! backup of the same name uploads only what the last one lacks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::{
    Clock as _, StoreMarkers, StoreSpec, SystemClock, TaskBackupManager as _, TaskContext,
};
use crate::blob::commit::backup::{BackupProgress, BackupSettings, BlobBackupManager, UploadStats};
use crate::blob::snapshot::FACTORY_NAME;
use crate::blobstore::BlobStore;
use crate::checkpoint::{
    BlobCheckpointStore, Checkpoint, CheckpointId, CheckpointIdGen, CheckpointStore as _,
    CheckpointV2,
};
use crate::error::{Error, Result};
use crate::index::IndexMarker;
use crate::layout::JobScope;
use crate::local::rocks::ClosedDb;

/// The job name of every manual backup.
pub const JOB: &str = crate::layout::MANUAL_JOB;
/// The one task of a manual backup.
pub const TASK: &str = "backup";
/// The one store of a manual backup.
pub const STORE: &str = "db";

/// What [`backup`] made.
#[derive(Clone, Debug)]
pub struct ManualBackup {
    /// The snapshot's marker (restore it with `--name` and this marker, or the latest).
    pub marker: IndexMarker,
    /// The checkpoint that pins it.
    pub checkpoint_id: CheckpointId,
    /// Files, bytes, and what was uploaded.
    pub stats: UploadStats,
}

/// Back up the RocksDB directory `db_dir` as the manual backup `name`.
///
/// A database dir (it has a `LOCK` file) is backed up as it is, never opened: opening it with
/// this RocksDB would replay its WAL, flush, and write a new MANIFEST and OPTIONS in a format
/// the application's own (older) RocksDB may refuse. RocksDB's own lock is held for the whole
/// upload (a running process holds it: `Conflict`), and only the live files are read (not
/// `LOCK`, the info logs, obsolete MANIFESTs). A checkpoint dir (no `LOCK`) is uploaded as it
/// is. The hashes of immutable files are cached in `hash_cache_dir` (never next to the
/// database), so an incremental backup reads only new files; `None`: no cache, every file is
/// hashed.
///
/// `watch` sees the upload's progress once it starts; what it returns is dropped when the
/// upload ends (a progress bar).
pub async fn backup<W>(
    store: Arc<dyn BlobStore>,
    db_dir: &Path,
    name: &str,
    hash_cache_dir: Option<PathBuf>,
    watch: impl FnOnce(Arc<BackupProgress>) -> W,
) -> Result<ManualBackup> {
    if !db_dir.join("CURRENT").is_file() {
        return Err(Error::invalid(format!(
            "{} is not a RocksDB directory (no CURRENT file)",
            db_dir.display()
        )));
    }
    let task = TaskContext {
        job_name: JOB.into(),
        job_id: name.to_string(),
        task_name: TASK.into(),
    };
    let pins = BlobCheckpointStore::new(Arc::clone(&store), JobScope::manual(name)?);
    // The next number is past every document, a removed one's too (its number stays
    // taken); listed before the latest is read, and before the upload, so that a backup of
    // the same name landing meanwhile makes this one's pin conflict.
    let top = pins.latest_seq(TASK).await?;
    let last = pins.latest(TASK).await?;
    let closed = if db_dir.join("LOCK").exists() {
        Some(ClosedDb::lock(db_dir)?)
    } else {
        None
    };
    // A checkpoint dir a lazily restored store made while files were remote (it has no LOCK:
    // live_files does not see it) is refused unless this process's lazy restore serves it.
    crate::local::lazy::check_complete(db_dir)?;
    let only = closed.as_ref().map(|c| c.live_files()).transpose()?;
    let mut ids = CheckpointIdGen::after(
        last.as_ref()
            .and_then(|c| c.checkpoint.as_v2())
            .map(|c| c.id),
    );
    let id = ids.next(SystemClock.now_millis())?;
    let spec = StoreSpec {
        name: STORE.into(),
        dir: db_dir.to_path_buf(),
    };
    let mgr = BlobBackupManager::new(
        Arc::clone(&store),
        task,
        std::slice::from_ref(&spec),
        Arc::new(SystemClock),
        BackupSettings {
            // Never beside the database: without a cache dir, no cache (every file hashed).
            hash_cache: hash_cache_dir.is_some(),
            hash_cache_dir,
            only,
            ..Default::default()
        },
    )?;
    mgr.init(last.as_ref().map(|c| &c.checkpoint)).await?;
    let watching = mgr.progress(STORE).map(watch);
    let result = mgr
        .upload(
            id,
            &Default::default(),
            &[(STORE.to_string(), db_dir.to_path_buf())].into(),
        )
        .await;
    drop(watching);
    drop(closed);
    let written = async {
        let markers = result?;
        // The pin is the commit point: inside the same bound as a job's checkpoint.
        mgr.before_commit(id)?;
        let last_seq = last.as_ref().map(|c| c.seq).max(top);
        pin(&pins, name, id, last_seq, markers).await
    }
    .await;
    // The lease goes whatever happened: a failed backup leaves orphans for the sweep.
    if let Err(e) = mgr.close().await {
        tracing::warn!(error = %e, "could not delete the backup's writer lease; it expires after the grace");
    }
    let marker = written?;
    let stats = mgr
        .last_upload_stats()
        .get(STORE)
        .copied()
        .unwrap_or_default();
    Ok(ManualBackup {
        marker,
        checkpoint_id: id,
        stats,
    })
}

/// Write the manual backup's pin: checkpoint `last + 1` of the scope naming `markers`.
async fn pin(
    pins: &BlobCheckpointStore,
    name: &str,
    id: CheckpointId,
    last: Option<u64>,
    markers: StoreMarkers,
) -> Result<IndexMarker> {
    let marker = markers
        .get(STORE)
        .ok_or_else(|| Error::invalid(format!("backup {name}: the upload returned no marker")))?
        .parse::<IndexMarker>()?;
    let checkpoint = Checkpoint::V2(CheckpointV2 {
        id,
        input_offsets: Default::default(),
        state_checkpoint_markers: [(FACTORY_NAME.to_string(), markers)].into(),
    });
    let seq = last.unwrap_or(0).checked_add(1).ok_or_else(|| {
        Error::corrupt(format!(
            "backup {name}: the latest checkpoint number has no successor: the history is corrupt"
        ))
    })?;
    pins.write(
        TASK,
        seq,
        &format!("cli-{:016x}", rand::random::<u64>()),
        &checkpoint,
    )
    .await?;
    Ok(marker)
}

/// What [`forget`] kept and removed: each backup's number, checkpoint id and time (ms).
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ForgetReport {
    /// The policy applied.
    pub policy: String,
    /// Backups kept, newest first.
    pub kept: Vec<ForgetEntry>,
    /// Backups removed (or, in a dry run, to remove).
    pub removed: Vec<ForgetEntry>,
}

/// One backup in a [`ForgetReport`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ForgetEntry {
    /// Its number in the backup's history.
    pub seq: u64,
    /// Its checkpoint id.
    pub checkpoint_id: String,
    /// When it was made, ms since the epoch.
    pub time_millis: u64,
}

/// Forget the backups of manual backup `name` that `policy` does not keep at `now_ms` (their
/// pins are deleted; the newest always stays). What only they named is then left to the
/// sweep (`blobsnap gc --name NAME`). `dry_run`: decide, delete nothing.
pub async fn forget(
    store: Arc<dyn BlobStore>,
    name: &str,
    policy: &crate::retention::RetentionPolicy,
    now_ms: u64,
    dry_run: bool,
) -> Result<ForgetReport> {
    let scope = JobScope::manual(name)?;
    crate::blob::time::history::require_job(store.as_ref(), &scope).await?;
    let pins = BlobCheckpointStore::new(Arc::clone(&store), scope);
    let history = pins.history(TASK, usize::MAX).await?;
    let points: Vec<ForgetEntry> = history
        .iter()
        .map(|c| {
            let id = c.checkpoint.as_v2().map(|v| v.id);
            ForgetEntry {
                seq: c.seq,
                checkpoint_id: id.map(|i| i.to_string()).unwrap_or_default(),
                time_millis: id.map_or(0, |i| i.millis()),
            }
        })
        .collect();
    let times: Vec<u64> = points.iter().map(|p| p.time_millis).collect();
    let keep = policy.select(&times, now_ms);
    let mut report = ForgetReport {
        policy: policy.to_string(),
        ..Default::default()
    };
    for (i, p) in points.into_iter().enumerate() {
        if keep.contains(&i) {
            report.kept.push(p);
        } else {
            report.removed.push(p);
        }
    }
    if !dry_run && !report.removed.is_empty() {
        let seqs: Vec<u64> = report.removed.iter().map(|p| p.seq).collect();
        pins.delete_seqs(TASK, &seqs).await?;
    }
    Ok(report)
}
