//! The blob backend's [`StateBackendAdmin`]: create and validate what a job deployment needs.
//!
//! - `create_resources`: on S3, create the bucket if it is missing and the caller may; merge
//!   (never replace) a lifecycle rule that aborts incomplete multipart uploads under the job's
//!   prefix; then write the owner record `scope.json` (create-only) naming this deployment.
//! - `validate_resources`: PUT, GET, LIST and DELETE a probe object under the prefix; check that
//!   `scope.json` names this deployment (a scope shared by two deployments would have each one's
//!   cleanup delete the other's blobs); on S3, check that no expiration or transition rule
//!   covers the prefix (it would silently delete or freeze live data). A missing bucket, bad
//!   credentials (403), a wrong region and an unreachable endpoint each fail with a clear,
//!   classified error.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt as _;
use serde::{Deserialize, Serialize};

use crate::backend::StateBackendAdmin;
use crate::blobstore::s3::S3Store;
use crate::blobstore::{get_bytes, BlobStore, CreateOnly, Probe, PutBody, PutOptions};
use crate::digest::Sha256;
use crate::error::{Error, ErrorKind, Result};
use crate::layout::JobScope;

/// The owner record of a job scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ScopeRecord {
    /// The deployment that owns the scope.
    pub deployment_id: String,
    /// The job.
    pub job_name: String,
    /// The job's id.
    pub job_id: String,
    /// The grace period of the job's sweeps, seconds: `blobsnap gc` refuses a shorter one
    /// unless forced (the job's abandon rule bounds its commits by half of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc_grace_secs: Option<u64>,
    /// The engine that writes the scope's snapshots, when it is not blobsnap's own: only
    /// [`SAMZA_ENGINE`] so far. Absent in every scope blobsnap writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// How that engine records its commits in blobsnap's layout: [`PREPARED_HISTORY`] (prepared
    /// records, promoted into `checkpoints/`), which makes its scope sweepable. Absent: it keeps
    /// no history the sweep can read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
}

/// The `history` of a scope whose engine writes prepared history records and checkpoint
/// documents (samza-s3 from this version on): the sweep reads its roots as blobsnap's own.
pub const PREPARED_HISTORY: &str = "prepared";

/// The `engine` of a scope Samza's own blob-store engine writes through samza-s3's
/// `S3BlobStoreManager` (issue 50, route 2). Its commits live in Samza's checkpoints (Kafka),
/// not under `checkpoints/`: a sweep there would find no root and delete live snapshots, so
/// every sweep refuses such a scope ([`refuse_foreign_engine`]).
pub const SAMZA_ENGINE: &str = "samza-blob-store";

/// Refuse to sweep a scope whose owner record names an engine that records its commits where
/// the sweep does not read them (`Conflict`, naming the scope and the engine).
pub fn refuse_foreign_engine(job: &JobScope, record: Option<&ScopeRecord>) -> Result<()> {
    let history = record.and_then(|r| r.history.as_deref());
    match record.and_then(|r| r.engine.as_deref()) {
        None => Ok(()),
        Some(_) if history == Some(PREPARED_HISTORY) => Ok(()),
        Some(engine) => Err(Error::conflict(format!(
            "scope {} is written by {engine:?} (Samza's own blob-store engine, through samza-s3's S3BlobStoreManager) without a history in blobsnap's layout (its owner record has no \"history\": made by a samza-s3 before prepared history records): its commits are Samza's checkpoints, not under checkpoints/, so a sweep would find no root and delete live snapshots; nothing is deleted (docs/samza.md)",
            job.scope().as_str()
        ))),
    }
}

/// The admin of one job deployment.
pub struct BlobStoreAdmin {
    store: Arc<dyn BlobStore>,
    s3: Option<S3Store>,
    job: JobScope,
    record: ScopeRecord,
}

