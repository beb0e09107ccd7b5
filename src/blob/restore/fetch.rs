//! Getting a file's bytes: a verified download into the staging tree (retried when corrupt
//! or transient), the proof that a lazy restore's remote files exist, and the fetcher and
//! footer reader a lazy restore is registered with.

use super::*;

impl BlobRestoreManager {
    pub(super) async fn download_one(
        &self,
        scope: &BlobScopes,
        staging: &Path,
        f: &PlannedFile,
        landed: &AtomicU64,
    ) -> Result<()> {
        let dest = staging.join(&f.path);
        let tmp = dest.with_file_name(format!(
            ".{}.blobsnap-part",
            dest.file_name().and_then(|n| n.to_str()).unwrap_or("file")
        ));
        match f.entry.inline_bytes()? {
            // Carried in the index (its SHA-256 was checked when the plan was made).
            Some(bytes) => {
                let tmp_w = tmp.clone();
                tokio::task::spawn_blocking(move || {
                    use std::io::Write as _;
                    std::fs::File::create(&tmp_w)
                        .and_then(|mut file| file.write_all(&bytes).and_then(|()| file.sync_all()))
                        .map_err(Error::io_with(format!("write {}", tmp_w.display())))
                })
                .await
                .map_err(|e| Error::task("write inline file", e))??;
            }
            None => self.fetch_blob(scope, f, &tmp, landed).await?,
        }
        if let Some(mode) = f.entry.file_metadata.mode() {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
                .map_err(Error::io_with(format!("chmod {}", tmp.display())))?;
        }
        std::fs::rename(&tmp, &dest)
            .map_err(Error::io_with(format!("rename into {}", dest.display())))
    }

    /// Download `f`'s blob into `tmp`, verified and fsynced, retrying a corrupt or transient
    /// download a bounded number of times (`tmp` is removed on a final failure).
    pub(super) async fn fetch_blob(
        &self,
        scope: &BlobScopes,
        f: &PlannedFile,
        tmp: &Path,
        landed: &AtomicU64,
    ) -> Result<()> {
        fetch_verified(
            self.blob_store.as_ref(),
            scope,
            &f.path,
            &f.entry,
            tmp,
            &self.settings,
            landed,
        )
        .await
    }

    /// How a lazy restore of a store in `scope` fetches its remote files: as
    /// [`fetch_blob`](Self::fetch_blob), on the lazy restore's runtime.
    /// HEAD every blob of `remote` (bounded: `downloads × part_concurrency` at once): `Ok`
    /// when each exists with its entry's size; `NotFound` naming the first file whose blob is
    /// missing, `Corrupt` when a blob's size is not the file's.
    pub(super) async fn prove_remote(
        &self,
        scope: &BlobScopes,
        remote: &[FileIndex],
    ) -> Result<()> {
        let width = (self.settings.downloads.max(1) * self.settings.part_concurrency.max(1)).max(4);
        futures::stream::iter(remote.iter().cloned())
            .map(|entry: FileIndex| async move {
                let blob = entry.first_blob_id(&entry.file_name)?;
                let key = scope.key(blob)?;
                let meta = self
                    .blob_store
                    .head(&key)
                    .await
                    .map_err(|e| e.context(format!("lazy restore: file {} (blob {key})", entry.file_name)))?;
                if meta.size != entry.file_metadata.size {
                    return Err(Error::corrupt(format!(
                        "lazy restore: file {} (blob {key}) is {} bytes in the store, the index says {}",
                        entry.file_name, meta.size, entry.file_metadata.size
                    )));
                }
                Ok(())
            })
            .buffer_unordered(width)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    pub(super) fn fetcher(&self, scope: &BlobScopes) -> crate::local::lazy::FetchFn {
        // The restore's cancel token ends the restore, not the store it opened: a lazily
        // restored store lives on, and after a graceful stop (the job's stop token) its
        // reads and the compactions of the final commit still fetch (issue 46, L5). The lazy
        // store's own token ends its fetches when it closes.
        let mut settings = self.settings.clone();
        settings.cancel = CancellationToken::new();
        let (store, scope, settings) = (Arc::clone(&self.blob_store), scope.clone(), settings);
        Arc::new(
            move |entry: FileIndex,
                  tmp: std::path::PathBuf|
                  -> futures::future::BoxFuture<'static, Result<()>> {
                let (store, scope, settings) =
                    (Arc::clone(&store), scope.clone(), settings.clone());
                Box::pin(async move {
                    let name = entry.file_name.clone();
                    fetch_verified(
                        store.as_ref(),
                        &scope,
                        &name,
                        &entry,
                        &tmp,
                        &settings,
                        &AtomicU64::new(0),
                    )
                    .await?;
                    if let Some(mode) = entry.file_metadata.mode() {
                        use std::os::unix::fs::PermissionsExt as _;
                        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
                            .map_err(Error::io_with(format!("chmod {}", tmp.display())))?;
                    }
                    Ok(())
                })
            },
        )
    }

