//! Whole-object reads over any [`BlobStore`]: into memory with a size cap, or into a file,
//! verified, with ranged parallel GETs for large objects.
//!
//! Large downloads use parallel ranged GETs: each range streams into the file at its offset
//! as its chunks arrive (memory: a few chunks per range in flight, not the range). Ranges
//! land out of order; a follower thread hashes the landed prefix in order as it grows
//! (reading it back from the page cache) and starts its writeback every [`FLUSH_EVERY`]
//! bytes, so that hashing and the disk's flush run while later ranges are still on the wire
//! and the final fsync has little left to write. Small downloads stream into the file and are
//! hashed on the way.

use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{StreamExt as _, TryStreamExt as _};
use tokio::io::AsyncWriteExt as _;

use super::{BlobKey, BlobStore};
use crate::digest::{Hasher, Sha256};
use crate::error::{Error, ErrorKind, Result};

/// Stream an object and return its SHA-256 and size, in memory of one chunk at a time (to
/// check an object that already exists, however large).
pub async fn hash_object(store: &dyn BlobStore, key: &BlobKey) -> Result<(Sha256, u64)> {
    let got = store.get(key, None).await?;
    let expected = got.range.end - got.range.start;
    let mut hasher = Hasher::new();
    let mut body = got.body;
    while let Some(chunk) = body.try_next().await? {
        hasher.update(&chunk);
    }
    if hasher.len() != expected {
        return Err(Error::transient(format!(
            "object {key}: body of {} bytes, announced {expected}",
            hasher.len()
        )));
    }
    let d = hasher.finish();
    Ok((d.sha256, d.size))
}

/// Read a whole object into memory, refusing objects larger than `max_len` before reading
/// their body. A body that ends early is `Transient` (retry), one longer than announced is
/// `Corrupt`.
pub async fn get_bytes(store: &dyn BlobStore, key: &BlobKey, max_len: u64) -> Result<Bytes> {
    // The store's retry layer retries the request; a body cut after the headers shows up only
    // while it is read, so that is re-fetched here (a few times, briefly spaced). An error of
    // the request itself has already had its retries.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let got = store.get(key, None).await?;
        if got.meta.size > max_len {
            return Err(Error::invalid(format!(
                "object {key} is {} bytes, over the cap of {max_len}",
                got.meta.size
            )));
        }
        let range = got.range.clone();
        match collect_body(key, got, &range).await {
            Err(e) if e.kind() == ErrorKind::Transient && attempt < BODY_ATTEMPTS => {
                tracing::debug!(%key, attempt, error = %e, "body cut; fetching again");
                tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
            }
            r => return r,
        }
    }
}

/// Read `range` of an object into memory: the object's whole size and the range's bytes. A
/// served range other than the one asked for, or a longer body, is `Corrupt`; a shorter body
/// is `Transient`.
pub async fn get_range_bytes(
    store: &dyn BlobStore,
    key: &BlobKey,
    range: std::ops::Range<u64>,
) -> Result<(u64, Bytes)> {
    let got = store.get(key, Some(range.clone())).await?;
    if got.range != range {
        return Err(Error::corrupt(format!(
            "object {key}: asked for bytes {range:?}, served {:?}",
            got.range
        )));
    }
    let size = got.meta.size;
    let bytes = collect_body(key, got, &range).await?;
    Ok((size, bytes))
}

/// Attempts of [`get_bytes`] at a body that ends early.
const BODY_ATTEMPTS: u32 = 5;

/// Read a body that must carry exactly `range`: longer is `Corrupt`, shorter (a dropped
/// connection) is `Transient`.
async fn collect_body(
    key: &BlobKey,
    got: super::GetResult,
    range: &std::ops::Range<u64>,
) -> Result<Bytes> {
    let want = range.end - range.start;
    let mut buf = BytesMut::with_capacity(want as usize);
    let mut body = got.body;
    while let Some(chunk) = body.try_next().await? {
        if buf.len() as u64 + chunk.len() as u64 > want {
            return Err(Error::corrupt(format!(
                "object {key}: body of range {range:?} longer than its {want} bytes"
            )));
        }
        buf.extend_from_slice(&chunk);
    }
    if (buf.len() as u64) < want {
        return Err(Error::transient(format!(
            "object {key}: body of range {range:?} truncated at {} of {want} bytes",
            buf.len()
        )));
    }
    Ok(buf.freeze())
}

