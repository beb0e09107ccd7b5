//! The upload of one store at a commit: renew the writer lease, scan the checkpoint dir,
//! carry an unchanged store's marker forward, PUT the blobs the committed snapshot lacks (or
//! name the pre-uploaded ones), bounded by the abandon age, then the index.

use super::*;

impl BlobBackupManager {
    #[tracing::instrument(level = "info", skip_all, fields(task = %self.task.task_name, store = %spec.name, checkpoint = %id))]
    pub(super) async fn upload_store(
        &self,
        id: CheckpointId,
        spec: &StoreSpec,
        scope: &StoreScope,
        cache: Option<Arc<HashCache>>,
        dir: PathBuf,
    ) -> Result<IndexMarker> {
        // 0. the commit manager's checkpoint directory of the committed snapshot, handed again
        //    (the store did not change): nothing read. A directory elsewhere (a caller's own)
        //    is always scanned.
        let same =
            lock(&self.state)?
                .get(&spec.name)
                .and_then(|s| match (&s.last_dir, &s.committed) {
                    (Some((d, m)), Some(c))
                        if *d == dir
                            && *m == c.marker
                            && dir.parent() == Some(&spec.checkpoints_dir()) =>
                    {
                        Some(c.clone())
                    }
                    _ => None,
                });
        if let Some(base) = same {
            let (files, bytes) = base
                .index
                .present_files()
                .iter()
                .fold((0, 0), |(n, b), (_, f)| (n + 1, b + f.file_metadata.size));
            let stats = UploadStats {
                files,
                bytes,
                diff: DiffTotals {
                    files_retained: files,
                    bytes_retained: bytes,
                    ..Default::default()
                },
                carried_forward: true,
                ..Default::default()
            };
            return self.carry_forward(spec, &base, stats);
        }
        let started = Instant::now();
        // 1. scan
        let (local, scan_stats) = self.scan(cache, dir.clone()).await?;
        let scan_ms = started.elapsed().as_millis() as u64;

        // 2. diff against the committed snapshot
        let committed = lock(&self.state)?
            .get(&spec.name)
            .and_then(|s| s.committed.clone());
        let prev_dir = committed.as_ref().map(|c| &c.index.dir_index);
        let dd = diff(&local, prev_dir);
        let totals = dd.totals();

        // An unchanged store costs no request: its snapshot holds exactly the files of the
        // diff base, so the base's marker is handed back and no index is written (DESIGN §7
        // step 2; restore and cleanup accept a marker named by several checkpoints).
        if let Some(base) = committed.as_ref().filter(|_| dd.is_unchanged()) {
            let stats = UploadStats {
                files: totals.files_retained,
                bytes: totals.bytes_retained,
                // Unchanged: nothing added or removed.
                diff: totals,
                bytes_hashed: scan_stats.bytes_hashed.load(Ordering::Relaxed),
                hash_cache_hits: scan_stats.cache_hits.load(Ordering::Relaxed),
                scan_ms,
                carried_forward: true,
                ..Default::default()
            };
            let marker = self.carry_forward(spec, base, stats)?;
            lock(&self.state)?
                .entry(spec.name.clone())
                .or_default()
                .last_dir = Some((dir, marker));
            return Ok(marker);
        }

        // 3. plan the blobs: reuse what the committed snapshot holds and what was pre-uploaded,
        //    send each new content once
        let pre = self.pre_uploaded(id, &spec.name, &dd).await;
        let (blob_of, to_put, to_inline, deduplicated) = plan_blobs(
            id,
            committed.as_ref(),
            &dd,
            self.settings.inline_below,
            &pre,
        );
        let pre_used: Vec<&PreUploaded> = pre
            .values()
            .filter(|p| blob_of.get(&p.digest.sha256) == Some(&p.blob_id))
            .collect();
        let progress = self.progress.get(&spec.name).cloned().unwrap_or_default();
        progress.reset();
        progress
            .files_to_upload
            .store(to_put.len() as u64, Ordering::Relaxed);
        progress.bytes_to_upload.store(
            to_put.iter().map(|f| f.digest.size).sum(),
            Ordering::Relaxed,
        );
        // A retained inline file shared as a blob now counts once: as an upload, or (already a
        // blob elsewhere) as deduplicated.
        let shared = retained_inline(&dd).len() as u64;
        progress.files_to_retain.store(
            totals.files_retained.saturating_sub(shared) + deduplicated,
            Ordering::Relaxed,
        );
        progress.bytes_to_retain.store(
            totals.bytes_added + totals.bytes_retained
                - to_put.iter().map(|f| f.digest.size).sum::<u64>(),
            Ordering::Relaxed,
        );
        let upload_started = Instant::now();
        self.note_first_put(id)?;
        // A named pre-upload's PUT is this commit's too: the abandon rule measures from the
        // earliest (DESIGN §7 step 2).
        for p in &pre_used {
            self.note_put_at(id, p.put_at)?;
        }
        if !pre_used.is_empty() {
            crate::crash::point("preupload.after-named");
        }
        let requests = self.put_blobs(id, scope, &to_put, &progress).await?;
        let inline = read_inline(&to_inline).await?;

        // 4. the index — unless the commit's uploads took so long that the sweep could have
        //    taken their first blobs (DESIGN §7 step 2; checked again before the checkpoint
        //    write, `before_commit`).
        self.check_age(id, &format!("upload of store {}", spec.name))?;
        let mut dir_index = build_dir(&dd, &blob_of, &inline)?;
        let reads = read_heat(&dir).await;
        {
            // No I/O under the lock: the heat file was read above.
            let state = lock(&self.state)?;
            let none = HashMap::new();
            let base = state.get(&spec.name).map_or(&none, |s| &s.heat_base);
            add_heat(&mut dir_index, base, &reads);
        }
        // A fork's retained files keep naming the blobs it borrows: the new index declares
        // the scopes they are in (those still named, no others).
        let (borrowed_from, blobs) = match committed.as_ref() {
            Some(c) => still_borrowed(c, &dir_index),
            None => (BTreeMap::new(), BlobScopes::own(scope.clone())),
        };
        let index = SnapshotIndex {
            format_version: if !borrowed_from.is_empty() {
                crate::index::FORMAT_FORK
            } else if has_inline(&dir_index) {
                FORMAT_INLINE
            } else {
                FORMAT_V1
            },
            creation_time_millis: self.clock.now_millis(),
            snapshot_metadata: SnapshotMetadata {
                checkpoint_id: id,
                job_name: self.task.job_name.clone(),
                job_id: self.task.job_id.clone(),
                task_name: self.task.task_name.clone(),
                store_name: spec.name.clone(),
            },
            dir_index,
            prev_snapshot_index_blob_id: committed.as_ref().map(|c| c.marker.to_string()),
            borrowed_from,
        };
        let (marker, index_len) = self.put_index(id, scope, &index).await?;

        let stats = UploadStats {
            files: totals.files_added + totals.files_retained,
            bytes: totals.bytes_added + totals.bytes_retained,
            diff: totals,
            blobs_uploaded: to_put.len() as u64,
            bytes_uploaded: to_put.iter().map(|f| f.digest.size).sum(),
            blobs_deduplicated: deduplicated,
            requests: requests + 1,
            bytes_hashed: scan_stats
                .bytes_hashed
                .load(std::sync::atomic::Ordering::Relaxed),
            hash_cache_hits: scan_stats
                .cache_hits
                .load(std::sync::atomic::Ordering::Relaxed),
            index_bytes: index_len,
            scan_ms,
            upload_ms: upload_started.elapsed().as_millis() as u64,
            carried_forward: false,
            files_inline: to_inline.len() as u64,
            files_pre_uploaded: pre_used.len() as u64,
            bytes_pre_uploaded: pre_used.iter().map(|p| p.digest.size).sum(),
        };
        if let Some(p) = self.pre.get(&spec.name) {
            p.used(stats.files_pre_uploaded, stats.bytes_pre_uploaded);
        }
        tracing::info!(
            marker = %marker,
            files = stats.files,
            files_added = stats.diff.files_added,
            files_retained = stats.diff.files_retained,
            files_removed = stats.diff.files_removed,
            blobs_uploaded = stats.blobs_uploaded,
            bytes_uploaded = stats.bytes_uploaded,
            files_pre_uploaded = stats.files_pre_uploaded,
            bytes_retained = stats.diff.bytes_retained,
            requests = stats.requests,
            bytes_hashed = stats.bytes_hashed,
            scan_ms = stats.scan_ms,
            upload_ms = stats.upload_ms,
            "uploaded store snapshot"
        );
        record_upload_metrics(&self.task.task_name, &spec.name, &stats);
        lock(&self.stats)?.insert(spec.name.clone(), stats);
        let mut state = lock(&self.state)?;
        let st = state.entry(spec.name.clone()).or_default();
        st.uploaded.insert(
            marker,
            LoadedSnapshot {
                scope: scope.clone(),
                blobs,
                marker,
                index: Arc::new(index),
            },
        );
        st.last_dir = Some((dir, marker));
        Ok(marker)
    }

