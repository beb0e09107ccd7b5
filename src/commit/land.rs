//! After the upload: the checkpoint document's write, bounded by the abandon age, and its
//! withdrawal when it cannot be known to have landed; what a commit then lets go (the
//! checkpoints that leave retention, their blobs, the older checkpoint dirs).

use super::*;

impl TaskCommitManager {
    /// Every backend's cleanup for the committed checkpoint `id`; returns the deletes they
    /// handed back.
    pub(super) async fn run_cleanup(
        &self,
        id: CheckpointId,
        markers: &Markers,
    ) -> Result<Vec<DeferredDeletes>> {
        let mut out = Vec::new();
        for b in &self.backends {
            let empty = StoreMarkers::new();
            let m = markers.get(&b.name).unwrap_or(&empty);
            let d = b
                .manager
                .cleanup_deferred(id, m)
                .await
                .map_err(|e| e.context(format!("cleanup of backend {} at {id}", b.name)))?;
            DeferredDeletes::merge(&mut out, d);
        }
        Ok(out)
    }

    /// The checkpoint at number `seq`, if it is the latest and this writer wrote it.
    pub(super) async fn own_landed(&self, seq: u64) -> Result<Option<Checkpoint>> {
        let latest = self
            .checkpoints
            .latest(&self.task.task_name)
            .await
            .map_err(|e| e.context(format!("read back checkpoint {seq}")))?;
        Ok(latest
            .filter(|c| c.seq == seq && c.writer == self.writer)
            .map(|c| c.checkpoint))
    }