    /// Reads a range of a remote file's blob (a blob file's footer, for RocksDB's purge of
    /// an obsolete blob file the lazy restore has not fetched), checking the blob's size.
    pub(super) fn tail_reader(&self, scope: &BlobScopes) -> crate::local::lazy::TailFn {
        let (store, scope) = (Arc::clone(&self.blob_store), scope.clone());
        Arc::new(
            move |entry: FileIndex,
                  range: std::ops::Range<u64>|
                  -> futures::future::BoxFuture<'static, Result<bytes::Bytes>> {
                let (store, scope) = (Arc::clone(&store), scope.clone());
                Box::pin(async move {
                    let blob = entry.first_blob_id(&entry.file_name)?;
                    let key = scope.key(blob)?;
                    let (size, bytes) =
                        crate::blobstore::get_range_bytes(store.as_ref(), &key, range).await?;
                    if size != entry.file_metadata.size {
                        return Err(Error::corrupt(format!(
                            "lazy restore: file {} (blob {key}) is {size} bytes in the store, the index says {}",
                            entry.file_name, entry.file_metadata.size
                        )));
                    }
                    Ok(bytes)
                })
            },
        )
    }
}

/// A file a lazy restore leaves remote: an SST or blob file held by a blob (not inline).
pub(super) fn is_lazy_candidate(f: &PlannedFile) -> bool {
    !f.path.contains('/')
        && is_immutable(&f.path)
        && f.entry.inline_data.is_none()
        && f.entry.sha256.is_some()
}

/// Download the blob of `entry` (the file `path` of a store in `scope`) into `tmp`, verified
/// (size and SHA-256) and fsynced, retrying a corrupt or transient download up to
/// `settings.max_attempts` times; `tmp` is removed on a final failure. `landed` counts the
/// bytes written as they land (a failed attempt takes its share back out).
pub(super) async fn fetch_verified(
    blob_store: &dyn BlobStore,
    scope: &BlobScopes,
    path: &str,
    entry: &FileIndex,
    tmp: &Path,
    settings: &RestoreSettings,
    landed: &AtomicU64,
) -> Result<()> {
    let blob = entry.first_blob_id(path)?;
    let key = scope.key(blob)?;
    let opts = DownloadOptions {
        expected_size: entry.file_metadata.size,
        expected_sha256: entry.sha256,
        part_size: settings.part_size,
        concurrency: settings.part_concurrency,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        if settings.cancel.is_cancelled() {
            return Err(Error::new(ErrorKind::Cancelled, "restore cancelled"));
        }
        match download_to_file_counted(blob_store, &key, tmp, opts, landed).await {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Corrupt && attempt < settings.max_attempts => {
                tracing::warn!(file = %path, %key, attempt, error = %e, "downloaded blob failed verification; fetching it again");
            }
            Err(e) if matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::NotFound) => {
                let _ = std::fs::remove_file(tmp);
                // The error names the blob's key ("blob K has SHA-256 …", "no object K"):
                // named once (issue 51, item 11).
                return Err(e.context(format!("file {path}, after {attempt} attempts")));
            }
            Err(e) if e.is_transient() && attempt < settings.max_attempts => {
                tracing::warn!(file = %path, %key, attempt, error = %e, "download failed; retrying");
            }
            Err(e) => {
                let _ = std::fs::remove_file(tmp);
                return Err(e.context(format!("file {path} (blob {key})")));
            }
        }
    }
}
