//! The blob store: a small, domain-shaped trait and its implementations.
//!
//! [`BlobStore`] is what every layer above needs from an object store, and nothing more:
//!
//! | operation | semantics |
//! |---|---|
//! | [`put`](BlobStore::put) | streams a file (never loaded whole into memory) or bytes; [`PutMode::CreateOnly`] fails with [`ErrorKind::Conflict`](crate::ErrorKind::Conflict) if the key exists; a SHA-256 sent along makes the store reject a body that does not match ([`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt)) |
//! | [`get`](BlobStore::get) | streams the object or a byte range of it |
//! | [`head`](BlobStore::head) | size, last-modified, ETag |
//! | [`delete_many`](BlobStore::delete_many) | idempotent (a missing key is not an error); failures are reported per key |
//! | [`list`](BlobStore::list) | every object under a [`Scope`], in key order, paginated by the store |
//! | [`incomplete_uploads`](BlobStore::incomplete_uploads) | incomplete multipart uploads under a scope, and the abort of those begun before a cutoff, for the sweep |
//! | [`capabilities`](BlobStore::capabilities) | what the store enforces and supports; with [`Probe::IfUnknown`], found out from the server where the settings say to probe |
//!
//! Implementations: [`local::LocalStore`] (a directory, the embedded default) and
//! [`s3::S3Store`] (aws-sdk-s3, any S3-compatible server). Layers that wrap any store and
//! implement the same trait: [`retry::RetryStore`] (the one retry loop of the process),
//! [`counting::CountingStore`] (requests and bytes per operation) and [`fault::FaultStore`]
//! (injected errors, latency and truncated bodies, for tests).

pub mod counting;
pub mod fault;
mod key;
pub mod limit;
pub mod local;
pub mod retry;
pub mod s3;
mod transfer;

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

pub use key::{escape_segment, unescape_segment, BlobKey, Scope, MAX_KEY_LEN};
pub use transfer::{
    download_to_file, download_to_file_counted, get_bytes, get_range_bytes, hash_object,
    DownloadOptions, DownloadStats,
};

use crate::digest::Sha256;
use crate::error::Result;

/// What a `put` uploads.
#[derive(Clone)]
pub enum PutBody {
    /// Bytes in memory (indexes, checkpoints, small objects).
    Bytes(Bytes),
    /// A local file of a known length, streamed from disk. The store fails the put if the file
    /// does not have exactly `len` bytes when read.
    File {
        /// The file to upload.
        path: PathBuf,
        /// Its expected length.
        len: u64,
    },
}

impl PutBody {
    /// The body's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            PutBody::Bytes(b) => b.len() as u64,
            PutBody::File { len, .. } => *len,
        }
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for PutBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PutBody::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            PutBody::File { path, len } => write!(f, "File({}, {len} bytes)", path.display()),
        }
    }
}

/// Whether a put may replace an existing object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PutMode {
    /// Replace whatever is there.
    #[default]
    Overwrite,
    /// Fail with `Conflict` if the key exists (S3 `If-None-Match: *`). Whether concurrent
    /// create-only puts are really exclusive depends on the store: see
    /// [`Capabilities::create_only`].
    CreateOnly,
}

/// Options of a put.
#[derive(Clone, Copy, Debug, Default)]
pub struct PutOptions {
    /// Overwrite or create-only.
    pub mode: PutMode,
    /// The SHA-256 the body must have. The store rejects a body that does not match with
    /// `Corrupt` and stores nothing (S3: `x-amz-checksum-sha256`; multipart: every part's
    /// checksum is sent and the whole is compared before completing). When `None`, the store
    /// computes it before sending.
    pub sha256: Option<Sha256>,
    /// The CRC-32 (IEEE) of the whole body, known with `sha256` from the scan. A store that
    /// re-reads a file part by part (S3 multipart) then checks the file did not change since
    /// the scan with this cheap CRC instead of a second SHA-256 pass; the parts themselves
    /// are checked by the server. `None`: the SHA-256 is recomputed.
    pub crc32: Option<u32>,
}

