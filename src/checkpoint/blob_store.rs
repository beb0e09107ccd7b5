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
    checkpoint: serde_json::Value,
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

    pub(crate) async fn read(
        &self,
        task: &str,
        seq: u64,
        key: &BlobKey,
    ) -> Result<CommittedCheckpoint> {
        let bytes = get_bytes(self.store.as_ref(), key, MAX_CHECKPOINT_BYTES as u64).await?;
        let c = parse_record(&bytes)
            .map_err(|e| e.context(format!("checkpoint {key} of task {task}")))?;
        if c.seq != seq {
            return Err(Error::corrupt(format!(
                "checkpoint {key} says it is number {}, its key says {seq}",
                c.seq
            )));
        }
        Ok(c)
    }
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
pub fn parse_record(bytes: &[u8]) -> Result<CommittedCheckpoint> {
    let doc: Document = serde_json::from_slice(bytes)
        .map_err(|e| Error::corrupt(format!("checkpoint record: {e}")))?;
    if doc.format != FORMAT {
        return Err(Error::corrupt(format!(
            "blobsnap-checkpoint format {} (this blobsnap reads {FORMAT})",
            doc.format
        )));
    }
    let raw = serde_json::to_vec(&doc.checkpoint)
        .map_err(|e| Error::corrupt(format!("checkpoint record: {e}")))?;
    let checkpoint = Checkpoint::from_json(&raw)
        .map_err(|e| e.context(format!("checkpoint record number {}", doc.seq)))?;
    Ok(CommittedCheckpoint {
        seq: doc.seq,
        writer: doc.writer,
        checkpoint,
    })
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
        checkpoint,
    })
    .map_err(|e| Error::invalid(format!("checkpoint record: {e}")))
}

#[async_trait]
impl CheckpointStore for BlobCheckpointStore {
    async fn enforces_exclusive_writes(&self) -> Result<bool> {
        Ok(self.store.capabilities(Probe::IfUnknown).await?.create_only == CreateOnly::Atomic)
    }

    async fn latest(&self, task: &str) -> Result<Option<CommittedCheckpoint>> {
        match self.seqs(task).await?.pop() {
            Some((seq, key)) => self.read(task, seq, &key).await.map(Some),
            None => Ok(None),
        }
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
            let reads: Vec<_> = seqs
                .into_iter()
                .rev()
                .take(limit)
                .map(|(seq, key)| async move { self.read(task, seq, &key).await })
                .collect();
            let mut reads = futures::stream::iter(reads).buffered(16);
            while let Some(r) = reads.next().await {
                match r {
                    Ok(c) => out.push(c),
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

    async fn write(
        &self,
        task: &str,
        seq: u64,
        writer: &str,
        checkpoint: &Checkpoint,
    ) -> Result<()> {
        if seq == 0 {
            return Err(Error::invalid("checkpoint sequence numbers start at 1"));
        }
        let checkpoint_json: serde_json::Value = serde_json::from_slice(&checkpoint.to_json()?)
            .map_err(|e| Error::invalid(format!("checkpoint JSON: {e}")))?;
        let doc = Document {
            format: FORMAT,
            seq,
            writer: writer.to_string(),
            checkpoint: checkpoint_json,
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
            let c = self.read(task, *seq, key).await?;
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
