//! Test harness: blob stores to run suites against.
//!
//! - `local()`: a [`LocalStore`] in a temp dir.
//! - `s3s()`: a real S3 server started in this process on 127.0.0.1 (the `s3s` + `s3s-fs`
//!   crates, SigV4 checked), reached by the real aws-sdk-s3 client over HTTP.
//! - `external()`: the server named by `BLOBSNAP_TEST_S3_ENDPOINT` (LocalStack in CI). Tests
//!   using it are `#[ignore]`d and run by `scripts/test.sh`; run without the variable set, or
//!   with the server down, they **fail**.

#![allow(dead_code)]

pub mod proxy;
pub mod rocks;

use std::net::SocketAddr;
use std::sync::Arc;

use blobsnap::backend::TaskContext;
use blobsnap::blob::FACTORY_NAME;
use blobsnap::blobstore::local::LocalStore;
use blobsnap::blobstore::s3::{CreateOnlySetting, S3Config, S3Store};
use blobsnap::blobstore::{BlobStore, CreateOnly, Scope};
use blobsnap::checkpoint::{BlobCheckpointStore, CheckpointStore as _};
use blobsnap::index::SnapshotIndex;
use blobsnap::layout::JobScope;

pub const S3S_ACCESS_KEY: &str = "AKIAS3SFSTEST";
pub const S3S_SECRET_KEY: &str = "s3s-fs-test-secret-key-0123456789";

/// A store under test, its name, and a fresh scope of its own.
pub struct Harness {
    pub name: String,
    pub store: Arc<dyn BlobStore>,
    pub kind: Kind,
    pub scope: Scope,
    _guard: Option<tempfile::TempDir>,
}

pub enum Kind {
    Local(LocalStore),
    S3(S3Store),
}

fn random_scope() -> Scope {
    Scope::new(format!("t-{:016x}/", rand::random::<u64>())).unwrap()
}

pub async fn local() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::new(dir.path().join("store")).unwrap();
    Harness {
        name: "local".into(),
        store: Arc::new(store.clone()),
        kind: Kind::Local(store),
        scope: random_scope(),
        _guard: Some(dir),
    }
}