    /// Hand back `base`'s marker for an unchanged store (DESIGN §7 step 2): no request.
    pub(super) fn carry_forward(
        &self,
        spec: &StoreSpec,
        base: &LoadedSnapshot,
        stats: UploadStats,
    ) -> Result<IndexMarker> {
        if let Some(p) = self.progress.get(&spec.name) {
            p.reset();
        }
        tracing::debug!(marker = %base.marker, files = stats.files, "store unchanged: marker carried forward, nothing uploaded");
        record_upload_metrics(&self.task.task_name, &spec.name, &stats);
        lock(&self.stats)?.insert(spec.name.clone(), stats);
        Ok(base.marker)
    }

    /// Scan a checkpoint dir (blocking, off the async threads), through the hash cache.
    pub(super) async fn scan(
        &self,
        cache: Option<Arc<HashCache>>,
        dir: PathBuf,
    ) -> Result<(LocalDir, Arc<ScanStats>)> {
        let scan_stats = Arc::new(ScanStats::default());
        let (owners, stats, only) = (
            Arc::clone(&self.owners),
            Arc::clone(&scan_stats),
            self.settings.only.clone(),
        );
        let tree = tokio::task::spawn_blocking(move || {
            let tree = scan_dir_only(&dir, only.as_ref(), cache.as_deref(), &owners, &stats)?;
            if let Some(c) = &cache {
                if let Err(e) = c.save() {
                    tracing::warn!(error = %e, "could not save the hash cache");
                }
            }
            Ok::<_, Error>(tree)
        })
        .await
        .map_err(|e| Error::task("scan", e))??;
        Ok((tree, scan_stats))
    }

