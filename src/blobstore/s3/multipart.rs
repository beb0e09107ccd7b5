//! Multipart uploads: parts streamed from disk, each with its checksum, the whole file's
//! SHA-256 or CRC-32 computed on the way.

use super::*;

/// Aborts a multipart upload whose future was dropped before it completed or failed (its
/// error path aborts inline), until the server says it is gone ([`abort_until_gone`]). Armed
/// before CreateMultipartUpload is sent: a put dropped while that request is out (the server
/// may have made the upload, the client never learns its id) aborts every upload of its key
/// the server lists ([`abort_uploads_of`]; blob keys are content-addressed and name their
/// checkpoint, so no other writer uploads the same key). The abort is spawned on the runtime
/// the drop happens in; with none (a runtime shutting down), the sweep's abort of stale
/// uploads and the bucket's abort-incomplete-multipart rule are the backstop.
struct AbortOnDrop {
    client: Client,
    bucket: String,
    key: String,
    /// `None` until CreateMultipartUpload answered.
    upload_id: Option<String>,
    /// Whether the server lists multipart uploads (`S3Config::multipart_listing`).
    listing: bool,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %self.key, upload_id = ?self.upload_id, "a dropped multipart upload could not be aborted (no runtime); the sweep will");
            return;
        };
        let (client, bucket, key) = (self.client.clone(), self.bucket.clone(), self.key.clone());
        let Some(upload_id) = self.upload_id.clone() else {
            if !self.listing {
                tracing::warn!(key = %self.key, "a put dropped while its multipart upload was being created: the server cannot list uploads, so the sweep will abort it if it was made");
                return;
            }
            rt.spawn(async move {
                let aborted = abort_uploads_of(&client, &bucket, &key).await;
                tracing::debug!(
                    key,
                    aborted,
                    "aborted the uploads of a put dropped while its upload was being created"
                );
            });
            return;
        };
        let req = client
            .abort_multipart_upload()
            .bucket(&bucket)
            .key(&key)
            .upload_id(&upload_id);
        rt.spawn(async move {
            if abort_until_gone(req).await {
                tracing::debug!(
                    key,
                    upload_id,
                    "aborted the multipart upload of a dropped put"
                );
            } else {
                tracing::warn!(
                    key,
                    upload_id,
                    "could not abort the multipart upload of a dropped put; the sweep will"
                );
            }
        });
    }
}

/// Abort every multipart upload of exactly `key` the server lists, in 3 rounds a second apart
/// (a CreateMultipartUpload still on its way when the first listing ran shows in a later one).
/// Returns how many uploads were aborted.
async fn abort_uploads_of(client: &Client, bucket: &str, key: &str) -> usize {
    let mut aborted = 0;
    for round in 0..3 {
        if round > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let listed = match client
            .list_multipart_uploads()
            .bucket(bucket)
            .prefix(key)
            .send()
            .await
        {
            Ok(out) => out.uploads.unwrap_or_default(),
            Err(e) => {
                tracing::debug!(key, error = %e, "listing the uploads of a dropped put failed");
                continue;
            }
        };
        for up in listed.iter().filter(|u| u.key() == Some(key)) {
            let Some(id) = up.upload_id() else { continue };
            let req = client
                .abort_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(id);
            if abort_until_gone(req).await {
                aborted += 1;
            }
        }
    }
    aborted
}

/// Abort a multipart upload until the server says it is gone (`NoSuchUpload`), at most 5
/// times, a second apart: a part whose upload was in flight when the abort landed can still
/// land after it, and a loaded server may fail an abort (S3's documentation: "it might be
/// necessary to abort a given multipart upload multiple times"). `true` once an abort
/// succeeded and a later one found nothing left (or the last one succeeded).
async fn abort_until_gone(
    req: aws_sdk_s3::operation::abort_multipart_upload::builders::AbortMultipartUploadFluentBuilder,
) -> bool {
    let mut aborted = false;
    for attempt in 0..5 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        match req.clone().send().await {
            Ok(_) => aborted = true,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_upload()) => {
                return true;
            }
            Err(e) => {
                tracing::debug!(attempt, error = %e, "abort of a multipart upload failed; retrying");
            }
        }
    }
    aborted
}