impl std::fmt::Debug for BlobStoreAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStoreAdmin")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl BlobStoreAdmin {
    /// The admin of `job_name`/`job_id` for deployment `deployment_id`. `s3` is the raw S3 store
    /// behind `store` (for bucket and lifecycle calls), if it is one.
    pub fn new(
        store: Arc<dyn BlobStore>,
        s3: Option<S3Store>,
        job_name: &str,
        job_id: &str,
        deployment_id: &str,
    ) -> Result<Self> {
        if deployment_id.trim().is_empty() {
            return Err(Error::invalid("the deployment id must not be blank"));
        }
        Ok(BlobStoreAdmin {
            store,
            s3,
            job: JobScope::new(job_name, job_id)?,
            record: ScopeRecord {
                deployment_id: deployment_id.to_string(),
                job_name: job_name.to_string(),
                job_id: job_id.to_string(),
                gc_grace_secs: None,
                engine: None,
                history: None,
            },
        })
    }

    /// Record `grace` as the job's sweep grace in the owner record.
    pub fn with_gc_grace(mut self, grace: std::time::Duration) -> Self {
        self.record.gc_grace_secs = Some(grace.as_secs());
        self
    }

    async fn read_record(&self) -> Result<Option<ScopeRecord>> {
        read_scope_record(self.store.as_ref(), &self.job).await
    }

    /// A key that does not exist must answer 404: with 403 instead (credentials without
    /// `s3:ListBucket`), a missing blob and a denied one look alike, so a restore fallback,
    /// the cleanup and the sweep could not tell a gone object from an unreadable one.
    async fn check_missing_is_not_found(&self) -> Result<()> {
        let missing = self
            .job
            .scope()
            .key(&format!("validate-missing-{:016x}", rand::random::<u64>()))?;
        match self.store.head(&missing).await {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Ok(_) => Err(Error::permanent(format!(
                "validate: {missing}, a key never written, exists"
            ))),
            Err(e) if e.kind() == ErrorKind::Permanent => Err(Error::permanent(format!(
                "validate: a missing key ({missing}) answers {e} instead of 404 Not Found: the credentials may read objects but not list the bucket (s3:ListBucket), so blobsnap cannot tell a missing blob from a denied one; grant s3:ListBucket on the bucket"
            ))),
            Err(e) => Err(e.context("validate: HEAD a missing key")),
        }
    }

    fn check_owner(&self, found: &ScopeRecord) -> Result<()> {
        if found.deployment_id != self.record.deployment_id {
            return Err(Error::conflict(format!(
                "scope {} belongs to deployment {:?}, not {:?}: two deployments must not share a job scope",
                self.job.scope(),
                found.deployment_id,
                self.record.deployment_id
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl StateBackendAdmin for BlobStoreAdmin {
    async fn create_resources(&self) -> Result<()> {
        if let Some(s3) = &self.s3 {
            s3.ensure_bucket().await?;
            s3.merge_abort_multipart_rule(self.job.scope().as_str())
                .await?;
        }
        let key = self.job.owner_record()?;
        let bytes = serde_json::to_vec(&self.record).map_err(|e| Error::invalid(e.to_string()))?;
        let sha = Sha256::of(&bytes);
        // Look first: a record of this deployment whose recorded grace differs is updated (the
        // job's grace setting changed); another deployment's record is a refusal. On a server
        // that ignores If-None-Match (Garage) this is also what keeps a sequential second
        // deployment from overwriting the first one's record.
        if let Some(found) = self.read_record().await? {
            self.check_owner(&found)?;
            if found.gc_grace_secs != self.record.gc_grace_secs
                && self.record.gc_grace_secs.is_some()
            {
                self.store
                    .put(
                        &key,
                        PutBody::Bytes(Bytes::from(bytes)),
                        PutOptions::default(),
                    )
                    .await
                    .map_err(|e| e.context(format!("update the owner record {key}")))?;
                tracing::info!(scope = %self.job.scope(), grace_secs = ?self.record.gc_grace_secs, "owner record: the job's sweep grace updated");
            }
            return Ok(());
        }
        let fenced =
            self.store.capabilities(Probe::IfUnknown).await?.create_only == CreateOnly::Atomic;
        let put = match self
            .store
            .put(
                &key,
                PutBody::Bytes(Bytes::from(bytes)),
                PutOptions::create_only(sha),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Conflict => match self.read_record().await? {
                Some(found) => self.check_owner(&found),
                None => Err(e),
            },
            Err(e) => Err(e),
        };
        if put.is_ok() && !fenced {
            // Two deployments racing on one new scope on such a server can still both pass.
            match self.read_record().await? {
                Some(found) => self.check_owner(&found)?,
                None => {
                    return Err(Error::transient(format!(
                        "scope {}: the owner record just written does not read back",
                        self.job.scope()
                    )))
                }
            }
        }
        put
    }

    async fn validate_resources(&self) -> Result<()> {
        let probe = self
            .job
            .scope()
            .key(&format!("validate-probe-{:016x}", rand::random::<u64>()))?;
        let body = Bytes::from_static(b"blobsnap validate");
        self.store
            .put(&probe, PutBody::Bytes(body.clone()), PutOptions::default())
            .await
            .map_err(|e| e.context("validate: PUT a probe object"))?;
        let back = get_bytes(self.store.as_ref(), &probe, 1 << 20)
            .await
            .map_err(|e| e.context("validate: GET the probe object"))?;
        let listed: Vec<_> = self
            .store
            .list(self.job.scope())
            .try_collect()
            .await
            .map_err(|e| e.context("validate: LIST the job scope"))?;
        let failures = self
            .store
            .delete_many(std::slice::from_ref(&probe))
            .await
            .map_err(|e| e.context("validate: DELETE the probe object"))?;
        if let Some((_, e)) = failures.into_iter().next() {
            return Err(e.context("validate: DELETE the probe object"));
        }
        if back != body || !listed.iter().any(|m| m.key == probe) {
            return Err(Error::permanent(
                "validate: the probe object did not read or list back as written",
            ));
        }
        match self.read_record().await? {
            Some(found) => self.check_owner(&found)?,
            None => {
                return Err(Error::not_found(format!(
                    "scope {} has no owner record (scope.json): create it with `blobsnap admin create --job JOB --job-id ID` (a job with job.create-resources = true, the default, creates it at its first start); a typo in the job name or id points here too",
                    self.job.scope()
                )))
            }
        }
        self.check_missing_is_not_found().await?;
        if let Some(s3) = &self.s3 {
            s3.check_no_expiration(self.job.scope().as_str()).await?;
        }
        Ok(())
    }
}

/// The owner record of `job`, if it has one.
pub async fn read_scope_record(
    store: &dyn BlobStore,
    job: &JobScope,
) -> Result<Option<ScopeRecord>> {
    let key = job.owner_record()?;
    match get_bytes(store, &key, 1 << 20).await {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::corrupt(format!("{key}: {e}"))),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A running task's lease, `writers/<task>/<nonce>.json`: written after the task's claim,
/// refreshed every quarter of its sweep grace, deleted when the task stops (and by the next
/// claim of the same task, which fences the old writer off). `blobsnap gc` reads the leases
/// to tell a running job from a stopped one: a lease younger than its grace is a writer that
/// may be between its blob PUTs and its checkpoint write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct WriterLease {
    /// The task.
    pub task: String,
    /// The writer's nonce.
    pub writer: String,
    /// Where it runs.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The task's sweep grace, seconds.
    pub gc_grace_secs: u64,
    /// Which process exactly (absent in leases of older versions): with it, a reader on the
    /// same machine can tell that the writer is gone ([`WriterLease::is_gone`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessIdentity>,
}

/// What identifies a process beyond its pid, which the kernel reuses: the machine's boot, the
/// pid namespace the pid is counted in, and the process's start time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ProcessIdentity {
    /// `/proc/sys/kernel/random/boot_id`: one per boot of one machine.
    pub boot_id: String,
    /// The pid namespace (`/proc/self/ns/pid`'s link, `pid:[N]`).
    pub pid_namespace: String,
    /// The process's start time, in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
}

impl ProcessIdentity {
    /// This process's identity (`None` where /proc does not say).
    pub fn current() -> Option<Self> {
        Some(ProcessIdentity {
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()?
                .trim()
                .to_string(),
            pid_namespace: pid_namespace()?,
            start_ticks: start_ticks(std::process::id())?,
        })
    }
}

fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()?
        .to_str()
        .map(str::to_string)
}

/// Field 22 of `/proc/<pid>/stat` (after the command name, which may hold spaces and
/// parentheses: parsed from its last `)`).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

impl WriterLease {
    /// A lease for `task` of this process.
    pub fn new(task: &str, gc_grace: std::time::Duration) -> Self {
        WriterLease {
            task: task.to_string(),
            writer: format!("{:032x}", rand::random::<u128>()),
            host: hostname(),
            pid: std::process::id(),
            gc_grace_secs: gc_grace.as_secs(),
            process: ProcessIdentity::current(),
        }
    }

    /// Whether the writer of this lease certainly no longer runs: it ran on this machine,
    /// in this boot and this pid namespace (so its pid is one this process can look up), and
    /// no process with its pid and start time exists. `false` whenever that cannot be known
    /// (another host, a lease without [`ProcessIdentity`], /proc unreadable).
    pub fn is_gone(&self) -> bool {
        let (Some(theirs), Some(ours)) = (&self.process, ProcessIdentity::current()) else {
            return false;
        };
        if self.host != hostname()
            || theirs.boot_id != ours.boot_id
            || theirs.pid_namespace != ours.pid_namespace
        {
            return false;
        }
        match start_ticks(self.pid) {
            None => !std::path::Path::new(&format!("/proc/{}", self.pid)).exists(),
            Some(t) => t != theirs.start_ticks,
        }
    }

    fn key(&self, job: &JobScope) -> Result<crate::blobstore::BlobKey> {
        job.writers(&self.task)?
            .key(&format!("{}.json", self.writer))
    }

    /// Write (or refresh) the lease, and delete the task's other leases: this process has
    /// claimed the task, so their writers are fenced off.
    pub async fn announce(&self, store: &dyn BlobStore, job: &JobScope) -> Result<()> {
        let key = self.key(job)?;
        let bytes = serde_json::to_vec(self).map_err(|e| Error::invalid(e.to_string()))?;
        store
            .put(
                &key,
                PutBody::Bytes(Bytes::from(bytes)),
                PutOptions::default(),
            )
            .await
            .map_err(|e| e.context(format!("write the writer lease {key}")))?;
        let others: Vec<_> = store
            .list(&job.writers(&self.task)?)
            .map_ok(|m| m.key)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .filter(|k| *k != key)
            .collect();
        if !others.is_empty() {
            store.delete_many(&others).await?;
        }
        Ok(())
    }

    /// Delete the lease (the task stopped).
    pub async fn retire(&self, store: &dyn BlobStore, job: &JobScope) -> Result<()> {
        let key = self.key(job)?;
        match store
            .delete_many(std::slice::from_ref(&key))
            .await?
            .into_iter()
            .next()
        {
            Some((_, e)) if e.kind() != ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Every writer lease of `job` with its age at `now` (by the store's clock) and its record
/// (`None`: it cannot be parsed); one retired while listed is left out.
async fn read_leases(
    store: &dyn BlobStore,
    job: &JobScope,
    now: std::time::SystemTime,
) -> Result<
    Vec<(
        crate::blobstore::BlobKey,
        Option<WriterLease>,
        std::time::Duration,
    )>,
> {
    let metas: Vec<_> = store.list(&job.all_writers()?).try_collect().await?;
    let mut out = Vec::new();
    for m in metas {
        let age = m
            .last_modified
            .and_then(|t| now.duration_since(t).ok())
            .unwrap_or_default();
        let lease = match get_bytes(store, &m.key, 1 << 20).await {
            Ok(b) => serde_json::from_slice::<WriterLease>(&b).ok(),
            Err(e) if e.kind() == ErrorKind::NotFound => continue, // retired meanwhile
            Err(e) => return Err(e.context(format!("read writer lease {}", m.key))),
        };
        out.push((m.key, lease, age));
    }
    Ok(out)
}

/// The leases of `job`'s writers younger than their grace at `now` (running tasks, or tasks
/// that died less than a grace ago), with their ages. A lease that cannot be parsed counts as
/// active with the job default grace (never silently ignored).
pub async fn active_writers(
    store: &dyn BlobStore,
    job: &JobScope,
    now: std::time::SystemTime,
) -> Result<Vec<(WriterLease, std::time::Duration)>> {
    let mut out = Vec::new();
    for (key, lease, age) in read_leases(store, job, now).await? {
        let lease = lease.unwrap_or_else(|| WriterLease {
            task: format!("? ({key})"),
            writer: String::new(),
            host: String::new(),
            pid: 0,
            gc_grace_secs: 86_400,
            process: None,
        });
        if age >= std::time::Duration::from_secs(lease.gc_grace_secs) {
            continue;
        }
        if lease.is_gone() {
            // Killed (SIGKILL, a crash) on this very machine: no commit of it is in flight.
            tracing::warn!(task = %lease.task, host = %lease.host, pid = lease.pid, age_secs = age.as_secs(), key = %key, "a writer lease of a process that no longer runs on this host: not an active writer");
            continue;
        }
        out.push((lease, age));
    }
    Ok(out)
}

/// What [`unlock`] found one lease to be, and whether it removed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct LeaseVerdict {
    /// The lease's key.
    pub key: String,
    /// Its task (`None`: the lease could not be read).
    pub task: Option<String>,
    /// Where its writer ran.
    pub host: Option<String>,
    /// Its writer's pid.
    pub pid: Option<u32>,
    /// Seconds since it was last renewed, by the store's clock.
    pub age_secs: u64,
    /// `expired` (older than its grace), `gone` (its process no longer runs on this host),
    /// `stopped-host` (its host was named as stopped), `live` (its process runs on this host:
    /// kept), `other-host` (another host's, within its grace: kept unless that host is named).
    pub verdict: &'static str,
    /// Whether it was (or, in a dry run, would be) removed.
    pub removed: bool,
}

/// Release the writer leases of a job known to be stopped (`blobsnap unlock`): a lease older
/// than its grace or whose process no longer runs on this host goes, and so does one of a
/// host in `stopped_hosts` (`*`: every other host, unreadable leases too); a lease whose
/// process runs on this host is never removed, and another host's within its grace is kept
/// unless named. Nothing is deleted in a `dry_run`. Returns every lease with its verdict.
pub async fn unlock(
    store: &dyn BlobStore,
    job: &JobScope,
    now: std::time::SystemTime,
    stopped_hosts: &[String],
    dry_run: bool,
) -> Result<Vec<LeaseVerdict>> {
    let all_hosts = stopped_hosts.iter().any(|h| h == "*");
    let mut out = Vec::new();
    let mut doomed = Vec::new();
    for (key, lease, age) in read_leases(store, job, now).await? {
        let verdict = match &lease {
            Some(l) if age >= std::time::Duration::from_secs(l.gc_grace_secs) => "expired",
            Some(l) if l.is_gone() => "gone",
            Some(l) if l.host == hostname() => "live",
            Some(l) if all_hosts || stopped_hosts.contains(&l.host) => "stopped-host",
            None if all_hosts => "stopped-host",
            _ => "other-host",
        };
        let removed = matches!(verdict, "expired" | "gone" | "stopped-host");
        if removed {
            doomed.push(key.clone());
        }
        out.push(LeaseVerdict {
            key: key.as_str().to_string(),
            task: lease.as_ref().map(|l| l.task.clone()),
            host: lease.as_ref().map(|l| l.host.clone()),
            pid: lease.as_ref().map(|l| l.pid),
            age_secs: age.as_secs(),
            verdict,
            removed,
        });
    }
    if !dry_run && !doomed.is_empty() {
        if let Some((k, e)) = store.delete_many(&doomed).await?.into_iter().next() {
            return Err(e.context(format!("delete writer lease {k}")));
        }
    }
    Ok(out)
}

/// The floor of a sweep's grace on a scope that records none and has no running writer (an
/// embedder's scope made before scopes recorded their grace, a manual backup's): the default
/// grace every writer abandons by (`BackupSettings::gc_grace`), 24 h — never less than what
/// a writer there may be using.
pub const UNRECORDED_GRACE_SECS: u64 = 86_400;

/// May a sweep of `grace` run on a scope whose owner record is `record` and whose active
/// writers are `active`? The job's grace (recorded, or the longest of its running writers', or
/// [`UNRECORDED_GRACE_SECS`] when the scope says nothing) is the floor:
/// - a grace at or over the floor is safe beside a running job (its commits are bounded by
///   half of it);
/// - a shorter one is refused unless `force`, and even forced, refused while a writer is
///   active: a task between its blob PUTs and its checkpoint write would lose its blobs.
pub fn sweep_guard(
    grace: std::time::Duration,
    record: Option<&ScopeRecord>,
    active: &[(WriterLease, std::time::Duration)],
    force: bool,
) -> Result<()> {
    let floor = record
        .and_then(|r| r.gc_grace_secs)
        .into_iter()
        .chain(active.iter().map(|(l, _)| l.gc_grace_secs))
        .max()
        .unwrap_or(UNRECORDED_GRACE_SECS);
    if grace.as_secs() >= floor {
        return Ok(());
    }
    if !force {
        return Err(Error::invalid(format!(
            "a sweep grace of {} s is under the job's {floor} s ({}): an upload in flight could lose its blobs; once no task of the job runs, pass --force",
            grace.as_secs(),
            if record.and_then(|r| r.gc_grace_secs).is_some() {
                "recorded in scope.json"
            } else if !active.is_empty() {
                "its running tasks' grace"
            } else {
                "the default grace: the scope records none"
            }
        )));
    }
    if let Some((l, age)) = active.first() {
        return Err(Error::conflict(format!(
            "{} writer(s) of the job active: task {:?} (host {:?}, pid {}) renewed its lease {} s ago, within its {} s grace — a sweep of {} s could delete the blobs of a commit in flight; stop the job (its leases are deleted when its tasks stop) or wait out the grace",
            active.len(),
            l.task,
            l.host,
            l.pid,
            age.as_secs(),
            l.gc_grace_secs,
            grace.as_secs()
        )));
    }
    tracing::warn!(
        grace_secs = grace.as_secs(),
        floor,
        "a sweep under the job's grace, forced: no writer of the job is active"
    );
    Ok(())
}

#[cfg(test)]
mod guard_tests {
    use super::*;
    use std::time::Duration;

    fn lease(grace: u64) -> WriterLease {
        WriterLease {
            task: "Partition 0".into(),
            writer: "w".into(),
            host: "h".into(),
            pid: 1,
            gc_grace_secs: grace,
            process: None,
        }
    }

    /// A lease of a process that ran on this machine and is gone is recognised as such; a
    /// live one (this process), one of another boot, pid namespace or host, and one without
    /// the identity (an older version's) never are.
    #[test]
    fn a_lease_of_a_dead_process_on_this_host_is_gone() {
        let mine = WriterLease::new("Partition 0", Duration::from_secs(60));
        assert!(
            mine.process.is_some(),
            "/proc gives this process's identity"
        );
        assert!(!mine.is_gone(), "this process runs");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let dead = WriterLease {
            pid,
            ..mine.clone()
        };
        assert!(dead.is_gone(), "pid {pid} exited");
        // The same pid with another start time: a reused pid, so the writer is gone too.
        let reused = WriterLease {
            process: mine.process.clone().map(|p| ProcessIdentity {
                start_ticks: p.start_ticks + 1,
                ..p
            }),
            ..mine.clone()
        };
        assert!(reused.is_gone());
        for other in [
            WriterLease {
                host: format!("{}-elsewhere", mine.host),
                pid,
                ..mine.clone()
            },
            WriterLease {
                pid,
                process: mine.process.clone().map(|p| ProcessIdentity {
                    boot_id: "another boot".into(),
                    ..p
                }),
                ..mine.clone()
            },
            WriterLease {
                pid,
                process: mine.process.clone().map(|p| ProcessIdentity {
                    pid_namespace: "pid:[1]".into(),
                    ..p
                }),
                ..mine.clone()
            },
            WriterLease {
                pid,
                process: None,
                ..mine.clone()
            },
        ] {
            assert!(!other.is_gone(), "{other:?}");
        }
    }

    #[test]
    fn a_sweep_under_the_jobs_grace_needs_force_and_no_active_writer() {
        let rec = ScopeRecord {
            deployment_id: "d".into(),
            job_name: "j".into(),
            job_id: "1".into(),
            gc_grace_secs: Some(3600),
            engine: None,
            history: None,
        };
        let s = Duration::from_secs;
        // At or over the recorded grace: fine, running writers or not.
        sweep_guard(s(3600), Some(&rec), &[(lease(3600), s(5))], false).unwrap();
        // Under it: refused unless forced...
        let e = sweep_guard(s(0), Some(&rec), &[], false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("3600 s"), "{e}");
        sweep_guard(s(0), Some(&rec), &[], true).unwrap();
        // ...and refused while a writer is active, forced or not.
        let e = sweep_guard(s(0), Some(&rec), &[(lease(3600), s(5))], true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
        // No record: the running writers' grace, else the default grace every writer
        // abandons by (a record without a grace likewise): never a 60 s floor beside an
        // embedder's or a manual backup's upload in flight (N1 of the second review).
        let e = sweep_guard(s(600), None, &[(lease(3600), s(5))], false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        let bare = ScopeRecord {
            gc_grace_secs: None,
            ..rec.clone()
        };
        for r in [None, Some(&bare)] {
            let e = sweep_guard(s(60), r, &[], false).unwrap_err();
            assert!(e.to_string().contains("records none"), "{e}");
            sweep_guard(s(UNRECORDED_GRACE_SECS), r, &[], false).unwrap();
            sweep_guard(s(60), r, &[], true).unwrap();
        }
    }
}
