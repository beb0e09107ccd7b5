//! The upload of one store at a commit: renew the writer lease, scan the checkpoint dir,
//! carry an unchanged store's marker forward, PUT the blobs the committed snapshot lacks (or
//! name the pre-uploaded ones), bounded by the abandon age, then the index.
//!
//! Over 800 lines, on purpose (issue 49): this file is one store's commit from its scan to
//! its index PUT — the upload below, then the index it writes — so that the commit's path
//! runs through as few files as a reader must open. Its unit tests live beside it
//! (`upload/tests.rs`).
//!
//! ## The index it writes
//!
//! The index a commit writes: the diff of the checkpoint dir against the committed index,
//! the heat of each table, which files travel inline (and which retained inline files become
//! shared blobs), which blobs to PUT, the dir index itself.
//!
//! The diff ([`diff`]): the local tree vs the previous [`DirIndex`] — which files are added,
//! retained and removed, recursively (Samza's DirDiff, reference §1.5), by content identity.
//! A file is *retained* when the previous index has a file of the same name, size and
//! SHA-256 (its blob is reused, its POSIX attributes are taken from disk now); otherwise it is
//! *added*, and a previous file of that name is *removed* (a MANIFEST or OPTIONS rewritten with
//! new content is removed + added). A previous entry without a SHA-256 (one of Samza's whose
//! blob key names none, DESIGN §6) is never retained. Pure: no I/O, unit- and
//! property-tested.

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

/// The heat of each file at the root of a snapshot (where RocksDB's table files are).
pub(super) fn heat_of(root: &DirIndex) -> HashMap<String, u64> {
    root.files_present
        .iter()
        .filter_map(|f| Some((f.file_name.clone(), f.heat?)))
        .collect()
}

/// The reads a checkpoint directory's [`crate::index::HEAT_FILE`] sampled, by file name:
/// none when it has none (a directory the caller made, or a store nobody read). An
/// unreadable one costs the heat of this snapshot, never the backup (a warning).
pub(super) async fn read_heat(dir: &Path) -> HashMap<String, u64> {
    let path = dir.join(crate::index::HEAT_FILE);
    let parsed = match tokio::fs::read(&path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HashMap::new(),
        Err(e) => Err(e.to_string()),
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| e.to_string()),
    };
    parsed.unwrap_or_else(|e| {
        tracing::warn!(file = %path.display(), error = %e, "unreadable heat file: this snapshot records no heat");
        HashMap::new()
    })
}

/// Set the heat of each root file: what it had when this process started plus the reads
/// sampled since (none written for a file never read).
pub(super) fn add_heat(
    root: &mut DirIndex,
    base: &HashMap<String, u64>,
    reads: &HashMap<String, u64>,
) {
    for f in &mut root.files_present {
        let heat = base
            .get(&f.file_name)
            .copied()
            .unwrap_or(0)
            .saturating_add(reads.get(&f.file_name).copied().unwrap_or(0));
        f.heat = (heat > 0).then_some(heat);
    }
}

pub(super) fn file_index(f: &LocalFile, blob_id: String) -> FileIndex {
    FileIndex {
        file_name: f.name.clone(),
        blobs: vec![FileBlob { blob_id, offset: 0 }],
        file_metadata: f.metadata.clone(),
        checksum: f.digest.crc32,
        sha256: Some(f.digest.sha256),
        inline_data: None,
        heat: None,
    }
}

/// Whether any present file of `d` (or below) travels inline.
pub(super) fn has_inline(d: &DirIndex) -> bool {
    d.files_present.iter().any(|f| f.inline_data.is_some())
        || d.sub_dirs_present.iter().any(has_inline)
}

/// Read the files that travel inline (small: off the async threads, all at once) and encode
/// them, by path. Each is checked against the SHA-256 and size the scan found: a file of
/// a checkpoint dir that changed since is an error, never a wrong index.
pub(super) async fn read_inline(files: &[&LocalFile]) -> Result<HashMap<PathBuf, String>> {
    let jobs: Vec<(PathBuf, FileDigest)> =
        files.iter().map(|f| (f.path.clone(), f.digest)).collect();
    tokio::task::spawn_blocking(move || {
        let mut out = HashMap::new();
        for (path, digest) in jobs {
            let bytes = std::fs::read(&path)
                .map_err(Error::io_with(format!("read {}", path.display())))?;
            if bytes.len() as u64 != digest.size || Sha256::of(&bytes) != digest.sha256 {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{} changed after it was hashed ({} bytes, {} when scanned): a checkpoint dir must not change",
                        path.display(),
                        bytes.len(),
                        digest.size
                    ),
                ));
            }
            out.insert(path, FileIndex::encode_inline(&bytes));
        }
        Ok(out)
    })
    .await
    .map_err(|e| Error::task("read inline files", e))?
}

