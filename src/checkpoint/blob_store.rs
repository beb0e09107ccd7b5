//! [`CheckpointStore`] on any [`BlobStore`]: `<job>/<job-id>/checkpoints/<task>/<seq:020>.json`,
//! written create-only. On the local directory store (the embedded default) that is a
//! `link(2)` of an fsynced temp file and an fsync of the directory; on S3 a PUT with
//! `If-None-Match: *`.
//!
//! Each document records the sequence number, the writer's nonce and the checkpoint in
//! Samza's JSON. The nonce makes every writer's bytes unique, so the retry layer's read-back
//! of an ambiguous create-only PUT tells "my write landed" from "another writer won".

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};

use super::{Checkpoint, CheckpointStore, CommittedCheckpoint, MAX_CHECKPOINT_BYTES};
use crate::blobstore::{
    get_bytes, BlobKey, BlobStore, CreateOnly, DeferredDeletes, Probe, PutBody, PutOptions,
};
use crate::digest::Sha256;
use crate::error::{Error, ErrorKind, Result};
use crate::layout::JobScope;

/// The format of the checkpoint documents this version writes and reads.
const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Document {
    #[serde(rename = "blobsnap-checkpoint")]
    format: u32,
    seq: u64,
    writer: String,
    /// The checkpoint; absent in a removal's record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checkpoint: Option<serde_json::Value>,
    /// Set when `blobsnap forget --checkpoint` replaced a document that could not be read:
    /// the number stays taken (no writer, live or zombie, can commit under it again) and
    /// every reader passes over it as removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    removed: Option<Removal>,
}

/// Why and when a checkpoint document that could not be read was removed (its number kept).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Removal {
    /// When it was removed, ms since the epoch.
    pub at_millis: u64,
    /// Why the document could not be read, as it was reported then.
    pub reason: String,
}

/// One stored checkpoint document: a committed checkpoint, or the record of a removed one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A committed checkpoint.
    Checkpoint(CommittedCheckpoint),
    /// Number `seq`, whose document could not be read, removed by an operator.
    Removed {
        /// The number it held (and keeps).
        seq: u64,
        /// When and why.
        removal: Removal,
    },
}

impl Record {
    /// The document's number.
    pub fn seq(&self) -> u64 {
        match self {
            Record::Checkpoint(c) => c.seq,
            Record::Removed { seq, .. } => *seq,
        }
    }
}

/// One listed document of a task's history, as an operator's listing sees it: read, removed,
/// or unreadable (with why).
#[derive(Debug)]
pub struct Listed {
    /// Its number.
    pub seq: u64,
    /// Its key.
    pub key: BlobKey,
    /// What it holds, or why it cannot be read.
    pub record: Result<Record>,
}

/// What [`BlobCheckpointStore::remove`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct RemovedReport {
    /// The document's key.
    pub key: String,
    /// Its task.
    pub task: String,
    /// Its number (kept taken).
    pub seq: u64,
    /// Why it could not be read, or that an operator removed a readable one.
    pub reason: String,
    /// False: it had been removed before (nothing written).
    pub changed: bool,
    /// It could be read (an operator removed a checkpoint a newer one supersedes).
    pub readable: bool,
}

/// Committed checkpoints of one job deployment, in a blob store.
#[derive(Debug, Clone)]
pub struct BlobCheckpointStore {
    store: Arc<dyn BlobStore>,
    job: JobScope,
}

impl BlobCheckpointStore {
    /// The checkpoint store of `job` in `store`.
    pub fn new(store: Arc<dyn BlobStore>, job: JobScope) -> Self {
        BlobCheckpointStore { store, job }
    }

    fn seq_of(&self, task: &str, key: &BlobKey) -> Option<u64> {
        let scope = self.job.checkpoints(task).ok()?;
        crate::layout::checkpoint_seq(key.strip_scope(&scope)?)
    }

    pub(crate) async fn seqs(&self, task: &str) -> Result<Vec<(u64, BlobKey)>> {
        let scope = self.job.checkpoints(task)?;
        let mut out: Vec<(u64, BlobKey)> = self
            .store
            .list(&scope)
            .try_filter_map(|m| {
                let seq = self.seq_of(task, &m.key);
                async move { Ok(seq.map(|s| (s, m.key))) }
            })
            .try_collect()
            .await?;
        out.sort_by_key(|(s, _)| *s);
        Ok(out)
    }