    /// PUT the planned blobs (create-only, at most [`UPLOADS_IN_HAND`] at once; the store's
    /// transfer budget bounds what is on the wire across the process); returns the requests
    /// they took.
    pub(super) async fn put_blobs(
        &self,
        id: CheckpointId,
        scope: &StoreScope,
        to_put: &[&LocalFile],
        progress: &Arc<BackupProgress>,
    ) -> Result<u64> {
        let jobs: Vec<(String, PathBuf, u64, FileDigest)> = to_put
            .iter()
            .map(|f| {
                (
                    StoreScope::blob_id(id, f.digest.sha256),
                    f.path.clone(),
                    f.digest.size,
                    f.digest,
                )
            })
            .collect();
        futures::stream::iter(jobs)
            .map(|(blob_id, path, len, digest)| {
                let progress = Arc::clone(progress);
                async move {
                    // A multipart upload's parts count as they land (never past the file's
                    // size, whatever retries resend); the rest once the put returns.
                    let reported = Arc::new(AtomicU64::new(0));
                    let report: Arc<dyn Fn(u64) + Send + Sync> = {
                        let (progress, reported) = (Arc::clone(&progress), Arc::clone(&reported));
                        Arc::new(move |n| {
                            let before = reported.fetch_add(n, Ordering::Relaxed);
                            let add = n.min(len.saturating_sub(before));
                            progress.bytes_uploaded.fetch_add(add, Ordering::Relaxed);
                        })
                    };
                    let r = crate::blobstore::with_put_progress(
                        report,
                        self.put_blob(scope, blob_id, path, len, digest),
                    )
                    .await?;
                    crate::crash::point("backup.mid-upload");
                    progress.files_uploaded.fetch_add(1, Ordering::Relaxed);
                    let counted = reported.load(Ordering::Relaxed).min(len);
                    progress
                        .bytes_uploaded
                        .fetch_add(len - counted, Ordering::Relaxed);
                    Ok::<_, Error>(r)
                }
            })
            .buffer_unordered(UPLOADS_IN_HAND)
            .try_fold(0u64, |acc, r| async move { Ok(acc + r) })
            .await
    }