/// Stream the body of `range` into `file` at its offset, chunk by chunk (positioned writes on
/// the blocking pool, in chunks of up to 1 MiB). A body longer than the range is `Corrupt`, a
/// shorter one `Transient`.
async fn write_range(
    key: &BlobKey,
    got: super::GetResult,
    range: &std::ops::Range<u64>,
    file: &Arc<std::fs::File>,
    dest: &Path,
    landed: &Landed<'_>,
) -> Result<()> {
    let want = range.end - range.start;
    let mut at = range.start;
    let mut pending = BytesMut::new();
    let mut body = got.body;
    let flush = |buf: Bytes, at: u64| {
        let file = Arc::clone(file);
        let dest = dest.to_path_buf();
        async move {
            tokio::task::spawn_blocking(move || {
                file.write_all_at(&buf, at)
                    .map_err(|e| Error::io(format!("write {}", dest.display()), e))
            })
            .await
            .map_err(|e| Error::task("write", e))?
        }
    };
    loop {
        let chunk = body.try_next().await?;
        let done = chunk.is_none();
        if let Some(c) = chunk {
            if at + pending.len() as u64 + c.len() as u64 > range.end {
                return Err(Error::corrupt(format!(
                    "object {key}: body of range {range:?} longer than its {want} bytes"
                )));
            }
            pending.extend_from_slice(&c);
            super::limit::pace(c.len() as u64).await;
        }
        if pending.len() >= 1 << 20 || (done && !pending.is_empty()) {
            let buf = pending.split().freeze();
            let len = buf.len() as u64;
            flush(buf, at).await?;
            landed.add(len);
            at += len;
        }
        if done {
            break;
        }
    }
    if at < range.end {
        return Err(Error::transient(format!(
            "object {key}: body of range {range:?} truncated at {} of {want} bytes",
            at - range.start
        )));
    }
    Ok(())
}

/// How [`download_to_file`] fetches and what it checks.
#[derive(Clone, Copy, Debug)]
pub struct DownloadOptions {
    /// The size the object must have.
    pub expected_size: u64,
    /// The SHA-256 the bytes must have (`Corrupt` otherwise).
    pub expected_sha256: Option<Sha256>,
    /// Objects larger than this are fetched as parallel ranges of this size (0: never).
    pub part_size: u64,
    /// Ranges in flight at once for one object.
    pub concurrency: usize,
}

/// What a download did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DownloadStats {
    /// Bytes received.
    pub bytes: u64,
    /// GET requests made.
    pub requests: u64,
}

/// Download `key` into `dest` (created or truncated), verify its size and SHA-256, and fsync
/// it. On any error `dest` may hold partial data: download into a temp path and rename it
/// only on success.
pub async fn download_to_file(
    store: &dyn BlobStore,
    key: &BlobKey,
    dest: &Path,
    opts: DownloadOptions,
) -> Result<DownloadStats> {
    download_to_file_counted(store, key, dest, opts, &AtomicU64::new(0)).await
}

/// [`download_to_file`], adding to `landed` the bytes written to `dest` as they land (a
/// progress bar's count, within the file); a download that fails takes what it added back
/// out, so a retried file is never counted twice.
pub async fn download_to_file_counted(
    store: &dyn BlobStore,
    key: &BlobKey,
    dest: &Path,
    opts: DownloadOptions,
    landed: &AtomicU64,
) -> Result<DownloadStats> {
    let size = opts.expected_size;
    let mut counter = Landed {
        total: landed,
        mine: AtomicU64::new(0),
        kept: false,
    };
    let stats = if opts.part_size > 0 && size > opts.part_size {
        download_ranges(store, key, dest, opts, &counter).await
    } else {
        download_stream(store, key, dest, opts, &counter).await
    };
    counter.kept = stats.is_ok();
    stats
}

/// The bytes one download has written: added to a shared count as they land, and kept, so
/// that a download that fails — or is dropped midway — takes its share back out.
struct Landed<'a> {
    total: &'a AtomicU64,
    mine: AtomicU64,
    /// The download succeeded: its bytes stay counted.
    kept: bool,
}

impl Landed<'_> {
    fn add(&self, n: u64) {
        self.mine.fetch_add(n, Ordering::Relaxed);
        self.total.fetch_add(n, Ordering::Relaxed);
    }
}

