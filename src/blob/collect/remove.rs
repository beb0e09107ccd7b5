//! Removing a whole deployment (`blobsnap forget --job J --job-id ID --all`): every object of
//! one job scope — a retired deployment, or a fork that is no longer wanted — with the guards
//! the sweep has and the ones a whole scope needs:
//!
//! - a running job is refused (a writer lease younger than its grace whose process is not known
//!   gone: `blobsnap unlock` releases the leases of a job known to be stopped; lease ages on
//!   the server's clock, as the sweep judges them), and the leases are read again before each
//!   kind of object goes: a task started meanwhile stops the removal there;
//! - once the checkpoint documents and savepoints are gone, none may appear again before the
//!   indexes and blobs go: a task that claimed (its claim, a checkpoint document, comes before
//!   its lease) or a fork that pinned a savepoint meanwhile stops the removal there, before
//!   anything a new document could name is deleted;
//! - a scope another job borrows from is refused while that fork exists (a fork's pin on one of
//!   its savepoints): forget the fork first, or release its pins (`savepoint unpin`);
//! - a fork releases the pins it holds on its sources, named by its tasks' start-from records
//!   (an unreadable record fails closed: the pins it names could not be released).
//!
//! The order makes a removal cut short safe to run again, and never leaves a readable
//! checkpoint that names a deleted blob: the checkpoint documents go first (no reader can
//! restore the scope any more), then savepoints, indexes, blobs and leases, then the pins in
//! the sources, then the start-from records (which name the pins) and the owner record last.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use futures::TryStreamExt as _;
use serde::Serialize;

use crate::blob::time::record::{parse_start_from, ForkPin, MAX_START_FROM_BYTES};
use crate::blobstore::{get_bytes, BlobKey, BlobStore, ObjectMeta, Probe};
use crate::error::{Error, Result};
use crate::layout::{parse, JobScope, KeyKind};

/// What [`remove_deployment`] removed (in a dry run: would remove).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct DeploymentRemoval {
    /// The job's name.
    pub job: String,
    /// The job id (the deployment).
    pub job_id: String,
    /// Nothing was deleted.
    pub dry_run: bool,
    /// Objects deleted, all kinds.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Checkpoint documents (removal records included).
    pub checkpoints: u64,
    /// Savepoint records.
    pub savepoints: u64,
    /// Snapshot indexes.
    pub indexes: u64,
    /// Blobs.
    pub blobs: u64,
    /// The owner record, writer leases, start-from records, stale pins of forks that no
    /// longer exist, and keys of no known shape under the scope.
    pub other: u64,
    /// The pins this scope (a fork) held on its sources' savepoints, released.
    pub pins_released: Vec<ForkPin>,
    /// Incomplete multipart uploads under the scope, aborted.
    pub uploads_aborted: u64,
}

/// The pins in the sources go after the blobs and leases, before the start-from records.
const PINS_PHASE: u8 = 5;

/// Savepoint records and the pins on them: the last kind of document a reader starts from.
const SAVEPOINTS_PHASE: u8 = 1;

/// The order of deletion (see the module's doc): lower first.
fn phase(kind: Option<&KeyKind>) -> u8 {
    match kind {
        // A prepared record is a root like a checkpoint document (docs/samza.md).
        Some(KeyKind::Checkpoint { .. } | KeyKind::Prepared { .. }) => 0,
        Some(KeyKind::Savepoint { .. } | KeyKind::ForkPin { .. }) => 1,
        Some(KeyKind::Index { .. }) => 2,
        Some(KeyKind::Blob { .. }) => 3,
        Some(KeyKind::Writer { .. } | KeyKind::Unknown { .. }) => 4,
        Some(KeyKind::StartFrom { .. }) => 6,
        Some(KeyKind::OwnerRecord) => 7,
        None => 4,
    }
}

