//! State through time, read side: every retained checkpoint of a job's tasks, and references
//! to one of them that an operator can type.
//!
//! A [`CheckpointRef`] names a committed checkpoint of one task:
//!
//! | text | resolves to |
//! |---|---|
//! | `latest` | the task's newest checkpoint |
//! | `#N` | the checkpoint with sequence number `N` |
//! | `1733133600000-7`, `17331336` | the checkpoint with that id, or the one id starting so (unique among the retained) |
//! | `@2026-12-02T10:00Z`, `@2026-12-02T10:00:00Z`, `@2026-12-02T10:00:00.250Z`, `@2026-12-02` | the newest checkpoint made at or before that UTC time (by its id's clock, to the millisecond) |
//! | `savepoint:NAME`, `NAME` | the task's checkpoint in savepoint `NAME` (`blob::savepoint`) |
//!
//! A bare word is an id (prefix) when it is made of digits and `-`, a savepoint name
//! otherwise; `savepoint:` forces the name.
//!
//! **A printed time names the checkpoint it was printed for.** `@TIME` compares to the
//! millisecond (the precision of a checkpoint id's clock), and a checkpoint's time is printed
//! to the millisecond (`checkpoints`, `savepoint show`, `forget`: [`utc_millis`]), so a time
//! copied from a listing reads back as exactly that checkpoint's time and `@TIME` resolves to
//! it. The other choice — print to the second and compare at the printed precision (a time
//! to the second meaning the end of that second) — cannot do this: a task commits several
//! times a second (the demo does; so does any job with a short commit interval), and
//! `checkpoints` would print one time for all of them, which would name the newest of that
//! second, not the one it was printed beside. A time typed with less precision still means
//! its first millisecond (`@2026-12-02` is midnight). One case remains: two commits of a task
//! within the same millisecond (ids `T-1` and `T-2`) share a time, which names the newer;
//! name the older by `#N` or its id. The history is the task's checkpoint documents
//! (`checkpoints/<task>/`), newest first; a claim repeats the checkpoint before it under the
//! next number, so two numbers can carry one id: the newest number wins.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use futures::TryStreamExt as _;

use crate::blobstore::BlobStore;
use crate::checkpoint::{BlobCheckpointStore, Checkpoint, CheckpointStore, CommittedCheckpoint};
use crate::error::{Error, ErrorKind, Result};
use crate::layout::{parse, JobScope};

/// A reference to one committed checkpoint of a task (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointRef {
    /// The newest.
    Latest,
    /// By sequence number.
    Seq(u64),
    /// By checkpoint id, or a unique prefix of one.
    Id(String),
    /// The newest made at or before this time, ms since the epoch (UTC).
    At(u64),
    /// The task's checkpoint in a savepoint.
    Savepoint(String),
    /// A savepoint of another job, `savepoint:JOB/JOB-ID/NAME`: a fork point, only for
    /// `start-from` (`blob::fork`).
    Fork(crate::blob::time::record::ForkSource),
}

impl FromStr for CheckpointRef {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "checkpoint reference {s:?}: {why} (expected latest, #N, a checkpoint id or a unique prefix of one, @2026-12-02T10:00Z, or savepoint:NAME)"
            ))
        };
        if s == "latest" {
            return Ok(CheckpointRef::Latest);
        }
        if let Some(n) = s.strip_prefix('#') {
            return n
                .parse()
                .map(CheckpointRef::Seq)
                .map_err(|_| bad("#N takes a sequence number"));
        }
        if let Some(t) = s.strip_prefix('@') {
            return parse_time(t).map(CheckpointRef::At).map_err(|e| bad(&e));
        }
        if let Some(name) = s.strip_prefix("savepoint:") {
            if name.contains('/') {
                return name.parse().map(CheckpointRef::Fork);
            }
            crate::blob::time::record::validate_name(name)?;
            return Ok(CheckpointRef::Savepoint(name.to_string()));
        }
        if s.is_empty() {
            return Err(bad("empty"));
        }
        if s.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
            return Ok(CheckpointRef::Id(s.to_string()));
        }
        crate::blob::time::record::validate_name(s)
            .map_err(|_| bad("not an id, a time or a savepoint name"))?;
        Ok(CheckpointRef::Savepoint(s.to_string()))
    }
}