    /// Checkpoint `seq` of `task`, stored at `key`. A removed one is `NotFound`, as a trimmed
    /// one is: neither is a root, nor a point to restore.
    pub(crate) async fn read(
        &self,
        task: &str,
        seq: u64,
        key: &BlobKey,
    ) -> Result<CommittedCheckpoint> {
        match self.read_record(task, seq, key).await? {
            Record::Checkpoint(c) => Ok(c),
            Record::Removed { removal, .. } => Err(removed_error(task, seq, &removal)),
        }
    }

    /// The document `seq` of `task`, stored at `key`, as it is: a checkpoint or a removal.
    pub(crate) async fn read_record(&self, task: &str, seq: u64, key: &BlobKey) -> Result<Record> {
        // A document over the cap is damaged (no writer makes one): `Corrupt`, so that
        // listings name it and `forget --checkpoint` can remove it.
        let bytes = get_bytes(self.store.as_ref(), key, MAX_CHECKPOINT_BYTES as u64)
            .await
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidInput => Error::corrupt(e.to_string()),
                _ => e,
            })?;
        let r = parse_entry(&bytes)
            .map_err(|e| e.context(format!("checkpoint {key} of task {task}")))?;
        if r.seq() != seq {
            return Err(Error::corrupt(format!(
                "checkpoint {key} says it is number {}, its key says {seq}",
                r.seq()
            )));
        }
        Ok(r)
    }

    /// The number of the newest checkpoint of `task` after `seq` that can be read.
    async fn newest_readable_after(
        &self,
        task: &str,
        seq: u64,
    ) -> Result<Option<CommittedCheckpoint>> {
        for (newer, key) in self.seqs(task).await?.into_iter().rev() {
            if newer <= seq {
                break;
            }
            match self.read_record(task, newer, &key).await {
                Ok(Record::Checkpoint(c)) => return Ok(Some(c)),
                Ok(Record::Removed { .. }) => {}
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Corrupt) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Every document of `task`'s history, newest first, each read, removed or unreadable
    /// with why (an operator's listing: one damaged document never hides the others). A
    /// document trimmed between the listing and its read is left out.
    pub async fn listing(&self, task: &str) -> Result<Vec<Listed>> {
        let seqs = self.seqs(task).await?;
        let reads: Vec<_> = seqs
            .into_iter()
            .rev()
            .map(|(seq, key)| async move {
                let record = self.read_record(task, seq, &key).await;
                Listed { seq, key, record }
            })
            .collect();
        Ok(futures::stream::iter(reads)
            .buffered(16)
            .filter(|l| {
                let trimmed = matches!(&l.record, Err(e) if e.kind() == ErrorKind::NotFound);
                async move { !trimmed }
            })
            .collect()
            .await)
    }

    /// Remove checkpoint document `seq` of `task` (`blobsnap forget --checkpoint`): it is
    /// replaced by a removal's record, so its number stays taken (a writer whose lease is
    /// still live, or a zombie, can never commit under a freed number) and every reader passes
    /// over it (`checkpoints` lists it as removed; the sweep and the restore do not see it, so
    /// the next sweep frees what only it needed). A document that cannot be read goes with
    /// why; a readable checkpoint goes only while a newer readable one stands in its task's
    /// history and `restores` accepts it (the caller checks that its snapshots can be read: the
    /// newest is what the task restores, and a restore falls back from a newer one that does
    /// not restore; a start-from moves a task back), and a document a newer blobsnap wrote is
    /// refused. `dry_run`: nothing written.
    pub async fn remove<F, Fut>(
        &self,
        task: &str,
        seq: u64,
        now_millis: u64,
        dry_run: bool,
        restores: F,
    ) -> Result<RemovedReport>
    where
        F: FnOnce(CommittedCheckpoint) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let key = self.job.checkpoint_key(task, seq)?;
        let mut readable = false;
        let reason = match self.read_record(task, seq, &key).await {
            Ok(Record::Checkpoint(_)) => {
                let newer = self.newest_readable_after(task, seq).await?;
                let Some(newer) = newer else {
                    return Err(Error::invalid(format!(
                        "checkpoint #{seq} of task {task:?} ({key}) is the newest the task can restore: it stays (a start-from — `[job] start-from`, `demo --start-from` — moves a task back; `blobsnap forget --job J --job-id ID --all` removes a whole deployment)"
                    )));
                };
                // The newer one must restore (its snapshots readable), else a restore-fallback
                // would come back to this one.
                let newer_seq = newer.seq;
                if let Err(e) = restores(newer).await {
                    return Err(Error::invalid(format!(
                        "checkpoint #{seq} of task {task:?} ({key}) stays: the newest one, #{newer_seq}, would not restore ({e}), so #{seq} may be what a restore falls back to"
                    )));
                }
                readable = true;
                format!(
                    "an operator removes it (`blobsnap forget --checkpoint`); #{newer_seq} is newer"
                )
            }
            Ok(Record::Removed { removal, .. }) => {
                return Ok(RemovedReport {
                    key: key.to_string(),
                    task: task.to_string(),
                    seq,
                    reason: removal.reason,
                    changed: false,
                    readable: false,
                })
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(e.context(format!("checkpoint #{seq} of task {task:?}")))
            }
            Err(e) if e.kind() == ErrorKind::Corrupt => e.to_string(),
            Err(e) => return Err(e),
        };
        // A document a newer blobsnap wrote is not damaged: upgrade instead (it would be lost).
        if let Ok(bytes) = get_bytes(self.store.as_ref(), &key, MAX_CHECKPOINT_BYTES as u64).await {
            let format = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("blobsnap-checkpoint")?.as_u64());
            if let Some(f) = format.filter(|f| *f > u64::from(FORMAT)) {
                return Err(Error::invalid(format!(
                    "checkpoint #{seq} of task {task:?} ({key}) was written by a newer blobsnap (format {f}; this one reads {FORMAT}): upgrade instead of removing it"
                )));
            }
        }
        let report = RemovedReport {
            key: key.to_string(),
            task: task.to_string(),
            seq,
            reason: reason.clone(),
            changed: !dry_run,
            readable,
        };
        if dry_run {
            return Ok(report);
        }
        let doc = Document {
            format: FORMAT,
            seq,
            writer: "blobsnap forget --checkpoint".into(),
            checkpoint: None,
            removed: Some(Removal {
                at_millis: now_millis,
                reason,
            }),
        };
        let bytes =
            serde_json::to_vec(&doc).map_err(|e| Error::invalid(format!("removal: {e}")))?;
        let sha = Sha256::of(&bytes);
        self.store
            .put(
                &key,
                PutBody::Bytes(Bytes::from(bytes)),
                PutOptions {
                    sha256: Some(sha),
                    ..PutOptions::default()
                },
            )
            .await
            .map_err(|e| e.context(format!("replace {key} by its removal")))?;
        // Read back: what stands there now is the removal.
        match self.read_record(task, seq, &key).await? {
            Record::Removed { .. } => Ok(report),
            Record::Checkpoint(_) => Err(Error::conflict(format!(
                "{key} holds a readable checkpoint after its removal was written: another process wrote it; nothing else changed"
            ))),
        }
    }
}