impl Drop for Landed<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.total
                .fetch_sub(self.mine.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

async fn download_stream(
    store: &dyn BlobStore,
    key: &BlobKey,
    dest: &Path,
    opts: DownloadOptions,
    landed: &Landed<'_>,
) -> Result<DownloadStats> {
    let got = store.get(key, None).await?;
    check_size(key, got.meta.size, opts.expected_size)?;
    let mut file = tokio::fs::File::create(dest)
        .await
        .map_err(|e| Error::io(format!("create {}", dest.display()), e))?;
    let mut hasher = Hasher::new();
    let mut body = got.body;
    while let Some(chunk) = body.try_next().await? {
        if hasher.len() + chunk.len() as u64 > opts.expected_size {
            return Err(Error::corrupt(format!(
                "blob {key}: body longer than its {} bytes",
                opts.expected_size
            )));
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| Error::io(format!("write {}", dest.display()), e))?;
        landed.add(chunk.len() as u64);
        super::limit::pace(chunk.len() as u64).await;
    }
    if hasher.len() < opts.expected_size {
        return Err(Error::transient(format!(
            "blob {key}: body truncated at {} of {} bytes",
            hasher.len(),
            opts.expected_size
        )));
    }
    file.sync_all()
        .await
        .map_err(|e| Error::io(format!("fsync {}", dest.display()), e))?;
    let digest = hasher.finish();
    check_sha(key, digest.sha256, opts.expected_sha256)?;
    Ok(DownloadStats {
        bytes: digest.size,
        requests: 1,
    })
}

async fn download_ranges(
    store: &dyn BlobStore,
    key: &BlobKey,
    dest: &Path,
    opts: DownloadOptions,
    count: &Landed<'_>,
) -> Result<DownloadStats> {
    let size = opts.expected_size;
    // Read as well as written: the follower hashes the landed prefix back from it.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dest)
        .and_then(|f| f.set_len(size).map(|()| f))
        .map_err(|e| Error::io(format!("create {}", dest.display()), e))?;
    let file = Arc::new(file);
    let ranges: Vec<_> = (0..size)
        .step_by(opts.part_size as usize)
        .map(|start| start..(start + opts.part_size).min(size))
        .collect();
    let requests = ranges.len() as u64;
    let (landed_tx, landed_rx) = std::sync::mpsc::channel();
    let follower = {
        let (file, dest) = (Arc::clone(&file), dest.to_path_buf());
        tokio::task::spawn_blocking(move || follow_prefix(&file, &dest, size, &landed_rx))
    };
    let mut landed = vec![false; ranges.len()];
    let mut prefix = 0;
    let downloaded = futures::stream::iter(ranges.iter().cloned().enumerate())
        .map(|(i, range)| {
            let file = Arc::clone(&file);
            async move {
                let got = store.get(key, Some(range.clone())).await?;
                check_size(key, got.meta.size, size)?;
                write_range(key, got, &range, &file, dest, count).await?;
                Ok::<_, Error>(i)
            }
        })
        .buffer_unordered(opts.concurrency.max(1))
        .try_for_each(|i| {
            landed[i] = true;
            while landed.get(prefix).copied().unwrap_or(false) {
                prefix += 1;
            }
            let upto = ranges.get(prefix).map_or(size, |r| r.start);
            // The follower only stops early when this download has already failed.
            let _ = landed_tx.send(upto);
            futures::future::ready(Ok(()))
        })
        .await;
    drop(landed_tx);
    let followed = follower.await.map_err(|e| Error::task("hash", e))?;
    downloaded?;
    let digest = followed?;
    check_size(key, digest.size, size)?;
    check_sha(key, digest.sha256, opts.expected_sha256)?;
    Ok(DownloadStats {
        bytes: size,
        requests,
    })
}

/// Bytes of a ranged download written between two flushes of its follower.
pub const FLUSH_EVERY: u64 = 32 << 20;

/// The follower of a ranged download (blocking: on its own thread): receives how far the
/// file has landed without a gap, hashes up to there, starts the writeback of what it hashed
/// every [`FLUSH_EVERY`] bytes, and when the download ends (the sender is dropped) fsyncs the
/// file and returns its digest. A download that stopped short is `Transient`.
fn follow_prefix(
    file: &std::fs::File,
    dest: &Path,
    size: u64,
    landed: &std::sync::mpsc::Receiver<u64>,
) -> Result<crate::digest::FileDigest> {
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let (mut hashed, mut flushed) = (0u64, 0u64);
    while let Ok(mut upto) = landed.recv() {
        while let Ok(later) = landed.try_recv() {
            upto = later;
        }
        while hashed < upto {
            let n = (upto - hashed).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], hashed)
                .map_err(|e| Error::io(format!("read back {}", dest.display()), e))?;
            hasher.update(&buf[..n]);
            hashed += n as u64;
        }
        if hashed - flushed >= FLUSH_EVERY && hashed < size {
            file.sync_data()
                .map_err(|e| Error::io(format!("fdatasync {}", dest.display()), e))?;
            flushed = hashed;
        }
    }
    crate::digest::count_hashed(hashed);
    if hashed < size {
        return Err(Error::transient(format!(
            "download of {} stopped at {hashed} of {size} bytes",
            dest.display()
        )));
    }
    file.sync_all()
        .map_err(|e| Error::io(format!("fsync {}", dest.display()), e))?;
    Ok(hasher.finish())
}

fn check_size(key: &BlobKey, actual: u64, expected: u64) -> Result<()> {
    if actual != expected {
        return Err(Error::corrupt(format!(
            "blob {key} is {actual} bytes, expected {expected}"
        )));
    }
    Ok(())
}

fn check_sha(key: &BlobKey, actual: Sha256, expected: Option<Sha256>) -> Result<()> {
    match expected {
        Some(exp) if exp != actual => Err(Error::corrupt(format!(
            "blob {key} has SHA-256 {actual}, expected {exp}"
        ))),
        _ => Ok(()),
    }
}