/// Start an in-process s3s-fs server on an ephemeral loopback port.
pub async fn start_s3s(root: &std::path::Path) -> SocketAddr {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder as ConnBuilder;
    use s3s::auth::SimpleAuth;
    use s3s::service::S3ServiceBuilder;

    let fs = s3s_fs::FileSystem::new(root).expect("s3s-fs root");
    let mut b = S3ServiceBuilder::new(fs);
    b.set_auth(SimpleAuth::from_single(S3S_ACCESS_KEY, S3S_SECRET_KEY));
    let service = b.build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let service = service.clone();
            tokio::spawn(async move {
                let _ = ConnBuilder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    addr
}

/// The settings s3s-fs 0.14 needs: path style; create-only checked but not atomic; no
/// multipart listing, tagging or lifecycle. It answers BadDigest to a body whose SHA-256 does
/// not match, but keeps the bad body under the key anyway (found by the conformance suite), so
/// it does not count as verifying.
pub fn s3s_config(addr: SocketAddr, bucket: &str) -> S3Config {
    S3Config {
        bucket: bucket.into(),
        endpoint: Some(format!("http://{addr}")),
        region: Some("us-east-1".into()),
        path_style: true,
        create_only: CreateOnlySetting::Racy,
        verifies_sha256: false,
        multipart_listing: false,
        tagging: false,
        lifecycle: false,
        part_size: 5 << 20,
        multipart_threshold: 5 << 20,
        part_concurrency: 4,
        list_page_size: 10,
        connect_timeout_ms: 2_000,
        read_timeout_ms: 20_000,
        ..Default::default()
    }
}

pub async fn s3s() -> Harness {
    s3s_with(|_| {}).await
}

/// An s3s-fs harness with adjusted client settings.
pub async fn s3s_with(adjust: impl FnOnce(&mut S3Config)) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let addr = start_s3s(dir.path()).await;
    let bucket = "blobsnap-test";
    let mut config = s3s_config(addr, bucket);
    adjust(&mut config);
    let store = S3Store::connect_with_credentials(config, S3S_ACCESS_KEY, S3S_SECRET_KEY, None)
        .await
        .unwrap();
    store
        .client()
        .create_bucket()
        .bucket(bucket)
        .send()
        .await
        .expect("create bucket on s3s-fs");
    Harness {
        name: format!("s3s-fs at {addr}"),
        store: Arc::new(store.clone()),
        kind: Kind::S3(store),
        scope: random_scope(),
        _guard: Some(dir),
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn env_bool(name: &str, default: bool) -> bool {
    env(name)
        .map(|v| v == "true" || v == "1")
        .unwrap_or(default)
}

/// The external S3 server named by `BLOBSNAP_TEST_S3_ENDPOINT`. Panics (fails the test) when
/// it is not configured or not reachable.
pub async fn external() -> Harness {
    external_in(None).await
}

/// [`external`] in `bucket` (created if missing) instead of the suite's shared one: for a
/// test that changes bucket-wide settings (a lifecycle rule over every prefix) which would
/// race every other test of the shared bucket.
pub async fn external_in(bucket: Option<String>) -> Harness {
    let endpoint = env("BLOBSNAP_TEST_S3_ENDPOINT").expect(
        "BLOBSNAP_TEST_S3_ENDPOINT is not set: the external-endpoint suite needs an S3 server (scripts/test.sh starts LocalStack)",
    );
    let bucket = bucket
        .or_else(|| env("BLOBSNAP_TEST_S3_BUCKET"))
        .unwrap_or_else(|| "blobsnap-test".into());
    let create_only = match env("BLOBSNAP_TEST_S3_CREATE_ONLY").as_deref() {
        None | Some("auto") => CreateOnlySetting::Auto,
        Some("atomic") => CreateOnlySetting::Atomic,
        Some("racy") => CreateOnlySetting::Racy,
        Some("ignored") => CreateOnlySetting::Ignored,
        Some(other) => panic!("BLOBSNAP_TEST_S3_CREATE_ONLY={other}?"),
    };
    let config = S3Config {
        bucket: bucket.clone(),
        endpoint: Some(endpoint.clone()),
        region: Some(env("BLOBSNAP_TEST_S3_REGION").unwrap_or_else(|| "us-east-1".into())),
        path_style: env_bool("BLOBSNAP_TEST_S3_PATH_STYLE", true),
        create_only,
        multipart_listing: env_bool("BLOBSNAP_TEST_S3_MULTIPART_LISTING", true),
        tagging: env_bool("BLOBSNAP_TEST_S3_TAGGING", true),
        lifecycle: env_bool("BLOBSNAP_TEST_S3_LIFECYCLE", true),
        part_size: 5 << 20,
        multipart_threshold: 5 << 20,
        part_concurrency: 4,
        list_page_size: 10,
        connect_timeout_ms: 2_000,
        read_timeout_ms: 20_000,
        ..Default::default()
    };
    let ak = env("BLOBSNAP_TEST_S3_ACCESS_KEY").unwrap_or_else(|| "test".into());
    let sk = env("BLOBSNAP_TEST_S3_SECRET_KEY").unwrap_or_else(|| "test".into());
    let store = S3Store::connect_with_credentials(config, &ak, &sk, None)
        .await
        .unwrap();
    match store.client().create_bucket().bucket(&bucket).send().await {
        Ok(_) => {}
        Err(e) => {
            let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&e).map(str::to_string);
            match code.as_deref() {
                Some("BucketAlreadyOwnedByYou") | Some("BucketAlreadyExists") => {}
                _ => panic!(
                    "external S3 server {endpoint} is not usable (create bucket {bucket}): {e:?}"
                ),
            }
        }
    }
    // Resolve `auto` by one probe per test process, so every case sees what the server
    // really enforces.
    static PROBED: tokio::sync::OnceCell<CreateOnly> = tokio::sync::OnceCell::const_new();
    let found = *PROBED
        .get_or_init(|| async {
            store
                .capabilities(blobsnap::blobstore::Probe::IfUnknown)
                .await
                .unwrap_or_else(|e| panic!("probe of {endpoint}: {e}"))
                .create_only
        })
        .await;
    if let Some(want) = env("BLOBSNAP_TEST_S3_EXPECT_CREATE_ONLY") {
        assert_eq!(
            format!("{found:?}").to_lowercase(),
            want,
            "{endpoint}: the probe disagrees with BLOBSNAP_TEST_S3_EXPECT_CREATE_ONLY"
        );
    }
    let store = if store.config().create_only == CreateOnlySetting::Auto {
        let mut config = store.config().clone();
        config.create_only = match found {
            CreateOnly::Atomic => CreateOnlySetting::Atomic,
            CreateOnly::Racy => CreateOnlySetting::Racy,
            CreateOnly::Ignored | CreateOnly::Unknown => CreateOnlySetting::Ignored,
        };
        S3Store::connect_with_credentials(config, &ak, &sk, None)
            .await
            .unwrap()
    } else {
        store
    };
    Harness {
        name: format!("external S3 at {endpoint}"),
        store: Arc::new(store.clone()),
        kind: Kind::S3(store),
        scope: random_scope(),
        _guard: None,
    }
}

/// The index of store `counts` of `ctx`'s task behind `marker`, read and checked.
pub async fn index_of(store: &dyn BlobStore, ctx: &TaskContext, marker: &str) -> SnapshotIndex {
    index_of_store(store, ctx, "counts", marker).await
}

/// The index of store `store_name` of `ctx`'s task behind `marker`, read and checked.
pub async fn index_of_store(
    store: &dyn BlobStore,
    ctx: &TaskContext,
    store_name: &str,
    marker: &str,
) -> SnapshotIndex {
    let who = blobsnap::blob::Expected {
        job_name: &ctx.job_name,
        job_id: &ctx.job_id,
        task_name: &ctx.task_name,
        store_name,
    };
    let snap = blobsnap::blob::load_snapshot(store, &who, marker)
        .await
        .unwrap();
    Arc::unwrap_or_clone(snap.index)
}

/// Every object under the job scope that the retained checkpoints reference: checkpoint
/// documents, indexes, blobs.
pub async fn referenced(
    store: &Arc<dyn BlobStore>,
    job: &str,
    partitions: u32,
) -> std::collections::BTreeSet<String> {
    let scope = JobScope::new(job, "1").unwrap();
    let cps = BlobCheckpointStore::new(Arc::clone(store), scope.clone());
    let mut out = std::collections::BTreeSet::new();
    for p in 0..partitions {
        let task = format!("Partition {p}");
        for c in cps.history(&task, usize::MAX).await.unwrap() {
            out.insert(
                scope
                    .checkpoint_key(&task, c.seq)
                    .unwrap()
                    .as_str()
                    .to_string(),
            );
            let Some(v2) = c.checkpoint.as_v2() else {
                continue;
            };
            for (store_name, marker) in v2
                .state_checkpoint_markers
                .get(FACTORY_NAME)
                .into_iter()
                .flatten()
            {
                let ctx = TaskContext {
                    job_name: job.into(),
                    job_id: "1".into(),
                    task_name: task.clone(),
                };
                let sscope = scope.store(&task, store_name).unwrap();
                out.insert(sscope.key(marker).unwrap().as_str().to_string());
                for (_, f) in index_of_store(store.as_ref(), &ctx, store_name, marker)
                    .await
                    .present_files()
                {
                    for b in &f.blobs {
                        out.insert(sscope.key(&b.blob_id).unwrap().as_str().to_string());
                    }
                }
            }
        }
    }
    out
}

impl Harness {
    /// Delete everything under this harness's scope.
    pub async fn cleanup(&self) {
        let _ = self.delete_under(&self.scope).await;
    }

    /// Delete every object under `scope` (one listing, then the store's batch deletes).
    pub async fn delete_under(&self, scope: &blobsnap::blobstore::Scope) -> blobsnap::Result<()> {
        use futures::TryStreamExt as _;
        let keys: Vec<_> = self
            .store
            .list(scope)
            .map_ok(|m| m.key)
            .try_collect()
            .await?;
        if keys.is_empty() {
            return Ok(());
        }
        match self.store.delete_many(&keys).await?.into_iter().next() {
            None => Ok(()),
            Some((_, e)) => Err(e),
        }
    }

    /// Say that a test needs a capability this store lacks, naming the server that runs it.
    /// Written straight to the process's stderr (not the test harness's captured output), so
    /// the CI log shows which store skipped what.
    pub fn lacks(&self, what: &str) {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "CAPABILITY: {} lacks {what}; this case is not run there (LocalStack runs it in scripts/test.sh)",
            self.name
        );
    }
}

/// Generate one `#[tokio::test]` per case for each store: the local store, the in-process
/// s3s-fs server, and (ignored, run by scripts/test.sh) the external endpoint. Each case is
/// `cases::<name>(&Harness)`; the harness's scope is cleaned up after it.
#[allow(unused_macros)]
macro_rules! store_suites {
    ([$($case:ident),* $(,)?]) => {
        store_suites!(@backend local, support::local, [], [$($case),*]);
        store_suites!(@backend s3s, support::s3s, [], [$($case),*]);
        store_suites!(@backend external, support::external,
            [#[ignore = "needs BLOBSNAP_TEST_S3_ENDPOINT; run by scripts/test.sh"]], [$($case),*]);
    };
    (@backend $backend:ident, $make:path, $attrs:tt, [$($case:ident),*]) => {
        mod $backend {
            use super::*;
            $( store_suites!(@one $make, $attrs, $case); )*
        }
    };
    (@one $make:path, [$(#[$attr:meta])*], $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$attr])*
        async fn $case() {
            let h = $make().await;
            eprintln!("{} on {}", stringify!($case), h.name);
            cases::$case(&h).await;
            h.cleanup().await;
        }
    };
}

/// Every file of a database dir but RocksDB's info logs (`LOG`, `LOG.old.*`), with its bytes:
/// what a backup must leave unchanged and a restore must give back. `LOCK` is listed but never
/// opened: closing any descriptor of it in a process that holds RocksDB's record lock on it
/// would drop that lock.
pub fn files_but_logs(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n != "LOG" && !n.starts_with("LOG.old")
        })
        .map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let bytes = if name == "LOCK" {
                Vec::new()
            } else {
                std::fs::read(e.path()).unwrap()
            };
            (name, bytes)
        })
        .collect()
}

/// What a [`Hooked`] store's hook sees of each GET: the key and how many GETs of keys under
/// `/blobs/` came before this one.
pub type GetHook =
    dyn Fn(&blobsnap::blobstore::BlobKey, u64) -> Option<blobsnap::Error> + Send + Sync;

/// A store that calls a hook before every GET; the hook may act (cancel a restore, fill a
/// disk) and may fail the GET with the error it returns. Optionally it rewrites metadata
/// ([`with_meta`](Self::with_meta)) and measures the transfers in flight on it
/// ([`with_gauge`](Self::with_gauge)). Everything else is the inner store's.
pub struct Hooked {
    pub inner: Arc<dyn BlobStore>,
    pub hook: Box<GetHook>,
    meta: Option<Box<MetaHook>>,
    gauge: Option<Arc<InFlight>>,
    blob_gets: std::sync::atomic::AtomicU64,
    hold: Option<(u64, Arc<tokio::sync::Notify>)>,
}

/// What a [`Hooked`] store does to the metadata HEAD and LIST return (a server whose clock is
/// off shifts every `last_modified`).
pub type MetaHook =
    dyn Fn(blobsnap::blobstore::ObjectMeta) -> blobsnap::blobstore::ObjectMeta + Send + Sync;

impl Hooked {
    pub fn new(inner: Arc<dyn BlobStore>, hook: Box<GetHook>) -> Self {
        Hooked {
            inner,
            hook,
            meta: None,
            gauge: None,
            blob_gets: Default::default(),
            hold: None,
        }
    }

    /// Hold every GET's body once `after` bytes of it have passed, until `release` is
    /// notified (then the rest flows).
    pub fn with_body_hold(mut self, after: u64, release: Arc<tokio::sync::Notify>) -> Self {
        self.hold = Some((after, release));
        self
    }

    /// `inner` with no GET hook, measured by `gauge`.
    pub fn measured(inner: Arc<dyn BlobStore>, gauge: Arc<InFlight>) -> Self {
        Hooked {
            gauge: Some(gauge),
            ..Hooked::new(inner, Box::new(|_, _| None))
        }
    }

    /// Rewrite the metadata of every HEAD and LIST answer.
    pub fn with_meta(mut self, meta: Box<MetaHook>) -> Self {
        self.meta = Some(meta);
        self
    }

    /// Start a transfer on the gauge; `key`: of a single-object request (a batch delete
    /// never waits for a meeting).
    async fn transfer(&self, key: Option<&blobsnap::blobstore::BlobKey>) -> Option<Transfer> {
        let g = self.gauge.as_ref()?;
        let t = g.start();
        if let Some(key) = key {
            g.arrive(key).await;
        }
        Some(t)
    }

    fn map_meta(&self, m: blobsnap::blobstore::ObjectMeta) -> blobsnap::blobstore::ObjectMeta {
        match &self.meta {
            Some(f) => f(m),
            None => m,
        }
    }
}

impl std::fmt::Debug for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hooked({:?})", self.inner)
    }
}

