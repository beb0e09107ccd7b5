//! The bucket layout of DESIGN §5, in one place:
//!
//! ```text
//! <job>/<job-id>/scope.json                                        owner record
//! <job>/<job-id>/checkpoints/<task>/<seq:020>.json                 checkpoint store (on S3)
//! <job>/<job-id>/writers/<task>/<writer>.json                      a running task's lease
//! <job>/<job-id>/savepoints/<name>.json                            a savepoint (user-owned)
//! <job>/<job-id>/savepoints/<name>/<fork-job>/<fork-id>/<task>.json a fork's pin on it
//! <job>/<job-id>/start-from/<task>.json                            the start-from a task applied
//! <job>/<job-id>/tasks/<task>/stores/<store>/blobs/<checkpoint-id>/<sha256>
//! <job>/<job-id>/tasks/<task>/stores/<store>/index/<checkpoint-id>.<sha256>.json
//! manual/<name>/...                                                CLI backups
//! ```
//!
//! Keys are relative to the blob store's root (the S3 store applies its bucket prefix). User
//! names (job, job id, task, store, backup name) are escaped with
//! [`escape_segment`](crate::blobstore::escape_segment). The golden tests below pin every
//! shape: changing one orphans every stored snapshot. [`parse`] is the one reader of these
//! shapes (the sweep, `blobsnap ls`, the checkpoint store's listing).

use crate::blobstore::{unescape_segment, BlobKey, Scope};
use crate::digest::Sha256;
use crate::error::Result;
use crate::id::CheckpointId;
use crate::index::IndexMarker;

/// The first segment of every manual (CLI) backup's key: `manual/<name>/…`.
pub const MANUAL_JOB: &str = "manual";

/// The scope of one job deployment (`<job>/<job-id>/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobScope(Scope);

impl JobScope {
    /// The scope of job `job` with id `job_id`.
    pub fn new(job: &str, job_id: &str) -> Result<Self> {
        Ok(JobScope(Scope::root().escaped(job)?.escaped(job_id)?))
    }

    /// The scope of a manual (CLI) backup named `name`: `manual/<name>/`.
    pub fn manual(name: &str) -> Result<Self> {
        Ok(JobScope(Scope::root().child(MANUAL_JOB)?.escaped(name)?))
    }

    /// The job's name and id, unescaped (as the operator typed them).
    pub fn names(&self) -> (String, String) {
        let mut parts = self
            .0
            .as_str()
            .split('/')
            .map(|p| unescape_segment(p).unwrap_or_else(|_| p.to_string()));
        (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        )
    }

    /// The scope itself.
    pub fn scope(&self) -> &Scope {
        &self.0
    }

    /// The owner record, `scope.json`.
    pub fn owner_record(&self) -> Result<BlobKey> {
        self.0.key("scope.json")
    }

    /// `tasks/`: everything the sweep may consider.
    pub fn tasks(&self) -> Result<Scope> {
        self.0.child("tasks")
    }

    /// The checkpoint history of `task`: `checkpoints/<task>/`.
    pub fn checkpoints(&self, task: &str) -> Result<Scope> {
        self.0.child("checkpoints")?.escaped(task)
    }

    /// Checkpoint number `seq` of `task`: `checkpoints/<task>/<seq:020>.json`.
    pub fn checkpoint_key(&self, task: &str, seq: u64) -> Result<BlobKey> {
        self.checkpoints(task)?.key(&format!("{seq:020}.json"))
    }

    /// The prepared history records of `task`: `prepared/<task>/` (DESIGN §7: a snapshot
    /// uploaded under another engine's checkpoint manager, a root until its commit is known).
    pub fn prepared(&self, task: &str) -> Result<Scope> {
        self.all_prepared()?.escaped(task)
    }

    /// Every task's prepared history records: `prepared/`.
    pub fn all_prepared(&self) -> Result<Scope> {
        self.0.child("prepared")
    }

    /// The prepared history record of checkpoint `id` of `task`: `prepared/<task>/<id>.json`.
    pub fn prepared_key(&self, task: &str, id: &CheckpointId) -> Result<BlobKey> {
        self.prepared(task)?.key(&format!("{id}.json"))
    }