/// Which blobs an upload sends: an added mutable file (not `*.sst` or `*.blob`) smaller than
/// `inline_below` travels inline in the index; an added file whose SHA-256 the committed snapshot (or an earlier file of this
/// upload) already holds reuses that blob; every other content is sent once, as
/// `blobs/<id>/<sha256>`. Returns the blob of every content, the files to PUT, the files to
/// carry inline and how many added files were deduplicated.
type BlobPlan<'a> = (
    HashMap<Sha256, String>,
    Vec<&'a LocalFile>,
    Vec<&'a LocalFile>,
    u64,
);

pub(super) fn plan_blobs<'a>(
    id: CheckpointId,
    committed: Option<&LoadedSnapshot>,
    dd: &'a DirDiff<'a>,
    inline_below: u64,
    pre: &HashMap<Sha256, PreUploaded>,
) -> BlobPlan<'a> {
    let mut blob_of: HashMap<Sha256, String> = HashMap::new();
    if let Some(c) = committed {
        for (_, f) in c.index.present_files() {
            if let (Some(sha), [blob]) = (f.sha256, f.blobs.as_slice()) {
                blob_of.entry(sha).or_insert_with(|| blob.blob_id.clone());
            }
        }
    }
    let mut to_put: Vec<&LocalFile> = Vec::new();
    let mut to_inline: Vec<&LocalFile> = Vec::new();
    let mut deduplicated = 0u64;
    // What the retained files already carry inline counts against the index's budget.
    let mut inline_left = INLINE_BUDGET.saturating_sub(retained_inline_bytes(dd));
    // A file carried inline that came back unchanged (RocksDB's OPTIONS file, the same for the
    // DB's whole open life) would be sent again in every later index: from its first repeat
    // on it is a blob of its own (one PUT, once), which later snapshots share for free.
    for f in retained_inline(dd) {
        let sha = f.digest.sha256;
        if blob_of.contains_key(&sha) {
            deduplicated += 1;
            continue;
        }
        blob_of.insert(sha, StoreScope::blob_id(id, sha));
        to_put.push(f);
    }
    for f in dd.added_files() {
        // Only mutable files (MANIFEST, OPTIONS, CURRENT, a WAL): they change at almost every
        // commit, so a blob of their own would cost a PUT each time. An SST or blob file is
        // immutable and stays a blob, which retained snapshots share for free (inline, it
        // would be sent again in every later index).
        if f.digest.size < inline_below && !is_immutable(&f.name) && f.digest.size <= inline_left {
            inline_left -= f.digest.size;
            to_inline.push(f);
            continue;
        }
        let sha = f.digest.sha256;
        if blob_of.contains_key(&sha) {
            deduplicated += 1;
            continue;
        }
        if let Some(p) = pre.get(&sha) {
            blob_of.insert(sha, p.blob_id.clone());
            continue;
        }
        blob_of.insert(sha, StoreScope::blob_id(id, sha));
        to_put.push(f);
    }
    (blob_of, to_put, to_inline, deduplicated)
}

/// Inline files at least this large that a snapshot retains unchanged become blobs of their
/// own from their first repeat on (one PUT, once; later snapshots name the blob); smaller
/// ones (CURRENT, IDENTITY) cost less inline than a PUT.
pub const SHARE_INLINE_FROM: u64 = 4 << 10;

/// The files `dd` retains (same name and content as the committed snapshot) whose entries
/// carry their content inline and are at least [`SHARE_INLINE_FROM`] bytes.
pub(super) fn retained_inline<'a>(dd: &'a DirDiff<'a>) -> Vec<&'a LocalFile> {
    fn collect<'a>(d: &'a DirDiff<'a>, out: &mut Vec<&'a LocalFile>) {
        out.extend(
            d.files_retained
                .iter()
                .filter(|(local, prev)| {
                    prev.inline_data.is_some() && local.digest.size >= SHARE_INLINE_FROM
                })
                .map(|(local, _)| *local),
        );
        for sub in d.sub_dirs_added.iter().chain(&d.sub_dirs_retained) {
            collect(sub, out);
        }
    }
    let mut out = Vec::new();
    collect(dd, &mut out);
    out
}

