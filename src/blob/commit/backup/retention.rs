//! What a commit keeps and lets go: a fork's pins, what was committed, the pre-upload
//! workers, and the snapshots that leave the retention window.

use super::*;

impl BlobBackupManager {
    /// A fork's task: delete the pins none of its snapshots needs any more (best effort: a
    /// pin kept too long only keeps the source's savepoint from being removed).
    pub(super) async fn release_pins(&self) {
        if !self.release.holds_any() {
            return;
        }
        let window: Vec<Arc<SnapshotIndex>> = match lock(&self.state) {
            Ok(state) => state
                .values()
                .flat_map(|st| st.retained.iter().chain(st.uploaded.values()))
                .map(|s| Arc::clone(&s.index))
                .collect(),
            Err(_) => return,
        };
        if let Err(e) = self
            .release
            .release_unused(window.iter().map(|i| i.as_ref()))
            .await
        {
            tracing::warn!(task = %self.task.task_name, error = %e, "could not release a fork pin; retried at the next commit");
        }
    }

    /// The checkpoint naming `markers` is committed: each store's index named there becomes
    /// the baseline of the next upload and joins the retention window. Returns the keys of
    /// pre-uploaded blobs no index named whose files RocksDB has deleted since: waste, which
    /// no commit can name any more ([`PreUploads::settle`]).
    pub(super) async fn note_committed(
        &self,
        id: CheckpointId,
        markers: &StoreMarkers,
    ) -> Result<Vec<BlobKey>> {
        // Uploads up to this one will never commit now: their clocks are done.
        lock(&self.first_put)?.retain(|k, _| *k > id);
        let mut wasted = Vec::new();
        let generation = {
            let mut g = lock(&self.generations)?;
            let mine = g.get(&id).copied();
            g.retain(|k, _| *k > id);
            mine
        };
        if let Some(generation) = generation {
            for (spec, scope, _) in &self.stores {
                if let Some(pre) = self.pre.get(&spec.name) {
                    for blob in pre.settle(id, generation) {
                        wasted.push(scope.key(&blob)?);
                    }
                }
            }
        }
        self.abandoned_in_a_row
            .store(0, std::sync::atomic::Ordering::Relaxed);
        for (spec, _, _) in &self.stores {
            let Some(marker_str) = markers.get(&spec.name) else {
                continue;
            };
            let marker: IndexMarker = marker_str.parse()?;
            let known = {
                let mut state = lock(&self.state)?;
                let st = state.entry(spec.name.clone()).or_default();
                if st.committed.as_ref().is_some_and(|c| c.marker == marker) {
                    continue;
                }
                let found = st.uploaded.remove(&marker);
                if found.is_some() {
                    // Uploads older than the committed one can never commit now.
                    st.uploaded
                        .retain(|m, _| m.checkpoint_id > marker.checkpoint_id);
                }
                found
            };
            let snap = match known {
                Some(s) => s,
                None => self.load_committed(spec, marker_str).await?,
            };
            tracing::debug!(store = %spec.name, checkpoint = %id, marker = %snap.marker, "committed");
            self.release.note(&snap.index);
            let mut state = lock(&self.state)?;
            let st = state.entry(spec.name.clone()).or_default();
            st.committed = Some(snap.clone());
            if st.retained.back().map(|s| s.marker) != Some(snap.marker) {
                st.retained.push_back(snap);
            }
        }
        Ok(wasted)
    }