impl PutOptions {
    /// Create-only with a known digest: how blobs and checkpoints are written.
    pub fn create_only(sha256: Sha256) -> Self {
        PutOptions {
            mode: PutMode::CreateOnly,
            sha256: Some(sha256),
            crc32: None,
        }
    }

    /// The same, with the whole body's CRC-32 (IEEE) known too.
    pub fn with_crc32(self, crc32: u32) -> Self {
        PutOptions {
            crc32: Some(crc32),
            ..self
        }
    }
}

/// What a successful put reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutResult {
    /// Bytes stored.
    pub size: u64,
    /// The store's entity tag, if any.
    pub e_tag: Option<String>,
    /// Requests the put took (1 for a single PUT; parts + 2 for a multipart upload).
    pub requests: u32,
}

/// One object in a listing or a head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Its key.
    pub key: BlobKey,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, by the store's clock.
    pub last_modified: Option<SystemTime>,
    /// The store's entity tag, if any.
    pub e_tag: Option<String>,
}

tokio::task_local! {
    static PUT_PROGRESS: Arc<dyn Fn(u64) + Send + Sync>;
}

/// Run `f` with `report` told of the bytes of its puts as they land in parts (each part of a
/// multipart upload, once the store acknowledged it): a progress bar that moves within a
/// large file. A single-request put reports nothing here (its caller counts it whole).
pub async fn with_put_progress<F: std::future::Future>(
    report: Arc<dyn Fn(u64) + Send + Sync>,
    f: F,
) -> F::Output {
    PUT_PROGRESS.scope(report, f).await
}

/// Tell the current [`with_put_progress`] scope, if any, that `n` bytes of a put landed.
pub(crate) fn put_progress(n: u64) {
    let _ = PUT_PROGRESS.try_with(|report| report(n));
}

/// A streamed get.
pub struct GetResult {
    /// The whole object's metadata (its full size, not the range's).
    pub meta: ObjectMeta,
    /// The byte range this body carries.
    pub range: Range<u64>,
    /// The body. It may end early or fail midway (a dropped connection): consumers count the
    /// bytes against `range` ([`get_bytes`] and [`download_to_file`] do).
    pub body: BoxStream<'static, Result<Bytes>>,
}

impl fmt::Debug for GetResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetResult")
            .field("meta", &self.meta)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

/// An incomplete multipart upload (or, for the local store, an abandoned temp file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultipartUpload {
    /// The key it would have created.
    pub key: BlobKey,
    /// The store's id of the upload.
    pub upload_id: String,
    /// When it was started, by the store's clock.
    pub initiated: Option<SystemTime>,
}

impl MultipartUpload {
    /// Whether an abort of the uploads begun before `cutoff` takes this one. An upload of
    /// unknown age never is (it may be in progress).
    pub fn begun_before(&self, cutoff: SystemTime) -> bool {
        self.initiated.is_some_and(|t| t < cutoff)
    }
}

/// How much [`BlobStore::capabilities`] may do to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Answer from what is known; never a request (what `gc --dry-run` and tests use).
    Never,
    /// Ask the server what the settings leave unknown (writes and deletes scratch objects
    /// the first time on a store configured to probe).
    IfUnknown,
}

/// How far a store enforces create-only puts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOnly {
    /// Exclusive even under concurrency: of N concurrent create-only puts of one key, exactly
    /// one succeeds (AWS S3, LocalStack, the local store via `link(2)`).
    Atomic,
    /// Checked, but not atomically: a sequential second put fails, concurrent ones may both
    /// succeed (s3s-fs). Not a fence.
    Racy,
    /// Accepted and ignored: a second put silently overwrites (Garage 2.x). Not a fence.
    Ignored,
    /// Not known yet: the store is configured to probe (`create-only = "auto"`) and
    /// [`BlobStore::capabilities`] has not been asked with [`Probe::IfUnknown`]. Not a fence.
    Unknown,
}

/// What a store enforces and supports. Tests declare the capabilities they need, and code
/// that depends on one checks it rather than assuming it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// How create-only puts behave.
    pub create_only: CreateOnly,
    /// Whether the store checks the SHA-256 sent with a put (and rejects a mismatch).
    pub verifies_sha256: bool,
    /// Whether incomplete multipart uploads can be listed.
    pub multipart_listing: bool,
    /// Whether object tagging works.
    pub tagging: bool,
    /// Whether bucket lifecycle rules can be read and written.
    pub lifecycle: bool,
}