fn removed_error(task: &str, seq: u64, removal: &Removal) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!(
            "checkpoint #{seq} of task {task:?} was removed (`blobsnap forget --checkpoint`, at {} ms): {}",
            removal.at_millis, removal.reason
        ),
    )
}

/// Whether `bytes` look like a stored checkpoint record (a JSON object with a
/// `blobsnap-checkpoint` field) rather than a bare checkpoint.
pub fn is_record(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .is_some_and(|v| v.get("blobsnap-checkpoint").is_some())
}

/// Parse one stored checkpoint record (what `checkpoints/<task>/<seq>.json` holds: its format,
/// number, writer and the checkpoint in Samza's JSON). `Corrupt` names what is wrong.
/// A removal's record (see [`Record::Removed`]) is `NotFound`.
pub fn parse_record(bytes: &[u8]) -> Result<CommittedCheckpoint> {
    match parse_entry(bytes)? {
        Record::Checkpoint(c) => Ok(c),
        Record::Removed { seq, removal } => Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "checkpoint record number {seq} was removed: {}",
                removal.reason
            ),
        )),
    }
}

/// Parse one stored checkpoint document: a checkpoint, or a removal's record. `Corrupt`
/// names what is wrong (at most [`MAX_CHECKPOINT_BYTES`] are ever read; serde_json's
/// nesting limit bounds the depth).
pub fn parse_entry(bytes: &[u8]) -> Result<Record> {
    let doc: Document = serde_json::from_slice(bytes)
        .map_err(|e| Error::corrupt(format!("checkpoint record: {e}")))?;
    if doc.format != FORMAT {
        return Err(Error::corrupt(format!(
            "blobsnap-checkpoint format {} (this blobsnap reads {FORMAT})",
            doc.format
        )));
    }
    match (doc.checkpoint, doc.removed) {
        (None, Some(removal)) => Ok(Record::Removed {
            seq: doc.seq,
            removal,
        }),
        (Some(checkpoint), None) => {
            let raw = serde_json::to_vec(&checkpoint)
                .map_err(|e| Error::corrupt(format!("checkpoint record: {e}")))?;
            let checkpoint = Checkpoint::from_json(&raw)
                .map_err(|e| e.context(format!("checkpoint record number {}", doc.seq)))?;
            Ok(Record::Checkpoint(CommittedCheckpoint {
                seq: doc.seq,
                writer: doc.writer,
                checkpoint,
            }))
        }
        (Some(_), Some(_)) => Err(Error::corrupt(format!(
            "checkpoint record number {} holds both a checkpoint and a removal",
            doc.seq
        ))),
        (None, None) => Err(Error::corrupt(format!(
            "checkpoint record number {} holds no checkpoint",
            doc.seq
        ))),
    }
}