    /// The least time any backend leaves this commit's checkpoint write (`None`: unbounded);
    /// an error abandons the commit.
    pub(super) fn commit_bound(&self, id: CheckpointId) -> Result<Option<std::time::Duration>> {
        let mut left: Option<std::time::Duration> = None;
        for b in &self.backends {
            let l = b
                .manager
                .before_commit(id)
                .map_err(|e| e.context(format!("commit of backend {} at {id}", b.name)))?;
            left = match (left, l) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(left)
    }

    /// Write checkpoint `seq` inside the commit's bound (DESIGN §7): a write (retries and
    /// all) still running when `left` runs out is cancelled, and a document that landed but
    /// whose write finished past the bound (checked again on every backend's clock) is
    /// withdrawn. Either way the commit is abandoned; what it uploaded is an orphan.
    pub(super) async fn write_bounded(
        &self,
        st: &mut State,
        id: CheckpointId,
        seq: u64,
        doc: &Checkpoint,
        left: Option<std::time::Duration>,
    ) -> Result<()> {
        let write = self
            .checkpoints
            .write(&self.task.task_name, seq, &self.writer, doc);
        let outcome = match left {
            None => write.await,
            Some(left) => match tokio::time::timeout(left, write).await {
                Ok(r) => r,
                Err(_) => {
                    // The cancelled request may still land: withdraw its number.
                    st.withdrawn.push((seq, id));
                    match self.withdraw(seq).await {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::Conflict => return Err(e),
                        Err(e) => {
                            tracing::warn!(error = %e, seq, "could not withdraw a checkpoint write cancelled past its bound; retried before the next write");
                            st.withdraw_pending = Some(seq);
                        }
                    }
                    metrics::counter!("blobsnap_commit_abandoned_total", "task" => self.task.task_name.clone())
                        .increment(1);
                    return Err(Error::transient(format!(
                        "commit at {id}: the checkpoint write did not finish within the commit's bound ({left:?} were left of half the sweep's grace): abandoned; the next commit starts afresh"
                    )));
                }
            },
        };
        outcome?;
        if left.is_some() {
            if let Err(e) = self.commit_bound(id) {
                // Landed, but past the bound: a sweep that started inside it may have taken
                // blobs it names. It never counts as committed.
                st.withdrawn.push((seq, id));
                if let Err(we) = self.withdraw(seq).await {
                    st.withdraw_pending = Some(seq);
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!("checkpoint {seq} at {id} landed past the commit's bound and could not be withdrawn ({we}); a restore of it falls back to the checkpoint before it if a sweep took its blobs"),
                    ));
                }
                return Err(e.context(format!(
                    "checkpoint {seq} landed past the bound and was withdrawn"
                )));
            }
        }
        Ok(())
    }

    /// Delete this writer's checkpoint `seq` (a withdrawal): only a document this writer
    /// wrote (issue 46, S4-2). Number `seq` holding another writer's document, or a newer
    /// number written, means a successor claimed the task while this write was cancelled:
    /// `Conflict`, this writer is fenced off (deleting it would free the number for this
    /// zombie). Not there (yet): nothing to delete; a late landing is found by the next
    /// write of the number (its `Conflict` names this writer's own withdrawn document).
    pub(super) async fn withdraw(&self, seq: u64) -> Result<()> {
        let task = &self.task.task_name;
        let latest = self
            .checkpoints
            .latest(task)
            .await
            .map_err(|e| e.context(format!("withdraw checkpoint {seq}: read it back")))?;
        match latest {
            Some(c) if c.seq > seq || (c.seq == seq && c.writer != self.writer) => {
                Err(Error::conflict(format!(
                    "checkpoint {} of task {task:?} was written by another writer ({}) after this writer's write of number {seq} was cancelled: this writer ({}) is fenced off and must stop",
                    c.seq, c.writer, self.writer
                )))
            }
            Some(c) if c.seq == seq => self
                .checkpoints
                .delete_seqs(task, &[seq])
                .await
                .map_err(|e| e.context(format!("withdraw checkpoint {seq}"))),
            _ => Ok(()),
        }
    }

    /// The checkpoint is written: record it, trim the history, clean up.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn committed(
        &self,
        mut st: tokio::sync::MutexGuard<'_, State>,
        id: CheckpointId,
        seq: u64,
        checkpoint: CheckpointV2,
        markers: Markers,
        upload_ms: u64,
        t: Instant,
        sync_ms: u64,
    ) -> Result<CommitReport> {
        st.seq = seq;
        st.written.push_back((seq, checkpoint.id.to_string()));
        st.last = Some(Checkpoint::V2(checkpoint.clone()));
        let write_ms = t.elapsed().as_millis() as u64;
        crate::crash::point("commit.after-checkpoint");

        // 4. cleanup: never un-commits. The history is trimmed first, so that it never names
        //    a snapshot a backend is about to delete; the snapshots that left retention at
        //    the last commit (no checkpoint names them since its trim) go in the same batch,
        //    and this commit's cleanup hands back what leaves now, for the next one: one batch
        //    delete per commit (DESIGN §7 step 4).
        //    The first trim of a process reads the history (what earlier processes left);
        //    later ones delete exactly what this process wrote and retention let go, reading
        //    nothing.
        //    While a store of the task is still lazily restoring, nothing leaves the history
        //    (DESIGN §8): a blob found corrupt at its late fetch must leave the restore
        //    fallback the checkpoints it had at the start (the backend holds its window too).
        //    The hold is not a trim: the first commit after it reads the history again.
        let t = Instant::now();
        let ready = std::mem::take(&mut st.deferred);
        let hold = self.hydrating();
        let trimmed = if hold {
            tracing::info!(task = %self.task.task_name, "a store is still lazily restoring: no checkpoint leaves the history until it is complete");
            self.checkpoints
                .delete_seqs_and(&self.task.task_name, &[], &ready)
                .await
        } else if st.history_trimmed {
            let doomed = leaving_by(&mut st.written, &self.policy(), id.millis());
            self.checkpoints
                .delete_seqs_and(&self.task.task_name, &doomed, &ready)
                .await
        } else {
            // What the trim kept (an earlier process's checkpoints among it) is what later
            // trims count from.
            let kept = async {
                if self.tiers.is_empty() {
                    self.checkpoints
                        .trim(&self.task.task_name, self.retention)
                        .await?;
                } else {
                    // The policy over the whole history: what it lets go is deleted.
                    let history = self
                        .checkpoints
                        .history(&self.task.task_name, usize::MAX)
                        .await?;
                    let mut all: std::collections::VecDeque<(u64, String)> = history
                        .iter()
                        .rev()
                        .map(|c| (c.seq, id_key(&c.checkpoint, c.seq)))
                        .collect();
                    let doomed = leaving_by(&mut all, &self.policy(), id.millis());
                    self.checkpoints
                        .delete_seqs(&self.task.task_name, &doomed)
                        .await?;
                }
                let history = self
                    .checkpoints
                    .history(&self.task.task_name, usize::MAX)
                    .await?;
                self.checkpoints
                    .delete_seqs_and(&self.task.task_name, &[], &ready)
                    .await?;
                Ok::<_, Error>(history)
            }
            .await;
            kept.map(|history| {
                st.written = history
                    .iter()
                    .rev()
                    .map(|c| (c.seq, id_key(&c.checkpoint, c.seq)))
                    .collect();
            })
        };
        st.history_trimmed = trimmed.is_ok() && !hold;
        match trimmed {
            Ok(()) => {
                let waited = std::mem::take(&mut st.awaiting_trim);
                st.hand_over(waited, true);
            }
            Err(e) => {
                // Deleting again is harmless: what was ready stays ready.
                st.hand_over(ready, true);
                tracing::warn!(error = %e, "could not trim the checkpoint history; the next commit reads it and trims again");
            }
        }
        crate::crash::point("commit.during-cleanup");
        match self.run_cleanup(id, &markers).await {
            Ok(d) => {
                let trimmed = st.history_trimmed;
                st.hand_over(d, trimmed);
                st.cleanup_pending = false;
            }
            Err(e) => {
                st.cleanup_pending = true;
                metrics::counter!("blobsnap_cleanup_failures_total", "task" => self.task.task_name.clone()).increment(1);
                tracing::warn!(error = %e, "cleanup failed; it will run again before the next upload");
            }
        }
        for engine in &self.stores {
            let spec = spec_of(engine.as_ref());
            let keep = st.made.get(&spec.name).map(|(_, d)| d.as_path());
            remove_older_checkpoint_dirs(&spec, id, keep);
        }
        let cleanup_ms = t.elapsed().as_millis() as u64;
        let labels = [("task", self.task.task_name.clone())];
        metrics::histogram!("blobsnap_commit_sync_seconds", &labels).record(sync_ms as f64 / 1e3);
        metrics::histogram!("blobsnap_commit_upload_seconds", &labels)
            .record(upload_ms as f64 / 1e3);
        metrics::histogram!("blobsnap_commit_cleanup_seconds", &labels)
            .record(cleanup_ms as f64 / 1e3);
        metrics::counter!("blobsnap_commits_total", &labels).increment(1);
        // Cleanup backlog: 1 while a failed cleanup waits to be re-run.
        metrics::gauge!("blobsnap_cleanup_backlog", &labels).set(if st.cleanup_pending {
            1.0
        } else {
            0.0
        });
        metrics::gauge!("blobsnap_last_commit_timestamp_seconds", &labels)
            .set(self.clock.now_millis() as f64 / 1e3);
        Ok(CommitReport {
            checkpoint,
            seq,
            sync_ms,
            upload_ms,
            write_ms,
            cleanup_ms,
        })
    }
}