/// A per-key failure from [`BlobStore::delete_many`].
pub type DeleteFailures = Vec<(BlobKey, crate::Error)>;

/// An object store, as blobsnap needs it. See the [module docs](self) for the semantics.
///
/// Implementations are cheap to share (`Arc<dyn BlobStore>`); every method may be called
/// concurrently.
#[async_trait]
pub trait BlobStore: Send + Sync + fmt::Debug + fmt::Display {
    /// What this store enforces and supports. With [`Probe::Never`] the answer is what is known
    /// now and no request is made (`create_only` may be [`CreateOnly::Unknown`]); with
    /// [`Probe::IfUnknown`] a store configured to probe (S3 with `create-only = "auto"`) finds
    /// out what the server really enforces — concurrent create-only puts to a scratch key, a
    /// few scratch objects written and deleted, once per store — remembers it and answers.
    /// Stores whose capabilities are fixed answer both alike.
    async fn capabilities(&self, probe: Probe) -> Result<Capabilities>;

    /// Store `body` under `key`.
    async fn put(&self, key: &BlobKey, body: PutBody, opts: PutOptions) -> Result<PutResult>;

    /// Stream `key`, or the byte `range` of it. An empty range or one past the end is
    /// `InvalidInput`; a missing key is `NotFound`.
    async fn get(&self, key: &BlobKey, range: Option<Range<u64>>) -> Result<GetResult>;

    /// Metadata of `key`; a missing key is `NotFound`.
    async fn head(&self, key: &BlobKey) -> Result<ObjectMeta>;

    /// Delete `keys` (idempotent: a missing key counts as deleted). `Err` means the request
    /// as a whole failed and nothing is known; `Ok` lists the keys that were not deleted,
    /// each with its error.
    async fn delete_many(&self, keys: &[BlobKey]) -> Result<DeleteFailures>;

    /// Every object under `scope`, in ascending key order.
    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>>;

    /// The incomplete multipart uploads under `scope`. With `before = Some(t)`, those of
    /// them begun before `t` by the store's clock ([`MultipartUpload::begun_before`]) are
    /// aborted (idempotent: one already gone is not an error); `None` changes nothing. Returns
    /// every upload listed. `Permanent` where [`Capabilities::multipart_listing`] is false.
    async fn incomplete_uploads(&self, scope: &Scope, before: Option<SystemTime>) -> Uploads;
}

/// What [`BlobStore::incomplete_uploads`] returns: every upload it listed.
pub type Uploads = Result<Vec<MultipartUpload>>;

/// A store's own listing and abort of its incomplete uploads, from which [`incomplete_uploads`]
/// makes [`BlobStore::incomplete_uploads`].
#[async_trait]
pub(crate) trait ListUploads: Sync {
    /// Every incomplete upload under `scope`.
    async fn list_uploads(&self, scope: &Scope) -> Uploads;

    /// Abort `upload` (idempotent: one already gone is not an error).
    async fn abort_upload(&self, upload: &MultipartUpload) -> Result<()>;
}

/// For implementations of [`BlobStore::incomplete_uploads`]: list them, abort one by one those
/// begun before `before`, and return them all.
pub(crate) async fn incomplete_uploads(
    store: &impl ListUploads,
    scope: &Scope,
    before: Option<SystemTime>,
) -> Uploads {
    let listed = store.list_uploads(scope).await?;
    if let Some(cutoff) = before {
        for u in listed.iter().filter(|u| u.begun_before(cutoff)) {
            store.abort_upload(u).await?;
        }
    }
    Ok(listed)
}