impl std::fmt::Display for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

#[async_trait::async_trait]
impl BlobStore for Hooked {
    async fn capabilities(
        &self,
        probe: blobsnap::blobstore::Probe,
    ) -> blobsnap::Result<blobsnap::blobstore::Capabilities> {
        self.inner.capabilities(probe).await
    }
    async fn put(
        &self,
        key: &blobsnap::blobstore::BlobKey,
        body: blobsnap::blobstore::PutBody,
        opts: blobsnap::blobstore::PutOptions,
    ) -> blobsnap::Result<blobsnap::blobstore::PutResult> {
        let _t = self.transfer(Some(key)).await;
        self.inner.put(key, body, opts).await
    }
    async fn get(
        &self,
        key: &blobsnap::blobstore::BlobKey,
        range: Option<std::ops::Range<u64>>,
    ) -> blobsnap::Result<blobsnap::blobstore::GetResult> {
        let n = if key.as_str().contains("/blobs/") {
            self.blob_gets
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        } else {
            self.blob_gets.load(std::sync::atomic::Ordering::SeqCst)
        };
        if let Some(e) = (self.hook)(key, n) {
            return Err(e);
        }
        use futures::StreamExt as _;
        let t = self.transfer(Some(key)).await;
        let mut got = self.inner.get(key, range).await?;
        if let Some((after, release)) = self.hold.clone() {
            let body = std::mem::replace(&mut got.body, futures::stream::empty().boxed());
            got.body = futures::stream::unfold(
                (body, 0u64, after, release),
                |(mut body, passed, after, release)| async move {
                    if passed >= after && after != u64::MAX {
                        release.notified().await;
                        let chunk = body.next().await?;
                        return Some((chunk, (body, passed, u64::MAX, release)));
                    }
                    let chunk = body.next().await?;
                    let n = chunk.as_ref().map_or(0, |c| c.len() as u64);
                    Some((chunk, (body, passed + n, after, release)))
                },
            )
            .boxed();
        }
        let Some(t) = t else {
            return Ok(got);
        };
        // The transfer lasts until the body ends or is dropped.
        let body = std::mem::replace(&mut got.body, futures::stream::empty().boxed());
        got.body = futures::stream::unfold((body, t), |(mut body, t)| async move {
            let chunk = body.next().await?;
            Some((chunk, (body, t)))
        })
        .boxed();
        Ok(got)
    }
    async fn head(
        &self,
        key: &blobsnap::blobstore::BlobKey,
    ) -> blobsnap::Result<blobsnap::blobstore::ObjectMeta> {
        let _t = self.transfer(Some(key)).await;
        Ok(self.map_meta(self.inner.head(key).await?))
    }
    async fn delete_many(
        &self,
        keys: &[blobsnap::blobstore::BlobKey],
    ) -> blobsnap::Result<blobsnap::blobstore::DeleteFailures> {
        let _t = self.transfer(None).await;
        self.inner.delete_many(keys).await
    }
    fn list<'a>(
        &'a self,
        scope: &Scope,
    ) -> futures::stream::BoxStream<'a, blobsnap::Result<blobsnap::blobstore::ObjectMeta>> {
        use futures::StreamExt as _;
        Box::pin(
            self.inner
                .list(scope)
                .map(move |r| r.map(|m| self.map_meta(m))),
        )
    }
    async fn incomplete_uploads(
        &self,
        scope: &Scope,
        before: Option<std::time::SystemTime>,
    ) -> blobsnap::blobstore::Uploads {
        self.inner.incomplete_uploads(scope, before).await
    }
}

