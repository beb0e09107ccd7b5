//! The whole-job check (`blobsnap check`; restic's `check` is the anchor): every retained
//! checkpoint and every savepoint of every task parses, every index it names is present and
//! matches its key (the key carries the SHA-256 of the index's bytes), and every blob those
//! indexes list exists with its size (HEAD) — and, with `read_data`, hashes to its SHA-256
//! (all blobs, or an exact random share).
//!
//! Each index and each blob is checked once, however many checkpoints share it; a problem is
//! reported with **every** root that needs what is wrong (task, checkpoint number or
//! savepoint, store) — for a blob, every snapshot that lists it, not only the first one read —
//! each with what the problem costs it, and with what `gc` does about it:
//!
//! - an index (or a checkpoint document, or a savepoint record) that cannot be read: `gc` and
//!   the job's cleanup **fail closed** (they cannot know what it keeps alive), until the root
//!   leaves retention or is removed;
//! - a blob that is missing or corrupt: `gc` is **not** stopped — it never reads blob
//!   contents; it keeps a corrupt blob while any root names it, and deletes it after the grace
//!   once none does. What fails is a restore of each root that names it (the task's next start
//!   when that is its latest checkpoint, a rollback, a start from the savepoint).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt as _;
use serde::Serialize;

use crate::blob::snapshot::{load_snapshot, Expected, FACTORY_NAME};
use crate::blobstore::{hash_object, BlobKey, BlobStore};
use crate::checkpoint::BlobCheckpointStore;
use crate::digest::Sha256;
use crate::error::{ErrorKind, Result};
use crate::layout::JobScope;

/// What to check.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Download and hash blobs (else HEAD only).
    pub read_data: bool,
    /// With `read_data`: the percentage of the distinct blobs downloaded, in (0, 100].
    pub subset_pct: f64,
}

/// One problem, with every root that names what is wrong.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Problem {
    /// `not-found`, `corrupt`, …
    pub kind: String,
    /// What is wrong.
    pub message: String,
    /// Every root that needs it, each with what the problem costs it: `task "Partition 0"
    /// checkpoint #12 (…; the task's latest checkpoint: …) store counts`, `savepoint
    /// before-upgrade task … store counts (…)`. Checkpoints first (by task, newest first),
    /// then savepoints.
    pub named_by: Vec<String>,
    /// What `gc` (and the job's cleanup) does about it: fails closed on an unreadable root,
    /// keeps a bad blob while a root names it (see the module docs).
    pub gc: String,
}

/// What a check found.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CheckReport {
    /// Tasks with a checkpoint history.
    pub tasks: u64,
    /// Retained checkpoints read.
    pub checkpoints: u64,
    /// Savepoints read.
    pub savepoints: u64,
    /// Distinct snapshot indexes checked.
    pub indexes: u64,
    /// Distinct blobs checked (HEAD).
    pub blobs: u64,
    /// Blobs downloaded and hashed.
    pub blobs_read: u64,
    /// Bytes of the blobs checked.
    pub bytes: u64,
    /// The problems, worst first.
    pub problems: Vec<Problem>,
    #[serde(skip)]
    worst: Option<ErrorKind>,
}

impl CheckReport {
    /// The kind that names the outcome (missing beats corrupt beats the rest); `None`: clean.
    pub fn worst(&self) -> Option<ErrorKind> {
        self.worst
    }

    fn add(&mut self, kind: ErrorKind, message: String, named_by: Vec<String>, gc: &str) {
        self.worst = match (self.worst, kind) {
            (Some(ErrorKind::NotFound), _) | (_, ErrorKind::NotFound) => Some(ErrorKind::NotFound),
            (Some(ErrorKind::Corrupt), _) | (_, ErrorKind::Corrupt) => Some(ErrorKind::Corrupt),
            (Some(w), _) => Some(w),
            (None, k) => Some(k),
        };
        self.problems.push(Problem {
            kind: kind.as_str().to_string(),
            message,
            named_by,
            gc: gc.to_string(),
        });
    }
}

/// What `gc` does about a checkpoint document or savepoint record that cannot be read.
const GC_FAILS_CLOSED: &str = "gc and the job's cleanup fail closed (delete nothing) while this root cannot be read: they cannot know what it keeps alive";
/// What `gc` does about an index that cannot be read: the roots that name it decide how long.
const GC_INDEX: &str = "gc fails closed (deletes nothing) while a retained checkpoint or savepoint names this index: it cannot know what the index keeps alive";
/// What `gc` does about an index whose inline file does not match its hash.
const GC_INLINE: &str = "gc is not stopped by it: it keeps the index while any checkpoint or savepoint names it, and deletes it after the grace once none does";
/// What `gc` does about a blob that is missing or corrupt.
const GC_BLOB: &str = "gc is not stopped by it (it never reads blob contents): a corrupt blob is kept while any checkpoint or savepoint names it, and deleted after the grace once none does";
/// What gc does about a blob that is missing.
const GC_MISSING_BLOB: &str = "gc is not stopped by it (it never reads blob contents): nothing can bring it back; each checkpoint or savepoint that names it fails to restore until retention or `forget --checkpoint` / `savepoint rm` lets it go";

