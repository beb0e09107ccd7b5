//! Every object and byte of a job's scope, explained (`blobsnap usage`): one streamed listing,
//! each object put in exactly one class, with counts, bytes and the oldest object of each.
//!
//! | class | what |
//! |---|---|
//! | `live` | an index or blob a retained checkpoint of some task names |
//! | `borrowed-by-forks` | named by no retained checkpoint, but by a savepoint a fork pins (a fork of this job reads it) |
//! | `savepoints-only` | named by a savepoint (no fork pins it) and by no retained checkpoint |
//! | `orphans-within-grace` | an index or blob nothing names, younger than the grace: an upload in flight, or garbage the sweep takes once it is old enough |
//! | `orphans-past-grace` | nothing names it and it is older than the grace: a leak (the next `gc` deletes it) |
//! | `metadata` | checkpoint documents, writer leases, savepoints, forks' pins, `scope.json`, start-from records |
//! | `unknown` | a key of no known shape (never deleted by `gc`; reported) |
//! | `maybe-live` | an index or blob no readable root names, where a root that cannot be read may name it: live or an orphan, unknown until that root can be read or is gone |
//! | `stale-multipart` | incomplete multipart uploads older than the grace (their parts' bytes are not listed) |
//!
//! The roots are read first (as the sweep reads them); the listing is then streamed, so
//! memory is bounded by the live set, not by the scope. Read-only: the grace is judged on
//! this machine's clock (no probe object is written).
//!
//! A root that cannot be read (a checkpoint document or savepoint record damaged, an index
//! gone or corrupt) does not stop the report, unlike the sweep (which fails closed on it): it
//! is named in [`UsageReport::unreadable_roots`], the report is `partial`, and what it may
//! name — the objects of its store (an index), its task (a checkpoint document) or the whole
//! job (a savepoint record) that no readable root names — is counted as `maybe-live`, never
//! as an orphan. A store that fails (transient, permanent, I/O) still fails the report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt as _;
use serde::Serialize;

use crate::blobstore::{BlobStore, Probe};
use crate::error::Result;
use crate::layout::{parse, JobScope, KeyKind};

/// One class of objects.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct UsageClass {
    /// How many.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The oldest of them (by last-modified), and its age in seconds.
    pub oldest: Option<String>,
    /// Its age, seconds.
    pub oldest_age_secs: Option<u64>,
    #[serde(skip)]
    oldest_at: Option<SystemTime>,
}

impl UsageClass {
    fn add(&mut self, key: &str, size: u64, at: Option<SystemTime>, now: SystemTime) {
        self.objects += 1;
        self.bytes += size;
        if let Some(at) = at {
            if self.oldest_at.is_none_or(|o| at < o) {
                self.oldest_at = Some(at);
                self.oldest = Some(key.to_string());
                self.oldest_age_secs = Some(now.duration_since(at).map_or(0, |d| d.as_secs()));
            }
        }
    }
}

/// What `usage` found.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct UsageReport {
    /// The grace the orphans were judged by, seconds.
    pub grace_secs: u64,
    /// Where it came from (`given`, `scope.json`, `default`).
    pub grace_from: String,
    /// Checkpoints and savepoints read as roots.
    pub roots: u64,
    /// Every class, by name (see the module docs).
    pub classes: BTreeMap<String, UsageClass>,
    /// Objects and bytes listed in all.
    pub total_objects: u64,
    /// Bytes listed in all.
    pub total_bytes: u64,
    /// Whether incomplete multipart uploads could be listed on this store.
    pub multipart_listed: bool,
    /// Whether some root could not be read (then `unreadable-roots` names each, and
    /// `maybe-live` holds what they may name).
    pub partial: bool,
    /// Every root that could not be read.
    pub unreadable_roots: Vec<crate::blob::collect::gc::UnreadableRoot>,
}