/// Deletes handed from one party to another to be sent later, in the same batch as others of
/// the same store (DESIGN §7 step 4: a backend's cleanup hands the commit manager the keys
/// of the snapshots that left retention, which go out with the next trim of the checkpoint
/// history — one batch delete per commit).
#[derive(Clone)]
pub struct DeferredDeletes {
    /// The store the keys live in.
    pub store: std::sync::Arc<dyn BlobStore>,
    /// The keys (deleting a missing one is not an error).
    pub keys: Vec<BlobKey>,
    /// Asked right before the keys are sent: which of them something pinned since they were
    /// decided (a savepoint) and must stay. An error sends nothing.
    pub pins: Option<std::sync::Arc<dyn DeleteFilter>>,
}

/// What may still keep a doomed key alive at the moment its delete is sent (the savepoints of
/// a job: [`crate::blob::time::savepoint`]).
#[async_trait]
pub trait DeleteFilter: Send + Sync {
    /// The keys of `keys` that must not be deleted now.
    async fn pinned(&self, keys: &[BlobKey]) -> Result<std::collections::HashSet<BlobKey>>;
}

impl fmt::Debug for DeferredDeletes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeferredDeletes({} keys in {})",
            self.keys.len(),
            self.store
        )
    }
}

impl DeferredDeletes {
    /// Whether `store` is the very handle these keys live in (then one batch can carry keys
    /// of both).
    pub fn same_store(&self, store: &std::sync::Arc<dyn BlobStore>) -> bool {
        std::sync::Arc::ptr_eq(&self.store, store)
    }

    /// Add `more` to `list`, joining the keys of one store into one entry.
    pub fn merge(list: &mut Vec<DeferredDeletes>, more: Vec<DeferredDeletes>) {
        for d in more.into_iter().filter(|d| !d.keys.is_empty()) {
            match list.iter_mut().find(|e| e.same_store(&d.store)) {
                Some(e) => {
                    e.keys.extend(d.keys);
                    if e.pins.is_none() {
                        e.pins = d.pins;
                    }
                }
                None => list.push(d),
            }
        }
    }

    /// Delete the keys, plus `with` (keys of the same store) in the same batch: no request if
    /// both are empty. The first key that could not be deleted is the error.
    pub async fn delete_with(&self, with: &[BlobKey]) -> Result<()> {
        if self.keys.is_empty() && with.is_empty() {
            return Ok(());
        }
        let mut keys = self.keys.clone();
        if let (Some(pins), false) = (&self.pins, keys.is_empty()) {
            let pinned = pins.pinned(&keys).await?;
            if !pinned.is_empty() {
                tracing::info!(
                    kept = pinned.len(),
                    "deletes withheld: pinned by a savepoint"
                );
                keys.retain(|k| !pinned.contains(k));
            }
        }
        if keys.is_empty() && with.is_empty() {
            return Ok(());
        }
        let all: Vec<BlobKey> = with.iter().chain(&keys).cloned().collect();
        match self.store.delete_many(&all).await?.into_iter().next() {
            Some((k, e)) => Err(e.context(format!("delete {k}"))),
            None => Ok(()),
        }
    }
}

/// Collect a whole listing (convenience for tests and small scopes).
pub async fn list_all(store: &dyn BlobStore, scope: &Scope) -> Result<Vec<ObjectMeta>> {
    use futures::TryStreamExt as _;
    store.list(scope).try_collect().await
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<T: BlobStore + ?Sized> BlobStore for std::sync::Arc<T> {
    async fn capabilities(&self, probe: Probe) -> Result<Capabilities> {
        (**self).capabilities(probe).await
    }
    async fn put(&self, key: &BlobKey, body: PutBody, opts: PutOptions) -> Result<PutResult> {
        (**self).put(key, body, opts).await
    }
    async fn get(&self, key: &BlobKey, range: Option<Range<u64>>) -> Result<GetResult> {
        (**self).get(key, range).await
    }
    async fn head(&self, key: &BlobKey) -> Result<ObjectMeta> {
        (**self).head(key).await
    }
    async fn delete_many(&self, keys: &[BlobKey]) -> Result<DeleteFailures> {
        (**self).delete_many(keys).await
    }
    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>> {
        (**self).list(scope)
    }
    async fn incomplete_uploads(&self, scope: &Scope, before: Option<SystemTime>) -> Uploads {
        (**self).incomplete_uploads(scope, before).await
    }
}