impl S3Store {
    pub(super) async fn put_multipart(
        &self,
        key: &str,
        path: PathBuf,
        len: u64,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let mut create = self
            .client
            .create_multipart_upload()
            .bucket(&self.config.bucket)
            .key(key)
            .checksum_algorithm(match self.config.part_checksum {
                PartChecksum::Crc32c => ChecksumAlgorithm::Crc32C,
                PartChecksum::Sha256 => ChecksumAlgorithm::Sha256,
            });
        create = match &self.config.sse {
            Sse::None => create,
            Sse::S3 => create.server_side_encryption(ServerSideEncryption::Aes256),
            Sse::Kms { key_id } => create
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .set_ssekms_key_id(key_id.clone()),
        };
        // A future dropped mid-upload (a sibling's error in a `try_join_all`, a cancelled
        // commit) aborts its upload too: the guard spawns the abort on this runtime. It is
        // armed before the create is sent (a drop while it is out aborts by listing).
        let mut guard = AbortOnDrop {
            client: self.client.clone(),
            bucket: self.config.bucket.clone(),
            key: key.to_string(),
            upload_id: None,
            listing: self.config.multipart_listing,
            armed: true,
        };
        let created = create.send().await.map_err(|e| {
            // The create failed: no upload to abort, or one the sweep takes.
            classify(self.what("create multipart upload", key), e)
        });
        let created = match created {
            Ok(c) => c,
            Err(e) => {
                guard.armed = false;
                return Err(e);
            }
        };
        let Some(upload_id) = created.upload_id else {
            guard.armed = false;
            return Err(Error::transient(format!(
                "{}: the server returned no upload id",
                self.what("create multipart upload", key)
            )));
        };
        guard.upload_id = Some(upload_id.clone());
        let result = self
            .upload_parts_and_complete(key, &upload_id, path, len, opts)
            .await;
        guard.armed = false;
        if result.is_err() {
            let abort = self
                .client
                .abort_multipart_upload()
                .bucket(&self.config.bucket)
                .key(key)
                .upload_id(&upload_id)
                .send()
                .await;
            if let Err(e) = abort {
                tracing::warn!(key, upload_id, error = %classify(self.what("abort multipart upload", key), e),
                    "could not abort a failed multipart upload; the sweep will");
            }
        }
        result
    }

    pub(super) async fn upload_parts_and_complete(
        &self,
        key: &str,
        upload_id: &str,
        path: PathBuf,
        len: u64,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let part_size = part_size_for(self.config.part_size, len);
        let n_parts = len.div_ceil(part_size).max(1);
        // The guard that the file did not change since the scan: its CRC-32 when the scan's
        // is known (cheap; the server checks every part), else its SHA-256 again.
        let whole = match (opts.sha256, opts.crc32) {
            (Some(_), Some(_)) => Whole::Crc32(crc32fast::Hasher::new()),
            _ => Whole::Sha256(Hasher::new()),
        };
        let reader = Arc::new(std::sync::Mutex::new(PartReader::open(
            path.clone(),
            len,
            self.config.part_checksum,
            whole,
        )?));
        // Parts are read (and the whole file hashed) in order, one at a time, in a blocking
        // task; up to `part_concurrency` of them are on the wire at once.
        let parts = futures::stream::iter(1..=n_parts)
            .then(|n| {
                let reader = Arc::clone(&reader);
                let budget = Arc::clone(&self.part_budget);
                async move {
                    // A part is hashed and sent only while it holds a permit of the budget.
                    let permit = budget
                        .acquire_owned()
                        .await
                        .map_err(|_| Error::new(ErrorKind::Cancelled, "part budget closed"))?;
                    let want = part_size.min(len - (n - 1) * part_size);
                    tokio::task::spawn_blocking(move || {
                        let mut r = reader
                            .lock()
                            .map_err(|_| Error::new(ErrorKind::Io, "part reader poisoned"))?;
                        r.next_part(want)
                    })
                    .await
                    .map_err(|e| Error::task("read", e))?
                    .map(|(offset, sum)| (n, offset, want, sum, permit))
                }
            })
            .map_ok(|(n, offset, want, sum, _permit)| {
                let path = path.clone();
                async move {
                    let body = super::body::file_body(&path, offset, want).await?;
                    let req = self
                        .client
                        .upload_part()
                        .bucket(&self.config.bucket)
                        .key(key)
                        .upload_id(upload_id)
                        .part_number(n as i32)
                        .content_length(want as i64)
                        .body(body);
                    let req = match &sum {
                        PartSum::Crc32c(c) => req.checksum_crc32_c(c),
                        PartSum::Sha256(c) => req.checksum_sha256(c),
                    };
                    // The server checks the part's checksum itself: signing the payload would
                    // hash every byte once more for nothing (kept where the server does not
                    // check).
                    let out = if self.config.verifies_sha256 {
                        req.customize().disable_payload_signing().send().await
                    } else {
                        req.send().await
                    }
                    .map_err(|e| classify(self.what(&format!("upload part {n} of"), key), e))?;
                    crate::blobstore::put_progress(want);
                    let part = CompletedPart::builder()
                        .part_number(n as i32)
                        .set_e_tag(out.e_tag);
                    Ok::<_, Error>(
                        match sum {
                            PartSum::Crc32c(c) => part.checksum_crc32_c(c),
                            PartSum::Sha256(c) => part.checksum_sha256(c),
                        }
                        .build(),
                    )
                }
            })
            .try_buffer_unordered(self.config.part_concurrency)
            .try_collect::<Vec<_>>()
            .await?;
        let mut parts = parts;
        parts.sort_by_key(|p| p.part_number);

        let whole = {
            let mut r = reader
                .lock()
                .map_err(|_| Error::new(ErrorKind::Io, "part reader poisoned"))?;
            r.finish()?
        };
        match (whole, opts.sha256, opts.crc32) {
            (WholeSum::Crc32(got), _, Some(expected)) if got != expected => {
                return Err(Error::corrupt(format!(
                    "{}: the file's CRC-32 was {got:08x} while being sent, {expected:08x} at the scan (it changed); upload aborted",
                    self.what("put", key)
                )));
            }
            (WholeSum::Sha256(got), Some(expected), _) if got != expected => {
                return Err(Error::corrupt(format!(
                    "{}: the file hashed to {got} while being sent, expected {expected} (it changed); upload aborted",
                    self.what("put", key)
                )));
            }
            _ => {}
        }
        let mut complete = self
            .client
            .complete_multipart_upload()
            .bucket(&self.config.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            );
        if opts.mode == PutMode::CreateOnly {
            complete = complete.if_none_match("*");
        }
        let out = complete
            .send()
            .await
            .map_err(|e| classify(self.what("complete multipart upload", key), e))?;
        Ok(PutResult {
            size: len,
            e_tag: out.e_tag,
            requests: n_parts as u32 + 2,
        })
    }
}