/// A root that names a store snapshot: a retained checkpoint of a task, or a savepoint.
#[derive(Clone, Debug)]
struct Root {
    task: String,
    store: String,
    kind: RootKind,
}

#[derive(Clone, Debug)]
enum RootKind {
    Checkpoint { seq: u64, id: String, latest: bool },
    Savepoint(String),
}

impl Root {
    /// Checkpoints first (by task, newest first), then savepoints (by name, task).
    fn order(&self) -> (u8, &str, std::cmp::Reverse<u64>, &str) {
        match &self.kind {
            RootKind::Checkpoint { seq, .. } => (0, &self.task, std::cmp::Reverse(*seq), ""),
            RootKind::Savepoint(name) => (1, name, std::cmp::Reverse(0), &self.task),
        }
    }

    /// The root, and what an index of its that cannot be read costs it.
    fn for_index(&self) -> String {
        let (task, store) = (&self.task, &self.store);
        match &self.kind {
            RootKind::Checkpoint { seq, id, latest: true } => format!(
                "task {task:?} checkpoint #{seq} ({id}; the task's latest checkpoint: a restore needs it) store {store}"
            ),
            RootKind::Checkpoint { seq, id, latest: false } => format!(
                "task {task:?} checkpoint #{seq} ({id}; an older retained checkpoint: gc fails closed on it until it leaves retention or `blobsnap forget --checkpoint` removes it) store {store}"
            ),
            RootKind::Savepoint(name) => format!(
                "savepoint {name} task {task:?} store {store} (gc fails closed on it until it is removed: blobsnap savepoint rm)"
            ),
        }
    }

    /// The root, and what a missing or corrupt blob (or inline file) of its costs it.
    fn for_blob(&self) -> String {
        let (task, store) = (&self.task, &self.store);
        match &self.kind {
            RootKind::Checkpoint { seq, id, latest: true } => format!(
                "task {task:?} checkpoint #{seq} ({id}; the task's latest checkpoint: its restore, the task's next start, fails) store {store}"
            ),
            RootKind::Checkpoint { seq, id, latest: false } => format!(
                "task {task:?} checkpoint #{seq} ({id}; an older retained checkpoint: a restore of it, or a rollback to it, fails) store {store}"
            ),
            RootKind::Savepoint(name) => format!(
                "savepoint {name} task {task:?} store {store} (a restore of it, or a start from it, fails)"
            ),
        }
    }
}

/// A store snapshot: (task, store, marker).
type Snapshot = (String, String, String);

/// One distinct blob to check.
struct BlobToCheck<'a> {
    /// Its size, as the index says.
    size: u64,
    /// Its SHA-256, as the index says.
    sha256: Option<Sha256>,
    /// The file of the first snapshot that lists it, for the message.
    what: String,
    /// Every snapshot that lists it: a blob shared by several checkpoints is needed by each.
    snapshots: Vec<&'a Snapshot>,
}

/// `roots` in their order (see [`Root::order`]), each described by `describe`, once.
fn describe(roots: &[&Root], describe: fn(&Root) -> String) -> Vec<String> {
    let mut sorted = roots.to_vec();
    sorted.sort_by(|a, b| a.order().cmp(&b.order()));
    let mut out: Vec<String> = sorted.into_iter().map(describe).collect();
    out.dedup();
    out
}