    /// PUT `index` create-only under its marker's key; returns the marker and the index's size.
    pub(super) async fn put_index(
        &self,
        id: CheckpointId,
        scope: &StoreScope,
        index: &SnapshotIndex,
    ) -> Result<(IndexMarker, u64)> {
        let bytes = index.to_bytes()?;
        let marker = IndexMarker::of(id, &bytes);
        let key = scope.index_key(&marker)?;
        let index_len = bytes.len() as u64;
        // Never commit an index no reader would accept: the commit fails (nothing committed
        // is lost) and says why.
        if index_len > crate::index::MAX_INDEX_BYTES {
            return Err(Error::invalid(format!(
                "the index of store {:?} at checkpoint {id} would be {index_len} bytes, over the {}-byte cap every reader enforces ({} files): not committed",
                index.snapshot_metadata.store_name,
                crate::index::MAX_INDEX_BYTES,
                index.present_files().len()
            )));
        }
        match self
            .blob_store
            .put(
                &key,
                PutBody::Bytes(bytes.into()),
                PutOptions::create_only(marker.sha256),
            )
            .await
        {
            Ok(_) => Ok((marker, index_len)),
            // The key is the hash of the bytes: an existing object with the same key and the
            // same hash is this very index (a retried upload).
            Err(e) if e.kind() == ErrorKind::Conflict => {
                let (sha, _) = hash_object(self.blob_store.as_ref(), &key).await?;
                if sha != marker.sha256 {
                    return Err(e.context(format!("index {key} exists with other bytes")));
                }
                Ok((marker, index_len))
            }
            Err(e) => Err(e.context(format!("put index {key}"))),
        }
    }

    /// PUT one blob (create-only); returns the requests it took.
    pub(super) async fn put_blob(
        &self,
        scope: &StoreScope,
        blob_id: String,
        path: PathBuf,
        len: u64,
        digest: FileDigest,
    ) -> Result<u64> {
        let key = scope.key(&blob_id)?;
        let body = PutBody::File {
            path: path.clone(),
            len,
        };
        match self
            .blob_store
            .put(
                &key,
                body,
                PutOptions::create_only(digest.sha256).with_crc32(digest.crc32),
            )
            .await
        {
            Ok(r) => Ok(u64::from(r.requests)),
            // The key names this upload's checkpoint id, which carries this process's epoch:
            // no other writer makes it, and the retry layer has already settled a retried PUT
            // of ours. An object there is foreign or an earlier incarnation's orphan — one a
            // sweep may be deleting right now (its last-modified is old): never reuse it, and
            // abandon the commit; the next one has a new id.
            Err(e) if e.kind() == ErrorKind::Conflict => Err(Error::transient(format!(
                "blob {key} already exists although its checkpoint id is this upload's own: not reused (it may be an orphan a sweep is deleting); the commit is abandoned and the next one starts afresh ({e})"
            ))),
            Err(e) => Err(e.context(format!("upload {} as {key}", path.display()))),
        }
    }

    // ---- before a PUT: the writer lease, pre-uploaded blobs, the abandon age ----

    pub(super) fn job_scope(&self) -> Result<JobScope> {
        if self.task.job_name == crate::layout::MANUAL_JOB {
            JobScope::manual(&self.task.job_id)
        } else {
            JobScope::new(&self.task.job_name, &self.task.job_id)
        }
    }

    /// Write the writer lease, or refresh it once it is older than a quarter of the grace:
    /// an upload starting now has its lease for at least three quarters of the grace, longer
    /// than the half the abandon rule lets it run.
    pub(super) async fn renew_lease(&self) -> Result<()> {
        let Some((lease, renewed)) = &self.lease else {
            return Ok(());
        };
        let due = lock(renewed)?.is_none_or(|t| t.elapsed() >= self.settings.gc_grace / 4);
        if due {
            lease
                .announce(self.blob_store.as_ref(), &self.job_scope()?)
                .await?;
            *lock(renewed)? = Some(Instant::now());
        }
        Ok(())
    }