/// A small tmpfs of `size` bytes mounted at a fresh temp dir, unmounted on drop: a real
/// filesystem that fills up. Needs CAP_SYS_ADMIN (root; CI runs as root): without it the
/// test fails naming that, it does not pass by doing nothing.
pub struct SmallDisk {
    pub path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    pub fn mount(size: u64) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a {size}-byte tmpfs to fill a real disk and needs root \
             (CAP_SYS_ADMIN): mount said {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { path, _dir: dir }
    }

    /// Write a file of zeros at `name` until the disk is full; returns its path.
    pub fn fill(&self, name: &str) -> std::path::PathBuf {
        let p = self.path.join(name);
        fill_disk(&p);
        p
    }
}

/// Write zeros to the file at `p` until its filesystem is full (ENOSPC).
pub fn fill_disk(p: &std::path::Path) {
    use std::io::Write as _;
    let mut f = std::fs::File::create(p).unwrap();
    let chunk = vec![0u8; 64 << 10];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("fill {}: {e}", p.display()),
        }
    }
    // The last partial page, byte by byte.
    while f.write(&[0u8]).is_ok_and(|n| n == 1) {}
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

/// How many transfers (PUT, GET until its body ends or is dropped, HEAD, batch delete) are in
/// flight at once on a [`Hooked::measured`] store: put that store under a layer to see what
/// the layer lets through.
#[derive(Debug, Default)]
pub struct InFlight {
    now: Arc<std::sync::atomic::AtomicUsize>,
    peak: Arc<std::sync::atomic::AtomicUsize>,
    transfers: std::sync::atomic::AtomicU64,
    /// [`meeting`](Self::meeting): 0 off.
    meet_at: usize,
    met: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

/// One transfer of an [`InFlight`] store, counted until dropped.
struct Transfer(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Transfer {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl InFlight {
    /// The most transfers in flight at once so far.
    pub fn peak(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Transfers made so far.
    pub fn transfers(&self) -> u64 {
        self.transfers.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A gauge whose first blob transfers (keys under `/blobs/`: a job's uploads and
    /// downloads, which run side by side; its setup reads and writes one at a time) wait
    /// until `n` transfers are in flight at once, then none waits: a layer that admits `n` is
    /// then seen admitting `n` by construction, not by the luck of scheduling. A hang guard
    /// ends the meeting after 60 s (the peak then says what happened).
    pub fn meeting(n: usize) -> Self {
        InFlight {
            meet_at: n,
            ..Default::default()
        }
    }

    /// Called by a transfer after it started: waits for the meeting, if one is set and has
    /// not happened.
    async fn arrive(&self, key: &blobsnap::blobstore::BlobKey) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.meet_at == 0 || self.met.load(SeqCst) || !key.as_str().contains("/blobs/") {
            return;
        }
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.now.load(SeqCst) >= self.meet_at {
            self.met.store(true, SeqCst);
            self.notify.notify_waiters();
            return;
        }
        if self.met.load(SeqCst) {
            return;
        }
        if tokio::time::timeout(std::time::Duration::from_secs(60), notified)
            .await
            .is_err()
        {
            self.met.store(true, SeqCst);
            self.notify.notify_waiters();
        }
    }

    fn start(&self) -> Transfer {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(now, SeqCst);
        self.transfers.fetch_add(1, SeqCst);
        Transfer(Arc::clone(&self.now))
    }
}