/// Check every root of `job_name`/`job_id` (see the module docs). Problems are reported, not
/// returned; an error means the check itself could not run (the listing failed).
pub async fn check_job(
    store: &Arc<dyn BlobStore>,
    job_name: &str,
    job_id: &str,
    opts: &CheckOptions,
) -> Result<CheckReport> {
    crate::blob::inspect::verify::VerifyOptions {
        deep: opts.read_data,
        sample_pct: opts.subset_pct,
    }
    .validate()?;
    let job = JobScope::new(job_name, job_id)?;
    crate::blob::time::history::require_job(store.as_ref(), &job).await?;
    let mut report = CheckReport::default();
    let mut named: Vec<(String, Root)> = Vec::new();

    // The roots: every task's history, then the savepoints.
    let tasks = crate::blob::time::history::task_names(store.as_ref(), &job).await?;
    report.tasks = tasks.len() as u64;
    let cps = BlobCheckpointStore::new(Arc::clone(store), job.clone());
    for task in &tasks {
        // Every document is read; each unreadable one is named by its key (issue 47), the
        // readable ones are checked.
        let listing = match cps.listing(task).await {
            Ok(l) => l,
            Err(e) => {
                report.add(
                    e.kind(),
                    format!("the checkpoint history of task {task:?} cannot be listed: {e}"),
                    vec![format!("task {task:?}")],
                    GC_FAILS_CLOSED,
                );
                continue;
            }
        };
        let mut history = Vec::new();
        for l in listing {
            match l.record {
                Ok(crate::checkpoint::Record::Checkpoint(c)) => history.push(c),
                Ok(crate::checkpoint::Record::Removed { .. }) => {}
                Err(e) => {
                    let fix = if e.kind() == crate::error::ErrorKind::Corrupt {
                        format!(
                            " (gc fails closed on it; `blobsnap forget --checkpoint {}` removes it)",
                            l.key
                        )
                    } else {
                        String::new()
                    };
                    report.add(
                        e.kind(),
                        format!(
                            "checkpoint #{} of task {task:?} cannot be read: {e}{fix}",
                            l.seq
                        ),
                        vec![l.key.to_string()],
                        GC_FAILS_CLOSED,
                    )
                }
            }
        }
        let newest = history.first().map(|c| c.seq);
        for c in &history {
            report.checkpoints += 1;
            let Some(v2) = c.checkpoint.as_v2() else {
                continue;
            };
            for (s, m) in v2
                .state_checkpoint_markers
                .get(FACTORY_NAME)
                .into_iter()
                .flatten()
            {
                named.push((
                    m.clone(),
                    Root {
                        task: task.clone(),
                        store: s.clone(),
                        kind: RootKind::Checkpoint {
                            seq: c.seq,
                            id: v2.id.to_string(),
                            latest: Some(c.seq) == newest,
                        },
                    },
                ));
            }
        }
    }
    let mut savepoints = Vec::new();
    {
        use futures::TryStreamExt as _;
        let metas: Vec<_> = store.list(&job.savepoints()?).try_collect().await?;
        // Records and forks' pins come in one listing: a pin without its record stops every
        // collector of the job (`savepoint::list_roots`), so it is a problem here too.
        let mut names = std::collections::BTreeSet::new();
        let mut pins = Vec::new();
        for m in &metas {
            match crate::layout::parse(&m.key).map(|p| p.kind) {
                Some(crate::layout::KeyKind::Savepoint { name }) => {
                    names.insert(name);
                }
                Some(crate::layout::KeyKind::ForkPin {
                    savepoint,
                    fork_job,
                    fork_id,
                    task,
                }) => pins.push((
                    savepoint,
                    format!("{fork_job}/{fork_id} task {task}"),
                    m.key.clone(),
                )),
                _ => {}
            }
        }
        for (savepoint, fork, key) in pins {
            if !names.contains(&savepoint) {
                report.add(
                    ErrorKind::Conflict,
                    format!("fork {fork} pins savepoint {savepoint:?}, which has no record ({key}): the job's cleanup and gc delete nothing until the pin goes or the savepoint is back"),
                    vec![format!("fork pin {key}")],
                    GC_FAILS_CLOSED,
                );
            }
        }
        for m in metas {
            let Some(crate::layout::KeyKind::Savepoint { name }) =
                crate::layout::parse(&m.key).map(|p| p.kind)
            else {
                continue;
            };
            match crate::blob::time::savepoint::read(store.as_ref(), &job, &name).await {
                Ok(sp) => savepoints.push(sp),
                Err(e) => report.add(
                    e.kind(),
                    format!("savepoint {name:?} cannot be read: {e} (gc fails closed on it; remove it with blobsnap savepoint rm)"),
                    vec![format!("savepoint {name}")],
                    GC_FAILS_CLOSED,
                ),
            }
        }
    }
    for sp in &savepoints {
        report.savepoints += 1;
        match sp.markers() {
            Ok(ms) => {
                for (task, s, m) in ms {
                    named.push((
                        m,
                        Root {
                            task,
                            store: s,
                            kind: RootKind::Savepoint(sp.name.clone()),
                        },
                    ));
                }
            }
            Err(e) => report.add(
                e.kind(),
                e.to_string(),
                vec![format!("savepoint {}", sp.name)],
                GC_FAILS_CLOSED,
            ),
        }
    }

    // Each distinct snapshot once, with every root that names it.
    let mut by_snapshot: BTreeMap<Snapshot, Vec<Root>> = BTreeMap::new();
    for (marker, root) in named {
        by_snapshot
            .entry((root.task.clone(), root.store.clone(), marker))
            .or_default()
            .push(root);
    }
    let mut blobs: BTreeMap<BlobKey, BlobToCheck<'_>> = BTreeMap::new();
    for (snapshot, roots) in &by_snapshot {
        let (task, store_name, marker) = snapshot;
        report.indexes += 1;
        let refs: Vec<&Root> = roots.iter().collect();
        let who = Expected {
            job_name,
            job_id,
            task_name: task,
            store_name,
        };
        let snap = match load_snapshot(store.as_ref(), &who, marker).await {
            Ok(s) => s,
            Err(e) => {
                report.add(
                    e.kind(),
                    format!("index {marker} of task {task:?} store {store_name}: {e}"),
                    describe(&refs, Root::for_index),
                    GC_INDEX,
                );
                continue;
            }
        };
        for (path, f) in snap.index.present_files() {
            if let Err(e) = f.verified_inline_bytes() {
                report.add(
                    e.kind(),
                    format!("{marker}: {path}: {e}"),
                    describe(&refs, Root::for_blob),
                    GC_INLINE,
                );
            }
            for b in &f.blobs {
                let key = snap.blobs.key(&b.blob_id)?;
                let entry = blobs.entry(key).or_insert_with(|| BlobToCheck {
                    size: f.file_metadata.size,
                    sha256: f.sha256,
                    what: format!("{marker}: {path}"),
                    snapshots: Vec::new(),
                });
                if entry.snapshots.last() != Some(&snapshot) {
                    entry.snapshots.push(snapshot);
                }
            }
        }
    }

    // Each distinct blob once, 16 at a time; a share of them read whole.
    let n = blobs.len();
    let chosen: BTreeSet<usize> = if !opts.read_data {
        BTreeSet::new()
    } else if opts.subset_pct >= 100.0 {
        (0..n).collect()
    } else {
        let k = ((n as f64 * opts.subset_pct / 100.0).ceil() as usize).min(n);
        rand::seq::index::sample(&mut rand::rng(), n, k)
            .into_iter()
            .collect()
    };
    let results: Vec<_> = futures::stream::iter(blobs.into_iter().enumerate())
        .map(|(i, (key, blob))| {
            let BlobToCheck {
                size,
                sha256: sha,
                what,
                snapshots,
            } = blob;
            let read = chosen.contains(&i);
            let store = Arc::clone(store);
            async move {
                let outcome = match store.head(&key).await {
                    Ok(meta) if meta.size != size => Some((
                        ErrorKind::Corrupt,
                        format!(
                            "{what}: blob {key} is {} bytes, the index says {size}",
                            meta.size
                        ),
                    )),
                    Ok(_) if read => match hash_object(store.as_ref(), &key).await {
                        Ok((got, _)) if Some(got) != sha => Some((
                            ErrorKind::Corrupt,
                            format!(
                                "{what}: blob {key} has SHA-256 {got}, the index says {}",
                                sha.map(|s| s.to_hex()).unwrap_or_default()
                            ),
                        )),
                        Ok(_) => None,
                        Err(e) => Some((e.kind(), format!("{what}: blob {key}: {e}"))),
                    },
                    Ok(_) => None,
                    // The key once: the store's "no object KEY" would name it again.
                    Err(e) if e.kind() == ErrorKind::NotFound => Some((
                        ErrorKind::NotFound,
                        format!("{what}: blob {key} is missing"),
                    )),
                    Err(e) => Some((e.kind(), format!("{what}: blob {key}: {e}"))),
                };
                (size, read, outcome, snapshots)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for (size, read, outcome, snapshots) in results {
        report.blobs += 1;
        report.bytes += size;
        report.blobs_read += u64::from(read);
        if let Some((kind, message)) = outcome {
            let roots: Vec<&Root> = snapshots
                .into_iter()
                .filter_map(|s| by_snapshot.get(s))
                .flatten()
                .collect();
            let gc = if kind == ErrorKind::NotFound {
                GC_MISSING_BLOB
            } else {
                GC_BLOB
            };
            report.add(kind, message, describe(&roots, Root::for_blob), gc);
        }
    }
    let rank = |k: &str| match k {
        "not-found" => 0,
        "corrupt" => 1,
        _ => 2,
    };
    report.problems.sort_by_key(|p| rank(&p.kind));
    Ok(report)
}