/// A stored checkpoint record's JSON, as [`BlobCheckpointStore`] writes it (the checkpoint
/// normalized).
pub fn record_to_json(c: &CommittedCheckpoint) -> Result<Vec<u8>> {
    let checkpoint: serde_json::Value = serde_json::from_slice(&c.checkpoint.to_json()?)
        .map_err(|e| Error::invalid(format!("checkpoint JSON: {e}")))?;
    serde_json::to_vec(&Document {
        format: FORMAT,
        seq: c.seq,
        writer: c.writer.clone(),
        checkpoint: Some(checkpoint),
        removed: None,
    })
    .map_err(|e| Error::invalid(format!("checkpoint record: {e}")))
}

#[async_trait]
impl CheckpointStore for BlobCheckpointStore {
    async fn enforces_exclusive_writes(&self) -> Result<bool> {
        Ok(self.store.capabilities(Probe::IfUnknown).await?.create_only == CreateOnly::Atomic)
    }

    /// The newest document that is not a removal's record.
    async fn latest(&self, task: &str) -> Result<Option<CommittedCheckpoint>> {
        for (seq, key) in self.seqs(task).await?.into_iter().rev() {
            match self.read_record(task, seq, &key).await? {
                Record::Checkpoint(c) => return Ok(Some(c)),
                Record::Removed { .. } => {}
            }
        }
        Ok(None)
    }

    async fn latest_seq(&self, task: &str) -> Result<Option<u64>> {
        Ok(self.seqs(task).await?.pop().map(|(seq, _)| seq))
    }