    /// The pre-uploaded blobs upload `id` of `store` can name for the table and blob files it
    /// adds (waiting for pre-uploads in flight), by content. Files the committed snapshot
    /// already holds are not asked for (they reuse its blob).
    pub(super) async fn pre_uploaded(
        &self,
        id: CheckpointId,
        store: &str,
        dd: &DirDiff<'_>,
    ) -> HashMap<Sha256, PreUploaded> {
        let mut out = HashMap::new();
        let Some(pre) = self.pre.get(store) else {
            return out;
        };
        let held: std::collections::HashSet<Sha256> = lock(&self.state)
            .ok()
            .and_then(|s| s.get(store).and_then(|s| s.committed.clone()))
            .map(|c| {
                c.index
                    .present_files()
                    .iter()
                    .filter_map(|(_, f)| f.sha256)
                    .collect()
            })
            .unwrap_or_default();
        let fresh = crate::blob::commit::preupload::fresh_for(self.settings.gc_grace);
        for f in dd.added_files() {
            if !is_immutable(&f.name) || held.contains(&f.digest.sha256) {
                continue;
            }
            let now = self.clock.now_millis();
            if let Some(p) = pre.resolve(id, &f.name, &f.digest, now, fresh).await {
                out.insert(p.digest.sha256, p);
            }
        }
        out
    }

    /// Upload `id` names a blob whose PUT started at `at`: its first PUT is at the latest then.
    pub(super) fn note_put_at(&self, id: CheckpointId, at: (Instant, u64)) -> Result<()> {
        let mut first = lock(&self.first_put)?;
        let e = first.entry(id).or_insert(at);
        if at.0 < e.0 {
            e.0 = at.0;
        }
        if at.1 < e.1 {
            e.1 = at.1;
        }
        Ok(())
    }

    /// The time of upload `id`'s first PUT: now, unless a store of the same upload put first.
    pub(super) fn note_first_put(&self, id: CheckpointId) -> Result<(Instant, u64)> {
        let mut first = lock(&self.first_put)?;
        Ok(*first
            .entry(id)
            .or_insert_with(|| (Instant::now(), self.clock.now_millis())))
    }

    /// Abandon upload `id` if its first PUT is older than half the sweep's grace. Measured on
    /// the monotonic clock and on the task's clock (the one the tests inject), whichever says
    /// longer. An upload that never PUT anything is not bounded.
    ///
    /// `Ok(Some(left))`: the time left before the bound (on whichever clock says less).
    pub(super) fn check_age(
        &self,
        id: CheckpointId,
        what: &str,
    ) -> Result<Option<std::time::Duration>> {
        let Some((t0, t0_ms)) = lock(&self.first_put)?.get(&id).copied() else {
            return Ok(None);
        };
        let ran = t0.elapsed().max(std::time::Duration::from_millis(
            self.clock.now_millis().saturating_sub(t0_ms),
        ));
        if self.settings.abandon_rule && ran > self.settings.gc_grace / 2 {
            lock(&self.first_put)?.remove(&id);
            metrics::counter!("blobsnap_commit_abandoned_total", "task" => self.task.task_name.clone())
                .increment(1);
            let n = self
                .abandoned_in_a_row
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            if n >= ABANDON_LIMIT {
                // Not transient: every next commit uploads at least as much and is abandoned
                // again (a livelock that never commits). Stop the task, saying what to change.
                return Err(Error::invalid(format!(
                    "{what} at {id}: {n} commits in a row were abandoned because their uploads outlived half the sweep's grace ({:?}; this one's first PUT was {ran:?} ago): the store's uploads take longer than gc-grace / 2. Raise job.gc-grace-secs above twice the upload time, or make each commit upload less",
                    self.settings.gc_grace
                )));
            }
            return Err(Error::transient(format!(
                "{what} at {id}: its first PUT was {ran:?} ago, over half the sweep's grace ({:?}): abandoned ({n} in a row); the next commit starts afresh",
                self.settings.gc_grace
            )));
        }
        if !self.settings.abandon_rule {
            return Ok(None);
        }
        Ok(Some((self.settings.gc_grace / 2).saturating_sub(ran)))
    }
}