impl fmt::Display for CheckpointRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointRef::Latest => write!(f, "latest"),
            CheckpointRef::Seq(n) => write!(f, "#{n}"),
            CheckpointRef::Id(id) => write!(f, "{id}"),
            // A whole second as before (`@2026-12-02T10:00:00Z`: the text a start-from record
            // holds, compared by `job::start_from`), else exact to the millisecond.
            CheckpointRef::At(ms) if ms % 1000 == 0 => write!(f, "@{}", utc(*ms)),
            CheckpointRef::At(ms) => write!(f, "@{}", utc_millis(*ms)),
            CheckpointRef::Savepoint(n) => write!(f, "savepoint:{n}"),
            CheckpointRef::Fork(src) => write!(f, "savepoint:{src}"),
        }
    }
}

impl CheckpointRef {
    /// Whether `text` — a reference as a start-from record holds it — is this reference: its
    /// text, or for `@TIME` the text an earlier blobsnap wrote (to the second: a point
    /// applied before must not be applied again after an upgrade).
    pub fn is_recorded_as(&self, text: &str) -> bool {
        text == self.to_string()
            || matches!(self, CheckpointRef::At(ms) if text == format!("@{}", utc(*ms)))
    }
}

/// `2026-12-02T10:00Z`, `2026-12-02T10:00:00Z`, `2026-12-02T10:00:00.250Z`, `2026-12-02` (UTC
/// midnight), or milliseconds since the epoch → ms since the epoch.
pub fn parse_time(t: &str) -> std::result::Result<u64, String> {
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map_err(|e| format!("{e}"));
    }
    let mut full = t.trim_end_matches('Z').to_string();
    match full.len() {
        10 => full.push_str("T00:00:00"),
        16 => full.push_str(":00"),
        _ => {}
    }
    full.push('Z');
    let when = humantime::parse_rfc3339(&full)
        .map_err(|e| format!("{t:?} is not a UTC time like 2026-12-02T10:00Z ({e})"))?;
    when.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .map_err(|_| format!("{t:?} is before 1970"))
}

pub use crate::units::{utc, utc_millis};

/// How many objects of the whole store a failed [`require_job`] reads to list the jobs it
/// holds (10 LIST pages): a typo costs at most that, however big the bucket.
pub const JOBS_LISTED_FROM: usize = 10_000;

/// `NotFound` unless something is stored under `job`'s scope (one LIST page): a typo in a
/// job's name or id is named, never taken for an empty job. The error lists the jobs the
/// store holds (`name/id`), read from at most [`JOBS_LISTED_FROM`] objects.
pub async fn require_job(store: &dyn BlobStore, job: &JobScope) -> Result<()> {
    let mut listing = store.list(job.scope());
    if listing.try_next().await?.is_some() {
        return Ok(());
    }
    drop(listing);
    // What the store holds, from a bounded listing; a listing that fails (a credential
    // limited to one prefix) leaves the pointer to `ls`, never another error.
    let mut jobs = BTreeSet::new();
    let mut all = store.list(&crate::blobstore::Scope::root());
    let mut read = 0;
    let mut complete = Some(true);
    loop {
        match all.try_next().await {
            Ok(Some(m)) => {
                if let Some(p) = parse(&m.key) {
                    jobs.insert(format!("{}/{}", p.job_name, p.job_id));
                }
                read += 1;
                if read == JOBS_LISTED_FROM {
                    complete = Some(false);
                    break;
                }
            }
            Ok(None) => break,
            Err(_) => {
                complete = None;
                break;
            }
        }
    }
    let listed: Vec<String> = jobs.into_iter().collect();
    let which = match (listed.is_empty(), complete) {
        (true, Some(true)) => "the store holds no job".to_string(),
        (false, Some(true)) => format!("the store holds {}", listed.join(", ")),
        (false, Some(false)) => format!(
            "among its first {JOBS_LISTED_FROM} objects the store holds {}; `blobsnap ls` lists every job",
            listed.join(", ")
        ),
        _ => "`blobsnap ls` lists the jobs".to_string(),
    };
    Err(Error::new(
        ErrorKind::NotFound,
        format!(
            "no job stored under {} (a typo in --job or --job-id, or a manual backup's --name?): {which}",
            job.scope().as_str()
        ),
    ))
}