    /// The prepared history record of one store at checkpoint `id` of `task` (Samza's own
    /// engine writes one per store): `prepared/<task>/<id>.<store>.json`.
    pub fn prepared_store_key(
        &self,
        task: &str,
        id: &CheckpointId,
        store: &str,
    ) -> Result<BlobKey> {
        self.prepared(task)?.key(&format!(
            "{id}.{}.json",
            crate::blobstore::escape_segment(store)
        ))
    }

    /// The job's savepoints: `savepoints/`.
    pub fn savepoints(&self) -> Result<Scope> {
        self.0.child("savepoints")
    }

    /// Savepoint `name`: `savepoints/<name>.json`.
    pub fn savepoint_key(&self, name: &str) -> Result<BlobKey> {
        self.savepoints()?
            .key(&format!("{}.json", crate::blobstore::escape_segment(name)))
    }

    /// The pins forks hold on savepoint `name`: `savepoints/<name>/` (beside its record, so
    /// that one listing of `savepoints/` reads both).
    pub fn fork_pins(&self, savepoint: &str) -> Result<Scope> {
        self.savepoints()?.escaped(savepoint)
    }

    /// The record of the start-from point `task` applied: `start-from/<task>.json`.
    pub fn start_from_key(&self, task: &str) -> Result<BlobKey> {
        self.0
            .child("start-from")?
            .key(&format!("{}.json", crate::blobstore::escape_segment(task)))
    }

    /// The pin task `task` of fork `fork_job`/`fork_id` holds on savepoint `savepoint`:
    /// `savepoints/<savepoint>/<fork-job>/<fork-id>/<task>.json`.
    pub fn fork_pin_key(
        &self,
        savepoint: &str,
        fork_job: &str,
        fork_id: &str,
        task: &str,
    ) -> Result<BlobKey> {
        self.fork_pins(savepoint)?
            .escaped(fork_job)?
            .escaped(fork_id)?
            .key(&format!("{}.json", crate::blobstore::escape_segment(task)))
    }

    /// Every task's writer leases: `writers/`.
    pub fn all_writers(&self) -> Result<Scope> {
        self.0.child("writers")
    }

    /// The writer leases of `task`: `writers/<task>/`.
    pub fn writers(&self, task: &str) -> Result<Scope> {
        self.all_writers()?.escaped(task)
    }

    /// The scope of one store of one task.
    pub fn store(&self, task: &str, store: &str) -> Result<StoreScope> {
        Ok(StoreScope(
            self.tasks()?
                .escaped(task)?
                .child("stores")?
                .escaped(store)?,
        ))
    }
}

/// The scope of one store: `…/tasks/<task>/stores/<store>/`. Blob ids and markers are relative
/// to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreScope(Scope);

impl StoreScope {
    /// The scope itself.
    pub fn scope(&self) -> &Scope {
        &self.0
    }

    /// The scope-relative id of a blob first uploaded by `checkpoint`:
    /// `blobs/<checkpoint-id>/<sha256>`.
    pub fn blob_id(checkpoint: CheckpointId, sha256: Sha256) -> String {
        format!("blobs/{checkpoint}/{sha256}")
    }

    /// The full key of a scope-relative blob id or marker.
    pub fn key(&self, relative: &str) -> Result<BlobKey> {
        self.0.key(relative)
    }

    /// The full key of an index.
    pub fn index_key(&self, marker: &IndexMarker) -> Result<BlobKey> {
        self.0.key(&marker.to_string())
    }

    /// `blobs/`.
    pub fn blobs(&self) -> Result<Scope> {
        self.0.child("blobs")
    }

    /// `index/`.
    pub fn indexes(&self) -> Result<Scope> {
        self.0.child("index")
    }
}

/// A key of the layout, read back by [`parse`]: the deployment it belongs to and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedKey {
    /// The job's name, unescaped (`manual` for a CLI backup).
    pub job_name: String,
    /// The job's id, unescaped (a CLI backup's name).
    pub job_id: String,
    /// What the key is.
    pub kind: KeyKind,
}