/// Bytes of the files `dd` retains that keep carrying their content inline (their entries
/// keep it; the larger ones become blobs, see `retained_inline`).
pub(super) fn retained_inline_bytes(dd: &DirDiff<'_>) -> u64 {
    let here: u64 = dd
        .files_retained
        .iter()
        .filter(|(local, prev)| prev.inline_data.is_some() && local.digest.size < SHARE_INLINE_FROM)
        .map(|(_, prev)| prev.file_metadata.size)
        .sum();
    dd.sub_dirs_added
        .iter()
        .chain(&dd.sub_dirs_retained)
        .map(retained_inline_bytes)
        .fold(here, u64::saturating_add)
}

/// The new DirIndex: retained files keep their blob or inline data (with attributes from
/// disk now), added files get their inline data or the blob planned for their content.
pub(super) fn build_dir(
    d: &DirDiff<'_>,
    blob_of: &HashMap<Sha256, String>,
    inline: &HashMap<PathBuf, String>,
) -> Result<DirIndex> {
    let mut files = Vec::with_capacity(d.files_added.len() + d.files_retained.len());
    for (local, prev) in &d.files_retained {
        // An inline file shared as a blob from its first repeat on (see `plan_blobs`).
        if prev.inline_data.is_some() && local.digest.size >= SHARE_INLINE_FROM {
            if let Some(blob) = blob_of.get(&local.digest.sha256) {
                files.push(file_index(local, blob.clone()));
                continue;
            }
        }
        let mut fi = (*prev).clone();
        fi.file_metadata = local.metadata.clone();
        files.push(fi);
    }
    for f in &d.files_added {
        // By file, not by content: a copy of an inlined content that came past the inline
        // budget is a blob.
        if let Some(data) = inline.get(&f.path) {
            files.push(FileIndex {
                blobs: Vec::new(),
                inline_data: Some(data.clone()),
                heat: None,
                ..file_index(f, String::new())
            });
            continue;
        }
        let blob = blob_of.get(&f.digest.sha256).ok_or_else(|| {
            Error::new(
                ErrorKind::Io,
                format!("internal: no blob planned for {}", f.path.display()),
            )
        })?;
        files.push(file_index(f, blob.clone()));
    }
    let mut dirs = Vec::new();
    for sub in d.sub_dirs_added.iter().chain(&d.sub_dirs_retained) {
        dirs.push(build_dir(sub, blob_of, inline)?);
    }
    Ok(DirIndex {
        dir_name: d.name.clone(),
        files_present: files,
        // A removed inline file is named without its bytes: they are in the previous index,
        // and copying them again made the removed MANIFEST a third of every index.
        files_removed: d
            .files_removed
            .iter()
            .map(|f| FileIndex {
                inline_data: None,
                ..(*f).clone()
            })
            .collect(),
        sub_dirs_present: dirs,
        sub_dirs_removed: d.sub_dirs_removed.iter().map(|d| (*d).clone()).collect(),
    })
}

// ---- the diff ----

/// The difference of one directory.
#[derive(Debug, Default)]
pub struct DirDiff<'a> {
    /// The directory's name (`""` for the root).
    pub name: String,
    /// Local files not in the previous index with the same content.
    pub files_added: Vec<&'a LocalFile>,
    /// Local files whose content the previous index already has, with that entry.
    pub files_retained: Vec<(&'a LocalFile, &'a FileIndex)>,
    /// Previous entries with no local file of the same name and content.
    pub files_removed: Vec<&'a FileIndex>,
    /// Local directories the previous index does not have.
    pub sub_dirs_added: Vec<DirDiff<'a>>,
    /// Directories on both sides.
    pub sub_dirs_retained: Vec<DirDiff<'a>>,
    /// Previous directories with no local counterpart (whole subtrees).
    pub sub_dirs_removed: Vec<&'a DirIndex>,
}

/// Totals of a diff.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiffTotals {
    /// Files added.
    pub files_added: u64,
    /// Bytes of added files.
    pub bytes_added: u64,
    /// Files retained.
    pub files_retained: u64,
    /// Bytes of retained files.
    pub bytes_retained: u64,
    /// Files removed (including those of removed subtrees).
    pub files_removed: u64,
    /// Bytes of removed files.
    pub bytes_removed: u64,
}