/// The tasks of `job` that have a checkpoint history (found under `checkpoints/`).
pub async fn task_names(store: &dyn BlobStore, job: &JobScope) -> Result<BTreeSet<String>> {
    let mut tasks = BTreeSet::new();
    let mut listing = store.list(&job.scope().child("checkpoints")?);
    while let Some(m) = listing.try_next().await? {
        if let Some(task) = parse(&m.key).as_ref().and_then(|p| p.kind.task()) {
            tasks.insert(task.to_string());
        }
    }
    Ok(tasks)
}

/// What a reference resolved to.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The checkpoint, with its number in the task's history (a savepoint records the number
    /// it had).
    pub committed: CommittedCheckpoint,
    /// The savepoint it came from.
    pub savepoint: Option<String>,
}

impl Resolved {
    /// The marker of `store` in it (blob backend), if it has one.
    pub fn marker(&self, store: &str) -> Option<&str> {
        self.committed
            .checkpoint
            .as_v2()
            .and_then(|c| c.marker(crate::blob::snapshot::FACTORY_NAME, store))
    }
}

/// Resolve `r` against the history of `task` in `job` (and its savepoints). `NotFound` names
/// the task and the reference; an id prefix that matches two retained checkpoints is
/// `InvalidInput` listing them.
pub async fn resolve(
    store: &Arc<dyn BlobStore>,
    job: &JobScope,
    task: &str,
    r: &CheckpointRef,
) -> Result<Resolved> {
    if let CheckpointRef::Savepoint(name) = r {
        let sp = crate::blob::time::record::read(store.as_ref(), job, name).await?;
        let committed = sp.checkpoint_of(task)?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("savepoint {name:?} has no checkpoint of task {task:?}"),
            )
        })?;
        return Ok(Resolved {
            committed,
            savepoint: Some(name.clone()),
        });
    }
    if let CheckpointRef::Fork(src) = r {
        return Err(fork_only(src));
    }
    let cps = BlobCheckpointStore::new(Arc::clone(store), job.clone());
    // `latest` reads one document, `#N` one, `@TIME` a binary search's (about log2 of the
    // history's length); the rest, and every miss (for its message), read the history (16
    // documents at a time).
    let quick = match r {
        CheckpointRef::Seq(n) => by_seq(&cps, task, *n).await?,
        CheckpointRef::At(ms) => at_or_before(store.as_ref(), &cps, job, task, *ms).await?,
        _ => None,
    };
    if let Some(committed) = quick {
        return Ok(Resolved {
            committed,
            savepoint: None,
        });
    }
    let limit = if *r == CheckpointRef::Latest {
        1
    } else {
        usize::MAX
    };
    let history = cps.history(task, limit).await?;
    let committed = pick(&history, r).map_err(|e| e.context(format!("task {task:?}")))?;
    Ok(Resolved {
        committed: committed.clone(),
        savepoint: None,
    })
}

/// Tasks [`job_wide`] reads (one LIST each, one GET for a task that has the number) to find
/// one that has a `#N` another lacks: an error path's cost stays bounded however many tasks.
const JOB_WIDE_TASKS_READ: usize = 64;