    /// A document listed but gone when read was trimmed by the task's writer meanwhile (every
    /// commit trims what left retention): the history is listed and read again, up to 3 times,
    /// so a reader of a busy job's roots (the sweep) does not fail on that routine race. A
    /// document still missing after that is `NotFound`, as is any other failure of the read.
    async fn history(&self, task: &str, limit: usize) -> Result<Vec<CommittedCheckpoint>> {
        let mut attempt = 0;
        'listing: loop {
            attempt += 1;
            let seqs = self.seqs(task).await?;
            let mut out = Vec::new();
            // Read 16 at a time, in order (a long tiered history is hundreds of documents).
            // Every document, newest first, until `limit` checkpoints (a removal's record
            // does not count).
            let reads: Vec<_> = seqs
                .into_iter()
                .rev()
                .map(|(seq, key)| async move { self.read_record(task, seq, &key).await })
                .collect();
            let mut reads = futures::stream::iter(reads).buffered(16);
            while out.len() < limit {
                let Some(r) = reads.next().await else { break };
                match r {
                    Ok(Record::Checkpoint(c)) => out.push(c),
                    // Removed by an operator: neither a root nor a point to restore.
                    Ok(Record::Removed { .. }) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound && attempt < 3 => {
                        tracing::debug!(
                            task,
                            attempt,
                            error = %e,
                            "checkpoint trimmed while the history was read; listing again"
                        );
                        continue 'listing;
                    }
                    Err(e) => return Err(e),
                }
            }
            return Ok(out);
        }
    }

    async fn write(&self, task: &str, seq: u64, writer: &str, cp: &Checkpoint) -> Result<()> {
        if seq == 0 {
            return Err(Error::invalid("checkpoint sequence numbers start at 1"));
        }
        let checkpoint_json: serde_json::Value = serde_json::from_slice(&cp.to_json()?)
            .map_err(|e| Error::invalid(format!("checkpoint JSON: {e}")))?;
        let doc = Document {
            format: FORMAT,
            seq,
            writer: writer.to_string(),
            checkpoint: Some(checkpoint_json),
            removed: None,
        };
        let bytes =
            serde_json::to_vec(&doc).map_err(|e| Error::invalid(format!("checkpoint: {e}")))?;
        let key = self.job.checkpoint_key(task, seq)?;
        let sha = Sha256::of(&bytes);
        self.store
            .put(&key, PutBody::Bytes(Bytes::from(bytes)), PutOptions::create_only(sha))
            .await
            .map(|_| ())
            .map_err(|e| {
                if e.kind() == ErrorKind::Conflict {
                    Error::conflict(format!(
                        "checkpoint {seq} of task {task:?} was written by another process: this writer ({writer}) is fenced off and must stop"
                    ))
                } else {
                    e.context(format!("write checkpoint {key}"))
                }
            })
    }

    async fn delete_seqs(&self, task: &str, seqs: &[u64]) -> Result<()> {
        self.delete_seqs_and(task, seqs, &[]).await
    }

    async fn delete_seqs_and(
        &self,
        task: &str,
        seqs: &[u64],
        also: &[DeferredDeletes],
    ) -> Result<()> {
        let keys = seqs
            .iter()
            .map(|s| self.job.checkpoint_key(task, *s))
            .collect::<Result<Vec<_>>>()?;
        let (ours, others): (Vec<_>, Vec<_>) = also.iter().partition(|d| d.same_store(&self.store));
        let pins = ours.iter().find_map(|d| d.pins.clone());
        let ours = DeferredDeletes {
            store: Arc::clone(&self.store),
            keys: ours
                .into_iter()
                .flat_map(|d| d.keys.iter().cloned())
                .collect(),
            pins,
        };
        ours.delete_with(&keys)
            .await
            .map_err(|e| e.context(format!("trim the checkpoints of task {task:?}")))?;
        for d in others {
            d.delete_with(&[]).await?;
        }
        Ok(())
    }

    async fn trim(&self, task: &str, keep: usize) -> Result<()> {
        let seqs = self.seqs(task).await?;
        let keep = keep.max(1);
        // Walk newest first until `keep` distinct checkpoint ids are covered.
        let mut ids = std::collections::HashSet::new();
        let mut cut = 0;
        for (i, (seq, key)) in seqs.iter().enumerate().rev() {
            let c = match self.read_record(task, *seq, key).await? {
                Record::Checkpoint(c) => c,
                Record::Removed { .. } => continue,
            };
            let id = c.checkpoint.as_v2().map(|v| v.id.to_string());
            ids.insert(id.unwrap_or_else(|| format!("v1-{seq}")));
            if ids.len() > keep {
                cut = i + 1;
                break;
            }
        }
        if cut == 0 {
            return Ok(());
        }
        let old: Vec<BlobKey> = seqs[..cut].iter().map(|(_, k)| k.clone()).collect();
        let failures = self.store.delete_many(&old).await?;
        match failures.into_iter().next() {
            Some((k, e)) => Err(e.context(format!("trim checkpoint {k}"))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CheckpointV2;

    /// F21 of the protocol reviews: a checkpoint document of a format this build does not
    /// read (a newer blobsnap's) is refused naming its format, never read as if it were ours;
    /// the same document in our format parses.
    #[test]
    fn a_document_of_a_foreign_format_is_refused_naming_it() {
        let c = CommittedCheckpoint {
            seq: 7,
            writer: "w".into(),
            checkpoint: Checkpoint::V2(CheckpointV2 {
                id: "1000-0".parse().expect("an id"),
                input_offsets: Default::default(),
                state_checkpoint_markers: Default::default(),
            }),
        };
        let ours = record_to_json(&c).expect("encodes");
        assert_eq!(parse_record(&ours).expect("ours parses").seq, 7);
        let text = String::from_utf8(ours).expect("JSON is UTF-8");
        assert!(text.contains("\"blobsnap-checkpoint\":1"), "{text}");
        for format in ["2", "99", "4294967295"] {
            let foreign = text.replace(
                "\"blobsnap-checkpoint\":1",
                &format!("\"blobsnap-checkpoint\":{format}"),
            );
            let e = parse_record(foreign.as_bytes()).expect_err("a foreign format");
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
            assert!(e.to_string().contains(&format!("format {format}")), "{e}");
        }
    }
}