    /// Start the pre-upload workers (once, when the commit manager hands over its ids; in a
    /// tokio runtime only).
    pub(super) fn start_pre_uploads(&self, ids: crate::backend::IdSource) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(task = %self.task.task_name, "no tokio runtime: no pre-upload");
            return;
        };
        let Ok(mut workers) = lock(&self.workers) else {
            return;
        };
        if !workers.is_empty() {
            return;
        }
        for (spec, scope, cache) in &self.stores {
            let Some(pre) = self.pre.get(&spec.name) else {
                continue;
            };
            let events = crate::local::events::subscribe(&spec.dir);
            let worker = crate::blob::commit::preupload::Worker {
                blob_store: Arc::clone(&self.blob_store),
                scope: scope.clone(),
                cache: cache.clone(),
                ids: Arc::clone(&ids),
                clock: Arc::clone(&self.clock),
            };
            let h = rt.spawn(Arc::clone(pre).run(events, worker));
            workers.push(h.abort_handle());
        }
    }

    /// What leaves retention now: exactly
    /// `blobs(leaving) − blobs(retained ∪ uploaded-but-uncommitted)`, computed by key from the
    /// indexes in hand (no listing), and the leaving indexes — every store's, for one batch
    /// delete for the whole task (DESIGN §7 step 4). Changes nothing:
    /// [`retire`](Self::retire) takes the snapshots out of the window once their deletes were
    /// sent or handed over.
    ///
    /// While a store of the task is lazily restoring — and at the first cleanup after (the
    /// commit manager kept the history at that commit's trim, which came first) — nothing
    /// leaves (DESIGN §8: the restore fallback keeps its candidates whole).
    pub(super) fn expiry(&self) -> Result<Expiry> {
        let mut out = Expiry::default();
        let lazy = self
            .stores
            .iter()
            .any(|(spec, _, _)| crate::local::lazy::status(&spec.dir).is_some());
        let held_before = self.held.swap(lazy, std::sync::atomic::Ordering::AcqRel);
        if lazy || held_before {
            return Ok(out);
        }
        for (spec, scope, _) in &self.stores {
            let (leaving, keep) = {
                let state = lock(&self.state)?;
                let Some(st) = state.get(&spec.name) else {
                    continue;
                };
                let n = st
                    .retained
                    .len()
                    .saturating_sub(self.settings.retention.max(1));
                if n == 0 {
                    continue;
                }
                let leaving: Vec<LoadedSnapshot> = st.retained.iter().take(n).cloned().collect();
                let keep: Vec<LoadedSnapshot> = st
                    .retained
                    .iter()
                    .skip(n)
                    .chain(st.uploaded.values())
                    .cloned()
                    .collect();
                (leaving, keep)
            };
            let mut doomed = BTreeMap::new();
            for l in &leaving {
                doomed.extend(blob_keys(scope, &l.index)?);
            }
            for k in &keep {
                for key in blob_keys(scope, &k.index)?.keys() {
                    doomed.remove(key);
                }
            }
            out.stats.bytes_deleted += doomed.values().sum::<u64>();
            out.stats.blobs_deleted += doomed.len() as u64;
            out.keys.extend(doomed.into_keys());
            // A leaving index goes unless a snapshot kept names the same marker (markers are
            // carried forward: DESIGN §7 step 4).
            for l in &leaving {
                if !keep.iter().any(|k| k.marker == l.marker) {
                    out.keys.push(scope.index_key(&l.marker)?);
                }
                tracing::info!(store = %spec.name, expired = %l.marker, "snapshot left retention");
            }
            out.stats.snapshots_expired += leaving.len() as u64;
            out.leaving.push((spec.name.clone(), leaving.len()));
        }
        Ok(out)
    }

    /// Take the snapshots of `expiry` out of the retention window and count them.
    pub(super) fn retire(&self, expiry: Expiry) -> Result<()> {
        {
            let mut state = lock(&self.state)?;
            for (store, n) in expiry.leaving {
                if let Some(st) = state.get_mut(&store) {
                    for _ in 0..n {
                        st.retained.pop_front();
                    }
                }
            }
        }
        let total = expiry.stats;
        if total.snapshots_expired > 0 {
            let labels = [("task", self.task.task_name.clone())];
            metrics::counter!("blobsnap_gc_blobs_deleted_total", &labels)
                .increment(total.blobs_deleted);
            metrics::counter!("blobsnap_gc_bytes_deleted_total", &labels)
                .increment(total.bytes_deleted);
        }
        let mut c = lock(&self.cleanup_stats)?;
        c.snapshots_expired += total.snapshots_expired;
        c.blobs_deleted += total.blobs_deleted;
        c.bytes_deleted += total.bytes_deleted;
        Ok(())
    }

    /// What cleanup has deleted since this manager was created.
    pub fn cleanup_stats(&self) -> CleanupStats {
        self.cleanup_stats.lock().map(|c| *c).unwrap_or_default()
    }
}