/// A job-wide reference's error (`savepoint create --at`, `start-from`: one reference
/// resolved for every task), with what `#N` means for a job when a task lacks it. `#N` is a
/// **task's** number: each task numbers its own checkpoints, and each start of a task takes a
/// number (its claim), so tasks that restarted at different times — or committed at different
/// rates — carry different numbers for the same moment, and one `#N` is not one point of the
/// job. The error then says so and names the job-wide choices that work: `latest`, `@TIME`
/// (each task's newest checkpoint at or before it; the time of a task's `#N`, when one has it,
/// is given), or a savepoint. Any other reference or error is returned as it is.
pub async fn job_wide(
    store: &Arc<dyn BlobStore>,
    job: &JobScope,
    r: &CheckpointRef,
    e: Error,
) -> Error {
    let CheckpointRef::Seq(n) = r else {
        return e;
    };
    if e.kind() != ErrorKind::NotFound {
        return e;
    }
    // A task that has #n, and when it was made: the @TIME to offer.
    let cps = BlobCheckpointStore::new(Arc::clone(store), job.clone());
    let mut at = None;
    if let Ok(tasks) = task_names(store.as_ref(), job).await {
        for task in tasks.iter().take(JOB_WIDE_TASKS_READ) {
            if let Ok(Some(c)) = by_seq(&cps, task, *n).await {
                if let Some(v2) = c.checkpoint.as_v2() {
                    at = Some((task.clone(), v2.id.millis()));
                    break;
                }
            }
        }
    }
    let (name, id) = job.names();
    let flags = if id == "1" {
        format!("--job {name}")
    } else {
        format!("--job {name} --job-id {id}")
    };
    let (who, time) = match at {
        Some((task, ms)) => (
            format!("task {task:?} has a retained #{n}"),
            format!("; task {task:?}'s #{n} was made at `@{}`", utc_millis(ms)),
        ),
        None => (format!("no task has a retained #{n}"), String::new()),
    };
    let text = e.to_string();
    let text = text
        .strip_suffix(&format!(" [{}]", e.kind()))
        .unwrap_or(&text);
    Error::new(
        e.kind(),
        format!(
            "{text}. For a whole job, #{n} names each task's own checkpoint #{n}: tasks number their checkpoints independently (each start of a task takes a number), so their numbers diverge ({who}). Name a point every task has: `latest`, `@TIME` (each task's newest checkpoint at or before it{time}), or a savepoint (`savepoint:NAME`; `blobsnap savepoint ls {flags}`); `blobsnap checkpoints {flags}` lists every task's numbers and times"
        ),
    )
}