/// The part size for a file of `len` bytes: the configured one, or, for a file too large for
/// [`MAX_PARTS`] parts of it, the smallest whole number of MiB that fits.
pub(super) fn part_size_for(configured: u64, len: u64) -> u64 {
    configured.max(len.div_ceil(MAX_PARTS).next_multiple_of(1 << 20))
}

/// A part's checksum, base64 as S3 wants it.
pub(super) enum PartSum {
    Crc32c(String),
    Sha256(String),
}

/// What a [`PartReader`] computes over the whole file.
pub(super) enum Whole {
    Sha256(Hasher),
    Crc32(crc32fast::Hasher),
}

/// Its result.
pub(super) enum WholeSum {
    Sha256(Sha256),
    Crc32(u32),
}

/// Reads a file part by part: each part's checksum, and the whole file's SHA-256 or CRC-32.
pub(super) struct PartReader {
    path: PathBuf,
    file: std::fs::File,
    len: u64,
    algorithm: PartChecksum,
    whole: Whole,
    hashed: u64,
    buf: Vec<u8>,
}

impl PartReader {
    fn open(path: PathBuf, len: u64, algorithm: PartChecksum, whole: Whole) -> Result<Self> {
        let file = std::fs::File::open(&path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        Ok(PartReader {
            path,
            file,
            len,
            algorithm,
            whole,
            hashed: 0,
            buf: vec![0u8; 1 << 20],
        })
    }

    /// Read the next `want` bytes through one reused 1 MiB buffer, into the part's checksum
    /// and the whole file's SHA-256; returns the part's offset and checksum. The part itself
    /// is then streamed from the file by the SDK, so no part is ever held in memory.
    fn next_part(&mut self, want: u64) -> Result<(u64, PartSum)> {
        use base64::Engine as _;
        let offset = self.hashed;
        let mut sha = (self.algorithm == PartChecksum::Sha256).then(Hasher::new);
        let mut crc = 0u32;
        let mut left = want;
        while left > 0 {
            let n = (left as usize).min(self.buf.len());
            let got = self
                .file
                .read(&mut self.buf[..n])
                .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
            if got == 0 {
                return Err(Error::corrupt(format!(
                    "{} shrank while being uploaded (expected {} bytes)",
                    self.path.display(),
                    self.len
                )));
            }
            match &mut self.whole {
                Whole::Sha256(h) => h.update(&self.buf[..got]),
                Whole::Crc32(h) => h.update(&self.buf[..got]),
            }
            match &mut sha {
                Some(h) => h.update(&self.buf[..got]),
                None => crc = crc32c::crc32c_append(crc, &self.buf[..got]),
            }
            left -= got as u64;
        }
        self.hashed += want;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        Ok((
            offset,
            match sha {
                Some(h) => PartSum::Sha256(h.finish().sha256.to_base64()),
                None => PartSum::Crc32c(b64(&crc.to_be_bytes())),
            },
        ))
    }

    fn finish(&mut self) -> Result<WholeSum> {
        let mut probe = [0u8; 1];
        let extra = self
            .file
            .read(&mut probe)
            .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
        if extra != 0 {
            return Err(Error::corrupt(format!(
                "{} grew while being uploaded (expected {} bytes)",
                self.path.display(),
                self.len
            )));
        }
        Ok(
            match std::mem::replace(&mut self.whole, Whole::Crc32(crc32fast::Hasher::new())) {
                Whole::Sha256(h) => WholeSum::Sha256(h.finish().sha256),
                Whole::Crc32(h) => WholeSum::Crc32(h.finalize()),
            },
        )
    }
}