/// What a key of a deployment is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// `scope.json`.
    OwnerRecord,
    /// `checkpoints/<task>/<seq:020>.json`.
    Checkpoint {
        /// The task.
        task: String,
        /// The checkpoint's number.
        seq: u64,
    },
    /// `savepoints/<name>.json`.
    Savepoint {
        /// The savepoint's name.
        name: String,
    },
    /// `savepoints/<savepoint>/<fork-job>/<fork-id>/<task>.json`: a fork's pin.
    ForkPin {
        /// The savepoint pinned.
        savepoint: String,
        /// The fork's job name.
        fork_job: String,
        /// The fork's job id.
        fork_id: String,
        /// The fork's task.
        task: String,
    },
    /// `start-from/<task>.json`: the start-from point a task applied (and a fork's pins).
    StartFrom {
        /// The task.
        task: String,
    },
    /// `prepared/<task>/<checkpoint-id>.json` (every store of the task: route 1) or
    /// `prepared/<task>/<checkpoint-id>.<store>.json` (one store: Samza's own engine, route 2):
    /// a prepared history record.
    Prepared {
        /// The task.
        task: String,
        /// The checkpoint it prepares.
        checkpoint_id: CheckpointId,
        /// The one store it holds, in a per-store record.
        store: Option<String>,
    },
    /// `writers/<task>/<writer>.json`.
    Writer {
        /// The task.
        task: String,
    },
    /// `tasks/<task>/stores/<store>/index/<checkpoint-id>.<sha256>.json`.
    Index {
        /// The task.
        task: String,
        /// The store.
        store: String,
        /// The index's marker.
        marker: IndexMarker,
    },
    /// `tasks/<task>/stores/<store>/blobs/<checkpoint-id>/<sha256>`.
    Blob {
        /// The task.
        task: String,
        /// The store.
        store: String,
        /// The checkpoint that first uploaded it.
        checkpoint_id: CheckpointId,
        /// The SHA-256 of its content.
        sha256: Sha256,
    },
    /// Of no known shape, in the area of `task` when it is under `checkpoints/<task>/`,
    /// `writers/<task>/` or `tasks/<task>/` (`swept`: under `tasks/`, where only indexes and
    /// blobs belong — the sweep reports such a key and never deletes it).
    Unknown {
        /// The task whose area it is in, if any.
        task: Option<String>,
        /// Whether it is under `tasks/`.
        swept: bool,
    },
}

impl KeyKind {
    /// The task whose area the key is in.
    pub fn task(&self) -> Option<&str> {
        match self {
            KeyKind::OwnerRecord | KeyKind::Savepoint { .. } | KeyKind::ForkPin { .. } => None,
            KeyKind::Checkpoint { task, .. }
            | KeyKind::StartFrom { task }
            | KeyKind::Prepared { task, .. }
            | KeyKind::Writer { task }
            | KeyKind::Index { task, .. }
            | KeyKind::Blob { task, .. } => Some(task),
            KeyKind::Unknown { task, .. } => task.as_deref(),
        }
    }
}