/// Checkpoint `#n` of `task`, read alone (`None`: not listed, or trimmed before it was read).
async fn by_seq(
    cps: &BlobCheckpointStore,
    task: &str,
    n: u64,
) -> Result<Option<CommittedCheckpoint>> {
    let seqs = cps.seqs(task).await?;
    let Some((seq, key)) = seqs.iter().find(|(s, _)| *s == n) else {
        return Ok(None);
    };
    match cps.read(task, *seq, key).await {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The newest checkpoint of `task` made at or before `ms` (by its id's clock), found by a
/// binary search over the listed sequence numbers: about log2(n) + 1 documents read instead
/// of n. Exact because a task's ids strictly increase with its sequence numbers
/// (`CheckpointIdGen` is seeded with the last committed id; a claim repeats the id before it,
/// and the newest number wins either way) — except at a head committed by `start-from` (a
/// rollback or a fork carries its point's older id), which leaves a record
/// (`JobScope::start_from_key`): a task with one is searched linearly, as is a history with a
/// V1 checkpoint or one trimmed while read. `None`: search linearly (also for the message
/// when nothing is that old). One window stays: a head whose record was never written (the
/// process died between the two writes, and `start-from` was then taken out of the settings,
/// so no restart wrote it) is searched as if its id were in order, which the linear rule agrees
/// with: the newest checkpoint by time, ties to the newest number.
async fn at_or_before(
    store: &dyn BlobStore,
    cps: &BlobCheckpointStore,
    job: &JobScope,
    task: &str,
    ms: u64,
) -> Result<Option<CommittedCheckpoint>> {
    match store.head(&job.start_from_key(task)?).await {
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let seqs = cps.seqs(task).await?;
    // The first index whose id is past `ms` lies in [lo, hi).
    let (mut lo, mut hi) = (0usize, seqs.len());
    let mut best = None;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let (seq, key) = &seqs[mid];
        let c = match cps.read(task, *seq, key).await {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(millis) = c.checkpoint.as_v2().map(|v| v.id.millis()) else {
            return Ok(None);
        };
        if millis <= ms {
            best = Some(c);
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(best)
}

/// The checkpoint of `history` (newest first) that `r` names (not a savepoint reference).
pub fn pick<'a>(
    history: &'a [CommittedCheckpoint],
    r: &CheckpointRef,
) -> Result<&'a CommittedCheckpoint> {
    let not_found = |what: String| Error::new(ErrorKind::NotFound, what);
    let id_of = |c: &CommittedCheckpoint| c.checkpoint.as_v2().map(|v| v.id);
    match r {
        CheckpointRef::Latest => history
            .first()
            .ok_or_else(|| not_found("no checkpoint".into())),
        CheckpointRef::Seq(n) => history.iter().find(|c| c.seq == *n).ok_or_else(|| {
            not_found(format!(
                "no retained checkpoint #{n} (retained: {})",
                seqs(history)
            ))
        }),
        CheckpointRef::Id(prefix) => {
            let mut hits: Vec<&CommittedCheckpoint> = history
                .iter()
                .filter(|c| id_of(c).is_some_and(|id| id.to_string().starts_with(prefix.as_str())))
                .collect();
            // A claim repeats the id of the checkpoint before it: one id, the newest number.
            hits.dedup_by_key(|c| id_of(c));
            match hits.as_slice() {
                [one] => Ok(one),
                [] => Err(not_found(format!(
                    "no retained checkpoint id starts with {prefix:?} (retained: {})",
                    seqs(history)
                ))),
                many => Err(Error::invalid(format!(
                    "checkpoint id prefix {prefix:?} is ambiguous: {}",
                    many.iter()
                        .filter_map(|c| id_of(c).map(|id| format!("#{} {id}", c.seq)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            }
        }
        // The newest by time (a checkpoint's id's clock), ties to the newest number: after a
        // rollback the head repeats its point's older id, and a time copied from a checkpoint
        // made before the rollback names that checkpoint, not the head written after it.
        CheckpointRef::At(ms) => history
            .iter()
            .filter_map(|c| Some((id_of(c)?.millis(), c)))
            .filter(|(millis, _)| *millis <= *ms)
            .max_by_key(|(millis, c)| (*millis, c.seq))
            .map(|(_, c)| c)
            .ok_or_else(|| {
                // Both times to the millisecond: the oldest is visibly later than the time
                // asked for, even within one second.
                let made = |c: &CommittedCheckpoint| {
                    id_of(c).map_or("?".to_string(), |id| utc_millis(id.millis()))
                };
                let what = match (history.last(), history.first()) {
                    (Some(oldest), Some(newest)) if oldest.seq != newest.seq => format!(
                        "the oldest retained is #{}, made {}; the newest, #{}, {}",
                        oldest.seq,
                        made(oldest),
                        newest.seq,
                        made(newest)
                    ),
                    (Some(only), _) => format!(
                        "the only one retained is #{}, made {}",
                        only.seq,
                        made(only)
                    ),
                    _ => "the task has none retained".to_string(),
                };
                not_found(format!(
                    "no retained checkpoint made at or before {}: {what}",
                    utc_millis(*ms)
                ))
            }),
        CheckpointRef::Savepoint(name) => Err(Error::invalid(format!(
            "savepoint:{name} is resolved against the job's savepoints, not a history"
        ))),
        CheckpointRef::Fork(src) => Err(fork_only(src)),
    }
}

fn fork_only(src: &crate::blob::time::record::ForkSource) -> Error {
    Error::invalid(format!(
        "savepoint:{src} is a savepoint of another job: a fork point for [job] start-from, not a checkpoint of this job"
    ))
}

fn seqs(history: &[CommittedCheckpoint]) -> String {
    if history.is_empty() {
        return "none".into();
    }
    let newest = history.first().map_or(0, |c| c.seq);
    let oldest = history.last().map_or(0, |c| c.seq);
    format!("#{oldest}..#{newest}")
}

/// One checkpoint's document as JSON text (for a savepoint's record).
pub(crate) fn checkpoint_json(c: &Checkpoint) -> Result<serde_json::Value> {
    serde_json::from_slice(&c.to_json()?)
        .map_err(|e| Error::new(ErrorKind::Corrupt, format!("checkpoint JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CheckpointV2;

    fn cp(seq: u64, id: &str) -> CommittedCheckpoint {
        CommittedCheckpoint {
            seq,
            writer: "w".into(),
            checkpoint: Checkpoint::V2(CheckpointV2 {
                id: id.parse().unwrap(),
                input_offsets: Default::default(),
                state_checkpoint_markers: Default::default(),
            }),
        }
    }

    #[test]
    fn references_parse_and_print() {
        for (text, want) in [
            ("latest", CheckpointRef::Latest),
            ("#12", CheckpointRef::Seq(12)),
            (
                "1733133600000-7",
                CheckpointRef::Id("1733133600000-7".into()),
            ),
            ("17331", CheckpointRef::Id("17331".into())),
            ("@2026-12-02T10:00Z", CheckpointRef::At(1_796_205_600_000)),
            (
                "@2026-12-02T10:00:00Z",
                CheckpointRef::At(1_796_205_600_000),
            ),
            ("@2026-12-02", CheckpointRef::At(1_796_169_600_000)),
            (
                "savepoint:before-upgrade",
                CheckpointRef::Savepoint("before-upgrade".into()),
            ),
            (
                "before-upgrade",
                CheckpointRef::Savepoint("before-upgrade".into()),
            ),
        ] {
            assert_eq!(text.parse::<CheckpointRef>().unwrap(), want, "{text}");
        }
        for bad in [
            "",
            "#x",
            "@yesterday",
            "@2026-13-02",
            "savepoint:",
            "a/b",
            "x\u{1b}",
        ] {
            let e = bad.parse::<CheckpointRef>().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}: {e}");
        }
        assert_eq!(
            CheckpointRef::At(1_796_205_600_000).to_string(),
            "@2026-12-02T10:00:00Z"
        );
    }

    #[test]
    fn picks_by_every_kind_of_reference() {
        // Newest first; #5 is a claim repeating #4's id.
        let h = vec![
            cp(6, "3000-0"),
            cp(5, "2000-1"),
            cp(4, "2000-1"),
            cp(3, "1500-0"),
        ];
        assert_eq!(pick(&h, &CheckpointRef::Latest).unwrap().seq, 6);
        assert_eq!(pick(&h, &CheckpointRef::Seq(3)).unwrap().seq, 3);
        assert_eq!(pick(&h, &CheckpointRef::Id("2000".into())).unwrap().seq, 5);
        assert_eq!(pick(&h, &CheckpointRef::At(2999)).unwrap().seq, 5);
        assert_eq!(pick(&h, &CheckpointRef::At(3000)).unwrap().seq, 6);
        let e = pick(&h, &CheckpointRef::At(1000)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        // A rollback head (#11) repeats its point's older id (#4's): a time copied from #9,
        // made before the rollback, names #9; #4's time names the head (the same state).
        let rolled = vec![cp(11, "1000-0"), cp(9, "3000-0"), cp(4, "1000-0")];
        assert_eq!(pick(&rolled, &CheckpointRef::At(3000)).unwrap().seq, 9);
        assert_eq!(pick(&rolled, &CheckpointRef::At(2999)).unwrap().seq, 11);
        assert_eq!(pick(&rolled, &CheckpointRef::At(1000)).unwrap().seq, 11);
        let e = pick(&h, &CheckpointRef::Seq(9)).unwrap_err();
        assert!(e.to_string().contains("#3..#6"), "{e}");
        let e = pick(&h, &CheckpointRef::Id("".into())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        let e = pick(&h, &CheckpointRef::Id("9".into())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }

    /// A checkpoint's printed time, read back as `@TIME`, names that checkpoint — also when
    /// several share one second (issue 51, item 3: printed to the second, each named the one
    /// before it, or none) — and a time before the oldest says what the history holds,
    /// to the millisecond, without contradicting itself.
    #[test]
    fn a_printed_time_names_its_checkpoint() {
        // Four commits within one second, newest first.
        let h = vec![
            cp(4, "1796469491509-1000000"),
            cp(3, "1796469491309-1000000"),
            cp(2, "1796469491191-1000000"),
            cp(1, "1796469491002-1000000"),
        ];
        for c in &h {
            let ms = c.checkpoint.as_v2().unwrap().id.millis();
            let printed = format!("@{}", utc_millis(ms));
            let r: CheckpointRef = printed.parse().unwrap();
            assert_eq!(pick(&h, &r).unwrap().seq, c.seq, "{printed}");
            assert_eq!(r.to_string(), printed, "the reference prints as typed");
        }
        // The second all four share: the instant it starts, before any of them.
        let r: CheckpointRef = "@2026-12-05T11:18:11Z".parse().unwrap();
        let e = pick(&h, &r).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert_eq!(
            e.to_string(),
            "no retained checkpoint made at or before 2026-12-05T11:18:11.000Z: the oldest retained is #1, made 2026-12-05T11:18:11.002Z; the newest, #4, 2026-12-05T11:18:11.509Z [not-found]"
        );
        // A whole second prints as before (a start-from record's text), and the text an
        // earlier blobsnap recorded for a sub-second time still matches it.
        assert_eq!(r.to_string(), "@2026-12-05T11:18:11Z");
        let exact = CheckpointRef::At(1_796_469_491_509);
        assert!(exact.is_recorded_as("@2026-12-05T11:18:11.509Z"));
        assert!(exact.is_recorded_as("@2026-12-05T11:18:11Z"));
        assert!(!exact.is_recorded_as("@2026-12-05T11:18:12Z"));
    }

    /// `#N` and `@TIME` read a few documents, not the history, and give what a linear pick
    /// over the whole history gives — also with a rollback head (an older id at a newer
    /// number), which the start-from record sends to the linear search.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn seq_and_time_references_read_a_few_documents() {
        use crate::blobstore::counting::CountingStore;
        use crate::blobstore::local::LocalStore;
        let tmp = tempfile::tempdir().unwrap();
        let counting = CountingStore::new(LocalStore::new(tmp.path()).unwrap());
        let counters = counting.counters();
        let store: Arc<dyn BlobStore> = Arc::new(counting);
        let job = JobScope::new("job", "1").unwrap();
        let cps = BlobCheckpointStore::new(Arc::clone(&store), job.clone());
        // 200 checkpoints, ids 10 s apart; #101 is a claim repeating #100's id.
        let millis = |seq: u64| 1_000_000 + 10_000 * if seq == 101 { 100 } else { seq };
        for seq in 1..=200u64 {
            let c = cp(seq, &format!("{}-{seq}", millis(seq)));
            cps.write("t", seq, "w", &c.checkpoint).await.unwrap();
        }
        let full = cps.history("t", usize::MAX).await.unwrap();
        let gets = || counters.snapshot().get.calls;
        let check = |r: CheckpointRef, most: u64| {
            let (store, job, full) = (Arc::clone(&store), job.clone(), full.clone());
            async move {
                let before = gets();
                let got = resolve(&store, &job, "t", &r).await.unwrap().committed.seq;
                let read = gets() - before;
                assert_eq!(got, pick(&full, &r).unwrap().seq, "{r}");
                assert!(read <= most, "{r}: {read} documents read");
                got
            }
        };
        assert_eq!(check(CheckpointRef::Seq(37), 1).await, 37);
        for (at, want) in [
            (millis(200), 200),
            (millis(150) + 9_999, 150),
            (millis(100), 101),
            (millis(1), 1),
            (millis(1) + 5, 1),
        ] {
            assert_eq!(check(CheckpointRef::At(at), 9).await, want, "@{at}");
        }
        let e = resolve(&store, &job, "t", &CheckpointRef::At(5))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");

        // A rollback to #50 committed as #201 (its id, older than #200's), and the record
        // start-from leaves: the search is linear, and picks the newest by time — #120, the
        // head the task had at that time (#201 was written later, with #50's older id).
        cps.write("t", 201, "w", &full[150].checkpoint)
            .await
            .unwrap();
        store
            .put(
                &job.start_from_key("t").unwrap(),
                crate::blobstore::PutBody::Bytes(bytes::Bytes::from_static(b"{}")),
                crate::blobstore::PutOptions::default(),
            )
            .await
            .unwrap();
        let full = cps.history("t", usize::MAX).await.unwrap();
        let r = CheckpointRef::At(millis(120));
        let got = resolve(&store, &job, "t", &r).await.unwrap().committed.seq;
        assert_eq!(got, pick(&full, &r).unwrap().seq);
        assert_eq!(got, 120);
        // #50's own time names the rollback head: the same state, the newest number.
        let r = CheckpointRef::At(millis(50));
        assert_eq!(
            resolve(&store, &job, "t", &r).await.unwrap().committed.seq,
            201
        );
    }
}