/// Delete every object of deployment `job` (see the module's doc for the guards and the
/// order). `NotFound` (naming the jobs that exist) when nothing is stored under it; `Conflict`
/// when it runs or a fork borrows from it; a start-from record that cannot be read is
/// `Corrupt` and nothing is deleted. `dry_run`: the same checks and report, nothing deleted.
pub async fn remove_deployment(
    store: Arc<dyn BlobStore>,
    job: &JobScope,
    now: SystemTime,
    dry_run: bool,
) -> Result<DeploymentRemoval> {
    let started = std::time::Instant::now();
    crate::blob::time::history::require_job(store.as_ref(), job).await?;
    let (job_name, job_id) = job.names();
    let active = super::admin::active_writers(store.as_ref(), job, now).await?;
    if let Some((lease, age)) = active.first() {
        return Err(Error::conflict(format!(
            "job {job_name}/{job_id} is running: task {:?} on {} pid {} renewed its writer lease {} s ago (and {} more lease(s) are live); stop it first — `blobsnap unlock --job {job_name} --job-id {job_id}` releases the leases of a job known to be stopped",
            lease.task,
            lease.host,
            lease.pid,
            age.as_secs(),
            active.len() - 1
        )));
    }
    let objects: Vec<ObjectMeta> = store.list(job.scope()).try_collect().await?;
    // Forks that borrow from this scope: a pin of a fork that still has objects refuses.
    let mut borrowers = BTreeSet::new();
    for m in &objects {
        if let Some(KeyKind::ForkPin {
            fork_job, fork_id, ..
        }) = parse(&m.key).map(|p| p.kind)
        {
            borrowers.insert((fork_job, fork_id));
        }
    }
    let mut live_forks = Vec::new();
    for (fork_job, fork_id) in borrowers {
        let fork = JobScope::new(&fork_job, &fork_id)?;
        if store.list(fork.scope()).try_next().await?.is_some() {
            live_forks.push((fork_job, fork_id));
        }
    }
    if !live_forks.is_empty() {
        let first = &live_forks[0];
        return Err(Error::conflict(format!(
            "fork(s) {} borrow blobs of {job_name}/{job_id} through its savepoints: forget them first (`blobsnap forget --all --job {} --job-id {}`); a fork that no longer borrows releases its pins with `blobsnap savepoint unpin`",
            live_forks.iter().map(|(j, i)| format!("{j}/{i}")).collect::<Vec<_>>().join(", "),
            first.0,
            first.1
        )));
    }
    // The pins this scope (a fork) holds in its sources, from its start-from records.
    let mut pins = BTreeSet::new();
    for m in &objects {
        if matches!(
            parse(&m.key).map(|p| p.kind),
            Some(KeyKind::StartFrom { .. })
        ) {
            let bytes = get_bytes(store.as_ref(), &m.key, MAX_START_FROM_BYTES).await?;
            let record = parse_start_from(&bytes, &m.key).map_err(|e| {
                e.context("the pins this fork holds on its sources cannot be known, so nothing was deleted; repair or delete the record, then `blobsnap savepoint unpin` releases what it named")
            })?;
            // Only this fork's own (a record copied from another scope names another's).
            pins.extend(
                record
                    .pins
                    .into_iter()
                    .filter(|p| p.fork_job == job_name && p.fork_id == job_id),
            );
        }
    }
    let mut report = DeploymentRemoval {
        job: job_name.clone(),
        job_id: job_id.clone(),
        dry_run,
        ..DeploymentRemoval::default()
    };
    // Uploads cut short under the scope (a job killed mid-upload): none is in flight (no live
    // writer), so every one goes — first, while the owner record still names the scope for a
    // rerun.
    let multipart = store.capabilities(Probe::Never).await?.multipart_listing;
    if multipart {
        let after_any = (!dry_run).then(|| now + std::time::Duration::from_secs(365 * 86_400));
        report.uploads_aborted = store
            .incomplete_uploads(job.scope(), after_any)
            .await
            .map_err(|e| e.context("abort the scope's incomplete uploads"))?
            .len() as u64;
    }
    let mut phases: BTreeMap<u8, Vec<BlobKey>> = BTreeMap::new();
    for m in &objects {
        let kind = parse(&m.key).map(|p| p.kind);
        match &kind {
            Some(KeyKind::Checkpoint { .. }) => report.checkpoints += 1,
            Some(KeyKind::Savepoint { .. }) => report.savepoints += 1,
            Some(KeyKind::Index { .. }) => report.indexes += 1,
            Some(KeyKind::Blob { .. }) => report.blobs += 1,
            _ => report.other += 1,
        }
        report.objects += 1;
        report.bytes += m.size;
        phases
            .entry(phase(kind.as_ref()))
            .or_default()
            .push(m.key.clone());
    }
    report.pins_released = pins.iter().cloned().collect();
    if dry_run {
        return Ok(report);
    }
    let pin_keys: Vec<BlobKey> = pins.iter().map(ForkPin::key).collect::<Result<_>>()?;
    let mut pins_left = !pin_keys.is_empty();
    for (p, keys) in phases {
        // A task of the job started meanwhile: stop, and say so, rather than delete what it
        // is writing.
        let elapsed = now + started.elapsed();
        if let Some((lease, _)) = super::admin::active_writers(store.as_ref(), job, elapsed)
            .await?
            .first()
        {
            return Err(Error::conflict(format!(
                "a task of {job_name}/{job_id} started while its deployment was being removed (task {:?} on {} pid {}): the removal stopped before its next kind of object; stop the job, then run it again",
                lease.task, lease.host, lease.pid
            )));
        }
        // Past the documents: a claim or a fork's pin written since would name what goes next.
        if p > SAVEPOINTS_PHASE {
            for (area, what) in [
                (
                    job.scope().child("checkpoints")?,
                    "a checkpoint document (a task claimed)",
                ),
                (job.savepoints()?, "a savepoint or a fork's pin on one"),
            ] {
                if let Some(m) = store.list(&area).try_next().await? {
                    return Err(Error::conflict(format!(
                        "{what} appeared in {job_name}/{job_id} while its deployment was being removed ({}): the removal stopped before its indexes and blobs; stop what writes to it, then run it again",
                        m.key
                    )));
                }
            }
        }
        if p > PINS_PHASE && pins_left {
            delete_all(store.as_ref(), &pin_keys, "release the pin").await?;
            pins_left = false;
        }
        delete_all(store.as_ref(), &keys, "delete").await?;
        crate::crash::point("forget.mid-deployment");
    }
    if pins_left {
        delete_all(store.as_ref(), &pin_keys, "release the pin").await?;
    }
    Ok(report)
}

/// Delete `keys` (the store pages the request: S3's DeleteObjects takes 1,000); a key not
/// deleted stops the removal, named.
async fn delete_all(store: &dyn BlobStore, keys: &[BlobKey], what: &str) -> Result<()> {
    match store.delete_many(keys).await?.into_iter().next() {
        Some((k, e)) => Err(e.context(format!(
            "{what} {k} (the removal stopped there; run it again to finish)"
        ))),
        None => Ok(()),
    }
}