fn same_content(local: &LocalFile, prev: &FileIndex) -> bool {
    prev.sha256 == Some(local.digest.sha256) && prev.file_metadata.size == local.digest.size
}

/// Diff `local` against `prev` (`None`: everything is added).
pub fn diff<'a>(local: &'a LocalDir, prev: Option<&'a DirIndex>) -> DirDiff<'a> {
    let mut out = DirDiff {
        name: local.name.clone(),
        ..Default::default()
    };
    let prev_files: HashMap<&str, &FileIndex> = prev
        .map(|p| {
            p.files_present
                .iter()
                .map(|f| (f.file_name.as_str(), f))
                .collect()
        })
        .unwrap_or_default();
    let prev_dirs: HashMap<&str, &DirIndex> = prev
        .map(|p| {
            p.sub_dirs_present
                .iter()
                .map(|d| (d.dir_name.as_str(), d))
                .collect()
        })
        .unwrap_or_default();

    for f in &local.files {
        match prev_files.get(f.name.as_str()) {
            Some(p) if same_content(f, p) => out.files_retained.push((f, p)),
            _ => out.files_added.push(f),
        }
    }
    if let Some(p) = prev {
        for pf in &p.files_present {
            let kept = local
                .files
                .iter()
                .any(|f| f.name == pf.file_name && same_content(f, pf));
            if !kept {
                out.files_removed.push(pf);
            }
        }
    }
    for d in &local.dirs {
        match prev_dirs.get(d.name.as_str()) {
            Some(p) => out.sub_dirs_retained.push(diff(d, Some(p))),
            None => out.sub_dirs_added.push(diff(d, None)),
        }
    }
    if let Some(p) = prev {
        for pd in &p.sub_dirs_present {
            if !local.dirs.iter().any(|d| d.name == pd.dir_name) {
                out.sub_dirs_removed.push(pd);
            }
        }
    }
    out
}

fn removed_subtree(d: &DirIndex, t: &mut DiffTotals) {
    for f in &d.files_present {
        t.files_removed += 1;
        t.bytes_removed += f.file_metadata.size;
    }
    for s in &d.sub_dirs_present {
        removed_subtree(s, t);
    }
}

impl DirDiff<'_> {
    /// Totals over the whole tree.
    pub fn totals(&self) -> DiffTotals {
        let mut t = DiffTotals::default();
        self.add_totals(&mut t);
        t
    }

    fn add_totals(&self, t: &mut DiffTotals) {
        for f in &self.files_added {
            t.files_added += 1;
            t.bytes_added += f.digest.size;
        }
        for (f, _) in &self.files_retained {
            t.files_retained += 1;
            t.bytes_retained += f.digest.size;
        }
        for f in &self.files_removed {
            t.files_removed += 1;
            t.bytes_removed += f.file_metadata.size;
        }
        for d in self.sub_dirs_added.iter().chain(&self.sub_dirs_retained) {
            d.add_totals(t);
        }
        for d in &self.sub_dirs_removed {
            removed_subtree(d, t);
        }
    }

    /// Whether the local tree has exactly the files of the previous snapshot: the same
    /// directories, names, sizes, contents (SHA-256) and permissions. Such a snapshot needs no
    /// new index: the previous marker is carried forward (DESIGN §7 step 2).
    pub fn is_unchanged(&self) -> bool {
        self.files_added.is_empty()
            && self.files_removed.is_empty()
            && self.sub_dirs_added.is_empty()
            && self.sub_dirs_removed.is_empty()
            && self
                .files_retained
                .iter()
                .all(|(f, p)| f.metadata.mode() == p.file_metadata.mode())
            && self.sub_dirs_retained.iter().all(DirDiff::is_unchanged)
    }

    /// Every added file, depth first.
    pub fn added_files(&self) -> Vec<&LocalFile> {
        let mut out = Vec::new();
        self.collect_added(&mut out);
        out
    }

    fn collect_added<'s>(&'s self, out: &mut Vec<&'s LocalFile>) {
        out.extend(self.files_added.iter().copied());
        for d in self.sub_dirs_added.iter().chain(&self.sub_dirs_retained) {
            d.collect_added(out);
        }
    }
}

#[cfg(test)]
mod tests;