/// The sequence number of a checkpoint file name, `<seq:020>.json` (exactly 20 digits).
pub fn checkpoint_seq(file_name: &str) -> Option<u64> {
    let digits = file_name.strip_suffix(".json")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Read a key back into the layout: `None` for a key with fewer than three segments
/// (`<job>/<job-id>/…`) or a segment that does not unescape. A name segment (task, store) that
/// does not unescape makes the key [`KeyKind::Unknown`].
pub fn parse(key: &BlobKey) -> Option<ParsedKey> {
    let parts: Vec<&str> = key.as_str().split('/').collect();
    let [job, id, rest @ ..] = parts.as_slice() else {
        return None;
    };
    if rest.is_empty() {
        return None;
    }
    let (job_name, job_id) = (unescape_segment(job).ok()?, unescape_segment(id).ok()?);
    let name = |s: &str| unescape_segment(s).ok();
    let area = match rest {
        ["checkpoints" | "writers" | "prepared", t, ..] => Some((name(t), false)),
        ["tasks", t, ..] => Some((name(t), true)),
        _ => None,
    };
    let known = match rest {
        ["scope.json"] => Some(KeyKind::OwnerRecord),
        ["checkpoints", t, file] => checkpoint_seq(file)
            .zip(name(t))
            .map(|(seq, task)| KeyKind::Checkpoint { task, seq }),
        ["savepoints", file] => file
            .strip_suffix(".json")
            .and_then(name)
            .map(|name| KeyKind::Savepoint { name }),
        ["savepoints", sp, fj, fid, file] => file.strip_suffix(".json").and_then(|t| {
            Some(KeyKind::ForkPin {
                savepoint: name(sp)?,
                fork_job: name(fj)?,
                fork_id: name(fid)?,
                task: name(t)?,
            })
        }),
        ["start-from", file] => file
            .strip_suffix(".json")
            .and_then(name)
            .map(|task| KeyKind::StartFrom { task }),
        ["prepared", t, file] => file.strip_suffix(".json").and_then(|stem| {
            // `<id>.json` (every store of a task) or `<id>.<store>.json` (one store: a name
            // segment escapes its dots, so the first dot ends the id).
            let (id, store) = match stem.split_once('.') {
                Some((id, st)) => (id, Some(name(st)?)),
                None => (stem, None),
            };
            Some(KeyKind::Prepared {
                task: name(t)?,
                checkpoint_id: id.parse().ok()?,
                store,
            })
        }),
        ["writers", t, file] if file.ends_with(".json") => {
            name(t).map(|task| KeyKind::Writer { task })
        }
        ["tasks", t, "stores", st, "index", file] => format!("index/{file}")
            .parse::<IndexMarker>()
            .ok()
            .zip(name(t).zip(name(st)))
            .map(|(marker, (task, store))| KeyKind::Index {
                task,
                store,
                marker,
            }),
        ["tasks", t, "stores", st, "blobs", cp, sha] => cp
            .parse::<CheckpointId>()
            .ok()
            .zip(sha.parse::<Sha256>().ok())
            .zip(name(t).zip(name(st)))
            .map(|((checkpoint_id, sha256), (task, store))| KeyKind::Blob {
                task,
                store,
                checkpoint_id,
                sha256,
            }),
        _ => None,
    };
    let kind = known.unwrap_or_else(|| KeyKind::Unknown {
        task: area.as_ref().and_then(|(t, _)| t.clone()),
        swept: area.is_some_and(|(_, swept)| swept),
    });
    Some(ParsedKey {
        job_name,
        job_id,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden keys: persisted in every bucket. Never change them.
    #[test]
    fn layout_golden() {
        let job = JobScope::new("word.count", "1").unwrap();
        assert_eq!(job.scope().as_str(), "word%2Ecount/1/");
        assert_eq!(
            job.owner_record().unwrap().as_str(),
            "word%2Ecount/1/scope.json"
        );
        assert_eq!(
            job.checkpoint_key("Partition 0", 7).unwrap().as_str(),
            "word%2Ecount/1/checkpoints/Partition%200/00000000000000000007.json"
        );
        assert_eq!(
            job.writers("Partition 0").unwrap().as_str(),
            "word%2Ecount/1/writers/Partition%200/"
        );
        let store = job.store("Partition 0", "counts").unwrap();
        assert_eq!(
            store.scope().as_str(),
            "word%2Ecount/1/tasks/Partition%200/stores/counts/"
        );
        let id: CheckpointId = "1700000000123-0".parse().unwrap();
        let sha = Sha256::of(b"");
        let blob = StoreScope::blob_id(id, sha);
        assert_eq!(
            store.key(&blob).unwrap().as_str(),
            "word%2Ecount/1/tasks/Partition%200/stores/counts/blobs/1700000000123-0/e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let marker = IndexMarker::of(id, b"{}");
        assert_eq!(
            store.index_key(&marker).unwrap().as_str(),
            "word%2Ecount/1/tasks/Partition%200/stores/counts/index/1700000000123-0.44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a.json"
        );
        assert_eq!(
            job.fork_pin_key("before upgrade", "fork.job", "2", "Partition 0")
                .unwrap()
                .as_str(),
            "word%2Ecount/1/savepoints/before%20upgrade/fork%2Ejob/2/Partition%200.json"
        );
        assert_eq!(
            JobScope::manual("nightly 1").unwrap().scope().as_str(),
            "manual/nightly%201/"
        );
    }

    /// `parse` reads back every shape the scopes write, and nothing else as a known shape.
    #[test]
    fn parse_reads_back_every_shape() {
        let job = JobScope::new("word.count", "1/2").unwrap();
        let store = job.store("Partition 0", "counts").unwrap();
        let id: CheckpointId = "1700000000123-0".parse().unwrap();
        let sha = Sha256::of(b"");
        let marker = IndexMarker::of(id, b"{}");
        let kind = |k: &BlobKey| {
            let p = parse(k).unwrap();
            assert_eq!(
                (p.job_name.as_str(), p.job_id.as_str()),
                ("word.count", "1/2")
            );
            p.kind
        };
        let task = || "Partition 0".to_string();
        assert_eq!(kind(&job.owner_record().unwrap()), KeyKind::OwnerRecord);
        assert_eq!(
            kind(&job.checkpoint_key("Partition 0", 7).unwrap()),
            KeyKind::Checkpoint {
                task: task(),
                seq: 7
            }
        );
        assert_eq!(
            kind(&job.writers("Partition 0").unwrap().key("w-1.json").unwrap()),
            KeyKind::Writer { task: task() }
        );
        assert_eq!(
            kind(&job.start_from_key("Partition 0").unwrap()),
            KeyKind::StartFrom { task: task() }
        );
        assert_eq!(
            kind(&job.prepared_key("Partition 0", &id).unwrap()),
            KeyKind::Prepared {
                task: task(),
                checkpoint_id: id,
                store: None
            }
        );
        assert_eq!(
            kind(
                &job.prepared_store_key("Partition 0", &id, "my.counts")
                    .unwrap()
            ),
            KeyKind::Prepared {
                task: task(),
                checkpoint_id: id,
                store: Some("my.counts".into())
            }
        );
        assert_eq!(
            kind(&job.prepared("Partition 0").unwrap().key("x.json").unwrap()),
            KeyKind::Unknown {
                task: Some(task()),
                swept: false
            }
        );
        assert_eq!(
            kind(&store.index_key(&marker).unwrap()),
            KeyKind::Index {
                task: task(),
                store: "counts".into(),
                marker
            }
        );
        assert_eq!(
            kind(&store.key(&StoreScope::blob_id(id, sha)).unwrap()),
            KeyKind::Blob {
                task: task(),
                store: "counts".into(),
                checkpoint_id: id,
                sha256: sha
            }
        );
        assert_eq!(
            kind(&job.fork_pin_key("sp", "f/x", "9", "Partition 0").unwrap()),
            KeyKind::ForkPin {
                savepoint: "sp".into(),
                fork_job: "f/x".into(),
                fork_id: "9".into(),
                task: task()
            }
        );
        // Near misses are unknown, in the area they are in.
        for (rel, swept) in [
            ("blobs/1700000000123-0/not-a-sha", true),
            ("index/1700000000123-0.json", true),
            ("notes.txt", true),
        ] {
            let k = store.key(rel).unwrap();
            assert_eq!(
                kind(&k),
                KeyKind::Unknown {
                    task: Some(task()),
                    swept
                },
                "{k}"
            );
        }
        let seq7 = job
            .checkpoints("Partition 0")
            .unwrap()
            .key("7.json")
            .unwrap();
        assert_eq!(
            kind(&seq7),
            KeyKind::Unknown {
                task: Some(task()),
                swept: false
            }
        );
        let probe = job.scope().key("gc-probe-0123").unwrap();
        assert_eq!(
            kind(&probe),
            KeyKind::Unknown {
                task: None,
                swept: false
            }
        );
        assert_eq!(parse(&BlobKey::new("lonely").unwrap()), None);
        assert_eq!(parse(&BlobKey::new("a/b").unwrap()), None);
        let manual = JobScope::manual("nightly 1").unwrap();
        let p = parse(
            &manual
                .store("backup", "db")
                .unwrap()
                .index_key(&marker)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            (p.job_name.as_str(), p.job_id.as_str()),
            ("manual", "nightly 1")
        );
    }

    #[test]
    fn task_scopes_do_not_overlap() {
        let job = JobScope::new("j", "1").unwrap();
        let p1 = job.store("Partition 1", "s").unwrap();
        let p10 = job.store("Partition 10", "s").unwrap();
        let k = p10.key("blobs/1-0/x").unwrap();
        assert!(!k.is_in(p1.scope()));
    }
}