/// Take out of `written` (oldest first) the checkpoints `policy` lets go at `now_ms` (over
/// their distinct ids, newest first, each at its id's time); returns their sequence numbers,
/// oldest first. A count policy is the count's rule exactly.
pub(super) fn leaving_by(
    written: &mut std::collections::VecDeque<(u64, String)>,
    policy: &crate::retention::RetentionPolicy,
    now_ms: u64,
) -> Vec<u64> {
    if policy.tiers.is_empty() {
        return leaving(written, policy.last);
    }
    let mut ids: Vec<&str> = Vec::new();
    for (_, id) in written.iter().rev() {
        if !ids.contains(&id.as_str()) {
            ids.push(id);
        }
    }
    let times: Vec<u64> = ids
        .iter()
        .map(|id| id.parse::<CheckpointId>().map_or(0, |i| i.millis()))
        .collect();
    let keep: std::collections::HashSet<String> = policy
        .select(&times, now_ms)
        .into_iter()
        .map(|i| ids[i].to_string())
        .collect();
    let doomed: Vec<u64> = written
        .iter()
        .filter(|(_, id)| !keep.contains(id))
        .map(|(seq, _)| *seq)
        .collect();
    written.retain(|(_, id)| keep.contains(id));
    doomed
}

/// Take out of `written` (oldest first) the checkpoints beyond its newest `keep` distinct
/// ids; returns their sequence numbers, oldest first.
pub(super) fn leaving(
    written: &mut std::collections::VecDeque<(u64, String)>,
    keep: usize,
) -> Vec<u64> {
    let mut ids = std::collections::HashSet::new();
    let mut cut = 0;
    for (i, (_, id)) in written.iter().enumerate().rev() {
        ids.insert(id.as_str());
        if ids.len() > keep.max(1) {
            cut = i + 1;
            break;
        }
    }
    written.drain(..cut).map(|(seq, _)| seq).collect()
}

/// Delete `<store dir>.checkpoints/<id>` dirs of ids older than `committed` (exact parse of
/// the dir name, never a substring match), but `keep`: the directory an unchanged store is
/// handed again.
pub(super) fn remove_older_checkpoint_dirs(
    spec: &StoreSpec,
    committed: CheckpointId,
    keep: Option<&Path>,
) {
    let Ok(entries) = std::fs::read_dir(spec.checkpoints_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(id) = name.to_str().and_then(|n| n.parse::<CheckpointId>().ok()) else {
            continue;
        };
        if id < committed && keep != Some(e.path().as_path()) {
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                tracing::warn!(dir = %e.path().display(), error = %err, "could not delete an old checkpoint dir");
            }
            crate::local::lazy::forget_links(&e.path());
        }
    }
}