/// Classify every object of `job_name`/`job_id` at `now`, orphans judged by `grace` (or the
/// job's recorded grace, or the default 24 h).
pub async fn usage(
    store: &Arc<dyn BlobStore>,
    job_name: &str,
    job_id: &str,
    grace: Option<Duration>,
    now: SystemTime,
) -> Result<UsageReport> {
    let job = JobScope::new(job_name, job_id)?;
    crate::blob::time::history::require_job(store.as_ref(), &job).await?;
    let (grace, grace_from) = match grace {
        Some(g) => (g, "given"),
        None => match crate::blob::collect::admin::read_scope_record(store.as_ref(), &job)
            .await?
            .and_then(|r| r.gc_grace_secs)
        {
            Some(s) => (Duration::from_secs(s), "scope.json"),
            None => (
                Duration::from_secs(crate::blob::collect::admin::UNRECORDED_GRACE_SECS),
                "default",
            ),
        },
    };
    let cutoff = now.checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH);
    let (roots, unreadable) =
        crate::blob::collect::gc::read_roots_partial(store, &job, job_name, job_id).await?;
    let mut report = UsageReport {
        grace_secs: grace.as_secs(),
        grace_from: grace_from.into(),
        roots: roots.roots,
        partial: !unreadable.is_empty(),
        unreadable_roots: unreadable,
        ..Default::default()
    };
    // Reading a root that is among the unreadable ones again (for the forks' pins below)
    // fails the same way: it is named already.
    let named_already =
        |e: &crate::error::Error| report.partial && crate::blob::collect::gc::is_unreadable(e);
    // What the savepoints that forks pin keep: a fork reads it.
    let mut borrowed = std::collections::HashSet::new();
    let pinned: std::collections::BTreeSet<String> = {
        let mut names = std::collections::BTreeSet::new();
        let mut pins = store.list(&job.savepoints()?);
        while let Some(m) = pins.try_next().await? {
            if let Some(KeyKind::ForkPin { savepoint, .. }) = parse(&m.key).map(|p| p.kind) {
                names.insert(savepoint);
            }
        }
        names
    };
    for name in &pinned {
        let sp = match crate::blob::time::savepoint::read(store.as_ref(), &job, name).await {
            Ok(sp) => sp,
            Err(e) if e.kind() == crate::error::ErrorKind::NotFound => continue,
            Err(e) if named_already(&e) => continue,
            Err(e) => return Err(e),
        };
        for (task, store_name, marker) in sp.markers()? {
            let who = crate::blob::snapshot::Expected {
                job_name,
                job_id,
                task_name: &task,
                store_name: &store_name,
            };
            let snap =
                match crate::blob::snapshot::load_snapshot(store.as_ref(), &who, &marker).await {
                    Ok(snap) => snap,
                    Err(e) if named_already(&e) => continue,
                    Err(e) => return Err(e),
                };
            borrowed.insert(snap.scope.index_key(&snap.marker)?);
            for (_, f) in snap.index.present_files() {
                for b in &f.blobs {
                    borrowed.insert(snap.blobs.key(&b.blob_id)?);
                }
            }
        }
    }
    for c in [
        "live",
        "borrowed-by-forks",
        "savepoints-only",
        "orphans-within-grace",
        "orphans-past-grace",
        "metadata",
        "unknown",
        "maybe-live",
        "stale-multipart",
    ] {
        report.classes.insert(c.into(), UsageClass::default());
    }
    let mut listing = store.list(job.scope());
    while let Some(m) = listing.try_next().await? {
        let class = match parse(&m.key).map(|p| p.kind) {
            Some(KeyKind::Index { .. } | KeyKind::Blob { .. }) => {
                if roots.history.contains(&m.key) {
                    "live"
                } else if borrowed.contains(&m.key) {
                    "borrowed-by-forks"
                } else if roots.savepoints.contains(&m.key) {
                    "savepoints-only"
                } else if report.unreadable_roots.iter().any(|r| r.may_name(&m.key)) {
                    "maybe-live"
                } else if m.last_modified.is_some_and(|t| t < cutoff) {
                    "orphans-past-grace"
                } else {
                    "orphans-within-grace"
                }
            }
            Some(
                KeyKind::Checkpoint { .. }
                | KeyKind::Writer { .. }
                | KeyKind::OwnerRecord
                | KeyKind::Savepoint { .. }
                | KeyKind::ForkPin { .. }
                | KeyKind::StartFrom { .. },
            ) => "metadata",
            _ => "unknown",
        };
        report.total_objects += 1;
        report.total_bytes += m.size;
        if let Some(c) = report.classes.get_mut(class) {
            c.add(m.key.as_str(), m.size, m.last_modified, now);
        }
    }
    report.multipart_listed = store.capabilities(Probe::Never).await?.multipart_listing;
    if report.multipart_listed {
        for u in store.incomplete_uploads(job.scope(), None).await? {
            if u.initiated.is_some_and(|t| t < cutoff) {
                if let Some(c) = report.classes.get_mut("stale-multipart") {
                    c.add(u.key.as_str(), 0, u.initiated, now);
                }
            }
        }
    }
    Ok(report)
}
